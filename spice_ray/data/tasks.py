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


def gym_env(name: str, task: int = 0, split: str = "eval", preset: str | None = None,
            horizon: int | None = None, render_mode: str | None = None,
            run_dir: str | None = None, experiment: str | None = None) -> Any:
    """Task ``task`` of ``split`` of environment ``name`` at ``preset`` scale (default
    "small") as a ``gymnasium.Env`` (:class:`spice_ray.envs.gym.TaskEnv` in a ``TimeLimit`` at
    its horizon, so ``spec.max_episode_steps`` says the episode's length): the same task as
    row ``task`` of the study's dataset of that preset (keyed by ``data.seed``, split and task
    id). With ``run_dir`` instead of ``preset``, the environment and data config of that run's
    experiment (``experiment``; by default the run's one experiment on ``name``, or the
    experiment named ``name`` where several use it), overrides included. The entry point of
    ``gymnasium.make("spice_ray/<name>-v0", task=..., split=..., preset=... | run_dir=...)``.

    Raises:
        ValueError: both ``preset`` and ``run_dir``; a run without such an experiment.
    """
    from gymnasium.wrappers import TimeLimit

    from spice_ray.envs.gym import TaskEnv

    cfg = _gym_config(name, preset, run_dir, experiment)
    env = cfg.environment()
    tasks = env.eval_tasks(generate_tasks(cfg.env, cfg.data, split, np.array([int(task)])))
    one = TaskEnv(env, tasks, 0, horizon, render_mode)
    # the episode's length as Gymnasium states it (``env.spec.max_episode_steps``, read by
    # SB3, RLlib, ...): this task's horizon, which the preset, run or ``horizon=`` sets, so it
    # is not a registration constant; the task ends its episodes there itself
    return TimeLimit(one, max_episode_steps=one.horizon)


def _gym_config(name: str, preset: str | None, run_dir: str | None,
                experiment: str | None) -> Any:
    """The config a Gymnasium task is built from: a preset's, or a run's experiment's."""
    from pathlib import Path

    from spice_ray.config import load_config, make_config

    if run_dir is None:
        if experiment is not None:
            raise ValueError("experiment= names an experiment of a run: give run_dir= too")
        return make_config(preset or "small", name)
    if preset is not None:
        raise ValueError(f"preset={preset!r} and run_dir= both given: the run's config "
                         "already says its preset and overrides; give one")
    configs = Path(run_dir) / "configs"
    if experiment is None:
        found = {p.stem: load_config(p) for p in sorted(configs.glob("*.yaml"))}
        mine = [e for e, c in found.items() if c.env.name == name]
        if len(mine) > 1 and name in mine:  # the environment's own experiment (a study's
            mine = [name]  # darkroom beside darkroom_dpt_star): what the docs' examples mean
        if len(mine) != 1:
            raise ValueError(
                f"{run_dir} has {len(mine) or 'no'} experiment(s) on environment {name!r}"
                f"{': ' + ', '.join(mine) if mine else ''}"
                + ("; name one with experiment=" if mine else
                   f" (it has: {', '.join(found) or 'none'})"))
        experiment = mine[0]
    path = configs / f"{experiment}.yaml"
    if not path.is_file():
        raise ValueError(f"{path} does not exist: is {run_dir} a study's run directory with "
                         f"experiment {experiment!r}?")
    cfg = load_config(path)
    if cfg.env.name != name:
        raise ValueError(f"experiment {experiment!r} of {run_dir} runs environment "
                         f"{cfg.env.name!r}, not {name!r}: use spice_ray/{cfg.env.name}-v0")
    return cfg


def gym_vector_env(num_envs: int, name: str, task: int = 0, split: str = "eval",
                   preset: str | None = None, horizon: int | None = None,
                   render_mode: str | None = None, run_dir: str | None = None,
                   experiment: str | None = None) -> Any:
    """``num_envs`` consecutive tasks ``task, task + 1, ...`` of ``split`` as one Gymnasium
    vector environment (each its own task, not copies of one); the vector entry point of
    ``gymnasium.make_vec("spice_ray/<name>-v0", num_envs=8, split=..., preset=...)``.
    ``reset(seed=s)`` seeds sub-environment i with s + i, as Gymnasium's vector envs do."""
    from functools import partial

    import gymnasium

    if int(num_envs) < 1:
        raise ValueError(f"num_envs must be >= 1, not {num_envs!r}")
    return gymnasium.vector.SyncVectorEnv(
        [partial(gym_env, name, int(task) + i, split, preset, horizon, render_mode, run_dir,
                 experiment)
         for i in range(int(num_envs))])
