"""Measured records -> graphs (gnn_ptp/dataset.py): every graph is traced with the kernel choices of the
torch version that measured its record, and a model the installed libraries build differently is left out
with the reason, never silently traced as something else."""

from __future__ import annotations

import torch

from gnn_ptp import cuda_dispatch, dataset, records

from conftest import LLAMA

CONFIG = {"spec": LLAMA[0], "set": dict(kv.split("=") for kv in LLAMA[1]), "task": None, "batch_size": 2,
          "seq_len": 16, "image_size": None, "precision": "fp32", "optimizer": "adamw"}
CONFIG["set"] = {k: int(v) for k, v in CONFIG["set"].items()}


def _record(config: dict, torch_version: str, params: int | None) -> dict:
    """A SYNTHETIC h100 record (made-up times) as if measured with ``torch_version``."""
    timing = {k: {"median": v, "p10": v, "p90": v, "n": 5, "mean": v}
              for k, v in (("forward_ms", 1.0), ("backward_ms", 2.0), ("optimizer_ms", 0.5), ("step_ms", 3.5))}
    return {"schema": records.SCHEMA_VERSION, "key": records.config_key(config, "h100"), "config": config,
            "status": "ok", "family": "llama", "params": params, "timing": timing, "memory": {"peak_bytes": 1e9},
            "env": {"hardware": "h100", "torch": torch_version, "transformers": "5.17.0",
                    "device_name": "NVIDIA H100 80GB HBM3"}, "timestamp": "2026-11-23T00:00:00+00:00"}


def _write(folder, rows):
    folder.mkdir(parents=True)
    for r in rows:
        records.append_record(r, folder, "h100.jsonl")


def test_records_are_traced_with_their_own_torch_kernels(tmp_path):
    from gnn_ptp.trace import trace_step

    params = trace_step(dataset.step_config_of(CONFIG, "cuda")).param_count
    folder = tmp_path / "h100"
    _write(folder, [_record(CONFIG, "2.11.0+cu130", params)])
    measured = dataset.measured_configs(folder)
    assert measured[0].torch_version == "2.11.0+cu130" and measured[0].params == params
    log: list[str] = []
    graphs = dataset.load_graphs(folder, measured, log=log.append)
    got = graphs[measured[0].key]
    want = dataset.graph_tensors(CONFIG, "cuda", kernels="2.11.0+cu130")
    assert all(torch.equal(got[k], want[k]) for k in want)
    installed = dataset.graph_tensors(CONFIG, "cuda")
    if cuda_dispatch.efficient_attention_supports_gqa():  # 2.14 on: the installed torch would differ
        assert got["x"].shape != installed["x"].shape
    assert any("torch 2.11.0+cu130" in line and "kernel choices" in line for line in log)
    assert any("transformers 5.17.0" in line for line in log)  # installed is another version: said so


def test_a_model_built_differently_now_is_left_out_with_the_reason(tmp_path):
    folder = tmp_path / "h100"
    _write(folder, [_record(CONFIG, "2.11.0+cu130", params=123)])
    measured = dataset.measured_configs(folder)
    log: list[str] = []
    assert dataset.load_graphs(folder, measured, log=log.append) == {}
    assert any("module structure changed" in line for line in log)


def test_cache_key_names_the_kernel_version():
    m = dataset.Measured("k", CONFIG, "llama", "h100", {}, None, 1, "2.11.0+cu130")
    assert dataset.cache_key(m) == "k@torch2.11"
    assert dataset.cache_key(dataset.Measured("k", CONFIG, "llama", "cpu", {}, None, 1, "2.11.0")) == "k"


def _refused_in_children(job):
    """SYNTHETIC stand-in for a trace: fails as a forked child fails once its parent has run autograd."""
    import os

    if os.getpid() != _PARENT_PID and job % 2:
        return "UserError: RuntimeError: Unable to handle autograd's threading in combination with fork-based multiprocessing"
    return job * 10


_PARENT_PID = __import__("os").getpid()


def test_map_runs_here_what_a_forked_worker_refused_wherever_it_comes():
    """A clean CI clone once cached three node-label traces as failed: workers forked after the parent ran
    autograd refused them in the middle of the list. Such jobs are run in this process instead."""
    from gnn_ptp import dataset

    assert list(dataset._map(_refused_in_children, [0, 1, 2, 3, 4, 5])) == [0, 10, 20, 30, 40, 50]


def test_steps_that_share_one_trace_are_grouped_together():
    """fp32, tf32 and torch-default steps of one model and shape come from one trace (trace.shared_trace):
    they form one group, so that one worker records that trace once; other classes and shapes stand apart."""
    configs = [dict(CONFIG, precision=p) for p in ("tf32", "amp-bf16", "fp32", "torch-default")]
    configs.append(dict(CONFIG, batch_size=4))
    groups = dataset.trace_groups(configs, lambda c: dataset.step_config_of(c, "cuda"))
    assert [[c["precision"] for c in g] for g in groups] == [["tf32", "fp32", "torch-default"], ["amp-bf16"], ["fp32"]]
    assert groups[2][0]["batch_size"] == 4


def _with_pid(job):
    return job, __import__("os").getpid()


def test_each_group_runs_in_one_process_and_the_results_keep_the_jobs_order():
    groups = [[0, 1], [2], [3, 4, 5], [6, 7]]
    out = list(dataset._map_in_groups(_with_pid, groups))
    assert [job for job, _ in out] == list(range(8))
    pids = iter(pid for _, pid in out)
    assert all(len({next(pids) for _ in g}) == 1 for g in groups)
    # a group a forked worker refused (its parent ran autograd) runs here, every job of it
    assert list(dataset._map_in_groups(_refused_in_children, groups)) == [10 * j for j in range(8)]


def test_fastest_labels_take_one_records_phases_and_mean_labels_average(tmp_path):
    """Two SYNTHETIC records of one configuration (made-up times): ``label="fastest"`` takes every phase
    from the record with the smaller step median (its phases add up to its step), ``mean`` averages each
    phase; peak memory is the records' mean either way. An unknown statistic is refused by name."""
    import pytest

    from gnn_ptp.errors import UserError

    slow, fast = _record(CONFIG, "2.11.0+cu130", None), _record(CONFIG, "2.11.0+cu130", None)
    for r, scale, peak in ((slow, 1.5, 2e9), (fast, 1.0, 1e9)):
        r["timing"] = {k: {**v, "median": v["median"] * scale} for k, v in r["timing"].items()}
        r["timing"]["forward_ms"]["median"] += 0.25 * (scale > 1)  # the slow record's phases differ in shape
        r["memory"] = {"peak_bytes": peak}
    folder = tmp_path / "h100"
    _write(folder, [slow, fast])
    (fastest,) = dataset.measured_configs(folder, label="fastest")
    (mean,) = dataset.measured_configs(folder)
    assert fastest.ms == {"forward_ms": 1.0, "backward_ms": 2.0, "optimizer_ms": 0.5, "step_ms": 3.5}
    assert mean.ms["forward_ms"] == pytest.approx((1.0 + 1.75) / 2) and mean.ms["step_ms"] == pytest.approx(4.375)
    assert fastest.peak_bytes == mean.peak_bytes == 1.5e9 and fastest.n_records == 2
    with pytest.raises(UserError, match="labels 'min'.*mean, fastest"):
        dataset.measured_configs(folder, label="min")
