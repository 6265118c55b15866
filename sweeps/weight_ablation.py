"""Darkroom weight ablation: SPICE retrained with no / only iw / only adv / only epi / all policy
weights (spice_ray.experiments.WEIGHT_VARIANTS), each evaluated online with Ray Tune.

    python sweeps/weight_ablation.py --preset small
    python sweeps/weight_ablation.py --preset smoke --out /tmp/sweep_smoke
    python sweeps/weight_ablation.py --preset paper --address auto --train-in-trials

Every variant and seed is pretrained before the sweep (skipped when current; the same
checkpoints as pipelines/full_run.py's darkroom_weights when --out matches), then each trial
evaluates one variant. --train-in-trials lets the trials train instead (see
sweeps/ensemble_size.py for the trade-off). Tables: <out>/sweeps/weight_ablation.parquet and
..._summary.parquet (the `variant` column names the variant).
"""

from __future__ import annotations

import argparse
from typing import Any

from spice_ray.cli import add_config_args, config_from_args, run_main
from spice_ray.console import Console
from spice_ray.experiments import WEIGHT_VARIANTS
from spice_ray.stages import generate_stage
from spice_ray.sweep import (
    add_sweep_args,
    format_result,
    pretrain_grid,
    run_sweep,
    start_sweep,
    sweep_kwargs,
)

VARIANTS = (*WEIGHT_VARIANTS, "all")
"""none, iw, adv, epi (one weight each, or none) and all (the main SPICE model)."""


def search_space() -> dict[str, Any]:
    """Tune param_space over the weight variants."""
    from ray import tune

    return {"variant": tune.grid_search(list(VARIANTS))}


def cli(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_args(parser, env=False)
    add_sweep_args(parser, retrain=True)
    args = parser.parse_args(argv)
    cfg = config_from_args(args, "darkroom")
    space = search_space()
    console = Console()
    lock = start_sweep(args, [cfg], args.train_in_trials, console=console)
    ds_dir = run_main(generate_stage, cfg, console=console, label="dataset").dataset_dir
    if not args.train_in_trials:
        run_main(pretrain_grid, cfg, space, ds_dir, console=console)
    result = run_main(run_sweep, "weight_ablation", cfg, space, None, ds_dir, cfg.out_dir,
                      train_in_trial=args.train_in_trials, **sweep_kwargs(args), console=console)
    console.line(format_result(result, args.top))
    lock.release()


if __name__ == "__main__":
    cli()
