"""Profiled real CPU steps matched onto their traced graphs (gnn_ptp/match.py): the raw material of
kernel-level labels. The profiles are real (a harvest on this CPU), not made up."""

from __future__ import annotations

import math

import pytest
import torch

from gnn_ptp import cli, dataset, match, profiles, records
from gnn_ptp.collect import CollectConfig, collect
from gnn_ptp.trace import trace_step

GRID = """
name = "m"
precisions = ["fp32", "amp-bf16", "bf16"]
[[model]]
spec = "random:mlp:3"
set = { in_features = 16, width = 32, depth = 2, num_classes = 4, dropout = 0.0, norm = "layernorm" }
batch_size = [4]
[[model]]
spec = "hf:gpt2"
set = { n_layer = 1, n_embd = 32, n_head = 2, vocab_size = 100 }
batch_size = [2]
seq_len = [8]
[[model]]
spec = "torchvision:resnet18"
batch_size = [2]
image_size = [32]
"""


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    threads = torch.get_num_threads()
    folder = tmp_path_factory.mktemp("match") / "cpu"
    grid = folder.parent / "m.toml"
    grid.write_text(GRID)
    collect(CollectConfig(str(grid), str(folder), device="cpu", threads=1, mode="harvest", warmup_steps=1,
                          harvest_steps=2, harvest_min_steps=2, profile="all"))
    torch.set_num_threads(threads)
    return folder


def test_every_graph_node_finds_its_profiled_op(profiled):
    found = profiles.read_profiles(profiled)
    rows = [r for r in records.iter_records(profiled) if r["status"] == "ok"]
    assert len(rows) == 9 and {r["id"] for r in rows} == set(found)
    for r in rows:
        traced = trace_step(dataset.step_config_of(r["config"], "cpu"))
        m = match.match_profile(traced, found[r["id"]])
        assert len(m.node_ms) == len(match.kernel_nodes(traced))
        assert all(not math.isnan(t) and t >= 0 for t in m.node_ms), (r["config"]["spec"], m.unmatched_nodes)
        assert sum(m.matched_ms.values()) <= sum(m.total_ms.values()) * 1.0001
        assert m.matched_share > 0  # its level is a measurement: a stall of this shared CPU can land anywhere


def test_dataset_match_report(profiled, capsys):
    result = match.match_dataset(profiled)
    assert result["records"] == 9 and not result["failed"]
    assert result["matched_share"] > 0.5 and set(result["by_family"]) == {"random-mlp", "gpt2", "resnet"}
    assert cli.main(["data", "match", str(profiled)]) == 0
    assert "device time matched to graph nodes" in capsys.readouterr().out
