"""Scaling on this machine: Ray Data generation tasks and Ray evaluation actors, 1 vs 2 at once;
and the evaluation stage's fixed cost, actors started per evaluation vs one pool for the stage.

    python benchmarks/bench_scale.py [--tasks 40000] [--eval-tasks 200] [--horizon 300]
                                     [--evaluations 10]

Prints tasks/s of dataset generation (bandit A=5, H=500) through Ray Data tasks with
1 and with 2 tasks at once, and env-steps/s of online SPICE evaluation (a random-weight model at the
paper's size, N tasks x H steps) split over 1 and 2 evaluation actors, with both ratios. On a
2-core machine the ideal ratio is 2; Ray's own tasks and the driver share the same cores.

Baseline named for the last figure: "actors per evaluation" = each of E small evaluations (a
smoke-size checkpoint on disk, 32 bandit tasks x H=24, one actor) starts its own actor, as the
evaluation stage did before ``EvalPool``; against the same E evaluations on one pool's actor.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time

import torch

from spice_ray.agents import AgentSpec
from spice_ray.config import make_config
from spice_ray.data.generate import generate_dataset
from spice_ray.data.store import load_split
from spice_ray.evaluate.actors import EvalPool, evaluate_parallel
from spice_ray.model.checkpoint import save_checkpoint
from spice_ray.model.registry import build_model, model_payload
from spice_ray.runtime.cli import init_ray


def generation(tasks: int, actors: int, root: str) -> float:
    cfg = make_config("paper", "bandit", overrides=[
        f"data.num_train_tasks={tasks}", "data.num_val_tasks=1", "data.num_eval_tasks=1",
        "eval.num_tasks=1", f"data.concurrent_tasks={actors}", "data.task_cpus=0.5",
        "data.shard_size=5000", "data.batch_size=1000"])
    t0 = time.perf_counter()
    generate_dataset(cfg, f"{root}/gen-{actors}")
    return tasks / (time.perf_counter() - t0)


def evaluation(n: int, horizon: int, actors: int, root: str) -> float:
    cfg = make_config("paper", "bandit", overrides=[
        f"env.horizon={horizon}", f"eval.online_horizon={horizon}", f"eval.num_tasks={n}",
        f"data.num_eval_tasks={n}", "data.num_train_tasks=1", "data.num_val_tasks=1",
        "eval.offline_points=20", f"eval.num_actors={actors}", "eval.actor_cpus=0.5"])
    ds = generate_dataset(cfg, f"{root}/eval-data").dataset_dir
    data = load_split(ds, "eval", limit=cfg.eval.num_tasks)
    model = build_model("spice", cfg, torch.Generator().manual_seed(0))
    spec = AgentSpec("spice", fusion=cfg.fusion)
    t0 = time.perf_counter()
    evaluate_parallel(model_payload(model), cfg.env, cfg.eval, data, [spec], ("online",),
                      num_actors=actors)
    return n * horizon / (time.perf_counter() - t0)


def evaluation_stage(evaluations: int, root: str) -> dict[str, float]:
    """Seconds for ``evaluations`` small evaluations: fresh actors each, then one pool."""
    cfg = make_config("smoke", "bandit", overrides=[
        "data.num_eval_tasks=32", "eval.num_tasks=32", "eval.num_actors=1"])
    ds = generate_dataset(cfg, f"{root}/stage-data").dataset_dir
    data = load_split(ds, "eval", limit=cfg.eval.num_tasks)
    model = build_model("spice", cfg, torch.Generator().manual_seed(0))
    path = str(save_checkpoint(f"{root}/ckpt", model, cfg, "bench", epoch=0))
    spec = AgentSpec("spice", fusion=cfg.fusion)

    def run(pool: EvalPool | None) -> float:
        t0 = time.perf_counter()
        for _ in range(evaluations):
            evaluate_parallel(path, cfg.env, cfg.eval, data, [spec], ("online",), pool=pool)
        return time.perf_counter() - t0

    fresh = run(None)
    with EvalPool() as pool:
        pooled = run(pool)
    return {"fresh": fresh, "pooled": pooled}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", type=int, default=40_000)
    p.add_argument("--eval-tasks", type=int, default=200)
    p.add_argument("--horizon", type=int, default=300)
    p.add_argument("--evaluations", type=int, default=10)
    args = p.parse_args()
    init_ray()
    root = tempfile.mkdtemp(prefix="bench_scale_")
    try:
        gen = {k: generation(args.tasks, k, root) for k in (1, 2)}
        ev = {k: evaluation(args.eval_tasks, args.horizon, k, root) for k in (1, 2)}
        stage = evaluation_stage(args.evaluations, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"generation ({args.tasks} bandit tasks, H=500): 1 Ray Data task at once "
          f"{gen[1]:.0f} tasks/s, 2 at once {gen[2]:.0f} tasks/s -> ratio {gen[2] / gen[1]:.2f}x")
    print(f"evaluation (SPICE online, {args.eval_tasks} tasks x H={args.horizon}): 1 actor "
          f"{ev[1]:.0f} steps/s, 2 actors {ev[2]:.0f} steps/s -> ratio {ev[2] / ev[1]:.2f}x")
    E = args.evaluations
    print(f"evaluation stage ({E} smoke evaluations of 32 tasks x H=24): actors per evaluation "
          f"{stage['fresh']:.1f} s ({stage['fresh'] / E:.2f} s each), one pool "
          f"{stage['pooled']:.1f} s ({stage['pooled'] / E:.2f} s each) -> ratio "
          f"{stage['fresh'] / stage['pooled']:.1f}x")


if __name__ == "__main__":
    main()
