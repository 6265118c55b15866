"""Sweep the fusion likelihood variance sigma^2 (fusion.noise_var) and the prior-variance floor
v_min (fusion.v_min) of SPICE, with Ray Tune.

    python sweeps/fusion_noise.py --preset small                    # bandit (default)
    python sweeps/fusion_noise.py --preset small --env darkroom
    python sweeps/fusion_noise.py --preset smoke --out /tmp/sweep_smoke

The dataset and the SPICE checkpoints are made first (skipped when current); each trial
evaluates one (noise_var, v_min) online. Tables: <out>/sweeps/fusion_noise_<env>.parquet and
..._summary.parquet. A re-run restores the experiment and runs only unfinished trials.

Grid per preset: every noise_var x v_min of ``GRIDS["noise_var"]`` and ``GRIDS["v_min"]`` in
spice_ray/config/grids.py (smoke 2 trials, small 12, paper 20; the bandit's true reward
variance is env.sigma^2 = 0.09).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from spice_ray import sweep
from spice_ray.config.grids import GRIDS as HYPER

if TYPE_CHECKING:  # annotations only: --help answers before torch loads
    from spice_ray.config import ExperimentConfig

GRIDS: dict[str, dict[str, tuple[float, ...]]] = {
    preset: {"noise_var": noise, "v_min": HYPER["v_min"].sweep[preset]}
    for preset, noise in HYPER["noise_var"].sweep.items()}
"""Per preset (``medium`` inherits ``small``'s), from ``spice_ray.config.grids``."""


def search_space(cfg: ExperimentConfig) -> dict[str, Any]:
    """Tune param_space: noise_var x v_min (a full product; both always matter)."""
    from ray import tune

    grid = sweep.preset_grid(GRIDS, cfg.preset)
    return {"fusion": {"noise_var": tune.grid_search(list(grid["noise_var"])),
                       "v_min": tune.grid_search(list(grid["v_min"]))}}


if __name__ == "__main__":
    sweep.main("fusion_noise", search_space, __doc__)
