"""Online rollout speed measured on this machine, for the dry run's tuning and evaluation times.

:func:`rollout_seconds` times short online rollouts of one agent (a freshly initialised model
of the configured size where the agent reads one: an untrained model costs what a trained one
does) on as many generated tasks as one evaluation actor gets, with one torch thread as an
actor has, and extrapolates to the full horizon: a step's cost grows with the context it reads
(a model without a KV cache re-runs its trunk over the whole context each step), so the time of
h steps is fitted as ``a h + b h^2`` from two probe lengths. The model's value heads run eager
(a dry run compiles nothing and writes nothing). A probe is one rollout to the longer length,
the clock read as the shorter length's step begins; the first probe of a model shape on a
task count is preceded by one untimed run (allocation, first-call costs). Nothing is written.

Against whole rollouts timed the same way (2-core machine, paper-size models, eager heads) the
estimate came to 0.64x (bandit, 100 tasks, H = 500) and 0.83x (darkroom, 50 tasks, H = 100)
of the measured time: 24 steps extrapolated to the horizon err short. (The same check of the
two-run probes this replaced: 0.58x and 0.89x.)
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any

import numpy as np
import torch

from spice_ray.agents import AgentSpec, make_agent
from spice_ray.config import ExperimentConfig
from spice_ray.data.tasks import generate_tasks
from spice_ray.evaluate.online import agent_draws, online_noise, run_online
from spice_ray.model.registry import build_model, torch_threads

PROBE_STEPS = (8, 24)
"""The two probe lengths (fewer where the horizon is shorter)."""

_MEASURED: dict[str, tuple[float, float]] = {}
"""(a, b) of rollouts already probed in this process, by what their cost depends on."""

_WARMED: set[str] = set()
"""Model shapes (with the environment and task count) already run once in this process."""


def actor_tasks(cfg: ExperimentConfig, num_tasks: int) -> int:
    """Tasks one evaluation actor runs of ``num_tasks`` (the shards are equal)."""
    return max(1, math.ceil(num_tasks / max(1, cfg.eval.num_actors)))


def rollout_seconds(cfg: ExperimentConfig, spec: AgentSpec, kind: str | None,
                    num_tasks: int) -> float:
    """Seconds of one online rollout of ``spec`` (over the full horizon and every episode) on
    ``num_tasks`` tasks in one process with one thread; ``kind``: the model kind it reads
    (None: model-free). Probed once per agent kind, model size, environment and task count in
    a process; 0 where ``spec`` does not act online in this environment."""
    env = cfg.environment()
    if not spec.applies_to(env, True):
        return 0.0
    key = repr((spec.method, spec.rule(), spec.fusion.kernel, spec.fusion.target, kind,
                cfg.model if kind else None, cfg.env, num_tasks))
    if key not in _MEASURED:
        _MEASURED[key] = _probe(cfg, spec, kind, num_tasks)
    a, b = _MEASURED[key]
    steps = cfg.eval.online_horizon * cfg.eval.episodes
    return a * steps + b * steps * steps


def _probe(cfg: ExperimentConfig, spec: AgentSpec, kind: str | None, num_tasks: int
           ) -> tuple[float, float]:
    env = cfg.environment()
    data = generate_tasks(cfg.env, cfg.data, "validation", np.arange(num_tasks))
    tasks = env.eval_tasks(data)
    horizon = cfg.eval.online_horizon * cfg.eval.episodes
    lengths = sorted({max(1, min(h, horizon)) for h in PROBE_STEPS})
    shape = repr((kind, cfg.model if kind else None, cfg.env, num_tasks))
    with torch_threads(1):  # as in an evaluation actor
        model = None
        if kind is not None:
            eager = cfg.replace(model=dataclasses.replace(cfg.model, head_kernel="eager"))
            model = build_model(kind, eager, torch.Generator().manual_seed(0)).eval()
        noise = online_noise(cfg.eval.seed, data["task_id"], lengths[-1])
        draws = agent_draws(cfg.eval.seed, data["task_id"])
        if shape not in _WARMED:  # the shape's first run, untimed
            run_online(make_agent(spec, env, tasks, model, cfg.eval), env, tasks, lengths[0],
                       noise, 1, draws)
            _WARMED.add(shape)
        # one run to the longer length, the clock read as it starts each probed length's
        # step: the time of h steps is the time until step h begins (reset included)
        agent = _Stopwatch(make_agent(spec, env, tasks, model, cfg.eval), lengths[:-1])
        agent.start = time.perf_counter()
        run_online(agent, env, tasks, lengths[-1], noise, 1, draws)
        seconds = [*agent.laps, time.perf_counter() - agent.start]
    return fit_steps(lengths, seconds)


class _Stopwatch:
    """An agent that reads the clock as step ``t`` of ``marks`` begins (elapsed since
    ``start`` into ``laps``) and otherwise is the agent it wraps."""

    def __init__(self, agent: Any, marks: list[int]) -> None:
        self._agent, self._marks = agent, set(marks)
        self.start, self.laps = 0.0, []

    def act(self, t: int, states: torch.Tensor) -> torch.Tensor:
        if t in self._marks:
            self.laps.append(time.perf_counter() - self.start)
        return self._agent.act(t, states)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._agent, name)


def fit_steps(lengths: list[int], seconds: list[float]) -> tuple[float, float]:
    """(a, b) of ``t = a h + b h^2`` through the probes' (h, t): exact through two, the one
    probe's mean step cost alone; b >= 0 (a step never gets cheaper as the context grows) and
    a >= 0."""
    if len(lengths) == 1:
        return seconds[0] / lengths[0], 0.0
    (h1, h2), (t1, t2) = lengths, seconds
    b = max(0.0, (t2 / h2 - t1 / h1) / (h2 - h1))
    a = max(0.0, t2 / h2 - b * h2)
    return a, b
