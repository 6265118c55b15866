"""The tuning stage on Ray Tune, the sweeps' search engine.

:func:`tune_all` prepares every experiment's grid (``tuning.prepare``: the learned widths
fitted on validation contexts, the grids built from them) and runs the points of all of them
as one Tune grid search (:func:`score_grid`), each trial a run of consecutive points of one
experiment (:func:`points_per_trial`: one or two at the ``small`` preset's sizes, up to 64
where points are cheap). A trial scores each of its points on every validation task under
every training seed's model (``tuning.score_points``: the mean, SEM and n of the final
cumulative regret, seeds averaged per task first; a trial's points that read the same
checkpoints roll out as one batch) and returns them. As soon as an
experiment's last point is in, its choices are made (``tuning.finish``) and
``results/tuning.json`` is rewritten, so an interrupted stage keeps what it chose; an
experiment whose inputs are unchanged is not run again. A point's score is the same whichever
process runs it (it reads no other point's rows), so the choices do not depend on how trials
were scheduled, and ``tuning.json`` is written in the experiments' order.

Each trial reserves an evaluation actor's resources (``eval.actor_cpus`` and
``eval.actor_gpus``, fractional so Ray Data's tasks keep a share), ``eval.num_actors`` run at
once, torch runs on one thread, and Tune reuses the trial processes, which read the stage's
job once and keep the checkpoints they loaded
(:class:`~spice_ray.evaluate.actors.ModelCache`). One Tune run serves the whole stage:
starting it and the trial processes costs ~8 s on the 2-core machine, each trial 75-100 ms
of Tune's controller.

Tune's experiment directory is scratch (a temporary directory in the run directory, deleted
after; Tune's per-trial loggers off): what the stage keeps is ``results/tuning.json``. A trial
whose process died is run again (:data:`MAX_FAILURES` times); a point still without a score is
an error that names it and the trial's error.
"""

from __future__ import annotations

import json
import logging
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from spice_ray.common.artifacts import write_checked_text
from spice_ray.common.console import SILENT, Console, count
from spice_ray.common.placement import actor_bundle
from spice_ray.config import EvalConfig, ExperimentConfig
from spice_ray.data import store
from spice_ray.evaluate.actors import ModelCache
from spice_ray.results.choices import paper_choice, resolution
from spice_ray.runtime import tune_engine as engine
from spice_ray.study.experiments import EXPERIMENTS
from spice_ray.study.records import Finals
from spice_ray.study.tuned import tuned_table_current
from spice_ray.study.tuning import (
    SCORE_FIELDS,
    TUNING_FILE,
    Pending,
    agent_specs,
    bases,
    evaluation_runs,
    finish,
    grid_point,
    prepare,
    read_tuning,
    score_point,
    score_points,
)

log = logging.getLogger(__name__)

MAX_FAILURES = 2
"""Times a trial is re-run after its process died."""

TRIAL_STEPS = 60_000
"""Rollout steps (tasks x horizon x episodes x seeds) one trial is given where its points are
cheap: a Tune trial costs its controller 75-100 ms here (2-core machine, Ray 2.60, trial
processes reused), more than a point's own work on the smoke preset's 16 tasks, so a trial
scores up to :data:`MAX_POINTS_PER_TRIAL` points there; at the ``small`` preset's sizes (a
darkroom SPICE point: 30,000 steps, ~9 s) it scores one or two, which keeps the load balanced
over the trials that run at once."""
MAX_POINTS_PER_TRIAL = 64

_MODELS: dict[bool, ModelCache] = {}
"""This process's checkpoints (a trial process serves many trials), per device choice."""
_JOBS: dict[str, dict[str, Any]] = {}
"""This process's copy of the stage's job (its points and tasks), read once, not per trial."""


def grid_trial(config: dict[str, Any], job: list[Any]) -> dict[str, Any]:
    """One Tune trial: the scores of the points of chunk ``config["chunk"]`` of the job
    (``job[0]``, the reference :func:`score_grid` put in the object store), in order."""
    import ray

    torch.set_num_threads(1)  # fractional CPUs: one thread per trial, as an evaluation actor
    key = job[0].hex()
    if key not in _JOBS:
        _JOBS.clear()  # another stage's job
        _JOBS[key] = ray.get(job[0])
    work = _JOBS[key]
    use_gpu = work["eval_cfg"].actor_gpus > 0
    models = _MODELS.setdefault(use_gpu, ModelCache(use_gpu))
    chunk = int(config["chunk"])
    points = [work["points"][point] for point in work["chunks"][chunk]]
    env, data = work["experiments"][points[0][0]]  # a chunk is points of one experiment
    scores = score_points([(cand, sources, seeds) for _, cand, sources, seeds in points],
                          env, data, models)
    return {"chunk": chunk, "scores": scores}


def points_per_trial(steps: int, gpu: bool = False) -> int:
    """How many points one trial scores when each point rolls out ``steps`` steps (tasks x
    horizon x episodes x seeds; see :data:`TRIAL_STEPS`). On a GPU (``eval.actor_gpus``) a
    trial takes :data:`MAX_POINTS_PER_TRIAL`: its points that read one checkpoint step as one
    batch (``tuning.score_points``), and the batch is what fills the device."""
    if gpu:
        return MAX_POINTS_PER_TRIAL
    return max(1, min(MAX_POINTS_PER_TRIAL, TRIAL_STEPS // max(1, steps)))


def rollout_steps(tasks: int, eval_cfg: EvalConfig, seeds: int) -> int:
    """Online steps one grid point rolls out: tasks x horizon x episodes x seeds."""
    return tasks * eval_cfg.online_horizon * eval_cfg.episodes * seeds


def point_steps(pending: Pending) -> int:
    """The rollout steps of ``pending``'s costliest point (its most seeds)."""
    return max(rollout_steps(len(pending.data["task_id"]), c.eval_cfg, len(seeds))
               for c, _, seeds in pending.points())


def chunks_of(experiment: Sequence[int], sizes: Sequence[int]) -> list[list[int]]:
    """The points (``experiment``: each point's experiment) in runs of consecutive points of
    one experiment, at most ``sizes[e]`` points of experiment e a run."""
    out: list[list[int]] = []
    for i, exp in enumerate(experiment):
        if out and len(out[-1]) < sizes[exp] and experiment[out[-1][0]] == exp:
            out[-1].append(i)
        else:
            out.append([i])
    return out


def _trial_progress(on_chunk: Callable[[int, list[dict[str, Any]]], None]) -> Any:
    """A Tune callback (built here: it needs Ray Tune) that hands each finished trial's
    scores to ``on_chunk`` in the driver."""
    from ray.tune import Callback

    class TrialDone(Callback):
        def __getstate__(self) -> dict[str, Any]:  # Tune pickles callbacks; never restored
            return {}

        def on_trial_complete(self, iteration: int, trials: list, trial: Any,
                              **info: Any) -> None:
            result = trial.last_result or {}
            if "chunk" in result:
                on_chunk(int(result["chunk"]), list(result["scores"]))

    return TrialDone()


def score_grid(pending: Sequence[Pending], eval_cfg: EvalConfig,
               on_done: Callable[[int, pd.DataFrame], None], console: Console = SILENT,
               scratch: Path | None = None) -> None:
    """Score every point of every experiment in ``pending`` on Ray Tune (needs a running Ray),
    :func:`points_per_trial` consecutive points of one experiment a trial;
    ``on_done(i, scores)`` as soon as ``pending[i]``'s last point is in, with one row per
    point in grid order (method, config, mean, sem, n, per_task). Tune's experiment is
    written in a temporary directory under ``scratch`` (the run directory; None: the
    system's), deleted after, without Tune's per-trial CSV, JSON and TensorBoard loggers
    (nothing reads them).

    Raises:
        RuntimeError: a point has no score after :data:`MAX_FAILURES` re-runs, or scored a
            number of tasks other than its experiment's.
    """
    from ray import tune

    points = [(i, cand, sources, seeds) for i, p in enumerate(pending)
              for cand, sources, seeds in p.points()]
    for p in pending:
        keys = [c.key for c, _, _ in p.points()]
        if len(set(keys)) != len(keys):
            raise ValueError(f"tuning {p.name}: two grid points have the same method and config")
    chunks = chunks_of([exp for exp, *_ in points],
                       [points_per_trial(point_steps(p), eval_cfg.actor_gpus > 0)
                        for p in pending])
    job = {"points": points, "chunks": chunks, "eval_cfg": eval_cfg,
           "experiments": [(p.env, p.data) for p in pending]}
    left = [sum(1 for e, *_ in points if e == i) for i in range(len(pending))]
    scores: dict[int, dict[str, Any]] = {}
    bar = console.bar("tune", len(points), "grid point")

    def on_chunk(chunk: int, results: list[dict[str, Any]]) -> None:
        for index, result in zip(chunks[chunk], results, strict=True):
            exp, cand, _, _ = points[index]
            tasks = len(pending[exp].data["task_id"])
            if int(result["n"]) != tasks:
                raise RuntimeError(f"tuning {pending[exp].name}: {cand.key[0]} at "
                                   f"{dict(cand.setting)} scored {result['n']} of {tasks} tasks")
            scores[index] = {"method": cand.key[0], "config": cand.key[1],
                             **{k: result[k] for k in SCORE_FIELDS}}
            left[exp] -= 1
        exp = points[chunks[chunk][0]][0]
        bar.update(len(results), status=pending[exp].name)
        if left[exp] == 0:
            on_done(exp, pd.DataFrame([scores[j] for j, (e, *_) in enumerate(points)
                                       if e == exp]))

    import ray

    ref = ray.put(job)  # held here while the trials run; a trial process reads it once
    bundle = actor_bundle(eval_cfg.actor_cpus, eval_cfg.actor_gpus)  # an evaluation actor's
    trainable = tune.with_resources(tune.with_parameters(grid_trial, job=[ref]),
                                    tune.PlacementGroupFactory([bundle]))
    with tempfile.TemporaryDirectory(prefix=".tuning-", dir=scratch) as storage:
        tuner = engine.new_tuner(
            trainable, name="tuning", storage=storage, max_concurrent=eval_cfg.num_actors,
            max_failures=MAX_FAILURES, callbacks=[_trial_progress(on_chunk)],
            param_space={"chunk": tune.grid_search(list(range(len(chunks))))})
        grid = engine.fit(tuner, f"{__name__}.tune", trial_logs=False)
    bar.close(f"{count(len(scores), 'grid point')} of {count(len(pending), 'experiment')} "
              f"in {count(len(chunks), 'Tune trial')}, {eval_cfg.num_actors} at a time")
    missing = [i for i in range(len(points)) if i not in scores]
    if missing:
        errors = [str(r.error).strip().splitlines()[-1] for r in grid if r.error is not None]
        exp, cand, _, _ = points[missing[0]]
        raise RuntimeError(
            f"tuning {pending[exp].name}: {len(missing)} of {len(points)} grid points have no "
            f"score, the first {cand.key[0]} at {dict(cand.setting)}"
            + (f" ({errors[0]})" if errors else ""))


def rescore_problem(name: str, cfg: ExperimentConfig, dataset: Path, finals: Finals,
                    record: dict[str, Any], models: ModelCache) -> str | None:
    """Why a stored record of experiment ``name`` must not be used, or None: each method's
    chosen point, its runner-up and its paper-width choice are scored again on the validation
    tasks (:func:`score_point`, in this process) and must give the recorded means. A point's
    score does not depend on where it runs, so only a record that is not what the stage
    wrote (a forged one whose sidecar was recomputed) or whose inputs changed unseen differs.
    """
    exp = EXPERIMENTS[name]
    data = store.load_split(dataset, "validation", limit=cfg.eval.num_tasks)
    specs = agent_specs(exp, cfg, dataset)
    for ev_name in exp.tuned:
        sources, seeds = evaluation_runs(name, ev_name, cfg, finals)
        for base in bases(specs[ev_name], cfg):
            method = record["methods"].get(base.label)
            if method is None:
                return f"has no choice of {base.label}"
            made = resolution(method["grid"])
            for setting in (made["chosen"], made["runner_up"], paper_choice(method)):
                point = None if setting is None else grid_point(base, cfg.eval, record, setting)
                if point is None:
                    if setting is not None:
                        return f"holds {base.label} at {setting}, which is not on its grid"
                    continue
                recorded = next(g["mean"] for g in method["grid"] if g["setting"] == setting)
                score = score_point(point, sources, seeds, cfg.env, data, models)["mean"]
                if not np.isclose(score, recorded, rtol=1e-9, atol=1e-9):
                    return (f"records {base.label} at {setting} as {recorded:.6g} on "
                            f"validation; scored again it is {score:.6g}")
    return None


def _rescored(name: str, cfg: ExperimentConfig, dataset: Path, finals: Finals,
              record: dict[str, Any]) -> str | None:
    """:func:`rescore_problem` as a trial would score: one torch thread, the trials' device."""
    use_gpu = cfg.eval.actor_gpus > 0 and torch.cuda.is_available()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return rescore_problem(name, cfg, dataset, finals, record,
                               _MODELS.setdefault(use_gpu, ModelCache(use_gpu)))
    finally:
        torch.set_num_threads(threads)


def tune_all(configs: dict[str, ExperimentConfig], run_dir: Path, datasets: dict[str, Path],
             finals: Finals, console: Console = SILENT,
             models: dict[str, Any] | None = None) -> dict[str, Any]:
    """The tuning stage: every experiment with tuned evaluations chosen on its validation
    tasks, ``results/tuning.json`` rewritten as each experiment's choices are made (an
    interrupted stage keeps them; choices whose inputs are unchanged are not re-run);
    ``models``: each experiment's loss-weight choice (``spice_ray.study.loss_weights``),
    recorded as its ``models.spice``. Returns {experiment: its record}."""
    old = read_tuning(run_dir)
    order = [name for name in configs if EXPERIMENTS[name].tuned]
    done: dict[str, Any] = {}
    pending: list[Pending] = []
    started = time.perf_counter()

    def record_done(name: str, record: dict[str, Any], skipped: bool) -> None:
        if (models or {}).get(name) and record.get("models") != {"spice": models[name]}:
            record = {**record, "models": {"spice": models[name]}}
        done[name] = record
        if not skipped:  # a re-run with nothing new leaves the file as it was
            ordered = {n: done[n] for n in order if n in done}  # the same file however
            write_checked_text(run_dir / TUNING_FILE,  # trials were scheduled
                               json.dumps({**old, **ordered}, indent=1))
        points = sum(len(m["grid"]) for m in record["methods"].values())
        console.line(f"  {name}: {count(len(record['methods']), 'method')}, "
                     f"{count(points, 'grid point')} on {record['tasks']} validation tasks"
                     + (", current, skipped" if skipped else
                        f" ({time.perf_counter() - started:.0f} s into the stage)"))

    for name in order:
        got = prepare(name, configs[name], datasets[name], finals, old.get(name))
        if not isinstance(got, Pending) and not tuned_table_current(
                name, configs[name], run_dir, datasets[name], got):
            # a stored record about to make a table: its choices scored again first
            problem = _rescored(name, configs[name], datasets[name], finals, got)
            if problem is not None:
                log.warning("%s: %s %s: tuned again", run_dir / TUNING_FILE, name, problem)
                console.line(f"  {name}: {TUNING_FILE} {problem}: tuned again")
                got = prepare(name, configs[name], datasets[name], finals, None)
        if isinstance(got, Pending):
            pending.append(got)
        else:
            record_done(name, got, skipped=True)
    if pending:
        evals = {configs[p.name].eval for p in pending}
        resources = {(e.actor_cpus, e.actor_gpus, e.num_actors) for e in evals}
        if len(resources) > 1:
            raise ValueError("eval.actor_cpus, eval.actor_gpus and eval.num_actors must be the "
                             f"same in every tuned experiment of a run, not {sorted(resources)}")
        score_grid(pending, configs[pending[0].name].eval,
                   lambda i, scores: record_done(pending[i].name,
                                                 finish(pending[i], scores), False), console,
                   scratch=run_dir)
    return {n: done[n] for n in order}


def tune_experiment(name: str, cfg: ExperimentConfig, dataset: Path, finals: Finals,
                    previous: dict[str, Any] | None = None) -> dict[str, Any]:
    """One experiment's record of ``tuning.json`` (``tune_all`` for one experiment, nothing
    written): ``previous`` when its inputs are unchanged and it is sound."""
    got = prepare(name, cfg, dataset, finals, previous)
    if not isinstance(got, Pending):
        return got
    out: list[dict[str, Any]] = []
    score_grid([got], cfg.eval, lambda i, scores: out.append(finish(got, scores)),
               scratch=Path(cfg.out_dir) if Path(cfg.out_dir).is_dir() else None)
    return out[0]
