"""Shared command-line plumbing for pipelines/ and sweeps/: config flags, logging, Ray start-up."""

from __future__ import annotations

import argparse
import atexit
import errno
import logging
import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from spice_ray.common import runlock
from spice_ray.common.artifacts import publish_dir
from spice_ray.common.console import Console
from spice_ray.common.errors import SpiceRayError, Stopped, current_stage, excerpt
from spice_ray.common.runlock import RunLock
from spice_ray.config import (
    ConfigError,
    ExperimentConfig,
    make_config,
    resolve_run_dir,
)
from spice_ray.runtime import reaper
from spice_ray.runtime.args import add_config_args, out_path  # noqa: F401 -- re-exported
from spice_ray.runtime.reach import (
    ClusterUnreachable,
    RayStartFailed,
    check_reachable,
    start_local,
)

log = logging.getLogger("spice_ray")


def config_from_args(args: argparse.Namespace, env: str | None = None) -> ExperimentConfig:
    """Resolve the config from parsed flags; exits with status 2 and the field's name if bad."""
    try:
        run_dir = resolve_run_dir(args.out, args.preset, args.config, args.overrides)
        return make_config(args.preset, env or args.env, yaml_path=args.config,
                           overrides=args.overrides, extra={"out_dir": str(run_dir)})
    except ConfigError as exc:
        print(f"error: bad config: {exc}", file=sys.stderr)
        raise SystemExit(2) from exc


def fail(message: str, status: int = 2) -> NoReturn:
    """Print ``error: message`` on stderr and exit with ``status``."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(status)


def start_run(address: str | None, cfgs: Sequence[ExperimentConfig], run_dir: str | Path,
              stages: Sequence[str] = ("datasets", "pretrain", "evaluate"),
              extra_requests: Callable[[], Sequence[Any]] | None = None,
              console: Console | None = None, verbose: bool = False,
              dashboard: bool = False) -> RunLock:
    """Everything a pipeline does before its first unit of work, each failing at once with one
    line and status 2: the run directory is writable, no other run holds it (its lock is taken
    and returned: keep it until the end), the datasets fit on disk and in memory, Ray starts
    (or is joined), and every stage's resource request fits the cluster. Logs are routed first
    (:func:`setup_logging`). A local Ray that does not start in two tries (a loaded machine,
    :func:`spice_ray.runtime.reach.start_local`) also ends in one line, with status 1.

    Args:
        extra_requests: called after Ray starts, returns more
            :class:`spice_ray.runtime.resources.Request` (e.g. a sweep trial's placement group).
        console: where warnings print (default: stdout).
        verbose: also print INFO lines and Ray's logs on the console.
        dashboard: start a local Ray's dashboard even when no config trains with Ray Train
            (``train.num_workers > 0``, which needs it).
    """
    import ray

    from spice_ray.common.faults import stop_before_run
    from spice_ray.runtime import resources
    from spice_ray.runtime.tracking import TrackingError, check_available

    stop_before_run(Path(sys.argv[0]).name)

    for cfg in cfgs:  # a tracker that cannot start would fail after the first model
        try:
            check_available(cfg.track)
        except TrackingError as exc:
            fail(str(exc))
    run_dir = check_writable(run_dir)
    try:
        lock = runlock.acquire(run_dir)
    except runlock.RunDirectoryLocked as exc:
        fail(str(exc))
    if links := runlock.links_out(run_dir):
        lock.release()
        (link, target), more = links[0], len(links) - 1
        fail(f"{link} is a symbolic link to {target}, outside the run directory: a run writes "
             "only inside its --out, and this link would carry its writes there. Replace it "
             "with the folder or file itself, or put the whole --out on that disk"
             + (f" ({more} more link{'s' if more > 1 else ''} like it)" if more else ""))
    problems = resources.size_problems(cfgs, run_dir, address)
    if not problems:
        console = console or Console()
        try:
            setup_logging(run_dir, console, verbose)
        except runlock.UnsafeRunPath as exc:
            lock.release()
            fail(str(exc))
        started = not ray.is_initialized()
        try:
            trains = "pretrain" in stages and any(c.train.on_ray_train for c in cfgs)
            init_ray(address, verbose=verbose, console=console, dashboard=dashboard or trains)
        except ClusterUnreachable as exc:
            lock.release()
            fail(str(exc))
        except RayStartFailed as exc:  # not the input's fault: status 1, as a failed stage
            lock.release()
            fail(str(exc), status=1)
        problems = resources.check_requests(_requests(cfgs, stages, extra_requests),
                                            resources.cluster_capacity(address))
        if problems and started:
            ray.shutdown()
    if problems:
        lock.release()
        fail("\nerror: ".join(problems))
    atexit.register(lock.release)  # also after a failure or a signal (idempotent)
    atexit.register(_collect_quietly, run_dir)  # runs first: also after a failure or a signal
    return lock


def _collect_quietly(run_dir: Path) -> None:
    try:
        collect_ray_logs(run_dir)
    except OSError as exc:  # a full disk must not hide the run's own error (the last line)
        why = exc.args[0][0][2] if isinstance(exc, shutil.Error) and exc.args[0] else exc
        log.info("could not copy Ray's logs to %s/logs/ray: %s", run_dir, str(why)[:300])


def _requests(cfgs: Sequence[ExperimentConfig], stages: Sequence[str],
              extra: Callable[[], Sequence[Any]] | None) -> list[Any]:
    from spice_ray.common.placement import DATAGEN, TRAINER, placement_resources
    from spice_ray.runtime.resources import gpus_available, stage_requests

    labels = {"datagen": placement_resources(DATAGEN), "trainer": placement_resources(TRAINER)}
    out = []
    for cfg in cfgs:
        use_gpu = gpus_available(cfg.train.use_gpu) if "pretrain" in stages else False
        out += stage_requests(cfg, stages, use_gpu=use_gpu, labels=labels)
    return out + list(extra() if extra else [])


RAY_LOGGERS = ("ray", "ray.data", "ray.train", "ray.tune", "ray.air", "ray.util")
"""Ray's Python loggers in this process: routed to ``<run>/logs/ray-driver.log`` (and the
console with ``--verbose``) instead of the stderr handlers Ray installs."""
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_LOG_DIR: list[Path] = []


class _LogFile(logging.FileHandler):
    """The run's log file. When it cannot be written (a full disk) it falls silent instead of
    printing logging's "--- Logging error ---" traceback for every record: the failure that
    matters is reported by the stage that hit it."""

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 - logging's name
        self.failed = True

    def _open(self):  # appends to a regular file of the run, never through a symbolic link
        fd = runlock.open_in_run(self.baseFilename, os.O_WRONLY | os.O_APPEND)
        return os.fdopen(fd, "a", encoding=self.encoding, errors=self.errors)


def _file_handler(path: Path) -> logging.Handler:
    handler = _LogFile(path)
    handler.setFormatter(logging.Formatter(LOG_FORMAT, datefmt="%Y-%m-%d %H:%M:%S"))
    handler.spice_ray = True  # type: ignore[attr-defined]
    return handler


def _replace_ours(logger: logging.Logger, *handlers: logging.Handler) -> None:
    for old in [h for h in logger.handlers if getattr(h, "spice_ray", False)]:
        logger.removeHandler(old)
        old.close()
    for handler in handlers:
        logger.addHandler(handler)


def setup_logging(run_dir: str | Path, console: Console, verbose: bool = False) -> Path:
    """Route this process's log lines to ``<run_dir>/logs/driver.log``.

    The console shows our warnings and errors (and, with ``verbose``, our INFO lines);
    progress is the console's own (``spice_ray.common.console``). Ray's loggers go to
    ``logs/ray-driver.log`` (:func:`init_ray`), and Ray's worker processes keep their output
    in the Ray session directory, which :func:`collect_ray_logs` copies to ``logs/ray``.

    Returns:
        The log directory.
    """
    logs = Path(run_dir) / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    _LOG_DIR[:] = [logs]
    root = logging.getLogger()
    _replace_ours(root, _file_handler(logs / "driver.log"))
    root.setLevel(logging.INFO)
    shown = console.handler(logging.INFO if verbose else logging.WARNING)
    shown.spice_ray = True  # type: ignore[attr-defined]
    _replace_ours(logging.getLogger("spice_ray"), shown)
    logging.captureWarnings(True)  # Python warnings (e.g. from libraries) to the log file
    return logs


def _route_ray_loggers(console: Console | None) -> None:
    """Replace the stderr handlers Ray installs on its loggers (at import of ``ray``,
    ``ray.data``, ...) with ``logs/ray-driver.log`` (and the console when verbose)."""
    if not _LOG_DIR:
        return
    file = _file_handler(_LOG_DIR[0] / "ray-driver.log")
    file.setLevel(logging.INFO)  # Ray Data logs DEBUG to its own file in the session logs
    for name in RAY_LOGGERS:
        logger = logging.getLogger(name)
        shown = []
        if console is not None:
            shown = [console.handler(logging.INFO)]
            shown[0].spice_ray = True  # type: ignore[attr-defined]
        logger.handlers = []
        _replace_ours(logger, file, *shown)
        logger.propagate = False


def collect_ray_logs(run_dir: str | Path) -> Path | None:
    """Copy this Ray session's log directory (driver, raylet, GCS and every worker's output)
    to ``<run_dir>/logs/ray`` (replacing an older copy); returns it, or None when Ray is not
    running in this process. On a multi-node cluster it holds the head node's logs (``ray
    logs`` lists the others)."""
    try:
        import ray

        # The session's log directory (/tmp/ray/session_*/logs by default) is only reachable
        # as the local node's attribute.
        node = ray._private.worker._global_node
        src = Path(node.get_logs_dir_path()) if node is not None else None
    except (ImportError, AttributeError):
        src = None
    if src is None or not src.is_dir():
        return None
    # never a half copy: on an error (shutil.Error is an OSError) the old copy stays
    def copy(tmp: Path) -> None:
        shutil.copytree(src, tmp, symlinks=True, ignore=shutil.ignore_patterns("*.sock"),
                        copy_function=_copy_if_present, dirs_exist_ok=True)
        runlock.owner_writable_only(tmp)

    return publish_dir(Path(run_dir) / "logs" / "ray", copy, sidecars=False)


def _copy_if_present(src: str, dst: str) -> None:
    try:
        shutil.copy2(src, dst)
    except FileNotFoundError:  # a worker's log rotated away while copying
        pass


WORKER_NICENESS = "RAY_worker_niceness"
"""Ray starts its worker processes (Train workers, evaluation actors, tasks) at nice 15 and its
own daemons (raylet, GCS, the dashboard's dozen processes) at 0. On a 2-core machine a Train
worker's two torch threads can stall at an operator's barrier whenever a daemon wakes. A local
Ray this driver starts runs its workers at 0 unless this variable is set; a cluster's `ray
start` keeps its own setting. The weights are the same either way; the speed-up is not
established: 1.05-1.30x in `fit` over 4 pairs whose order was fixed while the machine sped up,
0.97-0.98x in ``benchmarks/bench_niceness.py``'s 2 pairs."""


def dashboard_installed() -> bool:
    """Whether Ray's dashboard can start here: its packages come with ``ray[default]`` (this
    project's ``dashboard`` extra), not with the ``data``, ``train`` and ``tune`` extras."""
    try:
        import ray.dashboard.optional_deps  # noqa: F401 -- Ray's own check of those packages
    except ImportError:
        return False
    return True


def init_ray(address: str | None = None, num_cpus: int | None = None, verbose: bool = False,
             console: Console | None = None, dashboard: bool = True):
    """Start an embedded local Ray (default) or join a cluster (``address``, e.g. "auto").

    Worker output reaches the console only with ``verbose`` (``log_to_driver``); otherwise it
    stays in the session's log files (:func:`collect_ray_logs`). Ray Data's progress bars are
    off: the pipelines show their own (``spice_ray.common.console``)."""
    import ray
    from ray.data import DataContext

    if ray.is_initialized():  # joined again (e.g. the scaling ladder's next rung): its logs
        _route_ray_loggers(console if verbose else None)  # follow this run's directory
        return ray
    if address:
        check_reachable(address)
        try:
            ray.init(address=address, log_to_driver=verbose)
        except ConnectionError as exc:  # "auto" with no cluster running
            raise ClusterUnreachable(f"no Ray cluster found for --address {address}: "
                                     f"{str(exc).splitlines()[0][:200]}") from None
        log.info("joined the Ray cluster at %s", address)
    else:
        if os.environ.get("RAY_ADDRESS"):
            message = (f"RAY_ADDRESS={os.environ['RAY_ADDRESS']} is set but --address is not: "
                       "this run starts its own local Ray (pass --address auto to join that "
                       "cluster)")
            log.warning(message)
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # local only; never on a cluster
        os.environ.setdefault(WORKER_NICENESS, "0")
        reaper.start()  # ends what this driver's Ray leaves if the driver is killed
        # The dashboard serves the State API, which Ray Train's placement-group cleaner polls
        # (without it, it warns every few seconds); it takes the next free port after 8265.
        # Its ten module processes cost ~4 CPU-seconds per start (2-core machine), so a run
        # that starts no Ray Train job leaves it out unless asked (``dashboard``), and an
        # install without it (the ``dashboard`` extra, Ray's "default") runs without it.
        if dashboard and not dashboard_installed():
            (console.line if console else log.warning)(
                "note: Ray's dashboard is not installed (pip install 'spice-ray[dashboard]'); "
                "Ray Train runs without it and its clean-up logs warnings to the run's logs")
            dashboard = False
        start_local(ray.init, ray.shutdown, num_cpus=num_cpus or os.cpu_count(),
                    include_dashboard=dashboard, log_to_driver=verbose,
                    logging_level="INFO" if verbose else "WARNING")
    _route_ray_loggers(console if verbose else None)
    ctx = DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.execution_options.verbose_progress = False
    log.info("Ray %s: %s", ray.__version__, ray.cluster_resources())
    return ray


def check_writable(directory: str | Path) -> Path:
    """Create ``directory`` and prove a file can be written there, before any work starts.

    Raises:
        SystemExit(2): with a message naming the directory, if it cannot be written.
    """
    directory = Path(directory)
    if any(ord(c) < 32 or ord(c) == 127 for c in str(directory)):
        print(f"error: output directory {excerpt(str(directory))} has a control character "
              "(a newline?) in its name: choose another --out", file=sys.stderr)
        raise SystemExit(2)
    if directory.exists() and not directory.is_dir():
        print(f"error: output directory {directory} is a file, not a directory: choose "
              "another --out", file=sys.stderr)
        raise SystemExit(2)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".write-test-"):
            pass
    except OSError as exc:
        print(f"error: output directory {directory} is not writable: "
              f"{exc.strerror or exc}", file=sys.stderr)
        raise SystemExit(2) from exc
    return directory


# Errors that mean bad input or a broken environment: shown as one clear line, not a traceback.
_WRITE_ERRNOS = {errno.ENOSPC, errno.EACCES, errno.EROFS, errno.EDQUOT, errno.ENOTDIR,
                 errno.EPERM}


_SIGNALLED: list[int] = []
"""Signals received by :func:`run_main`'s handler (libraries such as Ray may catch the
exception it raises and raise a plain KeyboardInterrupt instead, losing which signal it was)."""


def _raise_stopped(signum: int, frame: Any) -> NoReturn:
    _SIGNALLED.append(signum)
    raise Stopped(signum)


def _stop_quietly() -> None:
    """Shut Ray down without its shutdown chatter (after a signal)."""
    try:
        import ray

        if ray.is_initialized():
            ray.shutdown()
    except Exception:  # noqa: BLE001 - already stopping; the exit status says why
        log.debug("ray.shutdown after a signal failed", exc_info=True)


def run_main(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call a pipeline's main; known failures exit with status 1 and a one-line message.

    SIGINT (Ctrl-C) and SIGTERM stop the run cleanly: the stage at work unwinds (its bar says
    "stopped"), Ray shuts down, one line names the signal and says that what finished is kept
    and that the same command resumes, and the exit status is 128 + the signal (130, 143).
    """
    import signal

    handlers = {}
    _SIGNALLED.clear()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            handlers[sig] = signal.signal(sig, _raise_stopped)
    try:
        return fn(*args, **kwargs)
    except KeyboardInterrupt as exc:
        signum = (exc.signum if isinstance(exc, Stopped) else
                  _SIGNALLED[-1] if _SIGNALLED else int(signal.SIGINT))
        for sig, old in handlers.items():  # a second Ctrl-C while shutting down: default
            signal.signal(sig, signal.SIG_DFL if sig == signal.SIGTERM else old)
        _stop_quietly()
        name = signal.Signals(signum).name
        print(f"stopped by {name}{' (Ctrl-C)' if name == 'SIGINT' else ''}: every finished "
              "dataset shard, checkpoint and table is kept; run the same command again to "
              "resume", file=sys.stderr)
        raise SystemExit(128 + signum) from None
    except SpiceRayError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(1) from exc
    except OSError as exc:
        if exc.errno not in _WRITE_ERRNOS:
            raise
        where = f" {exc.filename}" if exc.filename else ""
        stage = current_stage()
        during = f" in stage {stage}" if stage else ""
        print(f"error: cannot write{where}{during}: {exc.strerror}. Free space or choose "
              "another --out; completed stages are kept and a re-run resumes.", file=sys.stderr)
        raise SystemExit(1) from exc
    finally:
        for sig, old in handlers.items():
            signal.signal(sig, old)
