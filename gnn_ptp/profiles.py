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
    """A callable that runs ``step(timer, marks)`` once under the profiler and returns its profile."""

    def run(step) -> dict:
        activities = [torch.profiler.ProfilerActivity.CPU]
        if device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        marker = PhaseMarker()
        with torch.profiler.profile(activities=activities, record_shapes=True,
                                    profile_memory=device.type == "cpu") as prof:
            step(marker, [])
            if device.type == "cuda":
                torch.cuda.synchronize()
        return compact(prof, device)

    return run


def _us(event, name: str) -> float:
    value = getattr(event, name, None)
    return round(float(value), 3) if value is not None else 0.0


def compact(prof, device: torch.device) -> dict:
    """The profile of one step as string tables and rows (see the module docstring)."""
    events = [e for e in prof.events() if getattr(e, "device_type", None) == torch.autograd.DeviceType.CPU]
    ranges = {e.name[len(_MARK):]: (e.time_range.start, e.time_range.end)
              for e in events if e.name.startswith(_MARK)}
    ops = [e for e in events if e.name.startswith("aten::")]
    ops.sort(key=lambda e: (e.time_range.start, -e.time_range.end))
    t0 = min((r[0] for r in ranges.values()), default=ops[0].time_range.start if ops else 0.0)
    index = {id(e): i for i, e in enumerate(ops)}
    dtypes_of = _input_dtypes(prof, ops)
    names: dict[str, int] = {}
    sigs: dict[str, int] = {}
    sig_list: list = []
    rows = []
    phase_device_us = dict.fromkeys(PHASES, 0.0)
    phase_cpu_us = dict.fromkeys(PHASES, 0.0)
    for e in ops:
        start = e.time_range.start
        phase = next((i for i, p in enumerate(PHASES) if p in ranges and ranges[p][0] <= start <= ranges[p][1]), -1)
        parent = e.cpu_parent
        while parent is not None and id(parent) not in index:  # skip annotations between two ops
            parent = parent.cpu_parent
        sig = [list(map(_shape, e.input_shapes or [])), dtypes_of(e)]
        sig_text = json.dumps(sig, separators=(",", ":"))
        if sig_text not in sigs:
            sigs[sig_text] = len(sig_list)
            sig_list.append(sig)
        name_id = names.setdefault(e.name, len(names))
        self_device = _us(e, "self_device_time_total")
        self_cpu = _us(e, "self_cpu_time_total")
        if phase >= 0:
            phase_device_us[PHASES[phase]] += self_device
            if parent is None:
                phase_cpu_us[PHASES[phase]] += e.time_range.elapsed_us()
        rows.append([name_id, sigs[sig_text], phase, index[id(parent)] if parent is not None else -1,
                     int(getattr(e, "thread", 0) or 0), round(start - t0, 3), round(e.time_range.elapsed_us(), 3),
                     self_cpu, self_device, _us(e, "device_time_total")])
    out = {"device": device.type, "torch": torch.__version__, "names": list(names), "sigs": sig_list,
           "columns": list(COLUMNS), "ops": rows,
           "phase_ms": {p: round((ranges[p][1] - ranges[p][0]) / 1e3, 4) for p in PHASES if p in ranges},
           "phase_device_ms": {p: round(v / 1e3, 4) for p, v in phase_device_us.items()},
           "phase_top_level_cpu_ms": {p: round(v / 1e3, 4) for p, v in phase_cpu_us.items()}}
    if device.type == "cpu":
        peak = _peak_allocated(prof)
        if peak is not None:
            out["peak_allocated_bytes"] = peak
    return out


def _input_dtypes(prof, ops):
    """FunctionEvent.input_dtypes where torch has it (2.14), else the kineto event's dtypes (2.11), which
    share the FunctionEvent's id (the correlation id)."""
    if not ops or getattr(ops[0], "input_dtypes", None) is not None:
        return lambda e: list(getattr(e, "input_dtypes", None) or [])
    try:
        by_id = {k.correlation_id(): list(k.dtypes()) for k in prof.profiler.kineto_results.events()
                 if k.device_type() == torch.autograd.DeviceType.CPU}
    except AttributeError:
        by_id = {}
    return lambda e: by_id.get(e.id, [])


def _shape(s):
    return list(s) if isinstance(s, (list, tuple)) else s


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
