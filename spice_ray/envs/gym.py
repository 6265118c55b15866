"""Thin Gymnasium wrappers: one task per ``gymnasium.Env``, built on the batched kernels."""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces

from spice_ray.envs import bandit, darkroom


class BanditEnv(gymnasium.Env):
    """One Gaussian bandit task. Observations are the constant state [0.0]; episodes last
    ``horizon`` pulls. ``reset(seed=...)`` seeds the reward noise."""

    metadata = {"render_modes": []}

    def __init__(self, means: np.ndarray, sigma: float = 0.3, horizon: int = 500) -> None:
        self.tasks = bandit.BanditTasks(np.asarray(means, dtype=np.float64)[None, :], sigma)
        self.horizon = horizon
        self.action_space = spaces.Discrete(self.tasks.num_arms)
        self.observation_space = spaces.Box(0.0, 0.0, shape=(bandit.STATE_DIM,), dtype=np.float32)
        self._t = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self._t = 0
        return bandit.reset(self.tasks)[0], {}

    def step(self, action: int):
        noise = self.np_random.standard_normal(1)
        reward = float(bandit.step(self.tasks, np.array([action]), noise)[0])
        self._t += 1
        truncated = self._t >= self.horizon
        info = {"regret": float(bandit.regret(self.tasks, np.array([action]))[0])}
        return bandit.reset(self.tasks)[0], reward, False, truncated, info


class DarkroomEnv(gymnasium.Env):
    """One Darkroom task (goal, start). Observation is the (x, y) cell; episodes last
    ``horizon`` steps and never terminate early (the agent should stay on the goal)."""

    metadata = {"render_modes": []}

    def __init__(self, goal: tuple[int, int], start: tuple[int, int], size: int = 10,
                 horizon: int = 100) -> None:
        self.tasks = darkroom.DarkroomTasks(np.array([goal]), np.array([start]), size)
        self.horizon = horizon
        self.action_space = spaces.Discrete(darkroom.NUM_ACTIONS)
        self.observation_space = spaces.Box(0, size - 1, shape=(2,), dtype=np.int64)
        self._state = darkroom.reset(self.tasks)
        self._t = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self._state = darkroom.reset(self.tasks)
        self._t = 0
        return self._state[0].copy(), {}

    def step(self, action: int):
        self._state, rewards = darkroom.step(self.tasks, self._state, np.array([action]))
        self._t += 1
        return self._state[0].copy(), float(rewards[0]), False, self._t >= self.horizon, {}
