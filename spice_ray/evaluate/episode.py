"""The DPT paper's offline protocol on grids ("episode"): one episode from a fixed context.

Each eval task's own context -- H transitions of the uniform behaviour policy, as in the
dataset -- is given to the agent once; the agent then acts for one episode of
``eval.online_horizon`` steps from the corner cell (0, 0), and its own transitions are NOT added
to the context (offline: nothing is learned while acting). Rows: ``cumulative_return`` and
``cumulative_regret`` (against the environment's configured reading from the same start) per
step, like the online protocol's. This is how the DPT paper scores DPT on Darkroom (about 61.5
return with H = 100), so a DPT trained on optimal labels can be checked against it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from spice_ray.agents import Agent, AgentSpec, make_agent
from spice_ray.common.metrics import CUMULATIVE_REGRET, CUMULATIVE_RETURN
from spice_ray.config import EnvConfig, EvalConfig
from spice_ray.evaluate.accuracy import METRICS as ACCURACY_METRICS
from spice_ray.evaluate.accuracy import grid_accuracy
from spice_ray.evaluate.online import agent_draws, applicable_specs, run_online
from spice_ray.evaluate.rows import concat_rows, tidy_rows
from spice_ray.fusion import RandomSource
from spice_ray.model.trunk import TrunkModel


class FrozenContext:
    """An agent that sees a fixed context once (at reset) and nothing it does afterwards.

    Args:
        agent: any agent.
        context: (actions long [B, T], rewards [B, T], states [B, T, S], next states
            [B, T, S]), observed in order at every reset.
    """

    def __init__(self, agent: Agent, context: tuple[Tensor, Tensor, Tensor, Tensor]) -> None:
        self.agent, self.context = agent, context
        self.name = agent.name

    def reset(self, num_tasks: int, num_actions: int, draws: RandomSource | None = None
              ) -> None:
        self.agent.reset(num_tasks, num_actions, draws)
        actions, rewards, states, next_states = self.context
        for i in range(actions.shape[1]):
            self.agent.observe(actions[:, i], rewards[:, i], states[:, i], next_states[:, i])

    def act(self, t: int, states: Tensor) -> Tensor:
        return self.agent.act(self.context[0].shape[1], states)  # the context does not grow

    def observe(self, actions: Tensor, rewards: Tensor, states: Tensor, next_states: Tensor
                ) -> None:
        """Offline: the episode's own transitions are not added."""


def episode_rows(env_cfg: EnvConfig, eval_cfg: EvalConfig, data: Mapping[str, np.ndarray],
                 specs: Sequence[AgentSpec], model: TrunkModel | None = None, seed: int = 0
                 ) -> pd.DataFrame:
    """Rows of every applicable spec under the episode protocol (see the module docstring).

    Raises:
        ValueError: if the environment's tasks have no start cells to move to (0, 0).
    """
    env = env_cfg.environment()
    task_ids = np.asarray(data["task_id"])
    H = eval_cfg.online_horizon
    tasks = env.eval_tasks(data)
    if not hasattr(tasks, "starts"):
        raise ValueError(f"env.name={env_cfg.name}: the episode protocol needs tasks with start "
                         "cells")
    tasks = dataclasses.replace(tasks, starts=np.zeros_like(tasks.starts))
    dtype = env.reset(tasks).dtype  # the states the agent sees while acting
    encoded = env.encode(data)
    context = (torch.as_tensor(np.asarray(data["actions"], dtype=np.int64)),
               torch.as_tensor(np.asarray(data["rewards"], dtype=np.float64)),
               torch.as_tensor(np.asarray(encoded.states, dtype=dtype)),
               torch.as_tensor(np.asarray(encoded.next_states, dtype=dtype)))
    steps = np.arange(1, H + 1)
    shown = (np.asarray(data["rewards"]) > 0).any(1).astype(np.float64)
    frames = []
    for spec in applicable_specs(specs, env, eval_cfg, online=True):
        agent = FrozenContext(make_agent(spec, env, tasks, model, eval_cfg), context)
        run = run_online(agent, env, tasks, H, np.zeros((len(task_ids), H)),
                         draws=agent_draws(eval_cfg.seed, task_ids))
        regret = np.cumsum(env.regret(tasks, run.states, run.actions, run.rewards, H), axis=1)
        config = spec.config_json(eval_cfg, protocol="episode")
        for metric, values in ((CUMULATIVE_RETURN, np.cumsum(run.rewards, axis=1)),
                               (CUMULATIVE_REGRET, regret)):
            frames.append(tidy_rows(env.name, spec.label, spec.rule(), config, seed, task_ids,
                                    metric, steps, values))
        if hasattr(env, "grid"):  # the action at every cell, on the same fixed context
            agent.reset(len(task_ids), env.num_actions, agent_draws(eval_cfg.seed, task_ids))
            accuracy, stay = grid_accuracy(agent, tasks.goals, env.grid, context[0].shape[1],
                                           dtype)
            for metric, values in zip(ACCURACY_METRICS, (accuracy, stay, shown), strict=True):
                frames.append(tidy_rows(env.name, spec.label, spec.rule(), config, seed,
                                        task_ids, metric, np.array([-1]), values[:, None]))
    return concat_rows(frames)
