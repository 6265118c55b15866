"""The value heads' losses as pure tensor functions (paper appendix "Value Head training"): the
TD(n) targets and regression, the shrinkage toward per-action posterior means (the prefix form
and the paper's average form), the anchor penalty and the bootstrapped-heads TD.

Values. Transition t's prediction Qbar(s_t, .) comes from position t-1, which has not seen token
t (see ``spice_ray.model.spice.align_to_transitions``); bootstraps use the next-state values
from position t.., detached.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from spice_ray.config import TrainConfig
from spice_ray.fusion.posterior import (
    TAIL_DEFAULT,
    bootstrap_values,
    gaussian_posterior,
    nstep_targets,
)
from spice_ray.model.ensemble import ValueEnsemble
from spice_ray.model.spice import align_to_transitions
from spice_ray.model.tokens import Tokens


def td_targets(rewards: Tensor, next_values: Tensor, n: int, gamma: float,
               tail: str = TAIL_DEFAULT) -> Tensor:
    """TD(n) targets y_t = sum_{i<n, t+i<=T} gamma^i r_{t+i} + gamma^n 1[t+n<=T] V(s_{t+n}).

    Rewards past the context end are not summed (truncation), and the bootstrap is added only
    when the context still holds s_{t+n} as the state of a later transition (the paper's
    indicator t + n <= T). With ``tail="bootstrap"`` a window cut by the end adds
    gamma^k V(s_{T+1}) after its k = T - t + 1 rewards instead (``train.tail``). Bandits
    (n = 1, gamma = 0) give y_t = r_t.

    Args:
        rewards: [B, T] r_t.
        next_values: [B, T], next_values[:, t-1] = V(s_{t+1}) = max_a' Qbar(s_{t+1}, a'), i.e.
            the max over actions of ``align_to_transitions(prior_mean)[1]``. Detached here.
        n: TD length (>= 1).
        gamma: discount.
        tail: "truncate" (the paper's indicator), "bootstrap" or "inside"
            (``fusion.nstep_targets``).

    Returns:
        [B, T] targets (no gradient).
    """
    return nstep_targets(rewards, next_values.detach(), n, gamma, tail=tail)


def td_loss(q_pred_mean: Tensor, actions: Tensor, targets: Tensor) -> Tensor:
    """L_TD = mean over (b, t) of (Qbar(s_t, a_t) - y_t)^2.

    Args:
        q_pred_mean: [B, T, A] leakage-free Qbar for each transition (position t-1 for t), i.e.
            ``align_to_transitions(prior_mean)[0]``.
        actions: [B, T] a_t.
        targets: [B, T] y_t.

    Returns:
        Scalar.
    """
    q_taken = q_pred_mean.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)  # (B, T)
    return ((q_taken - targets.detach()) ** 2).mean()


def prefix_action_stats(
    actions: Tensor, targets: Tensor, num_actions: int, n: int
) -> tuple[Tensor, Tensor]:
    """Per-action counts c_a and mean targets ybar_a from the prefix each position has seen.

    Position p (0..T) has seen transitions 1..p. Transition t's TD(n) target needs rewards
    r_t..r_{t+n-1}, so it counts at position p iff t + n - 1 <= p: every reward in it is then
    inside the prefix (and its bootstrap, if any, comes from position t + n - 1 <= p). With
    n = 1 position p uses exactly transitions 1..p. Targets truncated at the context end never
    enter.

    Args:
        actions: [B, T] a_t.
        targets: [B, T] y_t.
        num_actions: A.
        n: TD length of the targets.

    Returns:
        (counts, ybar), each [B, T+1, A]; ybar = sum / max(1, count).
    """
    B, T = actions.shape
    onehot = F.one_hot(actions.long(), num_actions).to(targets.dtype)  # (B, T, A)
    enter = targets.new_zeros(B, T + 1, num_actions)  # (B, T+1, A): count added at position p
    enter_y = targets.new_zeros(B, T + 1, num_actions)  # (B, T+1, A): target sum added at p
    if n <= T:  # 0-indexed transition j enters at position j + n
        enter[:, n:] = onehot[:, : T + 1 - n]
        enter_y[:, n:] = onehot[:, : T + 1 - n] * targets.detach()[:, : T + 1 - n, None]
    counts = enter.cumsum(1)  # (B, T+1, A)
    return counts, enter_y.cumsum(1) / counts.clamp(min=1.0)


def shrinkage_posterior_mean(
    counts: Tensor, ybar: Tensor, prior_mean: float, prior_var: float, noise_var: float
) -> Tensor:
    """m_a = w_a mu0 + (1 - w_a) ybar_a with w_a = sigma^2 / (sigma^2 + c_a v0); any shape.

    This is the Normal-Normal posterior mean, computed by the project's one implementation
    (:func:`spice_ray.fusion.posterior.gaussian_posterior`).
    """
    return gaussian_posterior(prior_mean, prior_var, counts, ybar, noise_var).mean


def shrink_loss(
    q_mean: Tensor,
    actions: Tensor,
    targets: Tensor,
    n: int,
    prior_mean: float,
    prior_var: float,
    noise_var: float,
) -> Tensor:
    """L_shrink, prefix-respecting: Qbar at each position shrunk toward that prefix's posterior.

    The paper compares the per-action time-average (1/H) sum_t Qbar(s_t, a) with m_a from the
    whole context. A position must not be trained toward evidence it has not seen, so here each
    position p = 0..T gets its own target m_a^(p) from :func:`prefix_action_stats` (the
    transitions p has seen), and the square is taken per position:

        L = mean over (b, p) with any c^(p)_a > 0 of
            (1 / #{a: c^(p)_a > 0}) sum_{a: c^(p)_a > 0} (Qbar_p(a) - m_a^(p))^2.

    At the last position (the whole context) the target is the paper's m_a. Targets are detached.

    Args:
        q_mean: [B, T+1, A] Qbar at every position (position 0 never has evidence).
        actions: [B, T] a_t.
        targets: [B, T] TD(n) targets y_t.
        n: TD length of the targets.
        prior_mean: mu0.
        prior_var: v0.
        noise_var: sigma^2.

    Returns:
        Scalar (0 when no position has evidence).
    """
    counts, ybar = prefix_action_stats(actions, targets, q_mean.shape[-1], n)  # (B, T+1, A) x2
    m = shrinkage_posterior_mean(counts, ybar, prior_mean, prior_var, noise_var).detach()
    return _mean_square_over_seen(q_mean, m, counts)


def average_shrink_loss(
    q_pred_mean: Tensor,
    actions: Tensor,
    targets: Tensor,
    n: int,
    prior_mean: float,
    prior_var: float,
    noise_var: float,
) -> Tensor:
    """L_shrink as the paper writes it: each action's time-average of Qbar over the context's
    states, (1/T) sum_t Qbar(s_t, a), against m_a from the whole context:

        L = mean over contexts with any c_a > 0 of
            (1 / #{a: c_a > 0}) sum_{a: c_a > 0} ((1/T) sum_t Qbar(s_t, a) - m_a)^2.

    Only the average over states is pulled, so in an MDP each state keeps its own value; the
    prefix form (:func:`shrink_loss`) pulls every state's Qbar to the state-pooled m_a. In a
    stateless bandit both pull towards per-action posterior means (the prefix form each
    position towards its own prefix's, this one their average). Qbar(s_t, a) is the
    leakage-free prediction for transition t (``align_to_transitions(prior_mean)[0]``); the
    average pulls a position towards evidence it has not seen only through the mean.

    Args:
        q_pred_mean: [B, T, A] Qbar for each transition's state.
        actions: [B, T] a_t.
        targets: [B, T] TD(n) targets y_t (the context's counts and means leave out targets
            truncated at its end, as :func:`prefix_action_stats` does).
        n, prior_mean, prior_var, noise_var: as :func:`shrink_loss`.

    Returns:
        Scalar (0 when no context has evidence).
    """
    counts, ybar = prefix_action_stats(actions, targets, q_pred_mean.shape[-1], n)
    c, y = counts[:, -1], ybar[:, -1]  # (B, A) x2: the whole context
    m = shrinkage_posterior_mean(c, y, prior_mean, prior_var, noise_var).detach()  # (B, A)
    return _mean_square_over_seen(q_pred_mean.mean(1), m, c)


def _mean_square_over_seen(q: Tensor, m: Tensor, counts: Tensor) -> Tensor:
    """Both shrinkage forms' reduction: per row (a position, or a context), the mean of
    (q_a - m_a)^2 over the actions with evidence (c_a > 0), then the mean over the rows that
    have any; 0 when none has. ``q``, ``m``, ``counts``: [..., A]."""
    seen = (counts > 0).to(q.dtype)  # (..., A)
    n_seen = seen.sum(-1)  # (...)
    per_row = (seen * (q - m) ** 2).sum(-1) / n_seen.clamp(min=1.0)  # (...)
    has = (n_seen > 0).to(q.dtype)  # (...)
    return (per_row * has).sum() / has.sum().clamp(min=1.0)


def anchor_loss(ensemble: ValueEnsemble) -> Tensor:
    """L_anchor = sum_k sum_j ||phi_kj - phi0_kj||^2 (delegates to the ensemble)."""
    return ensemble.anchor_loss()


def head_masks(task_ids: Tensor, num_heads: int) -> Tensor:
    """Which tasks each head trains on: bool [B, K], a fixed half of the tasks per head.

    A deterministic function of (task id, head), so a head sees the same tasks every epoch
    and on every worker (no random state; the bootstrap of bootstrapped DQN).
    """
    ids = task_ids.to(torch.int64).reshape(-1, 1)  # (B, 1)
    heads = torch.arange(num_heads, device=ids.device).reshape(1, -1)  # (1, K)
    x = ids * 6364136223846793005 + (heads + 1) * 1442695040888963407  # wraps in int64
    x = x ^ (x >> 31)  # splitmix-style mixing: every input bit reaches every output bit
    x = x * -49064778989728563
    x = x ^ (x >> 29)
    return ((x >> 17) & 1).bool()  # (B, K)


def bootstrapped_td_loss(q: Tensor, tokens: Tokens, cfg: TrainConfig, task_ids: Tensor
                         ) -> Tensor:
    """L_TD with every head fit to its own targets on its own half of the tasks.

    Head k's target for transition t bootstraps from head k's own V_k(s_{t+n}), and the head
    sees only the tasks :func:`head_masks` gives it, so the heads disagree where data are few
    and sigma_Q responds to data (an extension beyond the paper, where only the mean is fit).

    Args:
        q: [B, T+1, K, A] every head's Q at every position.
        tokens: the batch (actions, rewards).
        cfg: td_n, gamma, tail, bootstrap.
        task_ids: [B] the tasks' ids.
    """
    q_pred, q_next = align_to_transitions(q)  # (B, T, K, A) x2
    B, T, K, _ = q_pred.shape
    next_values = bootstrap_values(q_next.detach(), cfg.bootstrap).permute(0, 2, 1)  # (B, K, T)
    rewards = tokens.rewards.to(q_pred.dtype)[:, None, :].expand(B, K, T)  # (B, K, T)
    y = nstep_targets(rewards, next_values, cfg.td_n, cfg.gamma, tail=cfg.tail)  # (B, K, T)
    idx = tokens.actions.long()[:, :, None, None].expand(B, T, K, 1)
    taken = q_pred.gather(-1, idx).squeeze(-1).permute(0, 2, 1)  # (B, K, T)
    mask = head_masks(task_ids, K).to(taken.dtype)[:, :, None]  # (B, K, 1)
    return (mask * (taken - y.detach()) ** 2).sum() / (mask.sum() * T).clamp(min=1.0)
