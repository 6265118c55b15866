"""Test-time Bayesian fusion: kernels, weighted evidence, Gaussian posterior, action rules.

Plain tensor functions: no Ray, no I/O, no model.
"""

from spice_ray.fusion.evidence import (
    STATS_DTYPE,
    context_evidence,
    fused_posterior,
    needs_bootstrap,
    needs_nstep,
)
from spice_ray.fusion.kernels import (
    KERNELS,
    cosine_weights,
    exact_weights,
    kernel_weights,
    rbf_weights,
    uniform_weights,
)
from spice_ray.fusion.posterior import (
    BOOTSTRAPS,
    NOISE_VAR_FLOOR,
    Posterior,
    RandomSource,
    RunningStats,
    argmax_lowest,
    beta_at,
    bootstrap_values,
    gaussian_posterior,
    greedy_action,
    nstep_targets,
    safe_mean,
    sample_categorical,
    select_action,
    standard_normal,
    thompson_action,
    ucb_action,
    ucb_scores,
    weighted_action_stats,
)

__all__ = [
    "STATS_DTYPE",
    "context_evidence",
    "fused_posterior",
    "needs_bootstrap",
    "needs_nstep",
    "BOOTSTRAPS",
    "bootstrap_values",
    "KERNELS",
    "NOISE_VAR_FLOOR",
    "Posterior",
    "RandomSource",
    "RunningStats",
    "argmax_lowest",
    "beta_at",
    "cosine_weights",
    "exact_weights",
    "gaussian_posterior",
    "greedy_action",
    "kernel_weights",
    "nstep_targets",
    "rbf_weights",
    "safe_mean",
    "sample_categorical",
    "select_action",
    "standard_normal",
    "thompson_action",
    "ucb_action",
    "ucb_scores",
    "uniform_weights",
    "weighted_action_stats",
]
