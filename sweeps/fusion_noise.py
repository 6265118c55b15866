"""Sweep the fusion likelihood variance sigma^2 (fusion.noise_var) and the prior-variance floor
v_min (fusion.v_min) of SPICE, with Ray Tune.

    python sweeps/fusion_noise.py --preset small                    # bandit (default)
    python sweeps/fusion_noise.py --preset small --env darkroom
    python sweeps/fusion_noise.py --preset smoke --out /tmp/sweep_smoke

The dataset and the SPICE checkpoints are made first (skipped when current); each trial
evaluates one (noise_var, v_min) online. Tables: <out>/sweeps/fusion_noise_<env>.parquet and
..._summary.parquet. A re-run restores the experiment and runs only unfinished trials.

Grid per preset (the bandit's true reward variance is env.sigma^2 = 0.09):

    smoke: noise_var (0.04, 0.25)                    x v_min (0.01,)             =  2
    small: noise_var (0.01, 0.09, 0.25, 1.0)         x v_min (0.001, 0.01, 0.1)  = 12
    paper: noise_var (0.01, 0.04, 0.09, 0.25, 1.0)   x v_min (1e-4 ... 0.1)      = 20
"""

from __future__ import annotations

import argparse
from typing import Any

from spice_ray.cli import add_config_args, config_from_args, run_main
from spice_ray.console import Console
from spice_ray.sweep import (
    add_sweep_args,
    ensure_models,
    format_result,
    run_sweep,
    start_sweep,
    sweep_kwargs,
)

GRIDS: dict[str, dict[str, tuple[float, ...]]] = {
    "smoke": {"noise_var": (0.04, 0.25), "v_min": (0.01,)},
    "small": {"noise_var": (0.01, 0.09, 0.25, 1.0), "v_min": (0.001, 0.01, 0.1)},
    "paper": {"noise_var": (0.01, 0.04, 0.09, 0.25, 1.0), "v_min": (1e-4, 1e-3, 1e-2, 1e-1)},
}
GRIDS["medium"] = GRIDS["small"]  # medium differs from small in darkroom training only


def search_space(preset: str) -> dict[str, Any]:
    """Tune param_space: noise_var x v_min (a full product; both always matter)."""
    from ray import tune

    grid = GRIDS[preset]
    return {"fusion": {"noise_var": tune.grid_search(list(grid["noise_var"])),
                       "v_min": tune.grid_search(list(grid["v_min"]))}}


def cli(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_args(parser)
    add_sweep_args(parser)
    args = parser.parse_args(argv)
    cfg = config_from_args(args)
    console = Console()
    lock = start_sweep(args, [cfg], console=console)
    ds_dir, ckpts = run_main(ensure_models, cfg, console=console)
    result = run_main(run_sweep, f"fusion_noise_{cfg.env.name}", cfg, search_space(cfg.preset),
                      ckpts, ds_dir, cfg.out_dir, **sweep_kwargs(args), console=console)
    console.line(format_result(result, args.top))
    lock.release()


if __name__ == "__main__":
    cli()
