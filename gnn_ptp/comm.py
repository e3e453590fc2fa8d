"""The all-reduce head: the communication that multi-GPU DistributedDataParallel (DDP) adds to a step.

Two parts, both plain arithmetic on top of the GNN's per-kernel backward times:

1. ``Fabric``: an alpha-beta model of one NCCL all-reduce of S bytes over p ranks,
   ``t = alpha(p) + 2(p-1)/p * S / busbw``, fitted per fabric to measured ``all_reduce_perf`` times
   (``nccl_allreduce_h100.csv`` beside this file, which names its sources). NCCL switches algorithm
   (ring, tree, NVLS) and protocol with message size, so one line cannot follow the whole curve: the
   H100 fabrics have two, fitted on either side of 16 MiB: a small-message line (latency-lean protocols:
   less latency, less bandwidth) and a bandwidth line (NVLS / Simple: the regime of DDP's 25 MiB buckets
   and of large single-parameter buckets). A message takes the faster of the two, as NCCL's tuner picks
   the fastest (algorithm, protocol) for each size, so time stays continuous and grows with size. Each
   line is fitted minimising the relative error; every third message size from 1 MiB up is held out of
   both fits and its error reported in ``Fabric.fit`` (``python -m gnn_ptp.comm`` prints the table).
   Below 1 MiB nothing is fitted (DDP's smallest bucket is 1 MiB).
2. ``ddp_allreduce``: DDP's overlap of bucketed all-reduces with the rest of the backward pass. The
   step's exposed communication is what the optimizer has to wait for.

Only the world sizes in the CSV are measured (8 GPUs on NVLink, 32 on InfiniBand). For any other p:
- ``busbw`` is held constant: the bus bandwidth of a ring (or NVLS) is set by the per-GPU link, not p;
- ``alpha`` scales with log2(p) / log2(p_measured), as NCCL's tree / NVLS latency does. (A pure ring's
  2(p-1) latency steps would grow linearly, too pessimistic where NCCL picks a tree at scale.)
So 2-7 GPUs on NVLink and 16, 64... GPUs on InfiniBand are extrapolations, and predict says so.
Not modelled: SM contention between NCCL and backward kernels, stragglers, compression hooks.
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import math
from dataclasses import dataclass, field
from importlib import resources

FIRST_BUCKET_BYTES = 1024 * 1024
"""DDP's first bucket (``torch.distributed._DEFAULT_FIRST_BUCKET_BYTES``, 1 MiB)."""
BUCKET_CAP_BYTES = 25 * 1024 * 1024
"""DDP's ``bucket_cap_mb=25`` (DDP's MB are MiB)."""
GPUS_PER_NODE = 8
FIT_RANGE_BYTES = (1 << 20, 1 << 40)
"""Message sizes the lines are fitted to: DDP's 1 MiB first bucket up (a single large parameter, e.g. an
embedding of 128k x 4096 fp32, is a 2 GiB bucket of its own)."""
SPLIT_BYTES = 16 << 20
"""Where the H100 fabrics' measurements are split between the small-message and the bandwidth fit."""
HOLD_OUT_EVERY = 3
"""Every 3rd message size >= 1 MiB (4 MiB, 32 MiB, 256 MiB, 2 GiB, 16 GiB) is kept out of the fit."""
MEASUREMENTS = "nccl_allreduce_h100.csv"


@dataclass(frozen=True)
class FitReport:
    """How well the line reproduces the measurements it was (and was not) fitted to. Errors are relative,
    |predicted / measured - 1|."""

    fit_range_bytes: tuple[int, int]
    fit_rows: int
    held_out_rows: int
    held_out_sizes_bytes: tuple[int, ...]
    held_out_max_rel_err: float
    held_out_mean_rel_err: float
    fit_max_rel_err: float
    """In-sample worst case."""
    max_rel_err_above_1MiB: float
    """All rows >= 1 MiB, fitted, held out, or beyond the fit range."""
    max_rel_err_below_1MiB: float
    """Small messages, where the line is not meant to hold (latency-bound, other NCCL algorithms)."""
    held_out_median_rel_err: float = float("nan")


@dataclass(frozen=True)
class Fabric:
    """One interconnect: an alpha-beta all-reduce model anchored at the world size it was measured at."""

    name: str
    description: str
    alpha_us: float
    """Intercept of the (bandwidth) line at ``measured_gpus`` ranks: fitted on large messages, so above the
    bare latency."""
    busbw_GBps: float
    """NCCL bus bandwidth, GB/s (1e9 B/s); held constant for every p."""
    measured_gpus: int
    """The world size the fit comes from; alpha scales with log2(p) / log2(measured_gpus)."""
    min_gpus: int = 2
    max_gpus: int | None = None
    """Largest world size this fabric serves (None: no limit)."""
    source: str = ""
    fit: FitReport | None = None
    algorithm: str = "ring"
    """What the lines stand for, as ``gnn-ptp comm`` reports it. Each is fitted through whatever NCCL (or
    gloo) chose at each size (ring, tree, NVLS): the measurements cannot separate them."""
    split_bytes: int | None = None
    """Where the measurements were split between the two fits: the small-message line
    (``small_alpha_us``, ``small_busbw_GBps``) was fitted below it, the bandwidth line from it up. A
    message takes whichever line is faster. None: one line for every size."""
    small_alpha_us: float | None = None
    small_busbw_GBps: float | None = None

    def __post_init__(self):
        if not self.alpha_us >= 0:
            raise ValueError(f"Fabric.alpha_us is {self.alpha_us}: must be >= 0")
        if not self.busbw_GBps > 0:
            raise ValueError(f"Fabric.busbw_GBps is {self.busbw_GBps}: must be > 0")
        if self.measured_gpus < 2:
            raise ValueError(f"Fabric.measured_gpus is {self.measured_gpus}: must be >= 2")
        if self.split_bytes is not None and not (
                self.small_alpha_us is not None and self.small_alpha_us >= 0
                and self.small_busbw_GBps is not None and self.small_busbw_GBps > 0):
            raise ValueError(f"Fabric {self.name!r} has split_bytes {self.split_bytes}: small_alpha_us must be "
                             f">= 0 and small_busbw_GBps > 0, got {self.small_alpha_us} and {self.small_busbw_GBps}")

    def alpha_us_at(self, gpus: int, alpha_us: float | None = None) -> float:
        """Latency term at ``gpus`` ranks: alpha * log2(p) / log2(p_measured) (0 for one rank)."""
        alpha = self.alpha_us if alpha_us is None else alpha_us
        return alpha * math.log2(gpus) / math.log2(self.measured_gpus)

    def lines(self) -> list[tuple[str, float, float]]:
        """(name, alpha_us, busbw_GBps) of each fitted line."""
        big = ("bandwidth line" if self.split_bytes is not None else "line", self.alpha_us, self.busbw_GBps)
        if self.split_bytes is None:
            return [big]
        return [("small-message line", self.small_alpha_us, self.small_busbw_GBps), big]

    def _line_us(self, message_bytes: float, gpus: int) -> tuple[float, str]:
        """(time, line name) of the fastest line, as NCCL's tuner takes the fastest algorithm."""
        return min((self.alpha_us_at(gpus, alpha) + 2 * (gpus - 1) / gpus * message_bytes / (busbw * 1e3), name)
                   for name, alpha, busbw in self.lines())

    def allreduce_us(self, message_bytes: float, gpus: int) -> float:
        """Time of one all-reduce of ``message_bytes`` over ``gpus`` ranks (0 for one rank)."""
        if gpus < 1:
            raise ValueError(f"gpus is {gpus}: must be >= 1")
        if gpus == 1 or message_bytes <= 0:
            return 0.0
        return self._line_us(message_bytes, gpus)[0]

    def line_name(self, message_bytes: float, gpus: int) -> str:
        """Which line answers for this message (``lines()``'s name)."""
        return self._line_us(message_bytes, max(gpus, 2))[1]

    def is_measured(self, gpus: int) -> bool:
        return gpus == self.measured_gpus

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Fabric":
        d = dict(d)
        fit = d.pop("fit", None)
        if fit is not None:
            fit = FitReport(**{**fit, "fit_range_bytes": tuple(fit["fit_range_bytes"]),
                               "held_out_sizes_bytes": tuple(fit["held_out_sizes_bytes"])})
        return cls(**d, fit=fit)


# --- the fit ----------------------------------------------------------------------------------------


def load_measurements() -> list[dict]:
    """Out-of-place rows of the shipped CSV, the source's OUTLIER rows excluded, as dicts of
    ``gpus``, ``message_bytes``, ``time_us``, ``fabric``, ``source``."""
    text = resources.files("gnn_ptp").joinpath(MEASUREMENTS).read_text()
    return [{"gpus": int(r["gpus"]), "message_bytes": int(r["message_bytes"]), "time_us": float(r["time_us"]),
             "fabric": r["fabric"], "source": r["source"]}
            for r in csv.DictReader(text.splitlines())
            if r["variant"] == "out_of_place" and r["note"] != "OUTLIER"]


def _lstsq_relative(sizes: list[float], times: list[float]) -> tuple[float, float]:
    """(a, b) minimising sum(((a + b*S) / t - 1)^2): the 2x2 normal equations of the rows (1/t, S/t)."""
    s11 = sum(1 / t**2 for t in times)
    s12 = sum(s / t**2 for s, t in zip(sizes, times))
    s22 = sum(s * s / t**2 for s, t in zip(sizes, times))
    r1 = sum(1 / t for t in times)
    r2 = sum(s / t for s, t in zip(sizes, times))
    det = s11 * s22 - s12 * s12
    return (r1 * s22 - r2 * s12) / det, (s11 * r2 - s12 * r1) / det


def fit_fabric(name: str, description: str, rows: list[dict], gpus: int, max_gpus: int | None = None,
               fit_range_bytes: tuple[int, int] = FIT_RANGE_BYTES, hold_out_every: int = HOLD_OUT_EVERY,
               algorithm: str = "ring", min_gpus: int = 2, split_bytes: int | None = None) -> Fabric:
    """Fit ``t = alpha + 2(p-1)/p * S / busbw`` to the rows measured at ``gpus`` ranks (all sources pooled),
    holding every ``hold_out_every``-th message size >= the fit range's start out of the fit. With
    ``split_bytes``, two lines: one fitted below it, one from it up (a message then takes the faster)."""
    rows = [r for r in rows if r["gpus"] == gpus]
    lo, hi = fit_range_bytes
    sizes = sorted({r["message_bytes"] for r in rows if r["message_bytes"] >= lo})
    held = set(sizes[hold_out_every - 1::hold_out_every])
    fit_rows = [r for r in rows if lo <= r["message_bytes"] <= hi and r["message_bytes"] not in held]

    def line(selected, what):
        if len({r["message_bytes"] for r in selected}) < 2:
            raise ValueError(f"fabric {name!r}: fewer than 2 message sizes to fit {what} at {gpus} GPUs")
        alpha_us, slope = _lstsq_relative([r["message_bytes"] for r in selected], [r["time_us"] for r in selected])
        if not slope > 0:
            sizes_fit = sorted({r["message_bytes"] for r in selected})
            raise ValueError(f"fabric {name!r}: times at {gpus} ranks do not grow with message size between "
                             f"{format_bytes(sizes_fit[0])} and {format_bytes(sizes_fit[-1])} (latency or noise "
                             "only): no bandwidth to fit")
        return max(alpha_us, 0.0), 2 * (gpus - 1) / gpus / slope / 1e3

    small = {}
    if split_bytes is not None:
        alpha_us, busbw_GBps = line([r for r in fit_rows if r["message_bytes"] >= split_bytes], "from the split")
        small_alpha, small_busbw = line([r for r in fit_rows if r["message_bytes"] < split_bytes],
                                        "below the split")
        small = dict(split_bytes=split_bytes, small_alpha_us=small_alpha, small_busbw_GBps=small_busbw)
    else:
        alpha_us, busbw_GBps = line(fit_rows, "the line")
    fabric = Fabric(name, description, alpha_us, busbw_GBps, gpus, min_gpus=min_gpus, max_gpus=max_gpus,
                    source="; ".join(sorted({r["source"] for r in rows})), algorithm=algorithm, **small)

    def err(selected):
        return [abs(fabric.allreduce_us(r["message_bytes"], gpus) / r["time_us"] - 1) for r in selected] or [0.0]

    held_err = err([r for r in rows if r["message_bytes"] in held])
    report = FitReport(
        fit_range_bytes=(lo, hi), fit_rows=len(fit_rows),
        held_out_rows=sum(r["message_bytes"] in held for r in rows), held_out_sizes_bytes=tuple(sorted(held)),
        held_out_max_rel_err=max(held_err), held_out_mean_rel_err=sum(held_err) / len(held_err),
        held_out_median_rel_err=_median(held_err),
        fit_max_rel_err=max(err(fit_rows)),
        max_rel_err_above_1MiB=max(err([r for r in rows if r["message_bytes"] >= 1 << 20])),
        max_rel_err_below_1MiB=max(err([r for r in rows if r["message_bytes"] < 1 << 20])))
    return dataclasses.replace(fabric, fit=report)


@functools.cache
def fabrics() -> dict[str, Fabric]:
    """The fabrics fitted from the shipped CSV: ``nvlink`` (one node) and ``infiniband`` (8 GPUs a node)."""
    rows = load_measurements()
    return {
        "nvlink": fit_fabric("nvlink", "one node of 8 H100 SXM on NVLink4/NVSwitch (DGX/HGX H100)", rows,
                             gpus=8, max_gpus=GPUS_PER_NODE, algorithm="nccl ring/nvls (fitted lines)",
                             split_bytes=SPLIT_BYTES),
        "infiniband": fit_fabric("infiniband", "nodes of 8 H100 SXM, NVLink4 inside, NDR InfiniBand between "
                                 "(measured on 4 nodes)", rows, gpus=32,
                                 algorithm="nccl hierarchical ring/tree (fitted lines)", split_bytes=SPLIT_BYTES),
    }


FABRIC_HARDWARE = ("h100", "h200")
"""Hardware the fitted fabrics apply to. H200 (HGX) has the same NVLink4/NVSwitch (900 GB/s) and NDR
InfiniBand as H100, so it uses the H100 measurements."""


def fabric_for(hardware: str, gpus: int) -> Fabric | None:
    """NVLink up to 8 GPUs, InfiniBand beyond; None where no fabric is modelled (e.g. ``cpu``: gloo on one
    machine cannot be fitted from NCCL measurements)."""
    if hardware not in FABRIC_HARDWARE:
        return None
    return fabrics()["nvlink" if gpus <= GPUS_PER_NODE else "infiniband"]


# --- DDP overlap ------------------------------------------------------------------------------------


@dataclass
class DDPComm:
    """The all-reduces of one DDP step, in milliseconds."""

    exposed_ms: float
    """End of the last all-reduce minus end of the backward pass (>= 0): what the optimizer waits for."""
    total_ms: float
    """Sum of all all-reduce times (hidden or not)."""
    buckets: int
    backward_ms: float
    fabric: str
    bucket_bytes: list[float] = field(default_factory=list)
    bucket_ready_ms: list[float] = field(default_factory=list)
    """When each bucket's last gradient is ready (ms after the backward starts)."""


def make_buckets(grad_bytes: list[float], ready_ms: list[float], first_bucket_bytes: float = FIRST_BUCKET_BYTES,
                 bucket_cap_bytes: float = BUCKET_CAP_BYTES) -> list[tuple[float, float]]:
    """(bytes, ready_ms) per bucket, as DDP's ``_compute_bucket_assignment_by_size``: gradients join the
    open bucket in the order they become ready (DDP rebuilds its buckets in that order after the first
    step); a bucket closes once it holds >= its cap (1 MiB for the first, 25 MiB after), so one large
    gradient can make a bucket bigger than the cap; what is left at the end is the last bucket."""
    buckets, size, ready, cap = [], 0.0, 0.0, first_bucket_bytes
    for nbytes, t in zip(grad_bytes, ready_ms):
        if nbytes <= 0:
            continue
        size, ready = size + nbytes, max(ready, t)
        if size >= cap:
            buckets.append((size, ready))
            size, cap = 0.0, bucket_cap_bytes
    if size > 0:
        buckets.append((size, ready))
    return buckets


def ddp_allreduce(grad_bytes: list[float], node_ms: list[float], fabric: Fabric, gpus: int,
                  first_bucket_bytes: float = FIRST_BUCKET_BYTES,
                  bucket_cap_bytes: float = BUCKET_CAP_BYTES, overlap: bool = True) -> DDPComm:
    """Exposed all-reduce time of a DDP step from its backward kernels, in execution order.

    ``node_ms[i]`` is kernel i's time and ``grad_bytes[i]`` the parameter-gradient bytes it finalises (in
    the parameter dtype: 4 bytes a parameter under fp32 / tf32 / AMP, 2 under pure bf16). Kernel i's
    gradients are ready when it ends (the running sum of node_ms). Each bucket's all-reduce starts when
    the bucket is ready and the previous all-reduce is done (one NCCL stream), overlapping the rest of
    the backward; the optimizer waits for the last one. ``overlap=False`` (gloo on a CPU whose cores the
    backward already fills: the reduction competes for the same cores) runs every all-reduce after the
    backward, so all of it is exposed."""
    if len(grad_bytes) != len(node_ms):
        raise ValueError(f"grad_bytes has {len(grad_bytes)} entries, node_ms {len(node_ms)}: one per kernel")
    ready_ms = list(_running_sum(node_ms))
    backward_ms = ready_ms[-1] if ready_ms else 0.0
    if gpus == 1:
        return DDPComm(0.0, 0.0, 0, backward_ms, fabric.name)
    buckets = make_buckets(grad_bytes, ready_ms, first_bucket_bytes, bucket_cap_bytes)
    comm_free_ms = total_ms = 0.0
    for nbytes, ready in buckets:
        duration_ms = fabric.allreduce_us(nbytes, gpus) / 1e3
        comm_free_ms = max(comm_free_ms, ready if overlap else backward_ms) + duration_ms
        total_ms += duration_ms
    return DDPComm(max(comm_free_ms - backward_ms, 0.0), total_ms, len(buckets), backward_ms, fabric.name,
                   [b for b, _ in buckets], [r for _, r in buckets])


def ddp_step_comm(phase: list[int], grad_bytes: list[float], fabric: Fabric, gpus: int,
                  node_ms: list[float] | None = None, backward_ms: float | None = None,
                  first_bucket_bytes: float = FIRST_BUCKET_BYTES, bucket_cap_bytes: float = BUCKET_CAP_BYTES,
                  overlap: bool = True, grad_scale: float = 1.0) -> DDPComm:
    """``ddp_allreduce`` on a whole step's graph (nodes in execution order, ``phase`` 1 = backward).

    With per-node times (``node_ms``, every node) the backward nodes' own times are used. Without them
    (a ``pool`` readout predicts phase totals only) every backward kernel gets an equal share of
    ``backward_ms``: gradients become ready uniformly over the backward time, in the traced order.
    Gradient bytes on a non-backward node (none are expected) count as ready at the end of the backward.
    ``grad_scale`` multiplies every gradient's bytes (0.5: an fp16/bf16 compression hook on fp32 grads)."""
    bwd = [i for i, ph in enumerate(phase) if ph == 1]
    if node_ms is not None:
        times = [float(node_ms[i]) for i in bwd]
    elif backward_ms is not None:
        times = [backward_ms / len(bwd)] * len(bwd) if bwd else []
    else:
        raise ValueError("ddp_step_comm needs node_ms (per-node times) or backward_ms (the phase total)")
    nbytes = [float(grad_bytes[i]) * grad_scale for i in bwd]
    late = sum(float(b) for i, b in enumerate(grad_bytes) if phase[i] != 1) * grad_scale
    if late > 0:
        times.append(0.0)
        nbytes.append(late)
    return ddp_allreduce(nbytes, times, fabric, gpus, first_bucket_bytes, bucket_cap_bytes, overlap)


def _median(values: list[float]) -> float:
    v = sorted(values)
    mid = len(v) // 2
    return v[mid] if len(v) % 2 else (v[mid - 1] + v[mid]) / 2


def _running_sum(values):
    total = 0.0
    for v in values:
        total += v
        yield total


SIZE_RANGES_BYTES = ((0, 1 << 20), (1 << 20, 16 << 20), (16 << 20, 256 << 20), (256 << 20, 1 << 30),
                     (1 << 30, 1 << 62))


def error_by_size_range(fabric: Fabric, rows: list[dict]) -> list[dict]:
    """Median and max relative error of ``fabric`` on ``rows`` measured at its world size, per message-size
    range (the line is fitted on 1 MiB - 1 GiB; below that NCCL's latency-bound algorithms take over)."""
    out = []
    for lo, hi in SIZE_RANGES_BYTES:
        sel = [r for r in rows if r["gpus"] == fabric.measured_gpus and lo <= r["message_bytes"] < hi]
        if not sel:
            continue
        errs = [abs(fabric.allreduce_us(r["message_bytes"], r["gpus"]) / r["time_us"] - 1) for r in sel]
        out.append({"range_bytes": (lo, hi), "n": len(sel), "median_rel_err": _median(errs),
                    "max_rel_err": max(errs)})
    return out


def format_bytes(n: float) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:g} {unit}"
    return f"{n:g} B"


def describe_fabric(fabric: Fabric, rows: list[dict]) -> list[str]:
    """A fabric's lines, its held-out error and its error by message-size range on ``rows``, as text lines."""
    out = [f"{name}: alpha {alpha:6.1f} us  busbw {busbw:6.1f} GB/s" for name, alpha, busbw in fabric.lines()]
    if fabric.split_bytes is not None:
        out[0] += f"  (fitted below {format_bytes(fabric.split_bytes)}, the other from there; the faster answers)"
    r = fabric.fit
    if r is not None:
        out.append(f"held-out median {r.held_out_median_rel_err:.1%} max {r.held_out_max_rel_err:.1%} mean "
                   f"{r.held_out_mean_rel_err:.1%} ({r.held_out_rows} rows)  fit max {r.fit_max_rel_err:.1%}  "
                   f">=1MiB max {r.max_rel_err_above_1MiB:.1%}  <1MiB max {r.max_rel_err_below_1MiB:.1%}")
    for e in error_by_size_range(fabric, rows):
        lo, hi = e["range_bytes"]
        top = "" if hi >= 1 << 62 else format_bytes(hi)
        out.append(f"{format_bytes(lo) if lo else '0':>8} - {top:<8} n {e['n']:>3}  median "
                   f"{e['median_rel_err']:6.1%}  max {e['max_rel_err']:6.1%}")
    return out


def fit_table() -> str:
    """The fitted fabrics and their errors (``python -m gnn_ptp.comm``)."""
    lines, rows = [], load_measurements()
    for f in fabrics().values():
        lines.append(f"{f.name}, {f.measured_gpus} GPUs ({f.description})")
        lines += ["    " + line for line in describe_fabric(f, rows)]
    return "\n".join(lines)


if __name__ == "__main__":
    print(fit_table())
