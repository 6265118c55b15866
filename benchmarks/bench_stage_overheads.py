"""Two costs around the steps and rollouts themselves, each against the way it was done before.

    python benchmarks/bench_stage_overheads.py [--experiments bandit darkroom] [--points 12]

1. A Ray Train job's datasets. Baseline "materialize": ``store.ray_dataset(...).materialize()``
   in the driver, a Ray Data execution per split, what every job ran before it started its
   workers. Current "in memory": ``store.ray_dataset(..., in_memory=True)`` (the shards read
   with pyarrow and handed to the object store as they are). Timed on the train and validation
   splits of a ``smoke`` and a ``small`` dataset generated for this run; both give the same
   batches (``tests/test_train.py`` checks the order, and the ratio is printed beside a
   comparison of every batch).
2. A tuning grid on the evaluation actors (``small``: 2 actors x 0.5 CPU, its validation task
   count). Baseline split="tasks": every actor runs every grid point on its share of the tasks.
   Current split="specs": every actor runs every task for every other grid point. SPICE's
   first ``--points`` grid points at a model of the ``small`` shape with random weights (the
   cost of a rollout does not depend on what the weights learned); both splits run twice,
   alternating, and the rows are compared equal.

Exits 1 if the batches or the rows differ between the two ways.

Numbers depend on the CPU and on what else runs: compare only within one run.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch


def dataset_handoff(preset: str, experiment: str, root: Path) -> tuple[float, float, bool]:
    """(seconds materialize, seconds in memory, same batches) over train + validation."""
    from spice_ray.config import make_config
    from spice_ray.data import store
    from spice_ray.data.generate import generate_dataset

    cfg = make_config(preset, experiment)
    ds_dir = generate_dataset(cfg, root / f"{preset}-{experiment}").dataset_dir
    seconds = {"materialize": 0.0, "memory": 0.0}
    same = True
    for split in ("train", "validation"):
        t0 = time.perf_counter()
        old = store.ray_dataset(ds_dir, split).materialize()
        seconds["materialize"] += time.perf_counter() - t0
        t0 = time.perf_counter()
        new = store.ray_dataset(ds_dir, split, in_memory=True)
        seconds["memory"] += time.perf_counter() - t0
        size = cfg.data.shard_size
        for a, b in zip(old.iter_torch_batches(batch_size=size),
                        new.iter_torch_batches(batch_size=size), strict=True):
            same &= all(torch.equal(a[k], b[k]) for k in a)
    return seconds["materialize"], seconds["memory"], same


def grid_split(experiment: str, points: int) -> tuple[float, float, bool, int, int]:
    """(seconds split="tasks", seconds split="specs", same rows, points, tasks), each the
    mean of two runs."""
    from spice_ray.config import make_config
    from spice_ray.data.tasks import generate_tasks
    from spice_ray.evaluate.actors import EvalPool, evaluate_parallel
    from spice_ray.model.registry import build_model, model_payload
    from spice_ray.study import tuning
    from spice_ray.study.experiments import EXPERIMENTS

    cfg = make_config("small", experiment)
    n = min(cfg.eval.num_tasks, cfg.data.num_val_tasks)
    data = generate_tasks(cfg.env, cfg.data, "validation", np.arange(n))
    exp = EXPERIMENTS[experiment]
    spec = next(s for ev in exp.tuned for s in exp.evaluation(ev).agents(cfg)
                if s.method == "spice")
    # without a fitted width its points equal the paper's: each distinct setting once
    grid = list({c.spec.config_json(cfg.eval): c.spec
                 for c in tuning.candidates(spec, cfg.eval)}.values())[:points]
    payload = model_payload(build_model("spice", cfg, torch.Generator().manual_seed(0)))
    seconds: dict[str, list[float]] = {"tasks": [], "specs": []}
    rows: dict[str, pd.DataFrame] = {}
    with EvalPool() as pool:
        evaluate_parallel(payload, cfg.env, cfg.eval, data, grid[:2], ("final",), pool=pool)
        for split in ("tasks", "specs", "tasks", "specs"):
            t0 = time.perf_counter()
            rows[split] = evaluate_parallel(payload, cfg.env, cfg.eval, data, grid, ("final",),
                                            pool=pool, split=split)
            seconds[split].append(time.perf_counter() - t0)
    same = np.allclose(rows["tasks"]["value"], rows["specs"]["value"], rtol=0, atol=1e-9) \
        and rows["tasks"].drop(columns="value").equals(rows["specs"].drop(columns="value"))
    return (float(np.mean(seconds["tasks"])), float(np.mean(seconds["specs"])), bool(same),
            len(grid), n)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--experiments", nargs="+", default=["bandit", "darkroom"])
    p.add_argument("--points", type=int, default=12, help="SPICE grid points timed")
    args = p.parse_args()
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             logging_level="ERROR")
    from ray.data import DataContext

    DataContext.get_current().enable_progress_bars = False
    differ = []
    print("1. a Ray Train job's datasets (train + validation splits), baseline: materialize()")
    with tempfile.TemporaryDirectory() as tmp:
        for preset in ("smoke", "small"):
            for experiment in args.experiments:
                old, new, same = dataset_handoff(preset, experiment, Path(tmp))
                print(f"  {preset:5s} {experiment:9s} materialize {old:6.2f} s, in memory "
                      f"{new:6.2f} s: {old / new:6.1f}x less, "
                      f"{'the same batches' if same else 'BATCHES DIFFER'}", flush=True)
                differ += [] if same else [f"{preset} {experiment} batches"]
    print("2. a tuning grid on the small preset's evaluation actors, baseline: split='tasks'")
    for experiment in args.experiments:
        old, new, same, points, n = grid_split(experiment, args.points)
        print(f"  {experiment:9s} {points} SPICE points x {n} validation tasks: tasks "
              f"{old:6.1f} s, specs {new:6.1f} s: {old / new:.2f}x, "
              f"{'the same rows' if same else 'ROWS DIFFER'}", flush=True)
        differ += [] if same else [f"{experiment} rows"]
    if differ:
        raise SystemExit(f"the two ways differ: {', '.join(differ)}")


if __name__ == "__main__":
    main()
