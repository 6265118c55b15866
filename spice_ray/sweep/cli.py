"""Command-line helpers of sweeps/*.py: flags, start-up checks, the console's summary."""

from __future__ import annotations

import argparse
import importlib.util
from collections.abc import Sequence
from typing import Any

import pandas as pd

from spice_ray.config import RunConfig
from spice_ray.console import Console
from spice_ray.sweep.driver import SweepResult
from spice_ray.sweep.resources import trial_bundles


def format_best(summary: pd.DataFrame, top: int = 5) -> str:
    """The ``top`` configurations as text lines (rank, final regret +- SEM, params)."""
    lines = []
    for row in summary.head(top).itertuples(index=False):
        stopped = "" if row.complete else ", stopped early"
        lines.append(f"  #{row.rank:<3d} final regret {row.mean:9.4f} +- {row.sem:7.4f} "
                     f"(n={row.n}, seeds={row.seeds}{stopped})  {row.params}")
    return "\n".join(lines)


def add_sweep_args(parser: argparse.ArgumentParser, retrain: bool = False) -> None:
    """Sweep flags shared by sweeps/*.py: --fresh, --curve-points, --top (and
    --train-in-trials for retraining sweeps)."""
    parser.add_argument("--fresh", action="store_true",
                        help="move an existing experiment aside and start again "
                             "(default: restore it; finished trials are kept)")
    parser.add_argument("--curve-points", type=int, default=50,
                        help="steps kept per regret curve in the table (0: every step)")
    parser.add_argument("--top", type=int, default=5, help="best configurations printed")
    if retrain:
        parser.add_argument("--train-in-trials", action="store_true",
                            help="let each trial train its model in-process (parallel on a "
                                 "cluster) instead of pretraining every variant first")


def sweep_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """run_sweep keyword arguments from the parsed flags: resume, curve_points."""
    return {"resume": not args.fresh, "curve_points": args.curve_points or None}


def start_sweep(args: argparse.Namespace, cfgs: Sequence[RunConfig],
                train_in_trial: bool = False, console: Console | None = None) -> Any:
    """:func:`spice_ray.cli.start_run` for a sweep: its datasets, pretraining and each trial's
    placement group must fit the cluster, its tracker and searcher must be installed. Returns
    the run directory's lock."""
    from spice_ray.cli import fail, start_run
    from spice_ray.resources import sweep_request
    for cfg in cfgs:
        if cfg.sweep.search == "optuna" and importlib.util.find_spec("optuna") is None:
            fail("sweep.search=optuna needs the optuna package: pip install "
                 "'spice-ray[search]'")
    first = cfgs[0]
    return start_run(args.address, cfgs, first.out_dir, stages=("datasets", "pretrain"),
                     extra_requests=lambda: [sweep_request(c, trial_bundles(c, train_in_trial))
                                             for c in cfgs],
                     console=console, verbose=getattr(args, "verbose", False))


def format_result(result: SweepResult, top: int = 5) -> str:
    """Where a sweep's tables are and its best configurations, as text for the console."""
    how = "restored" if result.restored else "new"
    return "\n".join([
        f"sweep {result.name} ({how}, {result.new_trials} trials run now, "
        f"{len(result.trials)} in all, {result.seconds:.0f} s)",
        f"  table:   {result.table_path}",
        f"  summary: {result.summary_path}",
        "  best (lowest final regret):",
        format_best(result.summary, top)])
