"""Fit the physical prior of a GPU to its own measured kernels and steps (``benchmarks/calibrate_prior.py
--profiles``).

Two stages, each on the configurations of the *calibration families* only (by default the random
architectures), so that every named model family stays held out for the step-level score:

1. **Device time per kernel.** The harvest's per-op profiles are matched onto the traced graphs
   (``match.py``); every matched node gives (FLOPs, bytes, dtype, path) -> measured device time. The
   prior's curves (``prior.Curve``: GEMM-like kernels per compute dtype, other compute, memory traffic)
   and a device floor (the shortest kernel) are fitted by least squares on log time, each node weighted
   by the square root of its time (the kernels that hold the step count more than a thousand tiny ones,
   which still count).
2. **Host costs.** An eager PyTorch step is a queue: the host issues kernel i at ``i * host_s`` (Python,
   autograd and dispatch, a few to tens of microseconds each), the GPU runs it when it is free and it has
   been issued. The phase then ends at ``max_k(k * host_s + sum_{j>=k} t_j)`` (``prior.queue_ms``), plus
   a fixed host time. Both, per phase (forward, backward, optimizer; the optimizer issued once per
   parameter tensor), are fitted to the measured phase times of the calibration configurations, with the
   device times of stage 1: they belong to the host CPU and torch version that measured them, which is
   said where they are used.

Nothing here reads a step of a held-out family or any public end-to-end figure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from gnn_ptp import ops, prior
from gnn_ptp.hardware import Hardware

GEMM_DTYPES = ("fp32", "tf32", "fp16", "bf16")
RANDOM_FAMILIES = ("random-cnn", "random-mlp", "random-transformer")


@dataclass
class KernelRows:
    """Matched graph nodes of profiled steps: features and measured device time."""

    flops: torch.Tensor
    moved: torch.Tensor
    dtype: list[str]
    gemm: torch.Tensor
    tensor_core: torch.Tensor
    category: list[str]
    family: list[str]
    seconds: torch.Tensor

    def __len__(self) -> int:
        return int(self.seconds.numel())


def kernel_rows(samples: list, node_seconds: dict[str, list[torch.Tensor]]) -> KernelRows:
    """Rows of every node with a measured device time > 0 (``node_seconds``: per configuration key, one
    tensor of per-node seconds per profile, NaN where unmatched; profiles of a configuration averaged)."""
    parts = {k: [] for k in ("flops", "moved", "dtype", "gemm", "tc", "cat", "family", "s")}
    gemm_ids = torch.tensor([ops.CATEGORIES.index(c) for c in ops.TENSOR_CORE_CATEGORIES])
    for s in samples:
        per_profile = node_seconds.get(s.key)
        if not per_profile:
            continue
        stack = torch.stack(per_profile)
        measured = torch.nanmean(stack, 0) if stack.shape[0] > 1 else stack[0]
        if measured.numel() != int(s.num_nodes):
            continue
        keep = ~torch.isnan(measured) & (measured > 0)
        if not bool(keep.any()):
            continue
        x, x_cat = s.x[keep], s.x_cat[keep]
        parts["flops"].append(prior._unlog(x[:, 0]))
        parts["moved"].append(prior._unlog(x[:, 1]) + prior._unlog(x[:, 2]))
        parts["dtype"] += [ops.DTYPES[d] for d in x_cat[:, 2].tolist()]
        parts["gemm"].append(torch.isin(x_cat[:, 1], gemm_ids))
        parts["tc"].append(x[:, prior.TC_COLUMN] > 0.5)
        parts["cat"] += [ops.CATEGORIES[c] for c in x_cat[:, 1].tolist()]
        parts["family"] += [s.family] * int(keep.sum())
        parts["s"].append(measured[keep].double())
    if not parts["s"]:
        raise ValueError("no profiled node with a measured device time")
    return KernelRows(torch.cat(parts["flops"]), torch.cat(parts["moved"]), parts["dtype"],
                      torch.cat(parts["gemm"]), torch.cat(parts["tc"]), parts["cat"], parts["family"],
                      torch.cat(parts["s"]))


# --- stage 1: device curves --------------------------------------------------------------------------------


def _curve_t(p: torch.Tensor, size: torch.Tensor) -> torch.Tensor:
    return torch.exp(p[0]) / (1 + (torch.exp(p[1]) / size.clamp_min(1.0)) ** torch.exp(p[2]))


def _groups(rows: KernelRows) -> list[str]:
    """The curve each row's compute time uses: its dtype for GEMM-like kernels, "vector" otherwise."""
    return [(d if d in GEMM_DTYPES else "vector") if g else "vector"
            for d, g in zip(rows.dtype, rows.gemm.tolist())]


def _rates(rows: KernelRows, hw: Hardware) -> torch.Tensor:
    return torch.tensor([hw.flops_rate(d, bool(t), gemm=bool(g))
                         for d, t, g in zip(rows.dtype, rows.tensor_core.tolist(), rows.gemm.tolist())],
                        dtype=torch.float64)


def _masks(groups: list[str]) -> dict[str, torch.Tensor]:
    return {name: torch.tensor([g == name for g in groups]) for name in sorted(set(groups))}


def _device_seconds(params: dict, rows: KernelRows, hw: Hardware, masks: dict, rates: torch.Tensor):
    compute = torch.zeros_like(rows.seconds)
    for name, m in masks.items():
        compute = compute.masked_scatter(m, rows.flops[m] / (rates[m] * _curve_t(params[name], rows.flops[m])))
    memory = rows.moved / (hw.memory_bandwidth_Bps * _curve_t(params["memory"], rows.moved))
    floor = torch.exp(params["floor"]).expand_as(compute)
    # a smooth max keeps the gradient alive for the term that is not (yet) the largest
    terms = torch.stack([compute.clamp_min(1e-12), memory.clamp_min(1e-12), floor]).log()
    return torch.logsumexp(terms * 8, 0).div(8).exp()


def fit_device(rows: KernelRows, hw: Hardware, steps: int = 1500) -> dict:
    """Curves (``prior.Curve`` dicts) for GEMM-like kernels per dtype, other compute ("vector"), memory
    traffic, and the device floor in seconds, fitted to ``rows``."""
    groups = _groups(rows)
    rates = _rates(rows, hw)
    masks = _masks(groups)
    names = sorted(masks)
    init = {n: [math.log(0.6), math.log(1e9 if n != "vector" else 1e7), 0.0] for n in names}
    init["memory"] = [math.log(0.8), math.log(1e6), 0.0]
    params = {n: torch.tensor(v, dtype=torch.float64, requires_grad=True) for n, v in init.items()}
    params["floor"] = torch.tensor(math.log(3e-6), dtype=torch.float64, requires_grad=True)
    opt = torch.optim.Adam(list(params.values()), lr=0.03)
    weight = rows.seconds.sqrt()
    weight = weight / weight.sum()
    target = torch.log(rows.seconds)
    for _ in range(steps):
        opt.zero_grad()
        pred = _device_seconds(params, rows, hw, masks, rates)
        loss = (weight * (torch.log(pred) - target) ** 2).sum()
        loss.backward()
        opt.step()
    with torch.no_grad():
        def curve(p):
            return {"peak_fraction": float(torch.exp(p[0])), "half_size": float(torch.exp(p[1])),
                    "slope": float(torch.exp(p[2]))}
        gemm = {n: curve(params[n]) for n in names if n != "vector"}
        out = {"gemm": gemm, "memory": curve(params["memory"]),
               "vector": curve(params["vector"]) if "vector" in params else {"peak_fraction": 1.0},
               "device_floor_s": float(torch.exp(params["floor"]))}
    return out


def device_profile(hw: Hardware, fitted: dict, host_s=None, fixed_s=None) -> prior.Profile:
    """A ``prior.Profile`` from ``fit_device``'s curves (and, once fitted, the host costs)."""
    d = {"gemm": fitted["gemm"], "vector": fitted["vector"], "memory": fitted["memory"],
         "launch_floor_s": fitted["device_floor_s"]}
    if host_s is not None:
        d["host_issue_s"] = list(host_s)
        d["host_fixed_s"] = list(fixed_s) if fixed_s is not None else [0.0, 0.0, 0.0]
    return prior.profile_from_dict(hw, d)


def kernel_errors(rows: KernelRows, profile: prior.Profile) -> dict:
    """Per category (and all): MAPE, median and p90 APE of the prior's device time per kernel, and its
    time-weighted error (|sum pred - sum meas| over sum meas per category)."""
    pred = _prior_seconds(rows, profile)
    out = {}
    masks = {"all": torch.ones(len(rows), dtype=torch.bool), **_masks(rows.category)}
    for cat, m in masks.items():
        if not bool(m.any()):
            continue
        ape = (pred[m] / rows.seconds[m] - 1).abs().numpy() * 100
        out[cat] = {"n": int(m.sum()), "mape": float(ape.mean()), "median_ape": float(np.median(ape)),
                    "p90_ape": float(np.percentile(ape, 90)),
                    "sum_error": float(abs(pred[m].sum() / rows.seconds[m].sum() - 1) * 100),
                    "measured_ms": float(rows.seconds[m].sum() * 1e3)}
    return out


def _prior_seconds(rows: KernelRows, profile: prior.Profile) -> torch.Tensor:
    hw = profile.hardware
    rates = _rates(rows, hw)
    eff = torch.empty_like(rows.seconds)
    for name, m in _masks(_groups(rows)).items():
        curve = profile.vector if name == "vector" else profile.gemm_curve(name)
        eff[m] = curve(rows.flops[m])
    compute = rows.flops / (rates * eff)
    memory = rows.moved / (hw.memory_bandwidth_Bps * profile.memory(rows.moved))
    return torch.maximum(torch.maximum(compute, memory), torch.full_like(compute, profile.launch_floor_s))


# --- stage 2: host issue cost -------------------------------------------------------------------------------


def fit_host(samples: list, profile: prior.Profile, per_kernel_us=None, per_phase_us=None) -> tuple[list, list, dict]:
    """Per phase, the host cost per issued kernel and the fixed host cost of the phase (seconds) that
    minimise the mean absolute log error of ``prior.queue_ms(...) + fixed`` against the measured phase
    medians of ``samples``. The optimizer's kernels are counted as the step's parameter tensors (the
    backward kernels that finalise a gradient): a foreach kernel is one graph node but its host work
    (and PyTorch's per-parameter bookkeeping) grows with the tensor count."""
    per_kernel = torch.tensor(np.arange(0.0, 150.01, 0.5) if per_kernel_us is None else per_kernel_us,
                              dtype=torch.float64) * 1e-6
    fixed = torch.tensor(np.arange(0.0, 3000.01, 25.0) if per_phase_us is None else per_phase_us,
                         dtype=torch.float64) * 1e-6
    curves = [[] for _ in prior.PHASE_NAMES]  # per phase: ([H] queue ms, measured ms)
    for s in samples:
        t = prior.node_seconds(s.x, s.x_cat, profile)
        measured = s.y[0].double().exp()
        for p in range(len(prior.PHASE_NAMES)):
            m = s.phase == p
            if not bool(m.any()) or float(measured[p]) <= 0:
                continue
            device = t[m]
            if p == prior.PHASE_NAMES.index("optimizer"):
                device = prior.optimizer_issues(device, getattr(s, "grad_bytes", None))
            curves[p].append((prior.queue_ms_grid(device, per_kernel), float(measured[p])))
    host, base, report = [], [], {}
    for p, name in enumerate(prior.PHASE_NAMES):
        if not curves[p]:
            host.append(0.0)
            base.append(0.0)
            continue
        queue = torch.stack([q for q, _ in curves[p]])  # [S, H]
        meas = torch.tensor([m for _, m in curves[p]], dtype=torch.float64)
        pred = queue[:, :, None] + fixed[None, None, :] * 1e3  # [S, H, F]
        err = (pred.log() - meas.log()[:, None, None]).abs().mean(0)
        flat = int(err.argmin())
        hi, fi = divmod(flat, err.shape[1])
        host.append(float(per_kernel[hi]))
        base.append(float(fixed[fi]))
        report[name] = {"host_us_per_kernel": float(per_kernel[hi]) * 1e6, "fixed_us": float(fixed[fi]) * 1e6,
                        "mean_abs_log_error": float(err[hi, fi]), "n": len(curves[p])}
    return host, base, report


def step_errors(samples: list, profile: prior.Profile) -> dict:
    """Step-time MAPE / median APE of the prior (queue model where the profile has host costs), overall,
    per precision class and per family, with the median predicted / measured ratio."""
    pred = np.array([prior.phase_ms(s, profile)[3] for s in samples])
    true = np.array([float(s.y[0, 3].double().exp()) for s in samples])  # the measured step median
    ape = np.abs(pred / true - 1) * 100

    def summary(mask):
        return {"n": int(mask.sum()), "mape": float(ape[mask].mean()), "median_ape": float(np.median(ape[mask])),
                "ratio_median": float(np.median(pred[mask] / true[mask]))}

    out = {"all": summary(np.ones(len(samples), dtype=bool))}
    for attr, key in (("precision", "by_precision"), ("family", "by_family")):
        values = np.array([getattr(s, attr) for s in samples])
        out[key] = {v: summary(values == v) for v in sorted(set(values))}
    return out
