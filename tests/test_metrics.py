"""Error metrics (gnn_ptp/metrics.py): closed forms, percentages as plain JSON numbers."""

from __future__ import annotations

import json

import numpy as np
import pytest

from gnn_ptp import metrics


def test_ape_is_the_absolute_relative_error_in_percent():
    got = metrics.ape([110.0, 90.0, 100.0, 1.0, 30.0], [100.0, 100.0, 100.0, 4.0, 10.0])
    np.testing.assert_allclose(got, [10.0, 10.0, 0.0, 75.0, 200.0])
    np.testing.assert_allclose(metrics.ape([-3.0], [-2.0]), [50.0])  # relative to |true|


def test_summarize_closed_forms():
    s = metrics.summarize(np.arange(1, 11, dtype=float))  # 1..10
    assert s == {"mape": 5.5, "median_ape": 5.5, "p90_ape": pytest.approx(9.1), "n": 10}
    s = metrics.summarize([4.0, 1.0, 100.0])
    assert s["mape"] == 35.0 and s["median_ape"] == 4.0 and s["n"] == 3
    assert s["p90_ape"] == pytest.approx(4.0 + 0.8 * 96.0)  # linear interpolation between 4 and 100
    one = metrics.summarize([7.5])
    assert one == {"mape": 7.5, "median_ape": 7.5, "p90_ape": 7.5, "n": 1}


def test_summarize_of_nothing_has_no_numbers():
    assert metrics.summarize([]) == {"mape": None, "median_ape": None, "p90_ape": None, "n": 0}


def test_summary_values_are_plain_python_numbers():
    s = metrics.summarize(np.array([1.0, 2.0], dtype=np.float32))
    assert type(s["mape"]) is float and type(s["median_ape"]) is float and type(s["p90_ape"]) is float
    assert type(s["n"]) is int
    json.dumps(s)  # no numpy scalars


def test_grouped_and_report():
    pred = [110.0, 80.0, 100.0, 50.0]
    true = [100.0, 100.0, 100.0, 100.0]
    r = metrics.report(pred, true, ["fp32", "bf16", "fp32", "bf16"], ["b", "a", "a", "b"])
    assert set(r) == {"overall", "per_precision", "per_family"}
    assert r["overall"]["mape"] == pytest.approx((10 + 20 + 0 + 50) / 4) and r["overall"]["n"] == 4
    assert list(r["per_precision"]) == ["bf16", "fp32"]  # sorted
    assert r["per_precision"]["fp32"]["mape"] == pytest.approx(5.0)
    assert r["per_precision"]["bf16"]["mape"] == pytest.approx(35.0)
    assert r["per_family"]["a"]["mape"] == pytest.approx(10.0) and r["per_family"]["a"]["n"] == 2
    assert r["per_family"]["b"]["median_ape"] == pytest.approx(30.0)
    json.dumps(r)
