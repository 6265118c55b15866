"""The sweep driver: build or restore the Tuner, guard the restore, gather the tables.

One Tune trial evaluates ONE configuration: :func:`sweep_trainable` builds the trial's
:class:`~spice_ray.config.ExperimentConfig` from the base config and the trial's overrides
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
variant (``spice_ray.study.experiments.WEIGHT_VARIANTS`` through ``spice_ray.sweep.params``;
``"all"`` switches every weight on).

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

import json
import logging
import os
import stat
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from spice_ray.common.artifacts import atomic_write_text
from spice_ray.common.console import SILENT, Console
from spice_ray.common.faults import fault
from spice_ray.config import ExperimentConfig, config_hash
from spice_ray.results.summary import summarise
from spice_ray.runtime import tracking
from spice_ray.runtime import tune_engine as engine
from spice_ray.sweep.params import (
    SweepError,
    check_space,
    count_trials,
    flatten_params,
    params_json,
    space_json,
)
from spice_ray.sweep.resources import auto_max_concurrent, bundles_total, trial_bundles
from spice_ray.sweep.trial import (
    OPTIMISE_METRIC,
    REGRET_METRIC,
    SWEEPS_DIR,
    TRIAL_ROWS,
    make_trainable,
)

if TYPE_CHECKING:
    from ray.tune import ResultGrid

log = logging.getLogger(__name__)


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


def _inputs_hash(name: str, cfg: ExperimentConfig, search_space: Mapping[str, Any],
                 checkpoints: Mapping[int, str] | None, dataset_dir: Path,
                 curve_points: int | None) -> str:
    """What a sweep's results depend on, by content (a moved run directory stays current)."""
    from spice_ray.data.store import split_id
    from spice_ray.model.checkpoint import content_id

    base = {k: v for k, v in cfg.to_dict().items() if k not in ("out_dir", "sweep")}
    return config_hash({"name": name, "space": json.loads(space_json(search_space)),
                        "base": base, "data": split_id(dataset_dir, "eval"),
                        "curve_points": curve_points,
                        "ckpts": None if checkpoints is None
                        else {str(k): content_id(v) for k, v in sorted(checkpoints.items())}})


def check_restorable(exp_dir: Path, inputs_file: Path, inputs: str | None) -> dict[str, Any]:
    """Refuse to restore a Tune experiment unless it is ours and was run with these inputs
    (``inputs=None``: any inputs, for reading its results back).

    ``Tuner.restore`` unpickles ``tuner.pkl``, Tune's other ``*.pkl`` files and fields inside
    ``experiment_state-*.json`` (cloudpickled, hex-encoded): whoever can write any of them can
    run code here. So restoring (and reading the results back) needs (1) ``<name>.inputs.json``
    beside the experiment, recording the same inputs hash, and (2) the experiment directory and
    every file and folder in it owned by this user, not writable by group or others, and not a
    symbolic link (which would lead the reader outside it).

    Returns:
        The recorded inputs file.

    Raises:
        SweepError: naming the file and what is wrong; ``--fresh`` starts again.
    """
    from spice_ray.common.artifacts import UnreadableFile, is_current, read_json

    try:
        recorded = read_json(inputs_file)
    except FileNotFoundError as exc:
        raise SweepError(f"{exp_dir} has no {inputs_file.name}, so what it was run with is "
                         "unknown; it is not restored (restoring unpickles its files). Use "
                         "another name or --fresh to start again") from exc
    except UnreadableFile as exc:
        raise SweepError(f"{exc}; {exp_dir} is not restored. Use --fresh to start again"
                         ) from exc
    if inputs is not None and not is_current(recorded, inputs)[0]:
        raise SweepError(f"{exp_dir} was run with other inputs (search space, base config, "
                         "checkpoints or dataset); use another name or resume=False "
                         "(--fresh) to start again")
    uid = os.getuid()
    for path in [exp_dir, inputs_file, *sorted(exp_dir.rglob("*"))]:
        st = path.lstat()
        if stat.S_ISLNK(st.st_mode):
            raise SweepError(f"{path} is a symbolic link; restoring would read (and unpickle) "
                             "what it points to. Remove it or use --fresh")
        if st.st_uid != uid or st.st_mode & 0o022:
            raise SweepError(
                f"{path} is owned by uid {st.st_uid} with mode {oct(st.st_mode & 0o777)}; "
                "restoring would unpickle files another user could have written. Make the "
                "run directory writable by you alone (chmod -R go-w) or use --fresh")
    return recorded


def load_result_grid(out_dir: str | Path, name: str) -> Any:
    """Tune's own ``ResultGrid`` of the sweep ``name`` under ``out_dir`` (its trials' configs,
    metrics, logs and errors), for analyses beyond the sweep's tables.

    Reading it unpickles Tune's files, so the same guard as a restore applies: the experiment
    must be one this driver wrote (its ``<name>.inputs.json`` beside it) and no other user may
    have written it.

    Raises:
        SweepError: no such sweep, or the guard refuses it (naming the file).
    """
    from ray.tune import ExperimentAnalysis, ResultGrid

    sweeps = Path(out_dir).resolve() / SWEEPS_DIR
    exp_dir = sweeps / name
    if not exp_dir.is_dir():
        have = sorted(p.stem for p in sweeps.glob("*.inputs.json")) if sweeps.is_dir() else []
        raise SweepError(f"no sweep {name!r} under {sweeps}; sweeps there: "
                         f"{', '.join(p.removesuffix('.inputs') for p in have) or 'none'}")
    check_restorable(exp_dir, sweeps / f"{name}.inputs.json", None)
    return ResultGrid(ExperimentAnalysis(str(exp_dir), default_metric=OPTIMISE_METRIC,
                                         default_mode="min"))


def _move_aside(path: Path) -> Path:
    dest = path.with_name(f"{path.name}.replaced-{time.strftime('%Y%m%d-%H%M%S')}")
    os.replace(path, dest)
    log.warning("moved the previous experiment %s aside to %s", path, dest)
    return dest


def _trial_frames(grid: ResultGrid, name: str, split: str
                  ) -> Iterator[tuple[dict[str, Any], pd.DataFrame]]:
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
                            "finished_at", "placement_group", "captures_actors", "actors_started",
                            "chunk", "chunks")}}
        info["stopped_early"] = int(metrics.get("chunk", 1)) < int(metrics.get("chunks", 1))
        flat = flatten_params(params)
        rows.insert(0, "sweep", name)
        rows.insert(1, "split", split)  # the tasks it was scored on
        rows.insert(2, "trial_id", info["trial_id"])
        rows.insert(3, "params", info["params"])
        for i, (key, value) in enumerate(flat.items()):
            rows.insert(4 + i, key, value)
        yield info | flat, rows


def summarise_sweep(table: pd.DataFrame) -> pd.DataFrame:
    """Per configuration (``params``): final regret mean, SEM and n over tasks.

    Seeds (and repeated samples of a config) are averaged per task first
    (``spice_ray.results.summarise``). ``complete`` says whether a config was evaluated on
    every task (a trial an ASHA scheduler stopped early was not: its mean is over the tasks it
    reached). Sorted complete configs first, then best first, with a ``rank`` column (1 =
    lowest final regret among the complete).
    """
    if "split" not in table:  # a table from before sweeps named their split: all on eval
        table = table.assign(split="eval")
    reg = table[table["metric"] == REGRET_METRIC]
    final = reg[reg["x"] == reg.groupby("params")["x"].transform("max")]
    param_cols = [c for c in table.columns
                  if c not in ("sweep", "split", "trial_id", "params", "env", "method", "rule",
                               "config", "seed", "task_id", "metric", "x", "value")]
    stats = summarise(final[["params", "task_id", "seed", "value"]], ["params"]).set_index(
        "params").drop(columns="seeds")
    meta = final.groupby("params").agg(env=("env", "first"), split=("split", "first"),
                                       config=("config", "first"),
                                       seeds=("seed", "nunique"), trials=("trial_id", "nunique"),
                                       horizon=("x", "max"))
    out = stats.join(meta)
    if param_cols:
        out = out.join(final.groupby("params")[param_cols].first())
    out["complete"] = out["n"] == out["n"].max()
    out = out.reset_index().sort_values(["complete", "mean", "params"],
                                        ascending=[False, True, True], kind="stable")
    out.insert(0, "rank", range(1, len(out) + 1))
    return out[["rank", "params", *param_cols, "env", "split", "mean", "sem", "n", "complete",
                "seeds", "trials", "horizon", "config"]].reset_index(drop=True)


def _scheduler(cfg: ExperimentConfig) -> Any:
    """ASHA over the trial's reported chunks (``sweep.scheduler=asha``), else FIFO."""
    if cfg.sweep.scheduler != "asha":
        return None
    from ray.tune.schedulers import ASHAScheduler

    return ASHAScheduler(time_attr="training_iteration", max_t=cfg.sweep.report_chunks(),
                         grace_period=1, reduction_factor=cfg.sweep.reduction_factor)


def run_sweep(
    name: str,
    base_cfg: ExperimentConfig,
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
    verbose: int = 0,
    console: Console = SILENT,
) -> SweepResult:
    """Run (or resume, or just re-collect) one Tune sweep and write its tables.

    Args:
        name: experiment name; the Tune experiment is ``<out_dir>/sweeps/<name>``.
        base_cfg: the config every trial starts from (seeds, eval sizes, sweep resources).
        search_space: Tune ``param_space`` over the trial parameters (see
            :func:`apply_params`): ``tune.grid_search`` with ``sweep.search=grid``, samplers
            (``tune.uniform``, ``loguniform``, ``choice``, and
            :class:`~spice_ray.sweep.params.Conditional` keys) with ``random`` or ``optuna``,
            which never run one configuration twice (:mod:`spice_ray.sweep.search`).
        checkpoints: {seed: SPICE checkpoint dir} shared by all trials, or None when trials
            retrain (see :func:`resolve_checkpoint`).
        dataset_dir: dataset with the eval split (and train split for retraining).
        out_dir: run directory; tables go to ``<out_dir>/sweeps``.
        resume: restore an existing experiment (finished trials are kept, unfinished and
            errored ones run again); False moves an existing one aside and starts afresh.
        max_concurrent_trials: trials at once; None takes ``sweep.max_concurrent_trials``, and
            when that is 0 derives it from the cluster (:func:`auto_max_concurrent`).
        train_in_trial: trials train missing checkpoints in-process (head bundle reserves
            ``train.worker_cpus``).
        curve_points: steps kept per regret curve in the table (None: every step).
        fail_if: fault injection: trials whose flattened params match raise
            :class:`SweepFault` (None: ``spice_ray.common.faults``' point ``sweep_trial``).
        verbose: Tune's own console output (0: none, the console's bar instead; 1, 2).
        console: shows a bar over the trials (running regret as chunks report).

    Returns:
        A :class:`SweepResult`.

    Raises:
        SweepError: some trials errored (their rows are not written; a re-run resumes them),
            or the existing experiment was run with different inputs.
    """
    from ray import tune

    from spice_ray.sweep import callbacks

    t0 = time.time()
    out_dir = Path(out_dir).resolve()
    dataset_dir = Path(dataset_dir).resolve()
    checkpoints = (None if checkpoints is None
                   else {int(k): str(Path(v).resolve()) for k, v in checkpoints.items()})
    cfg = base_cfg.replace(out_dir=str(out_dir))
    if cfg.sweep.split == "eval":
        log.warning("sweep %s is scored on the eval split (sweep.split=eval): a choice made "
                    "from it is tuned on the test tasks; its tables say split=eval", name)
    sweeps = out_dir / SWEEPS_DIR
    exp_dir = sweeps / name
    inputs_file = sweeps / f"{name}.inputs.json"
    if fail_if is None:
        fail_if = fault("sweep_trial")
    inputs = _inputs_hash(name, cfg, search_space, checkpoints, dataset_dir, curve_points)
    check_space(search_space, cfg.sweep.search)
    trainable = make_trainable(cfg, dataset_dir, checkpoints, curve_points, train_in_trial,
                               fail_if)
    num_trials = count_trials(search_space, cfg.sweep.num_samples)
    bundles = trial_bundles(cfg, train_in_trial)
    callbacks.attach(name, console)

    restored = bool(resume and tune.Tuner.can_restore(str(exp_dir)))
    searcher: Any = None  # a new sampled search's; a restored one is Tune's own copy
    if restored:
        recorded = check_restorable(exp_dir, inputs_file, inputs)
        log.info("[sweep %s] restoring %s (finished trials are kept)", name, exp_dir)
        tuner = tune.Tuner.restore(str(exp_dir), trainable, resume_errored=True)
        concurrency = int(recorded.get("max_concurrent_trials", 0))  # Tune keeps the original
    else:
        if exp_dir.exists():
            _move_aside(exp_dir)
        concurrency = (max_concurrent_trials or cfg.sweep.max_concurrent_trials
                       or auto_max_concurrent(bundles, num_trials=num_trials))
        per_trial = bundles_total(bundles)
        log.info("[sweep %s] %d trials (%s search, %s scheduler), %d at once; each trial "
                 "reserves %s (%d actors x %s)", name, num_trials, cfg.sweep.search,
                 cfg.sweep.scheduler, concurrency, per_trial, cfg.sweep.actors_per_trial,
                 bundles[-1] if len(bundles) > 1 else {})
        sweeps.mkdir(parents=True, exist_ok=True)
        atomic_write_text(inputs_file, json.dumps(
            {"inputs": inputs, "max_concurrent_trials": concurrency,
             "space": json.loads(space_json(search_space))}, indent=1))
        from spice_ray.sweep.search import make_searcher

        searcher = make_searcher(cfg.sweep.search, search_space, cfg.sweep.seed,
                                 OPTIMISE_METRIC)
        tuner = engine.new_tuner(
            trainable, name=name, storage=str(sweeps), max_concurrent=concurrency,
            max_failures=0, callbacks=[callbacks.TrialProgress(name, num_trials),
                                       *tracking.tune_callbacks(cfg, name)],
            # a sampled search draws from its searcher's own (conditional) space
            param_space=dict(search_space) if searcher is None else {},
            metric=OPTIMISE_METRIC, mode="min", num_samples=cfg.sweep.num_samples,
            search_alg=searcher, scheduler=_scheduler(cfg), keep_checkpoints=1,
            verbose=verbose)
    grid = engine.fit(tuner, "spice_ray.sweep.tune", quiet=verbose == 0)
    if getattr(searcher, "repeats", 0):
        log.info("[sweep %s] %d draws repeated a configuration already run; they were told "
                 "its result, not run", name, searcher.repeats)
    if grid.num_errors:
        failed = [f"{(r.metrics or {}).get('trial_id', '?')} {params_json(r.config or {})}: "
                  f"{type(r.error).__name__}: {str(r.error).strip().splitlines()[-1:]}"
                  for r in grid if r.error is not None]
        raise SweepError(f"sweep {name}: {grid.num_errors} of {len(grid)} trials errored; "
                         f"re-run to resume them ({exp_dir}):\n  " + "\n  ".join(failed))

    infos, frames = [], []
    for info, rows in _trial_frames(grid, name, cfg.sweep.split):
        infos.append(info)
        frames.append(rows)
    trials = pd.DataFrame(infos)
    table = pd.concat(frames, ignore_index=True)
    dup = table.duplicated(["trial_id", "seed", "task_id", "metric", "x"])
    if dup.any():
        raise SweepError(f"sweep {name}: {int(dup.sum())} duplicated rows")
    from spice_ray.results.schema import settings_columns
    from spice_ray.results.tables import check_finite, write_frame

    check_finite(table, f"sweep {name}")
    typed = settings_columns(table)  # each row's settings as typed columns, as a study's tables
    table = pd.concat([table, typed.drop(columns=[c for c in typed if c in table])], axis=1)
    table_path = write_frame(sweeps / f"{name}.parquet", table, inputs=inputs)
    summary = summarise_sweep(table)
    summary_path = write_frame(sweeps / f"{name}_summary.parquet", summary, inputs=inputs)
    new = int((trials["finished_at"] >= t0).sum()) if "finished_at" in trials else len(trials)
    log.info("[sweep %s] %d trials (%d new), %d rows -> %s", name, len(trials), new,
             len(table), table_path)
    return SweepResult(name, table_path, summary_path, summary, trials, exp_dir, restored, new,
                       concurrency, time.time() - t0)
