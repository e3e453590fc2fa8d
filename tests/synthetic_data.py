"""A SYNTHETIC dataset for training and sweep tests: made-up graphs and made-up times, no measurement.

``write_synthetic_dataset`` writes real-schema records (status ok, hardware ``cpu``, marked
``"synthetic": true``) for a few made-up families; their times are a fixed function of made-up graphs.
``load_synthetic_graphs`` stands in for ``gnn_ptp.dataset.load_graphs`` and rebuilds those graphs from the
record keys instead of tracing models, so training runs the real pipeline (records -> measured configs ->
samples -> family split -> GNN) in well under a second per epoch. Tests patch it in with
``monkeypatch.setattr(dataset, "load_graphs", load_synthetic_graphs)``; subprocesses call ``install()``.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from gnn_ptp import dataset, ops, records
from gnn_ptp.graph import GRAPH_FEATURES, NODE_FEATURES

FAMILIES = ("syn-alpha", "syn-beta", "syn-gamma", "syn-delta", "syn-epsilon", "syn-zeta")
CONFIGS_PER_FAMILY = 4
HARDWARE = "cpu"


def synthetic_config(family: str, index: int) -> dict:
    return {"spec": f"synthetic:{family}:{index}", "set": {}, "task": None, "batch_size": 2 + index,
            "seq_len": None, "image_size": None, "precision": ("fp32", "amp-bf16")[index % 2],
            "optimizer": "adamw"}


def synthetic_graph(key: str) -> dict[str, torch.Tensor]:
    """A made-up graph, the same every time for the same key: a chain of kernels plus a few skip edges,
    forward then backward then optimizer nodes, valid op / category / dtype / phase ids."""
    g = torch.Generator().manual_seed(int(key, 16) % (2**31))
    n = int(torch.randint(12, 31, (1,), generator=g))
    n_fwd, n_bwd = n * 2 // 5, n * 2 // 5
    phase = torch.tensor([0] * n_fwd + [1] * n_bwd + [2] * (n - n_fwd - n_bwd))
    x_cat = torch.stack([torch.randint(0, len(ops.VOCAB), (n,), generator=g),
                         torch.randint(0, len(ops.CATEGORIES), (n,), generator=g),
                         torch.randint(0, len(ops.DTYPES), (n,), generator=g), phase], dim=1)
    chain = torch.stack([torch.arange(n - 1), torch.arange(1, n)])
    src = torch.randint(0, n - 3, (n // 3,), generator=g)
    skips = torch.stack([src, src + 2 + torch.randint(0, 2, src.shape, generator=g)])
    edge_index = torch.cat([chain, skips], dim=1)
    return {
        "x": torch.randn(n, NODE_FEATURES, generator=g) * 0.5,
        "x_cat": x_cat.long(),
        "edge_index": edge_index.long(),
        "edge_attr": torch.rand(edge_index.shape[1], 1, generator=g) * 10,
        "u": torch.randn(1, GRAPH_FEATURES, generator=g) * 0.5,
        "phase": phase.long(),
        "grad_bytes": torch.where(phase == 1, torch.rand(n, generator=g, dtype=torch.float64) * 1e6,
                                  torch.zeros(n, dtype=torch.float64)),
    }


def synthetic_times_ms(graph: dict[str, torch.Tensor]) -> dict[str, float]:
    """Made-up phase times: each node costs exp(x0 / 2) ms, a little more in the backward phase."""
    per_node = torch.exp(graph["x"][:, 0] / 2) * torch.tensor([1.0, 1.7, 0.4])[graph["phase"]]
    ms = {name: float(per_node[graph["phase"] == p].sum()) for p, name in
          enumerate(("forward_ms", "backward_ms", "optimizer_ms"))}
    ms["step_ms"] = sum(ms.values())
    return ms


def write_synthetic_dataset(folder: str | Path, families=FAMILIES,
                            per_family: int = CONFIGS_PER_FAMILY, start: int = 0) -> Path:
    """Write one synthetic record per made-up configuration into ``folder/synthetic.jsonl``: each family's
    configurations ``start`` to ``start + per_family - 1`` (another ``start``: configurations none of the default
    folder's)."""
    folder = Path(folder)
    for family in families:
        for index in range(start, start + per_family):
            config = synthetic_config(family, index)
            key = records.config_key(config, HARDWARE)
            graph = synthetic_graph(key)
            timing = {k: {"median": v, "p10": v * 0.99, "p90": v * 1.01, "n": 10}
                      for k, v in synthetic_times_ms(graph).items()}
            peak = None if index == 0 else 1e6 * graph["x"].shape[0] * config["batch_size"]  # some unknown
            records.append_record({
                "schema": records.SCHEMA_VERSION, "key": key, "status": "ok", "family": family,
                "config": config, "env": {"hardware": HARDWARE}, "timing": timing,
                "memory": {"peak_bytes": peak}, "synthetic": True,
            }, folder, "synthetic.jsonl")
    return folder


def load_synthetic_graphs(data_dir, measured, precision_aware: bool = True, log=None) -> dict:
    """Drop-in for ``gnn_ptp.dataset.load_graphs``: the synthetic graphs of the records, no tracing."""
    assert all(math.isfinite(m.ms["step_ms"]) for m in measured)
    return {m.key: synthetic_graph(m.key) for m in measured}


def install() -> None:
    """Patch the synthetic graphs in for the rest of this process (for subprocess workers)."""
    dataset.load_graphs = load_synthetic_graphs
