"""Sharded data parallelism (PyTorch FSDP2 ``fully_shard``, ZeRO-3; and ZeRO-2-like without resharding):
its communication schedule and its memory per rank.

Every wrapped block (a model's repeated layers, found as its largest ModuleList of alike modules; the
rest of the parameters form the root block) keeps 1/p of its parameters, gradients and optimizer state.
Per step:

- forward: an all-gather of each block's parameters before it runs; the next block's all-gather is
  issued while the current one computes (one block of prefetch, FSDP2's default), on a stream of its own;
- backward: with ``reshard_after_forward=True`` (``fsdp``) each block's parameters are all-gathered again,
  in reverse order with the same prefetch; without (``fsdp-no-reshard``) they stayed unsharded; after each
  block's backward its gradients are reduce-scattered, overlapping the next block's backward;
- optimizer: on the shard, 1/p of the single-GPU optimizer time.

Collectives run in the parameter dtype (bf16 under pure bf16, fp32 otherwise; ``param_bytes``) and the
reduce dtype (``reduce_bytes``). Times come from the interconnect's all-reduce lines (``comm.Fabric``): a
ring all-reduce is a reduce-scatter followed by an all-gather, so each moves (p - 1)/p of the full tensor
per rank where the all-reduce moves 2 (p - 1)/p, with half its latency term. That split is derived, not
measured: no all-gather or reduce-scatter timings are in the calibration data. Compute per block is the
step's forward and backward time shared out by parameter count (uniform over a stack of alike layers).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

MODES = ("fsdp", "fsdp-no-reshard")


@dataclass
class Blocks:
    """How FSDP wraps a model: parameter counts of the repeated blocks and of the root."""

    block_params: list[int]
    root_params: int
    stack: str | None
    """Path of the ModuleList whose children are the blocks (None: the whole model is one block)."""
    tensors: int = 0
    """Parameter tensors of the whole model (each a sharded DTensor the optimizer steps one by one)."""

    @property
    def units(self) -> int:
        """Wrapped units: the blocks, and the root where it keeps parameters of its own."""
        return len(self.block_params) + (1 if self.root_params or not self.block_params else 0)

    @property
    def total(self) -> int:
        return sum(self.block_params) + self.root_params


@dataclass(frozen=True)
class Overheads:
    """FSDP2's own host costs beyond its collectives and flat-buffer copies, measured by ``gnn-ptp
    calibrate-comm --fsdp`` on synthetic stacks (hooks, DTensor bookkeeping, stream waits). Zero where not
    measured: on GPUs they run ahead of the kernels and hide, except for the smallest models."""

    unit_forward_ms: float = 0.0
    """Per wrapped unit, forward."""
    unit_backward_ms: float = 0.0
    """Per wrapped unit, backward (its gather and its reduce-scatter's bookkeeping)."""
    optimizer_tensor_ms: float = 0.0
    """Per parameter tensor, the optimizer step on a sharded DTensor over the same step on a plain one."""
    fresh_threshold_bytes: float | None = None
    """Buffers larger than this are page-faulted in anew at every allocation (glibc maps them from the
    kernel: its mmap threshold); None: no fresh-buffer cost measured."""
    fresh_ms_per_MiB: float = 0.0
    """What such a buffer costs per MiB on the compute thread, beyond writing it (measured, all ranks at once)."""

    def fresh_ms(self, nbytes: float) -> float:
        """The extra cost of one freshly allocated buffer of ``nbytes`` (FSDP2's flat all-gather output and
        reduce-scatter input are allocated at every call)."""
        if self.fresh_threshold_bytes is None or nbytes <= self.fresh_threshold_bytes:
            return 0.0
        return nbytes / 2 ** 20 * self.fresh_ms_per_MiB

    def to_dict(self) -> dict:
        return {"unit_forward_ms": self.unit_forward_ms, "unit_backward_ms": self.unit_backward_ms,
                "optimizer_tensor_ms": self.optimizer_tensor_ms, "fresh_threshold_bytes": self.fresh_threshold_bytes,
                "fresh_ms_per_MiB": self.fresh_ms_per_MiB}


def find_blocks(model: torch.nn.Module) -> Blocks:
    """The model's largest ModuleList of at least two modules of one class (by parameters): each child is
    wrapped with ``fully_shard``, then the root."""
    best, best_params = None, 0
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) >= 2 \
                and len({type(m) for m in module}) == 1:
            params = sum(p.numel() for p in module.parameters())
            if params > best_params:
                best, best_params = (name, module), params
    total = sum(p.numel() for p in model.parameters())
    tensors = sum(1 for _ in model.parameters())
    if best is None:
        return Blocks([], total, None, tensors)
    name, stack = best
    blocks = [sum(p.numel() for p in m.parameters()) for m in stack]
    return Blocks(blocks, total - sum(blocks), name, tensors)


def collective_us(fabric, kind: str, message_bytes: float, gpus: int) -> float:
    """One all-gather or reduce-scatter of a ``message_bytes`` (unsharded) tensor over ``gpus`` ranks, from
    the fabric's all-reduce lines (see the module docstring); the fastest line answers."""
    if kind not in ("all_gather", "reduce_scatter"):
        raise ValueError(f"kind is {kind!r}: all_gather or reduce_scatter")
    if gpus <= 1 or message_bytes <= 0:
        return 0.0
    return min(fabric.alpha_us_at(gpus, alpha) / 2 + (gpus - 1) / gpus * message_bytes / (busbw * 1e3)
               for _, alpha, busbw in fabric.lines())


@dataclass
class FSDPStep:
    mode: str
    gpus: int
    blocks: int
    compute_ms: float
    """Forward + backward + the sharded optimizer, without communication."""
    allgather_ms: float
    """All-gathers of the step (forward, and backward under ``fsdp``), one after another."""
    reduce_scatter_ms: float
    exposed_ms: float
    """Communication the compute could not hide."""
    iteration_ms: float
    timeline: dict = field(default_factory=dict)

    @property
    def comm_total_ms(self) -> float:
        return self.allgather_ms + self.reduce_scatter_ms


def fsdp_step(forward_ms: float, backward_ms: float, optimizer_ms: float, blocks: Blocks, fabric, gpus: int,
              param_bytes: int, reduce_bytes: int | None = None, mode: str = "fsdp", overlap: bool = True,
              copy_ms=None, collective=None, overheads: "Overheads | None" = None) -> FSDPStep:
    """The step time of FSDP over ``gpus`` ranks of ``fabric``, from one GPU's phase times (each rank runs
    the whole batch it is given: pass the per-rank batch's times). ``overlap=False`` (ranks sharing CPU
    cores, gloo) runs every collective on the compute thread; ``copy_ms(bytes)``, where given, is the cost
    of copying a collective's tensor into and out of its flat buffer, on the compute thread.
    ``collective(kind, bytes) -> us``, where given, times the collectives (an interconnect profile's
    measured all-gather and reduce-scatter: ``Interconnect.collective_us``) instead of ``fabric``'s
    all-reduce split."""
    if mode not in MODES:
        raise ValueError(f"mode is {mode!r}: one of {', '.join(MODES)}")
    reduce_bytes = param_bytes if reduce_bytes is None else reduce_bytes
    units = [blocks.root_params] + blocks.block_params if blocks.root_params else list(blocks.block_params)
    units = [u for u in units if u > 0] or [max(blocks.total, 1)]
    total = float(sum(units))
    ov = overheads or Overheads()
    # FSDP2's fresh flat buffers per unit: the all-gather output (forward, and again in the backward under
    # fsdp), the reduce-scatter's input and output; each costs page faults where the allocator maps it anew
    fresh_fwd = [ov.fresh_ms(u * param_bytes) for u in units]
    fresh_bwd = [(ov.fresh_ms(u * param_bytes) if mode == "fsdp" else 0.0) + ov.fresh_ms(u * reduce_bytes)
                 + ov.fresh_ms(u * reduce_bytes / gpus) for u in units]
    fwd = [forward_ms * u / total + ov.unit_forward_ms + f for u, f in zip(units, fresh_fwd)]
    bwd = [backward_ms * u / total + ov.unit_backward_ms + f for u, f in zip(units, fresh_bwd)]
    host_ms = (len(units) * (ov.unit_forward_ms + ov.unit_backward_ms) + blocks.tensors * ov.optimizer_tensor_ms
               + sum(fresh_fwd) + sum(fresh_bwd))
    if collective is None:
        def collective(kind, nbytes):
            return collective_us(fabric, kind, nbytes, gpus)
    ag = [collective("all_gather", u * param_bytes) / 1e3 for u in units]
    rs = [collective("reduce_scatter", u * reduce_bytes) / 1e3 for u in units]
    copies = 0.0
    if copy_ms is not None:
        copies = sum(copy_ms(u * param_bytes) * (2 if mode == "fsdp" else 1) + copy_ms(u * reduce_bytes)
                     for u in units)
    if not overlap:  # collectives and copies on the compute thread, one after another
        ag_total = sum(ag) * (2 if mode == "fsdp" else 1)
        compute = forward_ms + backward_ms + optimizer_ms / gpus
        exposed = ag_total + sum(rs) + copies + host_ms
        return FSDPStep(mode, gpus, len(blocks.block_params), compute, ag_total, sum(rs), exposed, compute + exposed)

    # forward: the comm stream gathers block i+1 once block i has started computing (one block prefetched)
    n = len(units)
    ready = {0: ag[0]}
    comm_free, compute_end = ag[0], 0.0
    for i in range(n):
        start = max(compute_end, ready[i])
        if i + 1 < n:
            comm_free = max(comm_free, start) + ag[i + 1]
            ready[i + 1] = comm_free
        compute_end = start + fwd[i]
    forward_end = compute_end
    # backward, last block first: gathered again under fsdp (the next one prefetched as one starts), its
    # gradients reduce-scattered on the comm stream once it is done
    order = list(range(n - 1, -1, -1))
    ready = {}
    if mode == "fsdp":
        comm_free = max(comm_free, forward_end) + ag[order[0]]
        ready[order[0]] = comm_free
    for k, i in enumerate(order):
        start = max(compute_end, ready.get(i, 0.0))
        if mode == "fsdp" and k + 1 < n:
            comm_free = max(comm_free, start) + ag[order[k + 1]]
            ready[order[k + 1]] = comm_free
        compute_end = start + bwd[i]
        comm_free = max(comm_free, compute_end) + rs[i]
    backward_end = max(compute_end, comm_free)
    optimizer_sharded = optimizer_ms / gpus
    iteration = backward_end + optimizer_sharded + blocks.tensors * ov.optimizer_tensor_ms
    compute = forward_ms + backward_ms + optimizer_sharded
    ag_total = sum(ag) * (2 if mode == "fsdp" else 1)
    iteration += copies
    return FSDPStep(mode, gpus, len(blocks.block_params), compute, ag_total, sum(rs), iteration - compute, iteration,
                    {"forward_end_ms": forward_end, "backward_end_ms": backward_end})


def memory_per_rank(floor_bytes: float, activation_bytes: float, blocks: Blocks, gpus: int, param_bytes: int,
                    mode: str = "fsdp", optimizer_transient_bytes: float = 0.0) -> float:
    """Peak bytes on one rank, the larger of two moments:

    - forward/backward: the sharded floor (parameters, gradients, optimizer state over ``gpus``) + the
      activations of its own batch (``activation_bytes``) + the unsharded working set: the parameters of
      the unit computing and of the one prefetched (one unit when the model is one unit) and one unit's
      gradients before its reduce-scatter under ``fsdp``; under ``fsdp-no-reshard`` every parameter
      stays gathered after the forward;
    - optimizer: the sharded floor + the single-GPU step's optimizer transients
      (``optimizer_transient_bytes``) over ``gpus``: the step runs on the shard."""
    if mode not in MODES:
        raise ValueError(f"mode is {mode!r}: one of {', '.join(MODES)}")
    largest = max(blocks.block_params + [blocks.root_params, 0])
    in_flight = min(2, blocks.units)
    if mode == "fsdp":
        working = in_flight * largest * param_bytes + largest * param_bytes
    else:
        working = blocks.total * param_bytes * (gpus - 1) / gpus + largest * param_bytes
    compute = floor_bytes / gpus + activation_bytes + working
    return max(compute, floor_bytes / gpus + optimizer_transient_bytes / gpus)


def split_estimate(peak_by_phase: dict, floor_bytes: float) -> tuple[float, float]:
    """(activation bytes, optimizer transient bytes) above the floor, from a single-GPU memory estimate's
    peak per phase (``memory.MemoryEstimate.peak_by_phase``)."""
    compute = max(peak_by_phase.get("forward", 0), peak_by_phase.get("backward", 0))
    return max(0.0, compute - floor_bytes), max(0.0, peak_by_phase.get("optimizer", 0) - floor_bytes)
