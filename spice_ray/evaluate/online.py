"""The online protocol: every agent in every environment, through one loop.

From an empty context, each task acts H steps per episode (``EvalConfig.episodes`` episodes,
the context kept across them, each restarting at the task's start state), appending every
transition to its context. Every agent sees the same randomness: the environment's noise of
(task, step) is ``TaskStreams.from_seed(eval_seed, "eval", task_ids).normal("online/noise",
(E*H,))`` (common random numbers, also across the robustness sweep's noise levels), and
randomised agents (TS, DPT sampling, SPICE-Thompson, random) draw from per-task
:class:`~spice_ray.common.rng.StepDraws` keyed by (eval seed, task id, request), so a task's rows do
not depend on how tasks are sharded over actors.

Metrics per (task, step): ``cumulative_regret`` under the environment's configured regret
reading, ``cumulative_regret_<reading>`` under each other reading it has, and, in environments
with states, ``cumulative_return``; with robustness noise levels, ``final_regret`` (x = H).
In environments whose states have grid positions, ``visits`` counts, per task, the steps at
which the agent acted from each cell (x = the cell index x * size + y; they sum to H).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from spice_ray.agents import Agent, AgentSpec, make_agent
from spice_ray.agents.stacked import StackedAgents, stackable
from spice_ray.common.metrics import CUMULATIVE_REGRET, CUMULATIVE_RETURN, FINAL_REGRET
from spice_ray.common.rng import StepDraws, TaskStreams
from spice_ray.config import EnvConfig, EvalConfig
from spice_ray.evaluate.rows import concat_rows, tidy_rows
from spice_ray.fusion import RandomSource
from spice_ray.model.trunk import TrunkModel

log = logging.getLogger(__name__)

NOISE_STREAM = "online/noise"
"""TaskStreams stream of the online environment noise (common random numbers)."""
AGENT_STREAM = "online/controller"
"""StepDraws stream of randomised agents' draws (Thompson noise, policy samples). The key is
the first release's: changing it would change every randomised agent's draws."""


def online_noise(eval_seed: int, task_ids: np.ndarray, steps: int) -> np.ndarray:
    """Standard-normal noise [B, steps] per (task, step): the common random numbers."""
    return TaskStreams.from_seed(eval_seed, "eval", np.asarray(task_ids)).normal(
        NOISE_STREAM, (steps,))


def agent_draws(eval_seed: int, task_ids: np.ndarray) -> StepDraws:
    """Fresh per-task draws for one randomised agent's run over ``task_ids``: every agent gets
    the same draws, and a task's draws depend on (eval seed, task id, step) only."""
    return StepDraws(TaskStreams.from_seed(eval_seed, "eval", np.asarray(task_ids)),
                     AGENT_STREAM)


@dataclass(frozen=True)
class Rollout:
    """What an online run did, per task and step (N = episodes * horizon).

    Attributes:
        states: [B, N, S] the state each action was taken in.
        actions: int64 [B, N].
        rewards: float64 [B, N].
    """

    states: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray


def run_online(agent: Agent, env, tasks, horizon: int, noise: np.ndarray,
               episodes: int = 1, draws: RandomSource | None = None) -> Rollout:
    """Act ``episodes`` episodes of ``horizon`` steps in every task, the context kept.

    Args:
        agent: any :class:`~spice_ray.agents.Agent`.
        env: the environment (``spice_ray.envs.Environment``).
        tasks: its tasks (``env.eval_tasks(...)``).
        horizon: steps per episode.
        noise: [B, >= episodes * horizon] standard normals (common random numbers).
        episodes: episodes per run; each restarts at the task's start state.
        draws: handed to ``agent.reset`` (randomised agents need it).
    """
    B, N = tasks.num_tasks, episodes * horizon
    if noise.shape[0] != B or noise.shape[1] < N:
        raise ValueError(f"noise has shape {noise.shape}, need ({B}, >= {N})")
    agent.reset(B, env.num_actions, draws)
    states_log = np.empty((B, N, env.state_dim), dtype=np.float64)
    actions = np.empty((B, N), dtype=np.int64)
    rewards = np.empty((B, N), dtype=np.float64)
    t = 0
    for _ in range(episodes):
        states = env.reset(tasks)  # (B, S)
        for _ in range(horizon):
            s = torch.from_numpy(states)
            a = agent.act(t, s)  # (B,)
            actions[:, t] = a.detach().cpu().numpy()
            states_log[:, t] = states
            nxt, rewards[:, t] = env.step(tasks, states, actions[:, t], noise[:, t])
            agent.observe(torch.from_numpy(actions[:, t]), torch.from_numpy(rewards[:, t]), s,
                          torch.from_numpy(nxt))
            states = nxt
            t += 1
    return Rollout(states_log, actions, rewards)


STACK_ON_CPU = "cached"
"""Which learned agents stack on a CPU: "cached" (KV-cache decoding, the stateless bandits:
1.14-1.40x the point-steps per second of one rollout per point at P = 4-16, B = 100) or "all".
A darkroom step re-runs the trunk over every row's whole context, and P * B rows of it run
at 0.77-0.78x there (the attention's scores outgrow the caches;
``benchmarks/bench_stacked_eval.py``); on a GPU every learned agent stacks."""


def stack_key(agent: Agent) -> tuple[bool, ...] | None:
    """Which agents may act as one batch (:class:`~spice_ray.agents.stacked.StackedAgents`):
    learned SPICE agents whose runners compute the same outputs (the heads at every position
    or at the last give the last position's values in different roundings), where stacking
    pays (:data:`STACK_ON_CPU`); None: alone."""
    if not stackable(agent):
        return None
    r = agent.runner
    if r.device.type == "cpu" and not r.use_cache and STACK_ON_CPU != "all":
        return None
    return (r.use_cache, r.keep_latents, r.keep_prior_means)


def run_all_online(agents: Sequence[Agent], env, tasks, data: Mapping[str, np.ndarray],
                   level: float | None, horizon: int, noise: np.ndarray, episodes: int,
                   eval_seed: int, task_ids: np.ndarray) -> list[Rollout]:
    """Each agent's :func:`run_online` in ``tasks`` (made from ``data``, at noise ``level``
    where the environment has one), in order. Learned SPICE agents that share a
    :func:`stack_key` act as one batch of P * B rows: the tasks and their noise repeated P
    times, the trunk run once per step for all; each agent's rollout is the one it acts alone
    (its own draws)."""
    groups: dict[tuple[bool, ...], list[int]] = {}
    for i, agent in enumerate(agents):
        key = stack_key(agent)
        if key is not None:
            groups.setdefault(key, []).append(i)
    stacks = [g for g in groups.values() if len(g) > 1]
    runs: dict[int, Rollout] = {}
    for group in stacks:
        P, B = len(group), len(task_ids)
        tiled = {k: np.concatenate([np.asarray(v)] * P) for k, v in data.items()}
        stack = StackedAgents([agents[i] for i in group],
                              [agent_draws(eval_seed, task_ids) for _ in group])
        run = run_online(stack, env, _tasks(env, tiled, level), horizon,
                         np.concatenate([noise] * P), episodes)
        for p, i in enumerate(group):
            rows = slice(p * B, (p + 1) * B)
            runs[i] = Rollout(run.states[rows], run.actions[rows], run.rewards[rows])
    for i, agent in enumerate(agents):
        if i not in runs:
            runs[i] = run_online(agent, env, tasks, horizon, noise, episodes,
                                 agent_draws(eval_seed, task_ids))
    return [runs[i] for i in range(len(agents))]


def _tasks(env, data: Mapping[str, np.ndarray], level: float | None):
    """The environment's tasks of ``data`` (at noise ``level`` when it is not None)."""
    tasks = env.eval_tasks(data)
    return tasks if level is None else env.with_noise(tasks, level)


def cell_index(cells: np.ndarray, size: int) -> np.ndarray:
    """Grid cells [..., 2] as one index each, x * size + y: a visit map's cell numbering."""
    return cells[..., 0] * size + cells[..., 1]


def visit_counts(env, states: np.ndarray) -> np.ndarray | None:
    """How often each grid cell was visited, [B, size * size] (cell index x * size + y), for
    environments whose states have grid positions; None otherwise."""
    cells = env.positions(states)
    size = getattr(env.params, "grid_size", None)
    if cells is None or size is None:
        return None
    index = cell_index(cells, size)  # (B, N)
    counts = np.zeros((len(index), size * size))
    np.add.at(counts, (np.arange(len(index))[:, None], index), 1.0)
    return counts


def applicable_specs(specs: Sequence[AgentSpec], env, eval_cfg: EvalConfig, online: bool
                ) -> list[AgentSpec]:
    """Specs that have this protocol here, one per (method, rule, config) result key."""
    seen: set[tuple[str, str, str]] = set()
    out = []
    for spec in specs:
        if not spec.applies_to(env, online):
            log.debug("%s has no %s protocol in %s; skipped", spec.method,
                      "online" if online else "offline", env.name)
            continue
        key = (spec.method, spec.rule(online), spec.config_json(eval_cfg, online))
        if key not in seen:
            seen.add(key)
            out.append(spec)
    return out


def online_rows(
    env_cfg: EnvConfig,
    eval_cfg: EvalConfig,
    data: Mapping[str, np.ndarray],
    specs: Sequence[AgentSpec],
    model: TrunkModel | None = None,
    seed: int = 0,
    curves: bool = True,
    final_sigmas: Sequence[float] = (),
    final_only: bool = False,
) -> pd.DataFrame:
    """Online rows of every applicable spec (see the module docstring for the metrics).

    Args:
        env_cfg: the environment config.
        eval_cfg: online_horizon, episodes, seed (of the noise streams), baseline constants.
        data: eval-split columns (task_id and whatever the environment's tasks need).
        specs: agents; those without an online protocol here are skipped.
        model: the checkpoint the learned specs use.
        seed: the checkpoint's training seed (the rows' ``seed``).
        curves: write the per-step curves at the environment's own noise level.
        final_sigmas: robustness noise levels (environments with that protocol): the final
            regret at each; a level equal to the environment's own is run once.
        final_only: instead of the curves, the cumulative regret at the last step alone (the
            same rollouts and values: what the tuning stage scores, without building and
            shipping a row per step).
    """
    env = env_cfg.environment()
    task_ids = np.asarray(data["task_id"])
    H, E = eval_cfg.online_horizon, eval_cfg.episodes
    noise = online_noise(eval_cfg.seed, task_ids, E * H)  # (B, E*H)
    steps = np.arange(1, E * H + 1)
    has_noise = "robustness" in env.protocols
    own = float(env.params.sigma) if has_noise else None
    curves = curves and not final_only
    levels = ([own] if curves or final_only else []) + [float(s) for s in final_sigmas]
    frames = []
    applicable = applicable_specs(specs, env, eval_cfg, online=True)
    for level in dict.fromkeys(levels):
        at = level if has_noise else None
        tasks = _tasks(env, data, at)
        agents = [make_agent(spec, env, tasks, model, eval_cfg, sigma=level or 0.0)
                  for spec in applicable]
        runs = run_all_online(agents, env, tasks, data, at, H, noise, E, eval_cfg.seed,
                              task_ids)
        for spec, run in zip(applicable, runs, strict=True):
            extra = {"sigma": level} if has_noise else {"episodes": E}
            config = spec.config_json(eval_cfg, **extra)

            def add(metric: str, values: np.ndarray, x: np.ndarray = steps,
                    spec: AgentSpec = spec, config: str = config) -> None:
                frames.append(tidy_rows(env.name, spec.label, spec.rule(), config, seed,
                                        task_ids, metric, x, values))

            for reading in env.regret_readings:
                main = reading == env.reading()
                if not (main or (curves and level == own)):
                    continue  # another reading, read only by the curves
                regret = np.cumsum(env.regret(tasks, run.states, run.actions, run.rewards, H,
                                              reading), axis=1)
                if curves and level == own:
                    add(CUMULATIVE_REGRET if main else f"{CUMULATIVE_REGRET}_{reading}", regret)
                if final_only and main and level == own:
                    add(CUMULATIVE_REGRET, regret[:, -1:], steps[-1:])
                if main and level in final_sigmas:
                    add(FINAL_REGRET, regret[:, -1:], steps[-1:])
            if curves and level == own and not env.stateless:
                add(CUMULATIVE_RETURN, np.cumsum(run.rewards, axis=1))
                visits = visit_counts(env, run.states)
                if visits is not None:
                    add("visits", visits, np.arange(visits.shape[1]))
                    for mark, cells in (env.landmarks(tasks) or {}).items():  # the map's marks
                        index = cell_index(cells, env.params.grid_size)  # (B,)
                        add(f"{mark}_cell", index[:, None].astype(float), np.zeros(1, np.int64))
    return concat_rows(frames)
