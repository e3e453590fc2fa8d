"""Per-op profiles of measured steps: the raw material of kernel-level labels.

The harvest runs one extra step of a record under ``torch.profiler`` (CUDA activity on a GPU, CPU ops on
a CPU) and stores the sequence of aten ops it ran, with their input shapes and dtypes, the phase each ran
in (forward, backward, optimizer: from the host time at which it started, against ranges the step marks)
and their time: host time, self time, and on a GPU the device time of the kernels each op launched
itself (``self_device_us``) and with its children (``device_us``).

File format (``PROFILE_SCHEMA``): ``<dataset>/profiles/<grid>-<start time>-<part>.jsonl.gz``, gzip
members appended one per profile (each a JSON line; ``gzip`` reads them as one stream), a new part
from ``PART_BYTES`` on so that no file passes 16 MiB. A line holds the record's ``id`` and ``key``,
the device, torch version, string tables and one row per op::

    {"schema": 1, "id": ..., "key": ..., "device": "cuda", "torch": "2.11.0+cu130",
     "names": ["aten::mm", ...], "sigs": [[[[8, 16], [16, 16]], ["float", "float"]], ...],
     "columns": ["name", "sig", "phase", "parent", "thread", "start_us", "cpu_us", "self_cpu_us",
                 "self_device_us", "device_us"],
     "ops": [[0, 0, 0, 3, 1, 12.5, 40.1, 20.2, 7.5, 7.5], ...], "phase_device_ms": {...}, ...}

``phase`` indexes ``PHASES`` (-1: outside the marked step); ``parent`` is the row of the op that called
this one (-1 for top-level ops), so composite ops (``aten::linear``) and what they ran (``aten::addmm``)
are both there and a matcher chooses its level. Records point at their profile with
``{"file": "profiles/...", "events": n}``.
"""

from __future__ import annotations

import gzip
import json
import os
import sys
import time
from pathlib import Path

import torch

from gnn_ptp.store import append_bytes

PROFILE_SCHEMA = 1
PHASES = ("forward", "backward", "optimizer")
COLUMNS = ("name", "sig", "phase", "parent", "thread", "start_us", "cpu_us", "self_cpu_us", "self_device_us",
           "device_us")
PART_BYTES = 12 * 2**20
"""A profile file is closed once it holds this much (the device tool returns files of up to 16 MiB)."""
_MARK = "gnn_ptp::"


class PhaseMarker:
    """Stands in for the step timer: its four marks open and close one profiler range per phase."""

    def __init__(self):
        self.open = None
        self.count = 0

    def mark(self, _marks: list) -> None:
        if self.open is not None:
            self.open.__exit__(None, None, None)
            self.open = None
        if self.count < len(PHASES):
            self.open = torch.profiler.record_function(_MARK + PHASES[self.count])
            self.open.__enter__()
        self.count += 1


def profiled_step(device: torch.device):
    """A callable ``run(step, resident=None)`` that runs ``step(timer, marks)`` once under the profiler and
    returns its profile. On a CPU, ``resident()`` (the bytes held before the step: parameters, optimizer
    state, inputs; call it after ``zero_grad(set_to_none=True)``) plus the profiled peak of what the step
    allocates is the step's peak allocated bytes (``peak_allocated_bytes``)."""

    def run(step, resident=None) -> dict:
        activities = [torch.profiler.ProfilerActivity.CPU]
        if device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        marker = PhaseMarker()
        before = resident() if resident is not None and device.type == "cpu" else None
        with torch.profiler.profile(activities=activities, record_shapes=True,
                                    profile_memory=device.type == "cpu") as prof:
            step(marker, [])
            if device.type == "cuda":
                torch.cuda.synchronize()
        out = compact(prof, device)
        if before is not None and "peak_allocated_bytes" in out:
            out["resident_before_bytes"] = before
            out["peak_allocated_bytes"] += before
        else:
            out.pop("peak_allocated_bytes", None)  # a peak without what was held before is no label
        return out

    return run


def compact(prof, device: torch.device) -> dict:
    """The profile of one step as string tables and rows (see the module docstring).

    Read from the profiler's raw kineto events, not ``prof.events()``: building FunctionEvents costs
    about a second per 5,000 ops in Python, which the harvest's profiling budget cannot pay. Nesting comes
    from each thread's time intervals; a kernel's time goes to the op whose correlation id it carries
    (or, through the runtime call that launched it, to the innermost op around that call)."""
    cpu_type = torch.autograd.DeviceType.CPU
    raw = list(prof.profiler.kineto_results.events())
    host = sorted((e for e in raw if e.device_type() == cpu_type),
                  key=lambda e: (e.start_thread_id(), e.start_ns(), -e.end_ns()))
    ranges = {e.name()[len(_MARK):]: (e.start_ns(), e.end_ns()) for e in host if e.name().startswith(_MARK)}
    ops, parent_of, corr_to_op = [], [], {}
    stack: list[tuple[int, int]] = []  # (end_ns, op row) of the open ops of the current thread
    thread = None
    for e in host:
        if e.start_thread_id() != thread:
            thread, stack = e.start_thread_id(), []
        while stack and stack[-1][0] <= e.start_ns():
            stack.pop()
        name = e.name()
        if name.startswith("aten::"):
            row = len(ops)
            ops.append(e)
            parent_of.append(stack[-1][1] if stack else -1)
            corr_to_op[e.correlation_id()] = row
            stack.append((e.end_ns(), row))
        elif stack and not name.startswith(_MARK):  # a runtime call (cudaLaunchKernel...) inside an op
            corr_to_op.setdefault(e.correlation_id(), stack[-1][1])
    self_device_ns = [0] * len(ops)
    for e in raw:
        if e.device_type() != cpu_type:
            row = corr_to_op.get(e.linked_correlation_id())
            if row is not None:
                self_device_ns[row] += e.duration_ns()
    device_ns = list(self_device_ns)
    child_ns = [0] * len(ops)
    for row in range(len(ops) - 1, -1, -1):  # children come after their parents: fold bottom-up
        parent = parent_of[row]
        if parent >= 0:
            device_ns[parent] += device_ns[row]
            child_ns[parent] += ops[row].duration_ns()
    order = sorted(range(len(ops)), key=lambda r: (ops[r].start_ns(), -ops[r].end_ns()))
    new_row = {old: new for new, old in enumerate(order)}
    t0 = min((r[0] for r in ranges.values()), default=ops[order[0]].start_ns() if ops else 0)
    names: dict[str, int] = {}
    sigs: dict[str, int] = {}
    sig_list: list = []
    rows = []
    phase_device_us = dict.fromkeys(PHASES, 0.0)
    phase_cpu_us = dict.fromkeys(PHASES, 0.0)
    for old in order:
        e = ops[old]
        start = e.start_ns()
        phase = next((i for i, p in enumerate(PHASES) if p in ranges and ranges[p][0] <= start <= ranges[p][1]), -1)
        sig = [[list(x) if isinstance(x, (list, tuple)) else x for x in e.shapes()], list(e.dtypes())]
        sig_text = json.dumps(sig, separators=(",", ":"))
        if sig_text not in sigs:
            sigs[sig_text] = len(sig_list)
            sig_list.append(sig)
        parent = parent_of[old]
        if phase >= 0:
            phase_device_us[PHASES[phase]] += self_device_ns[old] / 1e3
            if parent < 0:
                phase_cpu_us[PHASES[phase]] += e.duration_ns() / 1e3
        rows.append([names.setdefault(e.name(), len(names)), sigs[sig_text], phase,
                     new_row[parent] if parent >= 0 else -1, int(e.start_thread_id()), round((start - t0) / 1e3, 3),
                     round(e.duration_ns() / 1e3, 3), round((e.duration_ns() - child_ns[old]) / 1e3, 3),
                     round(self_device_ns[old] / 1e3, 3), round(device_ns[old] / 1e3, 3)])
    out = {"device": device.type, "torch": torch.__version__, "names": list(names), "sigs": sig_list,
           "columns": list(COLUMNS), "ops": rows,
           "phase_ms": {p: round((ranges[p][1] - ranges[p][0]) / 1e6, 4) for p in PHASES if p in ranges},
           "phase_device_ms": {p: round(v / 1e3, 4) for p, v in phase_device_us.items()},
           "phase_top_level_cpu_ms": {p: round(v / 1e3, 4) for p, v in phase_cpu_us.items()}}
    if device.type == "cpu":
        peak = _peak_allocated(prof)
        if peak is not None:
            out["peak_allocated_bytes"] = peak
    return out


def _peak_allocated(prof) -> int | None:
    """Peak of live allocated bytes during the profiled step, from the profiler's memory events."""
    try:
        from gnn_ptp.memory import profiler_peak_bytes
    except ImportError:
        return None
    try:
        return int(profiler_peak_bytes(prof))
    except Exception:  # a measurement that could not be read is left out, never guessed
        return None


class ProfileFile:
    """Appends profiles to ``<out>/profiles/<grid>-<start>-<part>.jsonl.gz``, one gzip member each."""

    def __init__(self, out: str | os.PathLike, grid: str):
        self.folder = Path(out) / "profiles"
        self.stem = f"{grid}-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{os.getpid()}"
        self.part = 0

    def _path(self) -> Path:
        return self.folder / f"{self.stem}-{self.part:03d}.jsonl.gz"

    def append(self, record: dict, profile: dict) -> dict:
        line = json.dumps({"schema": PROFILE_SCHEMA, "id": record["id"], "key": record["key"], **profile},
                          separators=(",", ":"))
        data = gzip.compress(line.encode() + b"\n", compresslevel=6)
        path = self._path()
        if path.exists() and path.stat().st_size + len(data) > PART_BYTES:
            self.part += 1
            path = self._path()
        append_bytes(data, path)
        return {"file": str(path.relative_to(self.folder.parent)), "events": len(profile["ops"]),
                "schema": PROFILE_SCHEMA}


def phase_op_counts(profile: dict) -> list[int]:
    """Ops the profile recorded in each phase (``PHASES``; ops outside the marked step not counted)."""
    phase_col = profile["columns"].index("phase")
    counts = [0] * len(PHASES)
    for r in profile["ops"]:
        if 0 <= r[phase_col] < len(PHASES):
            counts[r[phase_col]] += 1
    return counts


def profiler_cost_us(profile: dict, timing: dict) -> tuple[float, float, float] | None:
    """Per phase (``PHASES``), the microseconds the profiler added to each op it recorded in a CPU profile:
    the profiled step's phase (``phase_ms``, wall time between the step's marks) less the same record's
    unprofiled phase median (``timing["<phase>_ms"]["median"]``), over the ops recorded in that phase (at
    least 0). On the first CPU kind the profiled optimizer ran 1.35x its unprofiled median over 399
    records (~1.2 us per recorded op), the backward 1.11x (~3.6 us), the forward 1.09x (~1.9 us):
    ``benchmarks/profiler_cost.py``, README *Protocol*, the profiler's cost. None for a GPU profile (its
    kernels' device time is not the host's) or one without phase times."""
    if profile.get("device") == "cuda" or not profile.get("phase_ms"):
        return None
    counts = phase_op_counts(profile)
    out = []
    for p, name in enumerate(PHASES):
        profiled = profile["phase_ms"].get(name)
        unprofiled = ((timing or {}).get(f"{name}_ms") or {}).get("median")
        if profiled is None or unprofiled is None or not counts[p]:
            out.append(0.0)
        else:
            out.append(max(0.0, profiled - unprofiled) * 1e3 / counts[p])
    return tuple(out)


def read_profiles(folder: str | os.PathLike) -> dict[str, dict]:
    """Every profile under ``<folder>/profiles/``, by record id."""
    out = {}
    for path in sorted((Path(folder) / "profiles").glob("*.jsonl.gz")):
        try:
            with gzip.open(path, "rt") as f:
                for line in f:
                    if line.strip():
                        p = json.loads(line)
                        out[p["id"]] = p
        except (EOFError, gzip.BadGzipFile, ValueError) as e:  # a torn last member (power loss)
            print(f"warning: {path}: profiles after the last whole one are unreadable ({e})", file=sys.stderr)
    return out
