"""Gaussian multi-armed bandit, batched and pure (numpy, no per-task loop).

A task is a vector of arm means mu ~ U[0, 1]^A; pulling arm a returns r ~ N(mu_a, sigma^2),
sigma a *standard deviation* (default 0.3, so the likelihood variance in fusion is 0.09).
Bandits have no state: the query/context state is a constant 1-dim zero. Noise comes in as
standard normals so that every agent sees the same stream (common random numbers).

Pretraining data (paper sec. 5): the context policy of a task is the mixture
p = (1 - omega) Dirichlet(1) + omega delta_{i*}, omega = 0.5 and i* uniform over the arms, and
each context action is drawn i.i.d. from p; p is stored, since SPICE's importance weights need
pi_b(a*). The weak label is i* (the paper's main bandit setting).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from spice_ray.common.rng import TaskStreams
from spice_ray.envs.base import Column, Encoded, Environment, register
from spice_ray.envs.labels import make_labels

STATE_DIM = 1


@dataclass(frozen=True)
class BanditTasks:
    """A batch of bandit tasks.

    Attributes:
        means: float64 [B, A] arm means.
        sigma: reward noise standard deviation.
    """

    means: np.ndarray
    sigma: float

    @property
    def num_tasks(self) -> int:
        return int(self.means.shape[0])

    @property
    def num_arms(self) -> int:
        return int(self.means.shape[1])

    def with_sigma(self, sigma: float) -> BanditTasks:
        """The same means at another noise level (robustness sweep)."""
        return BanditTasks(self.means, float(sigma))


def sample_tasks(streams: TaskStreams, num_arms: int, sigma: float) -> BanditTasks:
    """Draw arm means mu_a ~ U[0, 1] i.i.d. for each task's stream."""
    return BanditTasks(streams.uniform("bandit/means", (num_arms,)), float(sigma))


def reset(tasks: BanditTasks) -> np.ndarray:
    """Initial (and only) states: zeros [B, 1]."""
    return np.zeros((tasks.num_tasks, STATE_DIM), dtype=np.float32)


def step(tasks: BanditTasks, actions: np.ndarray, noise: np.ndarray) -> np.ndarray:
    """Pull one arm per task.

    Args:
        actions: int [B] arm indices.
        noise: float [B] standard normals (the task's draw for this step).

    Returns:
        float64 [B] rewards mu_a + sigma * noise.
    """
    mu = np.take_along_axis(tasks.means, np.asarray(actions)[:, None], axis=1)[:, 0]
    return mu + tasks.sigma * noise


def expected_reward(tasks: BanditTasks, actions: np.ndarray) -> np.ndarray:
    """mu_{a} per task for actions [B] or [B, N] (broadcast over trailing axes)."""
    actions = np.asarray(actions)
    flat = actions.reshape(actions.shape[0], int(np.prod(actions.shape[1:], dtype=np.int64)))
    return np.take_along_axis(tasks.means, flat, axis=1).reshape(actions.shape)


def optimal_action(tasks: BanditTasks) -> np.ndarray:
    """argmax_a mu_a, int64 [B]."""
    return np.argmax(tasks.means, axis=1)


def optimal_rewards(tasks: BanditTasks, horizon: int) -> np.ndarray:
    """Expected reward of the optimal policy at every step, [B, H] (mu* repeated)."""
    best = tasks.means.max(axis=1)
    return np.repeat(best[:, None], horizon, axis=1)


def regret(tasks: BanditTasks, actions: np.ndarray) -> np.ndarray:
    """Pseudo-regret mu* - mu_{a} per task and step for actions [B] or [B, T]."""
    best = tasks.means.max(axis=1)
    actions = np.asarray(actions)
    gaps = best.reshape((-1,) + (1,) * (actions.ndim - 1)) - expected_reward(tasks, actions)
    return gaps


def dirichlet_mixture(streams: TaskStreams, num_arms: int, omega: float
                      ) -> tuple[np.ndarray, np.ndarray]:
    """Per-task behaviour distribution p = (1 - omega) Dir(1) + omega delta_{i*}.

    Returns:
        (probs float64 [B, A] summing to 1, favoured arm i* int64 [B] uniform over arms).
    """
    g = streams.exponential("behaviour/dirichlet", (num_arms,))  # Dir(1) = normalised Exp(1)
    dirichlet = g / g.sum(axis=1, keepdims=True)
    favoured = streams.integers("behaviour/favoured", num_arms)
    probs = (1.0 - omega) * dirichlet
    probs[np.arange(len(streams)), favoured] += omega
    return probs, favoured


@register
class Bandit(Environment):
    """The A-armed Gaussian bandit (paper sec. 5)."""

    name = "bandit"
    stateless = True
    labels = ("optimal", "weak", "weak-last", "mix")
    protocols = ("online", "offline", "robustness", "calibration")
    regret_readings = ("pseudo",)
    defaults = {
        "env": {"horizon": 500},
        "data": {"label": "weak", "num_eval_tasks": 200},
        "train": {"td_n": 1, "gamma": 0.0, "epochs": 300},
        "fusion": {"kernel": "uniform", "target": "reward", "td_n": 1, "gamma": 0.0},
        "eval": {"num_tasks": 200, "online_horizon": 500},
    }

    @dataclass(frozen=True)
    class Params:
        """Bandit fields of the ``env`` config section."""

        num_arms: int = 5
        """Arms A (in [2, 255])."""
        sigma: float = 0.3
        """Reward noise standard deviation of the datasets and of online evaluation (>= 0)."""

        def validate(self) -> None:
            if not 2 <= self.num_arms <= 255:
                raise ValueError(f"env.num_arms={self.num_arms!r} is invalid: an integer in "
                                 "[2, 255]")
            if not self.sigma >= 0:
                raise ValueError(f"env.sigma={self.sigma!r} is invalid: a float >= 0")

    @property
    def num_actions(self) -> int:
        return int(self.params.num_arms)

    def sample_means(self, streams: TaskStreams) -> np.ndarray:
        """Arm means [B, A] of each task's stream: the task family's prior (here U[0, 1]
        i.i.d.; the structured bandit families override this alone)."""
        return sample_tasks(streams, self.num_actions, self.params.sigma).means

    @property
    def state_dim(self) -> int:
        return STATE_DIM

    @property
    def state_bounds(self) -> tuple[float, float]:
        """A bandit has one state, the zero vector; the box [0, 1] holds it without the zero
        width Gymnasium's environment checker warns about on every ``make``."""
        return (0.0, 1.0)

    def columns(self) -> tuple[Column, ...]:
        a, h = self.num_actions, self.horizon
        u8, f32 = np.dtype(np.uint8), np.dtype(np.float32)
        return (
            Column("task_id", np.dtype(np.int64), ()),
            Column("means", f32, (a,)),
            Column("behaviour_probs", f32, (a,)),
            Column("favoured_arm", u8, ()),
            Column("actions", u8, (h,)),
            Column("rewards", f32, (h,)),
            Column("optimal_action", u8, ()),
            Column("label", u8, ()),
        )

    def generate(self, data: Any, split: str, streams: TaskStreams) -> dict[str, np.ndarray]:
        a, h, sigma = self.num_actions, self.horizon, self.params.sigma
        tasks = BanditTasks(self.sample_means(streams), float(sigma))
        probs, favoured = dirichlet_mixture(streams, a, data.behaviour_omega)
        actions = streams.categorical("behaviour/actions", probs, h)  # (B, H)
        noise = streams.normal("context/noise", (h,))
        rewards = expected_reward(tasks, actions) + sigma * noise
        optimal = optimal_action(tasks)
        labels = make_labels(data.label, streams, optimal, actions, a, weak=favoured,
                             behaviour_probs=probs)
        return {"means": tasks.means, "behaviour_probs": probs, "favoured_arm": favoured,
                "actions": actions, "rewards": rewards, "optimal_action": optimal,
                "label": labels}

    def encode(self, batch: Mapping[str, Any]) -> Encoded:
        probs = batch["behaviour_probs"]  # (B, A)
        b, t = batch["actions"].shape
        zeros = np.zeros((b, t, STATE_DIM), dtype=np.float32)
        return Encoded(np.zeros((b, STATE_DIM), dtype=np.float32), zeros, zeros, probs)

    def eval_tasks(self, data: Mapping[str, np.ndarray]) -> BanditTasks:
        return BanditTasks(np.asarray(data["means"], dtype=np.float64), self.params.sigma)

    def reset(self, tasks: BanditTasks) -> np.ndarray:
        return reset(tasks)

    def step(self, tasks: BanditTasks, states: np.ndarray, actions: np.ndarray,
             noise: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return states, step(tasks, actions, noise)

    def optimal_action(self, tasks: BanditTasks, states: np.ndarray) -> np.ndarray:
        return optimal_action(tasks)

    def regret(self, tasks: BanditTasks, states: np.ndarray, actions: np.ndarray,
               rewards: np.ndarray, horizon: int, reading: str | None = None) -> np.ndarray:
        """Pseudo-regret mu* - mu_{a_t} (not the realised reward's)."""
        return regret(tasks, np.asarray(actions, dtype=np.int64))

    def value_samples(self, batch: Mapping[str, np.ndarray]) -> np.ndarray:
        """The arm means of the batch's tasks [B, A]."""
        return np.asarray(batch["means"], dtype=np.float64)

    def action_values(self, tasks: BanditTasks) -> np.ndarray:
        return tasks.means

    def with_noise(self, tasks: BanditTasks, sigma: float) -> BanditTasks:
        return tasks.with_sigma(sigma)
