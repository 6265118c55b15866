"""The dry run's plan (``full_run --dry-run``): stages, resources, expected sizes and times,
with the pretraining time of every model from optimiser steps timed in this process."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import torch

from spice_ray.common.console import count, fmt_seconds
from spice_ray.config import TrainConfig
from spice_ray.runtime.resources import check_models, dataset_estimate, human_bytes, model_estimate
from spice_ray.study import tuning
from spice_ray.study.experiments import EXPERIMENTS, ModelRef
from spice_ray.study.loss_weights import trained_models
from spice_ray.study.records import busy_seconds
from spice_ray.train.loop import steps_per_epoch
from spice_ray.train.rates import step_seconds

if TYPE_CHECKING:
    from spice_ray.study import StudyPlan


def side_by_side_seconds(model_seconds: list[float], tc: TrainConfig) -> float:
    """Wall seconds of training models of these step seconds (in the job's order): with
    ``train.together``, model i on worker i mod n, the slowest worker's sum; otherwise one
    after another (data-parallel workers share each model's batch, which the per-worker step
    time already counts)."""
    n = max(1, tc.num_workers) if tc.together else 1
    return busy_seconds((i % n, seconds) for i, seconds in enumerate(model_seconds))


def describe_plan(plan: StudyPlan) -> str:
    """What ``run_study`` would do: stages, resources, expected sizes and rough times."""
    lines = [f"run directory: {plan.run_dir}", ""]
    w = max(9, *(len(name) for name in plan.configs))  # the experiments' column
    total_bytes = 0
    lines.append("stage 1 datasets (Ray Data tasks):")
    for name, cfg in plan.configs.items():
        n, size, _ = dataset_estimate(cfg)
        total_bytes += size
        lines.append(f"  {name:{w}s} {n:>8d} tasks, ~{size / 2**20:8.1f} MiB, "
                     f"{cfg.data.concurrent_tasks} tasks at once x {cfg.data.task_cpus} CPU, "
                     f"~{n / 4000:.0f} s at the 2-core rate of 4000 tasks/s")
    lines.append("stage 2 pretraining (Ray Train; times from steps timed now, 1 thread):")
    load, cpus = os.getloadavg()[0], os.cpu_count() or 1
    if load > 0.5 * cpus:  # the steps are timed on a machine others are using
        lines.append(f"  (the machine is busy: load average {load:.1f} on {cpus} cores, so "
                     "these step times are slower than a quiet machine's)")
    train_seconds = 0.0
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
                     f"({'1 GPU' if tc.use_gpu else f'{tc.worker_cpus} CPU'} each)")
        gpu = tc.use_gpu and torch.cuda.is_available()
        fits = not check_models([cfg])  # never build a model to time it that cannot fit
        step_of: dict[str, float] = {}
        gpus_per_model = 1 if tc.together else max(1, tc.num_workers)
        for kind in sorted({m.kind for m in models}):
            size = model_estimate(cfg, kind)
            if not fits:  # the error below names it
                lines.append(f"  {'':{w}s} {kind}: {size.params:,} parameters: does not fit")
                continue
            step = step_of[kind] = step_seconds(cfg, kind, device="cuda" if gpu else "cpu")
            seconds = step * steps * len(cfg.seeds) * sum(m.kind == kind for m in models)
            lines.append(f"  {'':{w}s} {kind}: {size.params:,} parameters, ~"
                         f"{human_bytes(size.worker_bytes)} per worker (weights, gradients, "
                         f"AdamW {human_bytes(size.state_bytes)}; activations "
                         f"{human_bytes(size.activation_bytes)}); {step * 1e3:.0f} ms/step "
                         f"on {'GPU' if gpu else 'CPU'}: ~{fmt_seconds(seconds)} of steps"
                         + (f", {seconds * gpus_per_model / 3600:.2f} GPU-hours"
                            if gpu else ""))
        if step_of:
            wall = side_by_side_seconds([step_of[m.kind] * steps for m in models
                                         for _ in cfg.seeds], tc)
            train_seconds += wall
            if tc.together and tc.num_workers > 1:
                lines.append(f"  {'':{w}s} side by side on {tc.num_workers} workers: "
                             f"~{fmt_seconds(wall)}")
    lines.append(f"  all models: ~{fmt_seconds(train_seconds)} of steps, plus each job's "
                 "start (~20-40 s on 2 cores)"
                 + ("; train.use_gpu asks for GPUs, none in this process: CPU rates shown"
                    if any(c.train.use_gpu for c in plan.configs.values())
                    and not torch.cuda.is_available() else ""))
    lines.append("stage 3 tuning on validation tasks (Ray actors):")
    for name, cfg in plan.configs.items():
        exp = EXPERIMENTS[name]
        points = [len(tuning.candidates(s, cfg.eval)) for ev in exp.tuned
                  for s in tuning.bases(exp.evaluation(ev).agents(cfg), cfg)]
        seeds = len(cfg.seeds)
        if not points:
            lines.append(f"  {name:{w}s} nothing to tune (a fixed protocol)")
            continue
        lines.append(f"  {name:{w}s} {count(len(points), 'method')}, "
                     f"{count(sum(points), 'grid point')} (x {count(seeds, 'seed')} where "
                     f"trained) on {min(cfg.eval.num_tasks, cfg.data.num_val_tasks)} validation "
                     "tasks")
    lines.append("stage 4 evaluation (Ray actors):")
    for name, cfg in plan.configs.items():
        lines.append(f"  {name:{w}s} {cfg.eval.num_tasks} tasks, H={cfg.eval.online_horizon}, "
                     f"{cfg.eval.num_actors} actors x {cfg.eval.actor_cpus} CPU"
                     + (f" + {cfg.eval.actor_gpus} GPU" if cfg.eval.actor_gpus else ""))
    lines += ["stage 5 figures, stage 6 report.md", "",
              f"datasets on disk: ~{human_bytes(total_bytes)}"]
    return "\n".join(lines)
