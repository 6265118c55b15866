"""Where a machine's CPU goes while one process lives, by kind of process (Linux).

    python -m pytest -q -p no:cacheprovider & python -m tools.cpu_by_process --pid $!

Samples every process's CPU time (``/proc/<pid>/stat``: user + system) every ``--every``
seconds until process ``--pid`` ends, then prints the CPU-seconds each kind of process used
meanwhile: Ray's workers by their title (``ray::EvalActor``, ``ray::RayTrainWorker``, an idle
one as ``ray::IDLE``), Ray's daemons by name (raylet, GCS, dashboard agent, log monitor, ...),
other Python processes by their script, module or ``-c``, the rest by executable. Beside
them: the machine's total CPU-seconds (``/proc/stat``) and the share the sampled processes
account for; a process that starts and ends between two samples is missed, one that ends
loses at most one interval. The whole machine is sampled, so anything else running is
counted too (under its own kind). Reads ``/proc`` only; writes nothing but ``--csv``.

Why: the suite is bound by CPU on two cores, and most of it is not the tests' own work but
the processes they start (Ray's daemons and helper actors, evaluation actors, Tune trials,
Train workers). This says which.
"""

from __future__ import annotations

import argparse
import csv
import os
import re
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
RAY_DAEMONS = {"gcs_server": "ray daemon: GCS", "raylet": "ray daemon: raylet",
               "dashboard/agent.py": "ray daemon: dashboard agent",
               "runtime_env/agent": "ray daemon: runtime env agent",
               "dashboard/dashboard.py": "ray daemon: dashboard",
               "log_monitor.py": "ray daemon: log monitor",
               "autoscaler/_private/monitor.py": "ray daemon: autoscaler monitor"}
"""A fragment of a Ray daemon's command line -> its kind."""
EXECNET_BOOTSTRAP = "import sys;exec(eval(sys.stdin.readline()))"
"""The ``-c`` code of a process execnet starts (pytest-xdist's workers)."""


def kind_of(name: str, cmdline: str) -> str:
    """A process's kind from its name (``comm``) and its latest command line."""
    if cmdline.startswith("ray::"):  # a Ray worker's title: ray::Class, ray::Class.method
        title = cmdline.split()[0][5:].split(".")[0]
        return "ray::" + (title.removeprefix("IDLE") or "IDLE")
    for fragment, kind in RAY_DAEMONS.items():
        if fragment in cmdline:
            return kind
    args = cmdline.split()
    if args and re.search(r"python[\d.]*$", Path(args[0]).name):
        if "-m" in args[1:-1]:
            return "python -m " + args[args.index("-m") + 1]
        if "-c" in args[1:]:
            code = cmdline.split(" -c ", 1)[-1]
            # execnet's bootstrap: the process a pytest-xdist worker runs its tests in
            return ("pytest-xdist worker" if code.startswith(EXECNET_BOOTSTRAP)
                    else "python -c")
        script = next((a for a in args[1:] if not a.startswith("-")), "")
        return "python " + Path(script).name if script else "python"
    return name


@dataclass
class Seen:
    """One process (a pid and its start time): its name, latest command line and CPU-seconds
    when first and last sampled."""

    name: str
    cmdline: str
    first: float
    last: float
    counted_from_start: bool

    @property
    def used(self) -> float:
        """CPU-seconds used while sampled (since its start when it started meanwhile)."""
        return self.last - (0.0 if self.counted_from_start else self.first)


def _read(pid: str) -> tuple[str, float, str, str] | None:
    """(start time, CPU-seconds, name, state) of ``pid``, or None if it is gone."""
    try:
        stat = (PROC / pid / "stat").read_text()
    except OSError:
        return None
    name = stat[stat.index("(") + 1:stat.rindex(")")]
    rest = stat[stat.rindex(")") + 2:].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return rest[19], (int(rest[11]) + int(rest[12])) / ticks, name, rest[0]


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, ended but not yet reaped by its parent, does not)."""
    got = _read(str(pid))
    return got is not None and got[3] not in "ZX"


def _cmdline(pid: str) -> str:
    try:
        raw = (PROC / pid / "cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()


def machine_cpu() -> float:
    """CPU-seconds the machine has spent busy (user, nice, system, irq, softirq) since boot."""
    fields = (PROC / "stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _, _, irq, softirq = (int(v) for v in fields[:7])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def sample(pid: int, every: float = 0.5) -> tuple[dict[str, Seen], float, float]:
    """Sample until ``pid`` ends: ({pid:start: Seen}, the machine's busy CPU-seconds, wall)."""
    me = str(os.getpid())
    seen: dict[str, Seen] = {}
    busy0, t0, first_pass = machine_cpu(), time.perf_counter(), True
    while True:
        alive = _alive(pid)
        for entry in os.listdir(PROC):
            if not entry.isdigit() or entry == me:
                continue
            got = _read(entry)
            if got is None:
                continue
            start, cpu, name, _ = got
            key = f"{entry}:{start}"
            known = seen.get(key)
            if known is None:
                known = seen[key] = Seen(name, _cmdline(entry), cpu, cpu, not first_pass)
            elif cpu > known.last:
                known.last = cpu
                # a Ray worker retitles itself; an exiting process has an empty command line
                known.cmdline = _cmdline(entry) or known.cmdline
        first_pass = False
        if not alive:
            break
        time.sleep(every)
    return seen, machine_cpu() - busy0, time.perf_counter() - t0


def by_kind(seen: dict[str, Seen]) -> list[tuple[str, float, int]]:
    """(kind, CPU-seconds, processes), most CPU first; a process counts under the kind of its
    last command line (a Ray worker starts as ``python default_worker.py`` and retitles)."""
    cpu: Counter[str] = Counter()
    n: Counter[str] = Counter()
    for s in seen.values():
        if s.used <= 0:
            continue
        kind = kind_of(s.name, s.cmdline)
        cpu[kind] += s.used
        n[kind] += 1
    return [(k, v, n[k]) for k, v in cpu.most_common()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pid", type=int, required=True,
                        help="sample while this process lives (e.g. $! of a command you "
                             "started in the background)")
    parser.add_argument("--every", type=float, default=0.5, help="seconds between samples")
    parser.add_argument("--top", type=int, default=30, help="kinds to print")
    parser.add_argument("--csv", type=Path, help="also write every kind to this file")
    args = parser.parse_args(argv)
    if not PROC.joinpath("stat").is_file():
        parser.error("--pid: this tool reads /proc, which this machine does not have")
    if not (PROC / str(args.pid)).is_dir():
        parser.error(f"--pid: no process {args.pid} is running")
    if args.every <= 0:
        parser.error(f"--every: {args.every} is not a positive number of seconds")
    seen, busy, wall = sample(args.pid, args.every)
    rows = by_kind(seen)
    sampled = sum(v for _, v, _ in rows)
    print(f"{'CPU-s':>9} {'procs':>6}  kind (while pid {args.pid} ran: {wall:.0f} s wall)")
    for kind, v, n in rows[:args.top]:
        print(f"{v:9.1f} {n:6d}  {kind}")
    if len(rows) > args.top:
        rest = rows[args.top:]
        print(f"{sum(v for _, v, _ in rest):9.1f} {sum(n for *_, n in rest):6d}  "
              f"({len(rest)} other kinds)")
    print(f"sampled {sampled:.0f} CPU-s of the machine's {busy:.0f} busy CPU-s "
          f"({sampled / busy:.0%}; the rest: processes shorter than {args.every} s, "
          "the last interval of each that ended, the kernel's own)" if busy > 0 else
          f"sampled {sampled:.0f} CPU-s")
    if args.csv:
        with args.csv.open("w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["kind", "cpu_seconds", "processes"])
            writer.writerows((k, f"{v:.2f}", n) for k, v, n in rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
