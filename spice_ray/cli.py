"""Shared command-line plumbing for pipelines/ and sweeps/: config flags, logging, Ray start-up."""

from __future__ import annotations

import argparse
import errno
import logging
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from spice_ray.config import ENV_NAMES, PRESET_NAMES, ConfigError, RunConfig, make_config

log = logging.getLogger("spice_ray")


def add_config_args(parser: argparse.ArgumentParser, env: bool = True) -> None:
    """--preset, --env, --config, --set, --out and --address."""
    parser.add_argument("--preset", choices=PRESET_NAMES, default="small",
                        help="scale preset (default: small, the laptop study)")
    if env:
        parser.add_argument("--env", choices=ENV_NAMES, default="bandit",
                            help="environment family (default: bandit)")
    parser.add_argument("--config", type=Path, default=None,
                        help="YAML file of config values applied over the preset")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="SECTION.FIELD=VALUE",
                        help="override one config value, e.g. --set data.num_train_tasks=2000")
    parser.add_argument("--out", type=Path, default=None,
                        help="run directory (default: runs/<preset>)")
    parser.add_argument("--address", default=None,
                        help="join a running Ray cluster (e.g. 'auto'); default: start a local one")


def config_from_args(args: argparse.Namespace, env: str | None = None) -> RunConfig:
    """Resolve the config from parsed flags; exits with status 2 and the field's name if bad."""
    # Absolute: Ray workers and actors run in other working directories.
    out = Path(args.out) if args.out else Path("runs") / args.preset
    extra = {"out_dir": str(out.resolve())}
    try:
        return make_config(args.preset, env or args.env, yaml_path=args.config,
                           overrides=args.overrides, extra=extra)
    except ConfigError as exc:
        print(f"error: bad config: {exc}", file=sys.stderr)
        raise SystemExit(2) from exc


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


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


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


def run_main(fn: Callable[..., Any], *args: Any) -> Any:
    """Call a pipeline's main; known failures exit with status 1 and a one-line message."""
    from spice_ray.config import ConfigError
    from spice_ray.data.store import DatasetError
    from spice_ray.results.tables import ResultsError
    from spice_ray.train.checkpoint import CheckpointError

    try:
        return fn(*args)
    except (ConfigError, DatasetError, CheckpointError, ResultsError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(1) from exc
    except OSError as exc:
        if exc.errno not in _WRITE_ERRNOS:
            raise
        where = f" ({exc.filename})" if exc.filename else ""
        print(f"error: cannot write{where}: {exc.strerror}. Free space or choose another "
              "--out; completed stages are kept and a re-run resumes.", file=sys.stderr)
        raise SystemExit(1) from exc
