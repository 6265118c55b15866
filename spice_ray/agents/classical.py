"""Classical agents: the bandit baselines, a uniform-random agent and the oracle.

Bandit baselines (paper app. "Bandit Algorithms"), vectorised over tasks, for stateless
environments:

    Emp  argmax of empirical means; offline over arms seen at least once, online one pull per
         arm first.
    UCB  argmax mu_hat + c sqrt(1/n), c = 1 by default; unpulled arms first.
    LCB  argmax mu_hat - c sqrt(1/n) (offline only); unpulled arms excluded.
    TS   Gaussian prior N(1/2, 1/12), known noise variance sigma^2 (floored at
         ``NOISE_VAR_FLOOR`` when sigma = 0); online a posterior draw, offline the posterior
         mean's argmax.

They are built on the fusion module's counting (:class:`RunningStats`,
:func:`weighted_action_stats`) and its Normal-Normal posterior (:func:`gaussian_posterior`), so
each formula exists once in the project. Statistics are float64 torch tensors [B, A] on the CPU.
Tie-breaking everywhere: the lowest arm index. "Unpulled arms first" therefore means
round-robin over the unpulled arms in index order. If no arm has been seen, Emp and LCB pick
arm 0 offline.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor

from spice_ray.agents.base import Build, Method, OfflineContexts, Tunable, register_method
from spice_ray.config import EvalConfig
from spice_ray.config.grids import GRIDS
from spice_ray.fusion import (
    BETA_DEFAULT,
    STATS_DTYPE,
    Posterior,
    RandomSource,
    RunningStats,
    argmax_ties,
    beta_at,
    gaussian_posterior,
    greedy_action,
    select_action,
    tie_draws,
    weighted_action_stats,
)
from spice_ray.fusion.rules import ActionRule, BetaSchedule


def _unpulled_first(counts: Tensor, scores: Tensor, ties: Tensor | None = None) -> Tensor:
    """argmax of scores, but an unpulled arm wins (one of them at random with ``ties``, else
    the lowest index). [B, A] -> [B]."""
    return argmax_ties(torch.where(counts > 0, scores, torch.inf), ties)


def _seen_only(counts: Tensor, scores: Tensor, ties: Tensor | None = None) -> Tensor:
    """argmax of scores over arms seen at least once; any arm (by ``ties``, else arm 0) if
    none. [B, A] -> [B]."""
    return argmax_ties(torch.where(counts > 0, scores, -torch.inf), ties)


def _bonus(counts: Tensor, c: float) -> Tensor:
    """Hoeffding-style width c sqrt(1/n), [B, A]; n clamped to 1 (callers mask unpulled arms)."""
    return c * torch.sqrt(1.0 / counts.clamp_min(1.0))


class CountingBandit:
    """Base of the classical baselines: running counts and mean rewards [B, A], a generator.

    Subclasses define the online rule ``_online(counts, mean, t)`` and the offline rule
    ``_offline(counts, mean)``, both on the same statistics, so online and offline use one
    counting code path (:class:`RunningStats` online, :func:`weighted_action_stats` offline).
    """

    name = "counting"

    def __init__(self) -> None:
        self._stats: RunningStats | None = None
        self._generator: RandomSource | None = None

    @property
    def stats(self) -> RunningStats:
        if self._stats is None:
            raise RuntimeError(f"{type(self).__name__}.reset() must be called before use")
        return self._stats

    def reset(
        self, num_tasks: int, num_actions: int, draws: RandomSource | None = None
    ) -> None:
        """Empty statistics for ``num_tasks`` tasks and ``num_actions`` arms."""
        self._stats = RunningStats.zeros(num_tasks, num_actions, dtype=STATS_DTYPE)
        self._generator = draws

    def observe(self, actions: Tensor, rewards: Tensor, states: Tensor | None = None,
                next_states: Tensor | None = None) -> None:
        """In-place O(A) update with one pull per task (states are ignored: one state)."""
        self.stats.update(actions.cpu(), rewards.cpu())

    def act(self, t: int, states: Tensor | None = None) -> Tensor:
        """Actions long [B] from the running statistics."""
        return self._online(self.stats.counts, self.stats.mean, t)

    def offline_pick(self, actions: Tensor, rewards: Tensor, num_actions: int,
                     ties: Tensor | None = None) -> Tensor:
        """One arm per task from contexts actions long [B, h], rewards [B, h] -> long [B];
        ties [B] uniforms break ties (:func:`argmax_ties`; None: the lowest index)."""
        rewards = torch.as_tensor(rewards, dtype=STATS_DTYPE)
        actions = torch.as_tensor(actions, dtype=torch.long)
        counts, mean = weighted_action_stats(None, actions, rewards, num_actions)
        return self._offline(counts, mean, ties)

    def offline_picks(self, contexts: OfflineContexts) -> Tensor:
        """:meth:`offline_pick` at every context length: long [B, P]."""
        c = contexts
        return torch.stack([self.offline_pick(c.actions[:, :h], c.rewards[:, :h], c.num_actions,
                                              None if c.ties is None else c.ties[:, j])
                            for j, h in enumerate(int(v) for v in c.hs)], 1)

    def _ties(self, scores: Tensor) -> Tensor | None:
        """Uniforms that break the ties of this step's argmax (from the agent's draws)."""
        return tie_draws(self._generator, scores)

    def _online(self, counts: Tensor, mean: Tensor, t: int) -> Tensor:
        raise NotImplementedError

    def _offline(self, counts: Tensor, mean: Tensor, ties: Tensor | None = None) -> Tensor:
        raise NotImplementedError


class EmpiricalMean(CountingBandit):
    """Emp: argmax of empirical means (online: one pull per arm first)."""

    name = "emp"

    def _online(self, counts: Tensor, mean: Tensor, t: int) -> Tensor:
        return _unpulled_first(counts, mean, self._ties(mean))

    def _offline(self, counts: Tensor, mean: Tensor, ties: Tensor | None = None) -> Tensor:
        return _seen_only(counts, mean, ties)


class _ConfidenceBound(CountingBandit):
    """Shared by UCB and LCB: the scale c (>= 0) of the sqrt(1/n) term."""

    def __init__(self, c: float = 1.0) -> None:
        super().__init__()
        if c < 0:
            raise ValueError(f"c={c!r} is invalid: >= 0")
        self.c = float(c)


class UCB(_ConfidenceBound):
    """UCB: argmax mu_hat + c sqrt(1/n), unpulled arms first.

    Offline it picks the arm its index prefers after the context (the action it would take
    next), so unseen arms win there too; use Emp/LCB/TS for a conservative offline pick.

    Args:
        c: bonus scale (>= 0); the paper's form has c = 1.
    """

    name = "ucb"

    def _online(self, counts: Tensor, mean: Tensor, t: int) -> Tensor:
        return self._offline(counts, mean, self._ties(mean))

    def _offline(self, counts: Tensor, mean: Tensor, ties: Tensor | None = None) -> Tensor:
        return _unpulled_first(counts, mean + _bonus(counts, self.c), ties)


class LCB(_ConfidenceBound):
    """LCB (offline only): argmax mu_hat - c sqrt(1/n) over arms seen at least once.

    Unseen arms are excluded (their lower bound is -infinity); arm 0 if no arm was seen.
    ``act`` raises: a pessimistic rule never explores, so it has no online protocol here.

    Args:
        c: penalty scale (>= 0); the paper's form has c = 1.
    """

    name = "lcb"

    def _online(self, counts: Tensor, mean: Tensor, t: int) -> Tensor:
        raise NotImplementedError("LCB is an offline baseline; it has no online rule")

    def _offline(self, counts: Tensor, mean: Tensor, ties: Tensor | None = None) -> Tensor:
        return _seen_only(counts, mean - _bonus(counts, self.c), ties)


class PosteriorBandit(CountingBandit):
    """A fixed Gaussian prior per arm fused with the running counts by the fusion posterior.

    This is SPICE's action rule with a constant prior instead of the learned ensemble: online it
    applies ``rule`` to N(m_post, v_post); offline it is greedy on m_post. Thompson sampling is
    the special case ``rule="thompson"`` with the prior N(1/2, 1/12); a huge ``prior_var`` with
    ``rule="ucb"`` and beta = c / sigma reproduces UCB (v_post -> sigma^2 / n).

    Args:
        prior_mean: mu_pri for every arm.
        prior_var: v_pri for every arm (> 0).
        noise_var: likelihood variance sigma^2 (>= 0, floored inside the posterior).
        rule: "greedy", "ucb" or "thompson".
        beta: fixed UCB coefficient.
        beta_schedule: a schedule of :func:`beta_at` (stateless: S A = A).
        v_min: prior-variance floor.
    """

    name = "posterior"

    def __init__(
        self,
        prior_mean: float,
        prior_var: float,
        noise_var: float,
        rule: ActionRule = "ucb",
        beta: float = BETA_DEFAULT,
        beta_schedule: BetaSchedule = "fixed",
        v_min: float = 0.0,
    ) -> None:
        super().__init__()
        if not prior_var > 0:
            raise ValueError(f"prior_var={prior_var!r} is invalid: > 0")
        if noise_var < 0:
            raise ValueError(f"noise_var={noise_var!r} is invalid: >= 0 (a variance)")
        self.prior_mean = float(prior_mean)
        self.prior_var = float(prior_var)
        self.noise_var = float(noise_var)
        self.rule: ActionRule = rule
        self.beta = float(beta)
        self.beta_schedule: BetaSchedule = beta_schedule
        self.v_min = float(v_min)

    def posterior(self, counts: Tensor, mean: Tensor) -> Posterior:
        """(m_post, v_post), each [B, A], from counts and mean rewards [B, A]."""
        return gaussian_posterior(self.prior_mean, self.prior_var, counts, mean, self.noise_var,
                                  self.v_min)

    def _online(self, counts: Tensor, mean: Tensor, t: int) -> Tensor:
        beta = beta_at(t, self.beta, self.beta_schedule, counts.shape[-1])  # S = 1: A
        return select_action(self.posterior(counts, mean), self.rule, beta, self._generator)

    def _offline(self, counts: Tensor, mean: Tensor, ties: Tensor | None = None) -> Tensor:
        return greedy_action(self.posterior(counts, mean).mean, ties)


class ThompsonSampling(PosteriorBandit):
    """TS: Gaussian prior N(prior_mean, prior_var), known noise variance; needs a generator.

    Args:
        noise_var: sigma^2 of the rewards (a variance; 0 is floored inside the posterior).
        prior_mean: default 1/2, the mean of U[0, 1].
        prior_var: default 1/12, the variance of U[0, 1].
    """

    name = "ts"

    def __init__(
        self, noise_var: float, prior_mean: float = 0.5, prior_var: float = 1.0 / 12.0
    ) -> None:
        super().__init__(prior_mean, prior_var, noise_var, rule="thompson")


def _baseline(cls: type, *fields: str) -> Callable[[Any, Any, Build], Any]:
    """A factory for a bandit baseline whose arguments are evaluation constants."""
    def build(spec: Any, env: Any, b: Build) -> Any:
        return cls(*(getattr(b.eval_cfg, f) for f in fields))
    return build


def _ts(spec: Any, env: Any, b: Build) -> ThompsonSampling:
    return ThompsonSampling(b.sigma**2, b.eval_cfg.ts_prior_mean, b.eval_cfg.ts_prior_var)




class RandomAgent:
    """Uniform over the actions, from the per-task draws (a reference row)."""

    name = "random"

    def reset(self, num_tasks: int, num_actions: int, draws: RandomSource | None = None
              ) -> None:
        if draws is None:
            raise ValueError("the random agent needs a torch.Generator or StepDraws in reset()")
        self._draws = draws
        self._probs = torch.full((num_tasks, num_actions), 1.0 / num_actions,
                                 dtype=STATS_DTYPE)

    def act(self, t: int, states: Tensor | None = None) -> Tensor:
        from spice_ray.fusion import sample_categorical

        return sample_categorical(self._probs, self._draws)

    def observe(self, actions: Tensor, rewards: Tensor, states: Tensor | None = None,
                next_states: Tensor | None = None) -> None:
        """Ignores the transition."""


class OracleAgent:
    """Plays the environment's optimal action (zero regret by construction)."""

    name = "optimal"

    def __init__(self, env: Any, tasks: Any) -> None:
        self.env = env
        self.tasks = tasks

    def reset(self, num_tasks: int, num_actions: int, draws: RandomSource | None = None
              ) -> None:
        """Nothing to reset."""

    def act(self, t: int, states: Tensor) -> Tensor:
        return torch.from_numpy(np.asarray(self.env.optimal_action(self.tasks,
                                                                   states.cpu().numpy()),
                                           dtype=np.int64))

    def observe(self, actions: Tensor, rewards: Tensor, states: Tensor | None = None,
                next_states: Tensor | None = None) -> None:
        """Ignores the transition."""


def _ucb_c(cfg: EvalConfig) -> dict[str, Any]:
    return {"c": cfg.ucb_c}


register_method("emp", Method("Emp", _baseline(EmpiricalMean), offline=True,
                              stateless_only=True))
register_method("ucb", Method("UCB", _baseline(UCB, "ucb_c"), stateless_only=True,
                              constants=_ucb_c, tunables=(Tunable.of(GRIDS["ucb_c"], "c"),)))
register_method("lcb", Method("LCB", _baseline(LCB, "lcb_c"), online=False, offline=True,
                              stateless_only=True, constants=lambda cfg: {"c": cfg.lcb_c}))
register_method("ts", Method("TS", _ts, offline=True, stateless_only=True,
                             constants=lambda cfg: {"prior_mean": cfg.ts_prior_mean,
                                                    "prior_var": cfg.ts_prior_var}))
register_method("random", Method("Random", lambda spec, env, b: RandomAgent()))
register_method("optimal", Method("Optimal", lambda spec, env, b: OracleAgent(env, b.tasks)))
