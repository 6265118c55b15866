"""What a pipeline prints: stage headers, one live progress display per unit of work, warnings.

On a terminal each unit of work (a dataset, a model, an experiment's evaluation) gets a tqdm
bar that ends in a one-line summary. When stdout is not a terminal (CI, ``ray job submit``,
``| tee``) the same events print as plain lines: a line per finished unit, and for long units a
heartbeat line every ``heartbeat_s`` seconds, so a log file stays short and still shows that
work is moving. Library code reports through a :class:`Console` it is handed (or
:data:`SILENT`); only the command-line entry points make one that writes.

Off a terminal a unit's lines have one grammar each, whatever the machine's speed (a slow
machine prints heartbeats a fast one never does, and a first heartbeat has no ETA yet):

- progress (:data:`PROGRESS_LINE`): ``  DESC: DONE/TOTAL UNIT[, STATUS][, ETA DURATION]``;
- close (:data:`CLOSE_LINE`): ``  DESC: SUMMARY (DURATION)``;

where DURATION is :func:`fmt_seconds`'s (:data:`DURATION`). Tests parse these, never a
machine's timing.
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
import re
import sys
import time
from collections.abc import Callable, Iterator
from typing import TextIO

from tqdm import tqdm


def fmt_seconds(seconds: float) -> str:
    """``42 s``, ``3 min 05 s``, ``1 h 02 min``; ``unknown`` for a non-finite value (an ETA
    before any rate exists must never stop a run)."""
    if not math.isfinite(seconds):
        return "unknown"
    s = int(round(max(0.0, seconds)))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


DURATION = r"(?:unknown|\d+ s|\d+ min \d{2} s|\d+ h \d{2} min)"
"""What :func:`fmt_seconds` writes, as a regular expression."""
PROGRESS_LINE = re.compile(
    r"  (?P<desc>.+?): (?P<done>\d+)/(?P<total>\d+) (?P<unit>[^,]+?)"
    rf"(?:, (?!ETA )(?P<status>.+?))?(?:, ETA (?P<eta>{DURATION}))?")
"""A unit's progress line off a terminal (``fullmatch`` it): DESC, DONE/TOTAL, UNIT (one or
more words), then STATUS and the ETA, each left out while it has nothing to say."""
CLOSE_LINE = re.compile(rf"  (?P<desc>.+?): (?P<summary>.*) \((?P<took>{DURATION})\)")
"""The line that ends a unit (``fullmatch`` it): DESC, its SUMMARY and the time it took."""


def progress_line(desc: str, done: int, total: int, unit: str, postfix: str = "") -> str:
    """A :data:`PROGRESS_LINE`: ``  desc: done/total unit[, postfix]``."""
    return f"  {desc}: {done}/{total} {unit}" + (f", {postfix}" if postfix else "")


def count(n: int, noun: str) -> str:
    """``1 model``, ``3 models``."""
    return f"{n} {noun}" + ("" if n == 1 else "s")


class Bar:
    """Progress of one unit of work: ``update`` as it moves, ``close`` with a summary."""

    def __init__(self, console: Console, desc: str, total: int, unit: str) -> None:
        self.console, self.desc, self.total, self.unit = console, desc, max(1, total), unit
        self.done = 0
        self.status = ""
        self.t0 = self._last_line = console.clock()
        self._first: tuple[float, int] | None = None
        """(time, done) at the first progress: the rate is measured from there, so the first
        unit's start-up (worker start, compilation) does not inflate the ETA."""
        # tqdm's own ETA counts from the bar's creation (the first step's start-up made a
        # minutes-long model read 5 h): the live bar shows this bar's ETA in its postfix instead
        self._tqdm = (tqdm(total=self.total, desc=desc, unit=unit, file=console.stream,
                           dynamic_ncols=True, leave=False, mininterval=0.5,
                           bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]")
                      if console.live else None)

    def update(self, advance: int = 0, *, done: int | None = None, status: str = "") -> None:
        """Move by ``advance`` (or to ``done``) and show ``status`` (e.g. the loss)."""
        new = self.done + advance if done is None else done
        new = min(max(new, self.done), self.total)
        if status:
            self.status = status
        if self._first is None and new > self.done:
            self._first = (self.console.clock(), new)
        advanced, self.done = new - self.done, new
        if self._tqdm is not None:  # the ETA first: tqdm cuts a line at the terminal's width
            self._tqdm.set_postfix_str(self._postfix(eta_first=True), refresh=False)
            self._tqdm.update(advanced)
            return
        now = self.console.clock()
        if now - self._last_line >= self.console.heartbeat_s and self.done < self.total:
            self._last_line = now
            self.console.line(progress_line(self.desc, self.done, self.total, self.unit,
                                            self._postfix()))

    def _postfix(self, eta_first: bool = False) -> str:
        """``status, ETA ...`` (either part left out while it has nothing to say); with
        ``eta_first`` ``ETA ..., status``, so a live bar that a narrow terminal cuts short loses
        the end of the status (the loss parts), never the ETA."""
        eta = self.eta()
        parts = [self.status, f"ETA {fmt_seconds(eta)}" if eta is not None else ""]
        return ", ".join(part for part in (parts[::-1] if eta_first else parts) if part)

    def eta(self) -> float | None:
        """Seconds left at the rate since the first progress; None until that rate exists
        (at least one more unit done after the first, in measurable time)."""
        if self._first is None:
            return None
        t1, done1 = self._first
        elapsed, moved = self.console.clock() - t1, self.done - done1
        if moved <= 0 or not elapsed > 0:
            return None
        eta = (self.total - self.done) * elapsed / moved
        return eta if math.isfinite(eta) else None

    def abort(self, exc: BaseException, where: str = "") -> None:
        """End the bar after ``exc``: "stopped" for a signal or Ctrl-C, else "failed"."""
        word = "stopped" if isinstance(exc, KeyboardInterrupt) else "failed"
        self.close(f"{word} in {where}" if where else word)

    def close(self, summary: str = "") -> None:
        """End the bar with one line: ``desc: summary (time)``."""
        if self._tqdm is not None:
            self._tqdm.close()
            self._tqdm = None
        took = fmt_seconds(self.console.clock() - self.t0)
        self.console.line(f"  {self.desc}: {summary or 'done'} ({took})")


class Console:
    """Writes a pipeline's progress to ``stream`` (stdout by default).

    Args:
        live: tqdm bars (default: when ``stream`` is a terminal); else plain lines.
        heartbeat_s: seconds between progress lines of one unit when not live.
    """

    def __init__(self, stream: TextIO | None = None, live: bool | None = None,
                 heartbeat_s: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.stream = stream if stream is not None else sys.stdout
        self.live = bool(self.stream.isatty()) if live is None else live
        self.heartbeat_s = heartbeat_s
        self.clock = clock
        self.lines = 0

    def line(self, text: str) -> None:
        """One line, above any live bar."""
        for part in text.splitlines() or [""]:
            self.lines += 1
            if self.live:
                tqdm.write(part, file=self.stream)
            else:
                self.stream.write(part + "\n")
                self.stream.flush()

    def stage(self, index: int, total: int, name: str, detail: str = "") -> None:
        """``[index/total] name: detail``."""
        self.line(f"[{index}/{total}] {name}" + (f": {detail}" if detail else ""))

    def bar(self, desc: str, total: int, unit: str = "it") -> Bar:
        return Bar(self, desc, total, unit)

    def handler(self, level: int = logging.WARNING) -> logging.Handler:
        """A logging handler that prints records of ``level`` and above as console lines."""
        return _ConsoleHandler(self, level)


class _ConsoleHandler(logging.Handler):
    """Log records as console lines. When the console's stream cannot be written (a closed
    pipe, a closed test capture) it falls silent instead of printing logging's "--- Logging
    error ---" traceback for every later record; the run's log file still has them."""

    def __init__(self, console: Console, level: int) -> None:
        super().__init__(level)
        self.console = console
        self.failed = False
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 - logging's name
        self.failed = True

    def emit(self, record: logging.LogRecord) -> None:
        if self.failed:
            return
        try:
            text = self.format(record)
            if record.levelno < logging.WARNING:
                text = text.split(": ", 1)[-1]  # with -v, INFO lines read as plain progress
            self.console.line(text.replace("WARNING ", "warning: ", 1)
                              .replace("ERROR ", "error: ", 1))
        except Exception:  # noqa: BLE001 - a broken handler must not break the run
            self.handleError(record)


class _Discard(io.TextIOBase):
    def write(self, text: str) -> int:
        return len(text)


SILENT = Console(stream=_Discard(), live=False, heartbeat_s=float("inf"))
"""The console of library calls made without one (tests, notebooks): prints nothing."""


class _LogLines(io.TextIOBase):
    """A text stream whose lines become INFO records of ``logger``."""

    def __init__(self, logger: logging.Logger) -> None:
        self.logger, self.pending = logger, ""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        *lines, self.pending = (self.pending + text).split("\n")
        for line in lines:
            if line.strip():
                self.logger.info("%s", line)
        return len(text)

    def flush(self) -> None:
        if self.pending.strip():
            self.logger.info("%s", self.pending)
        self.pending = ""


@contextlib.contextmanager
def printed_to_log(logger: logging.Logger, enabled: bool = True) -> Iterator[None]:
    """What a library prints on this process's stdout inside the block becomes INFO lines of
    ``logger`` (so the run's log, not the terminal); a :class:`Console` keeps writing to the
    stream it was made with. ``enabled=False`` leaves stdout alone."""
    if not enabled:
        yield
        return
    stream = _LogLines(logger)
    try:
        with contextlib.redirect_stdout(stream):
            yield
    finally:
        stream.flush()
