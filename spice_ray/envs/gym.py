"""A Gymnasium view of one task of any registered environment.

``TaskEnv(env, tasks, index)`` plays task ``index`` of a batch of evaluation tasks (from
``env.eval_tasks(eval_split_columns)``) through the batched kernels, one step at a time:
observations are the environment's state vectors, episodes last ``horizon`` steps and never
terminate early (a darkroom agent should stay on the goal), and ``info["regret"]`` is the
step's regret under the environment's configured reading.
"""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces

from spice_ray.envs.base import Environment


class TaskEnv(gymnasium.Env):
    """One evaluation task as a ``gymnasium.Env``.

    Args:
        env: the environment (``spice_ray.envs.make(cfg.env)``).
        tasks: a batch of its tasks.
        index: which task of the batch.
        horizon: steps per episode (default: the environment's roll-in length).

    ``reset(seed=...)`` seeds the reward noise of stochastic environments.
    """

    metadata = {"render_modes": []}

    def __init__(self, env: Environment, tasks: Any, index: int = 0,
                 horizon: int | None = None) -> None:
        self.env = env
        self.tasks = tasks
        self.index = int(index)
        self.horizon = int(horizon or env.horizon)
        self.action_space = spaces.Discrete(env.num_actions)
        self.observation_space = spaces.Box(-np.inf, np.inf, shape=(env.state_dim,),
                                            dtype=np.float64)
        self._one = self._select(tasks, self.index)
        self._state = env.reset(self._one)
        self._history: list[tuple[np.ndarray, int, float]] = []

    @staticmethod
    def _select(tasks: Any, index: int) -> Any:
        """Task ``index`` as a batch of one (every array field sliced on its first axis)."""
        import dataclasses

        return dataclasses.replace(tasks, **{
            f.name: getattr(tasks, f.name)[index:index + 1]
            for f in dataclasses.fields(tasks) if isinstance(getattr(tasks, f.name), np.ndarray)})

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self._state = self.env.reset(self._one)
        self._history = []
        return self._state[0].astype(np.float64), {}

    def step(self, action: int):
        noise = self.np_random.standard_normal(1)
        actions = np.array([int(action)])
        nxt, rewards = self.env.step(self._one, self._state, actions, noise)
        self._history.append((self._state[0], int(action), float(rewards[0])))
        states, acts, rews = (np.array(x)[None] for x in zip(*self._history, strict=True))
        regret = self.env.regret(self._one, states, acts, rews, horizon=self.horizon)  # (1, t)
        self._state = nxt
        info = {"regret": float(regret[0, -1]), "state": states[0, -1], "action": int(action)}
        done = len(self._history) >= self.horizon
        return nxt[0].astype(np.float64), float(rewards[0]), False, done, info
