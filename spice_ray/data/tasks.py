"""Whole pretraining tasks for given task ids: a pure function of (config, split, ids).

Every draw comes from :class:`spice_ray.common.rng.TaskStreams` keyed by (seed, split, task_id), so
a task's content does not depend on how tasks are batched; the environment decides what a task, its
behaviour roll-in and its label are (``Environment.generate``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from spice_ray.common.rng import TaskStreams
from spice_ray.config import DataConfig, EnvConfig


def generate_tasks(env: EnvConfig, data: DataConfig, split: str, task_ids: np.ndarray
                   ) -> dict[str, np.ndarray]:
    """All columns for ``task_ids`` of ``split``."""
    ids = np.asarray(task_ids, dtype=np.int64)
    cols = env.environment().generate(data, split, TaskStreams.from_seed(data.seed, split, ids))
    cols["task_id"] = ids
    return cols


def gym_env(name: str, task: int = 0, split: str = "eval", preset: str = "small",
            horizon: int | None = None, render_mode: str | None = None) -> Any:
    """Task ``task`` of ``split`` of environment ``name`` at ``preset`` scale as a
    ``gymnasium.Env`` (:class:`spice_ray.envs.gym.TaskEnv`): the same task as row ``task`` of
    the study's dataset of that preset (keyed by ``data.seed``, split and task id). The entry
    point of ``gymnasium.make("spice_ray/<name>-v0", task=..., split=..., preset=...)``."""
    from spice_ray.config import make_config
    from spice_ray.envs.gym import TaskEnv

    cfg = make_config(preset, name)
    env = cfg.environment()
    tasks = env.eval_tasks(generate_tasks(cfg.env, cfg.data, split, np.array([int(task)])))
    return TaskEnv(env, tasks, 0, horizon, render_mode)


def gym_vector_env(num_envs: int, name: str, task: int = 0, split: str = "eval",
                   preset: str = "small", horizon: int | None = None,
                   render_mode: str | None = None) -> Any:
    """``num_envs`` consecutive tasks ``task, task + 1, ...`` of ``split`` as one Gymnasium
    vector environment (each its own task, not copies of one); the vector entry point of
    ``gymnasium.make_vec("spice_ray/<name>-v0", num_envs=8, split=..., preset=...)``.
    ``reset(seed=s)`` seeds sub-environment i with s + i, as Gymnasium's vector envs do."""
    from functools import partial

    import gymnasium

    if int(num_envs) < 1:
        raise ValueError(f"num_envs must be >= 1, not {num_envs!r}")
    return gymnasium.vector.SyncVectorEnv(
        [partial(gym_env, name, int(task) + i, split, preset, horizon, render_mode)
         for i in range(int(num_envs))])
