"""Checkpoints: ``model.pt`` (weights only) + ``meta.json`` (everything needed to rebuild and trust it).

The model is rebuilt from meta.json alone and its weights loaded with ``torch.load(weights_only=True)``,
so a checkpoint can never run code. meta.json holds the model and training configs, FEATURE_VERSION,
the hardware it predicts for, the target offsets, a hash of the training data, the split, the metrics,
and the ranges of the training graphs (for out-of-distribution warnings).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from gnn_ptp.errors import UserError
from gnn_ptp.store import atomic_torch_save, atomic_write_json

FORMAT_VERSION = 1


def save(model, meta: dict, out_dir: str | Path) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    atomic_torch_save(model.state_dict(), out / "model.pt")
    atomic_write_json({"format_version": FORMAT_VERSION, **meta}, out / "meta.json")
    return out


def load(path: str | Path):
    """Return ``(model, meta)``; the model is in eval mode."""
    from gnn_ptp.graph import FEATURE_VERSION
    from gnn_ptp.model import ModelConfig, StepTimeGNN

    path = Path(path)
    if not (path / "meta.json").is_file() or not (path / "model.pt").is_file():
        raise UserError(f"no checkpoint at {str(path)!r} (expected model.pt and meta.json there)")
    meta = json.loads((path / "meta.json").read_text())
    if meta.get("feature_version") != FEATURE_VERSION:
        raise UserError(f"checkpoint {path} was trained on graph features v{meta.get('feature_version')}, "
                        f"this gnn-ptp builds v{FEATURE_VERSION}: retrain it with `gnn-ptp train`")
    model = StepTimeGNN(ModelConfig(**meta["model"]))
    model.load_state_dict(torch.load(path / "model.pt", weights_only=True, map_location="cpu"))
    model.eval()
    return model, meta
