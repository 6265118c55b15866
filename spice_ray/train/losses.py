"""SPICE and DPT training losses as pure tensor functions (paper sec. 3.2 and appendix
"Weighted Objectives", "Value Head training", "Randomised priors and anchoring").

Positions. Model outputs have T+1 positions; position p (0..T) has seen the query and the first
p transitions. The label a* is the action for the query state, so it supervises every position
p = 0..T. Position 0 (the query alone) is included because online rollouts act at t = 0 from it
(PROTOCOL "SPICE details the paper leaves open"); the paper's 1/H sum over t = 1..H becomes a
mean over the T+1 positions.

Values. Transition t's prediction Qbar(s_t, .) comes from position t-1, which has not seen token
t (see ``spice_ray.model.spice.align_to_transitions``); bootstraps use the next-state values
from position t.., detached.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from spice_ray.config import TrainConfig
from spice_ray.fusion.posterior import bootstrap_values
from spice_ray.model.spice import SpiceOutput, align_to_transitions
from spice_ray.model.tokens import Tokens
from spice_ray.model.trunk import TrunkModel
from spice_ray.train.value_losses import (
    average_shrink_loss,
    bootstrapped_td_loss,
    shrink_loss,
    td_loss,
    td_targets,
)


def _at_label(x: Tensor, label: Tensor) -> Tensor:
    """x[b, p, label[b]]: [B, P, A], [B] -> [B, P]."""
    B, P, _ = x.shape
    idx = label.long().view(B, 1, 1).expand(B, P, 1)  # (B, P, 1)
    return x.gather(-1, idx).squeeze(-1)


def importance_weights(behaviour_probs: Tensor, label: Tensor, clip: float) -> Tensor:
    """omega_IS = clip((1/A) / pi_b(a*), 0, c_iw).

    Args:
        behaviour_probs: [B, A] pi_b.
        label: [B] a*.
        clip: c_iw.

    Returns:
        [B]; pi_b(a*) = 0 gives c_iw.
    """
    A = behaviour_probs.shape[-1]
    p = behaviour_probs.gather(-1, label.long().unsqueeze(-1)).squeeze(-1)  # (B,)
    return ((1.0 / A) / p).clamp(0.0, clip)


def advantage_weights(
    q_mean: Tensor, label: Tensor, temperature: float, floor: float, clip: float
) -> Tensor:
    """omega_adv = clip(exp(A(a*) / tau_adv), eps, c_adv), A(a) = Qbar(a) - mean_a' Qbar(a').

    Args:
        q_mean: [B, P, A] ensemble mean at each position.
        label: [B] a*.
        temperature: tau_adv.
        floor: eps.
        clip: c_adv.

    Returns:
        [B, P].
    """
    adv = _at_label(q_mean, label) - q_mean.mean(-1)  # (B, P)
    # exp(min(x, log c)) == min(exp(x), c) without overflowing to inf first.
    return torch.exp((adv / temperature).clamp(max=math.log(clip))).clamp(min=floor)


def epistemic_weights(
    q_std: Tensor, label: Tensor, scale: float, floor: float, clip: float
) -> Tensor:
    """omega_epi = clip(1 + lambda_sigma * sigma_Q(a*), eps, c_epi).

    Args:
        q_std: [B, P, A] ensemble std at each position.
        label: [B] a*.
        scale: lambda_sigma.
        floor: eps.
        clip: c_epi.

    Returns:
        [B, P].
    """
    return (1.0 + scale * _at_label(q_std, label)).clamp(floor, clip)


def policy_weights(
    q_mean: Tensor, q_std: Tensor, behaviour_probs: Tensor, label: Tensor, cfg: TrainConfig
) -> Tensor:
    """omega = omega_IS * omega_adv * omega_epi, each factor 1 when switched off.

    Args:
        q_mean: [B, P, A] ensemble mean Qbar at each position.
        q_std: [B, P, A] ensemble std sigma_Q at each position.
        behaviour_probs: [B, A] pi_b.
        label: [B] a*.
        cfg: use_iw/use_adv/use_epi, the clips and ``detach_weights``.

    Returns:
        [B, P]; detached when ``cfg.detach_weights``.
    """
    if cfg.detach_weights:
        q_mean, q_std = q_mean.detach(), q_std.detach()
    B, P, _ = q_mean.shape
    w = q_mean.new_ones(B, P)
    if cfg.use_iw:
        w = w * importance_weights(behaviour_probs, label, cfg.clip_iw).to(w.dtype).unsqueeze(1)
    if cfg.use_adv:
        w = w * advantage_weights(q_mean, label, cfg.adv_temperature, cfg.weight_floor,
                                  cfg.adv_clip)
    if cfg.use_epi:
        w = w * epistemic_weights(q_std, label, cfg.epi_scale, cfg.weight_floor, cfg.epi_clip)
    return w


def _upcast(x: Tensor) -> Tensor:
    """float16/bfloat16 (autocast outputs) -> float32; other dtypes unchanged."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def policy_cross_entropy(logits: Tensor, label: Tensor) -> Tensor:
    """-log pi(a* | h_p) at every position: [B, P, A], [B] -> [B, P] (computed in float32+)."""
    return -_at_label(F.log_softmax(_upcast(logits), -1), label)


def weighted_policy_loss(logits: Tensor, label: Tensor, weights: Tensor | None = None) -> Tensor:
    """L_pi = mean over (b, p) of omega[b, p] * (-log pi(a*_b | h_{b,p})).

    Args:
        logits: [B, P, A] policy logits at every position used (P = T+1: query included).
        label: [B] a*.
        weights: [B, P] omega, or None for plain cross-entropy.

    Returns:
        Scalar.
    """
    ce = policy_cross_entropy(logits, label)  # (B, P)
    if weights is not None:
        ce = ce * weights.to(ce.dtype)
    return ce.mean()


def spice_loss(
    out: SpiceOutput, tokens: Tokens, cfg: TrainConfig, anchor: Tensor,
    task_ids: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """L = L_pi + lambda_q (L_TD + lambda_shrink L_shrink) + lambda_anchor L_anchor.

    Args:
        out: model outputs at all positions ([B, T+1, ...]), T >= 1.
        tokens: the batch (actions, rewards, label, behaviour_probs).
        cfg: loss weights, weight clips, TD(n) and shrinkage settings.
        anchor: scalar L_anchor (``model.anchor_loss()``).
        task_ids: [B] the tasks' ids (``train.head_targets="bootstrap"`` needs them).

    Returns:
        (loss, components): components are detached scalars ``loss``, ``policy``, ``td``,
        ``shrink``, ``anchor``, ``weight_mean``, ``weight_max``, ``q_std_mean``.
    """
    if tokens.context_len < 1:
        raise ValueError("spice_loss needs a context of at least one transition (T >= 1)")
    q_mean, q_std = _upcast(out.prior_mean), _upcast(out.prior_std)  # (B, T+1, A) x2
    q_pred, q_next = align_to_transitions(q_mean)  # (B, T, A) x2
    next_values = bootstrap_values(q_next.detach(), cfg.bootstrap)  # (B, T): V(s_{t+1})
    y = td_targets(tokens.rewards.to(q_pred.dtype), next_values, cfg.td_n, cfg.gamma,
                   cfg.tail)  # (B, T)
    if cfg.head_targets == "bootstrap":
        if task_ids is None:
            raise ValueError("train.head_targets=bootstrap needs the batch's task ids")
        l_td = bootstrapped_td_loss(_upcast(out.q), tokens, cfg, task_ids)
    else:
        l_td = td_loss(q_pred, tokens.actions, y)
    if cfg.shrink_form == "average":
        l_shrink = average_shrink_loss(q_pred, tokens.actions, y, cfg.td_n,
                                       cfg.shrink_prior_mean, cfg.shrink_prior_var,
                                       cfg.shrink_noise_var)
    else:
        l_shrink = shrink_loss(q_mean, tokens.actions, y, cfg.td_n, cfg.shrink_prior_mean,
                               cfg.shrink_prior_var, cfg.shrink_noise_var)
    first = 0 if cfg.query_position else 1  # position 0: the query alone
    w = policy_weights(q_mean, q_std, tokens.behaviour_probs, tokens.label, cfg)[:, first:]
    l_pi = weighted_policy_loss(out.logits[:, first:], tokens.label, w)
    loss = l_pi + cfg.lambda_q * (l_td + cfg.lambda_shrink * l_shrink) \
        + cfg.lambda_anchor * anchor
    parts = {
        "loss": loss, "policy": l_pi, "td": l_td, "shrink": l_shrink, "anchor": anchor,
        "weight_mean": w.mean(),
        "weight_max": w.max(),
        "q_std_mean": q_std.mean(),
    }
    if out.pred_var is not None:
        l_var = predictive_variance_loss(out.pred_var, q_pred, tokens.actions, y)
        loss = loss + cfg.lambda_var * l_var
        parts |= {"loss": loss, "var": l_var}
    return loss, {k: v.detach() for k, v in parts.items()}


def predictive_variance_loss(pred_var: Tensor, q_pred: Tensor, actions: Tensor, y: Tensor
                             ) -> Tensor:
    """Gaussian NLL of each transition's target under N(Q-bar, v): the variance head learns
    E[(y_t - Q-bar_{t-1}(a_t))^2 | context], the spread of the next target around the
    prior's mean (the target's noise plus what the context leaves unknown), PFN-style. The
    mean is detached: no gradient reaches the value heads from here (the trunk, which every
    head reads, does take one). Leakage-free as L_TD: v for transition t comes from position
    t-1 (:func:`align_to_transitions`).

    Args:
        pred_var: [B, T+1, A] the head's variance at every position.
        q_pred: [B, T, A] Q-bar at (s_t, .) from position t-1.
        actions: [B, T] a_t.
        y: [B, T] the targets (detached here).
    """
    v_pred, _ = align_to_transitions(_upcast(pred_var))  # (B, T, A)
    a = actions.long()[..., None]  # (B, T, 1)
    mean = q_pred.gather(-1, a).squeeze(-1).detach()  # (B, T)
    var = v_pred.gather(-1, a).squeeze(-1)  # (B, T)
    return F.gaussian_nll_loss(mean, y.detach(), var, full=False, eps=1e-6)


def dpt_loss(
    logits: Tensor, label: Tensor, train_query_position: bool = True
) -> tuple[Tensor, dict[str, Tensor]]:
    """DPT objective: plain cross-entropy on the label at every position.

    Args:
        logits: [B, T+1, A] policy logits.
        label: [B] a*.
        train_query_position: include position 0 (the query alone). The DPT reference code
            trains positions 1..T only; False reproduces that.

    Returns:
        (loss, {"loss", "policy"} detached).
    """
    if not train_query_position:
        logits = logits[:, 1:]
    loss = weighted_policy_loss(logits, label)
    return loss, {"loss": loss.detach(), "policy": loss.detach()}


# ---- the loss of each model kind ----------------------------------------------------------------

LossFn = Callable[[Any, Tokens, TrunkModel, Tensor, TrainConfig], tuple[Tensor, dict[str, Tensor]]]
"""(model outputs, tokens, the model, task ids [B], train config) -> (loss, detached parts)."""

LOSSES: dict[str, LossFn] = {}
"""Model kind (``model.registry.MODELS``) -> its training loss; the loop asks here by kind."""

VALUE_LOSS_FIELDS = frozenset({"h0_prior", "lambda_shrink", "shrink_form", "tail",
                               "value_target"})
"""Train fields read only by the value heads' losses and added after models were trained
(``config.LATER_DEFAULTS``): a kind whose loss has no value term leaves them out of its
models' training identity, so a variant that changes only them does not retrain it. (The
older SPICE-only fields -- lambda_q, td_n, gamma, the policy loss's weights -- stay in every
identity: leaving them out would change the identity of every model already trained.)"""

IGNORED_FIELDS: dict[str, frozenset[str]] = {}
"""Model kind -> train fields its loss does not read (left out of its training identity)."""


def register_loss(kind: str, ignores: frozenset[str] = frozenset()
                  ) -> Callable[[LossFn], LossFn]:
    """Decorator: ``fn`` is the training loss of model kind ``kind``; ``ignores``: train
    fields it does not read (of :data:`VALUE_LOSS_FIELDS`)."""
    unknown = set(ignores) - VALUE_LOSS_FIELDS
    if unknown:
        raise ValueError(f"register_loss({kind!r}): ignores={sorted(unknown)} is invalid: "
                         f"a subset of {sorted(VALUE_LOSS_FIELDS)}")

    def add(fn: LossFn) -> LossFn:
        LOSSES[kind] = fn
        IGNORED_FIELDS[kind] = frozenset(ignores)
        return fn
    return add


def loss_for(kind: str) -> LossFn:
    """The training loss of a model kind.

    Raises:
        ValueError: naming the kinds that have one.
    """
    try:
        return LOSSES[kind]
    except KeyError:
        raise ValueError(f"model kind {kind!r} has no training loss: one of "
                         f"{', '.join(LOSSES)}") from None


@register_loss("spice")
def _spice_batch_loss(out: SpiceOutput, tokens: Tokens, model: TrunkModel, task_ids: Tensor,
                      cfg: TrainConfig) -> tuple[Tensor, dict[str, Tensor]]:
    ids = task_ids if cfg.head_targets == "bootstrap" else None
    if cfg.h0_prior == "state":  # position 0's values: of s_1 itself, not of the drawn query
        out = model.with_state_values(out, tokens.states[:, 0])
    return spice_loss(out, tokens, cfg, model.anchor_loss(), task_ids=ids)


@register_loss("dpt", ignores=VALUE_LOSS_FIELDS)  # plain cross-entropy
def _dpt_batch_loss(out: Any, tokens: Tokens, model: TrunkModel, task_ids: Tensor,
                    cfg: TrainConfig) -> tuple[Tensor, dict[str, Tensor]]:
    return dpt_loss(out.logits, tokens.label, cfg.query_position)
