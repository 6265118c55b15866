"""Gaussian multi-armed bandit, batched and pure (numpy, no per-task loop).

A task is a vector of arm means mu ~ U[0, 1]^A; pulling arm a returns r ~ N(mu_a, sigma^2).
Bandits have no state: the query/context state is a constant 1-dim zero (PROTOCOL.md).
Noise is passed in as standard normals so that every controller can see the same stream
(common random numbers).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from spice_ray.rng import TaskStreams

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
