"""The one base class of errors whose message is written for the user, and how a user's value
is shown in one.

Entry points (``spice_ray.runtime.cli.run_main``) print such an error as one line, ``error:
<message>``, and exit with status 1, with no traceback: the message names the file, field or value
at fault and what to do. Any other exception is a bug and keeps its traceback.

A value the user typed can be anything (a 5,000-character string, a list of 3,000 seeds), so a
message shows it through :func:`excerpt`: about 80 characters, never the whole value.
"""

from __future__ import annotations

import reprlib
from typing import Any

EXCERPT_CHARS = 80
"""The most characters of a user's value an error message shows."""

_REPR = reprlib.Repr()
_REPR.maxlevel = 3
_REPR.maxstring = EXCERPT_CHARS
_REPR.maxother = EXCERPT_CHARS
_REPR.maxlong = 40
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = _REPR.maxset = _REPR.maxfrozenset = 8


class SpiceRayError(Exception):
    """A failure explained by its message (bad input, corrupt file, diverged training, ...)."""


def excerpt(value: Any, limit: int = EXCERPT_CHARS) -> str:
    """``repr(value)`` in at most about ``limit`` characters: a long string keeps its two ends
    and says its length (``'xxxx...xxxx' (5000 characters)``), a collection shows its first
    items and says how many. A collection's whole repr is never built, so a huge or deeply
    nested value costs nothing to show."""
    if isinstance(value, (str, bytes)):
        shown = repr(value)
        if len(shown) <= limit:
            return shown
        half = (limit - 3) // 2
        return f"{shown[:half]}...{shown[-half:]} ({len(value)} characters)"
    try:
        shown = _REPR.repr(value)
    except ValueError:  # an int beyond Python's 4,300-digit limit for str()
        shown = f"<{type(value).__name__} too long to show>"
    if len(shown) > limit:
        shown = shown[:limit - 3] + "..."
    if isinstance(value, (list, tuple, dict, set, frozenset)) and len(value) > _REPR.maxlist:
        shown += f" ({len(value)} items)"
    return shown


class Excerpt:
    """A value whose ``repr`` is its :func:`excerpt`: hand it to code that formats a user value
    with ``{value!r}`` (a config field's checks) to keep the message short."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def __repr__(self) -> str:
        return excerpt(self.value)


class Stopped(KeyboardInterrupt):
    """The run was stopped by a signal (SIGINT from Ctrl-C, SIGTERM from a scheduler or
    ``kill``): raised in the driver's main thread so every stage unwinds as after Ctrl-C.

    Attributes:
        signum: the signal number (exit status 128 + signum).
    """

    def __init__(self, signum: int) -> None:
        import signal

        super().__init__(signal.Signals(signum).name)
        self.signum = int(signum)


_STAGE: list[str] = []
"""The stage the driver is in (``"2/5 pretrain"``), for messages about failures that are not
the stage's own (a full disk, a lost connection)."""


def enter_stage(stage: str, detail: str = "") -> None:
    """Record (and log) that the driver enters ``stage``."""
    import logging

    _STAGE[:] = [stage]
    logging.getLogger("spice_ray").info("[stage %s]%s", stage, f" {detail}" if detail else "")


def current_stage() -> str | None:
    """The stage last entered in this process, or None."""
    return _STAGE[0] if _STAGE else None
