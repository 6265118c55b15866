"""tools/cpu_by_process.py: each process's CPU, while another lives, counted under its kind."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tools import cpu_by_process as cbp

MARK = "# burns one CPU-second of its own, however busy the machine"
BURN = f"import time\nwhile time.process_time() < 1.0:  {MARK}\n    pass\n"


def test_a_process_kind_comes_from_its_command_line() -> None:
    kinds = {("python3.11", "ray::EvalActor.evaluate"): "ray::EvalActor",
             ("python", "ray::IDLE"): "ray::IDLE",
             ("python", "ray::RayTrainWorker"): "ray::RayTrainWorker",
             ("raylet", "/site-packages/ray/core/src/ray/raylet/raylet --port=0"):
                 "ray daemon: raylet",
             ("python", "/usr/bin/python -u /site-packages/ray/dashboard/agent.py --x"):
                 "ray daemon: dashboard agent",
             ("python3.11", "/usr/bin/python3.11 -m pytest -q"): "python -m pytest",
             ("python", "/v/bin/python -u /repo/pipelines/full_run.py --preset smoke"):
                 "python full_run.py",
             ("python", "/v/bin/python -c import ray"): "python -c",
             ("python", "/v/bin/python -u -c import sys;exec(eval(sys.stdin.readline()))"):
                 "pytest-xdist worker",
             ("bash", "bash -c sleep 1"): "bash",
             ("kworker/0:1", ""): "kworker/0:1"}
    assert {key: cbp.kind_of(*key) for key in kinds} == kinds


@pytest.mark.skipif(not cbp.PROC.joinpath("stat").is_file(), reason="reads /proc (Linux)")
def test_a_child_that_burns_a_cpu_second_is_counted_while_it_lives(capsys) -> None:
    """A child that stops after one CPU-second of its own (not of wall time, so a busy machine
    only makes it last longer): sampled until it ends (a zombie counts as ended), it used
    that second less at most one interval's, under "python -c"; the machine was busy at least
    as long."""
    child = subprocess.Popen([sys.executable, "-c", BURN])
    try:
        seen, busy, wall = cbp.sample(child.pid, every=0.05)
    finally:
        child.wait(timeout=300)
    [mine] = [s for s in seen.values() if MARK in s.cmdline]
    assert 0.9 <= mine.used <= 1.5
    assert busy >= 0.9 and wall > 0
    assert dict((k, v) for k, v, _ in cbp.by_kind(seen))["python -c"] >= mine.used
    # the command line: a pid that does not run is refused naming the flag
    with pytest.raises(SystemExit) as stop:
        cbp.main(["--pid", str(child.pid)])
    assert stop.value.code == 2
    assert f"--pid: no process {child.pid} is running" in capsys.readouterr().err
