"""How to spend a machine's cores on several seeds: one batched model, threads, or processes.

    python benchmarks/bench_cores.py [--experiments bandit darkroom] [--steps 10]

At the ``small`` config of each experiment, SPICE optimiser steps (the full loss, AdamW) timed
in this run, three ways:
  1. one seed at batch B and one model at batch S x B (S = 3), one thread: what stacking the
     seeds into one vectorised model could buy at best (the same FLOPs in fewer, larger ops);
  2. one model on 2 threads (what the ``small`` study's one Train worker gets on 2 cores);
  3. two models at once in two one-thread processes (what two Train workers, each training
     whole models, would get).
Printed: ms per step and model-steps per second of each, and the ratios against (2), the
baseline the study runs today. Numbers depend on the CPU: compare only within one run.
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
from spice_ray.train.loop import compute_loss


def step_ms(experiment: str, batch_scale: int, threads: int, steps: int) -> float:
    """Median ms of one SPICE step at ``small`` with ``batch_scale`` x its batch."""
    torch.set_num_threads(threads)
    cfg = make_config("small", experiment)
    batch = generate_tasks(cfg.env, cfg.data, "train",
                           np.arange(cfg.train.batch_size * batch_scale))
    model = build_model("spice", cfg, torch.Generator().manual_seed(0))
    optimiser = torch.optim.AdamW(model.parameters(), lr=cfg.train.lr)
    times = []
    for _ in range(steps + 1):  # the first is a warm-up
        t0 = time.perf_counter()
        loss, _ = compute_loss(model, batch, "spice", cfg, torch.device("cpu"))
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        optimiser.step()
        times.append(time.perf_counter() - t0)
    return 1e3 * float(np.median(times[1:]))


def _worker(args: tuple[str, int, int, int]) -> float:
    return step_ms(*args)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--experiments", nargs="+", default=["bandit", "darkroom"])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--seeds", type=int, default=3, help="S of the batched model (1.)")
    args = p.parse_args()
    ctx = mp.get_context("spawn")
    for exp in args.experiments:
        one = step_ms(exp, 1, 1, args.steps)
        stacked = step_ms(exp, args.seeds, 1, args.steps)
        two_threads = step_ms(exp, 1, 2, args.steps)
        with ctx.Pool(2) as pool:
            side = pool.map(_worker, [(exp, 1, 1, args.steps)] * 2)
        base = 1e3 / two_threads  # model-steps per second, one model on 2 threads
        print(f"{exp} (small, SPICE, batch {make_config('small', exp).train.batch_size}):")
        print(f"  1. one seed, 1 thread: {one:7.1f} ms; {args.seeds} seeds as one batched model: "
              f"{stacked:7.1f} ms = {stacked / one:.2f}x one seed's step "
              f"(best case for stacking seeds: {args.seeds * one / stacked:.2f}x)")
        print(f"  2. one model on 2 threads: {two_threads:7.1f} ms ({base:.1f} model-steps/s, "
              f"{one / two_threads:.2f}x its 1-thread speed)")
        both = sum(1e3 / ms for ms in side)
        print(f"  3. two models at once, 1 thread each: {side[0]:7.1f} / {side[1]:7.1f} ms "
              f"({both:.1f} model-steps/s)")
        print(f"  two 1-thread processes / one model on 2 threads: {both / base:.2f}x "
              "model-steps per second")


if __name__ == "__main__":
    main()
