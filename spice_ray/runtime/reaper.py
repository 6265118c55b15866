"""Ends the processes a driver's local Ray instance left behind when the driver was killed.

Run as a script (``python -I reaper.py DRIVER_PID``; it imports nothing of the package, so it
costs a bare interpreter), started by ``spice_ray.runtime.cli.init_ray`` in a session of its own
beside a driver that starts its own Ray. While the driver lives it records, once a second,
every process descended from it (pid and start time, from ``/proc``). When the driver is gone
(killed with SIGKILL, or ended normally) it waits for Ray's own fate-sharing to end what it
ends, then sends SIGTERM, and after a grace period SIGKILL, to each recorded process still
running with the same start time. Without it, a SIGKILLed driver's dashboard and runtime-env
agents outlive it by a minute (each waits 60 s to report the raylet's death to a GCS that died
with it). Linux only (``/proc``); elsewhere it exits at once.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

POLL_S = 1.0
"""Seconds between two records of the driver's process tree."""
SETTLE_S = 1.0
"""Seconds Ray's own processes get to end by themselves once the driver is gone."""
GRACE_S = 2.0
"""Seconds between SIGTERM and SIGKILL."""
RECORDS_ENV = "SPICE_RAY_REAPER_RECORDS"
"""For tests: a file the reaper rewrites with the pids it has recorded after each record, so a
test kills the driver once the reaper knows the tree instead of guessing how long a loaded
machine takes to start it. Unset (always, outside tests): nothing is written."""


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time in clock ticks) of a live process, None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode(errors="replace")
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()  # after "pid (comm) "
    if fields[0] == "Z":  # a zombie is already dead
        return None
    return int(fields[1]), int(fields[19])


_STARTED: list[subprocess.Popen] = []  # kept, so no handle of a running reaper is collected


def start() -> None:
    """Start this script beside the calling driver, before the driver starts its own Ray: in
    a session of its own (a Ctrl-C to the driver's group does not reach it), as a bare
    interpreter (``-I``). Nothing where there is no ``/proc``."""
    if not os.path.isdir("/proc"):
        return
    _STARTED.append(subprocess.Popen(
        [sys.executable, "-I", os.path.abspath(__file__), str(os.getpid())],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True, close_fds=True))


def descendants(root: int) -> dict[int, int]:
    """pid -> start time of every live process under ``root`` (not ``root`` itself)."""
    parents: dict[int, list[int]] = {}
    started: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            stat = _stat(int(name))
            if stat is not None:
                parents.setdefault(stat[0], []).append(int(name))
                started[int(name)] = stat[1]
    out, todo = {}, list(parents.get(root, []))
    while todo:
        pid = todo.pop()
        if pid in started and pid not in out:
            out[pid] = started[pid]
            todo.extend(parents.get(pid, []))
    return out


def alive(recorded: dict[int, int]) -> list[int]:
    """The recorded processes still running as themselves (same start time: no reused pid)."""
    return [pid for pid, start in recorded.items()
            if (stat := _stat(pid)) is not None and stat[1] == start]


def reap(driver: int) -> int:
    """Watch ``driver`` until it is gone, then end what it left; returns how many were."""
    me = os.getpid()
    recorded: dict[int, int] = {}
    report = os.environ.get(RECORDS_ENV, "")
    while os.getppid() == driver:  # reparented: the driver is gone
        recorded.update(descendants(driver))
        if report:
            with open(report + ".tmp", "w") as f:
                f.write(" ".join(map(str, sorted(recorded))))
            os.replace(report + ".tmp", report)
        time.sleep(POLL_S)
    recorded.pop(me, None)
    time.sleep(SETTLE_S)
    left = alive(recorded)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in left:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        deadline = time.monotonic() + GRACE_S
        while (left := alive({p: recorded[p] for p in left})) and time.monotonic() < deadline:
            time.sleep(0.1)
        if not left:
            break
    return len(recorded)


if __name__ == "__main__":
    if os.path.isdir("/proc") and len(sys.argv) == 2 and sys.argv[1].isdigit():
        reap(int(sys.argv[1]))
