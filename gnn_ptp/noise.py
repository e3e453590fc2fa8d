"""The label noise floor: the error a perfect predictor of a configuration's true mean step time would show
against its label, which averages n noisy measurements.

For one configuration with relative standard deviation sigma per measurement, that error is
sqrt(2/pi) x sigma / sqrt(n) (Gaussian noise). Most configurations are measured once, so their own sigma is
unknown: it is pooled from the configurations of the same hardware measured more than once whose step time
is nearest (``NEIGHBOURS`` of them, by log step time). Noise depends on the step's length, not on who
measured it: a step of a few milliseconds is host-bound and varies with the host (5-10 % on the H200's
VM), a step of seconds repeats to 0.2 %. A floor from the repeated configurations alone, with their own
n >= 2, would leave out the noisier labels measured once (on the H200's 2,960 configurations it said
3.1 % where the labels carry 5 %).

Each repeated configuration's sigma is estimated as s / c4(n) / mean (``relative_sd``), unbiased for a
Gaussian, and the neighbours' estimates are averaged, not their squares: a few configurations measured
2x apart (a host that was briefly slow) then count as the noise they are without setting the floor alone.
"""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np

NEIGHBOURS = 30
"""Repeated configurations (nearest in log step time, same hardware) a configuration's noise is pooled from."""


def c4(n: int) -> float:
    """E[s] / sigma for n Gaussian samples: the bias of the sample standard deviation."""
    return math.sqrt(2.0 / (n - 1)) * math.exp(math.lgamma(n / 2.0) - math.lgamma((n - 1) / 2.0))


def relative_sd(values) -> float | None:
    """sigma / mean of one configuration's repeated measurements (None below two, or a mean <= 0)."""
    v = np.asarray(values, dtype=float)
    if len(v) < 2 or v.mean() <= 0:
        return None
    return float(v.std(ddof=1) / c4(len(v)) / v.mean())


class NoiseFloor:
    """Pooled per-measurement noise of each hardware's repeated configurations, by step time.

    ``repeats`` maps a key (``protocol.repeat_key``: (hardware name, configuration key)) to that
    configuration's step-time measurements (ms), every configuration included, measured once or more."""

    def __init__(self, repeats: dict, neighbours: int = NEIGHBOURS):
        self.repeats = repeats
        self.neighbours = neighbours
        pooled: dict = defaultdict(list)
        for key, values in repeats.items():
            sd = self.estimate(values)
            if sd is not None:
                pooled[_hardware(key)].append((math.log(float(np.mean(values))), sd))
        self.pooled = {hw: (np.array([p[0] for p in rows]), np.array([p[1] for p in rows]))
                       for hw, rows in pooled.items()}

    @staticmethod
    def estimate(values) -> float | None:
        """One repeated configuration's noise estimate, pooled by ``sigma``: its relative sd."""
        return relative_sd(values)

    def sigma(self, key) -> float | None:
        """The per-measurement relative sd of this configuration's labels: the mean estimate of the
        ``neighbours`` repeated configurations of its hardware nearest to it in log step time (None where
        its hardware has none, or the key has no measurement)."""
        values = self.repeats.get(key)
        pooled = self.pooled.get(_hardware(key))
        if not values or pooled is None or np.mean(values) <= 0:
            return None
        log_ms, sds = pooled
        nearest = np.argsort(np.abs(log_ms - math.log(float(np.mean(values)))), kind="stable")[:self.neighbours]
        return float(sds[nearest].mean())

    @staticmethod
    def label_error(sigma: float, n: int) -> float:
        """A label's expected relative error from its pooled ``sigma`` and its ``n`` measurements: the mean
        of n Gaussian ones is off by sqrt(2/pi) x sigma / sqrt(n)."""
        return math.sqrt(2.0 / math.pi) * sigma / math.sqrt(n)

    def floor(self, keys) -> float | None:
        """The label noise floor (%) of these configurations: the mean of their ``label_error``."""
        floors = [self.label_error(sd, len(self.repeats[k])) * 100.0
                  for k, sd in ((k, self.sigma(k)) for k in keys) if sd is not None]
        return float(np.mean(floors)) if floors else None


def _hardware(key):
    """The hardware part of a repeat key ((hardware, configuration) tuples; a bare key is one hardware)."""
    return key[0] if isinstance(key, tuple) else None


FASTEST_MIN_RECORDS = 4
"""Records a configuration needs for its fastest-record label's noise to be measured (two halves of two)."""
HALVINGS = 20
"""Random halvings of a configuration's records per estimate (seeded: the same floor every run)."""


def split_half_fastest(values, halvings: int = HALVINGS, seed: int = 0) -> float | None:
    """How far apart two fastest-record labels of one configuration fall: over ``halvings`` random splits of
    its records into two halves of ``n // 2``, the mean of |fastest(A) / fastest(B) - 1| (None below
    ``FASTEST_MIN_RECORDS`` records)."""
    v = np.asarray(values, dtype=float)
    if len(v) < FASTEST_MIN_RECORDS or v.min() <= 0:
        return None
    rng = np.random.default_rng(seed)
    half = len(v) // 2
    gaps = []
    for _ in range(halvings):
        order = rng.permutation(len(v))
        gaps.append(abs(v[order[:half]].min() / v[order[half:2 * half]].min() - 1.0))
    return float(np.mean(gaps))


class FastestFloor(NoiseFloor):
    """The noise floor of labels taken from each configuration's fastest record (``dataset.LABEL_STATS``):
    a Gaussian sigma / sqrt(n) does not describe a minimum, so the error is measured instead. Each
    configuration with ``FASTEST_MIN_RECORDS`` records or more gives the split-half gap of its fastest-record
    labels (``split_half_fastest``) / sqrt(2): the error of one half's label if the halves err independently
    and alike. A configuration's floor is the mean of that over the ``neighbours`` such configurations of its
    hardware nearest in step time. Each half holds half the records, so this is an upper estimate of the
    error of a label from all of them."""

    @staticmethod
    def estimate(values) -> float | None:
        """One configuration's half-label error: its split-half gap / sqrt(2)."""
        gap = split_half_fastest(values)
        return None if gap is None else gap / math.sqrt(2.0)

    @staticmethod
    def label_error(sigma: float, n: int) -> float:
        """The pooled half-label error itself, whatever ``n`` (a minimum does not shrink as 1 / sqrt(n))."""
        return sigma


def floor_for(label: str, repeats: dict, neighbours: int = NEIGHBOURS) -> NoiseFloor:
    """The noise floor that fits labels made by ``label`` (``dataset.LABEL_STATS``)."""
    return FastestFloor(repeats, neighbours) if label == "fastest" else NoiseFloor(repeats, neighbours)
