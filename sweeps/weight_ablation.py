"""Darkroom weight ablation: SPICE retrained with no / only iw / only adv / only epi / all policy
weights (spice_ray.study.experiments.WEIGHT_VARIANTS), each evaluated online with Ray Tune.

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

from typing import TYPE_CHECKING, Any

from spice_ray import sweep

if TYPE_CHECKING:  # annotations only: --help answers before torch loads
    from spice_ray.config import ExperimentConfig


def search_space(cfg: ExperimentConfig | None = None) -> dict[str, Any]:
    """Tune param_space over the weight variants (the same on every preset): none, iw, adv,
    epi (one weight each, or none) and all (the main SPICE model)."""
    from ray import tune

    from spice_ray.study.experiments import WEIGHT_VARIANTS

    return {"variant": tune.grid_search([*WEIGHT_VARIANTS, "all"])}


if __name__ == "__main__":
    sweep.main("weight_ablation", search_space, __doc__, retrain=True, env="darkroom")
