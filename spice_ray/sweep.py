"""Ray Tune sweeps over test-time fusion settings (and retrained model variants).

One Tune trial evaluates ONE configuration: :func:`sweep_trainable` builds the trial's
:class:`~spice_ray.config.RunConfig` from the base config and the trial's overrides
(:func:`apply_params`), runs SPICE online on the eval tasks of every training seed with
:func:`~spice_ray.evaluate.actors.evaluate_parallel` (``sweep.actors_per_trial`` actors of
``sweep.actor_cpus`` CPUs each), reports the final regret (mean and SEM over tasks, seeds averaged
per task first) and the mean regret curve, and attaches its tidy per-task rows as a Parquet file
in the trial's checkpoint (``rows.parquet``, persisted by Tune in the experiment directory).

The driver, :func:`run_sweep`, builds (or restores) the Tuner, checks for errored trials, and
gathers every trial's rows into one table ``<out>/sweeps/<name>.parquet`` plus a per-config
summary ``<out>/sweeps/<name>_summary.parquet`` (mean, SEM, n), and logs the best configs.

Trial parameters (the Tune ``param_space`` / ``result.config``) are a nested dict of config
sections, e.g. ``{"fusion": {"kernel": "rbf", "tau": 0.5}}`` or
``{"model": {"ensemble_size": 4}}``; the sections fusion, model, train and eval are merged over
the base config (and validated), and the special key ``"variant"`` selects a weight-ablation
variant (``spice_ray.study.weight_variant``; ``"all"`` switches every weight on).

Resources. A trial is a Tune function-trainable actor that does little itself; its evaluation
actors do the work. Each trial therefore reserves a placement group
``[{"CPU": 0}] + [{"CPU": actor_cpus}] * actors_per_trial`` (:func:`trial_resources`). Tune
schedules the trial actor with ``placement_group_capture_child_tasks=True``, so the actors
``evaluate_parallel`` creates (plain ``num_cpus=actor_cpus``, no scheduling strategy of their
own) land in the trial's bundles; the trainable checks this at start-up and refuses to run
otherwise. The number of concurrent trials is derived from ``ray.cluster_resources()``
(:func:`auto_max_concurrent`: whole trials that fit after one CPU is kept back for Ray's own
tasks and the driver) unless set explicitly. On 2 CPUs: 1 trial x 2 actors x 0.5 CPU = 1 CPU.

Resume. The experiment lives in ``<out>/sweeps/<name>``. When it exists and
``Tuner.can_restore`` says so, the sweep is restored with ``resume_errored=True``: finished
trials are kept (not re-run), unfinished and errored trials run again (a trial checkpoints only
when it is done, so an errored trial starts from scratch). A file ``<name>.inputs.json`` beside
the experiment records a hash of what the results depend on (search space, base config without
``out_dir``/``sweep``, checkpoints, dataset); a restore with different inputs is refused.

Retraining sweeps (ensemble size, weight ablation) pass ``checkpoints=None``: each trial then
finds its seed's checkpoint with :func:`spice_ray.train.ray_train.plan_job` from the trial's
config. By default these checkpoints are trained before the sweep, in the driver, with the
config's own Train settings (:func:`pretrain_grid`); with ``train_in_trial=True`` a trial
trains a missing checkpoint itself, in-process (``train.num_workers=0``), and its placement
group's head bundle reserves ``train.worker_cpus`` for that.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import math
import os
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from spice_ray.artifacts import atomic_write_text
from spice_ray.config import RunConfig, config_hash, from_dict
from spice_ray.errors import SpiceRayError

if TYPE_CHECKING:
    import argparse

    from ray.tune import PlacementGroupFactory, ResultGrid

log = logging.getLogger(__name__)

SWEEPS_DIR = "sweeps"
"""Sub-directory of the run directory holding Tune experiments and sweep tables."""
TRIAL_ROWS = "rows.parquet"
"""File name of a trial's tidy rows inside its Tune checkpoint."""
FAULT_ENV = "SPICE_RAY_SWEEP_FAIL"
"""Fault-injection switch read by :func:`run_sweep`: JSON of flattened params, e.g.
``{"fusion.beta": 2.0}``; trials whose params match raise :class:`SweepFault`."""
PARAM_SECTIONS = ("fusion", "model", "train", "eval")
"""Config sections a trial may override."""
VARIANT_KEY = "variant"
"""Trial parameter selecting a weight-ablation variant (none, iw, adv, epi, all)."""
RESERVE_CPUS = 1.0
"""CPUs :func:`auto_max_concurrent` keeps free for Ray's own tasks and the driver."""
REGRET_METRIC = "cumulative_regret"
"""Metric of the rows the summary and the trial metrics are computed from."""
OPTIMISE_METRIC = "regret_mean"
"""Trial metric Tune ranks by (lower is better)."""


class SweepError(SpiceRayError, RuntimeError):
    """A sweep could not complete (errored trials, changed inputs, missing checkpoints)."""


class SweepFault(RuntimeError):
    """Raised on purpose by a trial selected by the fault-injection switch (tests)."""


# ---- trial parameters --------------------------------------------------------------------


def _merge(base: dict[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def apply_params(base: RunConfig, params: Mapping[str, Any]) -> RunConfig:
    """The base config with a trial's overrides applied and validated.

    Args:
        base: the sweep's base config.
        params: trial parameters: sections of :data:`PARAM_SECTIONS` (nested dicts of fields)
            and optionally :data:`VARIANT_KEY`.

    Raises:
        SweepError: a key that is neither a section nor the variant.
        ConfigError: an override is invalid (names the field).
    """
    from spice_ray.study import WEIGHT_VARIANTS, weight_variant

    unknown = set(params) - set(PARAM_SECTIONS) - {VARIANT_KEY}
    if unknown:
        raise SweepError(f"trial parameters {sorted(unknown)} are invalid: use the sections "
                         f"{', '.join(PARAM_SECTIONS)} or {VARIANT_KEY!r}")
    sections = {k: v for k, v in params.items() if k in PARAM_SECTIONS}
    cfg = from_dict(_merge(base.to_dict(), sections)) if sections else base
    variant = params.get(VARIANT_KEY)
    if variant is None:
        return cfg
    if variant == "all":
        return cfg.replace(train=dataclasses.replace(cfg.train, use_iw=True, use_adv=True,
                                                     use_epi=True))
    if variant not in WEIGHT_VARIANTS:
        raise SweepError(f"{VARIANT_KEY}={variant!r} is invalid: one of "
                         f"{', '.join([*WEIGHT_VARIANTS, 'all'])}")
    return weight_variant(cfg, variant)


def flatten_params(params: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"fusion": {"tau": 0.5}}`` -> ``{"fusion.tau": 0.5}``."""
    out: dict[str, Any] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten_params(value, f"{name}."))
        else:
            out[name] = value
    return out


def params_json(params: Mapping[str, Any]) -> str:
    """Compact, key-sorted JSON of trial parameters (the ``params`` column)."""
    return json.dumps(params, sort_keys=True, separators=(",", ":"), default=str)


def _is_grid(value: Any) -> bool:
    return isinstance(value, Mapping) and set(value) == {"grid_search"}


def expand_grid(space: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every trial's parameters of a search space built from ``tune.grid_search`` (nested).

    Only grid searches and constants are supported (the sweeps here are plain grids).

    Raises:
        SweepError: the space holds a random sampler (e.g. ``tune.uniform``).
    """
    keys = list(space)
    options: list[list[Any]] = []
    for key in keys:
        value = space[key]
        if _is_grid(value):
            choices = list(value["grid_search"])
        elif isinstance(value, Mapping):
            choices = expand_grid(value)
        elif hasattr(value, "sample"):
            raise SweepError(f"search space key {key!r} is a random sampler; only "
                             "tune.grid_search is supported")
        else:
            choices = [value]
        options.append(choices)
    return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*options)]


def _matches(params: Mapping[str, Any], selector: Mapping[str, Any] | None) -> bool:
    if not selector:
        return False
    flat = flatten_params(params)
    return all(k in flat and flat[k] == v for k, v in selector.items())


# ---- resources ---------------------------------------------------------------------------


def trial_bundles(cfg: RunConfig, train_in_trial: bool = False,
                  cluster: Mapping[str, float] | None = None) -> list[dict[str, float]]:
    """Placement-group bundles of one trial: a head bundle for the trial actor, then one bundle
    per evaluation actor (``sweep.actor_cpus`` CPUs, plus ``eval.actor_gpus`` GPUs if set).

    The head bundle is empty (``{"CPU": 0}``) unless the trial trains in-process, when it
    reserves ``train.worker_cpus``. GPU actors also carry the ``trainer`` node label that
    ``evaluate_parallel`` requests on labelled clusters (``spice_ray.cluster``), so that they
    still fit their bundles.

    Args:
        cfg: the sweep's config.
        train_in_trial: trials train in-process.
        cluster: cluster resources for the label check (default: ``ray.cluster_resources()``;
            only consulted when ``eval.actor_gpus`` > 0).
    """
    head = {"CPU": float(cfg.train.worker_cpus) if train_in_trial else 0.0}
    actor = {"CPU": float(cfg.sweep.actor_cpus)}
    if cfg.eval.actor_gpus > 0:
        from spice_ray.cluster import TRAINER, placement_resources

        actor["GPU"] = float(cfg.eval.actor_gpus)
        actor |= placement_resources(TRAINER, cluster)
    return [head] + [dict(actor) for _ in range(cfg.sweep.actors_per_trial)]


def trial_resources(cfg: RunConfig, train_in_trial: bool = False) -> PlacementGroupFactory:
    """The trial's :class:`ray.tune.PlacementGroupFactory` (see :func:`trial_bundles`)."""
    from ray import tune

    return tune.PlacementGroupFactory(trial_bundles(cfg, train_in_trial))


def bundles_total(bundles: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Sum of a trial's bundles per resource."""
    total: dict[str, float] = {}
    for bundle in bundles:
        for key, amount in bundle.items():
            total[key] = total.get(key, 0.0) + float(amount)
    return total


def auto_max_concurrent(
    bundles: Sequence[Mapping[str, float]],
    cluster: Mapping[str, float] | None = None,
    num_trials: int | None = None,
    reserve_cpus: float = RESERVE_CPUS,
) -> int:
    """How many trials fit on the cluster at once (at least 1, at most ``num_trials``).

    Per resource a trial needs (CPU, GPU, ...): whole trials that fit in the cluster's total,
    with ``reserve_cpus`` CPUs kept back for Ray's own tasks, the driver and Tune.

    Args:
        bundles: one trial's bundles (:func:`trial_bundles`).
        cluster: total resources (default: ``ray.cluster_resources()``).
        num_trials: the sweep's trial count, an upper bound.
        reserve_cpus: CPUs not given to trials.
    """
    if cluster is None:
        import ray

        cluster = ray.cluster_resources()
    limits = []
    for key, amount in bundles_total(bundles).items():
        if amount <= 0:
            continue
        have = float(cluster.get(key, 0.0)) - (reserve_cpus if key == "CPU" else 0.0)
        limits.append(math.floor(have / amount + 1e-9))
    n = max(1, min(limits)) if limits else max(1, num_trials or 1)
    return min(n, num_trials) if num_trials else n


# ---- one trial ---------------------------------------------------------------------------


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


def resolve_checkpoint(cfg: RunConfig, seed: int, dataset_dir: str | Path,
                       train_in_trial: bool = False) -> Path:
    """The SPICE checkpoint of ``cfg`` and ``seed`` (for retraining sweeps).

    Returns the current final checkpoint; trains it in this process (``train.num_workers=0``)
    when it is missing and ``train_in_trial``.

    Raises:
        SweepError: the checkpoint is missing and training in the trial is off.
    """
    from spice_ray.train.ray_train import final_is_current, plan_job, pretrain

    job, run_dir = plan_job(cfg, "spice", seed, dataset_dir)
    final = run_dir / "final"
    if final_is_current(final, job):
        return final
    if not train_in_trial:
        raise SweepError(f"no current SPICE checkpoint at {final} for this trial's model/train "
                         "settings; pretrain before the sweep (pretrain_grid) or run with "
                         "train_in_trial=True")
    local = cfg.replace(train=dataclasses.replace(cfg.train, num_workers=0, use_gpu=False))
    return pretrain(local, "spice", seed, dataset_dir)


def evaluate_config(
    cfg: RunConfig,
    dataset_dir: str | Path,
    checkpoints: Mapping[int, str] | None = None,
    curve_points: int | None = None,
    train_in_trial: bool = False,
) -> pd.DataFrame:
    """SPICE online on the eval tasks for every seed, with ``cfg.fusion``; tidy rows.

    Args:
        cfg: the trial's config; ``sweep.actors_per_trial`` actors of ``sweep.actor_cpus``
            CPUs each evaluate the tasks.
        dataset_dir: dataset with the eval split.
        checkpoints: {seed: checkpoint dir}; None: per ``cfg.seeds``, found (or trained) by
            :func:`resolve_checkpoint`.
        curve_points: steps kept per curve (:func:`curve_steps`); None keeps every step.
        train_in_trial: see :func:`resolve_checkpoint`.

    Returns:
        Rows with ``spice_ray.evaluate.rollout.ROW_COLUMNS`` (online protocol: cumulative
        regret, and cumulative return on darkroom).
    """
    from spice_ray.evaluate.actors import evaluate_parallel
    from spice_ray.evaluate.controllers import ControllerSpec
    from spice_ray.evaluate.rollout import concat_rows, load_eval_tasks

    eval_cfg = dataclasses.replace(cfg.eval, num_actors=cfg.sweep.actors_per_trial,
                                   actor_cpus=cfg.sweep.actor_cpus)
    data = load_eval_tasks(dataset_dir, eval_cfg)
    spec = ControllerSpec("spice", fusion=cfg.fusion)
    seeds = sorted(int(s) for s in checkpoints) if checkpoints is not None else list(cfg.seeds)
    frames = []
    for seed in seeds:
        source = (str(checkpoints[seed]) if checkpoints is not None
                  else str(resolve_checkpoint(cfg, seed, dataset_dir, train_in_trial)))
        rows = evaluate_parallel(source, cfg.env, eval_cfg, data, [spec], ("online",),
                                 seed=seed, num_actors=cfg.sweep.actors_per_trial)
        frames.append(downsample(rows, curve_points))
    return concat_rows(frames)


def regret_stats(rows: pd.DataFrame) -> dict[str, Any]:
    """Final regret mean and SEM over tasks (seeds averaged per task first) and the mean curve.

    Returns:
        regret_mean, regret_sem, n_tasks, n_seeds, regret_curve (mean cumulative regret over
        tasks at each kept step) and curve_steps.
    """
    reg = rows[rows["metric"] == REGRET_METRIC]
    if reg.empty:
        raise SweepError(f"no {REGRET_METRIC} rows to summarise")
    per_task_step = reg.groupby(["x", "task_id"])["value"].mean()  # seeds averaged per task
    curve = per_task_step.groupby(level="x").mean().sort_index()
    final = per_task_step.xs(int(reg["x"].max()), level="x")
    n = int(final.size)
    sem = float(final.std(ddof=1) / math.sqrt(n)) if n > 1 else float("nan")
    return {"regret_mean": float(final.mean()), "regret_sem": sem, "n_tasks": n,
            "n_seeds": int(reg["seed"].nunique()),
            "regret_curve": [float(v) for v in curve.to_numpy()],
            "curve_steps": [int(x) for x in curve.index.to_numpy()]}


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
    ``config``). Reports the :func:`regret_stats` metrics, the trial's wall time, its placement
    group id, and a checkpoint holding :data:`TRIAL_ROWS`.

    Args:
        config: the trial's parameters (see :func:`apply_params`).
        base: the base RunConfig as a dict (absolute ``out_dir``).
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
    rows = evaluate_config(cfg, dataset_dir, checkpoints, curve_points, train_in_trial)
    metrics = regret_stats(rows)
    metrics |= {"seconds": time.perf_counter() - t0, "finished_at": time.time(),
                "placement_group": pg.id.hex(), "captures_actors": True}
    with tempfile.TemporaryDirectory(prefix="spice_sweep_") as tmp:
        write_frame(Path(tmp) / TRIAL_ROWS, rows)
        tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(tmp))


def make_trainable(
    cfg: RunConfig,
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


# ---- preparing models --------------------------------------------------------------------


def ensure_models(cfg: RunConfig, kind: str = "spice") -> tuple[Path, dict[int, str]]:
    """Generate the dataset and pretrain ``kind`` for every seed (each skipped when current).

    Returns:
        (dataset dir, {seed: final checkpoint dir}), absolute.
    """
    from spice_ray.stages import generate_stage
    from spice_ray.train.ray_train import pretrain

    ds_dir = Path(generate_stage(cfg).dataset_dir).resolve()
    finals = {seed: str(Path(pretrain(cfg, kind, seed, ds_dir)).resolve()) for seed in cfg.seeds}
    return ds_dir, finals


def pretrain_grid(cfg: RunConfig, search_space: Mapping[str, Any], dataset_dir: str | Path
                  ) -> list[Path]:
    """Pretrain SPICE for every trial's model/train settings and every seed, before a
    retraining sweep (each skipped when current; identical models trained once)."""
    from spice_ray.train.ray_train import plan_job, pretrain

    seen: dict[str, Path] = {}
    params_list = expand_grid(search_space)
    for i, params in enumerate(params_list, 1):
        c = apply_params(cfg, params)
        for seed in c.seeds:
            job, _ = plan_job(c, "spice", seed, dataset_dir)
            if job.identity() in seen:
                continue
            log.info("[pretrain %d/%d] %s seed %d", i, len(params_list), params_json(params),
                     seed)
            seen[job.identity()] = pretrain(c, "spice", seed, dataset_dir)
    return list(seen.values())


# ---- the driver --------------------------------------------------------------------------


@dataclass
class SweepResult:
    """What :func:`run_sweep` produced."""

    name: str
    table_path: Path
    """``<out>/sweeps/<name>.parquet``: every trial's rows."""
    summary_path: Path
    """``<out>/sweeps/<name>_summary.parquet``: one row per configuration."""
    summary: pd.DataFrame
    """The summary, best (lowest final regret) first."""
    trials: pd.DataFrame
    """One row per trial: trial_id, params, reported metrics (without the curve)."""
    experiment_dir: Path
    restored: bool
    """Whether an existing experiment was restored."""
    new_trials: int
    """Trials that finished during this call (0 when a finished sweep is re-run)."""
    max_concurrent_trials: int
    seconds: float


def _inputs_hash(name: str, cfg: RunConfig, search_space: Mapping[str, Any],
                 checkpoints: Mapping[int, str] | None, dataset_dir: Path,
                 curve_points: int | None) -> str:
    """What a sweep's results depend on, by content (a moved run directory stays current)."""
    from spice_ray.data.store import split_id
    from spice_ray.train.checkpoint import content_id

    base = {k: v for k, v in cfg.to_dict().items() if k not in ("out_dir", "sweep")}
    return config_hash({"name": name, "space": json.loads(params_json(search_space)),
                        "base": base, "data": split_id(dataset_dir, "eval"),
                        "curve_points": curve_points,
                        "ckpts": None if checkpoints is None
                        else {str(k): content_id(v) for k, v in sorted(checkpoints.items())}})


def check_restorable(exp_dir: Path, inputs_file: Path, inputs: str) -> dict[str, Any]:
    """Refuse to restore a Tune experiment unless it is ours and was run with these inputs.

    ``Tuner.restore`` unpickles ``tuner.pkl`` (and Tune's other ``*.pkl`` files): whoever can
    write them can run code here. So restoring needs (1) ``<name>.inputs.json`` beside the
    experiment, recording the same inputs hash, and (2) the experiment directory and every
    pickle in it owned by this user and not writable by group or others.

    Returns:
        The recorded inputs file.

    Raises:
        SweepError: naming the file and what is wrong; ``--fresh`` starts again.
    """
    from spice_ray.artifacts import UnreadableFile, read_json

    try:
        recorded = read_json(inputs_file)
    except FileNotFoundError as exc:
        raise SweepError(f"{exp_dir} has no {inputs_file.name}, so what it was run with is "
                         "unknown; it is not restored (restoring unpickles its files). Use "
                         "another name or --fresh to start again") from exc
    except UnreadableFile as exc:
        raise SweepError(f"{exc}; {exp_dir} is not restored. Use --fresh to start again"
                         ) from exc
    if recorded.get("inputs") != inputs:
        raise SweepError(f"{exp_dir} was run with other inputs (search space, base config, "
                         "checkpoints or dataset); use another name or resume=False "
                         "(--fresh) to start again")
    uid = os.getuid()
    for path in [exp_dir, inputs_file, *sorted(exp_dir.rglob("*.pkl"))]:
        st = path.lstat()
        if st.st_uid != uid or st.st_mode & 0o022:
            raise SweepError(
                f"{path} is owned by uid {st.st_uid} with mode {oct(st.st_mode & 0o777)}; "
                "restoring would unpickle files another user could have written. Make the "
                "run directory writable by you alone (chmod -R go-w) or use --fresh")
    return recorded


def _move_aside(path: Path) -> Path:
    dest = path.with_name(f"{path.name}.replaced-{time.strftime('%Y%m%d-%H%M%S')}")
    os.replace(path, dest)
    log.warning("moved the previous experiment %s aside to %s", path, dest)
    return dest


def _trial_frames(grid: ResultGrid, name: str) -> Iterator[tuple[dict[str, Any], pd.DataFrame]]:
    from spice_ray.results.tables import read_frame

    results = sorted(grid, key=lambda r: str((r.metrics or {}).get("trial_id", "")))
    for result in results:  # trial order, whatever order a restore returns them in
        metrics = dict(result.metrics or {})
        if result.checkpoint is None:
            raise SweepError(f"trial {metrics.get('trial_id')} finished without its rows")
        with result.checkpoint.as_directory() as d:
            rows = read_frame(Path(d) / TRIAL_ROWS)  # its checksum is checked first
        params = dict(result.config or {})
        info = {"trial_id": str(metrics.get("trial_id", "")), "params": params_json(params),
                **{k: v for k, v in metrics.items()
                   if k in ("regret_mean", "regret_sem", "n_tasks", "n_seeds", "seconds",
                            "finished_at", "placement_group", "captures_actors")}}
        flat = flatten_params(params)
        rows.insert(0, "sweep", name)
        rows.insert(1, "trial_id", info["trial_id"])
        rows.insert(2, "params", info["params"])
        for i, (key, value) in enumerate(flat.items()):
            rows.insert(3 + i, key, value)
        yield info | flat, rows


def summarise_sweep(table: pd.DataFrame) -> pd.DataFrame:
    """Per configuration (``params``): final regret mean, SEM and n over tasks.

    Seeds (and repeated samples of a config) are averaged per task first. Sorted best first,
    with a ``rank`` column (1 = lowest final regret).
    """
    reg = table[table["metric"] == REGRET_METRIC]
    final_x = reg.groupby("params")["x"].transform("max")
    final = reg[reg["x"] == final_x]
    param_cols = [c for c in table.columns
                  if c not in ("sweep", "trial_id", "params", "env", "method", "controller",
                               "config", "seed", "task_id", "metric", "x", "value")]
    per_task = final.groupby(["params", "task_id"])["value"].mean().reset_index()
    stats = per_task.groupby("params")["value"].agg(mean="mean", std="std", n="count")
    stats["sem"] = stats["std"] / np.sqrt(stats["n"].clip(lower=1))
    meta = final.groupby("params").agg(env=("env", "first"), config=("config", "first"),
                                       seeds=("seed", "nunique"), trials=("trial_id", "nunique"),
                                       horizon=("x", "max"))
    firsts = final.groupby("params")[param_cols].first() if param_cols else None
    out = stats.drop(columns="std").join(meta)
    if firsts is not None:
        out = out.join(firsts)
    out = out.reset_index().sort_values(["mean", "params"], kind="stable")
    out.insert(0, "rank", np.arange(1, len(out) + 1))
    return out[["rank", "params", *param_cols, "env", "mean", "sem", "n", "seeds", "trials",
                "horizon", "config"]].reset_index(drop=True)


def format_best(summary: pd.DataFrame, top: int = 5) -> str:
    """The ``top`` configurations as text lines (rank, final regret +- SEM, params)."""
    lines = []
    for row in summary.head(top).itertuples(index=False):
        lines.append(f"  #{row.rank:<3d} final regret {row.mean:9.4f} +- {row.sem:7.4f} "
                     f"(n={row.n}, seeds={row.seeds})  {row.params}")
    return "\n".join(lines)


def run_sweep(
    name: str,
    base_cfg: RunConfig,
    search_space: Mapping[str, Any],
    checkpoints: Mapping[int, str | Path] | None,
    dataset_dir: str | Path,
    out_dir: str | Path,
    resume: bool = True,
    *,
    max_concurrent_trials: int | None = None,
    train_in_trial: bool = False,
    curve_points: int | None = 50,
    fail_if: Mapping[str, Any] | None = None,
    top: int = 5,
    verbose: int = 1,
) -> SweepResult:
    """Run (or resume, or just re-collect) one Tune sweep and write its tables.

    Args:
        name: experiment name; the Tune experiment is ``<out_dir>/sweeps/<name>``.
        base_cfg: the config every trial starts from (seeds, eval sizes, sweep resources).
        search_space: Tune ``param_space`` over the trial parameters (see
            :func:`apply_params`), built from ``tune.grid_search``.
        checkpoints: {seed: SPICE checkpoint dir} shared by all trials, or None when trials
            retrain (see :func:`resolve_checkpoint`).
        dataset_dir: dataset with the eval split (and train split for retraining).
        out_dir: run directory; tables go to ``<out_dir>/sweeps``.
        resume: restore an existing experiment (finished trials are kept, unfinished and
            errored ones run again); False moves an existing one aside and starts afresh.
        max_concurrent_trials: trials at once; None derives it from the cluster
            (:func:`auto_max_concurrent`).
        train_in_trial: trials train missing checkpoints in-process (head bundle reserves
            ``train.worker_cpus``).
        curve_points: steps kept per regret curve in the table (None: every step).
        fail_if: fault injection (see :data:`FAULT_ENV`, which is read when this is None).
        top: best configurations logged.
        verbose: Tune's console verbosity (0 silent, 1 default, 2 verbose).

    Returns:
        A :class:`SweepResult`.

    Raises:
        SweepError: some trials errored (their rows are not written; a re-run resumes them),
            or the existing experiment was run with different inputs.
    """
    from ray import tune

    t0 = time.time()
    out_dir = Path(out_dir).resolve()
    dataset_dir = Path(dataset_dir).resolve()
    checkpoints = (None if checkpoints is None
                   else {int(k): str(Path(v).resolve()) for k, v in checkpoints.items()})
    cfg = base_cfg.replace(out_dir=str(out_dir))
    sweeps = out_dir / SWEEPS_DIR
    exp_dir = sweeps / name
    inputs_file = sweeps / f"{name}.inputs.json"
    if fail_if is None and os.environ.get(FAULT_ENV):
        fail_if = json.loads(os.environ[FAULT_ENV])
    inputs = _inputs_hash(name, cfg, search_space, checkpoints, dataset_dir, curve_points)
    trainable = make_trainable(cfg, dataset_dir, checkpoints, curve_points, train_in_trial,
                               fail_if)
    num_trials = len(expand_grid(search_space)) * cfg.sweep.num_samples
    bundles = trial_bundles(cfg, train_in_trial)

    restored = bool(resume and tune.Tuner.can_restore(str(exp_dir)))
    if restored:
        recorded = check_restorable(exp_dir, inputs_file, inputs)
        log.info("[sweep %s] restoring %s (finished trials are kept)", name, exp_dir)
        tuner = tune.Tuner.restore(str(exp_dir), trainable, resume_errored=True)
        concurrency = int(recorded.get("max_concurrent_trials", 0))  # Tune keeps the original
    else:
        if exp_dir.exists():
            _move_aside(exp_dir)
        concurrency = (max_concurrent_trials if max_concurrent_trials is not None
                       else auto_max_concurrent(bundles, num_trials=num_trials))
        per_trial = bundles_total(bundles)
        log.info("[sweep %s] %d trials, %d at once; each trial reserves %s (%d actors x %s)",
                 name, num_trials, concurrency, per_trial, cfg.sweep.actors_per_trial,
                 bundles[-1] if len(bundles) > 1 else {})
        sweeps.mkdir(parents=True, exist_ok=True)
        atomic_write_text(inputs_file, json.dumps(
            {"inputs": inputs, "max_concurrent_trials": concurrency,
             "space": json.loads(params_json(search_space))}, indent=1))
        tuner = tune.Tuner(
            trainable,
            param_space=dict(search_space),
            tune_config=tune.TuneConfig(metric=OPTIMISE_METRIC, mode="min",
                                        num_samples=cfg.sweep.num_samples,
                                        max_concurrent_trials=concurrency,
                                        reuse_actors=True),
            run_config=tune.RunConfig(name=name, storage_path=str(sweeps), verbose=verbose,
                                      failure_config=tune.FailureConfig(max_failures=0)),
        )
    grid = tuner.fit()
    if grid.num_errors:
        failed = [f"{(r.metrics or {}).get('trial_id', '?')} {params_json(r.config or {})}: "
                  f"{type(r.error).__name__}: {str(r.error).strip().splitlines()[-1:]}"
                  for r in grid if r.error is not None]
        raise SweepError(f"sweep {name}: {grid.num_errors} of {len(grid)} trials errored; "
                         f"re-run to resume them ({exp_dir}):\n  " + "\n  ".join(failed))

    infos, frames = [], []
    for info, rows in _trial_frames(grid, name):
        infos.append(info)
        frames.append(rows)
    trials = pd.DataFrame(infos)
    table = pd.concat(frames, ignore_index=True)
    dup = table.duplicated(["trial_id", "seed", "task_id", "metric", "x"])
    if dup.any():
        raise SweepError(f"sweep {name}: {int(dup.sum())} duplicated rows")
    from spice_ray.results.tables import check_finite, write_frame

    check_finite(table, f"sweep {name}")
    table_path = write_frame(sweeps / f"{name}.parquet", table, inputs=inputs)
    summary = summarise_sweep(table)
    summary_path = write_frame(sweeps / f"{name}_summary.parquet", summary, inputs=inputs)
    new = int((trials["finished_at"] >= t0).sum()) if "finished_at" in trials else len(trials)
    log.info("[sweep %s] %d trials (%d new), %d rows -> %s; best (lowest final regret):\n%s",
             name, len(trials), new, len(table), table_path, format_best(summary, top))
    return SweepResult(name, table_path, summary_path, summary, trials, exp_dir, restored, new,
                       concurrency, time.time() - t0)


# ---- command-line helpers for sweeps/*.py ------------------------------------------------


def add_sweep_args(parser: argparse.ArgumentParser, retrain: bool = False) -> None:
    """Sweep flags shared by sweeps/*.py: --fresh, --curve-points, --top (and
    --train-in-trials for retraining sweeps)."""
    parser.add_argument("--fresh", action="store_true",
                        help="move an existing experiment aside and start again "
                             "(default: restore it; finished trials are kept)")
    parser.add_argument("--curve-points", type=int, default=50,
                        help="steps kept per regret curve in the table (0: every step)")
    parser.add_argument("--top", type=int, default=5, help="best configurations printed")
    if retrain:
        parser.add_argument("--train-in-trials", action="store_true",
                            help="let each trial train its model in-process (parallel on a "
                                 "cluster) instead of pretraining every variant first")


def sweep_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """run_sweep keyword arguments from the parsed flags: resume, curve_points, top."""
    return {"resume": not args.fresh, "curve_points": args.curve_points or None,
            "top": args.top}


def explicit_concurrency(args: argparse.Namespace, cfg: RunConfig) -> int | None:
    """``cfg.sweep.max_concurrent_trials`` if set (>= 1), else None (derive from the cluster)."""
    return cfg.sweep.max_concurrent_trials or None


def start_sweep(args: argparse.Namespace, cfgs: Sequence[RunConfig],
                train_in_trial: bool = False) -> Any:
    """:func:`spice_ray.cli.start_run` for a sweep: its datasets, pretraining and each trial's
    placement group must fit the cluster. Returns the run directory's lock."""
    from spice_ray.cli import start_run
    from spice_ray.resources import sweep_request

    first = cfgs[0]
    return start_run(args.address, cfgs, first.out_dir, stages=("datasets", "pretrain"),
                     extra_requests=lambda: [sweep_request(c, trial_bundles(c, train_in_trial))
                                             for c in cfgs])


def print_result(result: SweepResult, top: int = 5) -> None:
    """Print where a sweep's tables are and its best configurations."""
    how = "restored" if result.restored else "new"
    print(f"\nsweep {result.name} ({how}, {result.new_trials} trials run now, "
          f"{len(result.trials)} in all, {result.seconds:.0f} s)")
    print(f"  table:   {result.table_path}")
    print(f"  summary: {result.summary_path}")
    print("  best (lowest final regret):")
    print(format_best(result.summary, top))

