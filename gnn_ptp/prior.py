"""The physical prior: what each kernel of a traced step should take on a given hardware, from its FLOPs,
bytes, dtype and path alone (no learning from step times).

Per node (one kernel of ``graph.to_tensors``)::

    compute_s = FLOPs / (peak(dtype, path) * gemm_curve[category, dtype](FLOPs, intensity))
                                                                     matmul, conv, attention
              = FLOPs / (vector_rate * vector_curve(FLOPs, intensity))        everything else
    memory_s  = bytes read + written / (bandwidth * memory_curve[category, dtype](bytes))
    seconds   = max(compute_s, memory_s, launch_floor_s)        (memory_s alone for a ``streaming`` category)
              + fresh bytes above the mmap threshold * fresh_s_per_byte        (a CPU whose cost is measured)

where a depthwise-like convolution's ``max(compute_s, memory_s)`` is, on a profile fitted with one, a power
law in its shape instead (``Profile.depthwise``: batch, channels, height x width, taps), and on a CPU profile
fitted with one a fused attention's time is a sum of the costs of its kernel's loops (``Profile.attention``).

``peak(dtype, path)`` is ``Hardware.flops_rate``: tensor-core rates for tf32/fp16/bf16 matmuls on a GPU,
the CUDA-core rate for strict fp32, the measured GEMM rate per dtype on a CPU. A curve is the fraction
of the peak a kernel of that size reaches, ``peak_fraction / (1 + (half_size / size) ** slope)``: small
GEMMs run far below peak, large memory-bound kernels reach ~85-90 % of the bandwidth; a curve may also
ramp with the kernel's arithmetic intensity (FLOPs per byte: thin GEMMs and depthwise convolutions fill
few tiles). On a GPU fitted to its own profiles the GEMM-like curves are per category (matmul, conv,
attention) and dtype: cuDNN convolutions and fused attention reach other fractions than cuBLAS GEMMs; the
non-GEMM kernels share one compute curve and one bandwidth curve, each at a peak fraction of the kernel's
own category (``vector_fraction``) or category and dtype (``memory_fraction``, ``memory_half_size``) where
fitted so, and the optimizer's foreach kernels are priced by their bytes alone (``streaming``). On a CPU
an output allocated above the allocator's mmap threshold also costs its page faults
(``fresh_s_per_byte``: glibc maps such a buffer from the kernel at every allocation). The launch floor
is the least time a kernel costs a PyTorch eager step (host dispatch + launch); a kernel shorter than it
still costs it, because the host cannot issue kernels faster.

The curves are fitted per hardware by ``benchmarks/calibrate_prior.py`` into
``gnn_ptp/prior_calibration.json`` (section ``h100``: the H200 harvest's profiled kernels and timed steps,
``gnn_ptp/prior_fit.py``, with host issue costs; ``h100-neusight``: the earlier fit to NeuSight's public
per-kernel H100 GEMM timings; ``cpu``: the CPU dataset's profiled kernels and timed steps, fitted the same way
with unbounded curves and a serial step, ``Profile.serial``). H200 and A100 use the H100 curves with their
own datasheet rates; any other ``Hardware`` (tests) gets ideal curves: the plain roofline.

Phase times (``phase_ms``): the sums of the kernels, or where the profile has host costs one launch queue
through the step (``graph_phase_ms``); ``log_node_ms`` gives per-node log
milliseconds in the form the GNN's per-kernel head has, for ``predict``'s analytic mode and the
all-reduce overlap model.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from functools import lru_cache, partial
from pathlib import Path

import numpy as np
import torch

from gnn_ptp import ops
from gnn_ptp.hardware import HARDWARE, Hardware
from gnn_ptp.profiles import PHASES

CALIBRATION_FILE = Path(__file__).with_name("prior_calibration.json")
TC_COLUMN = 13  # graph.py node features: tensor-core flag
GEMM_CATEGORIES = tuple(ops.CATEGORIES.index(c) for c in ops.TENSOR_CORE_CATEGORIES)
BACKWARD_PHASE = PHASES.index("backward")
"""``x_cat[:, 3]`` of a backward kernel."""
OPTIMIZER_PHASE = PHASES.index("optimizer")
"""``x_cat[:, 3]`` of a kernel of the optimizer step."""
OPTIMIZER_MEMORY = "@optimizer"
"""The ``memory_fraction`` / ``memory_half_size`` key of the optimizer phase's non-GEMM kernels, where a
fit gave them a bandwidth curve of their own (``Profile.memory_curve``)."""
BACKWARD_CURVES = ("conv", "attention")
"""GEMM-like categories whose backward is one fused node (``convolution_backward``, an attention's
backward) running other kernels than the forward: where a calibration has a "<category>_backward:<dtype>"
curve (``prior_fit.fit_device(backward_curves=True)``), their backward nodes use it."""
BACKWARD_SUFFIX = "_backward"
GROUPED_CONV = "conv_grouped"
"""The curve name of a grouped convolution (``grouped_conv``: every depthwise one, RegNet's wide groups),
where a calibration has "conv_grouped:<dtype>" (and "conv_grouped_backward:<dtype>") curves
(``prior_fit.fit_device(grouped_conv=True)``): such a convolution reduces over a few channels only, so it is
a GEMM in name alone, and on a CPU oneDNN runs it, its backward above all, at rates no dense convolution
shows. Without such curves it uses the convolution's (``Profile.gemm_curve``)."""
CONV_CATEGORY = ops.CATEGORIES.index("conv")
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
    intensity_half: float = 0.0
    """Arithmetic intensity (FLOPs per byte moved) at which a kernel reaches half the fraction its size
    gives (0: no intensity ramp). A GEMM with a thin side (few channels, a small head) or a depthwise
    convolution runs its tiles half empty long before it is memory-bound."""
    intensity_slope: float = 1.0
    size_max: float = 0.0
    """The largest size the curve was fitted on, beyond which it holds the fraction it reaches there (0: the
    ramp extrapolates; ``prior_fit.fit_device(bounded_layout_curves=True)`` sets it on per-layout curves)."""
    fraction_max: float = 0.0
    """The largest fraction the curve gives (0: none): the fastest fraction of its ceiling it reached on the
    kernels it was fitted to (``prior_fit.fit_device(matmul_cap=True)`` sets it on a CPU's matmul curves), so
    that its size and intensity ramps, whose peak fraction a fit may put far above anything it saw, never price
    a larger kernel faster than that."""

    def __call__(self, size: torch.Tensor, intensity: torch.Tensor | None = None) -> torch.Tensor:
        size = size.clamp_min(1.0)
        if self.size_max > 0:
            size = size.clamp_max(self.size_max)
        if self.half_size <= 0:
            out = torch.full_like(size, self.peak_fraction)
        else:
            out = self.peak_fraction / (1.0 + (self.half_size / size) ** self.slope)
        if self.intensity_half > 0 and intensity is not None:
            out = out / (1.0 + (self.intensity_half / intensity.clamp_min(1e-3)) ** self.intensity_slope)
        if self.fraction_max > 0:
            out = out.clamp_max(self.fraction_max)
        return out

    @classmethod
    def from_dict(cls, d: dict) -> "Curve":
        return cls(float(d["peak_fraction"]), float(d.get("half_size", 0.0)), float(d.get("slope", 1.0)),
                   float(d.get("intensity_half", 0.0)), float(d.get("intensity_slope", 1.0)),
                   float(d.get("size_max", 0.0)), float(d.get("fraction_max", 0.0)))


@dataclass(frozen=True)
class Profile:
    """A hardware's peak rates and how far below them its kernels run."""

    hardware: Hardware
    gemm: dict[str, Curve] = field(default_factory=dict)
    """GEMM-like kernels (matmul, conv, attention) per compute dtype ("bf16"), or per category and dtype
    ("conv:bf16") where fitted so; "default" for the others (lookup order: ``gemm_curve``)."""
    vector: Curve = Curve()
    """Compute-bound non-GEMM kernels (FLOPs)."""
    memory: Curve = Curve()
    """Memory traffic (bytes read + written)."""
    launch_floor_s: float = 0.0
    """Least time one kernel costs an eager step (with ``host_issue_s``: the shortest device time)."""
    host_issue_s: tuple[float, ...] | None = None
    """Host time to issue one kernel, per phase (forward, backward, optimizer): where set (a GPU fitted to
    its own measured steps, ``gnn_ptp/prior_fit.py``), a phase is a launch queue (``queue_ms``) rather than
    a sum of kernel times."""
    host_fixed_s: tuple[float, ...] | None = None
    """Host time of a phase beyond its kernels (per phase; with ``host_issue_s``)."""
    source: str = "ideal curves: the plain roofline"
    expected_error: dict = field(default_factory=dict)
    """How far off a step prediction from this profile is expected to be, and how that was derived."""
    fitted_on: str = ""
    """The hardware whose measured kernels and steps the curves were fitted to ("" where not so fitted)."""
    vector_fraction: dict[str, float] = field(default_factory=dict)
    """Per non-GEMM category ("optimizer", "norm", ...), its own peak fraction of ``vector`` where fitted so
    (the size and intensity ramps are shared): AdamW's foreach kernels stream memory, a norm's backward
    reduces. A category without one uses ``vector``'s."""
    memory_fraction: dict[str, float] = field(default_factory=dict)
    """Per non-GEMM "category:dtype" ("elementwise:bf16", "optimizer:fp32"), its own peak fraction of the
    bandwidth where fitted so (the ramp's slope is shared): on the H200 fit a large fp32 element-wise kernel
    streams at ~80 % of the bandwidth, AdamW's foreach kernels on bf16 states at ~66 %, a norm's backward at
    10-30 %. Any other kernel uses ``memory``'s."""
    memory_half_size: dict[str, float] = field(default_factory=dict)
    """Per non-GEMM "category:dtype", its own ``half_size`` of the memory curve where fitted so: AdamW's
    foreach kernels reach half their bandwidth only at ~40 MB (one launch per chunk of tensors), an
    element-wise kernel at ~5 MB. Both tables may also hold a category alone ("norm": its own curve over
    every dtype) and ``OPTIMIZER_MEMORY`` ("@optimizer": every non-GEMM kernel of the optimizer phase, a
    CPU's in-place per-parameter updates, which re-touch the same few tensors while they are in cache; or
    per pair, "@optimizer:elementwise:fp32", in a fit that gives every pair its own curve)."""
    streaming: tuple[str, ...] = ()
    """Non-GEMM categories priced by their bytes alone (no compute term), where fitted so: on a GPU AdamW's
    foreach kernels do well under one FLOP per byte moved, far below any compute ridge, and a compute curve
    fitted to them prices large ones by FLOPs that never bind."""
    fresh_threshold_bytes: float | None = None
    """A CPU's allocator maps every allocation above this many bytes fresh from the operating system
    (glibc: its mmap threshold, 32 MiB at most) and unmaps it on free; None where there is no such cost
    (a GPU's caching allocator) or it was not measured."""
    fresh_s_per_byte: float = 0.0
    """Seconds each byte of such an allocation adds to the kernel that first writes it (page faults and
    zeroing; the unmapping on free), measured per CPU kind (``descriptor.measure_fresh_alloc``): about
    0.23 ms per MiB on this project's Intel kind, where a large out-of-place add runs at 7 GB/s against
    24-41 GB/s in place."""

    depthwise: dict[str, tuple[float, ...]] = field(default_factory=dict)
    """Where fitted so (``prior_fit.fit_device(depthwise=True)``), per "forward:<dtype>" and
    "backward:<dtype>", a depthwise-like convolution's time (``depthwise_shapes``) as a power law in its
    shape rather than its FLOPs: ``exp(c0) * batch^a * channels^b * (height x width)^c * taps^d`` seconds,
    the coefficients (c0, a, b, c, d) (``depthwise_law_seconds``); fitted with the stride too
    (``prior_fit.fit_depthwise(stride=True)``), ``* stride^e`` besides, (c0, a, b, c, d, e): on the first
    CPU kind a bf16 depthwise backward of stride 2 runs ~5x the time of one of stride 1 of its shape
    (README *Protocol*, "The depthwise stride"). On the CPU kinds here oneDNN's
    depthwise backward runs at no one rate per FLOP: at equal FLOPs ConvNeXt's 7x7 ones take 4-10x the
    random CNNs' 3x3 ones, and the time grows as batch^0.6-0.74 x channels^0.46-0.68 x space^0.12-0.38
    x taps^0.8-1.03 on all three kinds (README, *The CPU prior*). Other nodes, and a (direction, dtype)
    without a law, use the curves."""

    moved_from: "tuple[Profile, Hardware, Hardware, float] | None" = None
    """Where this profile is another CPU kind's prior moved here by splitting each kernel's time
    (``descriptor.transfer(..., mode="split")``): (the source kind's profile, the source's and this kind's
    measured ceilings, how much faster this kind runs the part of a kernel's time above its ceilings).
    ``node_seconds`` then prices each kernel on the source, moves its time at the source's ceilings to its
    time at this kind's and divides the rest by that ratio (``split_moved_seconds``). None: the curves
    apply to this profile's rates directly."""

    sized_from: "tuple[Profile, SizedMove] | None" = None
    """Where this profile is another CPU kind's prior moved here by kernel size (``descriptor.transfer(...,
    mode="sized")`` between two kinds that measured the same step probes): (the source kind's profile, the
    speed-ups by kernel size, ``SizedMove``). ``node_seconds`` then prices each kernel on the source and
    divides its time by the target's speed-up at that kernel's FLOPs or bytes. None: not so moved."""

    conv_intensity: str = "tensor"
    """The arithmetic intensity a dense convolution's GEMM curve ramps with: "tensor" (FLOPs over the bytes
    of its input, weight and output tensors, as for every other kernel) or "gemm" (``conv_gemm_intensity``:
    FLOPs over the bytes of the implicit GEMM cuDNN runs it as, its im2col operand counted in full), where
    fitted so. By tensor bytes a 3x3 convolution's intensity is nine times a 1x1's of the same channels,
    though both run as GEMMs of similar shape: on the H200's fit by tensor bytes, 1x1 convolutions priced
    3.6x their measured time and 7x7 ones 0.5x; fitted so, left out family by family, it scored worse
    (README, *Analytic H100 mode*)."""

    gemm_layouts: bool = False
    """Where fitted so (``prior_fit.fit_device(gemm_layouts=True)``), a two-operand GEMM (``ops.GEMM_LAYOUTS``)
    runs at its operand layout's measured ceiling, ``Hardware.flops_rate`` times ``Hardware.layout_ratio``
    (a CPU descriptor's ``gemm_layout_flops_per_s``; 1 for a layout or hardware without one), and its curve
    is a fraction of that. On a CPU without a fast bf16 path torch runs each layout through another kernel:
    the fourth kind here runs bf16 nt GEMMs (a linear layer's forward) 7x and tn ones (its weight gradient)
    18x faster than nn ones (its input gradient), where one curve per dtype has to average them."""

    channel_ramp: dict[str, tuple[float, float]] = field(default_factory=dict)
    """Where fitted so, per batch-norm op ("batch_norm", "batch_norm_backward"), (half_channels, slope): its
    kernel time is multiplied by ``1 + (half_channels / channels) ** slope``. A GPU's batch norm reduces
    each channel in one thread block (PyTorch's ``batch_norm_collect_statistics_kernel`` and its backward
    launch one block per channel), so with fewer channels than the GPU has multiprocessors part of it
    idles: on the H200, by bytes alone, 16-channel batch norms priced 0.16-0.41 of their measured time and
    256-1,024-channel ones 1.4-1.9 (README, *Analytic H100 mode*). Other nodes, and a profile without it,
    are unchanged (``batch_norm_channels``)."""

    slow_conv: dict[str, tuple[float, ...]] = field(default_factory=dict)
    """Where fitted so (``prior_fit.fit_device(slow_conv=("bf16",))``), per "forward:<dtype>" and
    "backward:<dtype>", a dense 2-d convolution's time as a sum of costs in its shape (``slow_conv_terms``,
    coefficients in seconds per unit, ``slow_conv_seconds``): per call, per multiply-add, per multiply-add
    times how far its per-sample im2col matrix spills past ``SLOW_CONV_CACHE_BYTES``, per weight-gradient
    element per sample, per im2col element and per input/output element. On a CPU without a fast path for
    the dtype torch runs such a convolution one sample at a time (``slow_conv2d``: im2col, then a plain
    loop GEMM): on the fourth CPU kind here its bf16 backward costs ~41 ns per weight element per sample
    (the weight gradient accumulated sample by sample) whatever its FLOPs, so a ResNet 3x3 convolution on a
    1x1 map runs at 0.08 GFLOP/s and a random CNN's 32x32 one at 9 (README, *A fourth CPU kind*). Fitted
    with ``conv_blocks`` (``prior_fit.fit_slow_conv``) a law also has a cost per weight element per call and
    one per multiply-add of a convolution whose channels are not in whole blocks (``CONV_CHANNEL_BLOCK``):
    eight coefficients, six otherwise (``SLOW_CONV_BASE_TERMS``). Other nodes, and a (direction, dtype)
    without a law, use the curves."""

    depthwise_probes: bool = False
    """Where fitted so (``prior_fit.fit_device(depthwise_probes=True)``), a depthwise-like convolution with a
    channels-last input (``ops.CHANNELS_LAST``) is priced from its hardware's depthwise probes
    (``Hardware.depthwise_probe_s``, ``depthwise_table``), not by the law or the curves: torch runs another
    kernel for it, whose weight gradient on the first CPU kind jumps 10-15x between 640 and 768 channels
    (7x7). Hardware without probes, and every other node, are priced as without it."""

    depthwise_floor: dict[str, float] = field(default_factory=dict)
    """Where fitted so (``prior_fit.fit_depthwise_floor``), per key of ``depthwise``, the seconds per unit of
    work (``depthwise_work``) of the fastest kernel the law was fitted to: the law never prices a kernel
    faster than that. A power law fitted to small depthwise convolutions extrapolates to rates none of them
    reached: on the first CPU kind the size fold's law priced 1e7-FLOP ones at 0.25-0.5x their time (README
    *Protocol*, "Where the fresh steps' error comes from"). Empty: the law alone."""

    attention: dict[str, tuple[float, ...]] = field(default_factory=dict)
    """Where fitted so (``prior_fit.fit_device(attention_law=True)``), per "forward:<dtype>" and
    "backward:<dtype>", a fused attention kernel's time as a sum of the costs of the loops of aten's CPU flash
    attention (``attention_terms``, coefficients in seconds per unit, ``slow_conv_seconds``' sum): per call,
    per (query block, key block) pair it runs its small GEMMs on (its block sizes as aten picks them from the
    query length, ``ATTENTION_Q_SPLITS``), per query row, per score, per multiply-add and per byte of its
    tensors. A FLOPs curve cannot follow it: on the first CPU kind a bf16 backward costs ~75 us per 32-row
    query block at 32-128 tokens whatever the block's FLOPs, so it runs at 4 GFLOP/s at 32 tokens and 45-55
    at 256, where aten doubles the block; the size fold's curves, fitted to at most 128 tokens, priced
    256-token attention at 2.5-3.0x its time (README *Protocol*, "Where the held-back steps' error comes
    from"). Other nodes, and a (direction, dtype) without a law, use the curves."""

    depthwise_paths: dict[str, tuple[float, ...]] = field(default_factory=dict)
    """Where fitted so (``prior_fit.fit_device(depthwise_paths=True)``), per "forward:<dtype>" and
    "backward:<dtype>", a depthwise-like convolution's time as a sum of costs per kernel path in place of the
    power law (``depthwise_path_terms``, coefficients in seconds per unit, ``slow_conv_seconds``' sum): per
    call, per plane (batch x channels), and per path (stride 1 or 2, 3x3, 5x5 or 7x7 taps) per multiply-add
    and per plane. On the first CPU kind a large depthwise backward runs at a cost per multiply-add its path
    fixes (bf16 stride 1 3x3 ~0.24 ns, 5x5 ~0.9, stride 2 4-6 ns), where the power law's space exponent
    (0.12-0.38) priced 1e7-size kernels at 0.25-0.5x their time (README *Protocol*, "Depthwise convolutions by
    their kernel's path"). Other nodes, and a (direction, dtype) without a law, are priced as without it. A
    path no fitted kernel of its (direction, dtype) ran has no costs (None in the section, NaN here: a fit with
    ``prior_fit.fit_depthwise_paths`` since the forty-seventh session): a node on it is priced as without the
    law (``slow_conv_seconds``), not by the call and plane costs alone."""

    @property
    def serial(self) -> bool:
        """A CPU: the thread that issues a kernel runs it, so a phase with host costs is their plain sum,
        ``fixed + issues * host + sum t`` (``graph_phase_ms``), not a launch queue."""
        return self.hardware.kind == "cpu"

    def vector_curve(self, category: str) -> Curve:
        """The compute curve of a non-GEMM kernel of ``category``: ``vector``, at the category's own peak
        fraction where it has one."""
        fraction = self.vector_fraction.get(category)
        return self.vector if fraction is None else replace(self.vector, peak_fraction=fraction)

    @property
    def optimizer_memory(self) -> bool:
        """Whether the optimizer phase's non-GEMM kernels have bandwidth curves of their own
        (``OPTIMIZER_MEMORY``, alone or per "category:dtype")."""
        return any(k.startswith(OPTIMIZER_MEMORY) for k in self.memory_fraction)

    def memory_curve(self, category: str, dtype: str, optimizer: bool = False) -> Curve:
        """The bandwidth curve of a kernel of ``category`` in ``dtype``: ``memory``, at its own peak
        fraction and half size where it has them: the optimizer phase's (``optimizer``: a non-GEMM kernel
        of that phase; per pair, else pooled), else the pair's, else its category's."""
        fraction = half = None
        pair = f"{category}:{dtype}"
        for key in ((f"{OPTIMIZER_MEMORY}:{pair}", OPTIMIZER_MEMORY) if optimizer else ()) + (pair, category):
            fraction, half = self.memory_fraction.get(key), self.memory_half_size.get(key)
            if fraction is not None or half is not None:
                break
        if fraction is None and half is None:
            return self.memory
        return replace(self.memory, peak_fraction=self.memory.peak_fraction if fraction is None else fraction,
                       half_size=self.memory.half_size if half is None else half)

    @property
    def layout_curves(self) -> bool:
        """Whether some two-operand GEMMs have a curve of their own per operand layout
        (``LAYOUT_MARK``: "matmul@tn:bf16", ``prior_fit.fit_device(layout_curves=True)``)."""
        return any(LAYOUT_MARK in key for key in self.gemm)

    def gemm_curve(self, dtype: str, category: str = "matmul", backward: bool = False, layout: str = "") -> Curve:
        """The curve of a GEMM-like kernel, the first of ``gemm_keys`` the profile has, else the plain
        roofline."""
        for key in gemm_keys(dtype, category, backward, layout):
            if key in self.gemm:
                return self.gemm[key]
        return Curve()


LAYOUT_MARK = "@"
"""Separates a matmul's operand layout in a curve name: "matmul@tn:bf16" (``gemm_keys``)."""


def gemm_keys(dtype: str, category: str = "matmul", backward: bool = False, layout: str = "") -> tuple[str, ...]:
    """Where a GEMM-like kernel's curve is looked up, in order: a grouped convolution's own curves
    (``GROUPED_CONV``: its backward one for a backward node, then its forward one), then for a fused
    backward kernel (``BACKWARD_CURVES``) its category's backward curve, for a two-operand matmul of a known
    ``layout`` its layout's ("matmul@tn:bf16", ``LAYOUT_MARK``), then its category's in its dtype, the
    dtype's, the matmul's in that dtype and "default". A fit that pools a group with too few kernels into
    another (``prior_fit._fallback``) follows the same order."""
    keys: tuple[str, ...] = ()
    if layout and category == "matmul":
        keys += (f"matmul{LAYOUT_MARK}{layout}:{dtype}",)
    if category == GROUPED_CONV:
        keys = ((f"{GROUPED_CONV}{BACKWARD_SUFFIX}:{dtype}",) if backward else ()) + (f"{GROUPED_CONV}:{dtype}",)
        category = "conv"
    if backward and category in BACKWARD_CURVES:
        keys += (f"{category}{BACKWARD_SUFFIX}:{dtype}",)
    return keys + (f"{category}:{dtype}", dtype, f"matmul:{dtype}", "default")


def _dims(logged: torch.Tensor) -> torch.Tensor:
    """graph.py's ``log_shape`` columns back to dimensions ([N, 4]; 0 where padded)."""
    return torch.round(_unlog(logged))


def _channels(dims: torch.Tensor) -> torch.Tensor:
    """Dim 1 of each right-aligned shape of 2-4 dims (``_dims`` rows): a tensor's channels."""
    ndim = (dims > 0).sum(1).clamp(2, 4)
    return dims.gather(1, (4 - ndim + 1).unsqueeze(1)).squeeze(1)


def grouped_conv(x: torch.Tensor, x_cat: torch.Tensor) -> torch.Tensor:
    """Per node (bool [N]), whether it is a grouped convolution (``GROUPED_CONV``), from its features alone:
    its reduction depth (input channels per group x kernel area) is below its input channels. A forward
    node's depth is its FLOPs over twice its output's elements; a fused backward node's, its FLOPs over four
    times its incoming gradient's elements (two gradients, each a forward's cost). The input channels are
    dim 1 of the forward's input, of the backward's first output (the input's gradient). Every depthwise
    convolution qualifies (depth k*k against tens of channels), a dense one never does (depth = channels
    x k*k); a group convolution does once it has more groups than kernel taps (RegNet's 3x3 ones with
    more than 9 groups). Two corner cases read wrong: a backward node that computes no input gradient (a
    network's first convolution, its 1x1 ones only) and a 3-d convolution (its batch dim is not among the
    four dims a node keeps)."""
    conv = x_cat[:, 1] == CONV_CATEGORY
    out = torch.zeros(x.shape[0], dtype=torch.bool)
    if not bool(conv.any()):
        return out
    xs, backward = x[conv], x_cat[conv, 3] == BACKWARD_PHASE
    flops = _unlog(xs[:, 0])
    out_dims, in_dims = _dims(xs[:, 4:8]), _dims(xs[:, 8:12])
    forward_depth = flops / (2.0 * out_dims.clamp_min(1).prod(1))
    backward_depth = flops / (4.0 * in_dims.clamp_min(1).prod(1))
    depth = torch.where(backward, backward_depth, forward_depth)
    in_channels = torch.where(backward, _channels(out_dims), _channels(in_dims))
    out[conv] = depth < in_channels - 0.5
    return out


DEPTHWISE_MAX_DEPTH = 49
"""A grouped convolution reducing over at most this many products per output (one channel of a 7x7
kernel, four of a 3x3) is depthwise-like (``depthwise_shapes``); RegNet's group convolutions (16 channels
per group, depth 144) are not."""


DEPTHWISE_SHAPE = ("batch", "channels", "pixels", "taps", "stride")
"""The columns of ``depthwise_shapes``: a law of ``len(c) - 1`` exponents reads the first that many."""


def depthwise_shapes(x: torch.Tensor, x_cat: torch.Tensor) -> torch.Tensor:
    """Per node (float64 [N, 5], ``DEPTHWISE_SHAPE``) the shape a depthwise-like convolution's time follows
    (``Profile.depthwise``): batch, channels, spatial size (height x width) of its input, its reduction depth
    (kernel taps per output: 9 for a 3x3 depthwise one) and its stride (the input's height over the
    output's, rounded: 1 or 2 in the models here); NaN for every other node (not a grouped convolution of
    depth at most ``DEPTHWISE_MAX_DEPTH``, or not a 2-d one). The input is the forward node's input, the
    fused backward node's first output (the input's gradient), the output the forward's output, the
    backward's incoming gradient; the depth as ``grouped_conv`` reads it."""
    out = torch.full((x.shape[0], len(DEPTHWISE_SHAPE)), float("nan"), dtype=torch.float64)
    grouped = grouped_conv(x, x_cat)
    if not bool(grouped.any()):
        return out
    xs, backward = x[grouped], x_cat[grouped, 3] == BACKWARD_PHASE
    flops = _unlog(xs[:, 0])
    out_dims, in_dims = _dims(xs[:, 4:8]), _dims(xs[:, 8:12])
    depth = torch.round(torch.where(backward, flops / (4.0 * in_dims.clamp_min(1).prod(1)),
                                    flops / (2.0 * out_dims.clamp_min(1).prod(1))))  # an integer: taps
    shape = torch.where(backward.unsqueeze(1), out_dims, in_dims)
    result = torch.where(backward.unsqueeze(1), in_dims, out_dims)  # the output (its gradient, backward)
    stride = torch.round(shape[:, 2] / result[:, 2].clamp_min(1)).clamp_min(1)
    keep = (shape > 0).all(1) & (depth <= DEPTHWISE_MAX_DEPTH) & (depth >= 1)
    feats = torch.stack([shape[:, 0], shape[:, 1], shape[:, 2] * shape[:, 3], depth, stride], 1)
    feats[~keep] = float("nan")
    out[grouped] = feats
    return out


BATCH_NORM_OPS = ("batch_norm", "batch_norm_backward")


def batch_norm_channels(x: torch.Tensor, x_cat: torch.Tensor) -> torch.Tensor:
    """Per node (float64 [N]) a batch norm's channels (dim 1 of its first input, right-aligned in 2-4 dims:
    the forward's input, the backward's incoming gradient), NaN for every other node."""
    out = torch.full((x.shape[0],), float("nan"), dtype=torch.float64)
    bn = torch.zeros(x.shape[0], dtype=torch.bool)
    for name in BATCH_NORM_OPS:
        bn |= x_cat[:, 0] == ops.OP_ID[name]
    if not bool(bn.any()):
        return out
    dims = _dims(x[bn][:, 8:12])
    ndim = (dims > 0).sum(1)
    channels = _channels(dims)
    out[bn] = torch.where((ndim >= 2) & (channels > 0), channels, torch.full_like(channels, float("nan")))
    return out


def optimizer_memory_rows(optimizer_phase: torch.Tensor, gemm: torch.Tensor, profile: "Profile") -> torch.Tensor:
    """Per node (bool [N]), whether it is priced by the optimizer phase's own bandwidth curve
    (``Profile.memory_curve(..., optimizer=True)``): a non-GEMM kernel of that phase, where the profile has
    such a curve; all False otherwise. ``_kernel_seconds`` and ``prior_fit``'s pricing both ask here."""
    if not profile.optimizer_memory:
        return torch.zeros_like(gemm, dtype=torch.bool)
    return optimizer_phase & ~gemm


def channel_ramp_factor(channels: torch.Tensor, backward: torch.Tensor,
                        ramp: dict[str, tuple[float, float]]) -> torch.Tensor:
    """Per node the factor ``Profile.channel_ramp`` multiplies a batch norm's time by, ``1 + (half /
    channels) ** slope`` (its forward op's or backward op's ramp by ``backward``); 1 where ``channels`` is NaN
    or the op has no ramp."""
    out = torch.ones_like(channels, dtype=torch.float64)
    for name, is_backward in zip(BATCH_NORM_OPS, (False, True)):
        if name not in ramp:
            continue
        half, slope = ramp[name]
        m = ~torch.isnan(channels) & (backward == is_backward)
        out[m] = 1.0 + (half / channels[m].clamp_min(1.0)) ** slope
    return out


_ELEMENT_BYTES = {"fp32": 4.0, "tf32": 4.0, "fp16": 2.0, "bf16": 2.0, "fp64": 8.0, "fp8": 1.0}


def conv_gemm_intensity(x: torch.Tensor, x_cat: torch.Tensor) -> torch.Tensor:
    """Per node (float64 [N]) a dense convolution's arithmetic intensity as the implicit GEMM it runs as,
    ``2 M K C / (bytes per element x (M K + K C + M C))`` with M its output positions (batch x height x
    width), C its output channels and K its reduction depth (input channels x kernel taps, ``grouped_conv``'s
    depth); NaN for every other node (not a convolution, a grouped one, or one whose shape does not say).
    A forward node's C and M come from its output, a fused backward node's from its incoming gradient (the
    first input; its FLOPs are twice a forward's: input and weight gradients, GEMMs of the same three
    sides)."""
    out = torch.full((x.shape[0],), float("nan"), dtype=torch.float64)
    conv = (x_cat[:, 1] == CONV_CATEGORY) & ~grouped_conv(x, x_cat)
    if not bool(conv.any()):
        return out
    xs, backward = x[conv], x_cat[conv, 3] == BACKWARD_PHASE
    flops = _unlog(xs[:, 0])
    dims = torch.where(backward.unsqueeze(1), _dims(xs[:, 8:12]), _dims(xs[:, 4:8]))
    ndim = (dims > 0).sum(1)
    channels = _channels(dims)
    elements = dims.clamp_min(1).prod(1)
    positions = elements / channels.clamp_min(1)
    depth = flops / (torch.where(backward, 4.0, 2.0) * elements)
    element = torch.tensor([_ELEMENT_BYTES.get(ops.DTYPES[d], 4.0) for d in x_cat[conv, 2].tolist()],
                           dtype=torch.float64)
    gemm = 2.0 * positions * depth * channels / (element * (positions * depth + depth * channels
                                                            + positions * channels))
    ok = (ndim >= 3) & (channels > 0) & (depth >= 1)
    out[conv] = torch.where(ok, gemm, torch.full_like(gemm, float("nan")))
    return out


def kernel_intensity(x: torch.Tensor, x_cat: torch.Tensor, flops: torch.Tensor, moved: torch.Tensor,
                     profile: "Profile") -> torch.Tensor:
    """Per node the arithmetic intensity its curve ramps with: FLOPs per byte moved, or for a dense
    convolution on a profile fitted so (``Profile.conv_intensity == "gemm"``) its implicit GEMM's
    (``conv_gemm_intensity``)."""
    intensity = flops / (moved + 1.0)
    if profile.conv_intensity == "gemm":
        gemm = conv_gemm_intensity(x, x_cat)
        intensity = torch.where(torch.isnan(gemm), intensity, gemm)
    return intensity


@lru_cache(maxsize=1)
def calibration() -> dict:
    """The fitted curves per hardware (``prior_calibration.json``); {} where the file is absent."""
    if not CALIBRATION_FILE.is_file():
        return {}
    return json.loads(CALIBRATION_FILE.read_text())


PREDICTIVE_KEYS = ("gemm", "vector", "memory", "launch_floor_s", "host_issue_s", "host_fixed_s")
OPTIONAL_PREDICTIVE_KEYS = ("vector_fraction", "memory_fraction", "memory_half_size", "streaming",
                            "fresh_threshold_bytes", "fresh_s_per_byte", "depthwise", "conv_intensity",
                            "channel_ramp", "gemm_layouts", "slow_conv", "depthwise_probes", "depthwise_floor",
                            "attention", "depthwise_paths")
"""Predictive keys a section may lack; the digest covers them only where present, so that a section
written before they existed keeps its digest (and the checkpoints trained over it stay valid)."""


def calibration_digest(section: str) -> str:
    """A short hash of what a calibration section predicts with (its curves and host costs, not its
    provenance or error figures): a checkpoint trained over the prior stores it, so that a later re-fit of
    the curves under it is noticed (``checkpoint.load``)."""
    import hashlib

    d = calibration().get(section, {})
    keys = (*PREDICTIVE_KEYS, *(k for k in OPTIONAL_PREDICTIVE_KEYS if k in d))
    text = json.dumps({k: d.get(k) for k in keys}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _labelled_error(d: dict) -> dict:
    """A section's expected error, its summary saying what the steps were labelled by where a section
    says (``calibrate_prior.py --labels fastest``): a prediction from it is of the uncontended step."""
    from gnn_ptp.dataset import label_note

    err = dict(d.get("expected_error", {}))
    note = label_note(d.get("labels", "mean"))
    if note and err.get("summary"):
        err["summary"] += f", {note}"
    return err


def profile_from_dict(hw: Hardware, d: dict) -> Profile:
    """``hw``'s profile from a calibration section. A section fitted on another GPU (the H100 borrows the
    H200's: ``CURVES_OF``) gives its curves as they are, fractions of ``hw``'s own peaks; its depthwise law,
    in seconds, is moved by the two GPUs' memory bandwidth (``borrowed_depthwise``). A GPU section fitted
    with depthwise probes reads them from the GPU's probe file (``with_gpu_probes``). An attention law
    (``Profile.attention``) prices aten's CPU kernel and a depthwise law per path (``Profile.depthwise_paths``)
    oneDNN's CPU kernels: only a CPU takes them."""
    if d.get("depthwise_probes") and hw.kind != "cpu" and not hw.depthwise_probe_s:
        hw = with_gpu_probes(hw, d.get("fitted_on") or "")
    return Profile(hw, {k: Curve.from_dict(v) for k, v in d.get("gemm", {}).items()},
                   Curve.from_dict(d["vector"]) if "vector" in d else Curve(),
                   Curve.from_dict(d["memory"]) if "memory" in d else Curve(),
                   float(d.get("launch_floor_s", 0.0)),
                   tuple(float(v) for v in d["host_issue_s"]) if d.get("host_issue_s") else None,
                   tuple(float(v) for v in d["host_fixed_s"]) if d.get("host_fixed_s") else None,
                   d.get("source", ""), _labelled_error(d), d.get("fitted_on", ""),
                   {k: float(v) for k, v in d.get("vector_fraction", {}).items()},
                   {k: float(v) for k, v in d.get("memory_fraction", {}).items()},
                   {k: float(v) for k, v in d.get("memory_half_size", {}).items()},
                   tuple(d.get("streaming", ())),
                   float(d["fresh_threshold_bytes"]) if d.get("fresh_threshold_bytes") is not None else None,
                   float(d.get("fresh_s_per_byte", 0.0)),
                   borrowed_depthwise(hw, d), conv_intensity=d.get("conv_intensity", "tensor"),
                   channel_ramp={k: (float(v[0]), float(v[1])) for k, v in d.get("channel_ramp", {}).items()},
                   gemm_layouts=bool(d.get("gemm_layouts", False)),
                   slow_conv={k: tuple(float(v) for v in c) for k, c in d.get("slow_conv", {}).items()},
                   depthwise_probes=bool(d.get("depthwise_probes", False)),
                   depthwise_floor=borrowed_depthwise_floor(hw, d),
                   attention=({k: tuple(float(v) for v in c) for k, c in d.get("attention", {}).items()}
                              if hw.kind == "cpu" else {}),
                   depthwise_paths=({k: law_coefficients(c) for k, c in d.get("depthwise_paths", {}).items()}
                                    if hw.kind == "cpu" else {}))


def law_coefficients(c) -> tuple[float, ...]:
    """An additive law's coefficients from a section: None (a cost no fitted kernel had) as NaN."""
    return tuple(float("nan") if v is None else float(v) for v in c)


def with_gpu_probes(hw: Hardware, fitted_on: str) -> Hardware:
    """``hw`` carrying the depthwise probes measured on it (``depthwise_table.gpu_probe_rows``), else those
    of the GPU its section was fitted on, as measured: a channels-last depthwise convolution's slow kernels
    on a Hopper GPU run far below its memory bandwidth (ConvNeXt's fp32 weight gradients at ~40 G
    multiply-adds a second on the H200), so no bandwidth ratio moves them; ``hw`` unchanged where neither
    has probes."""
    from gnn_ptp import depthwise_table

    rows = depthwise_table.gpu_probe_rows(hw.name) or depthwise_table.gpu_probe_rows(fitted_on)
    return replace(hw, depthwise_probe_s=rows) if rows else hw


def borrowed_depthwise(hw: Hardware, d: dict) -> dict[str, tuple[float, ...]]:
    """A section's depthwise law for ``hw``: as fitted on a CPU (a CPU kind moves it by its descriptor,
    ``descriptor.transfer``) or on ``hw`` itself; fitted on another GPU, scaled by that GPU's memory
    bandwidth over ``hw``'s (a depthwise convolution reduces over a few taps only: on a GPU it streams its
    input and output, memory-bound)."""
    law = {k: tuple(float(v) for v in c) for k, c in d.get("depthwise", {}).items()}
    factor = _borrowed_factor(hw, d)
    return law if factor is None else scaled_depthwise(law, factor)


def borrowed_depthwise_floor(hw: Hardware, d: dict) -> dict[str, float]:
    """A section's depthwise floor (``Profile.depthwise_floor``) for ``hw``, moved as its law is
    (``borrowed_depthwise``)."""
    floor = {k: float(v) for k, v in d.get("depthwise_floor", {}).items()}
    factor = _borrowed_factor(hw, d)
    return floor if factor is None else scaled_depthwise_floor(floor, factor)


def _borrowed_factor(hw: Hardware, d: dict) -> float | None:
    """How much longer a section's depthwise times (law and floor) run on ``hw`` when the section was fitted
    on another GPU (its memory bandwidth over ``hw``'s); None when they apply as fitted."""
    source = HARDWARE.get(d.get("fitted_on") or "")
    if source is None or source.kind == "cpu" or hw.kind == "cpu" or source.name == hw.name:
        return None
    return source.memory_bandwidth_Bps / hw.memory_bandwidth_Bps


def get_profile(hw: Hardware | str) -> Profile:
    """The calibrated profile of a hardware (by name or ``Hardware``); ideal curves if it has none."""
    if isinstance(hw, str):
        hw = HARDWARE[hw]
    table = calibration()
    name = section_for(hw.name, table)
    if name not in table or HARDWARE.get(hw.name) != hw:  # a made-up Hardware: plain roofline
        return Profile(hw)
    return profile_from_dict(hw, table[name])


def section_for(hardware: str, table: dict) -> str | None:
    """The calibration section of ``table`` a hardware's profile comes from: its own, else the one whose
    curves it borrows (``CURVES_OF``)."""
    return hardware if hardware in table else CURVES_OF.get(hardware)


def _unlog(v: torch.Tensor) -> torch.Tensor:
    return torch.exp2(v.double()) - 1.0  # graph.py's node-feature scale is log2(1 + x)


def fresh_seconds(fresh: torch.Tensor | None, threshold: float | None, s_per_byte: float) -> torch.Tensor | None:
    """Per node (float64 [N]) the page-fault cost of its fresh outputs above an mmap ``threshold`` at
    ``s_per_byte`` (a profile's ``fresh_threshold_bytes``, ``fresh_s_per_byte``; ``fresh``: graph.py's
    ``fresh_bytes`` [N, 2], all the bytes a kernel allocates and its largest allocation; the threshold
    applies per allocation, so the rest counts where it is itself above it, as for a convolution's
    backward with two large gradients); None where there is no such cost or the graph does not say what
    it allocates."""
    if fresh is None or threshold is None or s_per_byte <= 0:
        return None
    fresh = fresh.double().reshape(-1, 2)
    largest, rest = fresh[:, 1], fresh[:, 0] - fresh[:, 1]
    faulted = torch.where(largest > threshold, largest, 0.0) + torch.where(rest > threshold, rest, 0.0)
    return faulted * s_per_byte


def layout_factor(hw: Hardware, dtype: torch.Tensor, layout: torch.Tensor | None) -> torch.Tensor | None:
    """Per node (float64 [N]) ``hw``'s ceiling of its GEMM layout over its nn ceiling (``Hardware.layout_ratio``;
    1 for a node that is no two-operand GEMM); None where ``layout`` is unknown or ``hw`` has no such ratio."""
    if layout is None or not hw.gemm_layout_ratio:
        return None
    layout = layout.reshape(-1).long()
    out = torch.ones(layout.shape[0], dtype=torch.float64)
    has = (layout > 0) & (layout < len(ops.GEMM_LAYOUTS))  # a convolution's channels-last code is no GEMM's
    if not bool(has.any()):
        return out
    for d, code in set(zip(dtype[has].tolist(), layout[has].tolist())):
        out[has & (dtype == d) & (layout == code)] = hw.layout_ratio(ops.DTYPES[d], ops.GEMM_LAYOUTS[code])
    return out


def _kernel_seconds(x: torch.Tensor, x_cat: torch.Tensor, profile: Profile,
                    *ceilings: Hardware, layout: torch.Tensor | None = None) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Per node (float64 [N]): the time the profile's curves give it (compute or memory, the longer; no
    launch floor, no fresh allocations), and for each of ``ceilings`` its time at those peak rates with
    ideal curves, ``max(FLOPs / rate of its path, bytes / bandwidth)``, a ``streaming`` category by its
    bytes alone."""
    hw = profile.hardware
    flops = _unlog(x[:, 0])
    moved = _unlog(x[:, 1]) + _unlog(x[:, 2])
    intensity = kernel_intensity(x, x_cat, flops, moved, profile)
    category, dtype = x_cat[:, 1], x_cat[:, 2]
    gemm = torch.zeros_like(category, dtype=torch.bool)
    for c in GEMM_CATEGORIES:
        gemm |= category == c
    tc = x[:, TC_COLUMN] > 0.5
    backward = (x_cat[:, 3] == BACKWARD_PHASE) & gemm
    if not any(BACKWARD_SUFFIX in key for key in profile.gemm):  # no backward curve: one group each
        backward = torch.zeros_like(backward)
    grouped = (grouped_conv(x, x_cat) if any(key.startswith(GROUPED_CONV) for key in profile.gemm)
               else torch.zeros_like(backward))
    optimizer = optimizer_memory_rows(x_cat[:, 3] == OPTIMIZER_PHASE, gemm, profile)
    lay = (gemm_layouts_only(layout) if profile.layout_curves and layout is not None
           else torch.zeros_like(category))
    rate = torch.empty_like(flops)
    peaks = [torch.empty_like(flops) for _ in ceilings]
    efficiency = torch.empty_like(flops)
    bandwidth = torch.empty_like(flops)
    for (d, c, t, g, b, gr, o, la) in set(zip(dtype.tolist(), category.tolist(), tc.tolist(), gemm.tolist(),
                                              backward.tolist(), grouped.tolist(), optimizer.tolist(), lay.tolist())):
        rows = ((dtype == d) & (category == c) & (tc == t) & (gemm == g) & (backward == b) & (grouped == gr)
                & (optimizer == o) & (lay == la))
        name, cat = ops.DTYPES[d], ops.CATEGORIES[c]
        rate[rows] = hw.flops_rate(name, t, gemm=g)
        streaming = not g and cat in profile.streaming
        if streaming:
            efficiency[rows] = float("inf")  # priced by its bytes alone
        else:
            curve = (profile.gemm_curve(name, GROUPED_CONV if gr else cat, b, ops.GEMM_LAYOUTS[la]) if g
                     else profile.vector_curve(cat))
            efficiency[rows] = curve(flops[rows], intensity[rows])
        for peak, ceiling in zip(peaks, ceilings):
            peak[rows] = float("inf") if streaming else ceiling.flops_rate(name, t, gemm=g)
        bandwidth[rows] = profile.memory_curve(cat, name, o)(moved[rows])
    if profile.gemm_layouts:  # each GEMM at its operand layout's ceiling (Profile.gemm_layouts)
        factor = layout_factor(hw, dtype, layout)
        rate = rate if factor is None else rate * factor
        for i, ceiling in enumerate(ceilings):
            factor = layout_factor(ceiling, dtype, layout)
            peaks[i] = peaks[i] if factor is None else peaks[i] * factor
    compute_s = flops / (rate * efficiency)
    memory_s = moved / (hw.memory_bandwidth_Bps * bandwidth)
    ideal_s = [torch.maximum(flops / peak, moved / ceiling.memory_bandwidth_Bps)
               for peak, ceiling in zip(peaks, ceilings)]
    seconds = torch.maximum(compute_s, memory_s)
    if profile.channel_ramp:
        seconds = seconds * channel_ramp_factor(batch_norm_channels(x, x_cat), x_cat[:, 3] == BACKWARD_PHASE,
                                                profile.channel_ramp)
    shapes = depthwise_shapes(x, x_cat) if profile.depthwise or profile.depthwise_paths else None  # both laws read it
    for law, features, law_seconds in ((profile.depthwise, lambda: shapes,
                                        partial(depthwise_law_seconds, floor=profile.depthwise_floor)),
                                       (profile.slow_conv, lambda: slow_conv_terms(x, x_cat), slow_conv_seconds),
                                       (profile.attention, lambda: attention_terms(x, x_cat), slow_conv_seconds),
                                       (profile.depthwise_paths, lambda: depthwise_path_terms(shapes),
                                        slow_conv_seconds)):
        if not law:
            continue
        feats = features()
        has = ~torch.isnan(feats[:, 0])
        if bool(has.any()):  # the dtype names of those nodes only: this runs on every priced graph
            by_law = law_seconds(feats[has], x_cat[has, 3] == BACKWARD_PHASE,
                                 [ops.DTYPES[d] for d in dtype[has].tolist()], law)
            seconds[has] = torch.where(torch.isnan(by_law), seconds[has], by_law)
    return seconds, ideal_s


SLOW_CONV_CACHE_BYTES = 32 * 1024
"""The per-sample im2col matrix size above which a slow-path convolution's multiply-adds start to cost more
(``slow_conv_terms``' third term grows with the log of its size over this: 32 KiB, a core's L1 data
cache on the CPU kinds here; on the fourth kind a forward multiply-add costs ~0.9 ns with a matrix
under 46 KB, ~1.6 ns at 0.2-0.5 MB and ~3 ns above 2 MB)."""

SLOW_CONV_TERMS = ("call", "mac", "mac_spill", "weight_per_sample", "im2col", "io", "weight", "mac_unaligned")
"""The costs of a dense convolution by its shape (``slow_conv_terms``), in the order of a law's coefficients. A
law of ``SLOW_CONV_BASE_TERMS`` coefficients (every section fitted before the fiftieth session) reads the first
six; one fitted with ``conv_blocks`` (``prior_fit.fit_slow_conv``) all eight."""

SLOW_CONV_BASE_TERMS = 6
"""How many of ``SLOW_CONV_TERMS`` a law fitted without ``conv_blocks`` has."""

CONV_CHANNEL_BLOCK = 16
"""The channel block a CPU's fast convolution kernels run in: oneDNN's AVX-512 kernels lay activations and
weights out in blocks of 16 channels (nChw16c). A dense convolution whose input or output channels are not a
multiple of it is "unaligned" (``slow_conv_terms``' last cost): on the first CPU kind such bf16 convolutions
(the random CNNs' widths are multiples of 8) run at 0.66-0.70 of the time the size fold's law priced them at,
the aligned ones at 0.81-0.92 (README *Protocol*, "Where the size folds' prior errs, by kernel")."""


def slow_conv_terms(x: torch.Tensor, x_cat: torch.Tensor) -> torch.Tensor:
    """Per node (float64 [N, 8], ``SLOW_CONV_TERMS``) what a dense 2-d convolution run one sample at a time
    costs (``Profile.slow_conv``): 1 (the call), its multiply-adds (FLOPs / 2), those times
    ``max(0, ln(im2col bytes per sample / SLOW_CONV_CACHE_BYTES))``, batch x weight elements (backward
    only: the weight gradient is accumulated once per sample), batch x im2col elements (input channels x
    taps x output positions) and the elements of its input and output tensors; then (a law fitted with
    ``conv_blocks``) its weight elements once per call (a fast kernel reorders the weight into its blocked
    layout every call) and its multiply-adds again where its input or output channels are not a multiple of
    ``CONV_CHANNEL_BLOCK`` (0 where both are); NaN rows for every other node (not a convolution, a grouped
    one, or not 2-d). A forward node's input and output are its input
    and output; a fused backward node's, its first output (the input's gradient) and incoming gradient. A
    backward node that computes no input gradient (a network's first convolution) has the weight's
    gradient as its first output: its batch and output positions come from the incoming gradient."""
    out = torch.full((x.shape[0], len(SLOW_CONV_TERMS)), float("nan"), dtype=torch.float64)
    conv = (x_cat[:, 1] == CONV_CATEGORY) & ~grouped_conv(x, x_cat)
    if not bool(conv.any()):
        return out
    xs, backward = x[conv], x_cat[conv, 3] == BACKWARD_PHASE
    macs = _unlog(xs[:, 0]) / 2.0
    first, second = _dims(xs[:, 4:8]), _dims(xs[:, 8:12])  # forward: output, input; backward: grad_in, grad_out
    inp = torch.where(backward.unsqueeze(1), first, second)
    outp = torch.where(backward.unsqueeze(1), second, first)
    four_d = (inp > 0).all(1) & (outp > 0).all(1)
    weight_only = backward & (inp[:, 0] != outp[:, 0])  # first output is the weight's gradient
    batch, out_channels = outp[:, 0], outp[:, 1]
    positions = outp[:, 2] * outp[:, 3]
    gemms = torch.where(backward & ~weight_only, 2.0, 1.0)
    depth = macs / (gemms * batch * positions * out_channels).clamp_min(1.0)  # input channels x taps
    element = torch.tensor([_ELEMENT_BYTES.get(ops.DTYPES[d], 4.0) for d in x_cat[conv, 2].tolist()],
                           dtype=torch.float64)
    spill = torch.log(depth * positions * element / SLOW_CONV_CACHE_BYTES).clamp_min(0.0)
    io = batch * out_channels * positions + torch.where(weight_only, 0.0, inp.clamp_min(1).prod(1))
    unaligned = (torch.remainder(inp[:, 1], CONV_CHANNEL_BLOCK) != 0) | (torch.remainder(out_channels,
                                                                                       CONV_CHANNEL_BLOCK) != 0)
    terms = torch.stack([torch.ones_like(macs), macs, macs * spill,
                         torch.where(backward, batch * out_channels * depth, torch.zeros_like(macs)),
                         batch * depth * positions, io, out_channels * depth,
                         torch.where(unaligned, macs, torch.zeros_like(macs))], 1)
    terms[~(four_d & (depth >= 1))] = float("nan")
    out[conv] = terms
    return out


def slow_conv_seconds(terms: torch.Tensor, backward: torch.Tensor, dtypes: list[str],
                      law: dict[str, tuple[float, ...]]) -> torch.Tensor:
    """Per node (float64 [N]) its time by an additive law (``Profile.slow_conv``, ``Profile.attention``) from
    its costs (``slow_conv_terms``, ``attention_terms``), NaN where it has none or its (direction, dtype) no
    law. A NaN coefficient (a cost the law has no figure for: ``Profile.depthwise_paths``' unfitted paths) makes
    NaN only the nodes that incur that cost (a cost of 0 counts nothing, whatever its coefficient)."""
    out = torch.full((terms.shape[0],), float("nan"), dtype=torch.float64)
    for rows, c in _law_rows(law, ~torch.isnan(terms[:, 0]), backward, dtypes):
        t = terms[rows][:, :len(c)]  # a law of fewer costs reads the first (SLOW_CONV_BASE_TERMS)
        out[rows] = torch.where(t == 0, 0.0, t * torch.tensor(c, dtype=torch.float64)).sum(1)
    return out


DEPTHWISE_PATHS = ((1, 9), (1, 25), (1, 49), (2, 9), (2, 25), (2, 49))
"""(stride, taps) of the depthwise kernel paths a law per path prices (``depthwise_path_terms``): a stride above
1 counts as 2, other taps as the nearest of 9, 25 and 49 by their logarithm."""


def depthwise_path_terms(shapes: torch.Tensor) -> torch.Tensor:
    """Per node (float64 [N, 2 + 2 x len(DEPTHWISE_PATHS)]) what a depthwise-like convolution costs by its
    kernel's path (``Profile.depthwise_paths``) from its shape (``depthwise_shapes``): 1 (the call), its planes
    (batch x channels), then per path of ``DEPTHWISE_PATHS`` its multiply-adds (planes x output pixels x
    taps) where it runs that path, else 0, then per path its planes likewise; NaN rows where it has no shape."""
    n_paths = len(DEPTHWISE_PATHS)
    out = torch.full((shapes.shape[0], 2 + 2 * n_paths), float("nan"), dtype=torch.float64)
    has = ~torch.isnan(shapes[:, 0])
    if not bool(has.any()):
        return out
    s = shapes[has].clamp_min(1.0)
    planes = s[:, 0] * s[:, 1]
    stride = torch.where(s[:, 4] > 1, 2.0, 1.0) if s.shape[1] > 4 else torch.ones_like(planes)
    macs = planes * s[:, 2] / stride ** 2 * s[:, 3]
    taps = torch.tensor(sorted({t for _, t in DEPTHWISE_PATHS}), dtype=torch.float64)
    nearest = taps[(torch.log(s[:, 3]).unsqueeze(1) - torch.log(taps)).abs().argmin(1)]
    on = torch.stack([(stride == st) & (nearest == t) for st, t in DEPTHWISE_PATHS], 1).double()
    out[has] = torch.cat([torch.ones_like(planes).unsqueeze(1), planes.unsqueeze(1), on * macs.unsqueeze(1),
                          on * planes.unsqueeze(1)], 1)
    return out


ATTENTION_TERMS = ("call", "block", "row", "score", "mac", "byte")
"""The costs of a fused attention kernel (``attention_terms``), in the order of a law's coefficients."""

ATTENTION_Q_SPLITS = ops.CPU_FLASH_Q_SPLITS
"""(least query length, query block rows) as aten's CPU flash attention picks its query block
(``ops.CPU_FLASH_Q_SPLITS``), its key block being ``ATTENTION_KV_SPLIT``."""
ATTENTION_KV_SPLIT = ops.CPU_FLASH_KV_SPLIT
ATTENTION_CATEGORY = ops.CATEGORIES.index("attention")


def attention_q_split(q_len: torch.Tensor) -> torch.Tensor:
    """Per query length, the query block aten's CPU flash attention runs it in (``ATTENTION_Q_SPLITS``)."""
    out = torch.full_like(q_len, float(ATTENTION_Q_SPLITS[-1][1]))
    for least, rows in reversed(ATTENTION_Q_SPLITS[:-1]):
        out = torch.where(q_len >= least, torch.full_like(q_len, float(rows)), out)
    return out


def attention_terms(x: torch.Tensor, x_cat: torch.Tensor) -> torch.Tensor:
    """Per node (float64 [N, 6], ``ATTENTION_TERMS``) what a fused attention kernel costs
    (``Profile.attention``): 1 (the call), its (query block, key block) pairs over every batch and head
    (``attention_q_split``, ``ATTENTION_KV_SPLIT``), its query rows (batch x heads x query length), its
    scores (batch x heads x query x key length, as its FLOPs count them: where causal, the pairs of the key
    blocks the kernel visits, ``ops.cpu_flash_causal_fraction``; past 512 keys its key blocks are then read
    from their mean visited length, so a causal kernel's block count is rounded up), its
    multiply-adds (FLOPs / 2) and the bytes it reads and writes; NaN rows for every other node. Batch, heads,
    query length and head size come from its first input (the query, or the backward's incoming gradient:
    the same shape), the key length from its FLOPs (``ops._attention_flops``, a value head size equal to the
    query's)."""
    out = torch.full((x.shape[0], len(ATTENTION_TERMS)), float("nan"), dtype=torch.float64)
    att = x_cat[:, 1] == ATTENTION_CATEGORY
    if not bool(att.any()):
        return out
    xs, backward = x[att], x_cat[att, 3] == BACKWARD_PHASE
    dims = _dims(xs[:, 8:12])
    batch, heads, q_len, head = dims.unbind(1)
    flops = _unlog(xs[:, 0])
    scores = flops / (4.0 * head.clamp_min(1) * torch.where(backward, 2.5, 1.0))
    rows = batch * heads * q_len
    kv_len = scores / rows.clamp_min(1)
    blocks = (batch * heads * torch.ceil(q_len / attention_q_split(q_len))
              * torch.ceil(kv_len / ATTENTION_KV_SPLIT).clamp_min(1))
    moved = _unlog(xs[:, 1]) + _unlog(xs[:, 2])
    terms = torch.stack([torch.ones_like(flops), blocks, rows, scores, flops / 2.0, moved], 1)
    terms[~((dims > 0).all(1) & (flops > 0))] = float("nan")
    out[att] = terms
    return out


def _law_rows(law: dict[str, tuple[float, ...]], has: torch.Tensor, backward: torch.Tensor, dtypes: list[str]):
    """(rows, coefficients) per "direction:dtype" key of ``law`` (``depthwise_key``) with any node of ``has``
    in that direction and dtype."""
    names = np.array(dtypes)
    for key, c in law.items():
        direction, dtype = key.split(":")
        rows = has & (backward == (direction == "backward")) & torch.from_numpy(names == dtype)
        if bool(rows.any()):
            yield rows, c


def depthwise_key(backward: bool, dtype: str) -> str:
    return f"{'backward' if backward else 'forward'}:{dtype}"


def channels_last(layout: torch.Tensor) -> torch.Tensor:
    """Per node (bool [N]) whether ``gemm_layout`` marks a convolution with a channels-last input."""
    return layout.reshape(-1).long() == ops.CHANNELS_LAST


def gemm_layouts_only(layout: torch.Tensor) -> torch.Tensor:
    """``gemm_layout`` with every code that is no GEMM's (``ops.CHANNELS_LAST``) read as 0."""
    layout = layout.reshape(-1).long()
    return torch.where(layout < len(ops.GEMM_LAYOUTS), layout, torch.zeros_like(layout))


def depthwise_work(shapes: torch.Tensor) -> torch.Tensor:
    """Per node (float64 [N]) a depthwise-like convolution's work from its shape (``depthwise_shapes``):
    batch x channels x output pixels (input pixels / stride^2) x taps, its multiply-adds."""
    s = shapes.clamp_min(1.0)
    stride = s[:, 4] if s.shape[1] > 4 else torch.ones_like(s[:, 0])
    return s[:, 0] * s[:, 1] * s[:, 2] * s[:, 3] / stride ** 2


def depthwise_law_seconds(shapes: torch.Tensor, backward: torch.Tensor, dtypes: list[str],
                          law: dict[str, tuple[float, ...]], floor: dict[str, float] | None = None) -> torch.Tensor:
    """Per node (float64 [N]) its time by a depthwise law (``Profile.depthwise``) from its shape
    (``depthwise_shapes``: a law of k exponents reads its first k columns, so one fitted without the stride
    reads the first four), NaN where it has no shape or its (direction, dtype) no law; with ``floor``
    (``Profile.depthwise_floor``) never under its work times the key's fastest fitted seconds per unit."""
    out = torch.full((shapes.shape[0],), float("nan"), dtype=torch.float64)
    logs = torch.log(shapes.clamp_min(1.0))
    has = ~torch.isnan(shapes[:, 0])
    for rows, c in _law_rows(law, has, backward, dtypes):
        out[rows] = torch.exp(c[0] + logs[rows][:, :len(c) - 1] @ torch.tensor(c[1:], dtype=torch.float64))
    if floor:
        work = depthwise_work(shapes)
        for rows, per_unit in _law_rows({k: v for k, v in floor.items() if k in law}, has, backward, dtypes):
            out[rows] = torch.maximum(out[rows], work[rows] * per_unit)
    return out


def scaled_depthwise(law: dict[str, tuple[float, ...]], factor: float) -> dict[str, tuple[float, ...]]:
    """A depthwise law whose times are ``factor`` times as long (a prior moved to a slower kind)."""
    return {k: (c[0] + math.log(factor), *c[1:]) for k, c in law.items()}


def scaled_additive(law: dict[str, tuple[float, ...]], factor: float) -> dict[str, tuple[float, ...]]:
    """An additive law (``Profile.attention``, ``Profile.depthwise_paths``: seconds per unit of each cost) whose
    times are ``factor`` times as long."""
    return {k: tuple(c * factor for c in v) for k, v in law.items()}


def scaled_depthwise_floor(floor: dict[str, float], factor: float) -> dict[str, float]:
    """A depthwise law's floor (``Profile.depthwise_floor``) for times ``factor`` times as long."""
    return {k: v * factor for k, v in floor.items()}


@dataclass(frozen=True)
class SizedMove:
    """How much faster a target CPU kind runs each kernel than the source kind, by the kernel's size
    (``descriptor.sized_move``, from the step probes both kinds measured): one number per GEMM dtype does
    not move a step's GEMMs between a kind with a fast bf16 path and one without, whose bf16 GEMMs run at a
    flat few GFLOP/s (the speed-up falls from 0.2 at 1e4 FLOPs to 0.01 at 1e9), and the in-cache element-wise
    probes do not say how a step's large element-wise kernels move (README *Protocol*, "Moving a prior by
    kernel size").

    - ``gemm``: per GEMM dtype, (slope, intercept, lowest, highest): log(speed-up) = slope * log(FLOPs) +
      intercept, log(FLOPs) held within [lowest, highest] (the probes' range); matmul and convolution
      kernels (depthwise and grouped ones too);
    - ``attention``: one speed-up for fused attention (aten's CPU kernel, every dtype): the fp32 GEMM probes';
    - ``in_cache``: non-GEMM kernels moving fewer than ``cache_bytes``: the element-wise probes';
    - ``bandwidth``: non-GEMM kernels moving more: the measured memory bandwidths' ratio."""

    gemm: dict[str, tuple[float, float, float, float]]
    attention: float
    in_cache: float
    bandwidth: float
    cache_bytes: float = float(2 ** 20)

    def speedup(self, x: torch.Tensor, x_cat: torch.Tensor) -> torch.Tensor:
        """Per node (float64 [N]): how many times faster the target runs it (graph.py's ``x``, ``x_cat``)."""
        flops = _unlog(x[:, 0]).double()
        moved = (_unlog(x[:, 1]) + _unlog(x[:, 2])).double()
        category, dtype = x_cat[:, 1], x_cat[:, 2]
        out = torch.where(moved >= self.cache_bytes, torch.full_like(moved, self.bandwidth),
                          torch.full_like(moved, self.in_cache))
        log_flops = torch.log(flops.clamp_min(1.0))
        fp32 = self.gemm["fp32"]
        for c in GEMM_CATEGORIES:
            rows = category == c
            if not bool(rows.any()):
                continue
            if ops.CATEGORIES[c] == "attention":
                out[rows] = self.attention
                continue
            for d in set(dtype[rows].tolist()):
                slope, intercept, lo, hi = self.gemm.get(ops.DTYPES[d], fp32)
                sel = rows & (dtype == d)
                out[sel] = torch.exp(slope * log_flops[sel].clamp(lo, hi) + intercept)
        return out


def split_moved_seconds(source_s: torch.Tensor, source_ideal_s: torch.Tensor, target_ideal_s: torch.Tensor,
                        rest_ratio: float) -> torch.Tensor:
    """A kernel's time moved to another kind by splitting it (``Profile.moved_from``): its time at the
    source's ceilings becomes its time at the target's, the rest (what the source's curves add above the
    ceilings: small kernels' tiling and packing, caches, loop overheads) is divided by ``rest_ratio``. A
    kernel priced at or under its ceilings' time (a CPU curve may run an in-cache kernel above DRAM
    bandwidth) moves by the ceilings alone."""
    above = source_s > source_ideal_s
    by_ceilings = source_s * target_ideal_s / source_ideal_s.clamp_min(1e-300)
    split = target_ideal_s + (source_s - source_ideal_s) / rest_ratio
    return torch.where(above, split, torch.where(source_ideal_s > 0, by_ceilings, source_s / rest_ratio))


def node_seconds(x: torch.Tensor, x_cat: torch.Tensor, profile: Profile,
                 fresh: torch.Tensor | None = None, layout: torch.Tensor | None = None) -> torch.Tensor:
    """Prior time in seconds of every node (float64 [N]) from its features (graph.py's ``x``, ``x_cat``),
    on a CPU whose fresh-allocation cost is measured what it allocates (``fresh_bytes``), and on a profile
    fitted with GEMM layouts each GEMM's operand layout (``gemm_layout``, ``Profile.gemm_layouts``)."""
    if profile.sized_from is not None:
        source, sized = profile.sized_from
        source_s, _ = _kernel_seconds(x, x_cat, source, layout=layout)
        seconds = source_s / sized.speedup(x, x_cat)
    elif profile.moved_from is None:
        seconds, _ = _kernel_seconds(x, x_cat, profile, layout=layout)
    else:
        source, source_ceilings, target_ceilings, rest_ratio = profile.moved_from
        source_s, (source_ideal_s, target_ideal_s) = _kernel_seconds(x, x_cat, source, source_ceilings,
                                                                     target_ceilings, layout=layout)
        seconds = split_moved_seconds(source_s, source_ideal_s, target_ideal_s, rest_ratio)
    if profile.depthwise_probes and profile.hardware.depthwise_probe_s and layout is not None:
        seconds = probed_depthwise(seconds, x, x_cat, layout, profile.hardware)
    seconds = torch.maximum(seconds, torch.full_like(seconds, profile.launch_floor_s))
    faults = fresh_seconds(fresh, profile.fresh_threshold_bytes, profile.fresh_s_per_byte)
    return seconds if faults is None else seconds + faults


def probed_depthwise(seconds: torch.Tensor, x: torch.Tensor, x_cat: torch.Tensor, layout: torch.Tensor,
                     hw: Hardware) -> torch.Tensor:
    """``seconds`` with every channels-last depthwise-like convolution's time taken from ``hw``'s depthwise
    probes (``Profile.depthwise_probes``) where they have its dtype and direction."""
    from gnn_ptp import depthwise_table

    cl = channels_last(layout)
    if not bool(cl.any()):
        return seconds
    by_table = depthwise_table.priced(depthwise_shapes(x, x_cat), x_cat[:, 3] == BACKWARD_PHASE,
                                      [ops.DTYPES[d] for d in x_cat[:, 2].tolist()], cl, hw.depthwise_probe_s)
    return torch.where(torch.isnan(by_table), seconds, by_table)


PHASE_NAMES = PHASES


def queue_ms_grid(device_s: torch.Tensor, host_s: torch.Tensor) -> torch.Tensor:
    """``queue_ms`` for every host issue cost of ``host_s`` [H] at once: [H] milliseconds."""
    if device_s.numel() == 0:
        return torch.zeros_like(host_s, dtype=torch.float64)
    after = torch.flip(torch.cumsum(torch.flip(device_s.double(), [0]), 0), [0])
    k = torch.arange(1, device_s.numel() + 1, dtype=torch.float64)
    return (host_s.double()[:, None] * k[None, :] + after[None, :]).max(1).values * 1e3


def queue_ms(device_s: torch.Tensor, host_s: float) -> float:
    """Milliseconds of a launch queue: the host issues kernel k (1-based, in order) at ``k * host_s``, the
    GPU runs it for ``device_s[k-1]`` once issued and free. The last kernel ends at
    ``max_k (k * host_s + sum_{j >= k} device_s[j])``: the GPU-bound sum when the host keeps ahead, the
    host's pace when the kernels are short."""
    return float(queue_ms_grid(device_s, torch.tensor([host_s], dtype=torch.float64))[0])


def issue_seconds(seconds: torch.Tensor, phase: torch.Tensor, profile: Profile) -> torch.Tensor:
    """Per node, the larger of its device time and its phase's host issue cost (the device time where the
    profile has none): what the kernel costs a host-bound step, summed by per-node readouts."""
    if not profile.host_issue_s:
        return seconds
    host = torch.tensor(profile.host_issue_s, dtype=torch.float64)[phase.long()]
    return seconds + host if profile.serial else torch.maximum(seconds, host)


def log_node_ms(tensors, profile: Profile) -> torch.Tensor:
    """Per-node log milliseconds (float32 [N]), as the GNN's per-kernel head gives them: the device time,
    or for a profile with host issue costs the node's share of its phase in the step's launch queue
    (``queued_node_seconds``; needs ``phase`` in ``tensors``, else the device time). ``tensors`` may hold
    one graph or a batch of them (``batch``: each node's graph), ``grad_bytes`` and ``fresh_bytes``."""
    get = tensors.get if isinstance(tensors, dict) else lambda k: getattr(tensors, k, None)
    seconds = node_seconds(tensors["x"], tensors["x_cat"], profile, get("fresh_bytes"), get("gemm_layout"))
    phase = tensors.get("phase") if isinstance(tensors, dict) else None
    if phase is not None:
        seconds = queued_node_seconds(seconds, phase, profile, tensors.get("grad_bytes"), tensors.get("batch"))
    return torch.log(seconds * 1e3).float()


def queued_node_seconds(seconds: torch.Tensor, phase: torch.Tensor, profile: Profile,
                        grad_bytes: torch.Tensor | None = None, graph: torch.Tensor | None = None) -> torch.Tensor:
    """Per-node seconds that add up, per phase of each graph, to the launch queue's phase time
    (``graph_phase_ms``): each node's ``issue_seconds`` scaled by its phase's queue / sum. So a per-node
    readout of them (the analytic model's, or a GNN predicting its log-ratio to them) starts from the
    prior's step model, with the GPU's lag and the host's pace, not from a plain sum. Without host costs:
    the device times."""
    if not profile.host_issue_s or seconds.numel() == 0:
        return seconds
    node = issue_seconds(seconds, phase, profile)
    phase = phase.long()
    graph = torch.zeros_like(phase) if graph is None else graph.long()
    graphs = int(graph.max()) + 1
    index = graph * 3 + phase
    summed = torch.zeros(graphs * 3, dtype=torch.float64).index_add(0, index, node.double())
    queued = torch.cat([graph_phase_ms(seconds[graph == g], phase[graph == g], profile,
                                       None if grad_bytes is None else grad_bytes[graph == g]) * 1e-3
                        for g in range(graphs)])
    return node * (queued / summed.clamp_min(1e-15))[index].to(node)


def optimizer_issues(device_s: torch.Tensor, grad_bytes: torch.Tensor | None) -> torch.Tensor:
    """The optimizer phase as the host issues it: a foreach kernel is one graph node, but its host work
    (and the optimizer's per-parameter bookkeeping) grows with the parameter tensors, counted as the
    backward nodes that finalise a gradient; the phase's device time is spread over one issue per tensor."""
    tensors = int((grad_bytes > 0).sum()) if grad_bytes is not None else 0
    if tensors <= device_s.numel():
        return device_s
    return torch.full((tensors,), float(device_s.sum()) / tensors, dtype=torch.float64)


def phase_after(device_s: torch.Tensor, host_s: float, fixed_s: float, lag_s: float) -> tuple[float, float]:
    """One phase of a step as the host issues it: (its ms, the GPU's lag behind the host at its end, s).

    The phase starts when the GPU reaches the previous phase's end event, ``lag_s`` after the host recorded
    it (the GPU was still busy). The host spends ``fixed_s`` (autograd's start, Python), then issues kernel
    k at ``fixed_s + k * host_s``; the GPU runs each once issued and free. The phase lasts
    ``max(sum t, fixed + max_k(k * host + sum_{j>=k} t_j) - lag)``: a GPU that is still busy hides the host's
    issuing, a host-bound phase shows it."""
    if device_s.numel() == 0:
        return 0.0, lag_s
    queued = queue_ms(device_s, host_s) * 1e-3
    phase = max(float(device_s.sum()), fixed_s + queued - lag_s)
    return phase * 1e3, lag_s + phase - (fixed_s + device_s.numel() * host_s)


STEADY_PASSES = 2
"""Steps run back to back without a synchronisation: the GPU's lag at the end of one step's optimizer is
the lag the next forward starts with. Two passes (from lag 0, then from the first pass's end) reach it."""


def graph_phase_ms(seconds: torch.Tensor, phase: torch.Tensor, profile: Profile,
                   grad_bytes: torch.Tensor | None = None) -> torch.Tensor:
    """[forward, backward, optimizer] ms of one graph's per-node device seconds (in graph order): where the
    profile has host costs, the step is one launch queue through its three phases (``phase_after``: the
    GPU's lag carries from phase to phase, and from one step to the next), on a CPU (``Profile.serial``)
    fixed + issues x host + the kernels; else the sums."""
    if not profile.host_issue_s:
        return torch.zeros(3, dtype=torch.float64).index_add(0, phase, seconds) * 1e3
    fixed = profile.host_fixed_s or (0.0, 0.0, 0.0)
    devices = []
    for p in range(3):
        device = seconds[phase == p]
        devices.append(optimizer_issues(device, grad_bytes) if p == 2 else device)
    if profile.serial:  # one thread issues and runs: nothing overlaps
        return torch.tensor([fixed[p] + d.numel() * profile.host_issue_s[p] + float(d.sum()) if d.numel() else 0.0
                             for p, d in enumerate(devices)], dtype=torch.float64) * 1e3
    lag = 0.0
    for _ in range(STEADY_PASSES):
        out = []
        for p in range(3):
            ms, lag = phase_after(devices[p], profile.host_issue_s[p], fixed[p], lag)
            out.append(ms)
    return torch.tensor(out, dtype=torch.float64)


HOST_FIELDS = 7
"""``host_vector``'s width: host issue seconds per phase (3), fixed host seconds per phase (3), serial flag."""


def host_vector(profile: Profile) -> torch.Tensor:
    """A profile's host costs as one row [1, HOST_FIELDS] (float64), for a batch of graphs to carry: what
    ``phase_seconds`` needs beside the per-node device times."""
    issue = profile.host_issue_s or (0.0, 0.0, 0.0)
    fixed = profile.host_fixed_s or (0.0, 0.0, 0.0)
    return torch.tensor([[*issue, *fixed, 1.0 if profile.serial else 0.0]], dtype=torch.float64)


def _queue_s(device_s: torch.Tensor, host_s: torch.Tensor) -> torch.Tensor:
    """``queue_ms`` in seconds, in torch ops (differentiable in both arguments)."""
    after = torch.flip(torch.cumsum(torch.flip(device_s, [0]), 0), [0])
    k = torch.arange(1, device_s.numel() + 1, dtype=device_s.dtype, device=device_s.device)
    return (host_s * k + after).max()


def phase_seconds(device_s: torch.Tensor, phase: torch.Tensor, host: torch.Tensor, tensors: int = 0,
                  host_scale: torch.Tensor | None = None) -> torch.Tensor:
    """``graph_phase_ms`` / 1e3 of one graph in torch ops, differentiable in the per-node device seconds
    (``device_s`` [N], graph order) and in ``host_scale`` [3] (a factor on each phase's host costs, issue
    and fixed): what a GNN that corrects the kernels' device times (``model.py``, readout ``queue``) reads
    its phase times through. ``host``: ``host_vector``'s row [HOST_FIELDS]; ``tensors``: the step's
    parameter tensors (``optimizer_issues``). Same launch queue, lag carried across phases and steps, or
    the serial sum on a CPU; [forward, backward, optimizer] seconds."""
    host = host.to(device_s)
    issue, fixed = host[0:3], host[3:6]
    if host_scale is not None:
        issue, fixed = issue * host_scale.to(device_s), fixed * host_scale.to(device_s)
    zero = device_s.new_zeros(())
    devices = []
    for p in range(3):
        device = device_s[phase == p]
        if p == 2 and tensors > device.numel():  # optimizer_issues: one issue per parameter tensor
            device = (device.sum() / tensors).expand(tensors)
        devices.append(device)
    if not bool((host[0:6] != 0).any()):  # a profile without host costs: the sums
        return torch.stack([d.sum() if d.numel() else zero for d in devices])
    if bool(host[6] > 0.5):  # serial: fixed + issues x host + kernels
        return torch.stack([fixed[p] + d.numel() * issue[p] + d.sum() if d.numel() else zero
                            for p, d in enumerate(devices)])
    lag = zero
    for _ in range(STEADY_PASSES):
        out = []
        for p, d in enumerate(devices):
            if not d.numel():
                out.append(zero)
                continue
            t = torch.maximum(d.sum(), fixed[p] + _queue_s(d, issue[p]) - lag)
            lag = lag + t - (fixed[p] + d.numel() * issue[p])
            out.append(t)
    return torch.stack(out)


def device_log_ms(x: torch.Tensor, x_cat: torch.Tensor, profile: Profile,
                  fresh: torch.Tensor | None = None, layout: torch.Tensor | None = None) -> torch.Tensor:
    """Each node's device time alone (``node_seconds``), log ms, float32 [N]."""
    return torch.log(node_seconds(x, x_cat, profile, fresh, layout) * 1e3).float()


def price(sample, profile: Profile) -> None:
    """Give a graph sample the prior's view of it under ``profile``: ``prior_log_ms`` [N] (each node's share
    of the launch queue, ``log_node_ms``), ``prior_device_log_ms`` [N] (each kernel's device time alone, log
    ms) and ``host_s`` [1, HOST_FIELDS] (``host_vector``): what a residual GNN reads (``model.py``)."""
    seconds = node_seconds(sample.x, sample.x_cat, profile, getattr(sample, "fresh_bytes", None),
                           getattr(sample, "gemm_layout", None))  # both views
    queued = queued_node_seconds(seconds, sample.phase, profile, getattr(sample, "grad_bytes", None))
    sample.prior_log_ms = torch.log(queued * 1e3).float()  # = log_node_ms
    sample.prior_device_log_ms = torch.log(seconds * 1e3).float()  # = device_log_ms
    sample.host_s = host_vector(profile).float()


def param_tensors(grad_bytes: torch.Tensor | None) -> int:
    """The parameter tensors of a step (nodes that finalise a gradient): ``optimizer_issues``' count."""
    return int((grad_bytes > 0).sum()) if grad_bytes is not None else 0


def phase_ms(tensors, profile: Profile) -> np.ndarray:
    """Prior ms of [forward, backward, optimizer, whole step] of one graph (a ``Data`` or a dict of its
    tensors with ``x``, ``x_cat``, ``phase`` and, for the launch queue, ``grad_bytes``)."""
    get = tensors.get if isinstance(tensors, dict) else lambda k: getattr(tensors, k, None)
    seconds = node_seconds(get("x"), get("x_cat"), profile, get("fresh_bytes"), get("gemm_layout"))
    out = graph_phase_ms(seconds, get("phase"), profile, get("grad_bytes")).numpy()
    return np.append(out, out.sum())


ANALYTIC_HARDWARE = ("h100", "h200", "a100")
"""Hardware ``predict`` answers from the prior alone while it has no checkpoint."""


class AnalyticModel:
    """The prior in the shape of a trained GNN for ``predict``: called on a ``Batch`` of graphs it returns
    ``log_phase_ms`` [G, 3] and per-node ``log_node_ms`` [N] (no memory head)."""

    def __init__(self, profile: Profile):
        self.profile = profile

    def __call__(self, batch) -> dict[str, torch.Tensor]:
        seconds = node_seconds(batch.x, batch.x_cat, self.profile, getattr(batch, "fresh_bytes", None),
                               getattr(batch, "gemm_layout", None))
        node_ms = queued_node_seconds(seconds, batch.phase, self.profile, getattr(batch, "grad_bytes", None),
                                      batch.batch) * 1e3
        graphs = int(batch.num_graphs)
        index = batch.batch * 3 + batch.phase
        summed = torch.zeros(graphs * 3, dtype=torch.float64).index_add(0, index, node_ms.double())
        return {"log_phase_ms": torch.log(summed.clamp_min(1e-9)).view(graphs, 3).float(),
                "log_node_ms": torch.log(node_ms.clamp_min(1e-12)).float()}


UNMEASURED_NOTE = {"h100": "same compute, less bandwidth"}
"""How a GPU differs from the one its curves were fitted on, where that is said in one phrase."""


def expected_error_on(hardware: str, profile: Profile) -> dict:
    """The profile's expected error as it applies to ``hardware``: as measured on the hardware it was fitted
    on; elsewhere with that said (the curves run at the other GPU's datasheet rates, which no step of it
    has checked)."""
    err = dict(profile.expected_error)
    if err.get("summary") and profile.fitted_on and profile.fitted_on != hardware:
        how = UNMEASURED_NOTE.get(hardware, f"the {profile.fitted_on}'s curves at its datasheet rates")
        err["summary"] += f"; on an {hardware.upper()} not measured ({how})"
    return err


CONV_FAMILIES = ("convnext", "densenet", "efficientnet", "mobilenet", "random-cnn", "regnet", "resnet", "vgg")
"""The fitted families that spend most of their GEMM-like FLOPs in convolutions (``model_error``'s groups)."""


def conv_flops_share(x: torch.Tensor, x_cat: torch.Tensor) -> float:
    """The share of a graph's GEMM-like FLOPs (matmul, convolution, attention) that are convolutions' (0
    where it has none)."""
    flops = _unlog(x[:, 0].double())
    category = x_cat[:, 1]
    total = float(flops[torch.isin(category, torch.tensor(GEMM_CATEGORIES))].sum())
    return float(flops[category == CONV_CATEGORY].sum()) / total if total > 0 else 0.0


def model_error(section: str, family: str, conv_share: float) -> dict | None:
    """The expected error of the prior for one model, from ``section``'s leave-one-family-out step errors
    (``errors.lofo.by_family``, written by ``benchmarks/calibrate_prior.py --lofo``): its own family's where
    the fit knows the family (each family was scored by a fit that never saw it), else the spread of the
    families of its kind, convolutional (``CONV_FAMILIES``) where at least half of its GEMM-like FLOPs are
    convolutions', the others otherwise. None where the section has no such figures."""
    by_family = ((calibration().get(section) or {}).get("errors") or {}).get("lofo", {}).get("by_family") or {}
    if not by_family:
        return None
    if family in by_family:
        row = by_family[family]
        return {"basis": "family", "family": family, "mape": row["mape"], "median_ape": row["median_ape"],
                "n": row["n"], "text": f"this model's family ({family}), left out of the fit: {row['mape']:.0f} % "
                                      f"(median {row['median_ape']:.0f} %, {row['n']} steps)"}
    conv = conv_share >= 0.5
    kin = {f: r["mape"] for f, r in by_family.items() if (f in CONV_FAMILIES) == conv}
    if not kin:
        return None
    what = "most GEMM FLOPs in convolutions" if conv else "most GEMM FLOPs in matmuls and attention"
    low, high, mean = min(kin.values()), max(kin.values()), sum(kin.values()) / len(kin)
    return {"basis": "kin", "family": family, "conv_flops_share": conv_share, "families": sorted(kin),
            "mape": mean, "mape_range": [low, high],
            "text": f"models like this one ({what}): {len(kin)} such families, each left out of the fit, "
                    f"{low:.0f}-{high:.0f} % (mean {mean:.0f} %)"}


def analytic_model(hardware: str) -> tuple[AnalyticModel, dict] | None:
    """(model, meta) answering for ``hardware`` from the calibrated prior, or None where it has none."""
    if hardware not in ANALYTIC_HARDWARE or hardware not in HARDWARE:
        return None
    profile = get_profile(hardware)
    if not profile.gemm:  # no calibration shipped
        return None
    meta = {"hardware": hardware, "trace_target": "cuda", "source": "analytic-prior",
            "expected_error": expected_error_on(hardware, profile), "section": section_for(hardware, calibration())}
    return AnalyticModel(profile), meta
