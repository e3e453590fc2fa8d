"""Baselines the GNN is measured against, on the same split.

- roofline: the physical prior (gnn_ptp/prior.py): every kernel takes max(FLOPs / (peak GEMM or vector
  rate of its dtype x calibrated efficiency), bytes / (bandwidth x efficiency), launch floor), summed per
  phase; fitted to kernel timings only, never to step times. A GEMM runs at the GEMM rate of its dtype
  whether or not it uses tensor cores (an fp32 matmul on a CPU at the measured fp32 GEMM rate).
- graph-totals ridge: a linear model in log space on the graph-level features (precision, sizes,
  parameters, FLOPs per dtype and phase, bytes, kernel counts), fitted on the training families.
- precision-unaware GNN: the same GNN trained on graphs traced as fp32 whatever the precision (what a
  predictor that ignores precision sees); trained by ``gnn-ptp train --baselines``.
"""

from __future__ import annotations

import numpy as np
import torch

from gnn_ptp import prior
from gnn_ptp.hardware import Hardware
from gnn_ptp.prior import TC_COLUMN  # noqa: F401  (tests build node features with it)


def roofline_ms(sample, hw: Hardware) -> np.ndarray:
    """Roofline time in ms of each phase and the whole step: [forward, backward, optimizer, step], with
    the hardware's calibrated efficiency curves (a made-up ``Hardware`` gets the plain peak roofline)."""
    return prior.phase_ms(sample, prior.get_profile(hw))


class GraphTotalsRidge:
    """Ridge regression from graph-level features to log ms of [forward, backward, optimizer, step]."""

    def __init__(self, alphas=(1e-3, 1e-2, 1e-1, 1.0, 10.0)):
        self.alphas = alphas

    @staticmethod
    def _features(samples) -> np.ndarray:
        u = torch.cat([s.u for s in samples]).double().numpy()
        return np.hstack([u, np.ones((len(samples), 1))])

    def _fit(self, x, y, alpha):
        mean, std = x[:, :-1].mean(0), x[:, :-1].std(0) + 1e-9
        z = np.hstack([(x[:, :-1] - mean) / std, x[:, -1:]])
        eye = np.eye(z.shape[1])
        eye[-1, -1] = 0.0  # no penalty on the intercept
        w = np.linalg.solve(z.T @ z + alpha * len(z) * eye, z.T @ y)
        return mean, std, w

    def fit(self, train, val) -> "GraphTotalsRidge":
        x, y = self._features(train), torch.cat([s.y for s in train]).double().numpy()
        best = None
        for alpha in self.alphas:
            params = self._fit(x, y, alpha)
            self.params = params
            err = np.abs(np.exp(self.predict_log(val)[:, 3]) / np.exp(torch.cat([s.y for s in val])[:, 3].numpy()) - 1).mean()
            if best is None or err < best[0]:
                best = (err, alpha, params)
        self.alpha, self.params = best[1], best[2]
        return self

    def predict_log(self, samples) -> np.ndarray:
        mean, std, w = self.params
        x = self._features(samples)
        z = np.hstack([(x[:, :-1] - mean) / std, x[:, -1:]])
        return z @ w

    def predict_ms(self, samples) -> np.ndarray:
        return np.exp(self.predict_log(samples))

    def to_dict(self) -> dict:
        mean, std, w = self.params
        return {"alpha": self.alpha, "mean": mean.tolist(), "std": std.tolist(), "w": w.tolist()}

    @classmethod
    def from_dict(cls, d: dict) -> "GraphTotalsRidge":
        ridge = cls()
        ridge.alpha = d["alpha"]
        ridge.params = (np.array(d["mean"]), np.array(d["std"]), np.array(d["w"]))
        return ridge


RIDGE_FILE = "graph_totals_ridge.json"
"""In a checkpoint's ``baselines/``: the ridge baseline fitted on the checkpoint's train and validation
families, with the hash of the data it saw. ``evaluate`` then needs graphs of the evaluated split only."""


def save_ridge(ridge: GraphTotalsRidge, data_hash: str, checkpoint_dir) -> None:
    from pathlib import Path

    from gnn_ptp.store import atomic_write_json

    (Path(checkpoint_dir) / "baselines").mkdir(parents=True, exist_ok=True)
    atomic_write_json({"data_hash": data_hash, **ridge.to_dict()}, Path(checkpoint_dir) / "baselines" / RIDGE_FILE)


def load_ridge(checkpoint_dir, data_hash: str) -> GraphTotalsRidge | None:
    """The stored ridge when it was fitted on exactly this data (same hash), else None."""
    import json
    from pathlib import Path

    path = Path(checkpoint_dir) / "baselines" / RIDGE_FILE
    try:
        d = json.loads(path.read_text())
        return GraphTotalsRidge.from_dict(d) if d.get("data_hash") == data_hash else None
    except (OSError, ValueError, KeyError, TypeError):
        return None
