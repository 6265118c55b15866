"""Shared command-line plumbing for pipelines/ and sweeps/: config flags, logging, Ray start-up."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

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
    extra = {"out_dir": str(args.out)} if args.out else {"out_dir": f"runs/{args.preset}"}
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
