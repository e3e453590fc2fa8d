"""Baselines (gnn_ptp/baselines.py): the roofline on hand-built graphs against a Hardware built here, and
the graph-totals ridge on SYNTHETIC graph features (an exact linear relation in log space)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch_geometric.data import Data

from gnn_ptp import ops
from gnn_ptp.baselines import TC_COLUMN, GraphTotalsRidge, roofline_ms
from gnn_ptp.graph import GRAPH_FEATURES, NODE_FEATURES
from gnn_ptp.hardware import Hardware

HW = Hardware("test", "a made-up accelerator", {"bf16": 1e12, "fp32": 2e11}, vector_flops_per_s=1e10,
              memory_bandwidth_Bps=1e9, memory_bytes=1e9)


def _log(x: float) -> float:  # graph.py's node-feature scale: log2(1 + x)
    return math.log2(1.0 + x)


def _graph(nodes: list[dict]) -> Data:
    """Nodes as {flops, read, written, dtype, tc, phase}; features as graph.to_data writes them."""
    x = torch.zeros(len(nodes), NODE_FEATURES)
    x_cat = torch.zeros(len(nodes), 4, dtype=torch.long)
    for i, n in enumerate(nodes):
        x[i, 0], x[i, 1], x[i, 2] = _log(n["flops"]), _log(n["read"]), _log(n["written"])
        x[i, TC_COLUMN] = float(n["tc"])
        x_cat[i] = torch.tensor([1, 1, ops.DTYPES.index(n["dtype"]), n["phase"]])
    phase = x_cat[:, 3].clone()
    return Data(x=x, x_cat=x_cat, phase=phase, num_nodes=len(nodes))


# powers of two minus one: exact after the float32 log2(1 + x) round trip
MATMUL = {"flops": 2.0**40 - 1, "read": 2.0**20 - 1, "written": 2.0**20 - 1, "dtype": "bf16", "tc": 1, "phase": 0}
ADD = {"flops": 2.0**20 - 1, "read": 2.0**28 - 1, "written": 2.0**27 - 1, "dtype": "fp32", "tc": 0, "phase": 1}


def _roof(n: dict, rate: float) -> float:
    return max(n["flops"] / rate, (n["read"] + n["written"]) / HW.memory_bandwidth_Bps) * 1e3


def test_roofline_two_nodes_is_max_of_compute_and_memory_time_per_phase():
    got = roofline_ms(_graph([MATMUL, ADD]), HW)
    fwd = _roof(MATMUL, 1e12)  # compute bound: 2^40 FLOPs at the bf16 tensor-core rate
    bwd = _roof(ADD, 1e10)  # memory bound: 3 * 2^27 bytes at 1 GB/s (vector rate for non tensor-core)
    assert fwd == pytest.approx((2.0**40 - 1) / 1e12 * 1e3)
    assert bwd == pytest.approx((2.0**28 + 2.0**27 - 2) / 1e9 * 1e3)
    np.testing.assert_allclose(got, [fwd, bwd, 0.0, fwd + bwd], rtol=1e-6)


def test_roofline_sums_nodes_of_one_phase_and_runs_gemms_at_the_gemm_rate_of_their_dtype():
    fp16_tc = {**MATMUL, "dtype": "fp16", "phase": 2}  # HW has no fp16 rate: vector rate
    simt_bf16 = {**MATMUL, "tc": 0, "phase": 2}  # a matmul without tensor cores: still the bf16 GEMM rate
    simt_fp32 = {**MATMUL, "dtype": "fp32", "tc": 0, "phase": 2}  # an fp32 matmul (CPU): fp32 GEMM rate
    got = roofline_ms(_graph([fp16_tc, simt_bf16, simt_fp32]), HW)
    opt = _roof(fp16_tc, 1e10) + _roof(simt_bf16, 1e12) + _roof(MATMUL, 2e11)
    np.testing.assert_allclose(got, [0.0, 0.0, opt, opt], rtol=1e-6)


def test_roofline_runs_non_gemm_kernels_at_the_vector_rate():
    compute_bound = {"flops": 2.0**40 - 1, "read": 1.0, "written": 1.0, "dtype": "fp32", "tc": 0, "phase": 0}
    g = _graph([compute_bound])
    g.x_cat[0, 1] = ops.CATEGORIES.index("elementwise")
    np.testing.assert_allclose(roofline_ms(g, HW)[0], _roof(compute_bound, 1e10), rtol=1e-6)


def test_roofline_scales_with_bandwidth_for_memory_bound_kernels():
    slow = roofline_ms(_graph([ADD]), HW)
    fast = roofline_ms(_graph([ADD]), Hardware("fast", "", HW.flops_per_s, HW.vector_flops_per_s,
                                               memory_bandwidth_Bps=4e9))
    np.testing.assert_allclose(fast, slow / 4, rtol=1e-6)


# --- ridge on graph totals ----------------------------------------------------------------------------


def _samples(n: int, w: np.ndarray, b: np.ndarray, seed: int) -> list:
    """Graph features u of varied scales; labels exactly u @ w + b (from the float32 u the samples hold)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        u = torch.tensor(rng.normal(size=(1, GRAPH_FEATURES)) * rng.uniform(0.5, 3.0, size=GRAPH_FEATURES),
                         dtype=torch.float32)
        out.append(Data(u=u, y=torch.tensor(u.double().numpy() @ w + b)))
    return out


@pytest.fixture
def linear_relation():
    rng = np.random.default_rng(0)
    w = rng.normal(size=(GRAPH_FEATURES, 4)) * 0.3
    b = np.array([1.0, 2.0, -0.5, 2.5])
    return lambda n, seed: _samples(n, w, b, seed)


def test_ridge_recovers_an_exact_linear_relation_in_log_space(linear_relation):
    make = linear_relation
    train, val, test = make(80, 1), make(20, 2), make(15, 3)
    ridge = GraphTotalsRidge(alphas=(0.0,)).fit(train, val)
    want = np.concatenate([s.y.numpy() for s in test])
    np.testing.assert_allclose(ridge.predict_log(test), want, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(ridge.predict_ms(test), np.exp(want), rtol=1e-6)


def test_ridge_picks_the_alpha_that_does_best_on_validation(linear_relation):
    make = linear_relation
    train, val, test = make(80, 1), make(20, 2), make(15, 3)
    ridge = GraphTotalsRidge(alphas=(10.0, 1e-3, 1.0)).fit(train, val)
    assert ridge.alpha == 1e-3  # noiseless data: the least shrinkage wins
    want = np.exp(np.concatenate([s.y.numpy() for s in test]))
    np.testing.assert_allclose(ridge.predict_ms(test), want, rtol=0.02)
    heavy = GraphTotalsRidge(alphas=(10.0,)).fit(train, val)
    assert np.abs(heavy.predict_ms(test) / want - 1).mean() > 0.05  # shrinkage costs accuracy
