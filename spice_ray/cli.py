"""Shared command-line plumbing for pipelines/ and sweeps/: config flags, logging, Ray start-up."""

from __future__ import annotations

import argparse
import errno
import logging
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from spice_ray import envs, runlock
from spice_ray.config import (
    PRESET_NAMES,
    ConfigError,
    RunConfig,
    make_config,
    resolve_run_dir,
)
from spice_ray.errors import SpiceRayError
from spice_ray.runlock import RunLock

log = logging.getLogger("spice_ray")


def add_config_args(parser: argparse.ArgumentParser, env: bool = True) -> None:
    """--preset, --env, --config, --set, --out and --address."""
    parser.add_argument("--preset", choices=PRESET_NAMES, default="small",
                        help="scale preset (default: small, the laptop study)")
    if env:
        parser.add_argument("--env", choices=envs.names(), default="bandit",
                            help="environment family (default: bandit)")
    parser.add_argument("--config", type=Path, default=None,
                        help="YAML file of config values applied over the preset")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="SECTION.FIELD=VALUE",
                        help="override one config value, e.g. --set data.num_train_tasks=2000")
    parser.add_argument("--out", type=out_path, default=None,
                        help="run directory (default: runs/<preset>)")
    parser.add_argument("--address", default=None,
                        help="join a running Ray cluster (e.g. 'auto'); default: start a local one")


def out_path(text: str) -> Path:
    """argparse type of --out: a non-empty path (an empty one would mean the current
    directory)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty (it would write the run into the "
                                         "current directory)")
    return Path(text)


def config_from_args(args: argparse.Namespace, env: str | None = None) -> RunConfig:
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


def start_run(address: str | None, cfgs: Sequence[RunConfig], run_dir: str | Path,
              stages: Sequence[str] = ("datasets", "pretrain", "evaluate"),
              extra_requests: Callable[[], Sequence[Any]] | None = None) -> RunLock:
    """Everything a pipeline does before its first unit of work, each failing at once with one
    line and status 2: the run directory is writable, no other run holds it (its lock is taken
    and returned: keep it until the end), the datasets fit on disk and in memory, Ray starts
    (or is joined), and every stage's resource request fits the cluster.

    Args:
        extra_requests: called after Ray starts, returns more
            :class:`spice_ray.resources.Request` (e.g. a sweep trial's placement group).
    """
    import ray

    from spice_ray import resources

    run_dir = check_writable(run_dir)
    try:
        lock = runlock.acquire(run_dir)
    except runlock.RunDirectoryLocked as exc:
        fail(str(exc))
    problems = resources.check_sizes(cfgs, run_dir)
    if not problems:
        setup_logging()
        started = not ray.is_initialized()
        init_ray(address)
        problems = resources.check_requests(_requests(cfgs, stages, extra_requests),
                                            resources.cluster_capacity(address))
        if problems and started:
            ray.shutdown()
    if problems:
        lock.release()
        fail("\nerror: ".join(problems))
    return lock


def _requests(cfgs: Sequence[RunConfig], stages: Sequence[str],
              extra: Callable[[], Sequence[Any]] | None) -> list[Any]:
    from spice_ray.placement import DATAGEN, TRAINER, placement_resources
    from spice_ray.resources import stage_requests
    from spice_ray.train.ray_train import gpus_available

    labels = {"datagen": placement_resources(DATAGEN), "trainer": placement_resources(TRAINER)}
    out = []
    for cfg in cfgs:
        use_gpu = gpus_available(cfg.train.use_gpu) if "pretrain" in stages else False
        out += stage_requests(cfg, stages, use_gpu=use_gpu, labels=labels)
    return out + list(extra() if extra else [])


def setup_logging(level: int = logging.INFO) -> None:
    """Plain timestamped log lines for the pipelines."""
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S")


def init_ray(address: str | None = None, num_cpus: int | None = None):
    """Start an embedded local Ray (default) or join a cluster (``address``, e.g. "auto")."""
    import ray
    from ray.data import DataContext

    if ray.is_initialized():
        return ray
    if address:
        ray.init(address=address, log_to_driver=True)
    else:
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # local only; never on a cluster
        ray.init(address="local", num_cpus=num_cpus or os.cpu_count(), include_dashboard=False,
                 log_to_driver=True, logging_level="WARNING")
    ctx = DataContext.get_current()
    ctx.enable_progress_bars = sys.stderr.isatty()
    ctx.execution_options.verbose_progress = False
    log.info("Ray %s: %s", ray.__version__, ray.cluster_resources())
    return ray


def check_writable(directory: str | Path) -> Path:
    """Create ``directory`` and prove a file can be written there, before any work starts.

    Raises:
        SystemExit(2): with a message naming the directory, if it cannot be written.
    """
    directory = Path(directory)
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


def run_main(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call a pipeline's main; known failures exit with status 1 and a one-line message."""
    try:
        return fn(*args, **kwargs)
    except SpiceRayError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(1) from exc
    except OSError as exc:
        if exc.errno not in _WRITE_ERRNOS:
            raise
        where = f" ({exc.filename})" if exc.filename else ""
        print(f"error: cannot write{where}: {exc.strerror}. Free space or choose another "
              "--out; completed stages are kept and a re-run resumes.", file=sys.stderr)
        raise SystemExit(1) from exc
