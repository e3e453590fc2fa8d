"""The one error type a user ever sees: a mistake in their input, reported as one line (exit code 2)."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable
from typing import NoReturn


class UserError(Exception):
    """Bad input from the user. The CLI prints ``gnn-ptp <cmd>: error: <message>`` and exits with 2."""


def closest(word: str, choices: Iterable[str], n: int = 3) -> str:
    """A ``; did you mean ...?`` suffix naming the closest valid choices, or '' when none is close."""
    matches = difflib.get_close_matches(word, list(choices), n=n, cutoff=0.6)
    if not matches:
        return ""
    return "; did you mean " + " or ".join(repr(m) for m in matches) + "?"


def one_line(text: object) -> str:
    """A message on one line: inner newlines and runs of spaces become single spaces."""
    return " ".join(str(text).split())


def first_line(text: object) -> str:
    """The first non-empty line of a message (libraries append advice and tracebacks after it)."""
    for line in str(text).splitlines():
        if line.strip():
            return line.strip()
    return ""


def user_code_error(exc: BaseException, file, doing: str) -> UserError:
    """A failure inside the user's own code (a ``py:`` factory or model): a UserError naming the deepest
    line of the user's file in the traceback, the exception and its first line.

    ``doing`` says what gnn-ptp was doing (``calling make()``, ``tracing the training step``)."""
    import traceback
    from pathlib import Path

    target = Path(file).resolve()
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if Path(f.filename).resolve() == target]
    where = f"{file}:{frames[-1].lineno}" if frames else str(file)
    message = first_line(exc)
    return UserError(f"{where}: {type(exc).__name__} while {doing}" + (f": {message}" if message else "")
                     + " (the error is in your model code; --debug shows the traceback)")


def run_script(main: Callable[[], int | None], prog: str | None = None) -> NoReturn:
    """Run a script's ``main()`` and exit with what it returns (None is 0); a UserError becomes one line,
    ``<prog>: error: <message>`` on stderr, and exit code 2. ``prog`` defaults to the script's file name."""
    import os
    import sys

    prog = prog or os.path.basename(sys.argv[0])
    try:
        code = main()
    except UserError as e:  # bad input: one line naming it, exit 2
        print(f"{prog}: error: {one_line(e)}", file=sys.stderr)
        sys.exit(2)
    sys.exit(code)
