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
An agent probed on n tasks gives the time on fewer tasks scaled by their number: a plan asks for
the same agent on validation and eval shards of different sizes, and probes it once, on the
larger. On the ``paper`` preset's plan (2-core machine, two probes of each) the learned
agents' probes on half as many tasks measured 0.8-1.2x their scaled times, but the bandit's
SPICE on 100 tasks 1.5x (costs per step that do not shrink with the tasks: scaled down, a
small shard's time errs short); the model-free agents' probes differ as much between two
probes on the same tasks (0.3-5x: their few milliseconds a step leave the fitted h^2 term to
timing noise), scaled or not.

Against whole rollouts timed the same way (2-core machine, paper-size models, eager heads) the
estimate came to 0.64x (bandit, 100 tasks, H = 500) and 0.83x (darkroom, 50 tasks, H = 100)
of the measured time: 24 steps extrapolated to the horizon err short. (The same check of the
two-run probes this replaced: 0.58x and 0.89x.)
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import multiprocessing
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import numpy as np
import torch

from spice_ray.agents import AgentSpec, make_agent
from spice_ray.config import ExperimentConfig
from spice_ray.data.tasks import generate_tasks
from spice_ray.evaluate.online import agent_draws, online_noise, run_online
from spice_ray.model.registry import build_model, torch_threads

log = logging.getLogger(__name__)

PROBE_STEPS = (8, 24)
"""The two probe lengths (fewer where the horizon is shorter)."""

_MEASURED: dict[str, tuple[int, float, float]] = {}
"""(tasks, a, b) of rollouts already probed in this process, by what their cost depends on
but the task count: a and b are for ``tasks`` tasks."""

_WARMED: set[str] = set()
"""Shapes (:func:`_shape`) already run once in this process."""


Probe = tuple[str, ExperimentConfig, AgentSpec, "str | None", int]
"""(key, cfg, spec, kind, num_tasks) of one rollout to probe (the key: what its cost depends
on but the task count)."""

_WANTED: list[Probe] | None = None
"""While :func:`collecting`: the probes :func:`rollout_seconds` was asked for."""


@contextlib.contextmanager
def collecting() -> Iterator[list[Probe]]:
    """Within: :func:`rollout_seconds` of anything not yet probed records it in the list
    yielded and returns 0.0 (a plan's first pass, so that :func:`probe_all` can time the
    probes side by side)."""
    global _WANTED
    _WANTED, previous = [], _WANTED
    try:
        yield _WANTED
    finally:
        _WANTED = previous


def probe_all(wanted: list[Probe], workers: int) -> None:
    """Probe every rollout of ``wanted`` not yet probed, in ``workers`` forks of this process
    side by side (as evaluation actors run), the probes of one model shape in one fork (it is
    warmed up once); one after another here where ``workers`` is 1, there is one shape, this
    process has joined Ray (a fork would copy its connection's state, not its threads), or the
    forks cannot run."""
    todo: dict[str, Probe] = {}  # each agent once, on the most tasks it is asked for
    for probe in wanted:
        key, tasks = probe[0], probe[4]
        if not _probed(key, tasks) and tasks > (todo[key][4] if key in todo else 0):
            todo[key] = probe
    groups: dict[str, list[Probe]] = {}
    for probe in todo.values():
        groups.setdefault(_shape(probe[1], probe[3], probe[4]), []).append(probe)
    ray = sys.modules.get("ray")
    if workers > 1 and len(groups) > 1 and not (ray is not None and ray.is_initialized()):
        try:
            context = multiprocessing.get_context("fork")
            with ProcessPoolExecutor(min(workers, len(groups)), mp_context=context) as pool:
                for measured in pool.map(_probe_group, groups.values()):
                    _MEASURED.update(measured)
            return
        except (OSError, BrokenProcessPool, ValueError) as exc:
            log.warning("rollout probes side by side failed (%s); probing one by one", exc)
    for group in groups.values():
        _MEASURED.update(_probe_group(group))


def _shape(cfg: ExperimentConfig, kind: str | None, num_tasks: int) -> str:
    """What a probe's untimed first run warms: the model (if any), environment and task count."""
    return repr((kind, cfg.model if kind else None, cfg.env, num_tasks))


def _probe_group(group: list[Probe]) -> dict[str, tuple[int, float, float]]:
    return {key: (n, *_probe(cfg, spec, kind, n)) for key, cfg, spec, kind, n in group}


def _probed(key: str, num_tasks: int) -> bool:
    """Whether the rollout ``key`` was probed on at least ``num_tasks`` tasks."""
    return key in _MEASURED and _MEASURED[key][0] >= num_tasks


def actor_tasks(cfg: ExperimentConfig, num_tasks: int) -> int:
    """Tasks one evaluation actor runs of ``num_tasks`` (the shards are equal)."""
    return max(1, math.ceil(num_tasks / max(1, cfg.eval.num_actors)))


def rollout_seconds(cfg: ExperimentConfig, spec: AgentSpec, kind: str | None,
                    num_tasks: int) -> float:
    """Seconds of one online rollout of ``spec`` (over the full horizon and every episode) on
    ``num_tasks`` tasks in one process with one thread; ``kind``: the model kind it reads
    (None: model-free). Probed once per agent kind, model size and environment in a process,
    on the most tasks asked for, and scaled to fewer; 0 where ``spec`` does not act online in
    this environment."""
    env = cfg.environment()
    if not spec.applies_to(env, True):
        return 0.0
    key = repr((spec.method, spec.rule(), spec.fusion.kernel, spec.fusion.target, kind,
                cfg.model if kind else None, cfg.env))
    if not _probed(key, num_tasks):
        if _WANTED is not None:  # a first pass over a plan: what it would probe
            _WANTED.append((key, cfg, spec, kind, num_tasks))
            return 0.0
        _MEASURED[key] = (num_tasks, *_probe(cfg, spec, kind, num_tasks))
    probed, a, b = _MEASURED[key]
    steps = cfg.eval.online_horizon * cfg.eval.episodes
    return (a * steps + b * steps * steps) * num_tasks / probed


def _probe(cfg: ExperimentConfig, spec: AgentSpec, kind: str | None, num_tasks: int
           ) -> tuple[float, float]:
    env = cfg.environment()
    data = generate_tasks(cfg.env, cfg.data, "validation", np.arange(num_tasks))
    tasks = env.eval_tasks(data)
    horizon = cfg.eval.online_horizon * cfg.eval.episodes
    lengths = sorted({max(1, min(h, horizon)) for h in PROBE_STEPS})
    shape = _shape(cfg, kind, num_tasks)
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
