"""``gnn-ptp data stats`` on SYNTHETIC records (hand-made numbers written to tmp_path; no measurement)."""

from __future__ import annotations

import json

import pytest

from gnn_ptp import cli, records
from gnn_ptp.stats import dataset_stats, format_stats, noise


def synthetic_record(key, *, hardware="cpu", family="gpt2", precision="fp32", status="ok", median=20.0,
                     spread=0.01, world_size=None) -> dict:
    """A synthetic record: step time ``median`` ms with (p90 - p10) / median == ``spread``."""
    r = {"schema": records.SCHEMA_VERSION, "key": key, "status": status, "family": family,
         "config": {"spec": "synthetic", "precision": precision}, "env": {"hardware": hardware},
         "synthetic": True}
    if status == "ok":
        half = median * spread / 2
        r["timing"] = {"step_ms": {"median": median, "p10": median - half, "p90": median + half, "n": 10}}
    if world_size:
        r["ddp"] = {"world_size": world_size, "backend": "gloo"}
    return r


SYNTHETIC = [
    synthetic_record("k1", median=20.0, spread=0.1),
    synthetic_record("k1", median=22.0, spread=0.01),                       # k1 measured again
    synthetic_record("k2", hardware="h100", family="bert", precision="bf16", median=5.0, spread=0.01),
    synthetic_record("k3", family="bert", precision="amp-bf16", status="oom"),
    synthetic_record("k4", family="random-mlp", status="error"),
    synthetic_record("k5", family="llama", precision="amp-bf16", median=100.0, spread=0.01, world_size=2),
]


@pytest.fixture
def synthetic_dir(tmp_path):
    folder = tmp_path / "synthetic-cpu"
    for r in SYNTHETIC[:4]:
        records.append_record(r, folder, "a.jsonl")
    for r in SYNTHETIC[4:]:
        records.append_record(r, folder, "b-ddp.jsonl")
    return folder


def test_noise_of_one_record():
    assert noise(synthetic_record("x", median=20.0, spread=0.1)) == pytest.approx(0.1)
    assert noise(synthetic_record("x", status="oom")) is None
    assert noise({"timing": {"step_ms": {"median": 0, "p10": 0, "p90": 0}}}) is None


def test_counts(synthetic_dir):
    s = dataset_stats(synthetic_dir)
    assert s["records"] == 6
    assert s["by_hardware"] == {"cpu": 5, "h100": 1}
    assert s["by_status"] == {"ok": 4, "oom": 1, "error": 1}
    assert s["by_precision"] == {"fp32": 3, "bf16": 1, "amp-bf16": 2}
    assert s["by_family"] == {"bert": 2, "gpt2": 2, "llama": 1, "random-mlp": 1}
    assert list(s["by_family"]) == sorted(s["by_family"])
    assert s["by_world_size"] == {"1": 5, "2": 1}


def test_noise_distribution(synthetic_dir):
    s = dataset_stats(synthetic_dir, min_step_ms=10.0)
    n = s["noise"]  # ok records only: 0.1, 0.01, 0.01, 0.01
    assert n["n"] == 4
    assert n["median"] == pytest.approx(0.01) and n["max"] == pytest.approx(0.1)
    assert n["p90"] == pytest.approx(0.1)
    assert n["share_le_2pct"] == pytest.approx(0.75)
    long = s["noise_steps_ge_10ms"]  # the 5 ms record is left out
    assert long["n"] == 3 and long["max"] == pytest.approx(0.1)
    assert dataset_stats(synthetic_dir, min_step_ms=50.0)["noise_steps_ge_50ms"]["n"] == 1


def test_repeat_difference(synthetic_dir):
    rep = dataset_stats(synthetic_dir)["repeat_difference"]
    assert rep["n"] == 1
    assert rep["median"] == pytest.approx(2.0 / 21.0)  # |22 - 20| / mean(20, 22)


def test_label_noise_floor_counts_the_configurations_measured_once(tmp_path):
    """k1 (cpu) measured at 20 and 22 ms: its noise is pooled to k6, measured once on the same hardware;
    k2 on the h100 has no repeated neighbour and no floor; a DDP record (k5) is not a single-process label."""
    import math

    from gnn_ptp.noise import c4

    folder = tmp_path / "floor-cpu"
    for r in SYNTHETIC + [synthetic_record("k6", median=50.0)]:
        records.append_record(r, folder, "a.jsonl")
    sigma = (22.0 - 20.0) / math.sqrt(2) / c4(2) / 21.0
    expected = math.sqrt(2 / math.pi) * sigma * 100 * (1 / math.sqrt(2) + 1) / 2
    assert dataset_stats(folder)["label_noise_floor"] == pytest.approx(expected)
    assert "label noise floor" in format_stats(dataset_stats(folder))


def test_host_probe_spread_and_changes(tmp_path):
    folder = tmp_path / "probed-cpu"
    for i, (before, after) in enumerate([(2.0, 2.1), (2.2, 2.0), (2.0, 5.0), (4.0, 4.2)]):
        r = synthetic_record(f"p{i}")
        r["host_probe"] = {"issue_us_before": before, "issue_us_after": after}
        records.append_record(r, folder, "a.jsonl")
    records.append_record(synthetic_record("old"), folder, "a.jsonl")  # collected before the probe existed
    h = dataset_stats(folder)["host_probe"]
    assert h["n"] == 4 and h["median_us"] == pytest.approx(2.1) and h["changed_during_record"] == 1
    assert "host issue cost" in format_stats(dataset_stats(folder))
    assert "fresh" not in h and "fresh-mapping" not in format_stats(dataset_stats(folder))  # no record probed it
    r = synthetic_record("f")  # a record with the fresh-mapping probe (synthetic readings, named so)
    r["host_probe"] = {"issue_us_before": 2.0, "issue_us_after": 2.0, "fresh_ms_per_mib_before": 2.8,
                       "fresh_ms_per_mib_after": 2.7, "fresh_faults_per_mib": 256.0}
    records.append_record(r, folder, "a.jsonl")
    r = synthetic_record("g")  # a probe that took no fault (a reused buffer): no reading, counted apart
    r["host_probe"] = {"issue_us_before": 2.0, "issue_us_after": 2.0, "fresh_ms_per_mib_before": 0.003,
                       "fresh_ms_per_mib_after": 0.4, "fresh_faults_per_mib": 0.0}
    records.append_record(r, folder, "a.jsonl")
    h = dataset_stats(folder)["host_probe"]
    assert h["n"] == 6 and h["fresh"]["n"] == 1 and h["fresh"]["no_fault"] == 1 and h["fresh"]["median_ms_per_mib"] == 2.8
    assert ("fresh-mapping cost (host_probe.fresh_fill): n 1, median 2.80 ms per MiB, p10-p90 2.80-2.80; 1 probes took "
            "no fault") in format_stats(dataset_stats(folder))
    assert dataset_stats(folder / "a.jsonl")["host_probe"]["n"] == 6


def test_optimizer_zero_shares_per_family(tmp_path):
    folder = tmp_path / "zeros-cpu"
    for i, (family, zeros) in enumerate([("resnet", 70), ("resnet", 10), ("resnet", 30), ("bert", 5)]):
        r = synthetic_record(f"z{i}")  # synthetic counts, named so
        r["family"] = family
        r["optimizer_state"] = {"exp_avg_sq": {"elements": 100, "zeros": zeros}}
        records.append_record(r, folder, "a.jsonl")
    records.append_record(synthetic_record("old"), folder, "a.jsonl")  # collected before the count existed
    z = dataset_stats(folder)["optimizer_zeros"]
    assert z["n"] == 4 and z["by_family"]["resnet"] == {"median": 0.3, "max": 0.7, "n": 3}
    assert z["by_family"]["bert"]["median"] == 0.05
    assert "resnet 30% (max 70%), bert 5%" in format_stats(dataset_stats(folder))


def test_single_file_and_empty_distributions(tmp_path):
    path = tmp_path / "only-failures.jsonl"
    records.append_record(synthetic_record("k", status="oom"), tmp_path, path.name)
    s = dataset_stats(path)
    assert s["records"] == 1 and s["noise"] == {"n": 0} and s["repeat_difference"] == {"n": 0}
    text = format_stats(s)
    assert "records: 1" in text and "none" in text


def test_format_stats(synthetic_dir):
    text = format_stats(dataset_stats(synthetic_dir))
    lines = text.splitlines()
    assert lines[0] == "records: 6"
    assert any(line.startswith("hardware") and "cpu 5" in line and "h100 1" in line for line in lines)
    assert any(line.startswith("status") and "oom 1" in line for line in lines)
    assert any(line.startswith("noise (p90-p10)/median") and "n 4" in line for line in lines)
    assert any(line.startswith("re-measured configurations") and "n 1" in line for line in lines)


def test_cli_data_stats(synthetic_dir, capsys):
    assert cli.main(["data", "stats", str(synthetic_dir), "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["records"] == 6 and s["by_status"]["oom"] == 1
    assert cli.main(["data", "stats", str(synthetic_dir), "--min-step-ms", "50"]) == 0
    assert "steps >= 50" in capsys.readouterr().out


def test_cli_data_stats_errors(tmp_path, capsys):
    assert cli.main(["data", "stats", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("gnn-ptp data stats: error:") and "missing" in err and len(err.splitlines()) == 1
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"key": 1}\nnot json\n{"key": 2}\n')
    assert cli.main(["data", "stats", str(bad)]) == 2
