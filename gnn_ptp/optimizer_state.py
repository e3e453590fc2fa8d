"""How many of an optimizer's state elements are exactly zero when a record's timed steps end.

A step's optimizer time on a CPU depends on the values it runs on, not only on their shapes: torch's fp32
``sqrt`` on a CPU takes 5-6x as long per element on zeros as on normal numbers (measured on the first AMD
kind's machine type, 4 M elements, one thread: 0.43 ns per element on values in [0.5, 1.5], 2.53 on zeros,
15.6 on subnormals; ``rsqrt`` and bf16 show none of it, flush-to-zero leaves zeros as slow;
``benchmarks/zero_sqrt.py``; in AdamW's step 3.9 ns per zero moment in fp32, README *Zeros in the optimizer
state*).
AdamW takes the square root of ``exp_avg_sq`` every step, and an element stays exactly zero for as long as
its gradient has been exactly zero: embedding rows the batch never touches, units a ReLU keeps dead, the
layers before a batch norm over two values (ResNet-18 at 32x32 and batch 2: 7.05 of its 11.7 M moments are
zero and its optimizer phase runs 2.5x as long as at 64x64). On a GPU it is expected not to matter (a
fused or foreach kernel of hardware square roots), not yet measured: GPU records carry the count too.

So the collector stores, per record, each state tensor kind's element count and its zeros at the end of
the timed steps (``record["optimizer_state"]``, e.g. ``{"exp_avg_sq": {"elements": 11689512, "zeros":
7051607}}``): a measured covariate of the optimizer phase that no trace can know, as the host probe is
of the host. One pass over the state (a chunked count, no copy of it), after the timing.
"""

from __future__ import annotations

import torch

CHUNK = 1 << 24  # elements per count: at most 16 MB of temporaries


def zero_counts(optimizer: torch.optim.Optimizer | None) -> dict[str, dict[str, int]]:
    """Per state key (``exp_avg``, ``exp_avg_sq``, ``momentum_buffer``...) the number of floating-point
    elements over every parameter's state and how many are exactly zero; scalars (``step``) are left out.
    A sharded tensor (FSDP2's DTensor) counts its local shard."""
    out: dict[str, dict[str, int]] = {}
    if optimizer is None:
        return out
    for state in optimizer.state.values():
        for name, t in state.items():
            if not isinstance(t, torch.Tensor):
                continue
            local = t.to_local() if hasattr(t, "to_local") else t
            if not local.is_floating_point() or local.dim() == 0:
                continue
            cell = out.setdefault(name, {"elements": 0, "zeros": 0})
            cell["elements"] += local.numel()
            cell["zeros"] += _zeros(local)
    return dict(sorted(out.items()))


def _zeros(t: torch.Tensor) -> int:
    """Exact zeros of ``t``, counted in chunks of ``CHUNK`` elements: a comparison's boolean temporary of a
    13 B-parameter model's moments would be 13 GB on a GPU whose step just fit."""
    flat = t.reshape(-1)
    return t.numel() - sum(int(torch.count_nonzero(part)) for part in flat.split(CHUNK))


def zero_fraction(record: dict, name: str = "exp_avg_sq") -> float | None:
    """A record's fraction of zero ``name`` elements (None where the record has no count of it)."""
    cell = (record.get("optimizer_state") or {}).get(name)
    if not cell or not cell.get("elements"):
        return None
    return cell["zeros"] / cell["elements"]
