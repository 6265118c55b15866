"""Evaluation over tasks: one shard in-process (:func:`evaluate_tasks`), or fanned out over Ray
actors (:func:`evaluate_parallel`) with shard retries when an actor dies.

Each :class:`EvalActor` evaluates whole shards of tasks for a list of :class:`AgentSpec` and a
checkpoint (a directory, kept loaded across calls, or an in-memory payload from
``spice_ray.model.registry.model_payload``). An :class:`EvalPool` keeps the actors for a whole
stage, so its evaluations pay the actors' start once. The driver splits the N tasks into one
shard per actor; if an actor dies (``ray.exceptions.RayActorError``) its shard is rerun on a
fresh actor, and the gathered table is checked: every key once, every task in every (method,
rule, config, metric) group, the same x values for every task.

Actors reserve ``EvalConfig.actor_cpus`` (fractional: on a small machine Ray Data's own tasks
need the rest) and ``EvalConfig.actor_gpus`` and run torch on one thread. Ray is imported
lazily, so the in-process path works without it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from spice_ray.agents import AgentSpec
from spice_ray.common.placement import actor_bundle
from spice_ray.config import EnvConfig, EvalConfig, FusionConfig
from spice_ray.envs.base import PROTOCOLS
from spice_ray.evaluate.calibration import PRIOR_FIT_LENGTHS, calibration_rows
from spice_ray.evaluate.episode import episode_rows
from spice_ray.evaluate.offline import offline_context_lengths, offline_rows
from spice_ray.evaluate.online import online_rows
from spice_ray.evaluate.rows import check_rows, concat_rows, merge_task_shards
from spice_ray.model.registry import ModelSource, load_model
from spice_ray.model.trunk import TrunkModel

log = logging.getLogger(__name__)

# ---- one shard ---------------------------------------------------------------------------


def evaluate_tasks(
    env: EnvConfig,
    eval_cfg: EvalConfig,
    data: Mapping[str, np.ndarray],
    specs: Sequence[AgentSpec],
    model: TrunkModel | None = None,
    protocols: Sequence[str] = ("online",),
    seed: int = 0,
    calibration_fusion: FusionConfig | None = None,
) -> pd.DataFrame:
    """Run the requested protocols on B tasks in this process; tidy rows.

    Args:
        env: environment config.
        eval_cfg: evaluation protocol settings.
        data: eval-split columns of the B tasks (task_id and the environment's columns).
        specs: agents to evaluate (those without a rule for a protocol are skipped there).
        model: the checkpoint the learned specs use.
        protocols: a subset of the environment's protocols (``PROTOCOLS``). "online":
            cumulative-regret curves at the environment's noise level; "robustness": final
            regret at each ``eval_cfg.robustness_sigmas``; "offline": suboptimality vs h;
            "calibration": the SPICE prior's coverage and pseudo-counts; "episode": one
            episode from the corner on a fixed context (``spice_ray.evaluate.episode``);
            "final": the online protocol's final cumulative regret alone (what tuning scores).
        seed: the checkpoint's training seed, written to every row.
        calibration_fusion: noise_var / v_min of the calibration rows (default: the first
            fused spec's fusion config, else FusionConfig()).

    Raises:
        ValueError: a protocol is unknown or the environment does not have it.
    """
    unknown = set(protocols) - {*PROTOCOLS, "final"}
    if unknown:
        raise ValueError(f"protocols {sorted(unknown)} are invalid: from {', '.join(PROTOCOLS)}"
                         ", final")
    environment = env.environment()
    missing = {"online" if p == "final" else p for p in protocols} - set(environment.protocols)
    if missing:
        raise ValueError(f"env.name={env.name} has no {sorted(missing)} protocol; it has "
                         f"{list(environment.protocols)}")
    frames = []
    if "offline" in protocols:
        frames.append(offline_rows(env, eval_cfg, data, specs, model, seed))
    if "online" in protocols or "robustness" in protocols:
        finals = eval_cfg.robustness_sigmas if "robustness" in protocols else ()
        frames.append(online_rows(env, eval_cfg, data, specs, model, seed,
                                  curves="online" in protocols, final_sigmas=finals))
    if "final" in protocols:
        frames.append(online_rows(env, eval_cfg, data, specs, model, seed, final_only=True))
    if "episode" in protocols:
        frames.append(episode_rows(env, eval_cfg, data, specs, model, seed))
    if "calibration" in protocols:
        if model is None:
            raise ValueError("the calibration protocol needs a SpiceModel")
        fusion = calibration_fusion or next((s.fusion for s in specs if s.info.fused),
                                            FusionConfig())
        T = np.asarray(data["actions"]).shape[1]
        hs = offline_context_lengths(T, eval_cfg.offline_points)
        if hasattr(environment, "posterior_moments"):  # the prior against the exact one
            hs = np.union1d(hs, [h for h in PRIOR_FIT_LENGTHS if h <= T])
        frames.append(calibration_rows(model, env, data, fusion, hs, seed=seed))
    return concat_rows(frames)


# ---- Ray actors --------------------------------------------------------------------------


class ModelCache:
    """The models a long-lived evaluation process loaded: checkpoints from a directory are kept
    (the last :attr:`SIZE` of them), so the seeds and methods of one checkpoint load and verify
    its weights once; an in-memory payload is rebuilt each time (cheap).

    Args:
        use_gpu: put models on CUDA when one is present (``EvalConfig.actor_gpus`` > 0).
    """

    SIZE = 4

    def __init__(self, use_gpu: bool = False) -> None:
        self.device = torch.device("cuda" if use_gpu and torch.cuda.is_available() else "cpu")
        self._models: dict[tuple[str, str], TrunkModel] = {}

    def get(self, source: ModelSource | None, env: EnvConfig) -> TrunkModel | None:
        """The model of ``source`` (None for None) in ``env``."""
        if source is None:
            return None
        if not isinstance(source, (str, Path)):
            return load_model(source, env).to(self.device)
        key = (str(source), repr(env))
        if key not in self._models:
            if len(self._models) >= self.SIZE:
                self._models.pop(next(iter(self._models)))  # the oldest
            self._models[key] = load_model(source, env).to(self.device)
        return self._models[key]


class EvalActor:
    """Evaluates shards of tasks for any checkpoint (wrap with ``ray.remote``).

    One actor serves many evaluations (:class:`EvalPool`): the stage pays the actor's start
    (a process, torch, the package) once, not once per evaluation, and keeps the checkpoints
    it loaded (:class:`ModelCache`).

    Args:
        use_gpu: put models on CUDA when one is present (``EvalConfig.actor_gpus`` > 0).
    """

    def __init__(self, use_gpu: bool = False) -> None:
        torch.set_num_threads(1)  # fractional CPUs: one thread per actor
        self._models = ModelCache(use_gpu)

    @staticmethod
    def _maybe_fail(fail_once_marker: str | None) -> None:
        """Fault injection for tests: the first actor to create this file (atomically) exits
        its process at the start of the shard; later calls see the file and run normally."""
        if fail_once_marker is None:
            return
        try:
            fd = os.open(fail_once_marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        os._exit(1)  # simulate a crashed worker: no exception, no cleanup

    def evaluate(self, model_source: ModelSource | None, env: EnvConfig, eval_cfg: EvalConfig,
                 data: Mapping[str, np.ndarray], specs: Sequence[AgentSpec],
                 protocols: Sequence[str], seed: int, fail_once_marker: str | None = None
                 ) -> pd.DataFrame:
        """:func:`evaluate_tasks` on one shard with the checkpoint ``model_source`` (a path,
        a ``model_payload`` dict, or None for baselines only); tidy rows."""
        self._maybe_fail(fail_once_marker)
        return evaluate_tasks(env, eval_cfg, data, specs, self._models.get(model_source, env),
                              protocols, seed)

    def evaluate_each(self, model_source: ModelSource | None, env: EnvConfig,
                      eval_cfg: EvalConfig, data: Mapping[str, np.ndarray],
                      specs: Sequence[AgentSpec], protocols: Sequence[str], seed: int,
                      fail_once_marker: str | None = None) -> list[pd.DataFrame]:
        """:meth:`evaluate` of each spec alone, in order: one frame per spec."""
        self._maybe_fail(fail_once_marker)
        model = self._models.get(model_source, env)
        return [evaluate_tasks(env, eval_cfg, data, [spec], model, protocols, seed)
                for spec in specs]

    def pid(self) -> int:
        """The actor's process id (for tests)."""
        return os.getpid()


class EvalPool:
    """Evaluation actors kept for a whole stage and reused by every :func:`evaluate_parallel`
    call given the pool (a context manager: the actors end with it).

    Actors are started when first needed and keyed by their resources (``actor_cpus``,
    ``actor_gpus``): an evaluation asking for other resources gets its own actors, and the
    idle ones of the other kind are ended first, so a pool never holds more than one
    evaluation's worth of CPUs. A dead actor is replaced.
    """

    def __init__(self) -> None:
        self._key: tuple[float, float] | None = None
        self._actors: list[Any] = []
        self.started = 0
        """Actors this pool has started (replacements included)."""

    def actors(self, eval_cfg: EvalConfig, m: int) -> list[Any]:
        """The first ``m`` actors for ``eval_cfg``'s resources, started as needed."""
        key = (float(eval_cfg.actor_cpus), float(eval_cfg.actor_gpus))
        if key != self._key:
            self.close()
            self._key = key
        while len(self._actors) < m:
            self._actors.append(_actor_class(eval_cfg).remote(eval_cfg.actor_gpus > 0))
            self.started += 1
        return self._actors[:m]

    def replace(self, eval_cfg: EvalConfig, actor: Any) -> Any:
        """A fresh actor in place of ``actor`` (which died, or is killed now)."""
        import ray

        ray.kill(actor, no_restart=True)
        fresh = _actor_class(eval_cfg).remote(eval_cfg.actor_gpus > 0)
        self.started += 1
        self._actors = [fresh if a is actor else a for a in self._actors]
        return fresh

    def close(self) -> None:
        """End every actor (dropping the handles: ``ray.kill`` on a live actor races its own
        exit, "KillActor RPC failed" in the GCS log)."""
        self._actors = []
        self._key = None

    def __enter__(self) -> EvalPool:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _actor_class(eval_cfg: EvalConfig) -> Any:
    import ray

    bundle = actor_bundle(eval_cfg.actor_cpus, eval_cfg.actor_gpus)
    options: dict[str, Any] = {"num_cpus": bundle.pop("CPU"), "max_restarts": 0,
                               "max_task_retries": 0}
    if "GPU" in bundle:
        options["num_gpus"] = bundle.pop("GPU")
    if bundle:  # the GPU nodes' label of cluster.yaml
        options["resources"] = bundle
    return ray.remote(EvalActor).options(**options)


def evaluate_parallel(
    model_source: ModelSource | None,
    env: EnvConfig,
    eval_cfg: EvalConfig,
    data: Mapping[str, np.ndarray],
    specs: Sequence[AgentSpec],
    protocols: Sequence[str] = ("offline", "online"),
    seed: int = 0,
    num_actors: int | None = None,
    max_retries: int = 2,
    fail_once_marker: str | None = None,
    on_tasks: Callable[[int], None] | None = None,
    pool: EvalPool | None = None,
    split: str = "tasks",
) -> pd.DataFrame:
    """Split the tasks (or the agents) over M actors, gather their rows, rerun shards whose
    actor died. Either way the rows come back in the order one actor doing everything would
    give (:func:`merge_task_shards`), so a table does not depend on M.

    Needs a running Ray (``ray.init``). Each actor reserves ``eval_cfg.actor_cpus`` CPUs and
    ``eval_cfg.actor_gpus`` GPUs.

    Args:
        model_source: checkpoint path or ``model_payload`` dict (put in the object store
            once), or None for baselines only.
        env: environment config.
        eval_cfg: evaluation settings (num_actors, actor_cpus, actor_gpus, ...).
        data: eval-split columns of all N tasks (each array [N, ...], with task_id).
        specs: agents.
        protocols: see :func:`evaluate_tasks`.
        seed: the checkpoint's training seed, written to every row.
        num_actors: M (default ``eval_cfg.num_actors``), at most N.
        max_retries: reruns allowed per shard after its actor died.
        fail_once_marker: fault injection, see :meth:`EvalActor._maybe_fail`.
        on_tasks: called with a shard's task count when its rows arrive (progress).
        pool: actors to reuse (kept alive after the call); default: actors for this call only.
        split: "tasks" (each actor a share of the tasks, every agent) or "specs" (each actor
            every task for every M-th agent: for many cheap agents on few tasks, a tuning
            grid, where an actor's per-step cost hardly depends on its tasks; the "online"
            and "final" protocols only, whose agents' rows do not depend on each other).

    Returns:
        The rows of all shards, checked by :func:`check_rows`.

    Raises:
        RuntimeError: a shard's actor died more than ``max_retries`` times, or rows were lost
            or duplicated.
    """
    import ray
    from ray.exceptions import RayActorError

    if pool is None:
        with EvalPool() as own:
            return evaluate_parallel(model_source, env, eval_cfg, data, specs, protocols, seed,
                                     num_actors, max_retries, fail_once_marker, on_tasks, own,
                                     split)
    if split not in ("tasks", "specs"):
        raise ValueError(f"split={split!r} is invalid: tasks or specs")
    if split == "specs" and not set(protocols) <= {"online", "final"}:
        raise ValueError(f"split='specs' takes the online and final protocols, not {protocols}")
    task_ids = np.asarray(data["task_id"])
    n = len(task_ids)
    by_spec = split == "specs"
    m = max(1, min(num_actors or eval_cfg.num_actors, len(specs) if by_spec else n))
    if by_spec:  # every M-th agent, all tasks: SPICE's grid points share the actors evenly
        shards = [np.arange(n)] * m
        agents = [list(range(j, len(specs), m)) for j in range(m)]
    else:
        shards = [idx for idx in np.array_split(np.arange(n), m) if len(idx)]
        agents = [list(range(len(specs)))] * len(shards)
    shard_data = [{k: np.asarray(v)[idx] for k, v in data.items()} for idx in shards]
    if isinstance(model_source, Mapping):
        source: Any = ray.put(dict(model_source))
    elif model_source is not None:
        source = str(Path(model_source).resolve())  # actors run in another working directory
    else:
        source = None
    actors = pool.actors(eval_cfg, len(shards))

    def submit(i: int, actor: Any) -> Any:
        method = actor.evaluate_each if by_spec else actor.evaluate
        return method.remote(source, env, eval_cfg, shard_data[i],
                             [specs[j] for j in agents[i]], list(protocols), seed,
                             fail_once_marker)

    pending: dict[Any, tuple[int, Any]] = {submit(i, a): (i, a) for i, a in enumerate(actors)}
    results: dict[int, Any] = {}
    retries = [0] * len(shards)
    while pending:
        done, _ = ray.wait(list(pending), num_returns=1)
        i, actor = pending.pop(done[0])
        try:
            results[i] = ray.get(done[0])
        except RayActorError as exc:
            retries[i] += 1
            if retries[i] > max_retries:
                pool.replace(eval_cfg, actor)
                raise RuntimeError(f"shard {i} ({len(shards[i])} tasks): its actor died "
                                   f"{retries[i]} times") from exc
            log.warning("actor of shard %d died (%s); rerunning it on a fresh actor "
                        "(retry %d of %d)", i, type(exc).__name__, retries[i], max_retries)
            actor = pool.replace(eval_cfg, actor)
            pending[submit(i, actor)] = (i, actor)
            continue
        if on_tasks is not None:
            on_tasks(len(shards[i]) if not by_spec else round(n * len(agents[i]) / len(specs)))
    if by_spec:  # one frame per agent: back in the agents' order
        frames = {j: f for i in range(len(shards)) for j, f in zip(agents[i], results[i],
                                                                    strict=True)}
        df = concat_rows(frames[j] for j in range(len(specs)))
    else:
        df = merge_task_shards(results[i] for i in range(len(shards)))
    check_rows(df, task_ids)
    return df
