"""Hardware descriptors: what a machine can do, as numbers a model can read.

A descriptor names one hardware kind by its ceilings: peak GEMM rate per compute dtype, the rate of
non-GEMM (vector) kernels, memory bandwidth and the launch floor (least time one eager kernel costs).
GPUs get datasheet figures (``gnn_ptp/hardware.py``: H100 SXM, H200, A100); a CPU gets what
``measure_cpu`` measures on it with one thread, stored in ``gnn_ptp/hardware_descriptors/<slug>.json``,
keyed by the CPU kind that records carry in ``env.cpu_kind`` (older records: ``env.cpu_model``) (GPU records: ``env.device_name``).

A descriptor serves the GNN twice (``ModelConfig.hardware_descriptor``, ``ModelConfig.target``):
``features()`` is a small log-scaled vector added to the graph-level embedding, and ``profile()`` is the
physical prior (``gnn_ptp/prior.py``) priced with the descriptor's own rates and the calibrated curves of
its kind (``cpu`` or ``h100``), so a checkpoint can be asked about a CPU it never saw once that CPU's
ceilings are measured::

    python -m gnn_ptp.descriptor --measure --write      # this CPU, one thread (pin it: taskset -c 1)
"""

from __future__ import annotations

import json
import math
import re
import sys
import time
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path

import torch

from gnn_ptp.errors import UserError
from gnn_ptp.hardware import HARDWARE, Hardware

DESCRIPTOR_DIR = Path(__file__).with_name("hardware_descriptors")
GEMM_DTYPES = ("fp32", "tf32", "fp16", "bf16")
FEATURE_NAMES = tuple(f"log10 {d} GEMM FLOP/s" for d in GEMM_DTYPES) + (
    "log10 vector FLOP/s", "log10 memory B/s", "log10 launch floor s", "gpu")
DESCRIPTOR_FEATURES = len(FEATURE_NAMES)
_CENTRE = (12.0,) * 4 + (11.0, 11.0, -5.5)  # log10 scale of each rate: features land in about [-1, 2]


@dataclass(frozen=True)
class Descriptor:
    name: str
    """Short name: a GPU kind (h100, h200, a100) or the slug of a CPU model (amd-epyc)."""
    kind: str
    """"cpu" or "gpu"."""
    gemm_flops_per_s: dict[str, float]
    """Peak GEMM rate per compute dtype (fp32, tf32, fp16, bf16); on a GPU tf32/fp16/bf16 on tensor
    cores and fp32 on CUDA cores; on a CPU measured (tf32 is the fp32 rate: a CPU has no TF32)."""
    vector_flops_per_s: float
    """Rate of non-GEMM kernels (element-wise, reductions, norms)."""
    memory_bandwidth_Bps: float
    """Bytes read + written per second."""
    launch_floor_s: float
    """Least time one eager kernel costs (host dispatch + launch)."""
    description: str = ""
    source: str = ""
    """Where the figures come from: a datasheet, or the measurement (date, threads, torch)."""
    measured: bool = False
    curves: str = ""
    """Whose calibrated efficiency curves (prior_calibration.json) price kernels below the peaks:
    "cpu" for CPUs, "h100" for GPUs (default by kind)."""
    extra: dict = field(default_factory=dict)
    step_probe_s: dict[str, dict[str, float]] = field(default_factory=dict)
    """Seconds of the step-sized probe kernels (``measure_step_probes``: forward + backward of kernels of
    training-step sizes), by group ("gemm fp32", "gemm bf16", "non-gemm fp32", "non-gemm bf16") and probe;
    empty where not measured. Between two kinds measured with the same ``probe_suite`` they, not the peaks,
    move a prior (``transfer_ratios``)."""
    probe_suite: str = ""
    fresh_alloc: dict = field(default_factory=dict)
    """What a fresh allocation costs this CPU beyond writing it (``measure_fresh_alloc``: one process, one
    thread): ``threshold_bytes`` (the allocator's mmap threshold; above it every allocation is mapped from
    the operating system and page-faulted in as it is first written), ``ms_per_MiB`` above it, ``source``;
    empty where not measured (a GPU: its caching allocator reuses memory). Priced per kernel by a prior
    fitted with it (``prior.Profile.fresh_s_per_byte``)."""
    gemm_layout_flops_per_s: dict = field(default_factory=dict)
    """Per dtype ("fp32", "bf16", "fp16"), the GEMM rate of each operand layout ("nn", "nt", "tn", "tt":
    ``ops.GEMM_LAYOUTS``) measured the same way (``measure_gemm_layouts``); empty where not measured. A CPU
    without a fast bf16 path runs each layout through another kernel (the fourth kind here: 1.3 to 24 GFLOP/s
    in bf16); a prior fitted with them prices each GEMM at its layout's ceiling (``prior.Profile.gemm_layouts``)."""
    depthwise_probe_s: tuple = field(default=(), compare=False)
    """Depthwise convolutions of a grid of shapes timed apart, one row each (``depthwise_table.measure``:
    dtype, input layout, batch, channels, pixels a side, taps, forward and backward seconds); empty where not
    measured. A prior whose section says so prices a step's channels-last depthwise convolutions from them
    (``prior.Profile.depthwise_probes``): torch runs another kernel for those, with a cliff in the channels no
    law fitted to other families' steps can know. Not part of a descriptor's identity (``==``, ``transfer``):
    a checkpoint's stored descriptor without them is still its kind's."""

    def __post_init__(self):
        if not isinstance(self.depthwise_probe_s, tuple):  # one object for every Hardware built from it
            object.__setattr__(self, "depthwise_probe_s", tuple(self.depthwise_probe_s))
        if self.kind not in ("cpu", "gpu"):
            raise UserError(f"hardware descriptor {self.name!r}: kind {self.kind!r} is not one of cpu, gpu")
        missing = [d for d in GEMM_DTYPES if not self.gemm_flops_per_s.get(d, 0) > 0]
        rates = {"vector_flops_per_s": self.vector_flops_per_s, "memory_bandwidth_Bps": self.memory_bandwidth_Bps,
                 "launch_floor_s": self.launch_floor_s}
        bad = [k for k, v in rates.items() if not (isinstance(v, (int, float)) and v > 0 and math.isfinite(v))]
        if missing or bad:
            raise UserError(f"hardware descriptor {self.name!r}: needs positive rates; missing or bad: "
                            f"{', '.join([f'gemm {d}' for d in missing] + bad)}")

    def features(self) -> torch.Tensor:
        """[1, DESCRIPTOR_FEATURES] float32: (log10(rate) - centre) / 2 per rate, then 1 for a GPU."""
        rates = [self.gemm_flops_per_s[d] for d in GEMM_DTYPES] + [
            self.vector_flops_per_s, self.memory_bandwidth_Bps, self.launch_floor_s]
        values = [(math.log10(r) - c) / 2 for r, c in zip(rates, _CENTRE)] + [float(self.kind == "gpu")]
        return torch.tensor([values], dtype=torch.float32)

    def hardware(self) -> Hardware:
        return Hardware(self.name, self.description, dict(self.gemm_flops_per_s),
                        vector_flops_per_s=self.vector_flops_per_s,
                        memory_bandwidth_Bps=self.memory_bandwidth_Bps, source=self.source, kind=self.kind,
                        gemm_layout_ratio=self.layout_ratios(), depthwise_probe_s=self.depthwise_probe_s)

    def layout_ratios(self) -> dict[str, float]:
        """``Hardware.gemm_layout_ratio`` from ``gemm_layout_flops_per_s``: each layout's rate over the nn
        rate of its dtype ("tf32" takes fp32's: a CPU has no TF32); {} where nothing was measured."""
        out = {}
        for dtype, rates in self.gemm_layout_flops_per_s.items():
            nn = rates.get("nn", 0.0)
            if nn > 0:
                for layout, rate in rates.items():
                    out[f"{dtype}:{layout}"] = float(rate) / nn
                    if dtype == "fp32":
                        out[f"tf32:{layout}"] = float(rate) / nn
        return out

    def curves_section(self) -> str:
        """The section of prior_calibration.json whose curves ``profile`` uses."""
        from gnn_ptp import prior

        curves = self.curves or ("cpu" if self.kind == "cpu" else "h100")
        if self.kind == "cpu" and f"cpu-{self.name}" in prior.calibration():  # this CPU kind's own curves
            curves = f"cpu-{self.name}"
        return curves

    def profile(self, section: str | None = None):
        """The physical prior for this hardware: the calibrated curves of its kind (``cpu`` or ``h100``;
        ``section`` names another, e.g. ``microbench-cpu``), with the calibrated machine's peaks scaled by
        this descriptor's rates over that machine's descriptor (measured the same way), so that on the
        calibrated machine itself the prior is exactly the calibrated one and elsewhere it moves with the
        measured ceilings (``transfer``). A CPU kind whose own kernel curves were measured
        (``benchmarks/calibrate_prior.py --cpu --cpu-section cpu-<name>``: kernel timings, no training
        step) uses those instead."""
        from gnn_ptp import prior

        table = prior.calibration()
        curves = section or self.curves_section()
        base = "cpu" if self.kind == "cpu" else curves if curves in HARDWARE else "h100"  # h100-neusight
        if curves not in table or base not in HARDWARE:
            return prior.Profile(self.hardware(), launch_floor_s=self.launch_floor_s)
        base_hw = HARDWARE[base]
        return transfer(prior.profile_from_dict(base_hw, table[curves]), calibrated_descriptor(curves), self)

    def steps_fitted_on(self, section: str | None = None) -> str | None:
        """The hardware (descriptor name) whose timed steps the curves of ``section`` (default: this
        hardware's own) were fitted to (``calibrate_prior.py --profiles``), or None for curves fitted to
        kernel timings alone: a score on that hardware's steps is not one "without any record of" it."""
        from gnn_ptp import prior

        d = prior.calibration().get(section or self.curves_section(), {})
        if not d.get("host_issue_s"):
            return None
        return stored_name(d["cpu_model"]) if d.get("cpu_model") else d.get("fitted_on") or None

    def fresh(self) -> dict | None:
        """``fresh_alloc`` as a prior fit takes it (``{"threshold_bytes", "s_per_byte"}``), or None where
        nothing was measured or nothing was costly (no threshold)."""
        f = self.fresh_alloc
        if not f or f.get("threshold_bytes") is None or not f.get("ms_per_MiB", 0) > 0:
            return None
        return {"threshold_bytes": float(f["threshold_bytes"]), "s_per_byte": float(f["ms_per_MiB"]) * 1e-3 / 2 ** 20}

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Descriptor":
        try:
            return cls(**d)
        except TypeError as e:
            raise UserError(f"hardware descriptor: {e}") from None


class MovedPrior:
    """``target``'s descriptor whose prior is ``source``'s (its calibrated section) moved to ``target`` by
    ``transfer`` (``CPU_TRANSFER``), never ``target``'s own section: a GNN trained as a residual over
    ``source``'s prior is consistent only over that prior, so ``predict --cpu-kind`` prices a residual
    checkpoint so, as the hardware protocol's folds do (README *Protocol*). Everything else is ``target``'s."""

    def __init__(self, source: "Descriptor", target: "Descriptor"):
        self.source, self.target = source, target

    def __getattr__(self, name):  # only for what is not set here (never source / target: no recursion)
        if name in ("source", "target"):
            raise AttributeError(name)
        return getattr(self.target, name)

    def profile(self, section: str | None = None):
        if section is not None:
            return self.target.profile(section)
        return transfer(self.source.profile(), self.source, self.target)


def residual_prior_for(trained: "Descriptor | None", target: "Descriptor", trained_kinds=()) -> "Descriptor | MovedPrior":
    """What a checkpoint trained as a residual over ``trained``'s prior prices ``target``'s steps over:
    ``target`` itself where it is one of the kinds it was trained on (``trained_kinds``, a checkpoint's
    ``hardware_kinds``; ``trained`` alone when empty) or not a CPU, else ``trained``'s prior moved to it
    (``MovedPrior``). ``evaluate`` and ``predict --cpu-kind`` both price so, as the hardware protocol's folds do."""
    if trained is None or trained.kind != "cpu" or target.kind != "cpu":
        return target
    if target.name in (set(trained_kinds) or {trained.name}):
        return target
    return MovedPrior(trained, target)


TRANSFER_MODES = ("ceilings", "split", "sized")
CPU_TRANSFER = "sized"
"""How ``transfer`` moves a prior between two CPU kinds (``TRANSFER_MODES``). ``sized`` since 2026-12-07
(fifty-fourth session), by a rule declared before the run (README *Protocol*, "Moving a prior by kernel size"):
between kinds sharing step probes each kernel by the probes at its size; onto the fourth kind (no fast bf16
path) in the hardware protocol the nearest kind's prior 45.5 -> 27.1 %, the residual GNN 60.3 -> 41.7 %
(run (91)). Between kinds without shared probes it is ``split``, the default from 2026-11-26 (fourteenth
session, also declared: the prior refitted per fold 66.4 -> 17.5 % over the three kinds' six pairs, the
residual GNN 61.0 -> 18.6 %; README *Protocol*, splitting)."""


def moved_mode(source: "Descriptor", target: "Descriptor", mode: str | None = None) -> str:
    """The mode ``transfer`` moves a prior from ``source`` to ``target`` by when asked for ``mode`` (default
    ``CPU_TRANSFER``): "sized" falls back to "split" where the two kinds share no step probes."""
    mode = mode or CPU_TRANSFER
    if mode == "sized" and not probes_shared(source, target):
        return "split"
    return mode


def transfer(profile, source: "Descriptor", target: "Descriptor", mode: str | None = None):
    """A prior fitted on ``source``'s hardware (``profile``: its curves at that hardware's rates) moved to
    ``target``: every peak scaled by ``transfer_ratios`` (the target's measured rate over the source's: the
    step-sized probes where both kinds have them, else the ceilings), the launch floor and the host costs
    by their dispatch floors (Python and the dispatcher run on the same core as that one-element op). The
    curves, fractions of the peaks, are kept. A prior fitted with a fresh-allocation cost
    (``prior.Profile.fresh_s_per_byte``) takes the target's measured one, or none where the target has no
    measurement (a cost is not moved between kinds: it is the operating system's and allocator's).

    ``mode`` "split" (what the default, ``CPU_TRANSFER``, does where the kinds share no step probes), between two
    CPU kinds that do not share step probes: each kernel's time is split instead (``prior.Profile.moved_from``, ``prior.split_moved_seconds``). Its time
    at the source's measured ceilings moves to its time at the target's; the rest, what the fitted curves
    add above the ceilings, moves by the non-GEMM ratio (the geometric mean of the element-wise and
    bandwidth ratios, the pairing the step probes use). A kernel far below its peak, as a step's small GEMMs
    are below a matrix unit's, then moves by the core's memory and vector speed, not by that peak. A
    depthwise law (``prior.Profile.depthwise``, seconds rather than fractions of a peak) moves by that
    same non-GEMM ratio when the kernels' time is not split (split, it is split like any kernel's), and so
    does an attention law (``prior.Profile.attention``: aten's CPU kernel, which every CPU kind runs). A
    slow-path convolution law (``prior.Profile.slow_conv``) does not move: it prices a kernel torch runs on
    the source kind only (its bf16 convolutions one sample at a time), so the target's convolutions take
    the curves.

    ``mode`` "sized", between two CPU kinds that share step probes: each kernel is priced on the source and
    its time divided by the target's speed-up at its size (``prior.Profile.sized_from``, ``sized_move``: the
    GEMM-like kernels by a line in log FLOPs over their dtype's GEMM probes, fused attention by the fp32 GEMM
    probes, the rest by the element-wise probes in cache and by the bandwidths beyond 1 MiB moved); between
    kinds without shared probes it is "split"."""
    from dataclasses import replace

    from gnn_ptp import prior

    mode = mode or CPU_TRANSFER
    if mode not in TRANSFER_MODES:
        raise UserError(f"hardware transfer mode {mode!r}: allowed: {', '.join(TRANSFER_MODES)}")
    mode = moved_mode(source, target, mode)  # "sized" needs both kinds' step probes; without them, "split"
    sized = mode == "sized" and source.kind == target.kind == "cpu" and source != target

    hw = profile.hardware
    ratio = transfer_ratios(source, target)
    rates = {d: hw.flops_per_s.get(d, hw.flops_per_s["fp32"]) * ratio[d] for d in GEMM_DTYPES}
    moved = Hardware(target.name, target.description, rates,
                     vector_flops_per_s=hw.vector_flops_per_s * ratio["vector"],
                     memory_bandwidth_Bps=hw.memory_bandwidth_Bps * ratio["memory"],
                     source=target.source, kind=target.kind, gemm_layout_ratio=target.layout_ratios(),
                     depthwise_probe_s=target.depthwise_probe_s)  # measured on the target itself
    host = target.launch_floor_s / source.launch_floor_s

    def scaled(costs):
        return tuple(c * host for c in costs) if costs else costs

    fresh = target.fresh() if profile.fresh_threshold_bytes is not None else None
    common = dict(hardware=moved, launch_floor_s=profile.launch_floor_s * host,  # every mode moves these alike
                  host_issue_s=scaled(profile.host_issue_s), host_fixed_s=scaled(profile.host_fixed_s),
                  fresh_threshold_bytes=fresh["threshold_bytes"] if fresh else None,
                  fresh_s_per_byte=fresh["s_per_byte"] if fresh else 0.0)
    if source != target and profile.slow_conv:  # a code path of the source's torch on its CPU, not a rate
        profile = replace(profile, slow_conv={})
    if sized:
        if profile.moved_from is not None or profile.sized_from is not None:
            raise UserError(f"a prior moved once cannot move on from {source.name!r} to {target.name!r} by kernel "
                            "size")
        return replace(profile, sized_from=(profile, sized_move(source, target)), **common)
    if profile.sized_from is not None:
        raise UserError(f"a prior moved by kernel size cannot move on from {source.name!r} to {target.name!r}")
    moved_from = profile.moved_from
    if (mode == "split" and source.kind == target.kind == "cpu" and source != target
            and not probes_shared(source, target)):
        rest = math.sqrt(ratio["vector"] * ratio["memory"])
        if moved_from is None:
            moved_from = (profile, source.hardware(), target.hardware(), rest)
        else:  # moved before: the rest of the first source's time moves by both ratios
            moved_from = (moved_from[0], moved_from[1], target.hardware(), moved_from[3] * rest)
    elif moved_from is not None:
        raise UserError(f"a prior moved by splitting its kernels' time cannot move on from {source.name!r} "
                        f"to {target.name!r} by the {'step probes' if mode == 'split' else mode}")
    depthwise, floor = profile.depthwise, profile.depthwise_floor
    attention, paths = profile.attention, profile.depthwise_paths
    if moved_from is None:  # a law is in seconds, not a fraction of a peak: it moves by the rest's ratio
        factor = 1.0 / math.sqrt(ratio["vector"] * ratio["memory"])
        depthwise, floor = prior.scaled_depthwise(depthwise, factor), prior.scaled_depthwise_floor(floor, factor)
        attention, paths = prior.scaled_additive(attention, factor), prior.scaled_additive(paths, factor)
    return replace(profile, moved_from=moved_from, depthwise=depthwise, depthwise_floor=floor,
                   attention=attention, depthwise_paths=paths, **common)


PROBE_SUITE = "step-probes-1"  # bump when _probe_suite changes
"""The version of ``measure_step_probes``' kernel set: probe seconds compare only within one suite."""
PROBE_GROUPS = ("gemm fp32", "gemm bf16", "non-gemm fp32", "non-gemm bf16")


def probes_shared(a: Descriptor, b: Descriptor) -> bool:
    """Whether two descriptors carry the same probe suite, every group measured."""
    return bool(a.probe_suite) and a.probe_suite == b.probe_suite and all(
        a.step_probe_s.get(g) and b.step_probe_s.get(g) for g in PROBE_GROUPS)


_PROBE_NAME = re.compile(r"^(linear|conv3x3|depthwise3x3|bmm) (\d+(?:x\d+)*)$")


def probe_flops(name: str) -> float:
    """Forward FLOPs of a GEMM-like step probe, from its name in ``_probe_suite`` (``PROBE_SUITE``)."""
    m = _PROBE_NAME.match(name)
    if not m:
        raise UserError(f"step probe {name!r}: not a GEMM probe of suite {PROBE_SUITE!r}")
    d = [int(v) for v in m.group(2).split("x")]
    kind = m.group(1)
    if kind == "linear" and len(d) == 3:  # tokens x in x out
        return 2.0 * d[0] * d[1] * d[2]
    if kind == "bmm" and len(d) == 3:  # heads x tokens x width: (t x w) @ (w x t) per head
        return 2.0 * d[0] * d[1] * d[1] * d[2]
    if kind == "conv3x3" and len(d) == 4:  # batch x c_in x c_out x pixels
        return 2.0 * d[0] * d[1] * d[2] * d[3] ** 2 * 9
    if kind == "depthwise3x3" and len(d) == 3:  # batch x channels x pixels
        return 2.0 * d[0] * d[1] * d[2] ** 2 * 9
    raise UserError(f"step probe {name!r}: not a GEMM probe of suite {PROBE_SUITE!r}")


def sized_move(source: Descriptor, target: Descriptor):
    """``prior.SizedMove`` from ``source`` to ``target`` (both with the same step probes, ``probes_shared``):
    per GEMM dtype with probes (fp32, its line also tf32's; bf16), the least-squares line of log(source
    seconds / target seconds) against log(forward FLOPs) over the dtype's GEMM probes; fp16, which no probe
    measures, the ceilings' ratio; fused attention the fp32 GEMM probes' ratio (``probe_ratio``); non-GEMM
    kernels the element-wise probes' ratio in cache (under 1 MiB moved, a core's L2 on the kinds here) and the
    measured bandwidths' ratio above."""
    from gnn_ptp import prior

    gemm = {}
    for dtype in ("fp32", "bf16"):
        src, tgt = source.step_probe_s[f"gemm {dtype}"], target.step_probe_s[f"gemm {dtype}"]
        points = [(math.log(probe_flops(k)), math.log(src[k] / tgt[k]))
                  for k in sorted(set(src) & set(tgt)) if src[k] > 0 and tgt[k] > 0]
        if len({p[0] for p in points}) < 2:
            raise UserError(f"hardware descriptors {source.name!r} and {target.name!r}: fewer than two sizes of "
                            f"'gemm {dtype}' probes measured on both")
        n = len(points)
        mx, my = sum(p[0] for p in points) / n, sum(p[1] for p in points) / n
        slope = (sum((p[0] - mx) * (p[1] - my) for p in points) / sum((p[0] - mx) ** 2 for p in points))
        gemm[dtype] = (slope, my - slope * mx, min(p[0] for p in points), max(p[0] for p in points))
    gemm["tf32"] = gemm["fp32"]
    gemm["fp16"] = (0.0, math.log(target.gemm_flops_per_s["fp16"] / source.gemm_flops_per_s["fp16"]), 0.0, 0.0)
    in_cache = math.sqrt(probe_ratio(source, target, "non-gemm fp32") * probe_ratio(source, target, "non-gemm bf16"))
    return prior.SizedMove(gemm=gemm, attention=probe_ratio(source, target, "gemm fp32"), in_cache=in_cache,
                           bandwidth=target.memory_bandwidth_Bps / source.memory_bandwidth_Bps)


def probe_ratio(source: Descriptor, target: Descriptor, group: str) -> float:
    """How much faster the target runs a probe group: the geometric mean over its probes of source
    seconds / target seconds (every probe counts alike, small or large, as a step's kernels span
    1e5-1e9 FLOPs)."""
    src, tgt = source.step_probe_s[group], target.step_probe_s[group]
    logs = [math.log(src[k] / tgt[k]) for k in sorted(set(src) & set(tgt)) if src[k] > 0 and tgt[k] > 0]
    if not logs:
        raise UserError(f"hardware descriptors {source.name!r} and {target.name!r}: no probe of {group!r} "
                        "measured on both")
    return math.exp(sum(logs) / len(logs))


def transfer_ratios(source: Descriptor, target: Descriptor) -> dict[str, float]:
    """How much faster the target runs each rate the prior prices with (target over source; keys: the GEMM
    dtypes, "vector", "memory"). Where both kinds measured the same step-sized probes (CPUs,
    ``measure_step_probes``) they set the fp32 (and tf32) and bf16 GEMM ratios and one non-GEMM ratio for
    the element-wise rate and the bandwidth (the geometric mean of the fp32 and bf16 groups): kernels of a
    training step's sizes, not the peaks of 512-2,048-square GEMMs, which on CPUs with matrix units (AMX)
    say 7x where steps' GEMMs run ~1.2x (``benchmarks/transfer_sources.py``). Otherwise, and for fp16
    always, the ratio of the measured or datasheet ceilings."""
    out = {d: target.gemm_flops_per_s[d] / source.gemm_flops_per_s[d] for d in GEMM_DTYPES}
    out["vector"] = target.vector_flops_per_s / source.vector_flops_per_s
    out["memory"] = target.memory_bandwidth_Bps / source.memory_bandwidth_Bps
    if probes_shared(source, target):
        out["fp32"] = out["tf32"] = probe_ratio(source, target, "gemm fp32")
        out["bf16"] = probe_ratio(source, target, "gemm bf16")
        out["vector"] = out["memory"] = math.sqrt(probe_ratio(source, target, "non-gemm fp32")
                                                  * probe_ratio(source, target, "non-gemm bf16"))
    return out


def ceiling_gap(a: Descriptor, b: Descriptor) -> float:
    """How far apart two hardware kinds' ceilings are: the largest |log10| ratio of their rates (the GEMM
    rates a training step of their kind uses: fp32 and bf16 on a CPU, every dtype on a GPU; element-wise,
    bandwidth and launch floor). A prior moved by ``transfer`` across a larger gap extrapolates further."""
    return abs(math.log10(widest_ceiling(a, b)[1]))


def widest_ceiling(a: Descriptor, b: Descriptor) -> tuple[str, float]:
    """The rate of ``ceiling_ratios`` on which ``b`` is furthest from ``a``: (its name, ``b`` over ``a``)."""
    return max(ceiling_ratios(a, b).items(), key=lambda kv: abs(math.log(kv[1])))


def ceiling_ratios(a: Descriptor, b: Descriptor) -> dict[str, float]:
    """``b``'s rates over ``a``'s, by name (``ceiling_gap``'s rates; the launch floor's as a rate, a floor
    half as long counting 2x)."""
    dtypes = ("fp32", "bf16") if a.kind == b.kind == "cpu" else GEMM_DTYPES
    out = {f"{d} GEMM": b.gemm_flops_per_s[d] / a.gemm_flops_per_s[d] for d in dtypes}
    out.update({"element-wise": b.vector_flops_per_s / a.vector_flops_per_s,
                "bandwidth": b.memory_bandwidth_Bps / a.memory_bandwidth_Bps,
                "launch floor": a.launch_floor_s / b.launch_floor_s})
    return out


def _from_hardware(hw: Hardware, launch_floor_s: float) -> Descriptor:
    rates = {d: hw.flops_per_s.get(d, hw.flops_per_s["fp32"]) for d in GEMM_DTYPES}
    return Descriptor(hw.name, "gpu", rates, hw.vector_flops_per_s, hw.memory_bandwidth_Bps, launch_floor_s,
                      hw.description, hw.source + " (datasheet)", measured=False, curves="h100")


GPU_DESCRIPTORS = {name: _from_hardware(HARDWARE[name], 5e-6) for name in ("h100", "h200", "a100")}
"""Datasheet descriptors (dense rates, ../shared/reference/h100.md); the 5 us launch floor is assumed, as
in the prior's H100 calibration."""


def reference_cpu() -> Descriptor:
    """This project's reference CPU as ``gnn_ptp/hardware.py`` quotes it (records without a CPU model)."""
    from gnn_ptp import prior

    hw = HARDWARE["cpu"]
    rates = {d: hw.flops_per_s.get(d, hw.flops_per_s["fp32"]) for d in GEMM_DTYPES}
    rates["tf32"] = rates["fp32"]
    floor = prior.calibration().get("cpu", {}).get("launch_floor_s", 3e-6)
    return Descriptor("cpu", "cpu", rates, hw.vector_flops_per_s, hw.memory_bandwidth_Bps, floor, hw.description,
                      hw.source, measured=True, curves="cpu")


def calibrated_descriptor(curves: str) -> Descriptor:
    """The descriptor of the machine whose curves ``prior_calibration.json`` holds under ``curves``: the
    H100's datasheet for "h100"; for "cpu" (and a CPU kind's own "cpu-<name>") the stored measurement of
    the CPU it names (for "cpu" this project's first AMD EPYC), else ``reference_cpu()``."""
    from gnn_ptp import prior

    model = prior.calibration().get(curves, {}).get("cpu_model")
    if not curves.startswith("cpu") and not model:
        return GPU_DESCRIPTORS.get(curves, GPU_DESCRIPTORS["h100"])
    found = stored_cpus().get(stored_name(model)) if model else None
    return found or reference_cpu()


def slug(cpu_model: str) -> str:
    """A file name for a CPU model: 'AMD EPYC 7B13' -> 'amd-epyc-7b13'."""
    return re.sub(r"[^a-z0-9]+", "-", cpu_model.lower()).strip("-") or "unknown-cpu"


SAME_KIND = {"amd-epyc-family-25-model-17": "amd-epyc"}
"""CPU kinds, as records name them now (model name, family and model numbers), that a descriptor stored
under an earlier, shorter name already describes. The first kind's records (2026-11-21 to 23) say "AMD EPYC"
alone; on 2026-11-28 a VM reporting AMD EPYC family 25 model 17 ran the whole CPU grid at 0.998x the step
times of that kind's third harvest pass (0.99-1.01x in each precision class, 6.8 % apart per configuration
where two of its own passes are 5.2 %), with ceilings 1.02-1.19x its stored ones (README, *The first kind
identified*)."""


def stored_name(cpu: str) -> str:
    """The stored descriptor name of a CPU, given as records name it ("AMD EPYC (family 25 model 17)") or
    as a slug: its slug, or the earlier name of the same kind (``SAME_KIND``)."""
    name = slug(cpu)
    return SAME_KIND.get(name, name)


def _check_this_cpu(stored: "Descriptor", why: str) -> None:
    """One clear error unless ``stored`` is this CPU's descriptor (what is measured here amends it)."""
    here = stored_name(cpu_model())
    if stored.kind != "cpu" or stored.name != here:
        raise UserError(f"hardware descriptor {stored.name!r} is not this CPU's ({here}): {why}")


def stored_cpus(folder: Path | None = None) -> dict[str, Descriptor]:
    """The measured CPU descriptors in ``folder`` (default ``DESCRIPTOR_DIR``), by CPU-model slug."""
    return dict(_stored_cpus(str(folder or DESCRIPTOR_DIR)))


@lru_cache(maxsize=8)
def _stored_cpus(folder: str) -> dict[str, Descriptor]:
    out = {}
    for path in sorted(Path(folder).glob("*.json")):
        try:
            d = Descriptor.from_dict(json.loads(path.read_text()))
        except (ValueError, UserError) as e:
            raise UserError(f"hardware descriptor file {path}: {e}") from None
        out[path.stem] = d
    return out


def for_env(env: dict, folder: Path | None = None) -> Descriptor:
    """The descriptor of the hardware a record was measured on (its ``env``); CPUs from ``folder``
    (default ``DESCRIPTOR_DIR``)."""
    folder = Path(folder or DESCRIPTOR_DIR)
    hardware = env.get("hardware", "?")
    if hardware == "cpu":
        # records since 2026-11-24 carry the CPU kind (model name + family and model numbers); older ones
        # only the model name, which a VM may share between generations: those map to the descriptor
        # measured for that name (this project's first AMD EPYC machine, the one they were measured on)
        model = env.get("cpu_kind") or env.get("cpu_model")
        if not model:
            return reference_cpu()
        found = stored_cpus(folder).get(stored_name(model))
        if found is None:
            raise UserError(f"no hardware descriptor for CPU {model!r} (looked for {folder}/{stored_name(model)}.json); "
                            "measure it on that machine: python -m gnn_ptp.descriptor --measure --write")
        return found
    if hardware in GPU_DESCRIPTORS:  # records.hardware_label already named the GPU kind
        return GPU_DESCRIPTORS[hardware]
    name = env.get("device_name") or hardware
    raise UserError(f"no hardware descriptor for device {name!r} (hardware {hardware!r}); known GPUs: "
                    f"{', '.join(GPU_DESCRIPTORS)}; CPUs: {', '.join(stored_cpus(folder)) or 'none'}")


def attach(samples: list, descriptors: list[Descriptor]) -> None:
    """Give every sample its hardware's features (``hw`` [1, D]) and the prior's view of it under that
    hardware (``prior.price``: ``prior_log_ms``, ``prior_device_log_ms``, ``host_s``): what
    ``hardware_descriptor`` and ``log_ratio_prior`` read."""
    from gnn_ptp import prior

    profiles: dict[str, object] = {}
    for s, d in zip(samples, descriptors, strict=True):
        if d.name not in profiles:
            profiles[d.name] = d.profile()
        s.hw = d.features()
        prior.price(s, profiles[d.name])
        s.hardware_name = d.name
        _by_name[d.name] = d


def attach_measured(samples: list, measured: list, over=None) -> list:
    """``attach`` with each sample's descriptor found from its record's environment (``Measured.env``),
    passed through ``over`` (a descriptor -> descriptor, e.g. ``residual_prior_for``) when given; returns
    the descriptors attached, one per sample."""
    env_of = {m.key: m.env or {"hardware": m.hardware} for m in measured}
    found = [for_env(env_of[s.key]) for s in samples]
    if over is not None:
        found = [over(d) for d in found]
    attach(samples, found)
    return found


def of_samples(samples: list) -> Descriptor:
    """The hardware of training samples (``attach``ed): the one descriptor they share, or the most common."""
    from collections import Counter

    names = Counter(getattr(s, "hardware_name", None) for s in samples)
    name = names.most_common(1)[0][0]
    if name is None:
        raise UserError("samples carry no hardware descriptor (descriptor.attach first)")
    return _by_name[name]


_by_name: dict[str, Descriptor] = {}
"""Descriptors ``attach`` has seen, by name (for ``of_samples``)."""


def priced_step_ms(sample) -> float:
    """The step time in ms of the prior ``attach`` gave a sample (its nodes' shares of the launch queue,
    ``prior_log_ms``, summed): ``prior.phase_ms``'s whole step under that profile, without pricing again."""
    from gnn_ptp.model import N_PHASES, scatter_logsumexp

    return float(torch.exp(scatter_logsumexp(sample.prior_log_ms.double(), sample.phase, N_PHASES)).sum())


def mean_log_ratio(samples: list) -> float:
    """Mean log(measured / prior) phase time over samples and their non-empty phases: where a model that
    predicts the log-ratio to the prior starts."""
    from gnn_ptp.model import N_PHASES, scatter_logsumexp

    values = []
    for s in samples:
        prior_phase = scatter_logsumexp(s.prior_log_ms.double(), s.phase, N_PHASES)
        y = s.y[0, :N_PHASES].double()
        keep = torch.isfinite(prior_phase) & (y > math.log(1e-5))
        values.append((y - prior_phase)[keep])
    return float(torch.cat(values).mean()) if values else 0.0


# --- measuring a CPU ------------------------------------------------------------------------------------


def _best_s(fn, repeat: int = 5, min_s: float = 0.002) -> float:
    """Least seconds per call of ``fn`` over ``repeat`` rounds of at least ``min_s`` each."""
    fn()
    best = math.inf
    for _ in range(repeat):
        calls, start = 0, time.perf_counter()
        while True:
            fn()
            calls += 1
            elapsed = time.perf_counter() - start
            if elapsed >= min_s:
                break
        best = min(best, elapsed / calls)
    return best


def cpu_model() -> str:
    """The CPU as records name it: its kind (``env.cpu_kind``: model name, family and model numbers), or
    the model name alone (``env.cpu_model``) where the kind is unknown."""
    from gnn_ptp.records import _cpu_kind, _cpu_model

    return _cpu_kind() or _cpu_model() or "unknown CPU"


def measure_fresh_alloc(threads: int = 1, log=None) -> dict:
    """What a fresh allocation costs this CPU in one process on ``threads`` threads
    (``fsdp_overheads.measure_fresh``: a fresh buffer filled against a reused one, 1-128 MiB, the
    threshold bisected); about 5 s."""
    from gnn_ptp import fsdp_overheads
    from gnn_ptp.records import now_utc

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = fsdp_overheads.measure_fresh()
    finally:
        torch.set_num_threads(previous)
    out = {"threshold_bytes": got["threshold_bytes"], "ms_per_MiB": got["ms_per_MiB"],
           "rows": got["rows"], "source": f"measured by gnn_ptp.descriptor.measure_fresh_alloc, {threads} "
                                         f"thread(s), torch {torch.__version__}, {now_utc()}"}
    if log:
        log(f"fresh allocations: threshold {got['threshold_bytes']} bytes, {got['ms_per_MiB']:.3f} ms per MiB above it")
    return out


GEMM_LAYOUT_SIZES = (256, 512)
"""Square sizes ``measure_gemm_layouts`` takes the best rate over (a 512^3 nn bf16 GEMM takes 0.2 s on the
fourth kind; 1,024 would take 1.6 s a call)."""


def measure_gemm_layouts(threads: int = 1, sizes=GEMM_LAYOUT_SIZES, log=None) -> dict:
    """This CPU's GEMM rate per dtype (fp32, bf16, fp16) and operand layout (``ops.GEMM_LAYOUTS``: nn,
    nt, tn, tt, a transposed operand being a ``.t()`` view of a contiguous matrix), the best over ``sizes``
    squares with ``threads`` torch threads; about 10 s on a CPU without fast bf16."""
    from gnn_ptp.ops import GEMM_LAYOUTS

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    out: dict[str, dict[str, float]] = {}
    try:
        for dtype, name in ((torch.float32, "fp32"), (torch.bfloat16, "bf16"), (torch.float16, "fp16")):
            best = {layout: 0.0 for layout in GEMM_LAYOUTS if layout}
            for n in sizes:
                plain = (torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype))
                flipped = (torch.randn(n, n).to(dtype).t(), torch.randn(n, n).to(dtype).t())
                for layout in best:
                    a = flipped[0] if layout[0] == "t" else plain[0]
                    b = flipped[1] if layout[1] == "t" else plain[1]
                    s = _best_s(lambda a=a, b=b: torch.mm(a, b), repeat=3, min_s=0.05)
                    best[layout] = max(best[layout], 2 * n ** 3 / s)
            out[name] = best
            if log:
                log(f"gemm {name} by layout: " + ", ".join(f"{k} {v / 1e9:.1f}" for k, v in best.items()) + " GFLOP/s")
    finally:
        torch.set_num_threads(previous)
    return out


def with_gemm_layouts(stored: Descriptor, threads: int = 1, runs: int = 1, log=None) -> Descriptor:
    """``stored`` (this CPU's descriptor) with its per-layout GEMM rates measured now (``runs`` of them:
    the median of each rate), everything else kept as it was measured."""
    from dataclasses import replace

    _check_this_cpu(stored, "its GEMM layouts are measured on the CPU it describes")
    return replace(stored, gemm_layout_flops_per_s=median_layouts(
        [measure_gemm_layouts(threads, log=log) for _ in range(runs)]))


def median_layouts(runs: list[dict]) -> dict:
    """The median of each (dtype, layout) rate over several ``measure_gemm_layouts`` results."""
    import statistics

    runs = [r for r in runs if r]
    if not runs:
        return {}
    return {d: {k: statistics.median(r[d][k] for r in runs) for k in runs[0][d]} for d in runs[0]}


def with_fresh_alloc(stored: Descriptor, threads: int = 1, log=None) -> Descriptor:
    """``stored`` (this CPU's descriptor) with its fresh-allocation cost measured now, everything else
    kept as it was measured."""
    from dataclasses import replace

    _check_this_cpu(stored, "its fresh-allocation cost is measured on the CPU it describes")
    return replace(stored, fresh_alloc=measure_fresh_alloc(threads, log))


FRESH_FROM_GLOO_RANKS = "2"
"""The rank count of a gloo profile's FSDP fresh-buffer figure a descriptor may take as its one-process
cost (``fresh_alloc_from_gloo``): on this project's 2-core VMs two ranks run a core each, as the
one-process measurement does; four share the cores (the second AMD kind: 0.74 ms per MiB against 0.36)."""


def fresh_alloc_from_gloo(stored: Descriptor, log=None) -> Descriptor:
    """``stored`` (a CPU kind's descriptor) with its fresh-allocation cost taken from the FSDP fresh-buffer
    measurement of the gloo profile measured on the same kind (``cpu-gloo-<name>``, ``gnn-ptp
    calibrate-comm --fsdp``): its 2-rank figure, the slowest of two ranks filling fresh buffers at once, each
    on a core of its own. For a kind whose descriptor predates ``measure_fresh_alloc`` and whose machine is
    not at hand; on the Intel kind, measured both ways, the two agree within 2 % (0.257 against 0.252 ms per
    MiB). The source says which it is."""
    from dataclasses import replace

    from gnn_ptp import interconnect

    if stored.kind != "cpu":
        raise UserError(f"hardware descriptor {stored.name!r} is not a CPU's: a GPU has no fresh-allocation cost")
    name = f"cpu-gloo-{stored.name}"
    profile = interconnect.builtin().get(name)
    if profile is None:
        raise UserError(f"--fresh-from-gloo {stored.name}: no shipped gloo profile {name!r} measured on that "
                        "CPU kind (gnn-ptp calibrate-comm --fsdp there)")
    fresh = (profile.fsdp.get(FRESH_FROM_GLOO_RANKS) or {}).get("fresh") or {}
    if fresh.get("threshold_bytes") is None or not fresh.get("ms_per_MiB", 0) > 0:
        raise UserError(f"--fresh-from-gloo {stored.name}: gloo profile {name!r} has no "
                        f"{FRESH_FROM_GLOO_RANKS}-rank fresh-buffer figure (calibrate-comm --fsdp measures it)")
    env = profile.env or {}
    out = {"threshold_bytes": fresh["threshold_bytes"], "ms_per_MiB": fresh["ms_per_MiB"],
           "rows": fresh.get("rows", []),
           "source": f"the {FRESH_FROM_GLOO_RANKS}-rank FSDP fresh-buffer figure of gloo profile {name} "
                     f"(gnn-ptp calibrate-comm --fsdp on that kind, torch {env.get('torch', '?')}, "
                     f"{env.get('date', 'date unknown')}), taken as "
                     "the one-process cost by gnn_ptp.descriptor.fresh_alloc_from_gloo"}
    if log:
        log(f"fresh allocations from {name}: threshold {out['threshold_bytes']} bytes, "
            f"{out['ms_per_MiB']:.3f} ms per MiB above it")
    return replace(stored, fresh_alloc=out)


def measure_cpu(threads: int = 1, sizes=(512, 1024, 2048), log=None, probes: bool = True,
                layout_sizes=GEMM_LAYOUT_SIZES) -> Descriptor:
    """This CPU's ceilings with ``threads`` torch threads: the best GEMM rate per dtype over ``sizes``
    (fp32, bf16, fp16 (sizes up to 512 only: CPUs without fp16 GEMM units run it ~100x slower);
    tf32 = fp32), the in-cache element-wise rate, copy bandwidth of a 64 MiB array
    (read + write), the dispatch floor of a one-element add, the cost of a fresh allocation
    (``measure_fresh_alloc``) and the GEMM rate of each operand layout over ``layout_sizes``
    (``measure_gemm_layouts``); with ``probes`` the step-sized probes too (``measure_step_probes``). About
    30 s on one core."""
    log = log or (lambda msg: None)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        gemm = {}
        for dtype, name in ((torch.float32, "fp32"), (torch.bfloat16, "bf16"), (torch.float16, "fp16")):
            best = 0.0
            for n in (sizes if name != "fp16" else [n for n in sizes if n <= 512] or sizes[:1]):
                a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
                best = max(best, 2 * n ** 3 / _best_s(lambda: torch.mm(a, b), repeat=3, min_s=0.05))
            gemm[name] = best
            log(f"gemm {name}: {best / 1e9:.1f} GFLOP/s")
        gemm["tf32"] = gemm["fp32"]
        one = torch.zeros(1)
        floor = _best_s(lambda: torch.add(one, 1.0), repeat=9)
        small = torch.randn(65536)  # 256 kB: in cache, so compute binds, not memory
        out = torch.empty_like(small)
        vector = small.numel() / max(_best_s(lambda: torch.mul(small, 1.0001, out=out)) - floor, 1e-9)
        x = torch.randn(64 * 1024 * 1024 // 4)  # 64 MiB, beyond the caches
        y = torch.empty_like(x)
        bandwidth = 2 * x.numel() * 4 / _best_s(lambda: y.copy_(x), repeat=5, min_s=0.05)
        log(f"vector {vector / 1e9:.2f} GFLOP/s, copy {bandwidth / 1e9:.1f} GB/s, floor {floor * 1e6:.2f} us")
    finally:
        torch.set_num_threads(previous)
    from gnn_ptp.records import now_utc

    model = cpu_model()
    step_probes = measure_step_probes(threads, log) if probes else {}
    fresh = measure_fresh_alloc(threads, log)
    layouts = measure_gemm_layouts(threads, layout_sizes, log=log)
    return Descriptor(stored_name(model), "cpu", gemm, vector, bandwidth, floor, f"{model}, {threads} thread(s)",
                      f"measured by gnn_ptp.descriptor.measure_cpu, {threads} thread(s), torch "
                      f"{torch.__version__}, {now_utc()}", measured=True, curves="cpu",
                      extra={"cpu_model": model, "threads": threads}, step_probe_s=step_probes,
                      probe_suite=PROBE_SUITE if probes else "", fresh_alloc=fresh,
                      gemm_layout_flops_per_s=layouts)


def median_of(runs: list[Descriptor]) -> Descriptor:
    """One descriptor of several measurements of the same CPU (``measure_cpu`` run after run): the median
    of each rate, of each step probe's seconds and of the fresh-allocation threshold and cost (its rows are
    the median run's); each run's ceilings are kept in ``extra["runs"]``. A shared VM drifts between runs
    by several percent and a burst of load can land in one run, so a kind scored with a descriptor it
    never trained on takes the median of three rather than whichever run came first."""
    import statistics
    from dataclasses import replace

    if not runs:
        raise UserError("median_of: no measurement to take the median of")
    names = {d.name for d in runs}
    if len(names) != 1 or any(d.kind != "cpu" for d in runs):
        raise UserError(f"median_of: the runs must be one CPU kind's; got {', '.join(sorted(names))}")
    if len(runs) == 1:
        return runs[0]
    med = statistics.median
    first = runs[0]
    probes = {group: {probe: med(d.step_probe_s[group][probe] for d in runs)
                      for probe in first.step_probe_s[group]} for group in first.step_probe_s}
    fresh = dict(first.fresh_alloc)
    costed = [d.fresh_alloc for d in runs if d.fresh_alloc.get("threshold_bytes") is not None]
    if len(costed) > len(runs) // 2:  # most runs found a threshold: the median one's rows and source
        middle = sorted(costed, key=lambda f: f["ms_per_MiB"])[(len(costed) - 1) // 2]
        fresh = {**middle, "threshold_bytes": med(f["threshold_bytes"] for f in costed),
                 "ms_per_MiB": med(f["ms_per_MiB"] for f in costed)}
    elif any(d.fresh_alloc for d in runs):
        fresh = next(d.fresh_alloc for d in runs if d.fresh_alloc.get("threshold_bytes") is None)
    each = [{"gemm_flops_per_s": d.gemm_flops_per_s, "vector_flops_per_s": d.vector_flops_per_s,
             "memory_bandwidth_Bps": d.memory_bandwidth_Bps, "launch_floor_s": d.launch_floor_s,
             "fresh_ms_per_MiB": d.fresh_alloc.get("ms_per_MiB"), "source": d.source} for d in runs]
    return replace(first, gemm_flops_per_s={k: med(d.gemm_flops_per_s[k] for d in runs) for k in first.gemm_flops_per_s},
                   vector_flops_per_s=med(d.vector_flops_per_s for d in runs),
                   memory_bandwidth_Bps=med(d.memory_bandwidth_Bps for d in runs),
                   launch_floor_s=med(d.launch_floor_s for d in runs), step_probe_s=probes, fresh_alloc=fresh,
                   gemm_layout_flops_per_s=median_layouts([d.gemm_layout_flops_per_s for d in runs]),
                   source=f"median of {len(runs)} runs of gnn_ptp.descriptor.measure_cpu (the first: {first.source})",
                   extra={**first.extra, "runs": each})


def with_step_probes(stored: Descriptor, threads: int = 1, log=None, runs: int = 1) -> Descriptor:
    """``stored`` (this CPU's descriptor) with step-sized probes measured now (``runs`` times: each probe's
    median, as ``median_of`` takes them), its ceilings kept as they were measured (so results computed from
    them stay reproducible); the source says when each was."""
    import statistics
    from dataclasses import replace

    from gnn_ptp.records import now_utc

    _check_this_cpu(stored, "step probes are measured on the CPU they describe")
    each = [measure_step_probes(threads, log) for _ in range(runs)]
    probes = {group: {probe: statistics.median(run[group][probe] for run in each) for probe in each[0][group]}
              for group in each[0]}
    source = stored.source.split("; step probes")[0]
    times = f"the median of {runs} runs, " if runs > 1 else ""
    return replace(stored, step_probe_s=probes, probe_suite=PROBE_SUITE,
                   source=f"{source}; step probes ({PROBE_SUITE}) measured {times}{threads} thread(s), torch "
                          f"{torch.__version__}, {now_utc()}")


def _probe_suite(dtype: torch.dtype) -> dict[str, dict[str, tuple]]:
    """The step-sized probes of one dtype: per group, per probe name, (forward function, its inputs).
    Kernels of the CPU grid's training steps (``training/grids/cpu.toml``), whose GEMM-like kernels
    spread their time over 1e5-1e9 FLOPs each (most in convolutions of 1e5-1e7): transformer linears of
    64-512 wide at 128-2,048 tokens, 3x3 convolutions from a 3-channel stem to 128 channels at 8-32
    pixels, MobileNet-like depthwise ones, attention score matmuls; GELU, a scaled residual add, layer
    norm and softmax on activations of the same sizes."""
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(0)

    def t(*shape):
        return torch.randn(*shape, generator=g).to(dtype).requires_grad_(True)

    def linear(tokens, n_in, n_out):
        x, w = t(tokens, n_in), t(n_out, n_in)
        return f"linear {tokens}x{n_in}x{n_out}", (lambda: F.linear(x, w), (x, w))

    def conv(batch, c_in, c_out, pixels):
        x, w = t(batch, c_in, pixels, pixels), t(c_out, c_in, 3, 3)
        return f"conv3x3 {batch}x{c_in}x{c_out}x{pixels}", (lambda: F.conv2d(x, w, padding=1), (x, w))

    def depthwise(batch, channels, pixels):
        x, w = t(batch, channels, pixels, pixels), t(channels, 1, 3, 3)
        return (f"depthwise3x3 {batch}x{channels}x{pixels}",
                (lambda: F.conv2d(x, w, padding=1, groups=channels), (x, w)))

    def scores(heads, tokens, width):
        q, k = t(heads, tokens, width), t(heads, width, tokens)
        return f"bmm {heads}x{tokens}x{width}", (lambda: torch.bmm(q, k), (q, k))

    a, ln_w, ln_b, s, b = t(2048, 512), t(512), t(512), t(32, 128, 128), t(256, 128)
    gemm = dict([linear(2048, 128, 512), linear(512, 128, 128), linear(128, 128, 128), linear(256, 64, 64),
                 conv(4, 3, 64, 32), conv(2, 16, 16, 32), conv(2, 16, 16, 16), conv(8, 64, 64, 16),
                 conv(2, 64, 64, 8), conv(8, 128, 128, 8), depthwise(2, 32, 16), depthwise(8, 96, 16),
                 depthwise(16, 32, 32), scores(32, 128, 32), scores(8, 64, 32)])
    other = {"gelu 2048x512": (lambda: F.gelu(a), (a,)), "scale-add 2048x512": (lambda: a * 1.5 + a, (a,)),
             "layer_norm 2048x512": (lambda: F.layer_norm(a, (512,), ln_w, ln_b), (a, ln_w, ln_b)),
             "softmax 32x128x128": (lambda: torch.softmax(s, -1), (s,)),
             "gelu-add 256x128": (lambda: F.gelu(b) + b, (b,))}
    return {"gemm": gemm, "non-gemm": other}


def measure_step_probes(threads: int = 1, log=None, passes: int = 5) -> dict[str, dict[str, float]]:
    """Seconds of each of ``_probe_suite``'s kernels, forward + backward (``torch.autograd.grad``, as a
    training step runs them: eager, one kernel after another), by group ("gemm fp32", "gemm bf16",
    "non-gemm fp32", "non-gemm bf16") and probe; each the best of ``passes`` passes over the whole suite
    (a burst of load on a shared VM lands in one pass, not in every probe's rounds) of 3 rounds each.
    About 8 s on one core."""
    log = log or (lambda msg: None)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    out: dict[str, dict[str, float]] = {}
    try:
        suites = {name: _probe_suite(dtype) for dtype, name in ((torch.float32, "fp32"), (torch.bfloat16, "bf16"))}
        for _ in range(passes):
            for name, suite in suites.items():
                for group, probes in suite.items():
                    seconds = out.setdefault(f"{group} {name}", {})
                    for probe, (forward, inputs) in probes.items():
                        def step(forward=forward, inputs=inputs):
                            y = forward()
                            torch.autograd.grad(y, inputs, torch.ones_like(y))
                        seconds[probe] = min(seconds.get(probe, math.inf), _best_s(step, repeat=3, min_s=0.01))
        for group, seconds in out.items():
            log(f"step probes {group}: {len(seconds)} probes, {sum(seconds.values()) * 1e3:.2f} ms")
    finally:
        torch.set_num_threads(previous)
    return out


def write(descriptor: Descriptor, folder: Path | None = None) -> Path:
    from gnn_ptp.store import atomic_write_json

    folder = Path(folder or DESCRIPTOR_DIR)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{descriptor.name}.json"
    atomic_write_json(descriptor.to_dict(), path)
    _stored_cpus.cache_clear()
    return path


def main(argv=None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m gnn_ptp.descriptor",
                                description="Show the hardware descriptors, or measure this CPU's.")
    p.add_argument("--measure", action="store_true", help="measure this CPU (pin it: taskset -c N)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--runs", type=int, default=1,
                   help="with --measure: measure this many times and keep the median of each rate and probe "
                        "(a noisy VM; each run about 30 s to 5 min)")
    p.add_argument("--probes", action="store_true",
                   help="measure only the step-sized probes and add them to this CPU's stored descriptor, "
                        "keeping its ceilings (a kind measured before the probes existed)")
    p.add_argument("--fresh", action="store_true",
                   help="measure only what a fresh allocation costs (page faults above the allocator's mmap "
                        "threshold) and add it to this CPU's stored descriptor, keeping the rest")
    p.add_argument("--layouts", action="store_true",
                   help="measure only the GEMM rate of each operand layout (nn, nt, tn, tt) and add it to this "
                        "CPU's stored descriptor, keeping the rest (with --runs N: the median of N)")
    p.add_argument("--depthwise-probes", action="store_true",
                   help="measure only depthwise convolutions of a grid of shapes with a channels-last input "
                        "(gnn_ptp/depthwise_table.py, about 3 minutes on one thread) and add them to this CPU's "
                        "stored descriptor, keeping the rest")
    p.add_argument("--fresh-from-gloo", metavar="NAME",
                   help="give stored CPU descriptor NAME the fresh-allocation cost its kind's shipped gloo "
                        "profile measured (cpu-gloo-NAME, the 2-rank FSDP fresh-buffer figure): for a kind "
                        "measured before --fresh existed, off its machine")
    p.add_argument("--write", action="store_true", help=f"store the measurement in {DESCRIPTOR_DIR}/")
    args = p.parse_args(argv)

    def show(d: Descriptor) -> int:  # print a measured or amended descriptor, store it with --write
        print(json.dumps(d.to_dict(), indent=1))
        if args.write:
            print(f"written to {write(d)}", file=sys.stderr)
        return 0

    if args.write and not (args.measure or args.probes or args.fresh or args.layouts or args.depthwise_probes
                           or args.fresh_from_gloo):
        print("python -m gnn_ptp.descriptor: error: --write needs --measure, --probes, --fresh, --layouts, "
              "--depthwise-probes or --fresh-from-gloo", file=sys.stderr)
        return 2
    if args.runs < 1 or (args.runs > 1 and not (args.measure or args.layouts or args.probes)):
        print(f"python -m gnn_ptp.descriptor: error: --runs {args.runs}: a whole number >= 1, and more than 1 "
              "only with --measure, --probes or --layouts", file=sys.stderr)
        return 2
    if args.fresh_from_gloo and (args.measure or args.probes or args.fresh or args.layouts or args.depthwise_probes):
        print("python -m gnn_ptp.descriptor: error: --fresh-from-gloo takes a stored kind's figure and measures "
              "nothing: give it without --measure, --probes, --fresh, --layouts or --depthwise-probes",
              file=sys.stderr)
        return 2
    if args.fresh_from_gloo:
        stored = stored_cpus().get(args.fresh_from_gloo)
        if stored is None:
            print(f"python -m gnn_ptp.descriptor: error: --fresh-from-gloo {args.fresh_from_gloo}: no stored CPU "
                  f"descriptor of that name in {DESCRIPTOR_DIR}/ (stored: {', '.join(sorted(stored_cpus()))})",
                  file=sys.stderr)
            return 2
        try:
            d = fresh_alloc_from_gloo(stored, log=lambda m: print(m, file=sys.stderr))
        except UserError as e:
            print(f"python -m gnn_ptp.descriptor: error: {e}", file=sys.stderr)
            return 2
        return show(d)
    if args.probes or args.fresh or args.layouts or args.depthwise_probes:
        name = stored_name(cpu_model())
        stored = stored_cpus().get(name)
        flag = ("--probes" if args.probes else "--fresh" if args.fresh else "--layouts" if args.layouts
                else "--depthwise-probes")
        if stored is None:
            print(f"python -m gnn_ptp.descriptor: error: {flag}: no stored descriptor {name!r} for this CPU "
                  f"in {DESCRIPTOR_DIR}/; measure it whole: --measure --write", file=sys.stderr)
            return 2
        log = lambda m: print(m, file=sys.stderr)  # noqa: E731
        d = with_step_probes(stored, args.threads, log=log, runs=args.runs) if args.probes else stored
        d = with_fresh_alloc(d, args.threads, log=log) if args.fresh else d
        d = with_gemm_layouts(d, args.threads, args.runs, log=log) if args.layouts else d
        if args.depthwise_probes:
            from dataclasses import replace

            from gnn_ptp import depthwise_table

            d = replace(d, depthwise_probe_s=tuple(depthwise_table.measure(threads=args.threads, log=log)),
                        extra={**d.extra, "depthwise_probes": depthwise_table.provenance(args.threads)})
        return show(d)
    if args.measure and args.write and slug(cpu_model()) in SAME_KIND:
        name = stored_name(cpu_model())
        print(f"python -m gnn_ptp.descriptor: error: --measure --write: this CPU ({cpu_model()}) is stored as "
              f"{name!r}, measured under its earlier name; the shipped prior and checkpoint were fitted with "
              "those ceilings, so they are not replaced: add what it lacks with --probes, --fresh or --layouts "
              "(or --measure without --write to compare)", file=sys.stderr)
        return 2
    if args.measure:
        runs = []
        for i in range(args.runs):
            if args.runs > 1:
                print(f"run {i + 1} of {args.runs}", file=sys.stderr)
            runs.append(measure_cpu(args.threads, log=lambda m: print(m, file=sys.stderr)))
        return show(median_of(runs))
    rows = [*GPU_DESCRIPTORS.values(), *stored_cpus().values()]
    w = max(len(d.name) for d in rows) + 2
    print(f"{'name':<{w}}{'kind':<5}{'fp32':>10}{'bf16':>10}{'vector':>10}{'GB/s':>9}{'floor us':>9}  "
          f"{'step probes':<14}  source")
    for d in rows:
        rates = "".join(f"{r / 1e12:>9.3g}T" for r in (d.gemm_flops_per_s["fp32"], d.gemm_flops_per_s["bf16"],
                                                        d.vector_flops_per_s))
        print(f"{d.name:<{w}}{d.kind:<5}{rates}{d.memory_bandwidth_Bps / 1e9:>9.1f}{d.launch_floor_s * 1e6:>9.2f}  "
              f"{d.probe_suite or 'none':<14}  {d.source}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
