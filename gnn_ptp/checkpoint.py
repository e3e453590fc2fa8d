"""Checkpoints: ``model.pt`` (weights only) + ``meta.json`` (everything needed to rebuild and trust it).

The model is rebuilt from meta.json alone and its weights loaded with ``torch.load(weights_only=True)``,
so a checkpoint can never run code. meta.json holds the model and training configs, the feature version
of its target's graphs (``graph.feature_version``; a checkpoint of another is refused), the hardware it
predicts for, the target offsets, a hash of the training data, the split, the metrics, and the ranges of
the training graphs (for out-of-distribution warnings).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from gnn_ptp.errors import UserError, first_line
from gnn_ptp.store import atomic_torch_save, atomic_write_json

FORMAT_VERSION = 1


def trained_labels(meta: dict) -> str:
    """The labels a checkpoint was trained on (``TrainConfig.labels``; mean for one trained before they
    were a setting)."""
    return (meta.get("train") or {}).get("labels", "mean")


def save(model, meta: dict, out_dir: str | Path) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    atomic_torch_save(model.state_dict(), out / "model.pt")
    atomic_write_json({"format_version": FORMAT_VERSION, **meta}, out / "meta.json")
    return out


def prior_calibration(model) -> dict[str, str]:
    """{calibration section: digest} of the physical prior a model predicts over (``target =
    "log_ratio_prior"``) or reads as a feature (``prior_feature``); {} for a model without one."""
    from gnn_ptp import prior

    sections = []
    if model.cfg.target == "log_ratio_prior" and model.descriptor is not None:
        sections.append(model.descriptor.curves_section())
    if model.cfg.prior_feature:
        sections.append(prior.CURVES_OF.get(model.cfg.prior_feature, model.cfg.prior_feature))
    return {s: prior.calibration_digest(s) for s in sections if s in prior.calibration()}


def correction_scale(meta: dict, path="checkpoint") -> float:
    """The factor on a residual checkpoint's correction to the prior (``train``'s ``scale_on_validation``;
    1 for a checkpoint that chose none)."""
    scaling = meta.get("correction_scale")
    if scaling is None:
        return 1.0
    chosen = scaling.get("chosen") if isinstance(scaling, dict) else None
    if isinstance(chosen, bool) or not isinstance(chosen, (int, float)) or not 0 <= chosen <= 1:
        raise UserError(f"checkpoint {path}: meta.json's correction_scale.chosen = {chosen!r} is not a factor "
                        "between 0 and 1; the checkpoint is damaged (retrain it or restore it from git)")
    return float(chosen)


def beyond_scale(meta: dict, path="checkpoint") -> tuple[float, float] | None:
    """A residual checkpoint's factor for steps beyond its training range and that range's largest step FLOPs
    (``TrainConfig.scale_beyond_range`` or ``beyond_scale``), or None for a checkpoint that has none."""
    beyond = meta.get("beyond_scale")
    if beyond is None:
        return None
    chosen = beyond.get("chosen") if isinstance(beyond, dict) else None
    top = beyond.get("train_max_flops") if isinstance(beyond, dict) else None
    if (isinstance(chosen, bool) or not isinstance(chosen, (int, float)) or not 0 <= chosen <= 1
            or isinstance(top, bool) or not isinstance(top, (int, float)) or not top > 0):
        raise UserError(f"checkpoint {path}: meta.json's beyond_scale ({beyond!r}) needs a factor between 0 and 1 "
                        "and a positive train_max_flops; the checkpoint is damaged (retrain it or restore it from git)")
    return float(chosen), float(top)


def model_records(meta: dict) -> list[dict]:
    """The records that carry a checkpoint's factors: each member's for a seed ensemble, else ``meta`` itself."""
    return list((meta.get("ensemble") or {}).get("members") or []) or [meta]


def beyond_note(meta: dict) -> str:
    """What answers beyond a checkpoint's training range (``beyond_scale``; each member's for an ensemble), in one
    wording for ``predict``; empty for a checkpoint without it."""
    from gnn_ptp.model import BEYOND_FACTOR

    records = [r.get("beyond_scale") or {} for r in model_records(meta)]
    factors = [r.get("chosen") for r in records]
    if all(f is None for f in factors):
        return ""
    fixed = all(r.get("chosen_by") == "config" for r in records)
    return ("beyond its largest training step its correction's factor moves to "
            + ", ".join("1" if f is None else f"{f:g}" for f in factors)
            + f" (reached at {BEYOND_FACTOR:g}x those FLOPs), "
            + ("fixed by its training config" + (" (the prior alone there)" if set(factors) == {0} else "")
               if fixed else "chosen by how a model trained on its smaller training steps fared on its larger ones"))


def scale_source(meta: dict) -> str:
    """Who chose a scaled checkpoint's factor: "validation" (``scale_on_validation``; checkpoints from before
    the field existed) or "config" (a fixed ``correction_scale`` in its training config)."""
    scaling = meta.get("correction_scale")
    return scaling.get("chosen_by", "validation") if isinstance(scaling, dict) else "validation"


def scale_note(scale: float, by: str = "validation") -> str:
    """What answers for a checkpoint whose learnt correction is scaled (``correction_scale``), in one wording
    for ``predict``'s expected error and ``evaluate``'s table; empty at factor 1."""
    if scale == 1.0:
        return ""
    whose = ("the fixed factor of its training config" if by == "config"
             else "the factor its validation families chose")
    return f"its learnt correction to the prior scaled by {scale:g}, {whose}"


def ensemble_note(meta: dict) -> str:
    """What answers for a seed-ensemble checkpoint (``TrainConfig.ensemble_seeds``), in one wording for
    ``predict``'s expected error and ``evaluate``'s table; empty for one model."""
    ens = meta.get("ensemble")
    if not isinstance(ens, dict):
        return ""
    members = ens.get("members") or []
    factors = [(m.get("correction_scale") or {}).get("chosen") for m in members]
    note = (f"the geometric mean of {len(members)} models trained with seeds "
            f"{', '.join(str(m.get('seed')) for m in members)}")
    if any(f is not None for f in factors):
        note += (", each its correction to the prior scaled by the factor its own validation families chose ("
                 + ", ".join("1" if f is None else f"{f:g}" for f in factors) + ")")
    return note


def _members(meta: dict, path) -> list[dict]:
    """A seed-ensemble checkpoint's member records (``meta["ensemble"]["members"]``), checked; [] for one model."""
    ens = meta.get("ensemble")
    if ens is None:
        return []
    members = ens.get("members") if isinstance(ens, dict) else None
    if not isinstance(members, list) or len(members) < 2 or not all(isinstance(m, dict) for m in members):
        raise UserError(f"checkpoint {path}: meta.json's ensemble lists no members (two or more); the checkpoint is "
                        "damaged (retrain it or restore it from git)")
    return members


def load(path: str | Path):
    """Return ``(model, meta)``; the model is in eval mode."""
    from gnn_ptp.dataset import trace_target
    from gnn_ptp.graph import feature_version
    from gnn_ptp.model import ModelConfig, SeedEnsemble, StepTimeGNN

    path = Path(path)
    if not (path / "meta.json").is_file() or not (path / "model.pt").is_file():
        raise UserError(f"no checkpoint at {str(path)!r} (expected model.pt and meta.json there)")
    try:
        meta = json.loads((path / "meta.json").read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise UserError(f"checkpoint {path}: meta.json is not valid JSON ({e}); the checkpoint is damaged "
                        "(retrain it or restore it from git)") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("model"), dict) or "hardware" not in meta:
        raise UserError(f"checkpoint {path}: meta.json lacks the 'model' and 'hardware' fields gnn-ptp "
                        "writes; it is not a gnn-ptp checkpoint or it is damaged")
    builds = feature_version(meta.get("trace_target") or trace_target(str(meta["hardware"])))
    if meta.get("feature_version") != builds:
        raise UserError(f"checkpoint {path} was trained on graph features v{meta.get('feature_version')}, "
                        f"this gnn-ptp builds v{builds} for its hardware: retrain it with `gnn-ptp train`")
    members = _members(meta, path)
    try:
        model = (SeedEnsemble([StepTimeGNN(ModelConfig(**meta["model"])) for _ in members]) if members
                 else StepTimeGNN(ModelConfig(**meta["model"])))
    except (TypeError, ValueError, UserError) as e:
        raise UserError(f"checkpoint {path}: meta.json's model config is not one this gnn-ptp builds "
                        f"({first_line(e)})") from None
    try:
        state = torch.load(path / "model.pt", weights_only=True, map_location="cpu")
    except Exception as e:  # torch's message advises weights_only=False, which would run the file's code
        raise UserError(f"checkpoint {path}: model.pt is not a readable weights file ({type(e).__name__}); "
                        "it is damaged or not from gnn-ptp train (retrain it or restore it from git)") from None
    expected = model.state_dict()
    if not isinstance(state, dict) or set(state) != set(expected) or any(
            getattr(state[k], "shape", None) != v.shape for k, v in expected.items()):
        have = set(state) if isinstance(state, dict) else set()
        raise UserError(f"checkpoint {path}: model.pt does not match meta.json's model ({len(expected) - len(have & set(expected))} "
                        f"weights missing, {len(have - set(expected))} unexpected, or shapes differ); "
                        "the two files come from different trainings")
    model.load_state_dict(state)
    for one, record in ([(model, meta)] if not members else zip(model.members, members)):  # each its own factors
        one.correction_scale = correction_scale(record, path)
        one.beyond_scale, one.train_max_flops = beyond_scale(record, path) or (None, None)
    if isinstance(meta.get("hardware_descriptor"), dict):  # what the model assumes of graphs that carry none
        from gnn_ptp.descriptor import Descriptor

        model.descriptor = Descriptor.from_dict(meta["hardware_descriptor"])
        for member in getattr(model, "members", ()):
            member.descriptor = model.descriptor
    stored, now = meta.get("prior_calibration") or {}, prior_calibration(model)
    changed = sorted(s for s in stored if now.get(s) != stored[s])
    if changed:
        print(f"warning: checkpoint {path} was trained over the physical prior's '{', '.join(changed)}' "
              "calibration as it was then; gnn_ptp/prior_calibration.json has been re-fitted since, so its "
              "predictions shift: retrain it (`gnn-ptp train`)", file=sys.stderr)
    model.eval()
    return model, meta
