"""The label noise floor (gnn_ptp/noise.py) on synthetic repeats, named so: Gaussian measurements of known
relative noise, drawn with a fixed seed."""

import math

import numpy as np
import pytest

from gnn_ptp.noise import NoiseFloor, c4, relative_sd


def test_c4_matches_its_known_values():
    assert c4(2) == pytest.approx(math.sqrt(2 / math.pi))
    assert c4(3) == pytest.approx(math.sqrt(math.pi) / 2)
    assert c4(100) == pytest.approx(1.0, abs=0.003)


def test_relative_sd_is_unbiased_for_gaussian_pairs():
    rng = np.random.default_rng(0)
    sds = [relative_sd(100.0 * (1 + 0.08 * rng.standard_normal(2))) for _ in range(20000)]
    assert np.mean(sds) == pytest.approx(0.08, rel=0.03)
    assert relative_sd([5.0]) is None and relative_sd([0.0, 0.0]) is None


def _synthetic(rng, noise_of, n_repeated=200, n_once=600):
    """Synthetic labels: step times log-uniform over 1 ms-10 s, relative noise ``noise_of(ms)``; some
    configurations measured twice, the rest once."""
    repeats, truth = {}, {}
    for i in range(n_repeated + n_once):
        ms = float(np.exp(rng.uniform(0, math.log(10000))))
        n = 2 if i < n_repeated else 1
        repeats[("gpu", f"k{i}")] = list(ms * (1 + noise_of(ms) * rng.standard_normal(n)))
        truth[("gpu", f"k{i}")] = ms
    return repeats, truth


def test_floor_matches_a_perfect_predictors_error_when_noise_depends_on_step_time():
    """Short steps noisy (10 %), long ones quiet (0.5 %): the floor of every configuration, measured once or
    twice, is the mean error the true means score against the labels, within sampling error; the old
    definition (repeated configurations with their own n) misses the once-measured labels' noise."""
    rng = np.random.default_rng(1)
    repeats, truth = _synthetic(rng, lambda ms: 0.10 if ms < 100 else 0.005)
    keys = list(repeats)
    perfect = np.mean([abs(truth[k] / np.mean(repeats[k]) - 1) for k in keys]) * 100
    floor = NoiseFloor(repeats).floor(keys)
    assert floor == pytest.approx(perfect, rel=0.15)
    repeated_only = np.mean([math.sqrt(2 / math.pi) * np.std(v, ddof=1) / np.mean(v) / math.sqrt(len(v)) * 100
                             for v in repeats.values() if len(v) >= 2])
    assert repeated_only < 0.8 * perfect
    # the short steps carry the noise: their floor is the larger by far
    short = [k for k in keys if truth[k] < 50]
    long_ = [k for k in keys if truth[k] > 200]
    assert NoiseFloor(repeats).floor(short) > 10 * NoiseFloor(repeats).floor(long_)


def test_a_configuration_measured_more_often_has_a_lower_floor():
    repeats = {("h", "a"): [100.0, 110.0], ("h", "b"): [100.0, 90.0, 100.0, 105.0], ("h", "c"): [100.0]}
    nf = NoiseFloor(repeats)
    assert nf.sigma(("h", "b")) == nf.sigma(("h", "c"))  # same neighbours: same per-measurement noise
    assert nf.floor([("h", "b")]) == pytest.approx(nf.floor([("h", "c")]) / 2)
    assert nf.floor([("h", "missing")]) is None


def test_fastest_floor_is_the_split_half_error_of_fastest_record_labels():
    """SYNTHETIC one-sided noise (a quiet machine's step times 100 ms, each record slowed by an exponential
    interference of mean 20 %), six records per configuration: the fastest record is the steadier label (its
    split-half gap smaller than the mean's), and ``FastestFloor`` is that gap / sqrt(2), pooled."""
    from gnn_ptp.noise import FastestFloor, floor_for, split_half_fastest

    rng = np.random.default_rng(3)
    repeats = {("cpu", f"k{i}"): list(100.0 * (1 + rng.exponential(0.2, 6))) for i in range(300)}
    gaps = [split_half_fastest(v) for v in repeats.values()]
    mean_gaps = []
    for v in repeats.values():
        order = np.random.default_rng(0).permutation(6)
        mean_gaps.append(abs(np.mean(np.array(v)[order[:3]]) / np.mean(np.array(v)[order[3:]]) - 1))
    assert np.mean(gaps) < 0.8 * np.mean(mean_gaps)
    floor = FastestFloor(repeats).floor(list(repeats))
    assert floor == pytest.approx(np.mean(gaps) / math.sqrt(2) * 100, rel=0.1)
    assert isinstance(floor_for("fastest", repeats), FastestFloor)
    assert type(floor_for("mean", repeats)) is NoiseFloor
    assert split_half_fastest([100.0, 101.0, 102.0]) is None  # three records: no two halves of two
    # a configuration measured fewer times takes its neighbours' estimate
    repeats[("cpu", "once")] = [110.0]
    assert FastestFloor(repeats).floor([("cpu", "once")]) is not None
