"""Output paths checked before any work starts: a command that would train for a minute and then fail to
write its result (an existing file where a folder goes, a folder where a file goes, no permission, a
file it must not overwrite) refuses at once, with one line naming the option and the path.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from gnn_ptp.errors import UserError


def _writable_parent(path: Path, what: str) -> None:
    """The nearest existing ancestor of ``path`` must be a folder we may create entries in."""
    parent = path.parent
    while not parent.exists():
        if parent == parent.parent:
            break
        parent = parent.parent
    if not parent.is_dir():
        raise UserError(f"{what} {str(path)!r}: {str(parent)!r} is a file, not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UserError(f"{what} {str(path)!r}: no permission to write in {str(parent)!r}")
    try:  # permission bits do not tell everything (root on /proc, a read-only mount): create and remove one
        fd, probe = tempfile.mkstemp(dir=parent, prefix=".gnn-ptp-probe.", suffix=".tmp")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise UserError(f"{what} {str(path)!r}: cannot create a file in {str(parent)!r} "
                        f"({e.strerror or e})") from None


def check_output_file(path: str | os.PathLike, what: str, overwrite: bool = False,
                      suffixes: tuple[str, ...] | None = None) -> Path:
    """Check that ``path`` can be written as a file, before the work that produces it.

    ``what`` names the option (``--plot``). An existing file is refused unless ``overwrite`` (a command
    that regenerates its own artifact, such as a plot, passes True); a folder is always refused.
    ``suffixes``: the allowed file name endings (``(".png", ".pdf")``), or None for any."""
    p = Path(path)
    if str(path).strip() == "":
        raise UserError(f"{what}: give a file path")
    if p.is_dir():
        raise UserError(f"{what} {str(path)!r} is a folder; give a file path")
    if suffixes and p.suffix.lower() not in suffixes:
        raise UserError(f"{what} {str(path)!r}: allowed file types: {', '.join(suffixes)}")
    if p.exists():
        if not overwrite:
            raise UserError(f"{what} {str(path)!r} already exists; not overwriting it (remove it or "
                            "choose another path)")
        if not p.is_file():
            raise UserError(f"{what} {str(path)!r} exists and is not a regular file")
        if not os.access(p, os.W_OK):
            raise UserError(f"{what} {str(path)!r}: no permission to overwrite it")
    _writable_parent(p, what)
    return p


def check_output_dir(path: str | os.PathLike, what: str, must_be_empty: bool = False) -> Path:
    """Check that ``path`` can be used as an output folder (created if missing), before any work.

    An existing file there is refused; so is a non-empty folder when ``must_be_empty``."""
    p = Path(path)
    if str(path).strip() == "":
        raise UserError(f"{what}: give a folder path")
    if p.exists():
        if not p.is_dir():
            raise UserError(f"{what} {str(path)!r} is a file; give a folder (it is created if missing)")
        if not os.access(p, os.W_OK | os.X_OK):
            raise UserError(f"{what} {str(path)!r}: no permission to write in it")
        if must_be_empty and any(p.iterdir()):
            raise UserError(f"{what} {str(path)!r} is not empty; not overwriting what it holds")
        return p
    _writable_parent(p, what)
    return p
