"""One trial: evaluate one configuration with evaluation actors inside its placement group.

:func:`sweep_trainable` builds the trial's config from the base config and the trial's
parameters (:func:`~spice_ray.sweep.params.apply_params`), runs SPICE online on the eval tasks
of every training seed with ``evaluate_parallel`` (``sweep.actors_per_trial`` actors of
``sweep.actor_cpus`` CPUs each; kept by the trial process for the next trial that Tune gives
it: :func:`trial_pool`), reports the final regret (mean and SEM over tasks, seeds
averaged per task first) and the mean regret curve, and attaches its tidy per-task rows as a
Parquet file in the trial's checkpoint (``rows.parquet``, persisted by Tune).

Retraining sweeps (ensemble size, weight ablation) pass ``checkpoints=None``: each trial then
finds its seed's checkpoint from the trial's config. By default these checkpoints are trained
before the sweep, in the driver (:func:`pretrain_grid`); with ``train_in_trial=True`` a trial
trains a missing checkpoint itself, in-process, and its placement group's head bundle reserves
``train.worker_cpus`` for that.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from spice_ray.common.console import SILENT, Console
from spice_ray.common.metrics import CUMULATIVE_REGRET
from spice_ray.config import ExperimentConfig, from_dict
from spice_ray.results.summary import summarise
from spice_ray.sweep.params import (
    SweepError,
    SweepFault,
    _matches,
    apply_params,
    expand_grid,
    params_json,
    samplers,
)
from spice_ray.sweep.resources import trial_resources

log = logging.getLogger(__name__)

SWEEPS_DIR = "sweeps"
"""Sub-directory of the run directory holding Tune experiments and sweep tables."""
TRIAL_ROWS = "rows.parquet"
"""File name of a trial's tidy rows inside its Tune checkpoint."""
STAGING = ".staging"
"""Where in the run's sweeps folder a trial writes its rows before Tune takes them into its
checkpoint (a directory per report, removed once reported): inside the run, never the
system's temporary directory."""
REGRET_METRIC = CUMULATIVE_REGRET
"""Metric of the rows the summary and the trial metrics are computed from."""
OPTIMISE_METRIC = "regret_mean"
"""Trial metric Tune ranks by (lower is better)."""


def curve_steps(horizon: int, points: int | None) -> np.ndarray:
    """Steps kept on a regret curve: ``points`` evenly spaced in [1, horizon] (both included),
    or every step when ``points`` is None or >= horizon."""
    if points is None or points >= horizon:
        return np.arange(1, horizon + 1, dtype=np.int64)
    return np.unique(np.round(np.linspace(1, horizon, max(2, points)))).astype(np.int64)


def downsample(rows: pd.DataFrame, points: int | None) -> pd.DataFrame:
    """Keep the rows at :func:`curve_steps` of their largest x (per metric)."""
    if points is None or rows.empty:
        return rows
    keep = []
    for _, group in rows.groupby("metric", sort=False):
        steps = curve_steps(int(group["x"].max()), points)
        keep.append(group[group["x"].isin(steps)])
    return pd.concat(keep, ignore_index=True)


def resolve_checkpoint(cfg: ExperimentConfig, seed: int, dataset_dir: str | Path,
                       train_in_trial: bool = False) -> Path:
    """The SPICE checkpoint of ``cfg`` and ``seed`` (for retraining sweeps).

    Returns the current final checkpoint; trains it in this process (``train.num_workers=0``)
    when it is missing and ``train_in_trial``.

    Raises:
        SweepError: the checkpoint is missing and training in the trial is off.
    """
    from spice_ray.train.ray_train import plan_job, pretrain, settle_final

    job, run_dir = plan_job(cfg, "spice", seed, dataset_dir)
    final = run_dir / "final"
    if settle_final(final, job):
        return final
    if not train_in_trial:
        raise SweepError(f"no current SPICE checkpoint at {final} for this trial's model/train "
                         "settings; pretrain before the sweep (pretrain_grid) or run with "
                         "train_in_trial=True")
    local = cfg.replace(train=dataclasses.replace(cfg.train, num_workers=0, use_gpu=False))
    return pretrain(local, "spice", seed, dataset_dir)


def evaluate_chunks(
    cfg: ExperimentConfig,
    dataset_dir: str | Path,
    checkpoints: Mapping[int, str] | None = None,
    curve_points: int | None = None,
    train_in_trial: bool = False,
    chunks: int = 1,
    pool: Any = None,
) -> Iterator[pd.DataFrame]:
    """SPICE online on the ``cfg.sweep.split`` tasks (validation unless the config says eval)
    for every seed, with ``cfg.fusion``, in ``chunks`` parts
    of the tasks; yields the rows so far after each part (every seed of its tasks).

    Args:
        cfg: the trial's config; ``sweep.actors_per_trial`` actors of ``sweep.actor_cpus``
            CPUs each evaluate the tasks.
        dataset_dir: dataset with that split.
        checkpoints: {seed: checkpoint dir}; None: per ``cfg.seeds``, found (or trained) by
            :func:`resolve_checkpoint`.
        curve_points: steps kept per curve (:func:`curve_steps`); None keeps every step.
        train_in_trial: see :func:`resolve_checkpoint`.
        chunks: parts of the tasks (at most one task each); the running regret after each
            lets a scheduler stop a bad trial early.
        pool: the ``EvalPool`` whose actors evaluate (None: actors started for this call,
            once for every chunk and seed, and ended after it).

    Yields:
        Rows of the online protocol (``spice_ray.evaluate.online``) of the tasks so far.
    """
    from spice_ray.agents import AgentSpec
    from spice_ray.data.store import load_split
    from spice_ray.evaluate import EvalPool, concat_rows, evaluate_parallel

    eval_cfg = dataclasses.replace(cfg.eval, num_actors=cfg.sweep.actors_per_trial,
                                   actor_cpus=cfg.sweep.actor_cpus)
    data = load_split(dataset_dir, cfg.sweep.split, limit=eval_cfg.num_tasks)
    spec = AgentSpec("spice", fusion=cfg.fusion)
    seeds = sorted(int(s) for s in checkpoints) if checkpoints is not None else list(cfg.seeds)
    sources = {seed: (str(checkpoints[seed]) if checkpoints is not None
                      else str(resolve_checkpoint(cfg, seed, dataset_dir, train_in_trial)))
               for seed in seeds}
    n = len(data["task_id"])
    frames = []
    with contextlib.nullcontext(pool) if pool is not None else EvalPool() as pool:
        for part in np.array_split(np.arange(n), max(1, min(chunks, n))):
            chunk = {k: np.asarray(v)[part] for k, v in data.items()}
            for seed in seeds:
                rows = evaluate_parallel(sources[seed], cfg.env, eval_cfg, chunk, [spec],
                                         ("online",), seed=seed,
                                         num_actors=cfg.sweep.actors_per_trial, pool=pool)
                frames.append(downsample(rows, curve_points))
            yield concat_rows(frames)


_KEPT: dict[str, Any] = {}
"""This process's evaluation actors, by the placement group they run in (at most one)."""


def trial_pool(placement_group: str) -> Any:
    """The evaluation actors of the trials of ``placement_group`` (its id) in this process,
    kept after a trial: Tune reuses a finished trial's process and placement group for the
    next trial of the sweep (``reuse_actors``), which then finds its actors started and their
    models loaded instead of starting them again (four sequential trials of a sweep: 42 s with
    an actor start each, 17 s with one, on a 2-core machine). The actors end with the
    process, or when a trial of another placement group comes."""
    from spice_ray.evaluate import EvalPool

    if placement_group not in _KEPT:
        for other in _KEPT.values():
            other.close()
        _KEPT.clear()
        _KEPT[placement_group] = EvalPool()
    return _KEPT[placement_group]


def regret_stats(rows: pd.DataFrame) -> dict[str, Any]:
    """Final regret mean and SEM over tasks (seeds averaged per task first, by
    ``spice_ray.results.summarise``) and the mean curve.

    Returns:
        regret_mean, regret_sem, n_tasks, n_seeds, regret_curve (mean cumulative regret over
        tasks at each kept step) and curve_steps.
    """
    reg = rows[rows["metric"] == REGRET_METRIC]
    if reg.empty:
        raise SweepError(f"no {REGRET_METRIC} rows to summarise")
    curve = summarise(reg[["x", "task_id", "seed", "value"]], ["x"]).sort_values("x")
    final = curve.iloc[-1]
    return {"regret_mean": float(final["mean"]), "regret_sem": float(final["sem"]),
            "n_tasks": int(final["n"]), "n_seeds": int(reg["seed"].nunique()),
            "regret_curve": [float(v) for v in curve["mean"]],
            "curve_steps": [int(x) for x in curve["x"]]}


def sweep_trainable(
    config: dict[str, Any],
    base: dict[str, Any] | None = None,
    dataset_dir: str = "",
    checkpoints: dict[int, str] | None = None,
    curve_points: int | None = None,
    train_in_trial: bool = False,
    fail_if: dict[str, Any] | None = None,
) -> None:
    """Tune function trainable: evaluate one configuration and report it once.

    Wrapped by :func:`make_trainable` (``tune.with_parameters`` supplies everything but
    ``config``). After each of ``sweep.report_chunks()`` parts of the tasks it reports the
    :func:`regret_stats` of the tasks so far (``training_iteration`` counts parts, so an ASHA
    scheduler can stop the trial), the trial's wall time, its placement group id, and a
    checkpoint holding :data:`TRIAL_ROWS` of those tasks.

    Args:
        config: the trial's parameters (see :func:`apply_params`).
        base: the base ExperimentConfig as a dict (absolute ``out_dir``).
        dataset_dir: absolute dataset directory.
        checkpoints: {seed: absolute checkpoint dir}, or None for retraining sweeps.
        curve_points: steps kept per curve.
        train_in_trial: train missing checkpoints in this process.
        fail_if: fault injection: raise :class:`SweepFault` when the trial's flattened params
            match this selector.

    Raises:
        SweepError: the trial does not run in a placement group that captures its actors.
        SweepFault: selected by ``fail_if``.
    """
    import ray
    import torch
    from ray import tune

    from spice_ray.results.tables import write_frame

    t0 = time.perf_counter()
    ctx = ray.get_runtime_context()
    pg = ray.util.get_current_placement_group()
    if pg is None or not ctx.should_capture_child_tasks_in_placement_group:
        raise SweepError("the trial does not run in a placement group that captures child "
                         "actors; wrap the trainable with trial_resources() (make_trainable)")
    cfg = apply_params(from_dict(base or {}), config)
    torch.set_num_threads(max(1, math.floor(cfg.train.worker_cpus)) if train_in_trial else 1)
    if _matches(config, fail_if):
        raise SweepFault(f"fault injection: trial {params_json(config)} fails on purpose")
    chunks = cfg.sweep.report_chunks()
    staging = Path(cfg.out_dir) / SWEEPS_DIR / STAGING
    staging.mkdir(parents=True, exist_ok=True)
    pool = trial_pool(pg.id.hex())
    started = pool.started
    for k, rows in enumerate(evaluate_chunks(cfg, dataset_dir, checkpoints, curve_points,
                                             train_in_trial, chunks, pool), 1):
        metrics = regret_stats(rows)
        metrics |= {"chunk": k, "chunks": chunks, "seconds": time.perf_counter() - t0,
                    "finished_at": time.time(), "placement_group": pg.id.hex(),
                    "captures_actors": True, "actors_started": pool.started - started}
        with tempfile.TemporaryDirectory(prefix=f"{pg.id.hex()[:12]}-", dir=staging) as tmp:
            write_frame(Path(tmp) / TRIAL_ROWS, rows)
            tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(tmp))


def make_trainable(
    cfg: ExperimentConfig,
    dataset_dir: str | Path,
    checkpoints: Mapping[int, str | Path] | None,
    curve_points: int | None = None,
    train_in_trial: bool = False,
    fail_if: Mapping[str, Any] | None = None,
) -> Any:
    """:func:`sweep_trainable` with its constants bound and its placement group declared."""
    from ray import tune

    fn = tune.with_parameters(
        sweep_trainable, base=cfg.to_dict(), dataset_dir=str(dataset_dir),
        checkpoints=None if checkpoints is None else {int(k): str(v)
                                                      for k, v in checkpoints.items()},
        curve_points=curve_points, train_in_trial=train_in_trial,
        fail_if=dict(fail_if) if fail_if else None)
    return tune.with_resources(fn, trial_resources(cfg, train_in_trial))



def ensure_models(cfg: ExperimentConfig, kind: str = "spice", console: Console = SILENT
                  ) -> tuple[Path, dict[int, str]]:
    """Generate the dataset and pretrain ``kind`` for every seed (each skipped when current).

    Returns:
        (dataset dir, {seed: final checkpoint dir}), absolute.
    """
    from spice_ray.data.generate import generate_stage
    from spice_ray.train.ray_train import pretrain

    ds_dir = Path(generate_stage(cfg, console=console,
                                 label=f"{cfg.env.name} dataset").dataset_dir).resolve()
    finals = {seed: str(Path(pretrain(cfg, kind, seed, ds_dir, console=console,
                                      label=f"{cfg.env.name} {kind} seed {seed}")).resolve())
              for seed in cfg.seeds}
    return ds_dir, finals


def pretrain_grid(cfg: ExperimentConfig, search_space: Mapping[str, Any], dataset_dir: str | Path,
                  console: Console = SILENT) -> list[Path]:
    """Pretrain SPICE for every trial's model/train settings and every seed, before a
    retraining sweep (each skipped when current; identical models trained once)."""
    from spice_ray.train.ray_train import plan_job, pretrain

    seen: dict[str, Path] = {}
    if samplers(search_space):
        raise SweepError(f"search space keys {samplers(search_space)} are sampled, so the "
                         "models to train are not known before the sweep: let each trial "
                         "train its own (--train-in-trials) or search a grid")
    params_list = expand_grid(search_space)
    for i, params in enumerate(params_list, 1):
        c = apply_params(cfg, params)
        for seed in c.seeds:
            job, _ = plan_job(c, "spice", seed, dataset_dir)
            if job.identity() in seen:
                continue
            what = f"model {i}/{len(params_list)} {params_json(params)} seed {seed}"
            log.info("[pretrain] %s", what)
            seen[job.identity()] = pretrain(c, "spice", seed, dataset_dir, console=console,
                                            label=what)
    return list(seen.values())
