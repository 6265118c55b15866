"""Two costs around the steps and rollouts themselves, each against the way it was done before.

    python benchmarks/bench_stage_overheads.py [--experiments bandit darkroom] [--points 12]

1. A Ray Train job's data. Baseline "Ray Data": the splits handed to the TorchTrainer as Ray
   Data datasets (read into the object store in the driver, ``ray.data.from_arrow``, not split
   over workers, in file order) and each worker streaming the train split with
   ``get_dataset_shard("train").iter_torch_batches`` every epoch, as training did before.
   Current "Parquet": no datasets on the trainer; the worker reads the shards in file order
   with ``store.iter_batches`` (what ``spice_ray.train.stream.shard_batches`` does). Each way
   is a whole one-worker job (0.5 CPU) that only streams its chunks for ``--epochs`` epochs and
   digests them, so the difference is the ingestion's cost per job, start-up included; the
   digests must be equal (the same chunks, so the same weights). Best of ``--repeats``
   alternating jobs, on a ``smoke`` and a ``small`` dataset generated for this run.
2. A tuning grid on the evaluation actors (``small``: 2 actors x 0.5 CPU, its validation task
   count). Baseline split="tasks": every actor runs every grid point on its share of the tasks.
   Current split="specs": every actor runs every task for every other grid point. SPICE's
   first ``--points`` grid points at a model of the ``small`` shape with random weights (the
   cost of a rollout does not depend on what the weights learned); both splits run twice,
   alternating, and the rows are compared equal.

Exits 1 if the chunks or the rows differ between the two ways.

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


def _stream_job(config: dict) -> dict:
    """A Train worker that streams the train split's chunks (one of the two ways) for some
    epochs and reports their digest (bytes and dtypes of every column)."""
    import hashlib

    import ray.train

    from spice_ray.data import store

    digest = hashlib.sha256()
    for _ in range(config["epochs"]):
        chunks = (ray.train.get_dataset_shard("train").iter_torch_batches(
            batch_size=config["chunk"]) if config["ray_data"] else
            store.iter_batches(config["ds"], "train", config["chunk"], verify=False))
        for chunk in chunks:
            for key in sorted(chunk):
                col = torch.as_tensor(chunk[key])
                digest.update(f"{key}{col.dtype}{tuple(col.shape)}".encode())
                digest.update(col.contiguous().numpy().tobytes())
    return {"digest": digest.hexdigest()}


def ingestion_job(ds_dir: Path, chunk: int, epochs: int, ray_data: bool, storage: Path
                  ) -> tuple[float, str]:
    """(seconds, digest) of one job streaming the chunks one way (see the module's 1.)."""
    import pyarrow.parquet as pq
    import ray.data
    import ray.train
    from ray.train.torch import TorchTrainer

    from spice_ray.data import store
    from spice_ray.train.ray_train import verify_dataset

    t0 = time.perf_counter()
    extra = {}
    if ray_data:
        datasets = {}
        for split in ("train", "validation"):
            files = store.split_files(ds_dir, split, verify=True)
            datasets[split] = ray.data.from_arrow([pq.read_table(f) for f in files])
            datasets[split].context.execution_options.preserve_order = True
        extra = {"datasets": datasets, "dataset_config": ray.train.DataConfig(
            datasets_to_split=[],
            execution_options=ray.data.ExecutionOptions(preserve_order=True))}
    else:  # what a job does now: the driver verifies, the worker reads
        verify_dataset(ds_dir)
    trainer = TorchTrainer(
        _stream_job, train_loop_config={"ds": str(ds_dir), "chunk": chunk, "epochs": epochs,
                                        "ray_data": ray_data},
        scaling_config=ray.train.ScalingConfig(num_workers=1,
                                               resources_per_worker={"CPU": 0.5}),
        run_config=ray.train.RunConfig(storage_path=str(storage)), **extra)
    result = trainer.fit()
    return time.perf_counter() - t0, result.return_value["digest"]


def dataset_handoff(preset: str, experiment: str, root: Path, epochs: int, repeats: int
                    ) -> tuple[float, float, bool]:
    """(best seconds Ray Data, best seconds Parquet, same chunks) of jobs that stream a
    generated dataset's train split ``epochs`` times."""
    from spice_ray.config import make_config
    from spice_ray.data.generate import generate_dataset

    cfg = make_config(preset, experiment)
    ds_dir = generate_dataset(cfg, root / f"{preset}-{experiment}").dataset_dir
    chunk = max(cfg.data.shard_size, cfg.train.batch_size)
    seconds: dict[bool, list[float]] = {True: [], False: []}
    digests = set()
    for i in range(repeats):
        for ray_data in (True, False):
            sec, digest = ingestion_job(ds_dir, chunk, epochs, ray_data,
                                        root / f"train-{preset}-{experiment}-{i}-{ray_data}")
            seconds[ray_data].append(sec)
            digests.add(digest)
    return min(seconds[True]), min(seconds[False]), len(digests) == 1


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
    p.add_argument("--epochs", type=int, default=3, help="epochs streamed by each job of 1.")
    p.add_argument("--repeats", type=int, default=2, help="jobs each way in 1. (best kept)")
    args = p.parse_args()
    from spice_ray.runtime.cli import init_ray

    init_ray(num_cpus=2, dashboard=False)  # as a run starts it (its workers at nice 0)
    differ = []
    print(f"1. a Ray Train job's data ({args.epochs} epochs, best of {args.repeats} jobs each "
          "way), baseline: Ray Data datasets on the trainer")
    with tempfile.TemporaryDirectory() as tmp:
        for preset in ("smoke", "small"):
            for experiment in args.experiments:
                old, new, same = dataset_handoff(preset, experiment, Path(tmp), args.epochs,
                                                 args.repeats)
                print(f"  {preset:5s} {experiment:9s} Ray Data {old:6.2f} s, Parquet "
                      f"{new:6.2f} s a job: {old / new:.2f}x, "
                      f"{'the same chunks' if same else 'CHUNKS DIFFER'}", flush=True)
                differ += [] if same else [f"{preset} {experiment} chunks"]
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
