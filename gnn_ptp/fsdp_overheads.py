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


def fit(rows: list[dict], profile, gpus: int) -> dict:
    """Overheads (``fsdp.Overheads`` fields) that close the gap between the schedule without overheads and
    the measured FSDP steps of ``rows`` at ``gpus`` ranks of ``profile``, with each stack's residuals."""
    from gnn_ptp import fsdp

    slowdown = profile.compute_slowdown(gpus)
    fabric = profile.level(gpus)
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
        missed = {"forward": r["fsdp"]["forward_ms"] - plain["forward_ms"] - ag - copy,
                  "backward": r["fsdp"]["backward_ms"] - plain["backward_ms"] - ag - rs - 2 * copy,
                  "optimizer": r["fsdp"]["optimizer_ms"] - plain["optimizer_ms"] / gpus}
        count = {"forward": units, "backward": units, "optimizer": r["tensors"]}
        for k in sums:
            sums[k][0] += missed[k] * count[k]
            sums[k][1] += count[k] ** 2
        residuals.append({"blocks": r["blocks"], "width": r["width"], **{f"{k}_missed_ms": v for k, v in missed.items()}})
    est = {k: max(0.0, a / b) if b else 0.0 for k, (a, b) in sums.items()}
    return {"unit_forward_ms": est["forward"], "unit_backward_ms": est["backward"],
            "optimizer_tensor_ms": est["optimizer"], "stacks": residuals, "gpus": gpus}
