"""A killed driver leaves no Ray process behind (``spice_ray/runtime/reaper.py``)."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import hang_guard

from spice_ray.runtime import reaper

ROOT = Path(__file__).resolve().parents[1]


def test_descendants_are_the_whole_tree_and_a_reused_pid_is_not_alive() -> None:
    parent = subprocess.Popen([sys.executable, "-c", (
        "import subprocess, sys, time; "
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
        "print('ready', flush=True); time.sleep(60)")], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout.readline().strip() == "ready"
        tree = reaper.descendants(parent.pid)
        assert len(tree) == 1 and reaper.alive(tree) == list(tree)
        assert reaper.descendants(os.getpid()).keys() >= {parent.pid, *tree}
        pid = next(iter(tree))
        assert reaper.alive({pid: tree[pid] + 1}) == []  # another start time: another process
    finally:
        for pid in reaper.descendants(parent.pid):
            os.kill(pid, signal.SIGKILL)
        parent.kill()
        parent.wait()


DRIVER = """
from spice_ray.runtime import reaper
import subprocess, sys, time
reaper.start()
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
print("ready", flush=True)
time.sleep(3600)
"""


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="the reaper reads /proc")
def test_a_sigkilled_drivers_processes_end_within_seconds(tmp_path) -> None:
    """Killed with SIGKILL, a driver that started the reaper leaves nothing running seconds
    later (here a child that would sleep an hour, past the hang guard; with a driver's own Ray,
    its dashboard and runtime-env agents, which lingered a minute without it: measured, 3.4 s
    with it)."""
    records = tmp_path / "recorded"
    env = {**os.environ, "PYTHONPATH": str(ROOT), reaper.RECORDS_ENV: str(records)}
    driver = subprocess.Popen([sys.executable, "-c", DRIVER], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True, env=env, cwd=ROOT)
    tree: dict[int, int] = {}
    try:
        assert driver.stdout.readline().strip() == "ready"
        tree = reaper.descendants(driver.pid)
        assert len(tree) == 2  # the reaper and the sleeper
        # killed only once the reaper has recorded the whole tree (it starts in its own time
        # on a busy machine, and a driver gone before its first record leaves it nothing)
        with hang_guard("the reaper's first record of the tree"):
            while not records.exists() or set(map(int, records.read_text().split())) < set(
                    tree):
                time.sleep(0.1)
        driver.send_signal(signal.SIGKILL)
        driver.wait()
        with hang_guard("the reaper ending the orphaned tree"):  # it polls once a second
            while reaper.alive(tree):
                time.sleep(0.2)
        assert reaper.alive(tree) == []
    finally:
        driver.kill()
        for pid in reaper.alive(tree):
            os.kill(pid, signal.SIGKILL)


def test_a_driver_that_starts_its_own_ray_starts_the_reaper_first(monkeypatch) -> None:
    """``init_ray`` without an address starts the reaper before Ray (so a driver killed while
    Ray starts is covered too); joining a cluster does not (its processes are not ours)."""
    import ray

    from spice_ray.runtime import cli

    calls: list[str] = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kw: calls.append(f"init {kw['address']}"))
    monkeypatch.setattr(ray, "cluster_resources", dict)
    monkeypatch.setattr(cli.reaper, "start", lambda: calls.append("reaper"))
    monkeypatch.setattr(cli, "check_reachable", lambda address: None)
    monkeypatch.setattr(cli, "_route_ray_loggers", lambda console: None)
    cli.init_ray(num_cpus=1)
    cli.init_ray(address="auto")
    assert calls == ["reaper", "init local", "init auto"]


def test_without_rays_dashboard_installed_a_run_starts_ray_without_it(monkeypatch) -> None:
    """The lean install (Ray's data, train and tune extras; the dashboard is this project's
    ``dashboard`` extra): a run that would start the dashboard for a Ray Train job starts Ray
    without it and says so in one line, instead of failing three start-ups on Ray's
    "Cannot include dashboard with missing packages" (measured in a fresh venv without it:
    the smoke bandit's Ray Train job then ran to its tables with exit 0)."""
    import ray

    from spice_ray.common.console import Console
    from spice_ray.runtime import cli

    asked: list[bool] = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kw: asked.append(kw["include_dashboard"]))
    monkeypatch.setattr(ray, "cluster_resources", dict)
    monkeypatch.setattr(cli.reaper, "start", lambda: None)
    monkeypatch.setattr(cli, "_route_ray_loggers", lambda console: None)
    out = io.StringIO()
    cli.init_ray(num_cpus=1, dashboard=True, console=Console(out))
    assert asked == [cli.dashboard_installed()]  # this environment's: the test extra has it
    monkeypatch.setattr(cli, "dashboard_installed", lambda: False)
    cli.init_ray(num_cpus=1, dashboard=True, console=Console(out))
    cli.init_ray(num_cpus=1, dashboard=False, console=Console(out))
    assert asked[1:] == [False, False]
    assert out.getvalue().count("note: Ray's dashboard is not installed (pip install "
                                "'spice-ray[dashboard]')") == 1


def test_a_local_ray_runs_its_workers_at_the_drivers_priority(monkeypatch, ray_local) -> None:
    """Ray nices its workers to 15 below its daemons; a local Ray of ours asks for 0 before
    it starts (a Train worker's torch threads otherwise stall whenever a daemon wakes), keeps a
    value the user set, and leaves a cluster's alone. The session's Ray is started the same
    way: its tasks run at the test process's own niceness, not 15 above it."""
    import ray

    from spice_ray.runtime import cli

    seen: list[str | None] = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kw: seen.append(os.environ.get(cli.WORKER_NICENESS)))
    monkeypatch.setattr(ray, "cluster_resources", dict)
    monkeypatch.setattr(cli.reaper, "start", lambda: None)
    monkeypatch.setattr(cli, "check_reachable", lambda address: None)
    monkeypatch.setattr(cli, "_route_ray_loggers", lambda console: None)
    monkeypatch.delenv(cli.WORKER_NICENESS, raising=False)
    cli.init_ray(address="auto")
    cli.init_ray(num_cpus=1)
    monkeypatch.setenv(cli.WORKER_NICENESS, "5")
    cli.init_ray(num_cpus=1)
    assert seen == [None, "0", "5"]
    monkeypatch.undo()
    # the driver's own niceness: 0 in CI, more where the suite itself runs niced
    assert ray_local.get(ray_local.remote(lambda: os.nice(0)).remote()) == os.nice(0)
