"""A Gymnasium view of one task of any registered environment.

Every environment is registered with Gymnasium when this module is imported::

    import gymnasium, spice_ray.envs.gym
    env = gymnasium.make("spice_ray/darkroom-v0", task=3, split="eval", preset="small")
    # or, without the import: gymnasium.make("spice_ray.envs.gym:spice_ray/darkroom-v0")
    envs = gymnasium.make_vec("spice_ray/darkroom-v0", num_envs=8, split="eval")  # tasks 0-7

gives task 3 of the darkroom's eval split at the small preset, the same task as the study's.

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

from spice_ray.common.gym_ids import GYM_NAMESPACE, register_ids
from spice_ray.envs.base import Environment

CELL_PIXELS = 16
"""Side of a grid cell in a rendered image, in pixels."""


class TaskEnv(gymnasium.Env):
    """One evaluation task as a ``gymnasium.Env``.

    Args:
        env: the environment (``spice_ray.envs.make(cfg.env)``).
        tasks: a batch of its tasks.
        index: which task of the batch.
        horizon: steps per episode (default: the environment's roll-in length).

    ``reset(seed=...)`` seeds the reward noise of stochastic environments.
    ``render_mode="rgb_array"`` (grid environments: the darkrooms with cell states) draws the
    grid: visited cells lighter, the goal green, the agent white, :data:`CELL_PIXELS` a cell.
    """

    metadata = {"render_modes": ["rgb_array"]}

    def __init__(self, env: Environment, tasks: Any, index: int = 0,
                 horizon: int | None = None, render_mode: str | None = None) -> None:
        self.env = env
        self.tasks = tasks
        self.index = int(index)
        self.horizon = int(horizon or env.horizon)
        if render_mode not in (None, "rgb_array"):
            raise ValueError(f"render_mode={render_mode!r} is invalid: None or 'rgb_array'")
        if render_mode is not None and not hasattr(env, "grid"):
            raise ValueError(f"render_mode='rgb_array' needs a grid environment; {env.name} "
                             "has none")
        self.render_mode = render_mode
        self.metadata = {"render_modes": ["rgb_array"] if hasattr(env, "grid") else [],
                         "render_fps": 4}
        self.action_space = spaces.Discrete(env.num_actions)
        low, high = env.state_bounds
        self.observation_space = spaces.Box(low, high, shape=(env.state_dim,),
                                            dtype=np.float64)
        self._one = self.select(tasks, self.index)
        self._state = env.reset(self._one)
        self._history: list[tuple[np.ndarray, int, float]] = []

    @staticmethod
    def select(tasks: Any, index: int) -> Any:
        """Task ``index`` as a batch of one: the tasks' own ``select`` where they have one (for
        fields shared by every task), else every array field sliced on its first axis."""
        import dataclasses

        if hasattr(tasks, "select"):
            return tasks.select(index)
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

    def render(self) -> np.ndarray | None:
        """The grid as an RGB image (uint8 [H, W, 3]) with ``render_mode="rgb_array"``."""
        if self.render_mode is None:
            return None
        size = self.env.grid
        image = np.full((size, size, 3), 40, dtype=np.uint8)
        for state, _, _ in self._history:
            image[int(state[1]), int(state[0])] = 90
        gx, gy = (int(v) for v in np.asarray(self._one.goals)[0])
        image[gy, gx] = (40, 170, 60)
        x, y = (int(v) for v in self._state[0])
        image[y, x] = (235, 235, 235)
        image = image[::-1]  # y up, as the figures draw the grid
        return np.kron(image, np.ones((CELL_PIXELS, CELL_PIXELS, 1), dtype=np.uint8))




def register_gym_envs() -> list[str]:
    """Register ``spice_ray/<name>-v0`` for every environment (idempotent; ``import
    spice_ray`` has done it already); returns the ids."""
    from spice_ray.envs.base import names

    register_ids()
    return [f"{GYM_NAMESPACE}/{name}-v0" for name in names()]


register_gym_envs()
