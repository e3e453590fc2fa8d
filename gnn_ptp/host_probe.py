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

On a CPU a second probe, ``fresh_fill``, times what filling a fresh anonymous mapping costs against filling a
reused buffer (``FRESH_MIB``): the page faults a step pays for each large output it allocates (an optimizer's
``sqrt`` and ``div`` over a 100 M-parameter layer, a convolution's large gradients), which the allocator maps
afresh above 32 MiB. That cost is the machine's state, not the model's: in the VGG records of the first CPU kind
(README *Protocol*, "Fresh allocations: a session's state, not a shape") the two allocating optimizer kernels over
its 411 MB fp32 layer ran at 0.54-0.79 ms per MiB in some sessions and 1.0-2.6 ms per MiB in others, while its
in-place kernels held at 0.05-0.11; the same configurations' optimizer phase moved 6.3-15.4 ns per fp32 parameter
from session to session. The probe maps its buffer itself (``mmap``), since a ``torch.empty`` of that size is
served from memory the allocator already holds whenever a model has freed enough of it (31 of the first 171
records so probed took no fault, fifty-third session); it records the faults it took beside the time. The
collector takes it before a record's peak memory is reset and after its memory label is taken (``with_fresh``),
so its buffers never count in the label; about 20-150 ms each time.
"""

from __future__ import annotations

import mmap
import resource
import time

import torch

OPS = 2000
FRESH_MIB = 48
"""The size of ``fresh_fill``'s mapping: above 32 MiB, glibc's largest mmap threshold (the first CPU kind's
measured fresh-allocation threshold is 31.9 MiB, ``descriptor.measure_fresh_alloc``), the sizes whose tensors
are mapped afresh."""
FRESH_MAP = "mmap"
"""How ``fresh_fill`` gets its fresh buffer, recorded as ``fresh_map`` (the first records of the fifty-third
session, without the field, took a ``torch.empty``, which could reuse the allocator's memory and fault nothing)."""


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


def _fresh_mapping(nbytes: int):
    """A new anonymous mapping of ``nbytes`` (no page touched yet) and a float32 tensor over it."""
    buf = mmap.mmap(-1, nbytes)
    return buf, torch.frombuffer(buf, dtype=torch.float32)


def fresh_fill(device: torch.device) -> dict | None:
    """What filling a fresh ``FRESH_MIB`` mapping costs over filling a reused buffer of that size, per MiB:
    ``{"ms_per_mib": ..., "faults_per_mib": ...}`` (the minor page faults the fresh fill took, 256 per MiB
    with 4 KiB pages, fewer with huge pages); None on a GPU, whose caching allocator hands back reused
    blocks. One timing of each: a record's state, not a benchmark."""
    if device.type != "cpu":
        return None
    nbytes = FRESH_MIB * 2 ** 20
    reused = torch.empty(nbytes // 4)
    reused.fill_(1.0)
    reused.fill_(1.0)
    start = time.perf_counter()
    reused.fill_(1.0)
    plain_s = time.perf_counter() - start
    del reused
    buf, fresh = _fresh_mapping(nbytes)
    try:
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        start = time.perf_counter()
        fresh.fill_(1.0)
        fresh_s = time.perf_counter() - start
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    finally:
        del fresh
        buf.close()
    return {"ms_per_mib": round(max(fresh_s - plain_s, 0.0) * 1e3 / FRESH_MIB, 4),
            "faults_per_mib": round(faults / FRESH_MIB, 1)}


def probe_fields(before_us: float, after_us: float) -> dict:
    """A record's ``host_probe``: the issue cost before and after its timed steps, and the probe's own
    definition, so records of different collector versions are not compared blindly."""
    return {"issue_us_before": before_us, "issue_us_after": after_us, "op": "add_", "ops": OPS, "stat": "mean"}


def with_fresh(fields: dict, before: dict | None, after: dict | None) -> dict:
    """``fields`` (a record's ``host_probe``) with ``fresh_fill`` from before the record's peak memory was reset
    and from after its memory label was taken (its buffers are no step's; records from the fifty-third session
    on); unchanged where either is None (a GPU)."""
    if before is None or after is None:
        return fields
    return {**fields, "fresh_ms_per_mib_before": before["ms_per_mib"], "fresh_ms_per_mib_after": after["ms_per_mib"],
            "fresh_faults_per_mib": before["faults_per_mib"], "fresh_faults_per_mib_after": after["faults_per_mib"],
            "fresh_mib": FRESH_MIB, "fresh_map": FRESH_MAP}
