"""Epsilon-greedy as a spice-ray plugin: a new agent and a new task family, added to the study
from outside the package.

    pip install -e examples/epsilon_greedy        # declares the entry point below
    python pipelines/full_run.py --preset smoke --experiments bandit,sparse_bandit --out /tmp/eps

The bandit study then tunes its epsilon (declared below, with its grid) on validation tasks,
evaluates it at the chosen epsilon on the eval tasks, and shows
it in ``bandit_online``, ``bandit_tuned``, their figures and the report; in-process,
``spice_ray.evaluate.evaluate(["epsilon-greedy", "ucb"], env="bandit")`` scores it in seconds.
Nothing under ``spice_ray/`` names it: this module's ``pyproject.toml`` declares it in the
entry-point group ``spice_ray.plugins``, and every spice-ray process (the driver, Ray actors)
imports it the first time it meets a name it does not know.

The agent: the best empirical mean, except that with probability epsilon the arm is drawn
uniformly (each arm once first, as Emp does).

The task family, ``sparse_bandit`` (an environment, its scales and its experiment, in this one
file): the Gaussian bandit whose arms pay U[0, 0.5] but for one per task, drawn uniformly, that
pays 0.5 more; ``gymnasium.make("spice_ray/sparse_bandit-v0")`` plays it, and the
``sparse_bandit`` experiment trains and tunes SPICE, DPT and the baselines on it (epsilon-greedy
among them) as the study does the bandit.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from spice_ray.agents import AgentSpec, Method, Tunable, register_method
from spice_ray.agents.classical import CountingBandit
from spice_ray.common.rng import TaskStreams
from spice_ray.envs.bandit import Bandit
from spice_ray.envs.base import register
from spice_ray.fusion import argmax_ties, sample_categorical
from spice_ray.study.experiments import (
    Evaluation,
    add_evaluation,
    add_experiment,
    bandit_experiment,
)

EPSILON = 0.1
"""The exploration probability of the untuned method."""
EPSILONS = (0.02, 0.05, 0.1, 0.2)
"""The epsilons the study's tuning stage tries on validation tasks."""


class EpsilonGreedy(CountingBandit):
    """Acts by one categorical draw per task and step: (1 - epsilon) on the greedy arm (ties
    broken by the agent's tie draws) plus epsilon / A on every arm.

    Args:
        epsilon: exploration probability in [0, 1].
    """

    name = "epsilon-greedy"

    def __init__(self, epsilon: float = EPSILON) -> None:
        super().__init__()
        if not 0.0 <= epsilon <= 1.0:
            raise ValueError(f"epsilon={epsilon!r} is invalid: a probability in [0, 1]")
        self.epsilon = float(epsilon)

    def _online(self, counts: Tensor, mean: Tensor, t: int) -> Tensor:
        if self._generator is None:
            raise ValueError("epsilon-greedy needs a torch.Generator or StepDraws in reset()")
        greedy = argmax_ties(torch.where(counts > 0, mean, torch.inf), self._ties(mean))
        num_actions = counts.shape[-1]
        probs = torch.full(counts.shape, self.epsilon / num_actions, dtype=mean.dtype)
        probs[torch.arange(len(greedy)), greedy] += 1.0 - self.epsilon
        return sample_categorical(probs, self._generator)


register_method("epsilon-greedy", Method(
    "Epsilon-greedy", lambda spec, env, b: EpsilonGreedy(spec.option("epsilon")),
    stateless_only=True, tunables=(Tunable("epsilon", EPSILONS, default=EPSILON),)))

# its rows in the bandit experiment: tuned over EPSILONS, and in the online table (at EPSILON)
add_evaluation("bandit", Evaluation("epsilon-greedy", lambda cfg: [AgentSpec("epsilon-greedy")],
                                    ("online",)), tables=("bandit_online",))


@register
class SparseBandit(Bandit):
    """One good arm per task: means U[0, 0.5], and 0.5 more on an arm drawn uniformly. At the
    bandit's scales at every preset (a subclass inherits its base's presets as it inherits
    its defaults; a ``presets = {"smoke": {...}}`` here would declare its own)."""

    name = "sparse_bandit"

    def sample_means(self, streams: TaskStreams) -> np.ndarray:
        means = 0.5 * streams.uniform("sparse/means", (self.num_actions,))  # (B, A)
        good = streams.integers("sparse/good", self.num_actions)  # (B,)
        means[np.arange(len(means)), good] += 0.5
        return means


add_experiment(bandit_experiment("sparse_bandit", "sparse bandit A=5 (plugin)",
                                 env="sparse_bandit"))
add_evaluation("sparse_bandit", Evaluation(
    "epsilon-greedy", lambda cfg: [AgentSpec("epsilon-greedy")], ("online",)),
    tables=("sparse_bandit_online",))
