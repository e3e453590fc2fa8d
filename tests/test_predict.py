"""``gnn_ptp.predict`` and ``gnn-ptp predict`` on ONE GPU, with a tiny real checkpoint: a GNN trained for
two epochs on the SYNTHETIC dataset (made-up graphs and times, see synthetic_data.py), so its numbers
mean nothing, but its graphs have the features tracing produces and predict really traces random:mlp:3.
Checks what predict promises: consistent fields, echoed inputs, job arithmetic, OOD warnings, the default
checkpoint lookup, the on-disk graph cache and the CLI's JSON. (gpus > 1 is tests/test_comm.py's.)"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch

import gnn_ptp
import gnn_ptp.prediction as predict_mod
from gnn_ptp import cli, dataset, prior
from gnn_ptp.errors import UserError
from gnn_ptp.model import ModelConfig
from gnn_ptp.precision import PRECISION_NAMES
from gnn_ptp.prediction import predict
from gnn_ptp.train import TrainConfig, train, train_ranges

from synthetic_data import load_synthetic_graphs, write_synthetic_dataset

SPEC = "random:mlp:3"
PHASE_KEYS = ("forward_ms", "backward_ms", "optimizer_ms")
JSON_KEYS = {"forward_ms", "backward_ms", "optimizer_ms", "compute_ms", "comm_exposed_ms", "iteration_ms",
             "spec", "precision", "batch_size", "seq_len", "image_size", "optimizer", "gpus", "hardware"}


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    """A tiny cpu checkpoint (trace target cpu) trained on the synthetic dataset."""
    root = tmp_path_factory.mktemp("predict-ckpt")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dataset, "load_graphs", load_synthetic_graphs)
        data = write_synthetic_dataset(root / "synthetic-cpu")
        cfg = TrainConfig(model=ModelConfig(hidden=16, depth=1), epochs=2, threads=1)
        train(cfg, data, root / "cpu", log=lambda m: None)
    meta = json.loads((root / "cpu" / "meta.json").read_text())
    assert meta["hardware"] == "cpu" and meta["trace_target"] == "cpu" and "train_ranges" in meta
    return root / "cpu"


@pytest.fixture(scope="module")
def module_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("graph-cache")


@pytest.fixture(autouse=True)
def graph_cache(module_cache, monkeypatch) -> Path:
    """Graphs cached under a temp folder, never in ~/.cache; no checkpoint lookup outside tmp."""
    monkeypatch.setenv("GNN_PTP_CACHE", str(module_cache))
    monkeypatch.delenv("GNN_PTP_CHECKPOINTS", raising=False)
    return module_cache


def _variant(ckpt: Path, dest: Path, **meta_changes) -> Path:
    """A copy of the checkpoint whose meta.json is changed (same weights)."""
    shutil.copytree(ckpt, dest)
    meta = json.loads((dest / "meta.json").read_text())
    meta.update(meta_changes)
    (dest / "meta.json").write_text(json.dumps(meta))
    return dest


def _traced(precision: str = "amp-bf16", batch_size: int = 8, target: str = "cpu"):
    """The graph of SPEC traced here, independently of predict."""
    from torch_geometric.data import Data

    from gnn_ptp.graph import to_data
    from gnn_ptp.spec import Shape, parse_spec
    from gnn_ptp.trace import StepConfig, trace_step

    data, _ = to_data(trace_step(StepConfig(parse_spec(SPEC), Shape(batch_size), precision, "adamw", target)))
    return Data(**{k: data[k] for k in ("x", "x_cat", "edge_index", "edge_attr", "u", "phase")},
                num_nodes=data.num_nodes)


# --- the documented entry point ------------------------------------------------------------------------

def test_gnn_ptp_predict_is_the_function_after_the_submodule_is_imported():
    assert callable(gnn_ptp.predict)  # this module imported gnn_ptp.prediction above, as the CLI does


def test_gnn_ptp_predict_resolves_in_a_fresh_process():
    import subprocess
    import sys

    code = "import gnn_ptp; assert callable(gnn_ptp.predict); assert gnn_ptp.Prediction.__name__ == 'Prediction'"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-500:]


# --- one prediction -----------------------------------------------------------------------------------


def test_prediction_fields_are_consistent_and_inputs_are_echoed(ckpt):
    p = predict(SPEC, precision="amp-bf16", batch_size=8, checkpoint=ckpt, hardware="cpu")
    assert isinstance(p, predict_mod.Prediction)
    for key in PHASE_KEYS:
        assert getattr(p, key) > 0 and math.isfinite(getattr(p, key))
    assert p.compute_ms == pytest.approx(p.forward_ms + p.backward_ms + p.optimizer_ms, rel=1e-12)
    assert p.comm_exposed_ms == 0.0  # one GPU: nothing to all-reduce
    assert p.iteration_ms == pytest.approx(p.compute_ms + p.comm_exposed_ms, rel=1e-12)
    assert (p.spec, p.precision, p.batch_size, p.optimizer, p.gpus) == (SPEC, "amp-bf16", 8, "adamw", 1)
    assert p.seq_len is None and p.image_size is None  # an MLP takes neither
    assert p.hardware == "cpu" and p.checkpoint == str(ckpt)
    assert p.steps is None and p.total_s is None and p.gpu_hours is None and p.cost is None
    assert p.peak_memory_bytes > 0 and isinstance(p.fits_in_memory, bool)
    assert p.params > 0 and p.flops > 0
    assert p.top_ops and all(t["ms"] > 0 for t in p.top_ops)
    assert [t["ms"] for t in p.top_ops] == sorted((t["ms"] for t in p.top_ops), reverse=True)
    assert sum(t["ms"] for t in p.top_ops) <= p.compute_ms * (1 + 1e-6)
    json.dumps(p.to_dict())


def test_prediction_is_the_checkpoint_applied_to_the_traced_graph(ckpt):
    from gnn_ptp import checkpoint

    p = predict(SPEC, precision="amp-bf16", batch_size=8, checkpoint=ckpt)
    model, _ = checkpoint.load(ckpt)
    from torch_geometric.data import Batch

    with torch.no_grad():
        out = model(Batch.from_data_list([_traced("amp-bf16", 8)]))
    want = out["log_phase_ms"][0].double().exp().tolist()
    assert [p.forward_ms, p.backward_ms, p.optimizer_ms] == pytest.approx(want, rel=1e-5)
    from gnn_ptp import memory
    from gnn_ptp.spec import Shape, parse_spec
    from gnn_ptp.trace import StepConfig, trace_step

    # memory is the analytic figure of the same trace, not the GNN's memory head
    want_memory = memory.estimate(trace_step(StepConfig(parse_spec(SPEC), Shape(8), "amp-bf16", "adamw", "cpu")))
    assert p.peak_memory_bytes == want_memory.peak_bytes
    assert p.memory["floor_bytes"] == want_memory.floor_bytes
    assert p.fits_in_memory == (want_memory.device_bytes <= 24e9)


def test_overrides_and_optimizer_are_echoed(ckpt):
    p = predict(SPEC, precision="fp32", batch_size=4, checkpoint=ckpt, overrides=["width=32"],
                        optimizer="sgd")
    assert p.overrides == {"width": 32} and p.optimizer == "sgd" and p.batch_size == 4
    base = predict(SPEC, precision="fp32", batch_size=4, checkpoint=ckpt, optimizer="sgd")
    assert p.params < base.params  # the override reached the model


def _trained(ckpt) -> list[str]:
    from gnn_ptp.prediction import trained_precisions

    return trained_precisions(json.loads((ckpt / "meta.json").read_text()))


def test_precision_all_returns_one_row_per_trained_precision_class(ckpt):
    trained = _trained(ckpt)
    assert 0 < len(trained) < 6, "the synthetic split should leave some precision classes out of training"
    preds = predict(SPEC, precision="all", batch_size=8, checkpoint=ckpt)
    assert [p.precision for p in preds] == trained
    for p in preds:
        assert p.compute_ms == pytest.approx(p.forward_ms + p.backward_ms + p.optimizer_ms, rel=1e-12)
        assert p.iteration_ms == pytest.approx(p.compute_ms, rel=1e-12)
        assert not any(f"never saw {p.precision}" in w for w in p.warnings)
    one = predict(SPEC, precision=trained[-1], batch_size=8, checkpoint=ckpt)
    assert preds[-1].iteration_ms == pytest.approx(one.iteration_ms, rel=1e-5)  # batching changes nothing


def test_an_untrained_precision_class_is_predicted_with_a_warning(ckpt):
    untrained = [p for p in PRECISION_NAMES if p not in _trained(ckpt)][0]
    p = predict(SPEC, precision=untrained, batch_size=8, checkpoint=ckpt)
    assert any(f"never saw {untrained}" in w for w in p.warnings)


def test_job_time_and_cost_from_steps(ckpt):
    p = predict(SPEC, batch_size=8, checkpoint=ckpt, steps=1000, gpu_hour_cost=3.0)
    assert p.steps == 1000
    assert p.total_s == pytest.approx(p.iteration_ms * 1000 / 1e3)
    assert p.gpu_hours == pytest.approx(p.total_s / 3600)
    assert p.cost == pytest.approx(p.gpu_hours * 3.0)


def test_job_steps_from_epochs_and_dataset_size(ckpt):
    p = predict(SPEC, batch_size=8, checkpoint=ckpt, epochs=2.5, dataset_size=1001)
    assert p.steps == 313  # ceil(2.5 * 1001 / 8): a partial last batch is a step
    assert p.total_s == pytest.approx(p.iteration_ms * 313 / 1e3)
    assert p.cost is None  # no price given


def test_job_steps_from_epochs_are_not_inflated_by_float_rounding(ckpt):
    p = predict(SPEC, batch_size=100, checkpoint=ckpt, epochs=1.1, dataset_size=50000)
    assert p.steps == 550


@pytest.mark.parametrize("kwargs, match", [
    ({"epochs": 3}, r"--epochs needs --dataset-size"),
    ({"epochs": 3, "dataset_size": 100, "steps": 10}, r"--steps or --epochs, not both"),
    ({"gpus": 0}, r"--gpus must be at least 1"),
    ({"precision": "fp8-magic"}, r"fp8-magic"),
])
def test_bad_job_arguments_are_user_errors(ckpt, kwargs, match):
    with pytest.raises(UserError, match=match):
        predict(SPEC, batch_size=8, checkpoint=ckpt, **kwargs)


def test_a_gpu_checkpoint_traces_for_cuda(ckpt, tmp_path):
    from gnn_ptp.graph import feature_version

    # the same weights said to be trained on CUDA graphs (their feature version: CPU graphs carry a revision)
    h100 = _variant(ckpt, tmp_path / "h100", hardware="h100", trace_target="cuda",
                    feature_version=feature_version("cuda"))
    p = predict(SPEC, precision="amp-bf16", batch_size=8, checkpoint=h100)
    assert p.hardware == "h100"
    from gnn_ptp import checkpoint
    from torch_geometric.data import Batch

    model, _ = checkpoint.load(h100)
    with torch.no_grad():
        out = model(Batch.from_data_list([_traced("amp-bf16", 8, target="cuda")]))
    assert p.forward_ms == pytest.approx(float(out["log_phase_ms"][0, 0].exp()), rel=1e-5)


# --- out-of-distribution warnings ---------------------------------------------------------------------


def test_no_warnings_inside_the_training_ranges(ckpt, tmp_path):
    inside = _variant(ckpt, tmp_path / "inside", train_ranges=train_ranges([_traced("fp32", 8)]))
    p = predict(SPEC, precision="fp32", batch_size=8, checkpoint=inside)
    assert p.warnings == []


def test_warnings_outside_the_training_ranges_and_for_unseen_ops(ckpt, tmp_path):
    from gnn_ptp import ops
    from gnn_ptp.graph import GRAPH_FEATURE_NAMES

    graph = _traced("fp32", 8)
    ranges = train_ranges([graph])
    b = GRAPH_FEATURE_NAMES.index("log_batch")
    ranges["u_min"][b] = ranges["u_max"][b] = math.log2(1 + 2)  # trained on batch 2 only
    dropped = ops.VOCAB[ranges["op_ids"].pop(0)]  # an op it never saw
    narrow = _variant(ckpt, tmp_path / "narrow", train_ranges=ranges)
    p = predict(SPEC, precision="fp32", batch_size=8, checkpoint=narrow)
    assert len(p.warnings) == 3, p.warnings  # the two, and the CPU prior's own answer beside the extrapolation
    assert any(w.startswith("batch is 8, outside the training range [2, 2]") for w in p.warnings)
    assert any(w.startswith("the calibrated prior alone says") for w in p.warnings)
    assert any("never saw" in w and dropped in w for w in p.warnings)


def test_the_synthetic_checkpoint_warns_about_real_graphs(ckpt):
    """Its training graphs have made-up features near 0: a real graph lies far outside them."""
    p = predict(SPEC, precision="fp32", batch_size=8, checkpoint=ckpt)
    assert any("outside the training range" in w for w in p.warnings)
    assert any("params" in w for w in p.warnings)


# --- default checkpoint lookup ------------------------------------------------------------------------


def test_default_checkpoint_comes_from_gnn_ptp_checkpoints(ckpt, tmp_path, monkeypatch):
    shipped = tmp_path / "shipped"
    shutil.copytree(ckpt, shipped / "cpu")
    monkeypatch.setenv("GNN_PTP_CHECKPOINTS", str(shipped))
    p = predict(SPEC, precision="fp32", batch_size=8, hardware="cpu")
    assert p.checkpoint == str(shipped / "cpu") and p.hardware == "cpu"


def test_missing_default_checkpoint_is_one_line_naming_what_is_shipped(ckpt, tmp_path, monkeypatch):
    monkeypatch.setenv("GNN_PTP_CHECKPOINTS", str(tmp_path / "empty"))
    monkeypatch.chdir(tmp_path)
    shutil.copytree(ckpt, tmp_path / "checkpoints" / "madeup-gpu")  # ./checkpoints/<hw> is looked in
    with pytest.raises(UserError) as e:
        predict(SPEC, batch_size=8, hardware="tpu-v9")
    message = str(e.value)
    assert "\n" not in message
    assert message.startswith("no tpu-v9 checkpoint")
    assert "shipped: " in message and "madeup-gpu" in message and "--checkpoint" in message


def test_missing_default_checkpoint_names_those_in_gnn_ptp_checkpoints(ckpt, tmp_path, monkeypatch):
    shutil.copytree(ckpt, tmp_path / "mine" / "cpu")
    monkeypatch.setenv("GNN_PTP_CHECKPOINTS", str(tmp_path / "mine"))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match=r"shipped: .*\bcpu\b"):
        predict(SPEC, batch_size=8, hardware="tpu-v9")


def test_cli_missing_checkpoint_is_exit_2_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GNN_PTP_CHECKPOINTS", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    code = cli.main(["predict", SPEC, "--hardware", "tpu-v9"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("gnn-ptp predict: error: no tpu-v9 checkpoint")
    assert len(err.strip().splitlines()) == 1


# --- the on-disk graph cache --------------------------------------------------------------------------


def test_graphs_are_cached_on_disk_and_reused(ckpt, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("GNN_PTP_CACHE", str(cache))
    calls = []
    real = predict_mod._build_graph

    def build_once(config):
        calls.append(config)
        if len(calls) > 1:
            raise AssertionError("traced again although the graph is cached on disk")
        return real(config)

    monkeypatch.setattr(predict_mod, "_build_graph", build_once)
    first = predict(SPEC, precision="amp-bf16", batch_size=6, checkpoint=ckpt)
    files = list(cache.rglob("*.pt"))
    assert len(calls) == 1 and len(files) == 1
    entry = torch.load(files[0], weights_only=True)  # plain tensors: safe to load
    assert entry["tensors"]["x"].shape[1] == 16
    second = predict(SPEC, precision="amp-bf16", batch_size=6, checkpoint=ckpt)
    assert len(calls) == 1
    assert second.to_dict() == first.to_dict()


def test_another_shape_or_precision_is_another_cache_entry(ckpt, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("GNN_PTP_CACHE", str(cache))
    predict(SPEC, precision="fp32", batch_size=6, checkpoint=ckpt)
    predict(SPEC, precision="fp32", batch_size=7, checkpoint=ckpt)
    predict(SPEC, precision="bf16", batch_size=7, checkpoint=ckpt)
    assert len(list(cache.rglob("*.pt"))) == 3


def test_no_disk_cache_neither_reads_nor_writes(ckpt, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("GNN_PTP_CACHE", str(cache))
    predict(SPEC, precision="fp32", batch_size=5, checkpoint=ckpt)
    calls = []
    real = predict_mod._build_graph
    monkeypatch.setattr(predict_mod, "_build_graph", lambda c: calls.append(c) or real(c))
    before = {p: p.stat().st_mtime_ns for p in cache.rglob("*.pt")}
    predict(SPEC, precision="fp32", batch_size=5, checkpoint=ckpt, use_disk_cache=False)
    predict(SPEC, precision="fp32", batch_size=3, checkpoint=ckpt, use_disk_cache=False)
    assert len(calls) == 2
    assert {p: p.stat().st_mtime_ns for p in cache.rglob("*.pt")} == before


def test_an_unreadable_cache_entry_is_rebuilt(ckpt, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("GNN_PTP_CACHE", str(cache))
    good = predict(SPEC, precision="fp32", batch_size=5, checkpoint=ckpt)
    (entry,) = cache.rglob("*.pt")
    entry.write_bytes(b"not a torch file")
    again = predict(SPEC, precision="fp32", batch_size=5, checkpoint=ckpt)
    assert again.iteration_ms == pytest.approx(good.iteration_ms, rel=1e-6)
    assert torch.load(entry, weights_only=True)["tensors"]["x"].shape[1] == 16  # rewritten


# --- the CLI ------------------------------------------------------------------------------------------


def test_cli_predict_json(ckpt, capsys):
    code = cli.main(["predict", SPEC, "--checkpoint", str(ckpt), "--batch-size", "8", "--precision", "amp-bf16",
                     "--steps", "200", "--gpu-hour-cost", "2", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    row = json.loads(out)
    assert JSON_KEYS <= set(row)
    assert (row["spec"], row["precision"], row["batch_size"], row["gpus"], row["hardware"]) == \
        (SPEC, "amp-bf16", 8, 1, "cpu")
    assert row["compute_ms"] == pytest.approx(row["forward_ms"] + row["backward_ms"] + row["optimizer_ms"])
    assert row["iteration_ms"] == pytest.approx(row["compute_ms"] + row["comm_exposed_ms"])
    assert row["steps"] == 200 and row["cost"] == pytest.approx(row["iteration_ms"] * 200 / 1e3 / 3600 * 2)


def test_cli_predict_all_json_and_table(ckpt, capsys):
    code = cli.main(["predict", SPEC, "--checkpoint", str(ckpt), "--precision", "all", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    result = json.loads(out)
    assert set(result) == {"predictions", "fastest"}
    rows = result["predictions"]
    assert [r["precision"] for r in rows] == _trained(ckpt)
    assert all(JSON_KEYS <= set(r) for r in rows)
    assert result["fastest"] == min(rows, key=lambda r: r["iteration_ms"])["precision"]

    code = cli.main(["predict", SPEC, "--checkpoint", str(ckpt), "--precision", "all"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert f"fastest: {result['fastest']}" in out
    assert all(name in out for name in _trained(ckpt))


def test_cli_epochs_without_dataset_size_is_exit_2(ckpt, capsys):
    code = cli.main(["predict", SPEC, "--checkpoint", str(ckpt), "--epochs", "3"])
    err = capsys.readouterr().err
    assert code == 2 and "--epochs needs --dataset-size" in err


# --- the human table (hand-made Prediction rows, no checkpoint) -------------------------------------------


def _row(precision, ms, warnings=()):
    from gnn_ptp.prediction import Prediction

    return Prediction("hf:llama", precision, 4, 2048, None, "adamw", 1, "h100", forward_ms=ms / 3,
                      backward_ms=2 * ms / 3, optimizer_ms=0.0, compute_ms=ms, comm_exposed_ms=0.0, iteration_ms=ms,
                      warnings=list(warnings))


def test_table_columns_stay_apart_for_long_steps():
    """Steps over 10 s are shown in seconds, so every column keeps a space before it."""
    from gnn_ptp.prediction import format_predictions

    text = format_predictions([_row("fp32", 1_364_222.5), _row("bf16", 93.3)])
    fp32 = next(line for line in text.splitlines() if line.startswith("fp32"))
    assert fp32.split() == ["fp32", "454.7s", "909.5s", "0.0ms", "1364.2s", "0.0ms", "1364.2s", "-"]
    bf16 = next(line for line in text.splitlines() if line.startswith("bf16"))
    assert bf16.split()[1:3] == ["31.1ms", "62.2ms"]


def test_out_of_range_warnings_are_merged_across_precision_classes():
    from gnn_ptp.prediction import format_predictions

    rng = "outside the training range [1, 129]: extrapolating"
    rows = [_row("fp32", 10.0, [f"seq_len is 2.05e+03, {rng}", f"params is 7e+09, {rng}", "ops: x"]),
            _row("bf16", 10.0, [f"seq_len is 2.05e+03, {rng}", f"params is 3e+09, {rng}", "ops: x"])]
    warnings = [line for line in format_predictions(rows).splitlines() if line.startswith("warning:")]
    assert warnings == ["warning: ops: x", f"warning: params is 7e+09 (fp32), 3e+09 (bf16), {rng}",
                        f"warning: seq_len is 2.05e+03, {rng}"]


def test_small_peak_memory_is_shown_in_kilobytes_not_as_zero_megabytes():
    from dataclasses import replace

    from gnn_ptp.prediction import format_predictions

    def mem(n):
        text = format_predictions([replace(_row("fp32", 1.0), peak_memory_bytes=n)])
        return next(line for line in text.splitlines() if line.startswith("fp32")).split(maxsplit=7)[-1]

    assert [mem(n) for n in (420e3, 3.4e6, 2.25e9)] == ["420 kB", "3 MB", "2.2 GB"]


def test_max_batch_size_is_the_largest_that_fits(ckpt, monkeypatch):
    """--max-batch-size: the batch found fits and the next one does not (analytic memory), and its
    step time is the checkpoint's prediction at that batch. (A 1 GB CPU, so that the tiny MLP meets
    the edge below the search's limit.)"""
    from dataclasses import replace

    from gnn_ptp import memory
    from gnn_ptp.hardware import HARDWARE
    from gnn_ptp.prediction import max_batch_sizes
    from gnn_ptp.spec import Shape, parse_spec
    from gnn_ptp.trace import StepConfig, trace_step

    monkeypatch.setitem(HARDWARE, "cpu", replace(HARDWARE["cpu"], memory_bytes=1e9))
    fits, notes = max_batch_sizes(SPEC, ["fp32", "bf16"], checkpoint=ckpt)
    for f in fits:
        def est(b):
            return memory.estimate(trace_step(StepConfig(parse_spec(SPEC), Shape(b), f.precision, "adamw", "cpu")))

        assert f.max_batch_size > 1 and f.capacity_bytes == 1e9
        assert est(f.max_batch_size).fits(1e9) and not est(f.max_batch_size + 1).fits(1e9)
        assert f.probes <= 8
        assert f.memory["peak_bytes"] == est(f.max_batch_size).peak_bytes
        assert f.prediction.batch_size == f.max_batch_size
        assert f.throughput_unit == "samples"
        assert f.throughput_per_s == pytest.approx(f.max_batch_size / (f.prediction.iteration_ms / 1e3))
    bf16, fp32 = fits[1], fits[0]
    assert bf16.max_batch_size > fp32.max_batch_size  # half the bytes per activation and parameter


def test_max_batch_size_needs_no_checkpoint(capsys, monkeypatch):
    """The memory search works for hardware with no checkpoint (h100 today); the step time is left out
    with a note. tf32 shares fp32's trace and answer; a model too big at batch 1 says so."""
    from dataclasses import replace

    from gnn_ptp import cli
    from gnn_ptp.hardware import HARDWARE

    monkeypatch.setattr("gnn_ptp.prediction.default_checkpoint",
                        lambda hw: (_ for _ in ()).throw(predict_mod.UserError(f"no {hw} checkpoint")))
    monkeypatch.setattr("gnn_ptp.prior.analytic_model", lambda hw: None)  # no analytic time model either
    tiny = ["hf:llama", "--set", "num_hidden_layers=2", "--set", "hidden_size=128", "--set", "intermediate_size=256",
            "--set", "num_attention_heads=4", "--set", "num_key_value_heads=2", "--set", "vocab_size=500",
            "--seq-len", "64", "--max-batch-size"]
    monkeypatch.setitem(HARDWARE, "h100", replace(HARDWARE["h100"], memory_bytes=2e9))
    assert cli.main(["predict", *tiny, "--precision", "fp32", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    (fit,) = out["fits"]
    assert fit["precision"] == "fp32" and fit["prediction"] is None and fit["capacity_bytes"] == 2e9
    assert 100 < fit["max_batch_size"] < 1 << 20 and fit["memory"]["device_bytes"] <= 2e9
    assert any("step time not predicted: no h100 checkpoint" in n for n in out["notes"])
    monkeypatch.setitem(HARDWARE, "h100", replace(HARDWARE["h100"], memory_bytes=1e6))
    assert cli.main(["predict", *tiny, "--precision", "tf32"]) == 0
    text = capsys.readouterr().out
    assert "tf32" in text and "batch 1 does not fit" in text


def test_max_batch_size_times_from_the_analytic_prior_without_a_checkpoint(capsys, monkeypatch):
    from gnn_ptp import cli

    monkeypatch.setattr("gnn_ptp.prediction.default_checkpoint",
                        lambda hw: (_ for _ in ()).throw(predict_mod.UserError(f"no {hw} checkpoint")))
    tiny = ["hf:llama", "--set", "num_hidden_layers=2", "--set", "hidden_size=128", "--set", "intermediate_size=256",
            "--set", "num_attention_heads=4", "--set", "num_key_value_heads=2", "--set", "vocab_size=500",
            "--seq-len", "64", "--max-batch-size", "--precision", "bf16", "--json"]
    assert cli.main(["predict", *tiny]) == 0
    (fit,) = json.loads(capsys.readouterr().out)["fits"]
    assert fit["prediction"]["source"] == "analytic-prior" and fit["throughput_per_s"] > 0


def test_cpu_kind_predicts_for_another_cpu_from_its_descriptor(tmp_path, monkeypatch, ckpt):
    """--cpu-kind: a tiny checkpoint trained with hardware descriptors on the SYNTHETIC dataset predicts
    for a SYNTHETIC CPU kind with a quarter of the home CPU's rates: every phase about 4x the home kind's
    (its prior is exactly 4x, host costs included; the learned residual moves a little with the descriptor
    features, which training on one kind never varied); a checkpoint without descriptors, an unknown kind
    or a GPU checkpoint get one clear error."""
    from gnn_ptp import descriptor

    from test_descriptor import synthetic_cpu

    folder = tmp_path / "descriptors"
    folder.mkdir()
    shutil.copy(descriptor.DESCRIPTOR_DIR / "amd-epyc.json", folder / "amd-epyc.json")
    descriptor.write(synthetic_cpu(0.25, "synthetic-quarter-cpu"), folder)
    monkeypatch.setattr(descriptor, "DESCRIPTOR_DIR", folder)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dataset, "load_graphs", load_synthetic_graphs)
        data = write_synthetic_dataset(tmp_path / "synthetic-cpu")
        cfg = TrainConfig(model=ModelConfig(hidden=16, depth=1, target="log_ratio_prior", hardware_descriptor=True),
                          epochs=2, threads=1)
        train(cfg, data, tmp_path / "cpu", log=lambda m: None)
    args = dict(batch_size=8, hardware="cpu", checkpoint=tmp_path / "cpu", precision="fp32")
    home = predict(SPEC, cpu_kind="amd-epyc", **args)
    slow = predict(SPEC, cpu_kind="synthetic-quarter-cpu", **args)
    for k in PHASE_KEYS:
        assert getattr(slow, k) == pytest.approx(4 * getattr(home, k), rel=0.1)
    quarter, own = descriptor.stored_cpus()["synthetic-quarter-cpu"].profile(), descriptor.stored_cpus()["amd-epyc"].profile()
    assert quarter.host_issue_s == pytest.approx(tuple(4 * h for h in own.host_issue_s))
    from synthetic_data import synthetic_graph

    g = synthetic_graph(dataset.measured_configs(data)[0].key)
    assert prior.phase_ms(g, quarter) == pytest.approx(4 * prior.phase_ms(g, own), rel=1e-9)
    assert any("CPU kind synthetic-quarter-cpu" in w for w in slow.warnings)
    # a quarter of every rate is far from the training CPU (the reference CPU here): the answer says so, naming
    # the furthest rate (the launch floor since the thirty-eighth session: the reference CPU's floor is its
    # section's fitted device floor, 1.6 us with the profiler's cost taken off, against 4x the stored kind's)
    assert any(" rate is " in w and "x the training CPU's" in w and "hardware protocol" in w for w in slow.warnings)
    assert predict(SPEC, **args).iteration_ms == pytest.approx(predict(SPEC, **args).iteration_ms)  # cache intact
    with pytest.raises(UserError, match="no stored descriptor 'nowhere-cpu'.*amd-epyc.*synthetic-quarter-cpu"):
        predict(SPEC, cpu_kind="nowhere-cpu", **args)
    with pytest.raises(UserError, match="trained without hardware descriptors"):
        predict(SPEC, batch_size=8, hardware="cpu", checkpoint=ckpt, precision="fp32", cpu_kind="amd-epyc")
    assert cli.main(["predict", SPEC, "--batch-size", "8", "--checkpoint", str(ckpt), "--cpu-kind", "amd-epyc"]) == 2


def test_cpu_kind_naming_the_shipped_checkpoint_s_own_kind_answers_as_without_it():
    """``--cpu-kind`` naming the kind the shipped CPU checkpoint was trained on (the first kind, by its stored
    name or by the name its machine type gives now, ``descriptor.SAME_KIND``) is the plain answer, and says
    so rather than that it was moved."""
    args = dict(batch_size=8, hardware="cpu", precision="fp32")
    plain = predict(SPEC, **args)
    for kind in ("amd-epyc", "amd-epyc-family-25-model-17"):
        own = predict(SPEC, cpu_kind=kind, **args)
        assert own.iteration_ms == plain.iteration_ms
        assert any("CPU kind amd-epyc: the kind the checkpoint was trained on" in w for w in own.warnings)
        assert not any("moved" in w for w in own.warnings)


def test_the_analytic_batch_prices_as_the_torch_geometric_batch_and_imports_no_torch_geometric():
    """An analytic prediction reads per-node tensors alone: its plain batch (``prediction._batch``) gives
    the analytic model the same phase and node times as a ``torch_geometric`` ``Batch`` of the same graphs,
    and a whole analytic ``predict`` in a fresh process never imports torch_geometric (~2 s cold)."""
    from fresh_process import run_fresh
    from gnn_ptp.trace import StepConfig
    from gnn_ptp.spec import Shape, parse_spec

    tiny = parse_spec("hf:gpt2", ["n_layer=1", "n_embd=64", "n_head=2", "vocab_size=500"])
    configs = [StepConfig(tiny, Shape(2, 16), p, "adamw", "cuda") for p in ("fp32", "amp-bf16")]
    graphs = [tensors for tensors, _ in predict_mod._graphs(configs, use_disk_cache=False)]
    model, _ = prior.analytic_model("h100")
    plain, pyg = model(predict_mod._batch(graphs, analytic=True)), model(predict_mod._batch(graphs, analytic=False))
    assert set(plain) == set(pyg)
    for key in plain:
        assert torch.equal(plain[key], pyg[key]), key

    code = ("import sys\nfrom gnn_ptp.prediction import predict_many\n"
            "out = predict_many('hf:gpt2', ['bf16'], 2, seq_len=16, use_disk_cache=False,\n"
            "                   overrides=['n_layer=1', 'n_embd=64', 'n_head=2', 'vocab_size=500'])\n"
            "assert out[0].iteration_ms > 0 and out[0].source == 'analytic-prior', out[0]\n"
            "assert 'torch_geometric' not in sys.modules\n")
    done = run_fresh(code)
    assert done.returncode == 0, done.stderr[-2000:]


def test_outside_a_gpu_checkpoint_s_range_the_prior_s_answer_is_printed_beside_it():
    """A step far below the H200 checkpoint's training range (a one-layer GPT-2 of 64 channels) is flagged
    as an extrapolation, and the calibrated prior's own answer for it follows the warnings, the number
    ``--analytic`` gives; the same on the CPU checkpoint (a residual over its CPU kind's prior: the number of
    ``--hardware cpu --analytic``); inside the range no such note (``test_no_warnings_inside_the_training_ranges``)."""
    tiny = ["n_layer=1", "n_embd=64", "n_head=2", "vocab_size=500"]
    _prior_beside_the_checkpoint("h200", "bf16", 2, 16, tiny, "--hardware h200 --analytic")
    wide = ["n_layer=2"]  # GPT-2's width and vocabulary at batch 8 x 128: beyond the CPU checkpoint's FLOPs
    cpu = _prior_beside_the_checkpoint("cpu", "fp32", 8, 128, wide, "one CPU here (gnn-ptp predict --hardware cpu --analytic;")
    assert cpu.expected_error.get("outside_training_range") is True
    assert "this step is outside it" in cpu.expected_error["summary"]


def _prior_beside_the_checkpoint(hardware, precision, batch, seq_len, overrides, command):
    """The shipped checkpoint's prediction of hf:gpt2 with ``overrides``, outside its training range: one note
    with the calibrated prior's answer, naming ``command``, equal to ``--analytic``'s (which has no such note)."""
    import re

    kw = dict(seq_len=seq_len, overrides=overrides, hardware=hardware, use_disk_cache=False)
    [gnn] = predict_mod.predict_many("hf:gpt2", [precision], batch, **kw)
    [alone] = predict_mod.predict_many("hf:gpt2", [precision], batch, analytic=True, **kw)
    assert any("outside the training range" in n for n in gnn.warnings)
    said = [n for n in gnn.warnings if n.startswith("the calibrated prior alone says")]
    assert len(said) == 1 and command in said[0]
    assert float(re.search(r"says ([0-9.]+) ms", said[0]).group(1)) == pytest.approx(alone.iteration_ms, abs=0.051)
    assert not any("calibrated prior alone" in n for n in alone.warnings)
    return gnn


def test_a_checkpoint_s_expected_error_comes_from_its_held_out_families():
    """``checkpoint_error`` on made-up checkpoint metadata (synthetic figures): the held-out MAPE with each
    family's, and where this model's family stood: held out (its own figure), trained on, or new."""
    meta = {"hardware": "cpu", "split": {"bert": "train", "vit": "val", "t5": "test", "vgg": "test"},
            "metrics": {"test": {"overall": {"mape": 12.4, "median_ape": 9.6, "n": 20},
                                 "per_family": {"t5": {"mape": 8.1, "n": 12}, "vgg": {"mape": 19.0, "n": 8}}}}}
    held = predict_mod.checkpoint_error(meta, "vgg")
    assert held["summary"].startswith("12 % step MAPE (median 10 %) on 20 measured steps")
    assert "(t5 8 %, vgg 19 %)" in held["summary"] and held["held_out"]["per_family"] == {"t5": 8.1, "vgg": 19.0}
    assert held["this_model"]["split"] == "test" and "19 % on its 8 steps" in held["this_model"]["text"]
    assert predict_mod.checkpoint_error(meta, "bert")["this_model"]["split"] == "train"
    assert "validated on" in predict_mod.checkpoint_error(meta, "vit")["this_model"]["text"]
    new = predict_mod.checkpoint_error(meta, "llama")
    assert new["this_model"]["split"] == "new" and "new to the checkpoint" in new["this_model"]["text"]
    assert "outside_training_range" not in new
    out = predict_mod.checkpoint_error(meta, "llama", outside=True)
    assert out["outside_training_range"] and predict_mod.SIZE_PROTOCOL_ERROR["cpu"] in out["summary"]
    moved = predict_mod.checkpoint_error(meta, "bert", other_kind=True)
    assert moved["other_hardware"] and "not the one predicted for" in moved["summary"]
    assert "other_hardware" not in held
    assert predict_mod.checkpoint_error({"metrics": {}}, "bert") == {}
    assert "labels" not in held and "record" not in held["summary"]  # mean labels: as every earlier checkpoint
    fastest = predict_mod.checkpoint_error({**meta, "train": {"labels": "fastest"}}, "vgg")
    assert fastest["labels"] == "fastest" and "fastest record (the uncontended step)" in fastest["summary"]
    assert "correction_scale" not in held and "scaled" not in held["summary"]  # factor 1: as learnt, unsaid
    scaled = predict_mod.checkpoint_error({**meta, "correction_scale": {"chosen": 0.25}}, "vgg")
    assert scaled["correction_scale"] == 0.25 and "scaled by 0.25, the factor its validation" in scaled["summary"]
    alone = predict_mod.checkpoint_error({**meta, "correction_scale": {"chosen": 0.0}}, "vgg")
    assert "scaled by 0, the factor its validation families chose (the prior alone)" in alone["summary"]


def test_the_table_prints_a_checkpoint_s_expected_error(ckpt):
    """The synthetic checkpoint held families out of training: ``predict`` carries their figure and the table
    prints it on one line; an analytic answer keeps it in its ANALYTIC ESTIMATE warning instead."""
    p = predict(SPEC, precision="fp32", batch_size=8, checkpoint=ckpt)
    assert p.source == "checkpoint" and p.expected_error["summary"]
    lines = [line for line in predict_mod.format_predictions([p]).splitlines() if line.startswith("expected error")]
    assert lines == [f"expected error: {p.expected_error['summary']}; this model: {p.expected_error['this_model']['text']}"]


def test_a_cpu_checkpoint_s_answer_stands_beside_the_prior_of_the_kind_it_was_trained_on():
    """``_checkpoint_cpu_kind``: a checkpoint trained on a stored CPU kind other than the reference CPU names
    it (its out-of-range note quotes that kind's ``--analytic`` answer); the reference CPU, a kind with no
    stored descriptor and a checkpoint without a descriptor name none (``--analytic``'s default)."""
    from types import SimpleNamespace

    from gnn_ptp import descriptor

    kinds = [k for k in descriptor.stored_cpus() if k != descriptor.calibrated_descriptor("cpu").name]
    assert kinds
    of = lambda name: SimpleNamespace(descriptor=SimpleNamespace(name=name))  # noqa: E731
    assert predict_mod._checkpoint_cpu_kind(of(kinds[0])) == kinds[0]
    assert predict_mod._checkpoint_cpu_kind(of(descriptor.calibrated_descriptor("cpu").name)) is None
    assert predict_mod._checkpoint_cpu_kind(of("a-cpu-never-measured")) is None
    assert predict_mod._checkpoint_cpu_kind(SimpleNamespace(descriptor=None)) is None
