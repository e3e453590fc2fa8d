"""gnn-ptp: predict the time of a PyTorch training step on NVIDIA H100 GPUs, for any precision setting.

The Python API (``gnn_ptp.predict``) is imported lazily so that ``import gnn_ptp`` stays cheap.
"""

__version__ = "0.1.0"

__all__ = ["__version__", "predict", "Prediction"]


def __getattr__(name):
    if name in ("predict", "Prediction"):
        from gnn_ptp import predict as _predict

        return getattr(_predict, name)
    raise AttributeError(f"module 'gnn_ptp' has no attribute {name!r}")
