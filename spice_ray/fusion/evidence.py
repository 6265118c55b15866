"""Fusion glue: a context's kernel-weighted evidence and the fused posterior (paper sec. 3.3).

The learned SPICE agent, the flat-prior and count-based references, the offline curve and the
calibration diagnostic all call these two functions, so the fusion is written once. They take
the fusion settings (any object with the fields of :class:`FusionSettings`, as the run
config's ``fusion`` section has) and plain tensors; they never see a model or a config class.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor

from spice_ray.fusion.kernels import kernel_weights
from spice_ray.fusion.posterior import (
    Posterior,
    gaussian_posterior,
    nstep_targets,
    weighted_action_stats,
)


class FusionSettings(Protocol):
    """What the fusion reads of its settings (the run config's ``fusion`` section has these
    fields and more); named here so that this kernel imports nothing above it."""

    kernel: str
    tau: float
    target: str
    td_n: int
    gamma: float
    tail: str
    noise_var: float
    v_min: float


STATS_DTYPE = torch.float64
"""Evidence, posteriors and action scores are float64 on the CPU (as in the baselines)."""


def needs_nstep(fusion: FusionSettings) -> bool:
    """True when the targets differ from the immediate rewards (n > 1 or gamma > 0)."""
    return fusion.target == "nstep" and (fusion.td_n > 1 or fusion.gamma > 0)


def needs_bootstrap(fusion: FusionSettings) -> bool:
    """True when the targets read max_a' Q-bar(s_{t+n}, a') (n-step with gamma > 0)."""
    return fusion.target == "nstep" and fusion.gamma > 0


def context_evidence(
    fusion: FusionSettings,
    actions: Tensor,
    rewards: Tensor,
    num_actions: int,
    query_features: Tensor | None = None,
    context_features: Tensor | None = None,
    next_values: Tensor | None = None,
    mask: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Kernel-weighted counts c_a and mean targets y~_a of a context (paper sec. 3.3).

    Args:
        fusion: kernel, tau, target, td_n, gamma.
        actions: long [..., T].
        rewards: [..., T] r_t.
        num_actions: A.
        query_features: [..., D] h_qry (latent or state); unused by the uniform kernel.
        context_features: [..., T, D] h_t of each transition's state s_t.
        next_values: [..., T] max_a' Q-bar at s_{t+1}; needed when gamma > 0.
        mask: optional bool [..., T] valid prefix.

    Returns:
        (counts [..., A], weighted_mean [..., A]), float64.
    """
    rewards = rewards.to(STATS_DTYPE)
    weights = None
    if fusion.kernel != "uniform":
        if query_features is None or context_features is None:
            raise ValueError(f"kernel={fusion.kernel!r} needs query and context features")
        weights = kernel_weights(query_features.to(STATS_DTYPE),
                                 context_features.to(STATS_DTYPE), fusion.kernel, fusion.tau,
                                 mask)
    targets = rewards
    if needs_nstep(fusion):
        if next_values is None:
            if fusion.gamma > 0:
                raise ValueError("n-step targets with gamma > 0 need next_values")
            next_values = torch.zeros_like(rewards)
        targets = nstep_targets(rewards, next_values.to(STATS_DTYPE), fusion.td_n,
                                fusion.gamma, mask, fusion.tail)
    return weighted_action_stats(weights, actions, targets, num_actions, mask)


def fused_posterior(fusion: FusionSettings, prior_mean: Tensor, prior_std: Tensor,
                    counts: Tensor, weighted_mean: Tensor) -> Posterior:
    """The ensemble prior N(Q-bar, max(sigma_Q^2, v_min)) fused with the evidence, [..., A].

    All inputs broadcast to [..., A]; computed in float64 on the CPU.
    """
    cpu = torch.device("cpu")
    return gaussian_posterior(
        prior_mean.to(cpu, STATS_DTYPE),
        prior_std.to(cpu, STATS_DTYPE).square(),
        counts.to(cpu, STATS_DTYPE),
        weighted_mean.to(cpu, STATS_DTYPE),
        fusion.noise_var,
        fusion.v_min,
    )


