"""Writing files so that nothing is ever half-written: temp file in the same folder, fsync, rename."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path


def atomic_write_bytes(data: bytes, path: str | os.PathLike) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(text: str, path: str | os.PathLike) -> None:
    atomic_write_bytes(text.encode(), path)


def atomic_write_json(obj, path: str | os.PathLike) -> None:
    atomic_write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n", path)


def atomic_torch_save(obj, path: str | os.PathLike) -> None:
    atomic_write_bytes(to_bytes(obj), path)


def to_bytes(obj) -> bytes:
    """Tensors (in dicts, lists, tuples) to bytes, for crossing a process boundary safely."""
    import io

    import torch

    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def from_bytes(data: bytes):
    import io

    import torch

    return torch.load(io.BytesIO(data), weights_only=True)


def append_line(line: str, path: str | os.PathLike) -> None:
    """Append one line with a single write() on an O_APPEND descriptor, then fsync.

    A reader sees the line whole or not at all, even with a kill mid-way (a torn final line, possible
    only on power loss, is skipped by the reader)."""
    append_bytes((line.rstrip("\n") + "\n").encode(), path)


def append_bytes(data: bytes, path: str | os.PathLike) -> None:
    """Append ``data`` with a single write() on an O_APPEND descriptor, then fsync."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        written = os.write(fd, data)
        if written != len(data):
            raise OSError(f"short write to {path}: {written} of {len(data)} bytes")
        os.fsync(fd)
    finally:
        os.close(fd)
