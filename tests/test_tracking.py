"""Weights & Biases logging, offline (no network): train on the SYNTHETIC dataset with a ``WandbLogger``,
then read the run back from its ``.wandb`` log on disk and check config, per-epoch history and summary."""

from __future__ import annotations

import json
import struct
import sys
import time
from pathlib import Path

import pytest

from gnn_ptp import cli, dataset
from gnn_ptp.errors import UserError
from gnn_ptp.model import ModelConfig
from gnn_ptp.train import TrainConfig, train

from synthetic_data import load_synthetic_graphs, write_synthetic_dataset

SMALL = TrainConfig(model=ModelConfig(hidden=16, depth=1), epochs=3, threads=1)


@pytest.fixture
def synthetic_dir(tmp_path, monkeypatch):
    """A SYNTHETIC dataset folder; its graphs are made up from the record keys instead of traced."""
    monkeypatch.setattr(dataset, "load_graphs", load_synthetic_graphs)
    return write_synthetic_dataset(tmp_path / "synthetic-cpu")


@pytest.fixture
def offline_wandb(tmp_path, monkeypatch):
    """wandb offline, with everything it writes (runs, its cache and logs, settings) under tmp_path."""
    wandb = pytest.importorskip("wandb")
    wandb.teardown()  # wandb keeps settings (the run folder...) process-wide from its first init
    for name in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(name, str(tmp_path / ("" if name == "WANDB_DIR" else "wandb-home")))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    wandb.teardown()


# --- reading an offline run back ---------------------------------------------------------------------
# wandb stores a run as records in a LevelDB-style log (the format ``wandb sync`` uploads): a 7-byte file
# header (":W&B", magic 0xBEE1, version), then 32 KiB blocks of chunks, each with a 7-byte header (CRC,
# length, type: 1 full, 2 first, 3 middle, 4 last), each record a wandb_internal_pb2.Record protobuf.

BLOCK, HEADER = 32 * 1024, 7


def read_wandb_log(path: Path) -> list:
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    if len(data) < HEADER:  # not written yet
        return []
    ident, magic, _version = struct.unpack("<4sHB", data[:HEADER])
    assert (ident, magic) == (b":W&B", 0xBEE1), f"{path} is not a wandb log"
    out, pos, pending = [], HEADER, b""
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:  # block trailer: zero padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + HEADER])
        if kind == 0 or pos + HEADER + length > len(data):  # the end, or a chunk still being written
            break
        pending += data[pos + HEADER:pos + HEADER + length]
        pos += HEADER + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            out.append(record)
            pending = b""
    return out


def _key(item) -> str:
    return item.key or ".".join(item.nested_key)


def offline_run(root: Path, timeout_s: float = 60.0) -> dict:
    """The one offline run under ``root/wandb``: its config, history rows, final summary and tags.

    ``run.finish()`` can return before wandb's service process has written the whole log (seen once in CI:
    the log read back had no config yet), so the log is read again until it ends with the run's ``exit``
    record."""
    runs = sorted((root / "wandb").glob("offline-run-*"))
    assert len(runs) == 1, runs
    (log_file,) = runs[0].glob("*.wandb")
    deadline = time.monotonic() + timeout_s
    while True:
        records = read_wandb_log(log_file)
        kinds = [r.WhichOneof("record_type") for r in records]
        if "exit" in kinds:
            break
        assert time.monotonic() < deadline, f"{log_file} has no exit record after {timeout_s} s: {kinds}"
        time.sleep(0.2)
    run = {"config": {}, "history": [], "summary": {}, "tags": []}
    for record in records:
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run["tags"] = list(record.run.tags)
            run["config"].update({_key(i): json.loads(i.value_json) for i in record.run.config.update})
        elif kind == "config":
            run["config"].update({_key(i): json.loads(i.value_json) for i in record.config.update})
        elif kind == "history":
            run["history"].append({_key(i): json.loads(i.value_json) for i in record.history.item})
        elif kind == "summary":
            run["summary"].update({_key(i): json.loads(i.value_json) for i in record.summary.update})
    run["config"].pop("_wandb", None)
    return run


# --- tests ---------------------------------------------------------------------------------------------


def test_train_logs_config_history_and_summary_offline(offline_wandb, synthetic_dir):
    from gnn_ptp.tracking import WandbLogger

    logger = WandbLogger(SMALL.to_dict(), name="synthetic-train", tags=["test"], dir=str(offline_wandb))
    try:
        result = train(SMALL, synthetic_dir, None, logger=logger, log=lambda msg: None)
    finally:
        logger.finish()

    run = offline_run(offline_wandb)
    assert run["config"] == json.loads(json.dumps(SMALL.to_dict()))
    assert run["tags"] == ["test"]
    assert [row["epoch"] for row in run["history"]] == [1, 2, 3]
    for row in run["history"]:
        assert {"loss", "train_mape", "val_mape"} <= set(row) and row["loss"] > 0
    summary = run["summary"]
    assert summary["best_epoch"] == result["best_epoch"]
    assert summary["val_mape"] == pytest.approx(result["val_mape"])
    assert summary["val_mape"] == pytest.approx(min(row["val_mape"] for row in run["history"]))
    assert summary["test_mape"] == pytest.approx(result["metrics"]["test"]["overall"]["mape"])


def test_cli_train_wandb_offline(offline_wandb, synthetic_dir, capsys):
    out = offline_wandb / "checkpoint"
    code = cli.main(["train", "--data", str(synthetic_dir), "--out", str(out), "--epochs", "2",
                     "--threads", "1", "--wandb", "--wandb-project", "gnn-ptp-test"])
    assert code == 0, capsys.readouterr().err
    assert (out / "model.pt").is_file() and (out / "meta.json").is_file()
    run = offline_run(offline_wandb)
    assert run["config"]["data"] == str(synthetic_dir)
    assert run["config"]["epochs"] == 2 and run["config"]["threads"] == 1
    assert run["config"]["model"] == json.loads(json.dumps(ModelConfig().to_dict()))
    assert run["tags"] == ["train"]
    assert [row["epoch"] for row in run["history"]] == [1, 2]
    meta = json.loads((out / "meta.json").read_text())
    assert run["summary"]["best_epoch"] == meta["best_epoch"]
    assert run["summary"]["val_mape"] == pytest.approx(meta["val_mape"])


def test_missing_wandb_is_one_line_with_the_install_hint(monkeypatch):
    from gnn_ptp.tracking import WandbLogger

    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb -> ImportError
    with pytest.raises(UserError, match="pip install wandb"):
        WandbLogger({})
