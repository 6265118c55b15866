"""Action rules on a per-action posterior N(m, v): greedy, posterior-UCB (with its beta
schedules), Thompson sampling, and the registry :data:`ACTION_RULES` that ``fusion.rule``
names; with the tie-breaking every argmax of every agent uses.

Ties: :func:`argmax_ties` picks among the maximal entries with a uniform per row (from the
agent's keyed draws); without one the lowest index wins (``torch.argmax``'s documented
behaviour), so every rule is deterministic given its inputs.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal

import torch
from torch import Tensor

from spice_ray.fusion.posterior import Posterior, RandomSource

ActionRule = str
"""A key of :data:`ACTION_RULES`."""
BetaSchedule = Literal["fixed", "sqrt2logt", "sqrt_log_sat"]
BETA_SCHEDULES = ("fixed", "sqrt2logt", "sqrt_log_sat")
BETA_FREE_SCHEDULES = frozenset({"sqrt2logt"})
"""Schedules that ignore ``beta`` (see :func:`beta_at`); a sweep or a tuning grid does not vary
beta with them: the runs would be identical."""


def argmax_lowest(scores: Tensor) -> Tensor:
    """argmax over the last axis; ties go to the lowest index. scores [..., A] -> long [...]."""
    return torch.argmax(scores, dim=-1)


def argmax_ties(scores: Tensor, ties: Tensor | None = None) -> Tensor:
    """argmax over the last axis with ties broken at random: of the k actions that share the
    maximum, the floor(u k)-th in index order, u the uniform ``ties`` [...] in [0, 1) of that
    row. ``ties`` None: the lowest index (:func:`argmax_lowest`). scores [..., A] -> long [...].

    Ties are exact equality: a flat prior before any evidence, unpulled arms, unvisited cells.
    """
    if ties is None:
        return argmax_lowest(scores)
    tied = scores == scores.max(dim=-1, keepdim=True).values  # (..., A)
    k = tied.sum(dim=-1)  # (...)
    u = torch.as_tensor(ties, dtype=torch.float64, device=scores.device).reshape(k.shape)
    j = torch.minimum((u * k).long(), k - 1)  # which of the k tied actions
    rank = tied.long().cumsum(dim=-1) - 1  # (..., A): rank among the tied
    return (tied & (rank == j.unsqueeze(-1))).long().argmax(dim=-1)


def tie_draws(source: RandomSource | None, scores: Tensor) -> Tensor | None:
    """The uniforms [...] that break the ties of ``scores`` [..., A] for the next action, from
    the agent's source of randomness: its own stream of a ``StepDraws`` (keyed by task and
    step), or the next uniforms of a ``torch.Generator``; None (no source): lowest index."""
    if source is None:
        return None
    if isinstance(source, torch.Generator):
        return torch.rand(scores.shape[:-1], generator=source, dtype=torch.float64,
                          device=source.device)
    return torch.as_tensor(source.ties())


BETA_DEFAULT = 1.0
"""Posterior-UCB's beta where nothing sets it (``fusion.beta``'s default): declared once here;
the study tunes it (``spice_ray.config.grids``)."""


def beta_at(
    step: int | Tensor, beta: float = BETA_DEFAULT, schedule: BetaSchedule = "fixed", pairs: int = 1
) -> float | Tensor:
    """Posterior-UCB exploration coefficient for the next action.

    ``step`` counts the transitions observed so far (0 before the first action); the round
    index is t = step + 1. Schedules:

    - "fixed": ``beta`` at every step.
    - "sqrt2logt", the bandit theory schedule: beta_t = sqrt(2 ln max(t, 2)); the max avoids
      beta_1 = sqrt(2 ln 1) = 0, which would make the first action purely greedy, so rounds 1
      and 2 both use sqrt(2 ln 2) ~ 1.18. It ignores ``beta``.
    - "sqrt_log_sat", the paper's MDP schedule: beta_t = C sqrt(ln(S A t)) with C = ``beta``
      and S A = ``pairs`` (states times actions; A in a stateless bandit), for which
      S A t >= 2 whenever A >= 2, so beta_1 > 0.

    Args:
        step: transitions observed so far, int or long tensor [...] (per task).
        beta: the fixed coefficient ("fixed") or the constant C ("sqrt_log_sat").
        schedule: one of :data:`BETA_SCHEDULES`.
        pairs: S x A of the environment ("sqrt_log_sat" only; >= 2).

    Returns:
        A float, or a tensor [...] when ``step`` is a tensor and the schedule is not fixed.
    """
    if schedule == "fixed":
        return float(beta)
    if schedule not in BETA_SCHEDULES:
        raise ValueError(f"beta_schedule={schedule!r} is invalid: one of "
                         f"{', '.join(BETA_SCHEDULES)}")
    scale, factor, floor = (1.0, 2.0, 2.0) if schedule == "sqrt2logt" else \
        (float(beta), 1.0, 1.0)
    if schedule == "sqrt_log_sat" and pairs < 2:
        raise ValueError(f"beta_schedule=sqrt_log_sat needs S x A >= 2; got pairs={pairs}")
    size = 1 if schedule == "sqrt2logt" else int(pairs)
    if isinstance(step, Tensor):
        t = (step + 1).to(torch.get_default_dtype()).clamp_min(floor)
        return scale * torch.sqrt(factor * torch.log(size * t))
    return scale * math.sqrt(factor * math.log(size * max(step + 1, floor)))


def ucb_scores(mean: Tensor, var: Tensor, beta: float | Tensor) -> Tensor:
    """m + beta sqrt(v), [..., A]. ``beta``: float or tensor of the batch shape [...]."""
    if isinstance(beta, Tensor):
        beta = beta.to(mean).unsqueeze(-1)  # (..., 1)
    return mean + beta * torch.sqrt(var)


def greedy_action(mean: Tensor, ties: Tensor | None = None) -> Tensor:
    """argmax_a m_post (offline rule), ties broken by ``ties`` (:func:`argmax_ties`).
    mean [..., A] -> long [...]."""
    return argmax_ties(mean, ties)


def ucb_action(mean: Tensor, var: Tensor, beta: float | Tensor, ties: Tensor | None = None
               ) -> Tensor:
    """Posterior-UCB rule argmax_a m_post + beta sqrt(v_post), ties broken by ``ties``.
    [..., A] -> long [...]."""
    return argmax_ties(ucb_scores(mean, var, beta), ties)


def standard_normal(like: Tensor, source: RandomSource) -> Tensor:
    """Standard normals shaped, typed and placed like ``like`` [B, ...] from ``source``."""
    if isinstance(source, torch.Generator):
        return torch.randn(like.shape, generator=source, dtype=like.dtype, device=like.device)
    if like.dim() == 0 or like.shape[0] != len(source):
        raise ValueError(f"StepDraws for {len(source)} tasks cannot fill shape "
                         f"{tuple(like.shape)}: the leading axis must be the tasks")
    return torch.as_tensor(source.normal(tuple(like.shape[1:])), dtype=like.dtype,
                           device=like.device)


def thompson_action(mean: Tensor, var: Tensor, generator: RandomSource) -> Tensor:
    """Thompson sampling: argmax of one draw from N(m_post, v_post) per action.

    Args:
        mean: [..., A] posterior means ([B, A] with a StepDraws source).
        var: [..., A] posterior variances.
        generator: the source of randomness (a torch.Generator on ``mean``'s device).

    Returns:
        long [...] actions.
    """
    noise = standard_normal(mean, generator)
    return argmax_lowest(mean + torch.sqrt(var) * noise)


def sample_categorical(probs: Tensor, generator: RandomSource) -> Tensor:
    """One draw per row from probabilities [B, A] (rows sum to 1) -> long [B].

    A torch.Generator goes through ``torch.multinomial``; StepDraws through the inverse CDF of
    one uniform per task (:meth:`~spice_ray.common.rng.StepDraws.categorical`).
    """
    if isinstance(generator, torch.Generator):
        return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    if probs.dim() != 2 or probs.shape[0] != len(generator):
        raise ValueError(f"StepDraws for {len(generator)} tasks cannot sample probabilities of "
                         f"shape {tuple(probs.shape)}: expected [{len(generator)}, A]")
    picks = generator.categorical(probs.detach().cpu().double().numpy())  # (B,)
    return torch.from_numpy(picks).to(probs.device)


Rule = Callable[[Posterior, "float | Tensor", "RandomSource | None"], Tensor]
"""(posterior, beta, draws) -> long [...] actions."""
ACTION_RULES: dict[str, Rule] = {}
"""Every action rule by name (``fusion.rule``): :func:`register_rule` adds one."""


def register_rule(name: str, rule: Rule) -> Rule:
    """Add an action rule (the config accepts its name at once).

    Raises:
        ValueError: ``name`` is taken by another rule.
    """
    if ACTION_RULES.get(name, rule) is not rule:
        raise ValueError(f"action rule {name!r} is already registered")
    ACTION_RULES[name] = rule
    return rule


def _thompson(posterior: Posterior, beta: float | Tensor, generator: RandomSource | None
              ) -> Tensor:
    if generator is None:
        raise ValueError("the thompson rule needs a torch.Generator or StepDraws")
    return thompson_action(posterior.mean, posterior.var, generator)


register_rule("greedy", lambda post, beta, draws: greedy_action(post.mean,
                                                                tie_draws(draws, post.mean)))
"""argmax of the posterior mean (the offline rule)."""
register_rule("ucb", lambda post, beta, draws: ucb_action(post.mean, post.var, beta,
                                                          tie_draws(draws, post.mean)))
"""argmax m + beta sqrt(v) (the online rule)."""
register_rule("thompson", _thompson)
"""argmax of one posterior sample."""


def select_action(
    posterior: Posterior,
    rule: ActionRule,
    beta: float | Tensor = BETA_DEFAULT,
    generator: RandomSource | None = None,
) -> Tensor:
    """Apply one of the :data:`ACTION_RULES` to a posterior (``FusionConfig.rule``).

    Args:
        posterior: Posterior(mean [..., A], var [..., A]).
        rule: a key of :data:`ACTION_RULES` ("greedy", "ucb", "thompson", ...).
        beta: UCB coefficient, float or tensor [...] (see :func:`beta_at`).
        generator: required for "thompson" (see :data:`RandomSource`); for "greedy" and
            "ucb" it breaks ties (:func:`tie_draws`; without it, the lowest index wins).

    Returns:
        long [...] actions.
    """
    if rule not in ACTION_RULES:
        raise ValueError(f"rule={rule!r} is invalid: one of {', '.join(ACTION_RULES)}")
    return ACTION_RULES[rule](posterior, beta, generator)
