"""FSDP2's host overheads on a machine, measured on synthetic stacks (``gnn-ptp calibrate-comm --fsdp``).

The FSDP schedule (gnn_ptp/fsdp.py) counts compute, all-gathers, reduce-scatters and flat-buffer copies.
FSDP2 also runs hooks per wrapped unit, keeps its parameters as DTensors (the optimizer steps each through
DTensor dispatch) and waits on its collectives from the compute thread. On GPUs that host work runs ahead
of the kernels; where ranks share CPU cores (gloo) it is on the critical path. This module measures it on
models of no interest to any user (stacks of K alike MLP blocks, each ``fully_shard``ed, then the root)
so that the schedule can be checked against real FSDP steps it was never fitted on:

1. inside a gloo world of p ranks, each stack runs 3 warm-up and ``steps`` timed FSDP2 steps (forward,
   backward, optimizer timed apart; medians; the slowest rank's), and the same stack unsharded on rank 0
   alone (the others wait);
2. the schedule predicts each FSDP step from the unsharded phases, the profile's compute slowdown, its
   measured collectives and copies, with no overheads; what it misses per unit (forward, backward) and per
   parameter tensor (optimizer) is fitted by least squares through the origin over the stacks.

It also measures what a *fresh* buffer costs (``measure_fresh``): FSDP2 allocates its flat all-gather
output and its reduce-scatter input anew at every call. CPU allocators hand small buffers back from the
heap, but glibc maps every allocation above its mmap threshold (32 MiB at most) from the kernel and
unmaps it on free, so each such buffer is page-faulted in again, on the compute thread (on this project's
VM about 0.36 ms per MiB: a ResNet-18 unit's 45 MiB gather costs 16 ms more than the collective timed on
a reused buffer). Each rank allocates and fills buffers of a range of sizes, all ranks at once, against
the same fill of a reused buffer; the threshold is found by bisection and the cost above it fitted per MiB.
"""

from __future__ import annotations

import statistics
import time

STACKS = ((2, 256), (6, 256), (4, 128))
"""(blocks, width) of the synthetic stacks: blocks Linear(w, 4w) -> GELU -> Linear(4w, w), a root Linear."""
BATCH = 8


def _stack(blocks: int, width: int):
    import torch

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.up, self.down = torch.nn.Linear(width, 4 * width), torch.nn.Linear(4 * width, width)

        def forward(self, x):
            return x + self.down(torch.nn.functional.gelu(self.up(x)))

    class Stack(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.head = torch.nn.Linear(width, width)
            self.layers = torch.nn.ModuleList(Block() for _ in range(blocks))

        def forward(self, x):
            x = self.head(x)
            for layer in self.layers:
                x = layer(x)
            return x

    return Stack()


def _time_phases(model, steps: int) -> dict:
    import torch

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(BATCH, model.head.in_features)
    phases = {"forward_ms": [], "backward_ms": [], "optimizer_ms": []}
    for i in range(3 + steps):
        t0 = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss = model(x).square().mean()
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        optimizer.step()
        t3 = time.perf_counter()
        if i >= 3:
            for k, v in zip(phases, (t1 - t0, t2 - t1, t3 - t2)):
                phases[k].append(v * 1e3)
    return {k: statistics.median(v) for k, v in phases.items()}


def measure(steps: int = 15) -> list[dict]:
    """In the current gloo process group: every synthetic stack's FSDP2 phases (slowest rank) and its
    unsharded phases on rank 0 alone. Every rank returns the same rows."""
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    from gnn_ptp.fsdp import find_blocks

    def agree(values: dict) -> dict:
        t = torch.tensor(list(values.values()), dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return dict(zip(values, t.tolist()))

    rows = []
    for blocks, width in STACKS:
        torch.manual_seed(0)
        plain = {"forward_ms": 0.0, "backward_ms": 0.0, "optimizer_ms": 0.0}
        dist.barrier()
        if dist.get_rank() == 0:
            plain = _time_phases(_stack(blocks, width), steps)
        dist.barrier()
        plain = agree(plain)
        model = _stack(blocks, width)
        found = find_blocks(model)
        for block in model.layers:
            fully_shard(block, reshard_after_forward=True)
        fully_shard(model, reshard_after_forward=True)
        dist.barrier()
        sharded = agree(_time_phases(model, steps))
        rows.append({"blocks": blocks, "width": width, "block_params": found.block_params,
                     "root_params": found.root_params, "tensors": found.tensors, "plain": plain, "fsdp": sharded})
    return rows


FRESH_SIZES_MIB = (1, 2, 4, 8, 16, 32, 64, 128)
MIN_FRESH_MS_PER_MIB = 0.01
"""Below 10 us per MiB (a fresh buffer as cheap as a 100 GB/s write) there is nothing to model."""


def _fresh_extra_ms(nbytes: int, agree, reps: int = 9) -> float:
    """Median extra ms of filling a freshly allocated buffer of ``nbytes`` over filling a reused one, the
    slowest rank's (all ranks at once)."""
    import torch
    import torch.distributed as dist

    numel = max(1, nbytes // 4)
    reused = torch.empty(numel)

    def timed(fn) -> float:
        fn()
        fn()
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return statistics.median(times) * 1e3

    if _in_group():
        dist.barrier()
    fresh = timed(lambda: torch.empty(numel).fill_(1.0))
    plain = timed(lambda: reused.fill_(1.0))
    return agree({"extra": fresh - plain})["extra"]


def _in_group() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def measure_fresh(sizes_mib=FRESH_SIZES_MIB, bisect_steps: int = 7) -> dict:
    """The extra cost of a fresh buffer over a reused one, by size: in a process group every rank at once
    (each returns the slowest rank's), else in this process alone (what a training step's kernels pay for
    their fresh outputs: ``descriptor.measure_fresh_alloc``); where the cost jumps (an allocator's mmap
    threshold) the threshold is bisected. Returns ``{"rows": [{"bytes", "extra_ms"}], "threshold_bytes",
    "ms_per_MiB"}`` (threshold None and rate 0 where no size is costly)."""
    import torch
    import torch.distributed as dist

    def agree(values: dict) -> dict:
        if not _in_group():
            return values
        t = torch.tensor(list(values.values()), dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return dict(zip(values, t.tolist()))

    rows = [{"bytes": int(m * 2 ** 20), "extra_ms": _fresh_extra_ms(int(m * 2 ** 20), agree)} for m in sizes_mib]
    largest = rows[-1]
    rate = largest["extra_ms"] / (largest["bytes"] / 2 ** 20)  # ms per MiB at the largest size

    def costly(row) -> bool:  # at least half the per-MiB cost of the largest buffer
        return row["extra_ms"] / (row["bytes"] / 2 ** 20) >= rate / 2

    if rate < MIN_FRESH_MS_PER_MIB or not costly(largest):
        return {"rows": rows, "threshold_bytes": None, "ms_per_MiB": 0.0}
    first = next(i for i, r in enumerate(rows) if costly(r) and all(costly(x) for x in rows[i:]))
    if first == 0:
        threshold = 0
    else:
        lo, hi = rows[first - 1]["bytes"], rows[first]["bytes"]  # cheap at lo, costly at hi
        for _ in range(bisect_steps):
            mid = (lo + hi) // 2 // 4096 * 4096
            if mid in (lo, hi):
                break
            row = {"bytes": mid, "extra_ms": _fresh_extra_ms(mid, agree)}
            rows.append(row)
            lo, hi = (lo, mid) if costly(row) else (mid, hi)
        threshold = lo
    above = [r for r in rows if r["bytes"] > threshold]
    per_mib = sum(r["extra_ms"] for r in above) / sum(r["bytes"] / 2 ** 20 for r in above)
    return {"rows": sorted(rows, key=lambda r: r["bytes"]), "threshold_bytes": threshold, "ms_per_MiB": per_mib}


def fit(rows: list[dict], profile, gpus: int, fresh: dict | None = None) -> dict:
    """Overheads (``fsdp.Overheads`` fields) that close the gap between the schedule without overheads and
    the measured FSDP steps of ``rows`` at ``gpus`` ranks of ``profile``, with each stack's residuals;
    ``fresh`` (``measure_fresh``'s result at these ranks), where given, is priced first and kept."""
    from gnn_ptp import fsdp

    fresh = fresh or {}
    priced = fsdp.Overheads(fresh_threshold_bytes=fresh.get("threshold_bytes"),
                            fresh_ms_per_MiB=fresh.get("ms_per_MiB", 0.0))

    slowdown = profile.compute_slowdown(gpus)
    profile.level(gpus)  # a world size the interconnect cannot hold is refused here
    sums = {"forward": [0.0, 0.0], "backward": [0.0, 0.0], "optimizer": [0.0, 0.0]}
    residuals = []
    for r in rows:
        blocks = fsdp.Blocks(r["block_params"], r["root_params"], "layers", r["tensors"])
        plain = {k: v * slowdown for k, v in r["plain"].items()}
        units = blocks.units
        per_unit = [u for u in [blocks.root_params] + blocks.block_params if u > 0]
        ag = sum(profile.collective_us("all_gather", u * 4, gpus)[0] for u in per_unit) / 1e3
        rs = sum(profile.collective_us("reduce_scatter", u * 4, gpus)[0] for u in per_unit) / 1e3
        copy = sum(profile.bucket_copy_ms(u * 4, gpus) for u in per_unit)  # one tensor in and out
        # the schedule on gloo (no overlap) puts a gather before each unit's forward and backward, a
        # reduce-scatter after its backward, and the copies on the compute thread: by phase
        fresh_fwd = sum(priced.fresh_ms(u * 4) for u in per_unit)
        fresh_bwd = sum(2 * priced.fresh_ms(u * 4) + priced.fresh_ms(u * 4 / gpus) for u in per_unit)
        missed = {"forward": r["fsdp"]["forward_ms"] - plain["forward_ms"] - ag - copy - fresh_fwd,
                  "backward": r["fsdp"]["backward_ms"] - plain["backward_ms"] - ag - rs - 2 * copy - fresh_bwd,
                  "optimizer": r["fsdp"]["optimizer_ms"] - plain["optimizer_ms"] / gpus}
        count = {"forward": units, "backward": units, "optimizer": r["tensors"]}
        for k in sums:
            sums[k][0] += missed[k] * count[k]
            sums[k][1] += count[k] ** 2
        residuals.append({"blocks": r["blocks"], "width": r["width"], **{f"{k}_missed_ms": v for k, v in missed.items()}})
    est = {k: max(0.0, a / b) if b else 0.0 for k, (a, b) in sums.items()}
    out = {"unit_forward_ms": est["forward"], "unit_backward_ms": est["backward"],
           "optimizer_tensor_ms": est["optimizer"], "stacks": residuals, "gpus": gpus}
    if fresh:
        out["fresh"] = fresh
    return out
