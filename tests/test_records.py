"""Reading records: bad lines (invalid JSON, missing fields, wrong types) are skipped and reported once
as file:line with their count, and work goes on; ``strict`` refuses instead."""

from __future__ import annotations

import json

import pytest

from gnn_ptp import cli, records
from gnn_ptp.errors import UserError


def test_corrupt_middle_line_is_skipped_and_reported(tmp_path):
    """A bad line mid-file no longer stops everything: the good records are read, the bad ones reported
    once with their count and file:line; ``strict`` refuses instead."""
    path = tmp_path / "x.jsonl"
    path.write_text('{"key": "a"}\nnot json\n{"key": "c"}\n[1]\n')
    warnings = []
    assert [r["key"] for r in records.iter_records(path, warn=warnings.append)] == ["a", "c"]
    assert len(warnings) == 1 and "2 bad" in warnings[0] and "x.jsonl:2" in warnings[0] and "x.jsonl:4" in warnings[0]
    with pytest.raises(UserError, match="x.jsonl:2"):
        list(records.iter_records(path, strict=True))


def test_measurement_problem_names_the_field(tmp_path):
    good = {"key": "k", "status": "ok", "config": {"spec": "hf:gpt2", "precision": "fp32", "batch_size": 2},
            "env": {"hardware": "cpu"},
            "timing": {k: {"median": 1.0} for k in ("forward_ms", "backward_ms", "optimizer_ms", "step_ms")}}
    assert records.measurement_problem(good) is None
    assert "config.batch_size" in records.measurement_problem({**good, "config": {**good["config"], "batch_size": "2"}})
    assert "env.hardware" in records.measurement_problem({**good, "env": {}})
    assert "timing.step_ms" in records.measurement_problem(
        {**good, "timing": {**good["timing"], "step_ms": {"median": None}}})
    assert records.measurement_problem({**good, "status": "error", "timing": None}) is None
    path = tmp_path / "x.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps({**good, "env": {}}) + "\n")
    warnings = []
    rows = list(records.iter_records(path, warn=warnings.append, check=records.measurement_problem))
    assert len(rows) == 1 and "x.jsonl:2: missing or non-string field 'env.hardware'" in warnings[0]


def test_data_stats_skips_bad_lines_and_strict_refuses(tmp_path, capsys):
    from pathlib import Path

    lines = (Path(__file__).resolve().parent.parent / "datasets" / "cpu" / "cpu.jsonl").read_text().splitlines()[:4]
    bad = json.loads(lines[1])
    del bad["config"]["precision"]
    (tmp_path / "d.jsonl").write_text("\n".join([lines[0], "{torn", json.dumps(bad), *lines[2:]]) + "\n")
    assert cli.main(["data", "stats", str(tmp_path), "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["records"] == 3
    assert err.count("warning:") == 1 and "skipped 2 bad" in err and "d.jsonl:2" in err and "d.jsonl:3" in err
    assert cli.main(["data", "stats", str(tmp_path), "--strict"]) == 2
    assert "d.jsonl:2" in capsys.readouterr().err
