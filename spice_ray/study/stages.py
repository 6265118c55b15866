"""The whole study: datasets -> pretraining -> evaluation -> result tables -> figures -> report.

The experiments are data (``spice_ray.study.experiments``); this module runs any of them the same
way. Every stage is skipped when its output already holds a complete result for the same
inputs: datasets and checkpoints by their manifests, result tables by their SHA-256 sidecar
``results/<table>.parquet.sha256``, which also records a hash of everything the table was
computed from (by content, so a copied run directory stays current).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from spice_ray import envs
from spice_ray.agents import AgentSpec
from spice_ray.common.artifacts import is_current
from spice_ray.common.console import SILENT, Console, count
from spice_ray.common.errors import enter_stage
from spice_ray.config import (
    ConfigError,
    ExperimentConfig,
    config_hash,
    make_config,
    resolve_run_dir,
    without_later_defaults,
)
from spice_ray.data import store
from spice_ray.data.generate import generate_stage, generation_means
from spice_ray.evaluate.actors import EvalPool, evaluate_parallel
from spice_ray.fusion import WIDTH_DECAY_DEFAULT, WIDTH_SCALE_DEFAULT, WIDTH_SOURCE_DEFAULT
from spice_ray.model import checkpoint as ckpt
from spice_ray.results import aggregate
from spice_ray.results.choices import fitted_decay, fitted_noise, fitted_scale
from spice_ray.results.figure_files import extra_formats
from spice_ray.results.schema import NO_SEED, settings_of
from spice_ray.results.tables import table_path, write
from spice_ray.runtime import tracking
from spice_ray.runtime.tasks import map_unordered
from spice_ray.study import tuning
from spice_ray.study.experiments import (
    DEFAULT_EXPERIMENTS,
    EXPERIMENTS,
    VARIANT,
    Table,
    experiment_named,
)
from spice_ray.study.loss_weights import check_choose, choose_models, trained_models
from spice_ray.study.records import (
    Finals,
    busy_seconds,
    check_same_study,
    write_checkpoint_index,
    write_timing,
)
from spice_ray.study.reporting import (
    SIDE_BY_SIDE_TABLES,
    aggregated,
    draw_figures,
    figure_tables,
    run_configs,
    tables_of,
    write_study_report,
)
from spice_ray.study.tune_grid import tune_all
from spice_ray.study.tuned import write_tuned_table
from spice_ray.study.tuning import agent_specs
from spice_ray.train.together import ModelSpec, on_local_gpu, pretrain_many

log = logging.getLogger(__name__)


@dataclass
class StudyPlan:
    """Validated configs of every experiment, built before any work starts."""

    configs: dict[str, ExperimentConfig]
    run_dir: Path
    experiments: tuple[str, ...] = DEFAULT_EXPERIMENTS
    timings: dict[str, float] = field(default_factory=dict)
    """Wall seconds of each stage in this invocation (0-ish when skipped)."""
    units: list[dict[str, Any]] = field(default_factory=list)
    """Wall seconds of each model and evaluation: {"stage", "experiment", "what", "seconds"};
    with ``timings``, ``<run>/logs/timing.json``."""
    figure_formats: tuple[str, ...] = ("png",)
    """Figure formats (``plots.FORMATS``): PNG always, PDF / SVG copies beside it on request."""


def _env_field(key: str) -> str | None:
    """``env.<field>`` of an override ``env.<field>=value`` (None for other keys)."""
    name = key.split("=", 1)[0].strip()
    return name[4:] if name.startswith("env.") and name.count(".") == 1 else None


def _env_fields(env: str) -> set[str]:
    return {"name", "horizon"} | {f.name for f in dataclasses.fields(envs.env_class(env).Params)}


def plan_study(preset: str, out: str | Path | None, yaml_path: str | Path | None = None,
               overrides: list[str] | tuple[str, ...] = (),
               experiments: tuple[str, ...] = DEFAULT_EXPERIMENTS, variant: str = ""
               ) -> StudyPlan:
    """Resolve and validate the config of every experiment.

    The user's overrides apply to every experiment, except that ``env.<field>`` applies only
    to the experiments whose environment has that field (``env.num_arms`` to the bandits,
    ``env.grid_size`` to darkroom); a field no chosen environment has is an error.

    Raises:
        ConfigError: naming the experiment and the field, before any work.
    """
    run_dir = resolve_run_dir(out, preset, yaml_path, overrides)
    if not experiments:
        raise ConfigError(f"no experiment chosen: name one or more of {list(EXPERIMENTS)}")
    unknown = [e for e in experiments if e not in EXPERIMENTS]
    if unknown:
        raise ConfigError(f"experiment {unknown[0]!r} is invalid: one of {list(EXPERIMENTS)}")
    used: set[str] = set()
    cfgs = {}
    for base in experiments:
        try:  # a variant: the experiment under a name of its own (experiments.VARIANT)
            exp = experiment_named(f"{base}{VARIANT}{variant}" if variant else base)
        except ValueError as exc:
            raise ConfigError(f"--variant {variant!r} is invalid: {exc}") from None
        name = exp.name
        fields = _env_fields(exp.env)
        mine = [o for o in overrides if _env_field(o) is None or _env_field(o) in fields]
        used |= set(mine)
        sets = [*exp.overrides, *exp.preset_overrides.get(preset, ()), *mine]
        try:
            cfgs[name] = make_config(preset, exp.env, yaml_path=yaml_path, overrides=sets,
                                     extra={"out_dir": str(run_dir)})
        except ConfigError as exc:
            raise ConfigError(f"experiment {name}: {exc}") from exc
    for item in overrides:
        if item not in used:
            raise ConfigError(f"--set {item!r}: no chosen experiment's environment has "
                              f"env.{_env_field(item)}")
    gpu = _local_gpu()
    cfgs = {name: cfg.replace(train=on_local_gpu(cfg.train, gpu)) for name, cfg in cfgs.items()}
    for name, cfg in cfgs.items():
        check_same_study(run_dir, name, cfg)
        check_choose(name, EXPERIMENTS[name], cfg)
    return StudyPlan(cfgs, run_dir, tuple(cfgs))


def _local_gpu() -> bool:
    """Whether this process has a GPU: where ``train.use_gpu=auto`` (the default) trains."""
    import torch

    return torch.cuda.is_available()


# ---- stage 2: pretraining ----------------------------------------------------------------


def draw_side_by_side(fn: Callable[..., str], jobs: list[tuple[Any, ...]]) -> Iterator[str]:
    """The figures stage's tables drawn side by side as Ray tasks, one CPU each, when there are
    at least :data:`SIDE_BY_SIDE_TABLES` (the same PNG bytes), else one after another in the
    driver."""
    return map_unordered(fn, jobs, num_cpus=1.0, min_jobs=SIDE_BY_SIDE_TABLES)


def pretrain_all(plan: StudyPlan, datasets: dict[str, Path], console: Console = SILENT
                 ) -> Finals:
    """Train every model of every experiment, each skipped when current.

    With ``train.together`` (the default) each experiment's models -- every kind, variant and
    seed -- train in one Ray Train job (one start-up per experiment); otherwise one job each.
    """
    finals: Finals = {}
    for i, (name, cfg) in enumerate(plan.configs.items(), 1):
        models = trained_models(EXPERIMENTS[name], cfg)
        keys = [(m, seed) for m in models if not m.same_as for seed in cfg.seeds]
        specs = [ModelSpec(m.config(cfg), m.kind, seed, m.label(seed)) for m, seed in keys]
        log.info("[pretrain %d/%d] %s: %s", i, len(plan.configs), name,
                 ", ".join(s.name for s in specs))
        paths, timing = pretrain_many(specs, datasets[name], console=console,
                                      label=f"{i}/{len(plan.configs)} {name}")
        for (m, seed), path in zip(keys, paths, strict=True):
            finals[(name, m.kind, m.variant, seed)] = path
        for m in models:  # variants that train exactly as another: its checkpoints
            for seed in cfg.seeds if m.same_as else ():
                finals[(name, m.kind, m.variant, seed)] = finals[(name, m.kind, m.same_as, seed)]
        fits = [{"stage": "pretrain", "experiment": name, "what": what, "part": "fit",
                 "worker": timing["worker"].get(what, 0), "seconds": sec}
                for what, sec in timing["models"].items()]
        plan.units += fits
        plan.units.append({"stage": "pretrain", "experiment": name,
                           "what": "start-up and data" if fits else
                           f"{count(len(specs), 'model')}, {count(timing['jobs'], 'job')}",
                           "part": "start-up" if fits else "jobs",
                           "seconds": timing["seconds"] - busy_seconds(
                               (u["worker"], u["seconds"]) for u in fits)})
    return finals


# ---- stage 3: evaluation -----------------------------------------------------------------


def _tables_done(run_dir: Path, name: str, tables: list[str], inputs_hash: str) -> bool:
    """Whether every table is intact (its SHA-256 sidecar matches) and made from these inputs.
    Every table that exists but is not (corrupt, truncated, made from other inputs) is named,
    with why, in one warning: the experiment is recomputed."""
    states = {t: is_current(table_path(run_dir, t), inputs_hash) for t in tables}
    stale = [f"{t} ({reason})" for t, (current, reason) in states.items()
             if not current and reason != "missing"]
    if stale:
        log.warning("[evaluate] %s: recomputing %s: %s", name, count(len(stale), "table"),
                    "; ".join(stale))
    return all(current for current, _ in states.values())


def evaluate_experiment(plan: StudyPlan, name: str, dataset: Path, finals: Finals,
                        console: Console = SILENT, pool: EvalPool | None = None,
                        width_scale: float | None = None, noise_var: float | None = None,
                        width_decay: float = WIDTH_DECAY_DEFAULT) -> list[str]:
    """Every evaluation of experiment ``name`` and its tables (skipped when current), on the
    actors of ``pool`` (default: a pool for this experiment).

    Args:
        width_scale: the learned prior's width scale the tuning stage fitted on validation
            (``results.choices.fitted_scale``): evaluations with the calibration protocol
            also run at it (and, with ``model.var_head``, at the predictive head's width), so
            the prior tables hold coverage and N_pri for every width source (said by the rows'
            config), at ``noise_var``, the likelihood variance fitted with it (None: config's).
        width_decay: how that width narrows with the context length (``fitted_decay``).
    """
    if pool is None:
        with EvalPool() as own:
            return evaluate_experiment(plan, name, dataset, finals, console, own, width_scale,
                                       noise_var, width_decay)
    exp, cfg = EXPERIMENTS[name], plan.configs[name]
    tables = [t.name for t in exp.tables_for(cfg)]
    specs = agent_specs(exp, cfg, dataset)
    if not any("calibration" in ev.protocols for ev in exp.evaluations):
        width_scale = noise_var = None  # nothing here reads them: the tables do not depend on it
        width_decay = WIDTH_DECAY_DEFAULT
    inputs = config_hash({
        "eval": dataclasses.asdict(cfg.eval), "fusion": without_later_defaults(
            "fusion", dataclasses.asdict(cfg.fusion)),
        "specs": {k: [s.config_json(cfg.eval) + s.rule() + s.label for s in v]
                  for k, v in specs.items()},
        "ckpts": {f"{k[1]}/{k[2]}/{k[3]}": ckpt.content_id(p)
                  for k, p in sorted(finals.items()) if k[0] == name},
        "data": store.split_id(dataset, "eval"),
        **({"width_scale": width_scale} if width_scale is not None else {}),
        **({"noise_var": noise_var} if noise_var is not None else {}),
        **({"width_decay": width_decay} if width_decay else {})})
    if _tables_done(plan.run_dir, name, tables, inputs):
        log.info("[evaluate] %s: tables are current, skipped", name)
        console.line(f"  {name}: {count(len(tables), 'table')} current, skipped")
        return tables
    data = store.load_split(dataset, "eval", limit=cfg.eval.num_tasks)
    rows: dict[str, list[pd.DataFrame]] = {ev.name: [] for ev in exp.evaluations}
    runs = [(ev, seed, specs[ev.name], ev.protocols) for ev in exp.evaluations
            for seed in (cfg.seeds if ev.model else (NO_SEED,))]
    calibrated = [(ev, seed, ev_specs) for ev, seed, ev_specs, protocols in runs
                  if "calibration" in protocols]
    if width_scale is not None and (width_scale != WIDTH_SCALE_DEFAULT or width_decay):
        # the fitted width too
        runs += [(ev, seed, [_at_width(ev_specs, width_scale, noise_var, width_decay)],
                  ("calibration",)) for ev, seed, ev_specs in calibrated]
    if cfg.model.var_head:  # and the predictive-variance head's
        runs += [(ev, seed, [_at_width(ev_specs, 1.0, noise_var, source="predictive")],
                  ("calibration",)) for ev, seed, ev_specs in calibrated]
    bar = console.bar(f"{name}: {len(runs)} evaluations", len(runs) * len(data["task_id"]),
                      "task")
    for k, (ev, seed, ev_specs, protocols) in enumerate(runs, 1):
        width = "" if ev_specs is specs[ev.name] else ev_specs[0].fusion.width_source
        what = (f"{ev.name}{f' seed {seed}' if ev.model else ''}"
                + {"": "", "predictive": " (predictive width)"}.get(width, " (fitted width)"))
        log.info("[evaluate] %s: %s", name, what)
        bar.update(status=f"{k}/{len(runs)} {what}")
        source = str(finals[(name, ev.model.kind, ev.model.variant, seed)]) \
            if ev.model else None
        t0 = time.perf_counter()
        try:
            df = evaluate_parallel(source, cfg.env, cfg.eval, data, ev_specs, protocols,
                                   seed=seed, on_tasks=bar.update, pool=pool)
        except BaseException as exc:
            bar.abort(exc, what)
            raise
        plan.units.append({"stage": "evaluate", "experiment": name, "what": what,
                           "seconds": time.perf_counter() - t0})
        rows[ev.name].append(df.assign(variant=ev.model.variant if ev.model else ""))
    if cfg.eval.ppo_episodes > 0 and any(s.evaluation == "ppo" for t in exp.tables
                                          for s in t.rows):
        rows["ppo"] = [_ppo_rows(cfg, data)]
    frames = {k: pd.concat(v, ignore_index=True) for k, v in rows.items() if v}
    for table in exp.tables_for(cfg):
        parts = []
        for sel in table.rows:
            if sel.evaluation not in frames:  # an optional evaluation that did not run (ppo)
                continue
            df = frames[sel.evaluation]
            if sel.where is not None:
                df = df[sel.where(df, cfg)]
            if sel.variant is not None:
                df = df.assign(variant=sel.variant)
            parts.append(df)
        df = pd.concat(parts, ignore_index=True)
        df = df[df["metric"].isin([*table.metrics, *table.rename])]
        df = df.assign(metric=df["metric"].replace(dict(table.rename)))
        write(plan.run_dir, table.name, df, inputs=inputs, description=table.description)
    bar.close(f"{count(len(tables), 'table')}: {', '.join(tables)}")
    return tables


def _at_width(specs: list[AgentSpec], width_scale: float, noise_var: float | None,
              width_decay: float = WIDTH_DECAY_DEFAULT,
              source: str = WIDTH_SOURCE_DEFAULT) -> AgentSpec:
    """The calibration protocol's spec (the evaluation's first fused one, whose fusion the
    rows describe) with the learned prior's width from ``source`` (``fusion.width_source``),
    scaled by ``width_scale`` and narrowed with h by ``width_decay`` (and the likelihood
    variance ``noise_var`` where one was fitted)."""
    spec = next(s for s in specs if s.info.fused)
    noise = {"noise_var": noise_var} if noise_var is not None else {}
    return dataclasses.replace(spec, fusion=dataclasses.replace(
        spec.fusion, width_scale=width_scale, width_decay=width_decay, width_source=source,
        **noise))


def _ppo_rows(cfg: ExperimentConfig, data: dict) -> pd.DataFrame:
    """The single-task PPO reference (``eval.ppo_episodes > 0``; needs the ``ppo`` extra)."""

    from spice_ray.evaluate.ppo import ppo_rows

    log.info("[evaluate] single-task PPO, %d episodes per task", cfg.eval.ppo_episodes)
    ppo = ppo_rows(data, cfg.env, cfg.eval, cfg.eval.ppo_episodes, seed=0)
    episode = ppo["config"].map(lambda c: f"episode {settings_of(c)['episode']}")
    return ppo.assign(seed=NO_SEED, variant=episode)


# ---- stages 5-6: figures and report ------------------------------------------------------


def study_tables(plan: StudyPlan, datasets: dict[str, Path] | None = None) -> list[Table]:
    """Every table of the plan's experiments in report order (``reporting.tables_of``)."""
    return tables_of(plan.configs, datasets)


def run_study(plan: StudyPlan, console: Console = SILENT) -> Path:
    """Run every stage (each skipped when current); returns the report's path.

    Args:
        console: shows a header per stage and a progress bar per dataset, model and
            experiment's evaluation.
    """
    run_dir = plan.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    for name, cfg in plan.configs.items():
        cfg.write(run_dir / "configs", f"{name}.yaml")
    first = next(iter(plan.configs.values()))
    first.write(run_dir)  # config.yaml: the first experiment's resolved config
    t0 = time.perf_counter()
    means = generation_means([cfg.data for cfg in plan.configs.values()])
    console.stage(1, 6, "datasets", f"{len(plan.configs)} ({means})")
    datasets = {}
    for name, cfg in plan.configs.items():
        enter_stage("1/6 datasets", name)
        datasets[name] = generate_stage(cfg, console=console, label=name).dataset_dir
    plan.timings["datasets"] = time.perf_counter() - t0

    t1 = time.perf_counter()
    enter_stage("2/6 pretrain")
    n_models = sum(len([m for m in trained_models(EXPERIMENTS[n], c) if not m.same_as])
                   * len(c.seeds)
                   for n, c in plan.configs.items())
    in_driver = [not c.train.on_ray_train for c in plan.configs.values()]
    runner = ("in the driver: train.num_workers=0" if all(in_driver) else
              "Ray Train" + ("; in the driver where train.num_workers=0" if any(in_driver)
                             else ""))
    console.stage(2, 6, "pretrain", f"{count(n_models, 'model')} ({runner})")
    finals = pretrain_all(plan, datasets, console)
    write_checkpoint_index(run_dir, finals)
    plan.timings["pretrain"] = time.perf_counter() - t1

    t2 = time.perf_counter()
    enter_stage("3/6 tune")
    console.stage(3, 6, "tune", "every method's settings on validation tasks (Ray Tune)")
    models = choose_models(plan.configs, run_dir, datasets, finals, console)
    tuned = tune_all(plan.configs, run_dir, datasets, finals, console, models)
    plan.timings["tune"] = time.perf_counter() - t2
    with EvalPool() as pool:  # the actors start once for every evaluation
        t3 = time.perf_counter()
        enter_stage("4/6 evaluate")
        console.stage(4, 6, "evaluate",
                      f"{count(len(plan.configs), 'experiment')} (Ray actors)")
        for name in plan.configs:
            evaluate_experiment(plan, name, datasets[name], finals, console, pool,
                                fitted_scale(tuned.get(name)), fitted_noise(tuned.get(name)),
                                fitted_decay(tuned.get(name)))
            if name in tuned:
                started = time.perf_counter()
                if write_tuned_table(name, plan.configs[name], run_dir, datasets[name], finals,
                                     pool, tuned[name], console):
                    plan.units.append({"stage": "evaluate", "experiment": name,
                                       "what": "tuned table",
                                       "seconds": time.perf_counter() - started})
    plan.timings["evaluate"] = time.perf_counter() - t3

    enter_stage("5/6 figures")
    t4 = time.perf_counter()
    every = run_configs(run_dir, plan.configs)  # and what earlier invocations ran here
    drawn = figure_tables(run_dir, every)
    console.stage(5, 6, "figures", f"{count(len(drawn), 'table')} (matplotlib)")
    bar = console.bar("figures", len(drawn), "table")
    try:
        with extra_formats(plan.figure_formats):
            figures = draw_figures(run_dir, drawn, lambda name: bar.update(1, status=name),
                                   draw_side_by_side)
            across = aggregate.study_aggregate(run_dir, aggregated(every))
    except BaseException as exc:
        bar.abort(exc)
        raise
    plan.timings["figures"] = time.perf_counter() - t4
    pngs = sum(len(v) for v in figures.values()) + bool(across)
    also = "".join(f", {pngs} {f.upper()}" for f in plan.figure_formats if f != "png")
    bar.close(f"{count(pngs, 'PNG file')}{also}")
    enter_stage("6/6 report")
    report = write_study_report(run_dir, every, finals, figures, across, plan.timings,
                                plan.units)
    plan.timings["total"] = time.perf_counter() - t0
    write_timing(run_dir, plan.timings, plan.units)
    console.stage(6, 6, "report", str(report))
    if first.track != "none":
        tracking.log_study(first, run_dir, "study", *tuning.headline(run_dir, list(plan.configs)),
                           checkpoints=finals)
        console.line(f"  tables, figures, report and final checkpoints logged to {first.track}")
    return report
