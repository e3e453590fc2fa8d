"""The physical prior: what each kernel of a traced step should take on a given hardware, from its FLOPs,
bytes, dtype and path alone (no learning from step times).

Per node (one kernel of ``graph.to_tensors``)::

    compute_s = FLOPs / (peak(dtype, path) * gemm_curve[dtype](FLOPs))     matmul, conv, attention
              = FLOPs / (vector_rate * vector_curve(FLOPs))                  everything else
    memory_s  = bytes read + written / (bandwidth * memory_curve(bytes))
    seconds   = max(compute_s, memory_s, launch_floor_s)

``peak(dtype, path)`` is ``Hardware.flops_rate``: tensor-core rates for tf32/fp16/bf16 matmuls on a GPU,
the CUDA-core rate for strict fp32, the measured GEMM rate per dtype on a CPU. A curve is the fraction
of the peak a kernel of that size reaches, ``peak_fraction / (1 + (half_size / size) ** slope)``: small
GEMMs run far below peak, large memory-bound kernels reach ~85-90 % of the bandwidth. The launch floor
is the least time a kernel costs a PyTorch eager step (host dispatch + launch); a kernel shorter than it
still costs it, because the host cannot issue kernels faster.

The curves are fitted per hardware by ``benchmarks/calibrate_prior.py`` into
``gnn_ptp/prior_calibration.json`` (H100: NeuSight's public per-kernel H100 GEMM timings; CPU: measured
on this machine). H200 and A100 use the H100 curves with their own datasheet rates; any other
``Hardware`` (tests) gets ideal curves: the plain roofline.

Phase sums give forward / backward / optimizer ms (``phase_ms``); ``log_node_ms`` gives per-node log
milliseconds in the form the GNN's per-kernel head has, for ``predict``'s analytic mode and the
all-reduce overlap model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

from gnn_ptp import ops
from gnn_ptp.hardware import HARDWARE, Hardware

CALIBRATION_FILE = Path(__file__).with_name("prior_calibration.json")
TC_COLUMN = 13  # graph.py node features: tensor-core flag
GEMM_CATEGORIES = tuple(ops.CATEGORIES.index(c) for c in ops.TENSOR_CORE_CATEGORIES)
CURVES_OF = {"h200": "h100", "a100": "h100"}
"""Hardware without a calibration of its own borrows these curves (its own peak rates still apply)."""


@dataclass(frozen=True)
class Curve:
    """Fraction of a peak rate reached by a kernel of a given size (FLOPs or bytes)."""

    peak_fraction: float = 1.0
    """The fraction reached by very large kernels."""
    half_size: float = 0.0
    """Size at which a kernel reaches half of ``peak_fraction`` (0: no ramp)."""
    slope: float = 1.0
    """How fast the ramp rises with size (log-log slope below ``half_size``); negative for a curve that
    falls with size (a CPU: arrays in cache move faster than DRAM)."""

    def __call__(self, size: torch.Tensor) -> torch.Tensor:
        size = size.clamp_min(1.0)
        if self.half_size <= 0:
            return torch.full_like(size, self.peak_fraction)
        return self.peak_fraction / (1.0 + (self.half_size / size) ** self.slope)

    @classmethod
    def from_dict(cls, d: dict) -> "Curve":
        return cls(float(d["peak_fraction"]), float(d.get("half_size", 0.0)), float(d.get("slope", 1.0)))


@dataclass(frozen=True)
class Profile:
    """A hardware's peak rates and how far below them its kernels run."""

    hardware: Hardware
    gemm: dict[str, Curve] = field(default_factory=dict)
    """GEMM-like kernels (matmul, conv, attention) per compute dtype; "default" for the others."""
    vector: Curve = Curve()
    """Compute-bound non-GEMM kernels (FLOPs)."""
    memory: Curve = Curve()
    """Memory traffic (bytes read + written)."""
    launch_floor_s: float = 0.0
    """Least time one kernel costs an eager step."""
    source: str = "ideal curves: the plain roofline"
    expected_error: dict = field(default_factory=dict)
    """How far off a step prediction from this profile is expected to be, and how that was derived."""

    def gemm_curve(self, dtype: str) -> Curve:
        return self.gemm.get(dtype, self.gemm.get("default", Curve()))


@lru_cache(maxsize=1)
def calibration() -> dict:
    """The fitted curves per hardware (``prior_calibration.json``); {} where the file is absent."""
    if not CALIBRATION_FILE.is_file():
        return {}
    return json.loads(CALIBRATION_FILE.read_text())


def profile_from_dict(hw: Hardware, d: dict) -> Profile:
    return Profile(hw, {k: Curve.from_dict(v) for k, v in d.get("gemm", {}).items()},
                   Curve.from_dict(d["vector"]) if "vector" in d else Curve(),
                   Curve.from_dict(d["memory"]) if "memory" in d else Curve(),
                   float(d.get("launch_floor_s", 0.0)), d.get("source", ""), d.get("expected_error", {}))


def get_profile(hw: Hardware | str) -> Profile:
    """The calibrated profile of a hardware (by name or ``Hardware``); ideal curves if it has none."""
    if isinstance(hw, str):
        hw = HARDWARE[hw]
    table = calibration()
    name = hw.name if hw.name in table else CURVES_OF.get(hw.name)
    if name not in table or HARDWARE.get(hw.name) != hw:  # a made-up Hardware: plain roofline
        return Profile(hw)
    return profile_from_dict(hw, table[name])


def _unlog(v: torch.Tensor) -> torch.Tensor:
    return torch.exp2(v.double()) - 1.0  # graph.py's node-feature scale is log2(1 + x)


def node_seconds(x: torch.Tensor, x_cat: torch.Tensor, profile: Profile) -> torch.Tensor:
    """Prior time in seconds of every node (float64 [N]) from its features (graph.py's ``x``, ``x_cat``)."""
    hw = profile.hardware
    flops = _unlog(x[:, 0])
    moved = _unlog(x[:, 1]) + _unlog(x[:, 2])
    category, dtype = x_cat[:, 1], x_cat[:, 2]
    gemm = torch.zeros_like(category, dtype=torch.bool)
    for c in GEMM_CATEGORIES:
        gemm |= category == c
    tc = x[:, TC_COLUMN] > 0.5
    rate = torch.empty_like(flops)
    efficiency = torch.empty_like(flops)
    for (d, g, t) in set(zip(dtype.tolist(), gemm.tolist(), tc.tolist())):
        rows = (dtype == d) & (gemm == g) & (tc == t)
        name = ops.DTYPES[d]
        rate[rows] = hw.flops_rate(name, t, gemm=g)
        curve = profile.gemm_curve(name) if g else profile.vector
        efficiency[rows] = curve(flops[rows])
    compute_s = flops / (rate * efficiency)
    memory_s = moved / (hw.memory_bandwidth_Bps * profile.memory(moved))
    return torch.maximum(torch.maximum(compute_s, memory_s),
                         torch.full_like(flops, profile.launch_floor_s))


def log_node_ms(tensors, profile: Profile) -> torch.Tensor:
    """Per-node log milliseconds (float32 [N]), as the GNN's per-kernel head gives them."""
    return torch.log(node_seconds(tensors["x"], tensors["x_cat"], profile) * 1e3).float()


def phase_ms(tensors, profile: Profile) -> np.ndarray:
    """Prior ms of [forward, backward, optimizer, whole step] of one graph (a ``Data`` or a dict of its
    tensors with ``x``, ``x_cat``, ``phase``)."""
    get = tensors.__getitem__ if isinstance(tensors, dict) else lambda k: getattr(tensors, k)
    seconds = node_seconds(get("x"), get("x_cat"), profile)
    phases = torch.zeros(3, dtype=torch.float64).index_add(0, get("phase"), seconds)
    out = (phases * 1e3).numpy()
    return np.append(out, out.sum())


ANALYTIC_HARDWARE = ("h100", "h200", "a100")
"""Hardware ``predict`` answers from the prior alone while it has no checkpoint."""


class AnalyticModel:
    """The prior in the shape of a trained GNN for ``predict``: called on a ``Batch`` of graphs it returns
    ``log_phase_ms`` [G, 3] and per-node ``log_node_ms`` [N] (no memory head)."""

    def __init__(self, profile: Profile):
        self.profile = profile

    def __call__(self, batch) -> dict[str, torch.Tensor]:
        log_node = log_node_ms({"x": batch.x, "x_cat": batch.x_cat}, self.profile).double()
        graphs = int(batch.num_graphs)
        index = batch.batch * 3 + batch.phase
        phase_ms = torch.zeros(graphs * 3, dtype=torch.float64).index_add(0, index, log_node.exp())
        return {"log_phase_ms": torch.log(phase_ms.clamp_min(1e-9)).view(graphs, 3).float(),
                "log_node_ms": log_node.float()}


def analytic_model(hardware: str) -> tuple[AnalyticModel, dict] | None:
    """(model, meta) answering for ``hardware`` from the calibrated prior, or None where it has none."""
    if hardware not in ANALYTIC_HARDWARE or hardware not in HARDWARE:
        return None
    profile = get_profile(hardware)
    if not profile.gemm:  # no calibration shipped
        return None
    meta = {"hardware": hardware, "trace_target": "cuda", "source": "analytic-prior",
            "expected_error": profile.expected_error}
    return AnalyticModel(profile), meta
