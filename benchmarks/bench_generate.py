"""Dataset generation throughput: Ray Data (vectorised tasks) vs a naive step-by-step loop.

    python benchmarks/bench_generate.py [--tasks 100000] [--naive-tasks 500] [--actors 2]

Generates ``--tasks`` bandit tasks (A=5, H=500) and ``--tasks`` darkroom tasks (H=100) through
the real pipeline (train split only; validation/eval set to 1 task) and prints tasks/s, bytes on
disk per task against the raw array bytes, and the speed-up over a naive single-process
generator that draws one step at a time with a per-task numpy Generator (timed on a subsample).
Targets (issue 2): 100k bandit tasks in < 120 s wall on 2 cores; disk <= 1.5x raw bytes.

    python benchmarks/bench_generate.py --smoke-stage

instead times the ``smoke`` study's datasets stage (its nine datasets of 128 tasks) both ways
in one fresh Ray session: baseline Ray Data (``data.ray_data_min_tasks=0``, first, so that its
first pipeline pays the workers' start as a study's does), current the driver (the default
below 1,024 tasks); prints both walls and the ratio, and exits 1 if any file differs.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from spice_ray.config import make_config
from spice_ray.data import schema, store
from spice_ray.data.generate import generate_dataset
from spice_ray.envs import darkroom
from spice_ray.runtime.cli import init_ray


def naive_bandit(n: int, num_arms: int, horizon: int, sigma: float, seed: int) -> float:
    """One task and one step at a time, as a straightforward reference generator would."""
    t0 = time.perf_counter()
    rows = []
    for task in range(n):
        rng = np.random.default_rng([seed, task])
        means = rng.uniform(size=num_arms)
        probs = 0.5 * rng.dirichlet(np.ones(num_arms))
        favoured = rng.integers(num_arms)
        probs[favoured] += 0.5
        actions, rewards = [], []
        for _ in range(horizon):
            a = rng.choice(num_arms, p=probs)
            actions.append(a)
            rewards.append(rng.normal(means[a], sigma))
        rows.append((means, probs, np.array(actions), np.array(rewards), favoured))
    return time.perf_counter() - t0


def naive_darkroom(n: int, horizon: int, seed: int) -> float:
    t0 = time.perf_counter()
    train_goals, _ = darkroom.goal_split(10, 0.8, 0)
    rows = []
    for task in range(n):
        rng = np.random.default_rng([seed, task])
        goal = train_goals[rng.integers(len(train_goals))]
        state = rng.integers(10, size=2)
        traj = [state]
        for _ in range(horizon):
            a = rng.integers(5)
            state = np.clip(state + darkroom.MOVES[a], 0, 9)
            traj.append(state)
        rows.append((goal, np.array(traj)))
    return time.perf_counter() - t0


def run(env: str, naive: Callable[[Any, int], float], tasks: int, naive_tasks: int,
        actors: int, root: str) -> dict[str, float]:
    """Generate ``tasks`` tasks of ``env`` through Ray Data; ``naive(cfg, n)`` times the
    step-by-step baseline on ``n`` tasks."""
    cfg = make_config("paper", env, overrides=[
        f"data.num_train_tasks={tasks}", "data.num_val_tasks=1", "data.num_eval_tasks=1",
        "eval.num_tasks=1", f"data.concurrent_tasks={actors}", "data.shard_size=10000",
        "data.batch_size=1000"])
    ds_dir = os.path.join(root, env)
    t0 = time.perf_counter()
    generate_dataset(cfg, ds_dir, splits=("train", "validation", "eval"))
    wall = time.perf_counter() - t0
    man = store.load_manifest(ds_dir)
    train = man.split("train")
    raw = schema.raw_nbytes(man.columns())
    seconds = naive(cfg, naive_tasks)
    return {"tasks": tasks, "wall_s": wall, "tasks_per_s": tasks / wall,
            "bytes_per_task": train["bytes"] / tasks, "raw_bytes_per_task": raw,
            "naive_tasks_per_s": naive_tasks / seconds}


BENCHMARKS = (  # environment, its step-by-step baseline, the wall-time target (s) or None
    ("bandit", lambda cfg, n: naive_bandit(n, cfg.env.num_arms, cfg.env.horizon,
                                           cfg.env.sigma, 0), 120.0),
    ("darkroom", lambda cfg, n: naive_darkroom(n, cfg.env.horizon, 0), None),
)


def smoke_stage(root: str) -> bool:
    """The smoke study's datasets, by Ray Data and then by the driver; True if every file of
    every dataset is the same bytes both ways."""
    from pathlib import Path

    from spice_ray.study import plan_study

    walls, dirs = {}, {}
    for how, sets in (("Ray Data", ["data.ray_data_min_tasks=0"]), ("driver", [])):
        configs = plan_study("smoke", Path(root) / "plan", overrides=sets).configs
        t0 = time.perf_counter()
        dirs[how] = [generate_dataset(cfg, Path(root) / how / name).dataset_dir
                     for name, cfg in configs.items()]
        walls[how] = time.perf_counter() - t0
        print(f"{how:9} {len(configs)} datasets: {walls[how]:6.2f} s")
    print(f"driver / Ray Data wall: {walls['driver'] / walls['Ray Data']:.3f}")
    same = True
    for a, b in zip(dirs["Ray Data"], dirs["driver"], strict=True):
        files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
        same &= files == sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file()) and all(
            (a / f).read_bytes() == (b / f).read_bytes() for f in files)
    print("every shard, sidecar and manifest the same bytes: " + ("yes" if same else "NO"))
    return same


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", type=int, default=100_000)
    p.add_argument("--naive-tasks", type=int, default=500)
    p.add_argument("--actors", type=int, default=2)
    p.add_argument("--smoke-stage", action="store_true",
                   help="time the smoke study's datasets stage, Ray Data vs the driver")
    args = p.parse_args()
    init_ray()
    root = tempfile.mkdtemp(prefix="bench_generate_")
    try:
        if args.smoke_stage:
            raise SystemExit(0 if smoke_stage(root) else 1)
        print(f"{'env':9} {'tasks':>7} {'wall s':>7} {'tasks/s':>8} {'B/task':>7} "
              f"{'disk/raw':>8} {'naive t/s':>9} {'speed-up':>8}")
        for env, naive, target in BENCHMARKS:
            r = run(env, naive, args.tasks, args.naive_tasks, args.actors, root)
            print(f"{env:9} {r['tasks']:7d} {r['wall_s']:7.1f} {r['tasks_per_s']:8.0f} "
                  f"{r['bytes_per_task']:7.0f} {r['bytes_per_task'] / r['raw_bytes_per_task']:8.3f}"
                  f" {r['naive_tasks_per_s']:9.0f} "
                  f"{r['tasks_per_s'] / r['naive_tasks_per_s']:7.1f}x")
            if target is not None:
                verdict = "meets" if r["wall_s"] < target and args.tasks >= 100_000 else "check"
                print(f"  target: 100k {env} tasks < {target:.0f} s wall -> {verdict} "
                      f"({r['wall_s']:.1f} s for {r['tasks']} tasks)")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
