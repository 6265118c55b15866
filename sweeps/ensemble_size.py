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

Grid per preset: ``GRIDS["ensemble_size"]`` of spice_ray/config/grids.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from spice_ray import sweep
from spice_ray.config.grids import GRIDS as HYPER

if TYPE_CHECKING:  # annotations only: --help answers before torch loads
    from spice_ray.config import ExperimentConfig

GRIDS: dict[str, tuple[int, ...]] = dict(HYPER["ensemble_size"].sweep)
"""Per preset (``medium`` inherits ``small``'s), from ``spice_ray.config.grids``."""


def search_space(cfg: ExperimentConfig) -> dict[str, Any]:
    """Tune param_space over the ensemble size."""
    from ray import tune

    return {"model": {"ensemble_size": tune.grid_search(list(sweep.preset_grid(GRIDS,
                                                                               cfg.preset)))}}


if __name__ == "__main__":
    sweep.main("ensemble_size", search_space, __doc__, retrain=True)
