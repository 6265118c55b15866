"""Shared fixtures: one local Ray for the integration tests of the whole session."""

from __future__ import annotations

import contextlib
import os
import runpy
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
os.environ.setdefault("RAY_worker_niceness", "0")  # as init_ray starts a local Ray
# Two of Ray Train's own watchers no test reads: the spot-preemption watcher (an actor per
# training run, polling for node drains a local cluster never has) and its Prometheus metrics
# callbacks. Off for the suite's Ray Train jobs, every Ray a test starts and every process it
# spawns (they inherit the variables); a user's run keeps Ray's defaults.
os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")
os.environ.setdefault("RAY_TRAIN_METRICS_ENABLED", "0")
# The suite's two workers share the machine's cores, and torch (and numpy's BLAS) would give
# each worker one thread per core: four threads, two spinning, on two cores (four of the
# modules took 58 s with 101 CPU-seconds that way, 40-44 s with 64-69 at one thread each). One
# thread per test process, and in every process a test starts (they inherit the variable;
# Ray's workers and Train's set their own counts as a run does).
os.environ.setdefault("OMP_NUM_THREADS", "1")
if "torch" in sys.modules:  # imported before this file (a plugin): the variable came too late
    sys.modules["torch"].set_num_threads(1)


@pytest.fixture(scope="session")
def ray_local():
    """A fresh 2-CPU local Ray cluster, shut down at the end of the session."""
    import ray
    from ray.data import DataContext

    from spice_ray.runtime.reach import start_local

    # as a run starts it: Ray's start-up waits raised, a second try on a loaded machine; but
    # without the idle workers Ray starts beside the first driver, which this cluster keeps
    # for the whole session: it then idles at 0.044 CPU-seconds a second instead of 0.068
    # (measured on the 2-core machine), and a test's first task starts its worker instead
    start_local(ray.init, ray.shutdown, num_cpus=2, include_dashboard=False,
                log_to_driver=False, logging_level="ERROR",
                _system_config={"prestart_worker_first_driver": False})
    ctx = DataContext.get_current()
    ctx.execution_options.verbose_progress = False
    ctx.enable_progress_bars = False
    ctx.execution_no_progress_timeout_s = 120  # a stall becomes an error, not a hang
    yield ray
    ray.shutdown()


@pytest.fixture
def one_thread():
    """Torch on one thread for the test: tiny ops run fastest so, and do not stall when the 2
    CPUs are shared (modules take it with ``pytestmark = pytest.mark.usefixtures(...)``)."""
    from spice_ray.model.registry import torch_threads

    with torch_threads(1):
        yield


def full_run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """``pipelines/full_run.py argv`` in the test process (no interpreter start-up): its exit
    status, stdout and stderr. Only for command lines that stop before the study starts."""
    path = Path(__file__).resolve().parents[1] / "pipelines" / "full_run.py"
    cli = runpy.run_path(str(path), run_name="full_run_under_test")["cli"]
    capsys.readouterr()
    try:
        cli(argv)
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


HEAVY_MODULES = ("torch", "pandas", "scipy", "matplotlib", "ray")
"""What a command line's ``--help`` or argument error must not import (seconds of start-up)."""


def heavy_imports(run: str, argv: list[str], cwd: Path | None = None) -> str:
    """Run ``run`` (``runpy``'s call, e.g. ``run_path('pipelines/full_run.py')`` or
    ``run_module('spice_ray.results', alter_sys=True)``, as ``__main__``) with ``argv`` in a
    fresh interpreter: "HEAVY [...] CODE n", the :data:`HEAVY_MODULES` it imported and its
    exit status, for a test to compare with "HEAVY [] CODE 0" (on its stderr's last line)."""
    import subprocess
    import sys

    probe = ("import runpy, sys\n"
             "sys.argv = ['cli'] + sys.argv[1:]\n"
             "code = None\n"
             "try:\n"
             f"    runpy.{run[:-1]}, run_name='__main__')\n"
             "except SystemExit as exc:\n"
             "    code = exc.code\n"
             f"heavy = sorted(m for m in {HEAVY_MODULES!r} if m in sys.modules)\n"
             "print('HEAVY', heavy, 'CODE', code, file=sys.stderr)\n")
    proc = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True, text=True,
                          timeout=120, cwd=cwd)
    lines = proc.stderr.strip().splitlines()
    return lines[-1] if lines and lines[-1].startswith("HEAVY") else proc.stderr[-2000:]


HANG_S = 300
"""The one wall-clock bound a test may hold work to: a hang reaches it, a slow or busy machine
never does (the suite's slowest in-process call takes seconds on a quiet 2-core machine and
some 3x that beside two busy processes). A speed claim is a benchmark's, never a test's."""


class Hang(AssertionError):
    """The guarded block ran past :data:`HANG_S`."""


@contextlib.contextmanager
def hang_guard(what: str, seconds: int = HANG_S) -> Iterator[None]:
    """Fail the test with :class:`Hang` if the block runs past ``seconds`` (SIGALRM; the
    main thread, where pytest and its xdist workers run tests), instead of waiting forever."""
    def expired(signum: int, frame: object) -> None:
        raise Hang(f"{what} still running after {seconds} s: a hang, not a slow machine")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test that takes the session's local Ray carries the ``ray`` marker (``-m "not
    ray"`` then leaves out exactly the tests that start Ray; two of them lacked it)."""
    for item in items:
        if "ray_local" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.ray)
