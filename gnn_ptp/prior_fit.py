"""Fit the physical prior of a GPU (or a CPU) to its own measured kernels and steps
(``benchmarks/calibrate_prior.py --profiles``).

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
   been issued; a phase lasts ``max(sum t, fixed + max_k(k * host_s + sum_{j>=k} t_j) - lag)``, where
   ``lag`` is how far the GPU is behind the host when the phase starts (``prior.phase_after``: no
   synchronisation between phases or steps, so a busy GPU hides the host's issuing). Both costs, per phase
   (forward, backward, optimizer; the optimizer issued once per parameter tensor), are fitted to the
   measured phase times of the calibration configurations, phase after phase, with the device times of
   stage 1: they belong to the host CPU and torch version that measured them, which is said where they
   are used.

The GEMM-like curves are per category and dtype (``matmul:bf16``): cuBLAS matmuls, cuDNN convolutions and
fused attention reach different fractions of the same tensor cores. ``leave_one_family_out`` judges the
method; ``benchmarks/calibrate_prior.py --lofo`` ships a fit to every family but a checkpoint's test ones.

On a CPU (``Hardware.kind == "cpu"``) the curves may exceed the quoted peaks and fall with size
(``_curve_t``), and a phase is serial, ``fixed + issues * host + kernels`` (``prior.Profile.serial``).

Nothing here reads a step of a family it holds out, or any public end-to-end figure.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from dataclasses import dataclass, replace
from functools import partial

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
    draw: torch.Tensor | None = None
    """Per row, a number in [0, 1) fixed by its configuration key and node index (``row_draws``):
    ``subsample`` keeps the rows with the smallest, so which rows a fit sees does not depend on the order
    or company its configurations come in."""
    backward: torch.Tensor | None = None
    """Per row, whether the kernel runs in the backward phase (None: unknown, all forward)."""
    fresh: torch.Tensor | None = None
    """Per row, graph.py's ``fresh_bytes`` (bytes the kernel allocates, its largest allocation; [R, 2];
    None: unknown, nothing fresh)."""
    grouped: torch.Tensor | None = None
    """Per row, whether the kernel is a grouped convolution (``prior.grouped_conv``; None: unknown, none)."""
    depthwise: torch.Tensor | None = None
    """Per row, a depthwise-like convolution's shape ([R, 5], ``prior.depthwise_shapes``; NaN for other
    rows; None: unknown, none)."""
    conv_gemm: torch.Tensor | None = None
    """Per row, a dense convolution's implicit-GEMM intensity (``prior.conv_gemm_intensity``; NaN for other
    rows; None: unknown, none)."""
    bn_channels: torch.Tensor | None = None
    """Per row, a batch norm's channels (``prior.batch_norm_channels``; NaN for other rows; None: unknown,
    none)."""
    optimizer: torch.Tensor | None = None
    """Per row, whether the kernel runs in the optimizer phase (None: unknown, none)."""
    layout: torch.Tensor | None = None
    """Per row, a two-operand GEMM's operand layout (graph.py's ``gemm_layout``, ``ops.GEMM_LAYOUTS``; 0 for
    other kernels; None: unknown)."""
    slow_conv: torch.Tensor | None = None
    """Per row, a dense convolution's slow-path costs ([R, 8], ``prior.slow_conv_terms``; NaN for other rows;
    None: unknown, none)."""
    step_share: torch.Tensor | None = None
    """Per row, its time over the summed time of every measured kernel of its step (its profile's matched
    nodes; ``fit_device(step_weights=True)``); None: unknown."""
    attention: torch.Tensor | None = None
    """Per row, a fused attention kernel's costs ([R, 6], ``prior.attention_terms``; NaN for other rows;
    None: unknown, none)."""

    def __len__(self) -> int:
        return int(self.seconds.numel())

    def backward_mask(self) -> torch.Tensor:
        """``backward``, or all False where unknown."""
        return self.backward if self.backward is not None else torch.zeros(len(self), dtype=torch.bool)


def load_profiled(data, profiler_cost: bool = False, label: str = "mean"):
    """(hardware, samples, per-node measured seconds: ``node_labels.node_seconds``) of a GPU dataset
    folder with per-op profiles; with ``profiler_cost`` a CPU's node seconds leave out the profiler's cost
    per recorded op (``node_labels.profiler_cost_us``). ``label``: the steps' labels, the mean of each
    configuration's records or its fastest record (``dataset.LABEL_STATS``)."""
    from gnn_ptp import dataset, node_labels
    from gnn_ptp.hardware import get_hardware

    measured = dataset.measured_configs(data, label=label)
    hw = get_hardware(measured[0].hardware)
    samples = dataset.make_samples(measured, dataset.load_graphs(data, measured, True))
    return hw, samples, node_labels.node_seconds(data, measured, profiler_cost=profiler_cost)


def measured_node_seconds(sample, per_profile: list[torch.Tensor]) -> torch.Tensor | None:
    """A sample's per-node measured device seconds (its profiles averaged; NaN where none matched the
    node), or None where the profiles were matched onto a graph of another node count."""
    stack = torch.stack(per_profile)
    measured = torch.nanmean(stack, 0) if stack.shape[0] > 1 else stack[0]
    return measured if measured.numel() == int(sample.num_nodes) else None


def kernel_rows(samples: list, node_seconds: dict[str, list[torch.Tensor]]) -> KernelRows:
    """Rows of every node with a measured device time > 0 (``node_seconds``: per configuration key, one
    tensor of per-node seconds per profile, NaN where unmatched; profiles of a configuration averaged)."""
    parts = {k: [] for k in ("flops", "moved", "dtype", "gemm", "tc", "cat", "family", "s", "draw", "bwd", "fresh",
                                 "grouped", "depthwise", "conv_gemm", "bn_channels", "opt", "layout", "slow_conv",
                                 "share", "attention")}
    gemm_ids = torch.tensor([ops.CATEGORIES.index(c) for c in ops.TENSOR_CORE_CATEGORIES])
    for s in samples:
        per_profile = node_seconds.get(s.key)
        if not per_profile:
            continue
        measured = measured_node_seconds(s, per_profile)
        if measured is None:
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
        seconds = measured[keep].double()
        parts["s"].append(seconds)
        parts["share"].append(seconds / seconds.sum())
        parts["draw"].append(row_draws(s.key, keep.numel())[keep])
        parts["bwd"].append(x_cat[:, 3] == prior.BACKWARD_PHASE)
        parts["opt"].append(x_cat[:, 3] == prior.OPTIMIZER_PHASE)
        parts["grouped"].append(prior.grouped_conv(x, x_cat))
        parts["depthwise"].append(prior.depthwise_shapes(x, x_cat))
        parts["conv_gemm"].append(prior.conv_gemm_intensity(x, x_cat))
        parts["slow_conv"].append(prior.slow_conv_terms(x, x_cat))
        parts["attention"].append(prior.attention_terms(x, x_cat))
        parts["bn_channels"].append(prior.batch_norm_channels(x, x_cat))
        layout = getattr(s, "gemm_layout", None)
        parts["layout"].append(layout[keep].long() if layout is not None else torch.zeros(int(keep.sum()), dtype=torch.long))
        fresh = getattr(s, "fresh_bytes", None)
        parts["fresh"].append(fresh[keep].double() if fresh is not None else torch.zeros(int(keep.sum()), 2,
                                                                                          dtype=torch.float64))
    if not parts["s"]:
        raise ValueError("no profiled node with a measured device time")
    return KernelRows(torch.cat(parts["flops"]), torch.cat(parts["moved"]), parts["dtype"],
                      torch.cat(parts["gemm"]), torch.cat(parts["tc"]), parts["cat"], parts["family"],
                      torch.cat(parts["s"]), torch.cat(parts["draw"]), torch.cat(parts["bwd"]),
                      torch.cat(parts["fresh"]), torch.cat(parts["grouped"]), torch.cat(parts["depthwise"]),
                      torch.cat(parts["conv_gemm"]), torch.cat(parts["bn_channels"]), torch.cat(parts["opt"]),
                      torch.cat(parts["layout"]), torch.cat(parts["slow_conv"]), torch.cat(parts["share"]),
                      torch.cat(parts["attention"]))


def row_draws(key: str, n: int) -> torch.Tensor:
    """``n`` uniform numbers in [0, 1) seeded by a configuration key (the first 15 hex digits of its
    SHA-256: a seed a 64-bit generator takes), the same for a configuration whatever else is fitted
    beside it."""
    seed = int(hashlib.sha256(key.encode()).hexdigest()[:15], 16)
    return torch.rand(n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


# --- stage 1: device curves --------------------------------------------------------------------------------


def _curve_t(p: torch.Tensor, size: torch.Tensor, intensity: torch.Tensor | None = None,
             bounded: bool = True) -> torch.Tensor:
    """A ``prior.Curve`` from raw parameters: the peak fraction (``bounded``: its logit, so that a GPU
    kernel cannot beat the datasheet peak; else its log: a CPU's arrays in cache move faster than the DRAM
    bandwidth, its vector units beat the quoted element-wise rate), the log half size, the slope (its log
    where ``bounded``; else signed: a CPU's curves may fall with size)[, log intensity half, log intensity
    slope]."""
    fraction = torch.sigmoid(p[0]) if bounded else torch.exp(p[0])
    slope = torch.exp(p[2]) if bounded else p[2]
    out = fraction / (1 + (torch.exp(p[1]) / size.clamp_min(1.0)) ** slope)
    if intensity is not None and p.numel() > 3:
        out = out / (1 + (torch.exp(p[3]) / intensity.clamp_min(1e-3)) ** torch.exp(p[4]))
    return out


def _intensity(rows: KernelRows, conv_intensity: str = "tensor") -> torch.Tensor:
    """As ``prior.kernel_intensity`` computes it: FLOPs per byte moved, or a dense convolution's
    implicit-GEMM intensity with ``conv_intensity="gemm"``."""
    intensity = rows.flops / (rows.moved + 1.0)
    if conv_intensity == "gemm" and rows.conv_gemm is not None:
        intensity = torch.where(torch.isnan(rows.conv_gemm), intensity, rows.conv_gemm)
    return intensity


def _groups(rows: KernelRows, by_category: bool = True, vector_by_category: bool = False,
            backward_curves: bool = False, grouped_conv: bool = False, own_vector: tuple[str, ...] = (),
            layout_curves: bool = False) -> list[str]:
    """The curve each row's compute time uses: "<category>:<dtype>" (or its dtype alone) for GEMM-like
    kernels, with ``backward_curves`` "<category>_backward:<dtype>" for a fused backward kernel
    (``prior.BACKWARD_CURVES``: a convolution's or attention's backward is one node that runs other
    kernels than its forward), with ``grouped_conv`` "conv_grouped:<dtype>" and
    "conv_grouped_backward:<dtype>" for a grouped convolution's forward and backward (``prior.GROUPED_CONV``),
    "vector" otherwise, or with ``vector_by_category`` (or for a category of ``own_vector``)
    "vector:<category>" (the vector curve at the category's own peak fraction); with ``layout_curves`` a
    two-operand matmul of known layout "matmul@<layout>:<dtype>" (``prior.LAYOUT_MARK``)."""
    def vector(c):
        return VECTOR_GROUP + c if vector_by_category or c in own_vector else "vector"
    backward = rows.backward.tolist() if rows.backward is not None else [False] * len(rows)
    grouped = rows.grouped.tolist() if grouped_conv and rows.grouped is not None else [False] * len(rows)
    layouts = (rows.layout.tolist() if layout_curves and rows.layout is not None else [0] * len(rows))

    def gemm(c, d, b, gr, la=0):
        if d not in GEMM_DTYPES:
            return "vector"
        if not by_category:
            return d
        if gr:
            return f"{prior.GROUPED_CONV}{prior.BACKWARD_SUFFIX if b else ''}:{d}"
        own_backward = backward_curves and b and c in prior.BACKWARD_CURVES
        if own_backward:
            return f"{c}{prior.BACKWARD_SUFFIX}:{d}"
        if la and c == "matmul":
            return f"{c}{prior.LAYOUT_MARK}{ops.GEMM_LAYOUTS[la]}:{d}"
        return f"{c}:{d}"
    return [gemm(c, d, b, gr, la) if g else vector(c)
            for d, g, c, b, gr, la in zip(rows.dtype, rows.gemm.tolist(), rows.category, backward, grouped, layouts)]


def _fallback(group: str, counts: Counter) -> str:
    """The group a curve with fewer than ``MIN_GROUP_ROWS`` kernels is fitted with: the next curve
    ``prior.gemm_keys`` looks up that has enough (a backward kernel's forward curve, a grouped
    convolution's the convolution's), else the dtype's pooled curve; a non-GEMM category's, the vector
    curve."""
    if _vector_category(group) is not None:
        return "vector"
    name, dtype = group.split(":")
    name, _, layout = name.partition(prior.LAYOUT_MARK)
    backward = name.endswith(prior.BACKWARD_SUFFIX)
    keys = prior.gemm_keys(dtype, name.removesuffix(prior.BACKWARD_SUFFIX), backward, layout)
    for key in keys[keys.index(group) + 1:]:
        if key == dtype:
            break
        if counts[key] >= MIN_GROUP_ROWS:
            return key
    return dtype


VECTOR_GROUP = "vector:"
"""Prefix of a non-GEMM category's group ("vector:<category>")."""


def _vector_category(name: str) -> str | None:
    """The category of a "vector:<category>" group; None for any other group."""
    return name[len(VECTOR_GROUP):] if name.startswith(VECTOR_GROUP) else None


def _vector_params(params: dict, name: str) -> torch.Tensor:
    """The raw curve parameters of group ``name``: "vector:<category>" is the vector curve with its peak
    fraction's raw parameter shifted by the category's own; a layout's matmul group fitted as a level
    (``fit_device(layout_levels=True)``) its dtype's matmul curve shifted by the layout's own."""
    category = _vector_category(name)
    if category is None:
        if LAYOUT_SHIFT + name in params:
            return _shifted(params[_layout_base(name)], params[LAYOUT_SHIFT + name])
        return params[name]
    return _shifted(params["vector"], params[f"shift:{category}"])


LAYOUT_SHIFT = "lshift:"
"""Prefix of a layout's level parameter ("lshift:matmul@nn:bf16", ``fit_device(layout_levels=True)``)."""


def _layout_base(name: str) -> str:
    """The curve a layout's matmul group shares its ramps with: "matmul@nn:bf16" -> "matmul:bf16"."""
    head, dtype = name.split(":")
    return f"{head.partition(prior.LAYOUT_MARK)[0]}:{dtype}"


def _shifted(base: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """Raw curve parameters ``base`` with their first ``len(shift)`` entries moved by ``shift``."""
    return torch.cat([base[:shift.numel()] + shift, base[shift.numel():]])


def _rates(rows: KernelRows, hw: Hardware, gemm_layouts: bool = False) -> torch.Tensor:
    """Per row its peak rate (``Hardware.flops_rate``); with ``gemm_layouts`` a GEMM's at its operand
    layout's ceiling (``prior.Profile.gemm_layouts``)."""
    rates = torch.tensor([hw.flops_rate(d, bool(t), gemm=bool(g))
                          for d, t, g in zip(rows.dtype, rows.tensor_core.tolist(), rows.gemm.tolist())],
                         dtype=torch.float64)
    if gemm_layouts:
        dtype = torch.tensor([ops.DTYPE_ID[d] for d in rows.dtype], dtype=torch.long)
        factor = prior.layout_factor(hw, dtype, rows.layout)
        rates = rates if factor is None else rates * factor
    return rates


def _masks(groups: list[str]) -> dict[str, torch.Tensor]:
    return {name: torch.tensor([g == name for g in groups]) for name in sorted(set(groups))}


MEMORY_GROUP = "memory:"
"""Prefix of a non-GEMM (category, dtype)'s bandwidth group ("memory:<category>:<dtype>")."""


def _memory_groups(rows: KernelRows, by_category: bool = True, optimizer_memory: bool = False,
                   own_memory: tuple[str, ...] = ()) -> list[str]:
    """The bandwidth curve each row's memory time uses: "memory", or with ``by_category`` for a non-GEMM
    kernel with at least ``MIN_GROUP_ROWS`` of its (category, dtype) "memory:<category>:<dtype>" (the
    memory curve at the pair's own peak fraction and half size); without it, for a category of
    ``own_memory`` "memory:<category>" (over every dtype). With ``optimizer_memory`` a non-GEMM kernel of
    the optimizer phase takes "memory:@optimizer" (``prior.OPTIMIZER_MEMORY``) before any of those, or with
    ``by_category`` "memory:@optimizer:<category>:<dtype>" (its pair's curve where that has too few)."""
    optimizer = (rows.optimizer.tolist() if optimizer_memory and rows.optimizer is not None
                 else [False] * len(rows))

    def key(c, d, g, o):
        if g:
            return "memory"
        if by_category:
            return f"{MEMORY_GROUP}{prior.OPTIMIZER_MEMORY + ':' if o else ''}{c}:{d}"
        if o:
            return MEMORY_GROUP + prior.OPTIMIZER_MEMORY
        return MEMORY_GROUP + c if c in own_memory else "memory"
    keys = [key(*k) for k in zip(rows.category, rows.dtype, rows.gemm.tolist(), optimizer)]
    counts = Counter(keys)

    def enough(k):  # an optimizer-phase pair with too few kernels takes its pair's curve, as priced
        if counts[k] >= MIN_GROUP_ROWS or k == "memory":
            return k
        pair = k.replace(prior.OPTIMIZER_MEMORY + ":", "")
        return pair if pair != k and counts[pair] >= MIN_GROUP_ROWS else "memory"
    return [enough(k) for k in keys]


def _memory_params(params: dict, name: str) -> torch.Tensor:
    """The raw memory curve parameters of group ``name``: "memory:<category>:<dtype>" is the memory curve
    with its peak fraction's and half size's raw parameters shifted by the pair's own."""
    if name == "memory":
        return params["memory"]
    return _shifted(params["memory"], params["mshift:" + name[len(MEMORY_GROUP):]])


def _ramp_factor(params: dict, rows: KernelRows) -> torch.Tensor | None:
    """Per row the batch norms' channel ramp (``prior.channel_ramp_factor``) from the fit's parameters
    ("cramp:batch_norm", "cramp:batch_norm_backward": log half channels, log slope), differentiable; None
    where the fit has none."""
    if "cramp:batch_norm" not in params or rows.bn_channels is None:
        return None
    ramp = {name: tuple(params[f"cramp:{name}"].exp()) for name in prior.BATCH_NORM_OPS}
    return prior.channel_ramp_factor(rows.bn_channels, rows.backward_mask(), ramp)


def _device_seconds(params: dict, rows: KernelRows, hw: Hardware, masks: dict, rates: torch.Tensor,
                    memory_masks: dict | None = None, conv_intensity: str = "tensor"):
    compute = torch.zeros_like(rows.seconds)
    intensity = _intensity(rows, conv_intensity)
    bounded = hw.kind != "cpu"  # a CPU's curves may pass its quoted peaks
    for name, m in masks.items():
        eff = _curve_t(_vector_params(params, name), rows.flops[m], intensity[m], bounded)
        compute = compute.masked_scatter(m, rows.flops[m] / (rates[m] * eff))
    if memory_masks is None:
        memory_masks = {"memory": torch.ones(len(rows), dtype=torch.bool)}
    memory = torch.zeros_like(rows.seconds)
    for name, m in memory_masks.items():
        eff = _curve_t(_memory_params(params, name), rows.moved[m], bounded=bounded)
        memory = memory.masked_scatter(m, rows.moved[m] / (hw.memory_bandwidth_Bps * eff))
    factor = _ramp_factor(params, rows)
    if factor is not None:
        compute, memory = compute * factor, memory * factor
    floor = torch.exp(params["floor"]).expand_as(compute)
    # a smooth max keeps the gradient alive for the term that is not (yet) the largest
    terms = torch.stack([compute.clamp_min(1e-12), memory.clamp_min(1e-12), floor]).log()
    return torch.logsumexp(terms * 8, 0).div(8).exp()


MEMORY_SHIFT_PENALTY = 1e-5
"""L2 weight on a (category, dtype)'s shifts of the memory curve's peak fraction and half size (raw scale):
weaker than ``SHIFT_PENALTY``; at 1e-3 it held AdamW's large foreach kernels 1.3x too slow (a few per cent
of the weighted loss sit in them)."""
STREAMING = ("optimizer",)
"""The non-GEMM categories a GPU fit prices by their bytes alone (``prior.Profile.streaming``)."""
MIN_GROUP_ROWS = 50
"""A (category, dtype) curve needs this many kernels; fewer are fitted with their dtype's pooled curve (a
non-GEMM category's peak fraction: with the vector curve's)."""
SHIFT_PENALTY = 1e-3
"""L2 weight on a category's shift of the vector curve's peak fraction (raw scale): it keeps the shared
curve the pooled one, which the categories without a fraction of their own use."""


FRESH_INIT_S_PER_BYTE = 0.3e-3 / 2 ** 20
"""Where ``fit_device`` starts a fitted fresh-allocation cost: 0.3 ms per MiB, between the two CPU kinds
measured by ``descriptor.measure_fresh_alloc`` (0.25 and 0.36)."""


def fit_device(rows: KernelRows, hw: Hardware, steps: int = 1500, by_category: bool = True,
               intensity: bool = True, vector_by_category: bool = True, memory_by_category: bool = True,
               streaming: tuple[str, ...] | None = None, backward_curves: bool = False,
               fresh: dict | None = None, grouped_conv: bool = False, depthwise: bool = False,
               conv_intensity: str = "tensor", channel_ramp: bool = False, optimizer_memory: bool = False,
               own_vector: tuple[str, ...] = (), own_memory: tuple[str, ...] = (),
               gemm_layouts: bool = False, layout_curves: bool = False,
               bounded_layout_curves: bool = False, layout_levels: bool = False,
               slow_conv: tuple[str, ...] = (), depthwise_probes: bool = False,
               step_weights: bool = False, depthwise_stride: bool = False, depthwise_floor: bool = False,
               attention_law: bool = False, depthwise_paths: bool = False, conv_blocks: bool = False,
               matmul_cap: bool = False) -> dict:
    """Curves (``prior.Curve`` dicts) for GEMM-like kernels per category and dtype (``by_category``; else per
    dtype), other compute ("vector"), memory traffic, and the device floor in seconds, fitted to ``rows``.
    With ``intensity`` the compute curves also ramp with arithmetic intensity; with ``vector_by_category``
    each non-GEMM category with enough kernels gets its own peak fraction of the vector curve
    (``vector_fraction``); with ``memory_by_category`` each non-GEMM (category, dtype) with enough kernels its
    own peak fraction and half size of the memory curve (``memory_fraction``, ``memory_half_size``).
    ``streaming`` categories are priced by their bytes alone (``prior.Profile.streaming``; default: the
    optimizer's on a GPU with ``memory_by_category``, none otherwise). With ``backward_curves`` a fused
    backward kernel of ``prior.BACKWARD_CURVES`` gets its own curve: tried on the CPU kinds (2026-11-25),
    where one convolution curve priced forward convolutions 1.7x too slow at every reduction depth, it made
    DenseNet's left-out steps worse (73 -> 86 % on the Intel kind, 60 -> 75 % on the second AMD kind), so it
    is off by default (README, *The CPU prior*). ``fresh`` (a CPU kind's measured fresh-allocation cost,
    ``{"threshold_bytes", "s_per_byte"}``: ``descriptor.Descriptor.fresh``) is added to every kernel's time
    before the curves are fitted to the rest, and kept in the result for ``device_profile``; with
    ``{"threshold_bytes": T, "s_per_byte": None}`` the cost per byte above ``T`` is fitted with the curves
    instead (log scale, from ``FRESH_INIT_S_PER_BYTE``; the result's ``fresh`` then says ``"fitted"`` and how
    many kernels it was fitted to; no ``fresh`` where no kernel allocates above ``T``): a CPU kind whose
    machine can no longer be measured, priced from its own profiles (``benchmarks/fresh_from_profiles.py``).
    With ``grouped_conv`` a grouped convolution (``prior.grouped_conv``: every depthwise one) gets a forward
    and a backward curve of its own (``prior.GROUPED_CONV``): tried on two CPU kinds (2026-11-26), it made
    DenseNet's left-out steps far better and the random CNNs' and RegNet's far worse (their small depthwise
    and dense-fast group convolutions priced by curves fitted to large depthwise ones), so it is off by
    default (README, *The CPU prior*). With ``depthwise`` each (direction, dtype) with at least
    ``MIN_GROUP_ROWS`` depthwise-like convolutions (``prior.depthwise_shapes``) gets a power law in their
    shape (``fit_depthwise``, ``prior.Profile.depthwise``) and the curves are fitted to the other rows;
    with ``depthwise_stride`` too, the law has the stride among its terms; with ``depthwise_floor`` it never
    prices a kernel faster than the fastest one it was fitted to (``fit_depthwise_floor``).
    ``conv_intensity="gemm"`` ramps a dense convolution's curve with its implicit GEMM's intensity
    (``prior.Profile.conv_intensity``). With ``channel_ramp`` each batch-norm op (forward, backward) gets a
    ramp in its channels (``prior.Profile.channel_ramp``) fitted with the curves. ``optimizer_memory`` gives
    the optimizer phase's non-GEMM kernels a bandwidth curve of their own (``prior.OPTIMIZER_MEMORY``: its
    peak fraction and half size; one per category and dtype with ``memory_by_category``); ``own_vector``
    categories their own peak fraction of the vector curve and ``own_memory`` categories their own bandwidth
    curve where ``vector_by_category`` and ``memory_by_category`` pool the others (on the CPU kinds here the
    random generator's kernels price at 0.11-0.14 of their time with the pooled vector curve, and the
    optimizer's in-place updates of 10 KB-1 MB at 1.2-1.7x theirs: README, *The CPU prior*). With
    ``gemm_layouts`` each two-operand GEMM's peak is its operand layout's measured ceiling
    (``prior.Profile.gemm_layouts``: ``hw.gemm_layout_ratio``, a CPU descriptor's per-layout rates), so the
    curves are fractions of that; it changes nothing on hardware without such rates. With ``layout_curves`` a
    two-operand matmul gets a curve of its own per operand layout and dtype ("matmul@tn:bf16",
    ``prior.LAYOUT_MARK``), its own size and intensity ramps, from the profiles alone (no descriptor rates);
    with ``bounded_layout_curves`` too, each such curve holds beyond the largest kernel (FLOPs) it was fitted
    on the fraction it reaches there (``prior.Curve.size_max``) instead of extrapolating its ramp. With
    ``layout_levels`` too, each layout's curve is its dtype's matmul curve ("matmul:bf16") at a peak fraction
    of its own (``LAYOUT_SHIFT``, held toward the shared level by ``SHIFT_PENALTY``): the operand layout sets
    the kernel's path and so its level, the size and intensity ramps are shared by every layout (written out
    as full per-layout curves, so that prediction reads them as ``layout_curves``; ``"layout_levels": true``
    in the result says how they were fitted). With ``slow_conv`` dtypes ("bf16"), each direction's dense
    convolutions of those dtypes get a law in their shape (``fit_slow_conv``, ``prior.Profile.slow_conv``),
    fitted to every such row; the curves are fitted as without it (the law overrides them where it
    applies, and a prior moved to another kind drops it: ``descriptor.transfer``); with ``conv_blocks`` too,
    the law has a cost per weight element per call and per unaligned multiply-add besides (``fit_slow_conv``).
    With ``depthwise_probes``
    and ``hw`` carrying depthwise probes (``Hardware.depthwise_probe_s``), the channels-last depthwise
    convolutions are priced from them (``prior.Profile.depthwise_probes``) and left out of the law and the
    curves; without probes it changes nothing. With ``step_weights`` each kernel weighs in the curves' fit
    as its share of its own step (``kernel_weights``; tried on the first CPU kind, worse: README *Protocol*).
    With ``attention_law`` each direction and dtype of fused attention kernels gets a law in the costs of
    its kernel's loops (``fit_attention``, ``prior.Profile.attention``), fitted to every such row; the curves
    are fitted as without it. With ``depthwise_paths`` each direction and dtype of depthwise-like
    convolutions also gets a law per kernel path (``fit_depthwise_paths``, ``prior.Profile.depthwise_paths``),
    which prices them in place of the power law. With ``matmul_cap`` each matmul curve holds at most the
    fraction of its ceiling it reaches on the kernels it was fitted to (``prior.Curve.fraction_max``): on a CPU
    its peak fraction may sit far above anything measured (2.2 for the first kind's bf16 matmuls, whose fastest
    fitted kernels reach 1.1), and a larger kernel's size and intensity would climb the ramps toward it."""
    slow = fit_slow_conv(rows, tuple(slow_conv), fresh, conv_blocks)
    fit_fresh = bool(fresh) and fresh.get("s_per_byte") is None
    probed = depthwise_probes and bool(hw.depthwise_probe_s)
    rows = unprobed(rows, hw) if probed else rows
    attention = fit_attention(rows, hw, None if fit_fresh else fresh) if attention_law else {}
    paths = fit_depthwise_paths(rows, None if fit_fresh else fresh) if depthwise_paths else {}
    law, floors, rows = (_depthwise_apart(rows, None if fit_fresh else fresh, depthwise_stride, depthwise_floor)
                         if depthwise else ({}, {}, rows))
    if streaming is None:
        streaming = STREAMING if memory_by_category and hw.kind != "cpu" else ()
    groups = _groups(rows, by_category, vector_by_category, backward_curves, grouped_conv, tuple(own_vector),
                     layout_curves)
    counts = Counter(groups)
    groups = [_fallback(g, counts) if ":" in g and counts[g] < MIN_GROUP_ROWS else g for g in groups]
    rates = _rates(rows, hw, gemm_layouts)
    streams = torch.tensor([c in streaming and not g for c, g in zip(rows.category, rows.gemm.tolist())])
    masks = {n: m & ~streams for n, m in _masks(groups).items()}
    masks = {n: m for n, m in masks.items() if bool(m.any())}
    memory_masks = _masks(_memory_groups(rows, memory_by_category, optimizer_memory, tuple(own_memory)))
    mshifts = sorted(n[len(MEMORY_GROUP):] for n in memory_masks if n != "memory")
    shifts = sorted(c for c in map(_vector_category, masks) if c is not None)
    lshifts = sorted(n for n in masks if prior.LAYOUT_MARK in n) if layout_curves and layout_levels else []
    names = sorted({"vector" if _vector_category(n) is not None else _layout_base(n) if n in lshifts else n
                    for n in masks})
    extra = [math.log(10.0), 0.0] if intensity else []
    bounded = hw.kind != "cpu"  # a CPU's curves may pass its quoted peaks
    if bounded:
        logit = lambda f: math.log(f / (1 - f))  # noqa: E731
        init = {n: [logit(0.6), math.log(1e9 if n != "vector" else 1e7), 0.0] + extra for n in names}
        init["memory"] = [logit(0.8), math.log(1e6), 0.0]
    else:  # a CPU: fractions of its measured peaks, starting from a memory curve that falls out of cache
        init = {n: [math.log(0.6), math.log(1e6 if n != "vector" else 1e4), 1.0] + extra for n in names}
        init["memory"] = [math.log(2.0), math.log(4e6), -0.5]
    params = {n: torch.tensor(v, dtype=torch.float64, requires_grad=True) for n, v in init.items()}
    params["floor"] = torch.tensor(math.log(3e-6), dtype=torch.float64, requires_grad=True)
    for c in shifts:
        params[f"shift:{c}"] = torch.zeros(1, dtype=torch.float64, requires_grad=True)
    for n in lshifts:
        params[LAYOUT_SHIFT + n] = torch.zeros(1, dtype=torch.float64, requires_grad=True)
    for k in mshifts:
        params[f"mshift:{k}"] = torch.zeros(2, dtype=torch.float64, requires_grad=True)
    if channel_ramp and rows.bn_channels is not None and bool((~torch.isnan(rows.bn_channels)).any()):
        for name in prior.BATCH_NORM_OPS:  # half at 64 channels, slope 1
            params[f"cramp:{name}"] = torch.tensor([math.log(64.0), 0.0], dtype=torch.float64, requires_grad=True)
    opt = torch.optim.Adam(list(params.values()), lr=0.03)
    weight = kernel_weights(rows, step_weights)
    target = torch.log(rows.seconds)
    faults = None if not fresh else prior.fresh_seconds(rows.fresh, fresh["threshold_bytes"],
                                                        1.0 if fit_fresh else fresh["s_per_byte"])
    if fit_fresh:  # faults holds the faulted bytes; their cost per byte is fitted with the curves
        if faults is None or not bool((faults > 0).any()):
            fresh, faults = None, None  # no kernel allocates above the threshold: nothing to fit it to
        else:
            params["fresh"] = torch.tensor(math.log(FRESH_INIT_S_PER_BYTE), dtype=torch.float64, requires_grad=True)
            opt.add_param_group({"params": [params["fresh"]]})
    for _ in range(steps):
        opt.zero_grad()
        pred = _device_seconds(params, rows, hw, masks, rates, memory_masks, conv_intensity)
        if faults is not None:
            pred = pred + (faults * torch.exp(params["fresh"]) if "fresh" in params else faults)
        loss = (weight * (torch.log(pred) - target) ** 2).sum()
        if shifts:
            loss = loss + SHIFT_PENALTY * sum((params[f"shift:{c}"] ** 2).sum() for c in shifts)
        if lshifts:
            loss = loss + SHIFT_PENALTY * sum((params[LAYOUT_SHIFT + n] ** 2).sum() for n in lshifts)
        if mshifts:
            loss = loss + MEMORY_SHIFT_PENALTY * sum((params[f"mshift:{k}"] ** 2).sum() for k in mshifts)
        loss.backward()
        opt.step()
    with torch.no_grad():
        def curve(p):
            p = [float(v) for v in p]
            out = {"peak_fraction": 1 / (1 + math.exp(-p[0])) if bounded else math.exp(p[0]),
                   "half_size": math.exp(p[1]), "slope": math.exp(p[2]) if bounded else p[2]}
            if len(p) > 3:
                out.update(intensity_half=math.exp(p[3]), intensity_slope=math.exp(p[4]))
            return out
        gemm = {n: curve(params[n]) for n in names if n != "vector"}
        gemm.update({n: curve(_vector_params(params, n)) for n in lshifts})
        if layout_curves and bounded_layout_curves:
            for n in gemm:
                if prior.LAYOUT_MARK in n:
                    gemm[n]["size_max"] = float(rows.flops[masks[n]].max())
        if matmul_cap:  # the fastest fraction each matmul curve gives a kernel it was fitted to
            intensity = _intensity(rows, conv_intensity)
            for n in gemm:
                if n.split(":")[0].split(prior.LAYOUT_MARK)[0] == "matmul" and n in masks:
                    m = masks[n]
                    gemm[n]["fraction_max"] = float(prior.Curve.from_dict(gemm[n])(rows.flops[m], intensity[m]).max())
        out = {"gemm": gemm, "memory": curve(params["memory"]),
               "vector": curve(params["vector"]) if "vector" in params else {"peak_fraction": 1.0},
               "device_floor_s": float(torch.exp(params["floor"]))}
        if shifts:
            out["vector_fraction"] = {c: curve(_vector_params(params, VECTOR_GROUP + c))["peak_fraction"]
                                      for c in shifts}
        if mshifts:
            own = {k: curve(_memory_params(params, MEMORY_GROUP + k)) for k in mshifts}
            out["memory_fraction"] = {k: c["peak_fraction"] for k, c in own.items()}
            out["memory_half_size"] = {k: c["half_size"] for k, c in own.items()}
        if streaming:
            out["streaming"] = sorted(streaming)
        if law:
            out["depthwise"] = law
        if floors:
            out["depthwise_floor"] = floors
        if slow:
            out["slow_conv"] = slow
        if attention:
            out["attention"] = attention
        if paths:
            out["depthwise_paths"] = paths
        if conv_intensity != "tensor":
            out["conv_intensity"] = conv_intensity
        if gemm_layouts:
            out["gemm_layouts"] = True
        if probed:
            out["depthwise_probes"] = True
        if lshifts:
            out["layout_levels"] = True
        if step_weights:
            out["step_weights"] = True
        if "cramp:batch_norm" in params:
            out["channel_ramp"] = {name: [float(v) for v in params[f"cramp:{name}"].exp()]
                                   for name in prior.BATCH_NORM_OPS}
        if fresh and "fresh" in params:
            out["fresh"] = {"threshold_bytes": float(fresh["threshold_bytes"]),
                            "s_per_byte": float(torch.exp(params["fresh"])), "fitted": True,
                            "faulted_kernels": int((faults > 0).sum())}
        elif fresh:
            out["fresh"] = {"threshold_bytes": float(fresh["threshold_bytes"]),
                            "s_per_byte": float(fresh["s_per_byte"])}
    return out


def _law_target(rows: KernelRows, fresh: dict | None) -> torch.Tensor:
    """The seconds a shape law is fitted to (float64 [R]): each row's time less its measured fresh-allocation
    cost (``fresh``: threshold and seconds per byte; none where it has no such figure), at least a tenth of
    the time left; the prior adds the cost back."""
    faults = (None if not fresh or fresh.get("s_per_byte") is None
              else prior.fresh_seconds(rows.fresh, fresh["threshold_bytes"], fresh["s_per_byte"]))
    return rows.seconds if faults is None else torch.maximum(rows.seconds - faults, 0.1 * rows.seconds)


def fit_depthwise(rows: KernelRows, fresh: dict | None = None, stride: bool = False) -> tuple[dict, torch.Tensor]:
    """A power law in the shape of the depthwise-like convolutions of ``rows`` (``prior.Profile.depthwise``),
    per direction and dtype with at least ``MIN_GROUP_ROWS`` of them: log time (less a measured
    fresh-allocation cost, which the prior adds back; at least a tenth of the time left) by ordinary least
    squares on the logs of batch, channels, spatial size and taps (and the stride, with ``stride``), its
    constant raised by the log of the mean of exp(residual), so that the rows' summed time is priced without
    the geometric mean's low bias. Returns the laws ({"backward:bf16": [c0, a, b, c, d]}, ``e`` appended
    for the stride) and which rows they price (bool [R])."""
    on_law = torch.zeros(len(rows), dtype=torch.bool)
    if rows.depthwise is None:
        return {}, on_law
    has = ~torch.isnan(rows.depthwise[:, 0])
    columns = prior.DEPTHWISE_SHAPE.index("stride") + (1 if stride else 0)
    target = _law_target(rows, fresh)
    backward = rows.backward_mask()
    names = np.array(rows.dtype)
    law = {}
    for b in (False, True):
        for d in sorted(set(names[has.numpy()].tolist())):
            m = has & (backward == b) & torch.from_numpy(names == d)
            if int(m.sum()) < MIN_GROUP_ROWS:
                continue
            X = torch.cat([torch.ones(int(m.sum()), 1, dtype=torch.float64),
                           torch.log(rows.depthwise[m][:, :columns].clamp_min(1.0))], 1).numpy()
            y = torch.log(target[m]).numpy()
            coef = np.linalg.lstsq(X, y, rcond=None)[0]
            coef[0] += math.log(float(np.mean(np.exp(y - X @ coef))))
            law[prior.depthwise_key(b, d)] = [float(c) for c in coef]
            on_law |= m
    return law, on_law


def fit_depthwise_floor(rows: KernelRows, law: dict, fresh: dict | None = None) -> dict[str, float]:
    """``prior.Profile.depthwise_floor``: per key of ``law`` (``fit_depthwise``'s), the seconds per unit of work
    (``prior.depthwise_work``) of the fastest depthwise-like kernel of ``rows`` in that direction and dtype
    (its time less a measured fresh-allocation cost, as the law is fitted): the law never prices a kernel
    faster than one it was fitted to ran. Declared before it was scored (README *Protocol*, "A floor under the
    depthwise law")."""
    if rows.depthwise is None or not law:
        return {}
    has = ~torch.isnan(rows.depthwise[:, 0])
    target = _law_target(rows, fresh)
    per_unit = target / prior.depthwise_work(rows.depthwise)
    return {key: float(per_unit[m].min())
            for m, key in prior._law_rows({k: k for k in law}, has, rows.backward_mask(), rows.dtype)}


def probed_rows(rows: KernelRows, hw: Hardware) -> torch.Tensor:
    """Per row (float64 [R]) its seconds from ``hw``'s depthwise probes where it is a channels-last
    depthwise-like convolution they price (``prior.Profile.depthwise_probes``), NaN elsewhere."""
    from gnn_ptp import depthwise_table

    if rows.depthwise is None or rows.layout is None or not hw.depthwise_probe_s:
        return torch.full((len(rows),), float("nan"), dtype=torch.float64)
    return depthwise_table.priced(rows.depthwise, rows.backward_mask(), rows.dtype, prior.channels_last(rows.layout),
                                  hw.depthwise_probe_s)


def unprobed(rows: KernelRows, hw: Hardware) -> KernelRows:
    """``rows`` without those ``hw``'s depthwise probes price (``probed_rows``): neither the depthwise law nor
    the curves are fitted to them."""
    return take(rows, torch.isnan(probed_rows(rows, hw))) if hw.depthwise_probe_s else rows


def _nnls(A: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with every coefficient >= 0: ``lstsq`` on the active columns, the negative ones dropped
    until none is left (enough for a handful of columns whose costs all add)."""
    active = list(range(A.shape[1]))
    coef = np.zeros(A.shape[1])
    while active:
        c = np.linalg.lstsq(A[:, active], y, rcond=None)[0]
        if (c >= 0).all():
            coef[active] = c
            break
        active = [a for a, v in zip(active, c) if v >= 0]
    return coef


def fit_slow_conv(rows: KernelRows, dtypes: tuple[str, ...], fresh: dict | None = None,
                  conv_blocks: bool = False) -> dict:
    """A slow-path convolution law (``prior.Profile.slow_conv``) per direction and dtype of ``dtypes`` with
    at least ``MIN_GROUP_ROWS`` dense convolutions in ``rows``: the time (less a measured fresh-allocation
    cost, which the prior adds back; at least a tenth of it left) as a non-negative sum of the first
    ``prior.SLOW_CONV_BASE_TERMS`` costs of ``prior.slow_conv_terms`` (all of them with ``conv_blocks``: a
    cost per weight element per call and per multiply-add of a convolution whose channels are not in whole
    blocks besides), fitted by least squares on the relative error, each row weighted by the square root of
    its time over the median (as the curves weight theirs): {"backward:bf16": [6 or 8 s/unit]}. {} without
    ``dtypes`` or such rows. ``conv_blocks`` was declared before it was scored (README *Protocol*, "Dense
    convolutions by their channel blocks")."""
    if not dtypes or rows.slow_conv is None:
        return {}
    terms = rows.slow_conv if conv_blocks else rows.slow_conv[:, :prior.SLOW_CONV_BASE_TERMS]
    return _additive_law(rows, terms, dtypes, fresh)


def fit_attention(rows: KernelRows, hw: Hardware, fresh: dict | None = None) -> dict:
    """An attention law (``prior.Profile.attention``) per direction and dtype with at least
    ``ATTENTION_MIN_ROWS`` fused attention kernels in ``rows``: the time as a non-negative sum of the costs of
    ``prior.attention_terms``, fitted as ``fit_slow_conv`` fits its law but with each column scaled to unit
    norm (``_additive_law(unit_free=True)``) and the multiply-adds at ``hw``'s GEMM peak of the dtype
    (``Hardware.flops_rate``: 2 / peak seconds each, not fitted): the rest of the time is what the kernel's
    loops add above its GEMM work at peak (per call, block pair, query row, score and byte), each at least 0:
    {"backward:bf16": [6 s/unit]}; {} where there are none. The curves are still
    fitted to these rows (the law overrides them where it applies). Declared before it was scored (README
    *Protocol*, "Attention by its kernel's loops")."""
    if rows.attention is None:
        return {}
    has = ~torch.isnan(rows.attention[:, 0])
    mac = prior.ATTENTION_TERMS.index("mac")
    peak = {d: 2.0 / hw.flops_rate(d, False, gemm=True) for d in set(np.array(rows.dtype)[has.numpy()])}
    return _additive_law(rows, rows.attention, tuple(sorted(peak)), fresh, ATTENTION_MIN_ROWS, unit_free=True,
                         fixed={(mac, d): s for d, s in peak.items()})


def fit_depthwise_paths(rows: KernelRows, fresh: dict | None = None) -> dict:
    """A depthwise law per kernel path (``prior.Profile.depthwise_paths``) per direction and dtype with at least
    ``MIN_GROUP_ROWS`` depthwise-like convolutions in ``rows`` (their shapes: ``KernelRows.depthwise``): the
    time as a non-negative sum of the costs of ``prior.depthwise_path_terms``, each column scaled to unit norm
    (``_additive_law(unit_free=True)``). {} where there are none. Declared before it was scored (README
    *Protocol*, "Depthwise convolutions by their kernel's path"). A path none of a (direction, dtype)'s rows
    runs gets None for its two costs (forty-seventh session): the fit knows nothing of it, and 0 would price
    its kernels by the call and plane costs alone (the random CNNs' 7x7 stride-2 backward at ~0.45x its time
    where they are left out of the fit); ``prior.slow_conv_seconds`` then leaves such a node to the power law."""
    if rows.depthwise is None:
        return {}
    terms = prior.depthwise_path_terms(rows.depthwise)
    has = ~torch.isnan(terms[:, 0])
    return _additive_law(rows, terms, tuple(sorted(set(np.array(rows.dtype)[has.numpy()]))), fresh, unit_free=True,
                         unfitted=None)


ATTENTION_MIN_ROWS = 2 * len(prior.ATTENTION_TERMS)
"""Fused attention kernels a (direction, dtype) needs for a law of its own (``fit_attention``): twice its
terms. A step has one per layer and direction, so a dataset holds far fewer than of its GEMMs: the size
protocol's smaller half on the first CPU kind has 24 fp32 ones a direction."""


def _additive_law(rows: KernelRows, terms: torch.Tensor, dtypes: tuple[str, ...], fresh: dict | None,
                  min_rows: int = MIN_GROUP_ROWS, unit_free: bool = False, fixed: dict | None = None,
                  unfitted: float | None = 0.0) -> dict:
    """``fit_slow_conv``'s fit of the costs ``terms`` (NaN rows: not priced by the law) per direction and dtype
    of ``dtypes`` with at least ``min_rows`` rows. With ``unit_free`` each cost's column is scaled to unit
    norm before the fit (and its coefficient back after), so that where the rows cannot tell two costs apart
    (both grow alike over them) the least-norm answer splits the time between them whatever their units,
    rather than giving it to the one counted in the larger numbers. ``fixed``: {(term index, dtype): seconds
    per unit} of terms not fitted (their time is counted, the others fitted to the rest). ``unfitted``: the
    coefficient of a cost no row of the (direction, dtype) has (0 by default; None: unknown, see
    ``fit_depthwise_paths``)."""
    has = ~torch.isnan(terms[:, 0])
    target = _law_target(rows, fresh)
    backward = rows.backward_mask()
    names = np.array(rows.dtype)
    law = {}
    for b in (False, True):
        for d in dtypes:
            m = (has & (backward == b) & torch.from_numpy(names == d)).numpy()
            if int(m.sum()) < min_rows:
                continue
            t = target.numpy()[m]
            w = np.sqrt(t / np.median(t))
            design = terms.numpy()[m] / t[:, None] * w[:, None]
            held = {i: c for (i, dt), c in (fixed or {}).items() if dt == d}
            free = [i for i in range(design.shape[1]) if i not in held]
            target_w = w - sum(design[:, i] * c for i, c in held.items()) if held else w
            norm = np.linalg.norm(design[:, free], axis=0) if unit_free else np.ones(len(free))
            norm = np.where(norm > 0, norm, 1.0)
            coef = np.zeros(design.shape[1])
            coef[free] = _nnls(design[:, free] / norm, target_w) / norm
            for i, c in held.items():
                coef[i] = c
            absent = ~(design != 0).any(axis=0)
            law[prior.depthwise_key(b, d)] = [unfitted if absent[i] and i not in held else float(c)
                                              for i, c in enumerate(coef)]
    return law


def _depthwise_apart(rows: KernelRows, fresh: dict | None, stride: bool = False,
                     floor: bool = False) -> tuple[dict, dict, KernelRows]:
    """``fit_depthwise``'s laws, with ``floor`` their floors (``fit_depthwise_floor``; else {}), and the rows
    they do not price (the ones the curves are fitted to)."""
    law, on_law = fit_depthwise(rows, fresh, stride)
    floors = fit_depthwise_floor(rows, law, fresh) if floor else {}
    return law, floors, (take(rows, ~on_law) if law else rows)


def kernel_weights(rows: KernelRows, step_weights: bool = False) -> torch.Tensor:
    """Each row's weight in the device fit's log-time loss, summing to 1: the square root of its time (the
    default: the kernels that hold a step count more than a thousand tiny ones, which still count), or with
    ``step_weights`` its share of its own step's measured kernel time (``KernelRows.step_share``): every step
    weighs the same, a small step's kernels as much as a large one's, and within a step each kernel as much
    as it adds to the step's time, the weight a step's relative error puts on it to first order."""
    if step_weights:
        if rows.step_share is None:
            raise ValueError("step_weights needs each row's share of its step (KernelRows.step_share)")
        weight = rows.step_share.double()
    else:
        weight = rows.seconds.sqrt()
    return weight / weight.sum()


def device_profile(hw: Hardware, fitted: dict, host_s=None, fixed_s=None) -> prior.Profile:
    """A ``prior.Profile`` from ``fit_device``'s curves (and, once fitted, the host costs)."""
    d = {"gemm": fitted["gemm"], "vector": fitted["vector"], "memory": fitted["memory"],
         "launch_floor_s": fitted["device_floor_s"], "vector_fraction": fitted.get("vector_fraction", {}),
         "memory_fraction": fitted.get("memory_fraction", {}),
         "memory_half_size": fitted.get("memory_half_size", {}), "streaming": fitted.get("streaming", []),
         "depthwise": fitted.get("depthwise", {}), "slow_conv": fitted.get("slow_conv", {}),
         "depthwise_floor": fitted.get("depthwise_floor", {}), "attention": fitted.get("attention", {}),
         "depthwise_paths": fitted.get("depthwise_paths", {})}
    if fitted.get("conv_intensity"):
        d["conv_intensity"] = fitted["conv_intensity"]
    if fitted.get("channel_ramp"):
        d["channel_ramp"] = fitted["channel_ramp"]
    if fitted.get("gemm_layouts"):
        d["gemm_layouts"] = True
    if fitted.get("depthwise_probes"):
        d["depthwise_probes"] = True
    if fitted.get("fresh"):
        d["fresh_threshold_bytes"] = fitted["fresh"]["threshold_bytes"]
        d["fresh_s_per_byte"] = fitted["fresh"]["s_per_byte"]
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
    rates = _rates(rows, hw, profile.gemm_layouts)
    eff = torch.empty_like(rows.seconds)
    intensity = _intensity(rows, profile.conv_intensity)
    for name, m in _masks(_groups(rows, vector_by_category=True, backward_curves=True,
                                  grouped_conv=True, layout_curves=profile.layout_curves)).items():
        category = _vector_category(name)
        if category is not None:
            curve = profile.vector_curve(category)
        else:
            category, dtype = name.split(":")
            category, _, layout = category.partition(prior.LAYOUT_MARK)
            backward = category.endswith(prior.BACKWARD_SUFFIX)
            category = category.removesuffix(prior.BACKWARD_SUFFIX)
            curve = profile.gemm_curve(dtype, category, backward, layout)
        streams = _vector_category(name) is not None and category in profile.streaming
        eff[m] = float("inf") if streams else curve(rows.flops[m], intensity[m])  # streaming: bytes alone
    compute = rows.flops / (rates * eff)
    bandwidth = torch.empty_like(rows.seconds)
    category, dtype = np.array(rows.category), np.array(rows.dtype)
    optimizer = prior.optimizer_memory_rows(rows.optimizer if rows.optimizer is not None
                                            else torch.zeros(len(rows), dtype=torch.bool), rows.gemm, profile)
    for c, d, o in set(zip(rows.category, rows.dtype, optimizer.tolist())):
        m = torch.from_numpy((category == c) & (dtype == d)) & (optimizer == o)
        bandwidth[m] = profile.memory_curve(c, d, o)(rows.moved[m])
    memory = rows.moved / (hw.memory_bandwidth_Bps * bandwidth)
    seconds = torch.maximum(compute, memory)
    if profile.channel_ramp and rows.bn_channels is not None:
        seconds = seconds * prior.channel_ramp_factor(rows.bn_channels, rows.backward_mask(), profile.channel_ramp)
    path_terms = (prior.depthwise_path_terms(rows.depthwise)  # only where a law reads them
                  if profile.depthwise_paths and rows.depthwise is not None else None)
    for law, feats, law_seconds in ((profile.depthwise, rows.depthwise,
                                     partial(prior.depthwise_law_seconds, floor=profile.depthwise_floor)),
                                    (profile.slow_conv, rows.slow_conv, prior.slow_conv_seconds),
                                    (profile.attention, rows.attention, prior.slow_conv_seconds),
                                    (profile.depthwise_paths, path_terms, prior.slow_conv_seconds)):
        if law and feats is not None:  # as prior.node_seconds prices a graph's nodes
            by_law = law_seconds(feats, rows.backward_mask(), rows.dtype, law)
            seconds = torch.where(torch.isnan(by_law), seconds, by_law)
    if profile.depthwise_probes:  # as prior.node_seconds
        by_table = probed_rows(rows, hw)
        seconds = torch.where(torch.isnan(by_table), seconds, by_table)
    seconds = torch.maximum(seconds, torch.full_like(compute, profile.launch_floor_s))
    faults = prior.fresh_seconds(rows.fresh, profile.fresh_threshold_bytes, profile.fresh_s_per_byte)
    return seconds if faults is None else seconds + faults


# --- stage 2: host issue cost -------------------------------------------------------------------------------


def fit_host(samples: list, profile: prior.Profile, per_kernel_us=None, per_phase_us=None) -> tuple[list, list, dict]:
    """Per phase, the host cost per issued kernel and the fixed host cost of the phase (seconds) that
    minimise the mean absolute log error of the launch queue (``prior.phase_after``) against the measured
    phase medians of ``samples``. The phases are fitted in order, each with the GPU's lag the fitted
    earlier phases leave (the forward first from lag 0, then again from the steady-state lag at the end of
    a step, ``prior.STEADY_PASSES``). The optimizer's kernels are counted as the step's parameter tensors
    (the backward kernels that finalise a gradient): a foreach kernel is one graph node but its host work
    (and PyTorch's per-parameter bookkeeping) grows with the tensor count. On a CPU (``Profile.serial``)
    the phase is the plain sum ``fixed + issues * host + kernels``: no queue, no lag."""
    per_kernel = torch.tensor(np.arange(0.0, 150.01, 0.5) if per_kernel_us is None else per_kernel_us,
                              dtype=torch.float64) * 1e-6
    fixed = torch.tensor(np.arange(0.0, 3000.01, 25.0) if per_phase_us is None else per_phase_us,
                         dtype=torch.float64) * 1e-6
    phases = len(prior.PHASE_NAMES)
    rows = []  # per sample: per phase (queue seconds [H], device sum s, kernels, measured s)
    for s in samples:
        t = prior.node_seconds(s.x, s.x_cat, profile, getattr(s, "fresh_bytes", None), getattr(s, "gemm_layout", None))
        measured = s.y[0].double().exp() * 1e-3
        row = []
        for p in range(phases):
            device = t[s.phase == p]
            if p == prior.PHASE_NAMES.index("optimizer"):
                device = prior.optimizer_issues(device, getattr(s, "grad_bytes", None))
            queue = None if profile.serial else prior.queue_ms_grid(device, per_kernel) * 1e-3
            row.append((queue, float(device.sum()), device.numel(),
                        float(measured[p])))
        rows.append(row)
    host, base, report = [0.0] * phases, [0.0] * phases, {}

    def choose(p: int, pred: torch.Tensor, meas: torch.Tensor) -> None:
        """The grid point ([S, H, F] predicted phase seconds) with the least mean absolute log error."""
        err = (pred.log() - meas.log()[:, None, None]).abs().mean(0)
        hi, fi = divmod(int(err.argmin()), err.shape[1])
        host[p], base[p] = float(per_kernel[hi]), float(fixed[fi])
        report[prior.PHASE_NAMES[p]] = {"host_us_per_kernel": host[p] * 1e6, "fixed_us": base[p] * 1e6,
                                        "mean_abs_log_error": float(err[hi, fi]), "n": len(meas)}

    if profile.serial:  # a CPU: each phase is fixed + issues * host + its kernels, nothing overlaps
        for p in range(phases):
            keep = [i for i, r in enumerate(rows) if r[p][2] and r[p][3] > 0]
            if keep:
                total, n, meas = (torch.tensor([rows[i][p][j] for i in keep], dtype=torch.float64) for j in (1, 2, 3))
                choose(p, total[:, None, None] + n[:, None, None] * per_kernel[None, :, None] + fixed[None, None, :],
                       meas)
        return host, base, report
    lag_start = torch.zeros(len(rows), dtype=torch.float64)
    for _ in range(prior.STEADY_PASSES):
        lag = lag_start.clone()
        for p in range(phases):
            keep = [i for i, r in enumerate(rows) if r[p][2] and r[p][3] > 0]
            if keep:
                queue = torch.stack([rows[i][p][0] for i in keep])  # [S, H] seconds
                total = torch.tensor([rows[i][p][1] for i in keep], dtype=torch.float64)
                meas = torch.tensor([rows[i][p][3] for i in keep], dtype=torch.float64)
                choose(p, torch.maximum(total[:, None, None],
                                        fixed[None, None, :] + queue[:, :, None] - lag[keep][:, None, None]), meas)
            chosen = int(torch.argmin((per_kernel - host[p]).abs()))  # host[p]'s place in the grid
            for i, r in enumerate(rows):  # the lag this phase leaves, with its fitted costs
                queued, total, n, _ = r[p]
                if n:
                    phase_s = max(total, base[p] + float(queued[chosen]) - float(lag[i]))
                    lag[i] = lag[i] + phase_s - (base[p] + n * host[p])
        lag_start = lag
    return host, base, report


def step_errors(samples: list, profile: prior.Profile) -> dict:
    """Step-time MAPE / median APE of the prior (queue model where the profile has host costs), overall,
    per precision class and per family, with the median predicted / measured ratio."""
    pred, true = _step_ms(samples, profile)
    out = {"all": _summary(pred, true)}
    for attr, key in (("precision", "by_precision"), ("family", "by_family")):
        values = np.array([getattr(s, attr) for s in samples])
        out[key] = {v: _summary(pred[values == v], true[values == v]) for v in sorted(set(values))}
    return out


def _step_ms(samples: list, profile: prior.Profile) -> tuple[np.ndarray, np.ndarray]:
    """(the prior's step ms, the measured step median ms) of every sample."""
    pred = np.array([prior.phase_ms(s, profile)[3] for s in samples])
    true = np.array([float(s.y[0, 3].double().exp()) for s in samples])
    return pred, true


def _summary(pred: np.ndarray, true: np.ndarray) -> dict:
    ape = np.abs(pred / true - 1) * 100
    return {"n": int(len(ape)), "mape": float(ape.mean()), "median_ape": float(np.median(ape)),
            "ratio_median": float(np.median(pred / true))}


# --- leave one family out ------------------------------------------------------------------------------------


def subsample(rows: KernelRows, limit: int, seed: int = 0) -> KernelRows:
    """At most ``limit`` rows (the device fit's cost grows with rows), drawn uniformly: those with the
    smallest ``draw``, so the same rows whatever order they come in; rows without draws are drawn with a
    fixed ``seed``."""
    if len(rows) <= limit:
        return rows
    draw = rows.draw if rows.draw is not None else torch.rand(
        len(rows), generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    keep = torch.argsort(draw, stable=True)[:limit].sort().values
    return take(replace(rows, draw=draw), keep)


def take(rows: KernelRows, keep: torch.Tensor) -> KernelRows:
    """The rows at indices ``keep`` (int) or where ``keep`` is true (bool), in their order."""
    if keep.dtype == torch.bool:
        keep = torch.nonzero(keep).flatten()
    pick = keep.tolist()

    def part(t):
        return t[keep] if t is not None else None
    return KernelRows(rows.flops[keep], rows.moved[keep], [rows.dtype[i] for i in pick], rows.gemm[keep],
                      rows.tensor_core[keep], [rows.category[i] for i in pick], [rows.family[i] for i in pick],
                      rows.seconds[keep], part(rows.draw), part(rows.backward), part(rows.fresh),
                      part(rows.grouped), part(rows.depthwise), part(rows.conv_gemm), part(rows.bn_channels),
                      part(rows.optimizer), part(rows.layout), part(rows.slow_conv), part(rows.step_share),
                      part(rows.attention))


def fit(samples: list, node_seconds: dict, hw: Hardware, max_rows: int | None = None, **device_kw):
    """Both stages on ``samples``: (fitted device curves, profile with host costs, host report). With
    ``depthwise`` the law is fitted to every depthwise-like kernel (a few thousand) and the curves to at most
    ``max_rows`` of the others. ``profiler_cost``: ``node_seconds`` leave out the profiler's cost per
    recorded op (``node_labels.node_seconds(..., profiler_cost=True)``, the caller's); the fit says so
    (``fitted["profiler_cost"]``), and a refit of its section does the same (``section_options``)."""
    profiler_cost = device_kw.pop("profiler_cost", False)
    rows = kernel_rows(samples, node_seconds)
    rows = unprobed(rows, hw) if device_kw.get("depthwise_probes") else rows  # before the law is fitted
    slow = fit_slow_conv(rows, tuple(device_kw.pop("slow_conv", ())), device_kw.get("fresh"),
                         device_kw.pop("conv_blocks", False))
    attention = fit_attention(rows, hw, device_kw.get("fresh")) if device_kw.pop("attention_law", False) else {}
    paths = fit_depthwise_paths(rows, device_kw.get("fresh")) if device_kw.pop("depthwise_paths", False) else {}
    stride, floor = device_kw.pop("depthwise_stride", False), device_kw.pop("depthwise_floor", False)
    law, floors, rows = (_depthwise_apart(rows, device_kw.get("fresh"), stride, floor)
                         if device_kw.pop("depthwise", False) else ({}, {}, rows))
    if max_rows:
        rows = subsample(rows, max_rows)
    fitted = fit_device(rows, hw, **device_kw)
    if law:
        fitted["depthwise"] = law
    if floors:
        fitted["depthwise_floor"] = floors
    if slow:
        fitted["slow_conv"] = slow
    if attention:
        fitted["attention"] = attention
    if paths:
        fitted["depthwise_paths"] = paths
    if profiler_cost:
        fitted["profiler_cost"] = True
    host, fixed, report = fit_host(samples, device_profile(hw, fitted))
    return fitted, device_profile(hw, fitted, host, fixed), report


def section_options(section: dict) -> dict:
    """``fit_device``'s curve options a shipped calibration section (``prior_calibration.json``) was fitted
    with, read from what it carries: per-category vector fractions and bandwidth curves only where it has
    them (the AMD CPU kinds ship pooled ones: ``calibrate_prior.py --pooled-vector --pooled-memory``), the
    batch norms' channel ramp and a convolution intensity where it has them, the stride in its depthwise
    law where the law has that term. Whether there is a depthwise law at all and a CPU's fresh-allocation
    cost are the caller's (``protocol.PriorRefit``)."""
    return {"vector_by_category": bool(section.get("vector_fraction")),
            "memory_by_category": bool(section.get("memory_fraction")),
            "channel_ramp": bool(section.get("channel_ramp")),
            "conv_intensity": section.get("conv_intensity") or "tensor",
            "gemm_layouts": bool(section.get("gemm_layouts")),
            "layout_curves": any(prior.LAYOUT_MARK in k for k in section.get("gemm", {})),
            "bounded_layout_curves": any(prior.LAYOUT_MARK in k and v.get("size_max", 0) > 0
                                         for k, v in section.get("gemm", {}).items()),
            "layout_levels": bool(section.get("layout_levels")),
            "slow_conv": tuple(sorted({k.split(":")[1] for k in section.get("slow_conv", {})})),
            "conv_blocks": any(len(c) > prior.SLOW_CONV_BASE_TERMS for c in section.get("slow_conv", {}).values()),
            "depthwise_probes": bool(section.get("depthwise_probes")),
            "step_weights": bool(section.get("step_weights")),
            "profiler_cost": bool(section.get("profiler_cost")),
            "depthwise_stride": any(len(c) > prior.DEPTHWISE_SHAPE.index("stride") + 1
                                    for c in section.get("depthwise", {}).values()),
            "depthwise_floor": bool(section.get("depthwise_floor")),
            "attention_law": bool(section.get("attention")),
            "depthwise_paths": bool(section.get("depthwise_paths")),
            "matmul_cap": any(v.get("fraction_max", 0) > 0 for v in section.get("gemm", {}).values())}


MAX_ROWS = 80_000
"""Kernel rows a device fit draws at most when it fits many times (its cost grows with rows)."""


_LOFO_ARGS: tuple = ()
"""What a forked ``leave_one_family_out`` worker reads (samples, node seconds, hardware, max rows, options):
set in the parent before the pool forks, so nothing large is pickled."""


def _left_out(family: str) -> tuple[np.ndarray, np.ndarray]:
    """(predicted, measured) step ms of ``family``'s steps by a prior fitted to every other family."""
    samples, node_seconds, hw, max_rows, device_kw = _LOFO_ARGS
    train = [s for s in samples if s.family != family]
    _, profile, _ = fit(train, node_seconds, hw, max_rows=max_rows, **device_kw)
    return _step_ms([s for s in samples if s.family == family], profile)


def _left_out_worker(family: str) -> tuple[np.ndarray, np.ndarray]:
    torch.set_num_threads(1)
    return _left_out(family)


def leave_one_family_out(samples: list, node_seconds: dict, hw: Hardware, max_rows: int = MAX_ROWS,
                         log=None, jobs: int = 1, **device_kw) -> dict:
    """Each family's steps predicted by a prior fitted (kernels and host costs) to every other family:
    per family the ``step_errors`` summary, and over all steps (each predicted once, by the fit that never
    saw its family) the same summary with the mean and worst family MAPE. With ``jobs`` > 1 the families
    are left out in that many forked processes at once, one thread each (the fits do not depend on it)."""
    global _LOFO_ARGS
    families = sorted({s.family for s in samples})
    per_family, pred, true, precision = {}, [], [], []
    _LOFO_ARGS = (samples, node_seconds, hw, max_rows, device_kw)
    pool = None
    try:
        if jobs > 1:
            import multiprocessing

            pool = multiprocessing.get_context("fork").Pool(min(jobs, len(families)))
            scored = zip(families, pool.imap(_left_out_worker, families))
        else:
            scored = ((f, _left_out(f)) for f in families)
        for f, (p, t) in scored:
            per_family[f] = _summary(p, t)
            pred += p.tolist()
            true += t.tolist()
            precision += [s.precision for s in samples if s.family == f]
            if log:
                log(f"  {f:<20} {per_family[f]['mape']:5.1f}%  (n {per_family[f]['n']})")
    finally:
        _LOFO_ARGS = ()
        if pool is not None:
            pool.terminate()
    pred, true, precision = np.array(pred), np.array(true), np.array(precision)
    ape = np.abs(pred / true - 1) * 100
    mapes = [v["mape"] for v in per_family.values()]
    worst = max(per_family, key=lambda f: per_family[f]["mape"])
    return {"all": _summary(pred, true),
            "family_mean_mape": float(np.mean(mapes)), "worst_family": worst,
            "worst_family_mape": per_family[worst]["mape"], "by_family": per_family,
            "by_precision": {p: float(ape[precision == p].mean()) for p in sorted(set(precision))},
            "max_rows": max_rows}
