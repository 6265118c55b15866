"""Sweep the SPICE value-ensemble size K (model.ensemble_size); every K is a retrained model.

    python sweeps/ensemble_size.py --preset small                   # bandit (default)
    python sweeps/ensemble_size.py --preset small --env darkroom
    python sweeps/ensemble_size.py --preset paper --address auto --train-in-trials

Retraining. By default every K (and seed) is pretrained BEFORE the sweep, in the driver, with
the config's own Train settings (Ray Train workers, GPUs on the paper preset; each model is
skipped when its checkpoint is current and resumes from its last checkpoint when interrupted).
The Tune trials then only evaluate: each finds its checkpoint from its K. This is the robust
default on small machines: training never has to fit inside a trial's placement group, and a
killed sweep loses no training. With --train-in-trials each trial trains its own K in-process
(train.num_workers=0; the trial's head bundle reserves train.worker_cpus), which parallelises
training across trials on a cluster.

Grid per preset: smoke K in (2, 4); small and paper K in (2, 4, 7, 10).
"""

from __future__ import annotations

import argparse
from typing import Any

from spice_ray.cli import add_config_args, config_from_args, run_main
from spice_ray.console import Console
from spice_ray.stages import generate_stage
from spice_ray.sweep import (
    add_sweep_args,
    format_result,
    pretrain_grid,
    run_sweep,
    start_sweep,
    sweep_kwargs,
)

GRIDS: dict[str, tuple[int, ...]] = {"smoke": (2, 4), "small": (2, 4, 7, 10),
                                     "paper": (2, 4, 7, 10)}
GRIDS["medium"] = GRIDS["small"]  # medium differs from small in darkroom training only


def search_space(preset: str) -> dict[str, Any]:
    """Tune param_space over the ensemble size."""
    from ray import tune

    return {"model": {"ensemble_size": tune.grid_search(list(GRIDS[preset]))}}


def cli(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_args(parser)
    add_sweep_args(parser, retrain=True)
    args = parser.parse_args(argv)
    cfg = config_from_args(args)
    space = search_space(cfg.preset)
    console = Console()
    lock = start_sweep(args, [cfg], args.train_in_trials, console=console)
    ds_dir = run_main(generate_stage, cfg, console=console, label="dataset").dataset_dir
    if not args.train_in_trials:
        run_main(pretrain_grid, cfg, space, ds_dir, console=console)
    result = run_main(run_sweep, f"ensemble_size_{cfg.env.name}", cfg, space, None, ds_dir,
                      cfg.out_dir,
                      train_in_trial=args.train_in_trials, **sweep_kwargs(args), console=console)
    console.line(format_result(result, args.top))
    lock.release()


if __name__ == "__main__":
    cli()
