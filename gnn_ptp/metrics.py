"""Error metrics, as percentages (4.2 means 4.2%)."""

from __future__ import annotations

from collections import defaultdict

import numpy as np


def ape(pred, true) -> np.ndarray:
    """Absolute percentage errors of predictions against measurements."""
    pred, true = np.asarray(pred, dtype=float), np.asarray(true, dtype=float)
    return np.abs(pred - true) / np.abs(true) * 100.0


def summarize(errors) -> dict:
    errors = np.asarray(errors, dtype=float)
    if errors.size == 0:
        return {"mape": None, "median_ape": None, "p90_ape": None, "n": 0}
    return {"mape": float(errors.mean()), "median_ape": float(np.median(errors)),
            "p90_ape": float(np.quantile(errors, 0.9)), "n": int(errors.size)}


def grouped(errors, groups) -> dict[str, dict]:
    by: dict[str, list[float]] = defaultdict(list)
    for e, g in zip(errors, groups):
        by[g].append(e)
    return {g: summarize(v) for g, v in sorted(by.items())}


def report(pred, true, precisions, families) -> dict:
    """``{"overall": ..., "per_precision": {...}, "per_family": {...}}`` for one predictor."""
    errors = ape(pred, true)
    return {"overall": summarize(errors), "per_precision": grouped(errors, precisions),
            "per_family": grouped(errors, families)}
