"""The command lines' shared flags, importing nothing heavy: ``--help`` and an argument error
answer before torch, pandas or Ray load (``tests/test_full_run.py`` checks the imports)."""

from __future__ import annotations

import argparse
from pathlib import Path

from spice_ray.config.presets import PRESET_NAMES


def add_config_args(parser: argparse.ArgumentParser, env: bool = True) -> None:
    """--preset, --env, --config, --set, --out and --address."""
    parser.add_argument("--preset", choices=PRESET_NAMES, default="small",
                        help="scale preset (default: small, the laptop study)")
    if env:
        from spice_ray import envs  # the environment names (this loads the environments)

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
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="also print our INFO lines and Ray's own logs on the console "
                             "(they always go to <run>/logs/)")
    parser.add_argument("--dashboard", action="store_true",
                        help="start Ray's dashboard (http://localhost:8265) with the local Ray; "
                             "default: only when a Ray Train job will run "
                             "(train.num_workers > 0), whose clean-up polls its State API, and "
                             "only where it is installed (the 'dashboard' extra)")


def out_path(text: str) -> Path:
    """argparse type of --out: a non-empty path (an empty one would mean the current
    directory)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty (it would write the run into the "
                                         "current directory)")
    return Path(text)
