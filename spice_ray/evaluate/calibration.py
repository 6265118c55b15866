"""Calibration of SPICE's ensemble prior on eval tasks of a stateless environment (bandits), as a
function of context length h (the environment's action values are the truth).

At position h (the query plus the first h context transitions) the ensemble gives, per arm,
the prior N(mu_pri, sigma_Q^2). This module measures

* coverage: the fraction of arms whose true mean mu_a lies in the central interval
  mu_pri +- z_{(1+level)/2} sigma_Q (levels 50/90/95%); a calibrated prior covers ~level;
* the prior pseudo-counts N_pri = sigma^2 / v_pri, v_pri = max(sigma_Q^2, v_min) (paper
  Definition 1): how many observations the prior is worth in the posterior;
* the warm-start term of Theorem 1, sum_a N_pri |mu_pri - mu_a| ("warm_start", all arms, as
  a per-task summary) and the theorem's own constant 4 sum_{a != a*} N_pri |mu_pri - mu_a|
  ("warm_start_bound").

sigma^2 is the fusion's likelihood variance ``FusionConfig.noise_var`` (floored like the
posterior's, :data:`spice_ray.fusion.NOISE_VAR_FLOOR`), so N_pri is exactly the prior's weight
in the posterior the agent uses.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from spice_ray.agents import METHODS
from spice_ray.config import EnvConfig, FusionConfig
from spice_ray.evaluate.offline import offline_context_lengths, sequence_outputs
from spice_ray.evaluate.rows import concat_rows, tidy_rows
from spice_ray.fusion import NOISE_VAR_FLOOR, width_settings
from spice_ray.fusion.posterior import prior_variance
from spice_ray.fusion.width import learned_prior_std
from spice_ray.model.tokens import make_tokens
from spice_ray.model.trunk import TrunkModel

LEVELS = (0.5, 0.9, 0.95)
METRICS = ("coverage_50", "coverage_90", "coverage_95", "n_pri_mean", "n_pri_min", "n_pri_max",
           "warm_start", "warm_start_bound")
"""The metrics of :func:`calibration_rows` (with the default levels)."""
ORACLE_METRICS = ("oracle_rmse", "oracle_sd_ratio", "oracle_coverage_90", "oracle_n_pri_mean")
"""Added where the environment has an exact posterior (``posterior_moments``): the learned
prior against the exact posterior given the same context, per task over arms: the RMSE of
Q-bar from the posterior mean, sigma_Q / posterior sd (1: calibrated width), the fraction of
arms whose posterior mean lies in Q-bar +- 1.645 sigma_Q, and the exact posterior's own
pseudo-counts sigma^2 / max(v_post, v_min) (compare ``n_pri_mean``)."""
PRIOR_FIT_LENGTHS = (0, 1, 5, 10, 20, 50)
"""Context lengths at which the learned prior is held against the exact posterior (besides the
offline curve's): 0 is the prior before any transition."""


def prior_pseudocounts(prior_std: Tensor, noise_var: float, v_min: float) -> Tensor:
    """N_pri = sigma^2 / v_pri per arm (shapes of ``prior_std``), float64."""
    v_pri = prior_variance(prior_std.to(torch.float64), v_min)
    return max(float(noise_var), NOISE_VAR_FLOOR) / v_pri


@dataclass(frozen=True)
class CalibrationStats:
    """Per task, context length and arm.

    Attributes:
        hs: int [P] context lengths.
        levels: central interval levels L.
        prior_mean: float64 [B, P, A] mu_pri at position h.
        prior_std: float64 [B, P, A] the prior's sd the fusion uses at position h, s sigma_Q
            (s = ``fusion.width_scale``, 1 by default).
        covered: bool [B, P, L, A] whether mu_a lies in mu_pri +- z prior_std.
        n_pri: float64 [B, P, A] prior pseudo-counts.
        warm_start: float64 [B, P] sum_a N_pri |mu_pri - mu_a|.
        warm_start_bound: float64 [B, P] 4 sum_{a != a*} N_pri |mu_pri - mu_a| (Theorem 1).
    """

    hs: np.ndarray
    levels: tuple[float, ...]
    prior_mean: np.ndarray
    prior_std: np.ndarray
    covered: np.ndarray
    n_pri: np.ndarray
    warm_start: np.ndarray
    warm_start_bound: np.ndarray
    oracle_mean: np.ndarray | None = None
    """float64 [B, P, A] the exact posterior mean given the same context (or None)."""
    oracle_std: np.ndarray | None = None
    """float64 [B, P, A] its standard deviation (or None)."""


def oracle_moments(env, actions: np.ndarray, rewards: np.ndarray, hs: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray]:
    """The exact posterior's mean and sd [B, P, A] after the first h transitions of each
    context (``env.posterior_moments`` of the per-arm counts and reward sums)."""
    A = env.num_actions
    onehot = np.eye(A)[np.asarray(actions, dtype=np.int64)]  # (B, T, A)
    counts = np.concatenate([np.zeros_like(onehot[:, :1]), np.cumsum(onehot, 1)], 1)
    sums = np.concatenate([np.zeros_like(onehot[:, :1]),
                           np.cumsum(onehot * np.asarray(rewards, np.float64)[..., None], 1)], 1)
    c, s = counts[:, hs], sums[:, hs]  # (B, P, A)
    mean, var = env.posterior_moments(c.reshape(-1, A), s.reshape(-1, A))
    return mean.reshape(c.shape), np.sqrt(var).reshape(c.shape)


def calibration_stats(
    model: TrunkModel,
    env_cfg: EnvConfig,
    data: Mapping[str, np.ndarray],
    fusion: FusionConfig,
    hs: np.ndarray | None = None,
    levels: Sequence[float] = LEVELS,
    batch_size: int = 32,
) -> CalibrationStats:
    """Coverage, pseudo-counts and warm-start terms of the prior on eval contexts.

    Args:
        model: a SpiceModel.
        env_cfg: a stateless environment with action values (the calibration protocol).
        data: eval-split columns: actions, rewards, label and the environment's.
        fusion: noise_var (sigma^2), v_min and width_scale (the prior's sd is s sigma_Q).
        hs: context lengths (default: :func:`offline_context_lengths` with 25 points).
        levels: central interval probabilities in (0, 1).
        batch_size: tasks per model forward.
    """
    env = env_cfg.environment()
    if "calibration" not in env.protocols:
        raise ValueError(f"env.name={env.name} has no calibration protocol (no action values)")
    means = np.asarray(env.action_values(env.eval_tasks(data)), dtype=np.float64)  # (B, A)
    A = means.shape[1]
    T = np.asarray(data["actions"]).shape[1]
    hs = offline_context_lengths(T) if hs is None else np.asarray(hs, dtype=np.int64)
    out = sequence_outputs(model, make_tokens(data, env), hs, batch_size=batch_size)
    if "prior_std" not in out:
        raise ValueError("calibration needs a SpiceModel (a value ensemble)")
    pm = out["prior_mean"].to(torch.float64).numpy()  # (B, P, A)
    # The width the fusion uses (fusion.width_source: s g(h) sigma_Q, the paper's at s = 1 and
    # no decay; or from the predictive variance)
    ps = learned_prior_std(fusion, out["prior_std"], torch.as_tensor(hs)[None, :, None],
                           out.get("pred_var")).to(torch.float64).numpy()
    for level in levels:
        if not 0 < level < 1:
            raise ValueError(f"level={level} is invalid: in (0, 1)")
    z = np.array([NormalDist().inv_cdf(0.5 + level / 2) for level in levels])  # (L,)
    err = np.abs(pm - means[:, None, :])  # (B, P, A)
    covered = err[:, :, None, :] <= z[None, None, :, None] * ps[:, :, None, :]  # (B, P, L, A)
    n_pri = prior_pseudocounts(torch.from_numpy(ps), fusion.noise_var, fusion.v_min).numpy()
    gap = n_pri * err  # (B, P, A)
    suboptimal = np.arange(A)[None, :] != means.argmax(1)[:, None]  # (B, A)
    oracle = (oracle_moments(env, data["actions"], data["rewards"], hs)
              if hasattr(env, "posterior_moments") else (None, None))
    return CalibrationStats(
        hs=hs, levels=tuple(levels), prior_mean=pm, prior_std=ps, covered=covered, n_pri=n_pri,
        warm_start=gap.sum(-1),
        warm_start_bound=4.0 * (gap * suboptimal[:, None, :]).sum(-1),
        oracle_mean=oracle[0], oracle_std=oracle[1],
    )


def calibration_rows(
    model: TrunkModel,
    env_cfg: EnvConfig,
    data: Mapping[str, np.ndarray],
    fusion: FusionConfig,
    hs: np.ndarray | None = None,
    levels: Sequence[float] = LEVELS,
    seed: int = 0,
    batch_size: int = 32,
) -> pd.DataFrame:
    """:func:`calibration_stats` as tidy rows (method "SPICE", rule "prior", x = h).

    Metrics per task: ``coverage_50`` / ``coverage_90`` / ``coverage_95`` (fraction of arms
    covered), ``n_pri_mean`` / ``n_pri_min`` / ``n_pri_max`` over arms, ``warm_start``,
    ``warm_start_bound``; config holds noise_var and v_min (and width_scale when not 1).
    """
    stats = calibration_stats(model, env_cfg, data, fusion, hs, levels, batch_size)
    task_ids = np.asarray(data["task_id"])
    settings = {"noise_var": fusion.noise_var, "v_min": fusion.v_min} | width_settings(fusion)
    config = json.dumps(settings, sort_keys=True, separators=(",", ":"))
    metrics: dict[str, np.ndarray] = {}
    for i, level in enumerate(stats.levels):
        metrics[f"coverage_{round(level * 100):d}"] = stats.covered[:, :, i].mean(-1)
    metrics["n_pri_mean"] = stats.n_pri.mean(-1)
    metrics["n_pri_min"] = stats.n_pri.min(-1)
    metrics["n_pri_max"] = stats.n_pri.max(-1)
    metrics["warm_start"] = stats.warm_start
    metrics["warm_start_bound"] = stats.warm_start_bound
    if stats.oracle_mean is not None:
        err = stats.prior_mean - stats.oracle_mean  # (B, P, A)
        z90 = NormalDist().inv_cdf(0.95)
        metrics["oracle_rmse"] = np.sqrt((err**2).mean(-1))
        metrics["oracle_sd_ratio"] = (stats.prior_std / np.maximum(stats.oracle_std, 1e-12)
                                      ).mean(-1)
        metrics["oracle_coverage_90"] = (np.abs(err) <= z90 * stats.prior_std).mean(-1)
        metrics["oracle_n_pri_mean"] = prior_pseudocounts(
            torch.from_numpy(stats.oracle_std), fusion.noise_var, fusion.v_min).numpy().mean(-1)
    method = METHODS["spice"].label
    return concat_rows(tidy_rows(env_cfg.name, method, "prior", config, seed, task_ids, name,
                                 stats.hs, values) for name, values in metrics.items())


def context_follow(prior_mean: np.ndarray, oracle_mean: np.ndarray) -> dict[str, np.ndarray]:
    """How far a learned prior's mean moves with the context, per context length.

    The family's mean is the exact posterior's at the first length (h = 0: no context). Per
    length [P], over tasks and arms: ``slope``, the least-squares slope through the origin of
    (prior - family mean) on (exact posterior - family mean): 1 when the prior moves as the
    posterior does, 0 when it ignores the context; ``rmse``, the prior against the exact
    posterior mean; ``rmse_blind``, the family's mean against it (a prior that reads nothing).

    Args:
        prior_mean, oracle_mean: [B, P, A], the first length 0 (``calibration_stats``'s
            ``prior_mean`` and ``oracle_mean`` at ``hs`` starting with 0).
    """
    family = oracle_mean[:, :1]  # (B, 1, A)
    moved, follows = oracle_mean - family, prior_mean - family
    sxx = (moved**2).sum((0, 2))
    slope = np.where(sxx > 0, (moved * follows).sum((0, 2)) / np.maximum(sxx, 1e-300), np.nan)
    return {"slope": slope,
            "rmse": np.sqrt(((prior_mean - oracle_mean) ** 2).mean((0, 2))),
            "rmse_blind": np.sqrt((moved**2).mean((0, 2)))}
