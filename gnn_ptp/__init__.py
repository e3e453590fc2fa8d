"""gnn-ptp: predict the time of a PyTorch training step on NVIDIA H100 GPUs, for any precision setting.

``gnn_ptp.predict(spec, precision=..., batch_size=..., gpus=...)`` returns a ``Prediction``; both live
in ``gnn_ptp.prediction`` and are imported on first use, so that ``import gnn_ptp`` stays cheap.
"""

__version__ = "0.1.0"

__all__ = ["__version__", "predict", "predict_many", "Prediction"]


def __getattr__(name):
    if name in ("predict", "predict_many", "Prediction"):
        import importlib

        return getattr(importlib.import_module("gnn_ptp.prediction"), name)
    raise AttributeError(f"module 'gnn_ptp' has no attribute {name!r}")
