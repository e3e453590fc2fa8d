"""How fast the host issues work at the moment a record is timed.

A step of a few milliseconds is host-bound: its time is the host's Python and dispatch cost per kernel,
not the GPU's. On the H200 loans that cost changed from record to record: the same RegNet configuration
took 112, 86 and 66 ms within 16 minutes of one loan and 50 ms on another (its optimizer phase 6.6 against
0.9 ms), and the noise of steps of 3-100 ms is 5-9 % per measurement against 0.2 % for steps over 300 ms
(``benchmarks/noise_floor.py``). Nothing in a record said how busy or slow its host was.

``issue_us`` times ``OPS`` tiny in-place additions on the record's device from an idle queue (after a
synchronisation): the host's mean cost to issue one small op, in microseconds. A mean over a few
milliseconds, not a median of short bursts: a host that is time-sliced away (another process, another
thread holding the interpreter) slows a host-bound step in proportion, and the mean sees it where the
median of bursts shorter than a time slice would not. The collector measures it just before and just after a record's timed steps
(``record["host_probe"]``), so a record taken while the host was slow can be told from one where the model
was, and a model of host costs can be fitted per record rather than per loan. It costs 2,000 tiny ops
(about 4 ms on a CPU, 10 ms at a GPU's launch rate) twice per record.
"""

from __future__ import annotations

import time

import torch

OPS = 2000


def issue_us(device: torch.device) -> float:
    """Mean microseconds the host takes to issue one tiny in-place add on ``device`` over ``OPS`` of them (a
    CUDA device's queue is drained first, so the GPU never holds the host back: kernels of ~2 us each,
    issued at several us each)."""
    x = torch.zeros(16, device=device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    for _ in range(10):  # first-call costs (dispatch caches, the kernel's module load)
        x.add_(1.0)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(OPS):
        x.add_(1.0)
    elapsed = time.perf_counter() - start
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return round(elapsed / OPS * 1e6, 3)


def probe_fields(before_us: float, after_us: float) -> dict:
    """A record's ``host_probe``: the issue cost before and after its timed steps, and the probe's own
    definition, so records of different collector versions are not compared blindly."""
    return {"issue_us_before": before_us, "issue_us_after": after_us, "op": "add_", "ops": OPS, "stat": "mean"}
