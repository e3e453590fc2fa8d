"""The one error type a user ever sees: a mistake in their input, reported as one line (exit code 2)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class UserError(Exception):
    """Bad input from the user. The CLI prints ``gnn-ptp <cmd>: error: <message>`` and exits with 2."""


def closest(word: str, choices: Iterable[str], n: int = 3) -> str:
    """A ``; did you mean ...?`` suffix naming the closest valid choices, or '' when none is close."""
    matches = difflib.get_close_matches(word, list(choices), n=n, cutoff=0.6)
    if not matches:
        return ""
    return "; did you mean " + " or ".join(repr(m) for m in matches) + "?"
