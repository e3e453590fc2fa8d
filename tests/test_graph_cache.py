"""``train``/``evaluate`` and ``predict`` share one per-graph cache (keyed by step config, feature version
and library versions), and a dataset traces each distinct step once. SYNTHETIC records (made-up times)
of tiny real models: the graphs are real traces."""

from __future__ import annotations

import json
import re

import pytest

from gnn_ptp import dataset, prediction, records
from gnn_ptp.errors import UserError

MLP = {"spec": "random:mlp:3", "set": {"in_features": 16, "width": 32, "depth": 2, "num_classes": 4},
       "task": None, "batch_size": 4, "seq_len": None, "image_size": None, "optimizer": "adamw"}


def _write(folder, precisions=("fp32", "amp-bf16", "bf16")):
    for precision in precisions:
        config = {**MLP, "precision": precision}
        records.append_record({
            "key": records.config_key(config, "cpu"), "status": "ok", "config": config, "family": "random-mlp",
            "env": {"hardware": "cpu"}, "synthetic": True,
            "timing": {k: {"median": 1.0, "p10": 0.9, "p90": 1.1, "n": 3}
                       for k in ("forward_ms", "backward_ms", "optimizer_ms", "step_ms")}}, folder, "x.jsonl")
    return folder


def test_one_trace_per_distinct_step_and_reuse_across_folders(tmp_path, monkeypatch):
    monkeypatch.setenv("GNN_PTP_CACHE", str(tmp_path / "cache"))
    first = _write(tmp_path / "a-cpu")
    measured = dataset.measured_configs(first)
    logs = []
    aware = dataset.load_graphs(first, measured, True, log=logs.append)
    assert len(aware) == 3 and "3 distinct steps to trace" in logs[0] and "~" not in logs[-1]
    # precision-unaware graphs are the fp32 graph of each config: one step, already in the shared cache
    logs.clear()
    unaware = dataset.load_graphs(first, measured, False, log=logs.append)
    assert "3 from" in logs[0] and "0 distinct steps to trace" in logs[0]
    fp32_key = next(m.key for m in measured if m.config["precision"] == "fp32")
    for key in unaware:
        assert all((unaware[key][f] == aware[fp32_key][f]).all() for f in ("x", "x_cat", "edge_index"))
    # another folder holding the same configurations traces nothing
    second = _write(tmp_path / "b-cpu")
    logs.clear()
    again = dataset.load_graphs(second, dataset.measured_configs(second), True, log=logs.append)
    assert "3 from" in logs[0] and "0 distinct steps" in logs[0]
    assert all((again[k]["x"] == aware[k]["x"]).all() for k in aware)
    # and the folder's own cache answers a second run without even the shared one
    logs.clear()
    dataset.load_graphs(second, dataset.measured_configs(second), True, log=logs.append)
    assert logs == []


def test_predict_reads_what_a_dataset_traced(tmp_path, monkeypatch):
    monkeypatch.setenv("GNN_PTP_CACHE", str(tmp_path / "cache"))
    folder = _write(tmp_path / "c-cpu", precisions=("fp32",))
    dataset.load_graphs(folder, dataset.measured_configs(folder), True, log=lambda m: None)
    monkeypatch.setattr(prediction, "_trace_groups", lambda groups: groups and pytest.fail("traced again"))
    config = dataset.step_config_of({**MLP, "precision": "fp32"}, "cpu")
    (tensors, info), = prediction._graphs([config])
    assert tensors["x"].shape[0] > 0 and json.dumps(info)


def test_kernel_choices_version_keys_cuda_caches_only(tmp_path, monkeypatch):
    """A change in cuda_dispatch's kernel choices (DISPATCH_VERSION) rebuilds every CUDA-target graph cache
    (the dataset folder's, predict's per-graph one, the node labels') and leaves CPU-target caches and
    FEATURE_VERSION, hence the shipped CPU checkpoint, as they were."""
    import dataclasses
    import hashlib
    from pathlib import Path

    import torch
    import transformers

    from gnn_ptp import checkpoint, cuda_dispatch, graph, node_labels

    cpu = dataset.step_config_of({**MLP, "precision": "fp32"}, "cpu")
    cuda = dataset.step_config_of({**MLP, "precision": "fp32"}, "cuda", kernels="2.11.0+cu130")
    keys = {c.target: prediction._graph_key(c) for c in (cpu, cuda)}
    paths = {t: dataset._cache_path(tmp_path, t, True).name for t in ("cpu", "cuda")}
    labels = {t: node_labels._cache_path(tmp_path, cuda=t == "cuda").name for t in ("cpu", "cuda")}
    # the CPU key is the payload it always was (no dispatch version in it)
    payload = {"spec": cpu.spec.to_dict(), "shape": dataclasses.asdict(cpu.shape),
               "precision": "fp32", "optimizer": "adamw", "target": "cpu", "kernels": None,
               "feature_version": graph.feature_version("cpu"), "memory_version": prediction.MEMORY_VERSION,
               "layout_version": graph.LAYOUT_VERSION,
               "torch": torch.__version__, "transformers": transformers.__version__}
    assert keys["cpu"] == hashlib.sha1(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:20]
    assert f"-d{cuda_dispatch.DISPATCH_VERSION}" in paths["cuda"] and "-d" not in paths["cpu"].split("-tf")[1]
    assert f"-d{cuda_dispatch.DISPATCH_VERSION}" in labels["cuda"] and labels["cpu"].endswith(
        f"-tf{transformers.__version__}.pt")
    monkeypatch.setattr(cuda_dispatch, "DISPATCH_VERSION", "test")
    assert prediction._graph_key(cpu) == keys["cpu"] and prediction._graph_key(cuda) != keys["cuda"]
    assert dataset._cache_path(tmp_path, "cpu", True).name == paths["cpu"]
    assert dataset._cache_path(tmp_path, "cuda", True).name != paths["cuda"]
    assert node_labels._cache_path(tmp_path).name == labels["cpu"]
    assert node_labels._cache_path(tmp_path, cuda=True).name != labels["cuda"]
    model, meta = checkpoint.load(Path(__file__).resolve().parent.parent / "checkpoints" / "cpu")
    assert meta["feature_version"] == graph.feature_version("cpu") == "4.2"


def test_a_cpu_feature_revision_rebuilds_cpu_caches_and_refuses_cpu_checkpoints_only(tmp_path,
                                                                                       monkeypatch):
    """A change in what only CPU-target graphs record (``graph.CPU_FEATURE_REVISION``; 2: causal CPU
    attention counted by the key blocks its kernel visits) rebuilds every CPU-target graph cache (the dataset
    folder's, predict's per-graph one, the node labels') and refuses a CPU checkpoint trained before it, with
    one line naming the versions; CUDA-target caches and the H200 checkpoint stay as they were."""
    from pathlib import Path

    from gnn_ptp import checkpoint, graph, node_labels

    shipped = Path(__file__).resolve().parent.parent / "checkpoints"
    cpu = dataset.step_config_of({**MLP, "precision": "fp32"}, "cpu")
    cuda = dataset.step_config_of({**MLP, "precision": "fp32"}, "cuda", kernels="2.11.0+cu130")
    keys = {c.target: prediction._graph_key(c) for c in (cpu, cuda)}
    paths = {t: dataset._cache_path(tmp_path, t, True).name for t in ("cpu", "cuda")}
    labels = {t: node_labels._cache_path(tmp_path, cuda=t == "cuda").name for t in ("cpu", "cuda")}
    trained = graph.feature_version("cpu")
    monkeypatch.setattr(graph, "CPU_FEATURE_REVISION", "test")
    assert prediction._graph_key(cpu) != keys["cpu"] and prediction._graph_key(cuda) == keys["cuda"]
    assert dataset._cache_path(tmp_path, "cpu", True).name != paths["cpu"]
    assert dataset._cache_path(tmp_path, "cuda", True).name == paths["cuda"]
    assert node_labels._cache_path(tmp_path).name != labels["cpu"]
    assert node_labels._cache_path(tmp_path, cuda=True).name == labels["cuda"]
    with pytest.raises(UserError, match=rf"trained on graph features v{re.escape(trained)}, this gnn-ptp builds "
                                        rf"v{graph.FEATURE_VERSION}\.test"):
        checkpoint.load(shipped / "cpu")
    model, meta = checkpoint.load(shipped / "h200")
    assert meta["trace_target"] == "cuda" and meta["feature_version"] == graph.FEATURE_VERSION


def test_a_layout_version_rebuilds_every_graph_cache_and_no_checkpoint(tmp_path, monkeypatch):
    """A change in the per-node attributes that are not features (``graph.LAYOUT_VERSION``: since 2 a
    convolution's channels-last input in ``gemm_layout``) rebuilds the graph caches of both targets (the
    dataset folder's, predict's per-graph one), so that no graph traced before lacks it, and leaves
    FEATURE_VERSION, which the shipped checkpoints are checked against, as it was."""
    from gnn_ptp import graph

    configs = [dataset.step_config_of({**MLP, "precision": "fp32"}, "cpu"),
               dataset.step_config_of({**MLP, "precision": "fp32"}, "cuda", kernels="2.11.0+cu130")]
    keys = [prediction._graph_key(c) for c in configs]
    paths = [dataset._cache_path(tmp_path, t, True).name for t in ("cpu", "cuda")]
    feature = graph.FEATURE_VERSION
    assert all(f"-l{graph.LAYOUT_VERSION}-" in p for p in paths)
    monkeypatch.setattr(graph, "LAYOUT_VERSION", "test")
    assert all(prediction._graph_key(c) != k for c, k in zip(configs, keys))
    assert all(dataset._cache_path(tmp_path, t, True).name != p for t, p in zip(("cpu", "cuda"), paths))
    assert graph.FEATURE_VERSION == feature
