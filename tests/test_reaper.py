"""A killed driver leaves no Ray process behind (``spice_ray/runtime/reaper.py``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

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
from spice_ray.runtime.cli import init_ray
import time
init_ray(num_cpus=1)
print("ready", flush=True)
time.sleep(300)
"""


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="the reaper reads /proc")
def test_a_sigkilled_drivers_ray_processes_end_within_seconds() -> None:
    """Killed with SIGKILL, a driver that started its own Ray leaves nothing running seconds
    later: without the reaper its dashboard and runtime-env agents linger for a minute."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_AUTH_MODE": "disabled"}
    driver = subprocess.Popen([sys.executable, "-c", DRIVER], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True, env=env, cwd=ROOT)
    tree: dict[int, int] = {}
    try:
        assert driver.stdout.readline().strip() == "ready"
        time.sleep(1.2)  # the reaper records the tree once a second
        tree = reaper.descendants(driver.pid)
        assert len(tree) >= 5  # GCS, raylet, agents, dashboard, the reaper, ...
        driver.send_signal(signal.SIGKILL)
        driver.wait()
        deadline = time.monotonic() + 20
        while reaper.alive(tree) and time.monotonic() < deadline:
            time.sleep(0.5)
        left = reaper.alive(tree)
        assert left == [], [Path(f"/proc/{p}/comm").read_text().strip() for p in left]
    finally:
        driver.kill()
        for pid in reaper.alive(tree):
            os.kill(pid, signal.SIGKILL)
