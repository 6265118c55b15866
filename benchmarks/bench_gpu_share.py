"""Several Train workers on one GPU: model-steps per second against how many share it.

    python benchmarks/bench_gpu_share.py [--workers 1 2 4 8] [--experiments bandit darkroom]
                                         [--kinds spice] [--seconds 10] [--device cuda]

A ``small`` model's training step on a GPU is bound by kernel launches and host work (a few
percent of the GPU's arithmetic at batch 32; ``bench_throughput.py``), so one worker leaves
the GPU mostly idle. ``train.worker_gpus=1/n`` lets n workers of a ``train.together`` job
share it, each training whole models. This times exactly that: n processes, each with one
torch thread and its own model, batch and optimiser on the device, stepping the training step
as ``fit`` runs it (``compute_loss``: bf16 autocast on a GPU; backward, the gradient clip, the
finiteness check, fused AdamW) for ``--seconds`` after a warm-up, all starting together at a
barrier. Printed per n: the summed model-steps per second, the per-process step time, and the
ratio against one process (the ``worker_gpus=1`` baseline) measured in the same run.

``--device cpu`` runs the same on CPU cores (then n processes need n cores to mean anything).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import time

import numpy as np
import torch

from spice_ray.config import make_config
from spice_ray.data.tasks import generate_tasks
from spice_ray.model.registry import build_model
from spice_ray.train.loop import compute_loss, make_optimizer, optimiser_step


def _worker(experiment: str, kind: str, device_name: str, seconds: float, rank: int,
            barrier, results) -> None:
    """One sharing worker: warm up, wait for the others, step for ``seconds``."""
    torch.set_num_threads(1)
    device = torch.device(device_name)
    cfg = make_config("small", experiment)
    batch = generate_tasks(cfg.env, cfg.data, "train",
                           np.arange(rank * cfg.train.batch_size,
                                     (rank + 1) * cfg.train.batch_size))
    model = build_model(kind, cfg, torch.Generator().manual_seed(rank)).to(device)
    params = [p for p in model.parameters() if p.requires_grad]
    optimiser = make_optimizer(params, cfg.train)

    def step() -> None:
        loss, comp = compute_loss(model, batch, kind, cfg, device)
        optimiser_step(loss, optimiser, params, cfg.train.grad_clip, "benchmark", comp)

    for _ in range(5):
        step()
    barrier.wait()
    steps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        step()
        steps += 1
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    results.put((rank, steps, time.perf_counter() - t0))


def shared_rate(experiment: str, kind: str, device: str, workers: int, seconds: float
                ) -> tuple[float, float]:
    """(summed model-steps per second, median seconds per step of one worker) of ``workers``
    processes stepping side by side."""
    ctx = mp.get_context("spawn")  # CUDA cannot be forked
    barrier, results = ctx.Barrier(workers), ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(experiment, kind, device, seconds, r, barrier,
                                               results)) for r in range(workers)]
    for p in procs:
        p.start()
    out = [results.get(timeout=600) for _ in procs]
    for p in procs:
        p.join()
        if p.exitcode:
            raise RuntimeError(f"a benchmark worker exited with status {p.exitcode}")
    rate = sum(steps / wall for _, steps, wall in out)
    return rate, float(np.median([wall / steps for _, steps, wall in out]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", nargs="+", type=int, default=[1, 2, 4, 8])
    p.add_argument("--experiments", nargs="+", default=["bandit", "darkroom"])
    p.add_argument("--kinds", nargs="+", default=["spice"])
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--device", default="cuda")
    args = p.parse_args()
    if args.device.startswith("cuda"):
        if not torch.cuda.is_available():
            p.error("--device cuda: torch sees no CUDA device here")
        print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}, bf16 autocast")
    if 1 not in args.workers:
        args.workers = [1, *args.workers]  # the baseline
    for experiment in args.experiments:
        for kind in args.kinds:
            cfg = make_config("small", experiment)
            print(f"\n{experiment} {kind} (small: T={cfg.env.horizon}, batch "
                  f"{cfg.train.batch_size}), {args.seconds:g} s per setting, one thread each:")
            base = None
            for n in sorted(set(args.workers)):
                rate, step = shared_rate(experiment, kind, args.device, n, args.seconds)
                base = base or rate
                print(f"  {n:2d} worker(s): {rate:7.1f} model-steps/s ({step * 1e3:6.1f} ms a "
                      f"step each) = {rate / base:.2f}x one worker")


if __name__ == "__main__":
    main()
