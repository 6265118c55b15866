"""The dry run's plan (``full_run --dry-run``): stages, resources, expected sizes and times,
with the pretraining time of every model from optimiser steps timed in this process (on a GPU
preset planned without a GPU: from the steps' FLOP count)."""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING

import torch

from spice_ray.common.console import count, fmt_seconds
from spice_ray.config import ExperimentConfig, TrainConfig
from spice_ray.data.generate import generation_means, uses_ray_data
from spice_ray.evaluate import rates
from spice_ray.evaluate.online import applicable_specs
from spice_ray.runtime.resources import check_models, dataset_estimate, human_bytes, model_estimate
from spice_ray.study import tuning
from spice_ray.study.experiments import EXPERIMENTS, Experiment, ModelRef
from spice_ray.study.loss_weights import trained_models
from spice_ray.study.records import busy_seconds
from spice_ray.study.reporting import SIDE_BY_SIDE_TABLES, tables_of
from spice_ray.study.tune_grid import points_per_trial, rollout_steps
from spice_ray.train.loop import steps_per_epoch
from spice_ray.train.rates import step_flops, step_seconds

TASKS_PER_SECOND = 10_000
DATASET_START_SECONDS = 0.8
"""Tasks Ray Data generates and writes per second on the 2-core machine, after a start per
dataset (its plan, read and write tasks, manifest): fitted to the smoke study's datasets stage
(9 small datasets, 7.7 s) and the small study's (101,100 tasks, 16.9 s)."""
FIGURE_SECONDS = (0.4, 3.9e-5)
"""Seconds to draw one PNG on the 2-core machine: a fixed part, and a part per eval task and
online step of its experiment (the summaries it draws grow with them); fitted to the smoke
study's figure stage (48 in about 20 s) and the small study's (48 in 2 min 02 s)."""
TASK_START_SECONDS = 3.0
"""A Ray task worker's start and imports, which the figures stage pays once per CPU when it
draws the tables side by side."""
ACTOR_START_SECONDS = 3.5
"""The evaluation actors' start (processes, imports), paid once by the evaluation stage and
once by the tuning stage's trial processes (smoke study, 2026-11-26: its first tuned
experiment)."""
TUNE_START_SECONDS = 6.0
"""The tuning stage's Tune run beside its trials' work: its controller's start and end
(smoke study, 2026-11-27: 38 s of tuning against 21 s before it ran on Tune, with 111 trials)."""
TUNE_TRIAL_SECONDS = 0.1
"""The Tune controller's time per trial (75-100 ms on the 2-core machine, 2026-11-27), serial:
one trial per ``tune_grid.points_per_trial`` points."""
TUNE_EXPERIMENT_SECONDS = 1.0
"""Per tuned experiment, beside its rollouts: the validation split read, the width fitted on its
contexts, the checkpoints loaded in the actors (smoke study, 2026-11-26: 17 s of tuning against
6 s of rollouts and one actor start, over 8 experiments)."""
JOB_START_SECONDS = 13.0
"""A Ray Train job's own cost on 2 cores beside its steps: its worker group's start, each
worker's imports and first optimiser (torch's compiler stack is imported then), and its end
(a smoke job: 15.2 s, 2.3 s of it training, 2026-11-26)."""
GPU_FLOPS = (1e12, 10e12)
"""The range of FLOP/s a training step sustains on one GPU, for presets planned without one:
on an H100 the small models sustain 0.2-6.6 TFLOP/s (docs/cluster.md; a step there is bound
by kernel launches), larger widths and batches more."""

GPU_FLOPS_PLANNED = (GPU_FLOPS[0] * GPU_FLOPS[1]) ** 0.5
"""The rate a planned GPU step is timed at: the geometric middle of :data:`GPU_FLOPS`."""

if TYPE_CHECKING:
    from spice_ray.study import StudyPlan


def gpu_hours(flops: float) -> str:
    """GPU-hours of ``flops`` FLOPs of training steps at :data:`GPU_FLOPS`: how presets that
    ask for GPUs are planned where there is none."""
    low, high = (flops / rate / 3600 for rate in GPU_FLOPS[::-1])
    return (f"{flops / 1e15:,.1f} PFLOP, ~{low:,.1f}-{high:,.1f} GPU-hours at "
            f"{GPU_FLOPS[0] / 1e12:.0f}-{GPU_FLOPS[1] / 1e12:.0f} TFLOP/s sustained")


def side_by_side_seconds(model_seconds: list[float], tc: TrainConfig) -> float:
    """Wall seconds of training models of these step seconds (in the job's order): with
    ``train.together``, model i on worker i mod n, the slowest worker's sum; otherwise one
    after another (data-parallel workers share each model's batch, which the per-worker step
    time already counts)."""
    n = max(1, tc.num_workers) if tc.together else 1
    return busy_seconds((i % n, seconds) for i, seconds in enumerate(model_seconds))


def describe_plan(plan: StudyPlan) -> str:
    """What ``run_study`` would do: stages, resources, expected sizes and rough times. A first
    pass collects the rollouts to probe, which are then timed side by side, as many at once as
    evaluation actors run (``eval.num_actors``, at most one per CPU: :func:`rates.probe_all`),
    and a second pass writes the plan with their times."""
    with rates.collecting() as wanted:
        _describe(plan)
    actors = max((c.eval.num_actors for c in plan.configs.values()), default=1)
    usable = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")  # Linux
              else os.cpu_count() or 1)
    rates.probe_all(wanted, min(actors, usable))
    return _describe(plan)


def _describe(plan: StudyPlan) -> str:
    load, cpus = os.getloadavg()[0], os.cpu_count() or 1
    lines = [f"run directory: {plan.run_dir}", ""]
    if load > 0.5 * cpus:  # every time below that is timed now is timed on a shared machine
        slower = max(1.0, load / cpus)
        lines[1:1] = [f"note: this machine is busy (load average {load:.1f} on {cpus} cores): "
                      f"the times timed now (steps, rollouts) are about {slower:.1f}x a quiet "
                      "machine's"]
    w = max(9, *(len(name) for name in plan.configs))  # the experiments' column
    total_bytes = 0
    data_seconds = 0.0
    lines.append("stage 1 datasets "
                 f"({generation_means([c.data for c in plan.configs.values()])}):")
    for name, cfg in plan.configs.items():
        n, size, _ = dataset_estimate(cfg)
        total_bytes += size
        if uses_ray_data(cfg.data):
            seconds = DATASET_START_SECONDS + n / TASKS_PER_SECOND
            how = (f"{cfg.data.concurrent_tasks} Ray Data tasks at once x {cfg.data.task_cpus} "
                   f"CPU, ~{seconds:.0f} s at the 2-core rate ({TASKS_PER_SECOND} tasks/s after "
                   f"~{DATASET_START_SECONDS} s of start)")
        else:
            seconds = n / TASKS_PER_SECOND
            how = f"in the driver, ~{seconds:.1f} s ({TASKS_PER_SECOND} tasks/s, no start)"
        data_seconds += seconds
        lines.append(f"  {name:{w}s} {n:>8d} tasks, ~{size / 2**20:8.1f} MiB, {how}")
    planned = [c.train.use_gpu is True and not torch.cuda.is_available()
               for c in plan.configs.values()]
    gpu_planned = any(planned)  # pretraining asks for GPUs this process does not have
    lines.append("stage 2 pretraining (Ray Train; " + (
        f"times from each step's FLOP count at {GPU_FLOPS_PLANNED / 1e12:.1f} TFLOP/s a GPU: "
        "none here to time one" if all(planned) else "times from steps timed now, 1 thread")
        + "):")
    if load > 0.5 * cpus and not all(planned):  # steps timed on a machine others are using
        lines.append(f"  (the machine is busy: load average {load:.1f} on {cpus} cores, so "
                     "these step times are slower than a quiet machine's)")
    train_seconds = total_flops = 0.0
    too_big: set[str] = set()  # experiments whose models cannot fit: nothing is timed
    for name, cfg in plan.configs.items():
        models: tuple[ModelRef, ...] = tuple(m for m in trained_models(EXPERIMENTS[name], cfg)
                                             if not m.same_as)
        steps, tc = cfg.train.epochs * steps_per_epoch(cfg), cfg.train
        n_models, n_seeds = count(len(models), "model"), count(len(cfg.seeds), "seed")
        lines.append(f"  {name:{w}s} {n_models} x {n_seeds}, "
                     f"{tc.epochs} epochs, {steps} steps of batch {tc.batch_size} x "
                     f"T={cfg.env.horizon} each; "
                     + ("all in one job, " if tc.together and tc.num_workers else "")
                     + f"{count(tc.num_workers, 'worker')} "
                     + (f"({tc.worker_gpus:g} GPU each)" if tc.use_gpu is True
                        else f"({tc.worker_cpus} CPU each)"))
        gpu = tc.on_gpu(torch.cuda.is_available()) and torch.cuda.is_available()
        fits = not check_models([cfg])  # never build a model to time it that cannot fit
        if not fits:
            too_big.add(name)
        step_of: dict[str, float] = {}
        gpus_per_model = tc.worker_gpus * (1 if tc.together else max(1, tc.num_workers))
        for kind in sorted({m.kind for m in models}):
            size = model_estimate(cfg, kind)
            if not fits:  # the error below names it
                lines.append(f"  {'':{w}s} {kind}: {size.params:,} parameters: does not fit")
                continue
            count_of = len(cfg.seeds) * sum(m.kind == kind for m in models)
            memory = (f"  {'':{w}s} {kind}: {size.params:,} parameters, ~"
                      f"{human_bytes(size.worker_bytes)} per worker (weights, gradients, "
                      f"AdamW {human_bytes(size.state_bytes)}; activations "
                      f"{human_bytes(size.activation_bytes)})")
            if tc.use_gpu is True and not gpu:  # GPU steps cannot be timed here, and a CPU's rate
                # says nothing of them (a paper-size step takes seconds to time): FLOPs
                per_step = step_flops(cfg, kind)
                flops = per_step * steps * count_of
                total_flops += flops
                step_of[kind] = per_step / GPU_FLOPS_PLANNED
                lines.append(f"{memory}; no GPU here to time it: {gpu_hours(flops)}")
                continue
            step = step_of[kind] = step_seconds(cfg, kind, device="cuda" if gpu else "cpu")
            seconds = step * steps * count_of
            lines.append(f"{memory}; {step * 1e3:.0f} ms/step on {'GPU' if gpu else 'CPU'}: "
                         f"~{fmt_seconds(seconds)} of steps"
                         + (f", {seconds * gpus_per_model / 3600:.2f} GPU-hours" if gpu else ""))
        if step_of:
            wall = side_by_side_seconds([step_of[m.kind] * steps for m in models
                                         for _ in cfg.seeds], tc)
            train_seconds += wall
            if tc.together and tc.num_workers > 1:
                lines.append(f"  {'':{w}s} side by side on {tc.num_workers} workers: "
                             f"~{fmt_seconds(wall)}")
    jobs = sum(c.train.on_ray_train and name not in too_big
               for name, c in plan.configs.items())  # one job per experiment (together)
    train_seconds += jobs * JOB_START_SECONDS
    lines.append(f"  all models: ~{fmt_seconds(train_seconds)} "
                 + (f"with the start of {count(jobs, 'job')} (~{JOB_START_SECONDS:.0f} s each "
                    "on 2 cores: Ray Train's worker group, the workers' imports)" if jobs
                    else "in the driver (train.num_workers=0: no Ray Train job to start)")
                 + (f"; train.use_gpu asks for GPUs, none in this process: timed from the "
                    f"steps' FLOPs at {GPU_FLOPS_PLANNED / 1e12:.1f} TFLOP/s a GPU (the "
                    f"middle of {gpu_hours(total_flops)})" if total_flops else ""))
    lines.append("stage 3 tuning on validation tasks (Ray Tune trials; times from online "
                 "rollouts probed now, 1 thread per trial):")
    tune_seconds = 0.0
    for name, cfg in plan.configs.items():
        exp = EXPERIMENTS[name]
        n_val = min(cfg.eval.num_tasks, cfg.data.num_val_tasks)
        methods, points, seconds = 0, 0, 0.0
        for ev_name in exp.tuned if name not in too_big else ():
            ev = exp.evaluation(ev_name)
            seeds = len(cfg.seeds) if ev.model else 1
            for s in tuning.bases(ev.agents(cfg), cfg):
                # every width the tuning stage will weigh: the fit's constant one where its
                # decay is not 0 (counted), the predictive head's where the model has one
                planned = {"scale": 1.0, "decay": 1.0, "constant_scale": 1.0,
                           "predictive": cfg.model.var_head}
                grid = len(tuning.candidates(s, cfg.eval, planned))
                methods, points = methods + 1, points + grid
                # the grid's points shared out over the actors, each on every task
                seconds += grid * seeds * rates.rollout_seconds(
                    cfg, s, ev.model.kind if ev.model else None, n_val) / max(
                    1, cfg.eval.num_actors)
        if name in too_big:
            lines.append(f"  {name:{w}s} its models do not fit: not timed")
            continue
        if not points:
            lines.append(f"  {name:{w}s} nothing to tune (a fixed protocol)")
            continue
        steps = rollout_steps(n_val, cfg.eval, len(cfg.seeds))
        seconds += TUNE_EXPERIMENT_SECONDS + TUNE_TRIAL_SECONDS * math.ceil(
            points / points_per_trial(steps))
        tune_seconds += seconds
        lines.append(f"  {name:{w}s} {count(methods, 'method')}, "
                     f"{count(points, 'grid point')} (x {count(len(cfg.seeds), 'seed')} where "
                     f"trained) on {n_val} validation tasks: ~{fmt_seconds(seconds)}")
    tune_seconds += ACTOR_START_SECONDS + TUNE_START_SECONDS if tune_seconds else 0.0
    lines.append("stage 4 evaluation (Ray actors; online rollouts as probed above):")
    eval_seconds = ACTOR_START_SECONDS  # the stage's own actors
    for name, cfg in plan.configs.items():
        seconds = evaluation_seconds(EXPERIMENTS[name], cfg) if name not in too_big else 0.0
        eval_seconds += seconds
        lines.append(f"  {name:{w}s} {cfg.eval.num_tasks} tasks, H={cfg.eval.online_horizon}, "
                     f"{count(cfg.eval.num_actors, 'actor')} x {cfg.eval.actor_cpus} CPU"
                     + (f" + {cfg.eval.actor_gpus} GPU" if cfg.eval.actor_gpus else "")
                     + f": ~{fmt_seconds(seconds)}")
    n_tables = n_figures = 0
    figure_seconds = 0.0
    for name, cfg in plan.configs.items():
        tables = [t for t in tables_of({name: cfg}) if t.figures]
        figures = sum(len(t.figures) for t in tables)
        steps = cfg.eval.num_tasks * cfg.eval.online_horizon * cfg.eval.episodes
        n_tables, n_figures = n_tables + len(tables), n_figures + figures
        figure_seconds += figures * (FIGURE_SECONDS[0] + FIGURE_SECONDS[1] * steps)
    side = n_tables >= SIDE_BY_SIDE_TABLES
    if side:  # shared out over the CPUs, plus the task workers' start (smoke: 13.3 s vs 16.9)
        figure_seconds = figure_seconds / cpus + TASK_START_SECONDS
    total = data_seconds + train_seconds + tune_seconds + eval_seconds + figure_seconds
    lines += [f"stage 5 figures: {n_figures} PNG files of {n_tables} tables, "
              f"~{fmt_seconds(figure_seconds)} at the 2-core rate"
              + (f", drawn side by side on {count(cpus, 'CPU')}" if side else "")
              + "; stage 6 report.md", "",
              f"datasets on disk: ~{human_bytes(total_bytes)}"]
    cpu_seconds = data_seconds + tune_seconds + eval_seconds + figure_seconds
    if gpu_planned:
        lines += [f"GPU part (pretraining, from the steps' FLOPs at "
                  f"{GPU_FLOPS_PLANNED / 1e12:.1f} TFLOP/s a GPU): ~{fmt_seconds(train_seconds)}",
                  f"CPU part, on this machine's {count(cpus, 'core')} (datasets "
                  f"~{fmt_seconds(data_seconds)}, tuning ~{fmt_seconds(tune_seconds)}, "
                  f"evaluation ~{fmt_seconds(eval_seconds)}, figures "
                  f"~{fmt_seconds(figure_seconds)}): ~{fmt_seconds(cpu_seconds)}",
                  "does not fit this machine: its pretraining asks for GPUs (train.use_gpu) "
                  "and there are none here; run it on a cluster with GPUs (ray up "
                  "cluster.yaml, then --address auto), or --set train.use_gpu=false to train "
                  "on CPUs (much slower)"]
    else:
        lines.append(f"whole study: ~{fmt_seconds(total)} "
                     f"(datasets ~{fmt_seconds(data_seconds)}, pretraining "
                     f"~{fmt_seconds(train_seconds)}, tuning ~{fmt_seconds(tune_seconds)}, "
                     f"evaluation ~{fmt_seconds(eval_seconds)}, figures "
                     f"~{fmt_seconds(figure_seconds)}); a stage whose outputs are current is "
                     "skipped")
    if cpu_seconds > DAY_SECONDS:
        lines.append(f"the CPU stages alone would take ~{fmt_seconds(cpu_seconds)} here, more "
                     "than a day: a cluster shares them out over its nodes' CPUs")
    return "\n".join(lines)


DAY_SECONDS = 86_400.0
"""Beyond this the plan says that its CPU stages do not fit the machine it is planned on."""


def evaluation_seconds(exp: Experiment, cfg: ExperimentConfig) -> float:
    """Seconds of the evaluation stage's online rollouts of ``exp`` on one actor's share of
    the eval tasks: every evaluation's online agents per training seed (once more per
    robustness noise level), and the tuned table's methods at their choice (SPICE also at the
    paper's width). The offline and calibration protocols (one pass over fixed contexts, no
    rollout) are not counted."""
    env = cfg.environment()
    tasks = rates.actor_tasks(cfg, cfg.eval.num_tasks)
    own = [float(env.params.sigma)] if "robustness" in env.protocols else [0.0]
    seconds = 0.0
    for ev in exp.evaluations:
        if not {"online", "robustness"} & set(ev.protocols):
            continue
        levels = len(dict.fromkeys(own + [float(s) for s in cfg.eval.robustness_sigmas])) \
            if "robustness" in ev.protocols else 1
        kind = ev.model.kind if ev.model else None
        seeds = len(cfg.seeds) if ev.model else 1
        tuned = ev.name in exp.tuned
        for s in applicable_specs(ev.agents(cfg), env, cfg.eval, online=True):
            rollout = rates.rollout_seconds(cfg, s, kind, tasks)
            seconds += seeds * levels * rollout
        for s in tuning.bases(ev.agents(cfg), cfg) if tuned else ():
            seconds += seeds * (2 if s.info.scales_width else 1) * rates.rollout_seconds(
                cfg, s, kind, tasks)
    return seconds
