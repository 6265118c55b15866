"""References that know the task family's exact posterior (the non-Bayesian task-family
references, LinUCB, a nearest-unvisited-cell searcher and a hill climber, are in
``spice_ray.agents.references``).

``BayesAgent`` reads a :class:`~spice_ray.envs.bayes.TaskPosterior` (the environment's exact
posterior over tasks given the context) and acts on it directly: posterior-UCB on its mean and
variance (``Bayes posterior-UCB``), or one joint posterior draw per step (Thompson sampling
with the true prior: ``TS (true prior)``, ``LinTS (true prior)``). The fused oracle row
(``SPICE (oracle prior)``) is :class:`~spice_ray.agents.spice.SpiceAgent` with the same
posterior as its prior.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from spice_ray.agents.base import Build, Method, register_method, to_numpy
from spice_ray.envs.bayes import TaskPosterior
from spice_ray.fusion import (
    BETA_DEFAULT,
    STATS_DTYPE,
    Posterior,
    RandomSource,
    beta_at,
    select_action,
)
from spice_ray.fusion.rules import BetaSchedule


class BayesAgent:
    """Acts on the exact task posterior: ``ucb`` (mean + beta sd) or ``thompson`` (argmax of
    one joint draw).

    Args:
        posterior: the environment's ``task_posterior()``.
        rule: "ucb" or "thompson".
        beta: fixed UCB coefficient; beta_schedule: "fixed" or a schedule of ``beta_at``.
        name: the method name.
    """

    def __init__(self, posterior: TaskPosterior, rule: str = "ucb", beta: float = BETA_DEFAULT,
                 beta_schedule: BetaSchedule = "fixed", name: str = "bayes-ucb",
                 num_states: int = 1) -> None:
        if rule not in ("ucb", "thompson"):
            raise ValueError(f"rule={rule!r} is invalid: ucb or thompson")
        self.posterior, self.rule, self.name = posterior, rule, name
        self.beta, self.beta_schedule = float(beta), beta_schedule
        self.num_states, self.num_actions = int(num_states), 0
        self._draws: RandomSource | None = None

    def reset(self, num_tasks: int, num_actions: int, draws: RandomSource | None = None
              ) -> None:
        if self.rule == "thompson" and not hasattr(draws, "categorical"):
            raise ValueError(f"{self.name} needs per-task StepDraws in reset()")
        self.posterior.reset(num_tasks)
        self._draws, self.num_actions = draws, num_actions

    def observe(self, actions: Tensor, rewards: Tensor, states: Tensor, next_states: Tensor
                ) -> None:
        self.posterior.observe(*(to_numpy(x) for x in (actions, rewards, states, next_states)))

    def act(self, t: int, states: Tensor) -> Tensor:
        s = to_numpy(states)
        if self.rule == "thompson":
            return torch.from_numpy(self.posterior.sample(s, self._draws).argmax(axis=1))
        mean, var = (torch.from_numpy(v).to(STATS_DTYPE) for v in self.posterior.moments(s))
        return select_action(Posterior(mean, var), "ucb",
                             beta_at(t, self.beta, self.beta_schedule,
                                     self.num_states * self.num_actions), self._draws)


def _bayes_ucb(spec: Any, env: Any, b: Build) -> BayesAgent:
    fusion = spec.fusion
    return BayesAgent(env.task_posterior(fusion.gamma), "ucb", fusion.beta,
                      fusion.beta_schedule, spec.method, env.num_states)


def _bayes_ts(spec: Any, env: Any, b: Build) -> BayesAgent:
    return BayesAgent(env.task_posterior(spec.fusion.gamma), "thompson", name=spec.method)


register_method("bayes-ucb", Method("Bayes posterior-UCB", _bayes_ucb, requires="task_posterior",
                                    settings=("beta", "beta_schedule")))
"""Posterior-UCB on the exact task posterior, without fusing the context a second time."""
register_method("bayes-ts", Method("TS (true prior)", _bayes_ts, requires="task_posterior"))
register_method("lints", Method("LinTS (true prior)", _bayes_ts, requires="arm_features"))
