"""Command-line helpers of sweeps/*.py: flags, start-up checks, the console's summary."""

from __future__ import annotations

import argparse
import importlib.util
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:  # loaded where they are used: --help answers before pandas, torch or Ray
    import pandas as pd

    from spice_ray.common.console import Console
    from spice_ray.config import ExperimentConfig
    from spice_ray.sweep.driver import SweepResult

T = TypeVar("T")


def shown_params(params: str) -> str:
    """A ``params`` JSON cell for reading: floats to 4 significant digits, sections flattened
    (``fusion.beta=1.142, fusion.kernel=uniform``); the tables keep the exact values."""
    def flat(value: Any, prefix: str = "") -> list[str]:
        if isinstance(value, dict):
            return [item for k in sorted(value) for item in flat(value[k], f"{prefix}{k}.")]
        shown = f"{value:.4g}" if isinstance(value, float) else str(value)
        return [f"{prefix[:-1]}={shown}"]

    from spice_ray.results.schema import settings_of

    try:
        return ", ".join(flat(settings_of(params)))
    except ValueError:
        return str(params)


def format_best(summary: pd.DataFrame, top: int = 5) -> str:
    """The ``top`` configurations as text lines (rank, final regret +- SEM, params rounded)."""
    lines = []
    for row in summary.head(top).itertuples(index=False):
        stopped = "" if row.complete else ", stopped early"
        lines.append(f"  #{row.rank:<3d} final regret {row.mean:9.4f} +- {row.sem:7.4f} "
                     f"(n={row.n}, seeds={row.seeds}{stopped})  {shown_params(row.params)}")
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


def start_sweep(args: argparse.Namespace, cfgs: Sequence[ExperimentConfig],
                train_in_trial: bool = False, console: Console | None = None) -> Any:
    """:func:`spice_ray.runtime.cli.start_run` for a sweep: its datasets, pretraining and each
    trial's placement group must fit the cluster, its tracker and searcher must be installed.
    Returns the run directory's lock."""
    from spice_ray.runtime.cli import fail, start_run
    from spice_ray.runtime.resources import sweep_request
    from spice_ray.sweep.resources import trial_bundles

    for cfg in cfgs:
        if cfg.sweep.search != "grid" and importlib.util.find_spec("optuna") is None:
            fail(f"sweep.search={cfg.sweep.search} needs the optuna package (both sampled "
                 "searches run through it): pip install 'spice-ray[search]'")
    first = cfgs[0]
    return start_run(args.address, cfgs, first.out_dir, stages=("datasets", "pretrain"),
                     extra_requests=lambda: [sweep_request(c, trial_bundles(c, train_in_trial))
                                             for c in cfgs],
                     console=console, verbose=getattr(args, "verbose", False),
                     dashboard=getattr(args, "dashboard", False))


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


def preset_grid(grids: Mapping[str, T], preset: str) -> T:
    """A sweep's grid for ``preset``: its own, else the nearest smaller preset's (``medium``
    inherits ``small``'s)."""
    from spice_ray.config.presets import PRESET_NAMES

    for name in reversed(PRESET_NAMES[:PRESET_NAMES.index(preset) + 1]):
        if name in grids:
            return grids[name]
    raise ValueError(f"no grid for preset {preset!r} or a smaller one (grids: "
                     f"{', '.join(grids)})")


def main(name: str, space: Callable[[ExperimentConfig], dict[str, Any]], doc: str | None = None, *,
         retrain: bool = False, env: str | None = None, both: tuple[str, ...] = (),
         argv: list[str] | None = None) -> None:
    """The whole command line of a sweep script: each ``sweeps/*.py`` holds only its grids
    (as data) and calls this.

    Args:
        name: the sweep's name; its tables are ``<out>/sweeps/<name>_<env>.parquet`` (or
            ``<name>.parquet`` with a fixed ``env``).
        space: the Tune param_space for a validated config.
        doc: the script's docstring (its --help).
        retrain: every trial is a retrained model (``model.*`` or ``variant`` in the space):
            the variants are pretrained first, or in the trials with --train-in-trials;
            otherwise the trials evaluate the config's own checkpoints.
        env: sweep this environment only (no --env flag).
        both: environments swept when ``--env both`` (the default then).
    """
    from spice_ray.runtime.args import add_config_args

    parser = argparse.ArgumentParser(description=doc,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_args(parser, env=env is None and not both)
    if both:
        from spice_ray import envs  # the environment names (this loads the environments)

        parser.add_argument("--env", choices=(*envs.names(), "both"), default="both",
                            help=f"environment to sweep, or both: {' and '.join(both)} "
                                 "(default)")
    add_sweep_args(parser, retrain=retrain)
    args = parser.parse_args(argv)
    # the work's modules only once the flags are known (--help has answered by now)
    from spice_ray.common.console import Console
    from spice_ray.data.generate import generate_stage
    from spice_ray.runtime.cli import config_from_args, run_main
    from spice_ray.sweep.driver import run_sweep
    from spice_ray.sweep.trial import ensure_models, pretrain_grid

    if both:
        names: tuple[str | None, ...] = both if args.env == "both" else (args.env,)
    else:
        names = (env,)
    cfgs = [config_from_args(args, e) for e in names]
    in_trials = retrain and args.train_in_trials  # every config valid before Ray starts
    console = Console()
    lock = start_sweep(args, cfgs, in_trials, console=console)
    for cfg in cfgs:
        grid = space(cfg)
        if retrain:
            ds_dir = run_main(generate_stage, cfg, console=console, label="dataset").dataset_dir
            ckpts = None
            if not in_trials:
                run_main(pretrain_grid, cfg, grid, ds_dir, console=console)
        else:
            ds_dir, ckpts = run_main(ensure_models, cfg, console=console)
        result = run_main(run_sweep, name if env else f"{name}_{cfg.env.name}", cfg, grid,
                          ckpts, ds_dir, cfg.out_dir, train_in_trial=in_trials,
                          **sweep_kwargs(args), console=console)
        console.line(format_result(result, args.top))
    lock.release()
