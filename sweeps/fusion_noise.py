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

from typing import Any

from spice_ray import sweep
from spice_ray.config import ExperimentConfig

GRIDS: dict[str, dict[str, tuple[float, ...]]] = {
    "smoke": {"noise_var": (0.04, 0.25), "v_min": (0.01,)},
    "small": {"noise_var": (0.01, 0.09, 0.25, 1.0), "v_min": (0.001, 0.01, 0.1)},
    "paper": {"noise_var": (0.01, 0.04, 0.09, 0.25, 1.0), "v_min": (1e-4, 1e-3, 1e-2, 1e-1)},
}
"""Per preset (``medium`` inherits ``small``'s)."""


def search_space(cfg: ExperimentConfig) -> dict[str, Any]:
    """Tune param_space: noise_var x v_min (a full product; both always matter)."""
    from ray import tune

    grid = sweep.preset_grid(GRIDS, cfg.preset)
    return {"fusion": {"noise_var": tune.grid_search(list(grid["noise_var"])),
                       "v_min": tune.grid_search(list(grid["v_min"]))}}


if __name__ == "__main__":
    sweep.main("fusion_noise", search_space, __doc__)
