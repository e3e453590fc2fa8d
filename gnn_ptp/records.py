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


def iter_records(path: str | os.PathLike, warn=None) -> Iterator[dict]:
    """Every record under ``path`` (a .jsonl file or a folder of them). A torn final line, left by a
    power loss mid-append, is skipped with a warning; nothing else is ever skipped silently."""
    path = Path(path)
    if path.is_dir():
        files = sorted(path.glob("*.jsonl"))
    elif path.is_file():
        files = [path]
    else:
        raise UserError(f"no records at {str(path)!r}: not a file or folder")
    for file in files:
        lines = file.read_text().splitlines()
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError:
                message = f"{file}:{number}: unreadable record skipped"
                if number != len(lines):
                    raise UserError(f"{file}:{number} is not valid JSON (only a torn last line is "
                                    "tolerated); fix or remove that line") from None
                (warn or (lambda m: print(f"warning: {m}", file=sys.stderr)))(message)
                continue
            record.setdefault("_file", file.name)
            yield record


def load_records(path, status: str | None = "ok") -> list[dict]:
    return [r for r in iter_records(path) if status is None or r.get("status") == status]


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
