"""Measurement records: one JSON object per line in ``datasets/<hardware>/*.jsonl``, append-only.

A record holds everything needed to rebuild the model and its graph (the spec grammar, shapes,
precision, optimizer), what was measured (per-phase times as median with p10/p90/n, peak memory),
how it ended (ok, oom, error), and where: hardware, driver, CUDA, torch and library versions, a
timestamp. ``key`` identifies the configuration, so a rerun skips what a folder already holds.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import platform
import sys
from collections.abc import Iterator
from pathlib import Path

from gnn_ptp.errors import UserError
from gnn_ptp.store import append_line

SCHEMA_VERSION = 2
"""2: harvest records (``id``, ``flags``, ``grad_scaler``, ``profile``) and the status ``skipped``."""
STATUSES = ("ok", "oom", "error", "skipped")
CONFIG_FIELDS = ("spec", "set", "task", "batch_size", "seq_len", "image_size", "precision", "optimizer")


def config_key(config: dict, hardware: str, ddp: dict | None = None) -> str:
    """A stable id for one measured configuration on one kind of hardware."""
    payload = {k: config.get(k) for k in CONFIG_FIELDS}
    payload["hardware"] = hardware
    if ddp:
        payload["ddp"] = {k: ddp[k] for k in ("world_size", "backend", "bucket_cap_mb")}
        if ddp.get("parallel", "ddp") != "ddp":  # FSDP records: their own keys (DDP keys stay as they were)
            payload["ddp"]["parallel"] = ddp["parallel"]
    blob = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    return hashlib.sha1(blob.encode()).hexdigest()[:16]


def iter_records(path: str | os.PathLike, warn=None, strict: bool = False, check=None) -> Iterator[dict]:
    """Every record under ``path`` (a .jsonl file or a folder of them).

    A bad line (not valid JSON, not a JSON object, or, with ``check``, a record ``check`` finds a problem
    in) is skipped, and once the files are read the skipped lines are reported in one warning: their
    count and ``file:line: why`` for the first few. Work goes on with the good records. ``strict``
    refuses instead: a UserError naming the count and the first bad lines, raised after the last file.
    ``check(record) -> str | None`` returns why a record is unusable (see ``measurement_problem``)."""
    path = Path(path)
    if path.is_dir():
        files = sorted(path.glob("*.jsonl"))
    elif path.is_file():
        files = [path]
    elif path.exists():
        raise UserError(f"no records at {str(path)!r}: not a file or folder")
    else:
        raise UserError(f"no records at {str(path)!r}: no such file or folder")
    bad: list[str] = []
    for file in files:
        try:
            text = file.read_text()
        except (OSError, UnicodeDecodeError) as e:
            bad.append(f"{file}: unreadable file ({type(e).__name__}: {e.args[-1] if e.args else e})")
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError as e:
                bad.append(f"{file}:{number}: not valid JSON ({e.msg})")
                continue
            why = "not a JSON object" if not isinstance(record, dict) else (check(record) if check else None)
            if why:
                bad.append(f"{file}:{number}: {why}")
                continue
            record.setdefault("_file", file.name)
            yield record
    if bad:
        shown = "; ".join(bad[:3]) + (f"; ... ({len(bad) - 3} more)" if len(bad) > 3 else "")
        if strict:
            raise UserError(f"{len(bad)} bad record line(s) in {path} and --strict refuses them: {shown}")
        (warn or (lambda m: print(f"warning: {m}", file=sys.stderr)))(
            f"skipped {len(bad)} bad record line(s) in {path}: {shown}")


def load_records(path, status: str | None = "ok", strict: bool = False, check=None) -> list[dict]:
    return [r for r in iter_records(path, strict=strict, check=check) if status is None or r.get("status") == status]


_TIMING_KEYS = ("forward_ms", "backward_ms", "optimizer_ms", "step_ms")


TWINS = ("same-day", "all")


def same_day_twins(alone: list[dict], beside: list[dict], mode: str = "same-day") -> tuple[list[dict], bool]:
    """The single-process records (``alone``) that stand for a configuration's one-process step beside its
    multi-process records (``beside``, DDP or FSDP): with ``mode`` "same-day" those measured on a UTC day one
    of ``beside`` was (a machine's speed moves from day to day; a data-parallel model is judged against compute
    as it ran then), all of them where none was (and True: a fallback); with "all", all of them."""
    if mode == "all" or not alone:
        return alone, False
    days = {r["timestamp"][:10] for r in beside}
    same = [r for r in alone if r["timestamp"][:10] in days]
    return (same, False) if same else (alone, True)


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value


def record_problem(record: dict) -> str | None:
    """Why ``data stats`` cannot count a record (missing fields, wrong types), or None when it can: a
    string key, a known status, config.precision, and for ``ok`` records a numeric step median."""
    if not isinstance(record.get("key"), str):
        return "missing or non-string field 'key'"
    if record.get("status") not in STATUSES:
        return f"field 'status' is {record.get('status')!r}, allowed: {', '.join(STATUSES)}"
    config = record.get("config")
    if not isinstance(config, dict):
        return "missing or non-object field 'config'"
    if not isinstance(config.get("precision"), str):
        return f"field 'config.precision' is {config.get('precision')!r}, expected a string"
    for name in ("env", "memory"):
        if record.get(name) is not None and not isinstance(record[name], dict):
            return f"field '{name}' is not an object"
    if record.get("ddp") is not None and not (isinstance(record["ddp"], dict)
                                               and isinstance(record["ddp"].get("world_size", 1), int)):
        return "field 'ddp' is not an object with an integer world_size"
    if record["status"] == "ok":
        timing = record.get("timing")
        if not isinstance(timing, dict):
            return "status ok but missing or non-object field 'timing'"
        return _phase_problem(timing, "step_ms")
    return None


def _phase_problem(timing: dict, name: str) -> str | None:
    phase = timing.get(name)
    if not isinstance(phase, dict) or not _number(phase.get("median")) or phase["median"] < 0:
        return f"status ok but 'timing.{name}.median' is missing or not a non-negative number"
    for q in ("p10", "p90"):
        if q in phase and not _number(phase[q]):
            return f"field 'timing.{name}.{q}' is {phase[q]!r}, expected a number"
    return None


def measurement_problem(record: dict) -> str | None:
    """Why a record cannot be used as a measurement by ``train`` and ``evaluate`` (missing fields, wrong
    types), or None when it can: ``record_problem``'s fields, config.spec and batch_size, env.hardware,
    and for ``ok`` records the median of every phase's timing."""
    why = record_problem(record)
    if why:
        return why
    config = record["config"]
    for name, kind, label in (("spec", str, "a string"), ("batch_size", int, "an integer")):
        value = config.get(name)
        if not isinstance(value, kind) or isinstance(value, bool):
            return f"field 'config.{name}' is {value!r}, expected {label}"
    for name in ("seq_len", "image_size"):
        value = config.get(name)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            return f"field 'config.{name}' is {value!r}, expected an integer or null"
    if config.get("set") is not None and not isinstance(config.get("set"), dict):
        return f"field 'config.set' is {config.get('set')!r}, expected an object"
    if not isinstance((record.get("env") or {}).get("hardware"), str):
        return "missing or non-string field 'env.hardware'"
    if record["status"] == "ok":
        for name in _TIMING_KEYS:
            why = _phase_problem(record["timing"], name)
            if why:
                return why
    return None


def append_record(record: dict, out_dir: str | os.PathLike, file_name: str) -> None:
    record = {k: v for k, v in record.items() if not k.startswith("_")}
    append_line(json.dumps(record, sort_keys=True, separators=(",", ":")), Path(out_dir) / file_name)


def now_utc() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _version(module: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(module)
    except Exception:
        return None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cpu_kind() -> str | None:
    """The CPU's kind: its model name with the family and model numbers of /proc/cpuinfo, e.g. 'AMD EPYC
    (family 26 model 2)'. Virtual machines often name several generations alike ('AMD EPYC' for Zen 4 and
    Zen 5, which run the same steps up to 2x apart); the numbers tell them apart. None where unknown."""
    fields = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if not line.strip():
                break  # the first processor's block is enough
            key, _, value = line.partition(":")
            fields[key.strip()] = value.strip()
    except OSError:
        return None
    if "model name" not in fields or "cpu family" not in fields or "model" not in fields:
        return None
    return f"{fields['model name']} (family {fields['cpu family']} model {fields['model']})"


def hardware_label(device_name: str) -> str:
    """``NVIDIA H100 80GB HBM3`` -> ``h100``; every GPU kind is its own target; ``cpu`` for CPUs."""
    name = device_name.lower()
    for label in ("h200", "h100", "h800", "a100", "a10g", "l40s", "l4", "v100", "b200", "gh200"):
        if label in name.replace(" ", "").replace("-", ""):
            return label
    if name == "cpu":
        return "cpu"
    return "".join(c for c in name.replace("nvidia", "") if c.isalnum()) or "gpu"


def environment(device) -> dict:
    """Where a measurement was taken: hardware, driver, CUDA, library versions, CPU, threads."""
    import torch

    env = {
        "torch": torch.__version__,
        "transformers": _version("transformers"),
        "torchvision": _version("torchvision"),
        "timm": _version("timm"),
        "torch_geometric": _version("torch-geometric"),
        "python": platform.python_version(),
        "cpu_model": _cpu_model(),
        "cpu_kind": _cpu_kind(),
        "cpu_count": os.cpu_count(),
        "num_threads": torch.get_num_threads(),
        "cpu_affinity": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "platform": platform.platform(),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update({
            "device_name": props.name,
            "device_count": torch.cuda.device_count(),
            "device_memory_bytes": props.total_memory,
            "compute_capability": f"{props.major}.{props.minor}",
            "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version(),
            "driver": _nvidia_driver(),
        })
    else:
        env.update({"device_name": "cpu", "device_count": 1, "cuda": None, "driver": None})
    env["hardware"] = hardware_label(env["device_name"])
    return env


def _nvidia_driver() -> str | None:
    try:
        text = Path("/proc/driver/nvidia/version").read_text()
        for token in text.split():
            if token.count(".") >= 1 and token.replace(".", "").isdigit():
                return token
    except OSError:
        pass
    try:
        import subprocess

        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
    except (OSError, subprocess.SubprocessError, IndexError):
        return None
