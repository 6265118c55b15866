"""Fit the learned prior's width scale s (``FusionConfig.width_scale``) on logged contexts,
without labels.

Each transition t of a logged context is predicted by the prior of the position that has not
seen it (``spice_ray.model.spice.align_to_transitions``: position t-1), at the action taken:
m_t = Q-bar_{t-1}(a_t), sd_t = sigma_Q,{t-1}(a_t). Its target y_t is what the fusion would use
as evidence (``fusion.target``): the reward, or the n-step return built exactly as the TD(n)
targets of training (``spice_ray.train.losses``), bootstrapped from the positions' own
Q-bar. s maximises sum_t log N(y_t; m_t, s^2 sd_t^2 + sigma^2)
(:func:`spice_ray.fusion.width.fit_width_scale`), at the config's sigma^2 or, with
``fit_noise`` (where the targets are n-step returns, whose variance no config constant knows),
jointly with sigma^2 (:func:`spice_ray.fusion.width.fit_width_and_noise`). Only actions,
rewards and what the model reads of a context enter: never the task's label or true means.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from spice_ray.config import EnvConfig, FusionConfig
from spice_ray.evaluate.offline import sequence_outputs
from spice_ray.fusion import (
    bootstrap_values,
    fit_width_and_noise,
    fit_width_decay,
    fit_width_scale,
    needs_bootstrap,
    needs_nstep,
    nstep_targets,
    width_log_likelihood,
    width_profile,
)
from spice_ray.model.registry import ModelSource, load_model, torch_threads
from spice_ray.model.spice import align_to_transitions
from spice_ray.model.tokens import make_tokens
from spice_ray.model.trunk import TrunkModel


@dataclass(frozen=True)
class WidthFit:
    """The fitted width scale and the likelihoods a report prints."""

    scale: float
    """s maximising the targets' likelihood (0.0: the likelihood is largest without the
    ensemble's spread)."""
    log_lik: float
    """Mean log-likelihood per target at ``scale``."""
    log_lik_paper: float
    """Mean log-likelihood per target at s = 1 (the paper's width)."""
    num_targets: int
    """Transitions whose target entered the fit."""
    noise_var: float
    """sigma^2 of the fit: fitted with s (``fit_noise``) or the config's ``fusion.noise_var``."""
    decay: float = 0.0
    """How the width narrows with the context length (``fit_decay``; 0: constant)."""


def transition_predictions(
    model: TrunkModel,
    batch: Mapping[str, Any],
    env_cfg: EnvConfig,
    fusion: FusionConfig,
    batch_size: int = 32,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Each transition's leakage-free prediction, its prior sd and its target, for one batch.

    Args:
        model: a SpiceModel.
        batch: dataset columns of B contexts: ``actions`` [B, T], ``rewards`` [B, T] and what
            the environment's ``encode`` reads; a ``label`` or true-means column is never read.
        env_cfg: the environment the contexts come from.
        fusion: target, td_n, gamma, bootstrap (the evidence targets).
        batch_size: tasks per model forward.

    Returns:
        (mean, std, targets, complete), each [B, T], float64 (complete: bool): mean[:, t-1] =
        Q-bar_{t-1}(a_t), std[:, t-1] = sigma_Q,{t-1}(a_t), targets[:, t-1] = y_t, and
        complete[:, t-1] whether y_t is a whole target (an n-step return with gamma > 0 is
        complete when its bootstrap s_{t+n} is inside the context, t + n <= T).
    """
    env = env_cfg.environment()
    actions = torch.as_tensor(np.asarray(batch["actions"], dtype=np.int64))  # (B, T)
    B, T = actions.shape
    # make_tokens wants a label column; the forward never reads it, so a constant stands in.
    unlabelled = {**batch, "label": np.zeros(B, dtype=np.int64)}
    out = sequence_outputs(model, make_tokens(unlabelled, env), np.arange(T + 1),
                           batch_size=batch_size)
    if "prior_std" not in out:
        raise ValueError("the width scale needs a SpiceModel (a value ensemble)")
    q_mean = out["prior_mean"].to(torch.float64)  # (B, T+1, A)
    q_std = out["prior_std"].to(torch.float64)  # (B, T+1, A)
    q_pred, q_next = align_to_transitions(q_mean)  # (B, T, A) x2
    std_pred, _ = align_to_transitions(q_std)  # (B, T, A)
    taken = actions[:, :, None]  # (B, T, 1)
    mean = q_pred.gather(-1, taken).squeeze(-1)  # (B, T)
    std = std_pred.gather(-1, taken).squeeze(-1)  # (B, T)
    rewards = torch.as_tensor(np.asarray(batch["rewards"], dtype=np.float64))  # (B, T)
    complete = torch.ones(B, T, dtype=torch.bool)
    targets = rewards
    if needs_nstep(fusion):  # as the TD(n) targets of training (spice_ray.train.losses)
        next_values = bootstrap_values(q_next, fusion.bootstrap)  # (B, T): V(s_{t+1})
        targets = nstep_targets(rewards, next_values, fusion.td_n, fusion.gamma,
                                tail=fusion.tail)  # (B, T)
        if needs_bootstrap(fusion) and fusion.tail == "truncate":  # none for t + n > T
            complete = (torch.arange(T) < T - fusion.td_n)[None, :].expand(B, T)  # (B, T)
    return mean, std, targets, complete


def fit_model_width(
    model: TrunkModel,
    batches: Iterable[Mapping[str, Any]],
    env_cfg: EnvConfig,
    fusion: FusionConfig,
    batch_size: int = 32,
    bounds: tuple[float, float] = (1e-3, 1e3),
    fit_noise: bool = False,
    fit_decay: bool = False,
) -> WidthFit:
    """Fit ``fusion.width_scale`` for a trained SPICE model on logged contexts, label-free.

    Args:
        model: a SpiceModel.
        batches: dataset batches, e.g. ``spice_ray.data.store.iter_batches(dataset_dir,
            "validation", batch_size)``.
        env_cfg: the environment the contexts come from.
        fusion: noise_var (sigma^2) and the targets (target, td_n, gamma, bootstrap).
        batch_size: tasks per model forward.
        bounds: the range of s searched besides s = 0.
        fit_noise: fit sigma^2 with s (else ``fusion.noise_var`` is used as it is).
        fit_decay: fit how the width narrows with the context length too
            (``spice_ray.fusion.fit_width_decay``; else it is constant).

    Returns:
        The :class:`WidthFit` over every complete target of every batch.

    Raises:
        ValueError: no batch, or no complete target (n-step contexts no longer than n).
    """
    parts = [_complete(*transition_predictions(model, batch, env_cfg, fusion, batch_size))
             for batch in batches]
    if not parts:
        raise ValueError("batches is empty: the width scale needs at least one context")
    return _fit_parts(parts, fusion, bounds, fit_noise, fit_decay)


def _complete(mean: Tensor, std: Tensor, targets: Tensor, complete: Tensor
              ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(mean, std, targets, h) of the complete targets, flat; h is the context length each
    prediction was made at (its column: the position that has not seen its target)."""
    h = torch.arange(mean.shape[1], dtype=torch.float64).expand_as(mean)
    return mean[complete], std[complete], targets[complete], h[complete]


def _fit_parts(parts: list[tuple[Tensor, Tensor, Tensor, Tensor]], fusion: FusionConfig,
               bounds: tuple[float, float] = (1e-3, 1e3), fit_noise: bool = False,
               fit_decay: bool = False) -> WidthFit:
    """The :class:`WidthFit` over the complete targets of every part (mean, std, targets, h)."""
    mean, std, targets, h = (torch.cat(x) for x in zip(*parts, strict=True))  # (N,) each
    if targets.numel() == 0:
        raise ValueError(f"no complete target: n-step returns with td_n={fusion.td_n} need "
                         f"contexts longer than {fusion.td_n} transitions")
    decay = 0.0
    if fit_decay:
        scale, decay, noise = fit_width_decay(mean, std, targets, h,
                                              None if fit_noise else fusion.noise_var,
                                              bounds=bounds)
    elif fit_noise:
        scale, noise = fit_width_and_noise(mean, std, targets, bounds=bounds)
    else:
        noise = fusion.noise_var
        scale = fit_width_scale(mean, std, targets, noise, bounds=bounds)
    return WidthFit(
        scale=scale,
        log_lik=width_log_likelihood(mean, std * width_profile(h, decay), targets, noise,
                                     scale),
        log_lik_paper=width_log_likelihood(mean, std, targets, fusion.noise_var, 1.0),
        num_targets=int(targets.numel()),
        noise_var=noise,
        decay=decay,
    )


def fit_pooled_width(sources: Mapping[int, ModelSource], data: Mapping[str, Any],
                     env_cfg: EnvConfig, fusion: FusionConfig, fit_noise: bool = False,
                     fit_decay: bool = False) -> dict[str, Any]:
    """One scale s for several models of an experiment (its training seeds), fitted on the
    same logged contexts: the kernel over every model's predictions at once, each model's own
    s beside it.

    Args:
        sources: seed -> a SPICE checkpoint directory or in-memory payload
            (``spice_ray.model.registry.load_model``).
        data: dataset columns of the contexts (e.g. the validation split); no label is read.
        env_cfg: their environment.
        fusion: noise_var (sigma^2) and the evidence targets.
        fit_noise: fit sigma^2 jointly with s (pooled), not take ``fusion.noise_var``.
        fit_decay: fit the width's narrowing with the context length too (pooled).

    Returns:
        {"scale": s, "per_seed": {str(seed): s of that model alone, at the pooled sigma^2},
        "log_lik": mean log-likelihood per target at (s, sigma^2), "log_lik_paper": the same
        at s = 1 and the config's sigma^2, "targets": their number}, and with ``fit_noise``
        "noise_var": the fitted sigma^2, and with ``fit_decay`` "decay" (each seed's s at
        the pooled decay) and "constant_scale" (s without a decay, at the same sigma^2).
    """
    # One thread, as in an evaluation actor: this runs in the driver, whose two threads made the
    # compiled heads' forward depend on scheduling when the CPU was contended (the small
    # bandit's fitted s moved in its 7th digit between two runs of the same weights, and with
    # it the calibration table's bytes); one thread gives one value every time.
    with torch_threads(1):
        parts = [_complete(*transition_predictions(load_model(source, env_cfg, kind="spice"),
                                                   data, env_cfg, fusion))
                 for source in sources.values()]
    if not parts:
        raise ValueError("sources is empty: the width scale needs at least one model")
    fit = _fit_parts(parts, fusion, fit_noise=fit_noise, fit_decay=fit_decay)
    per_seed = {str(seed): fit_width_scale(mean, std * width_profile(h, fit.decay), y,
                                           fit.noise_var)
                for seed, (mean, std, y, h) in zip(sources, parts, strict=True)}
    return {"scale": fit.scale, "per_seed": per_seed, "log_lik": fit.log_lik,
            "log_lik_paper": fit.log_lik_paper, "targets": fit.num_targets,
            **({"noise_var": fit.noise_var} if fit_noise else {}),
            **({"decay": fit.decay, "constant_scale": _constant_scale(parts, fit.noise_var)}
               if fit_decay else {})}


def _constant_scale(parts: list[tuple[Tensor, Tensor, Tensor, Tensor]], noise_var: float
                    ) -> float:
    """s of a constant width (no decay) over every part, at sigma^2 = ``noise_var``: the
    tuning stage's other fitted width, since the likelihood's choice of decay need not be the
    fused posterior's best."""
    mean, std, targets, _ = (torch.cat(x) for x in zip(*parts, strict=True))
    return fit_width_scale(mean, std, targets, noise_var)
