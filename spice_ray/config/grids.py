"""Every hyperparameter grid, declared once: the values the tuning stage tries on validation
tasks, the fixed values the experiments' tables report, and each sweep's per-preset grid and
search range. The tuning stage (``spice_ray.study.tuning``), the experiments
(``spice_ray.study.experiments``) and the sweep scripts (``sweeps/``) read them from here;
``tests/test_architecture.py`` fails if a grid's values are written anywhere else.

A :class:`Grid` names the config field it sets. ``tuning`` is the study's grid (the tuning stage
runs every point for every method that reads the field); ``sweep`` is a sweep's grid per preset
(``medium`` takes ``small``'s, ``spice_ray.sweep.cli.preset_grid``); ``search`` the log-uniform
range that ``sweep.search=random|optuna`` samples.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Grid:
    """One hyperparameter's values wherever they are searched."""

    field: str
    """The config field, "section.name" (e.g. "fusion.beta")."""
    tuning: tuple[Any, ...] = ()
    """The tuning stage's points on validation tasks (empty: not tuned by the study)."""
    sweep: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)
    """A sweep's grid per preset."""
    search: tuple[float, float] | None = None
    """(low, high) of a log-uniform search (``sweep.search`` random or optuna)."""
    doc: str = ""


GRIDS: dict[str, Grid] = {
    "beta": Grid(
        "fusion.beta", tuning=(0.5, 1.0, 2.0, 4.0),
        sweep={"smoke": (1.0,), "small": (0.5, 2.0), "paper": (0.25, 0.5, 1.0, 2.0, 4.0)},
        search=(0.1, 10.0),
        doc="posterior-UCB's beta (fixed schedule); the theory schedule sqrt(2 log t) is one "
            "more tuning point"),
    "tau": Grid(
        "fusion.tau", tuning=(0.3, 0.5, 0.7, 1.0),
        sweep={"smoke": (0.5,), "small": (0.25, 1.0), "paper": (0.1, 0.25, 0.5, 1.0, 2.0)},
        search=(0.05, 5.0),
        doc="the RBF kernel's bandwidth over states (tuned only where a kernel reads it)"),
    "ucb_c": Grid("eval.ucb_c", tuning=(0.5, 1.0, 2.0, 4.0),
                  doc="UCB's and LinUCB's exploration constant"),
    "width": Grid(
        "fusion.width_scale", tuning=("paper", "fitted"),
        doc="SPICE's prior width: the paper's sigma_Q and the one fitted on validation "
            "contexts without labels (with 'constant' and 'predictive' where they exist)"),
    "noise_var": Grid(
        "fusion.noise_var", tuning=("paper", "fitted", 1.0, 10.0, 100.0, 1000.0),
        sweep={"smoke": (0.04, 0.25), "small": (0.01, 0.09, 0.25, 1.0),
               "paper": (0.01, 0.04, 0.09, 0.25, 1.0)},
        doc="sigma^2 of the model-free fused methods on n-step evidence: the config's, the one "
            "fitted with SPICE's width, and decades spanning the targets' scale (a darkroom's "
            "values reach 1 / (1 - gamma) = 20). A prior that has already seen the context (the "
            "exact posterior, a learned prior) is fused with it again; a large sigma^2 is how "
            "the fusion stops counting it twice (the region darkroom's oracle prior: 86 at "
            "0.09, 9 at 1000)"),
    "lambda_q": Grid(
        "train.lambda_q", tuning=(1.0, 10.0, 30.0),
        doc="the value loss's weight beside the policy loss on the shared trunk, chosen per "
            "experiment where ``train.choose`` names it (a model trained per point; the "
            "validation log-likelihood of the rewards under each model's prior decides)"),
    "lambda_shrink": Grid(
        "train.lambda_shrink", tuning=(1.0, 0.0),
        doc="the shrinkage loss's weight beside the TD loss: the paper's pull of every arm "
            "toward one pooled prior, or none (chosen as lambda_q is, where train.choose names "
            "it; the paper's first, so a tie keeps it)"),
    "v_min": Grid("fusion.v_min",
                  sweep={"smoke": (0.01,), "small": (0.001, 0.01, 0.1),
                         "paper": (1e-4, 1e-3, 1e-2, 1e-1)},
                  doc="the floor of the prior's variance"),
    "ensemble_size": Grid("model.ensemble_size",
                          sweep={"smoke": (2, 4), "small": (2, 4, 7, 10), "paper": (2, 4, 7, 10)},
                          doc="K, the value heads (a sweep retrains a model per value)"),
}
"""Every searched hyperparameter by name."""

FIXED_BETAS: dict[str, tuple[float, ...]] = {
    "paper_table": (0.5, 1.0, 2.0),
    "prior_families": (1.0, 2.0),
}
"""The fixed-beta tables beside the tuned ones: the darkroom's as the paper reports it
and the structured families' fused rows (at 1 a few tasks that lock onto a wrong arm dominate
the mean, at 2 they do not)."""
