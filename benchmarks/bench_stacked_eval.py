"""Tuning rollouts: a grid's points stepped as one batch against one rollout per point.

Baseline named: "alone" = today's tuning path before stacking, one online rollout per grid
point (``online_rows`` called with one spec at a time, ``final_only``), which re-runs the trunk
for that point's B tasks at every step. "stacked" = the same P points in one ``online_rows``
call: their learned SPICE agents act as P * B rows, one trunk call per step
(``spice_ray.agents.stacked``). Both score the same rows (asserted here on every run).

Setup: the ``small`` preset's models (3 layers, width 32, random weights), SPICE posterior-UCB
at P beta points, on B validation-like tasks: the darkroom (T = 100, the n-step targets the
study uses; the trunk re-runs over the whole context every step) and the bandit (T = 500, KV
cache). Prints point-steps per second (P x B x T / seconds) for each path and the ratio
stacked / alone, per P. Torch runs on ``--threads`` threads; ``--device cuda`` puts the model
on a GPU (the fusion's statistics stay on the CPU). The darkroom is stacked here on a CPU too,
where the study does not stack it (``evaluate.online.STACK_ON_CPU``: measured slower there).

Measured (2-core AMD EPYC VM, 1 thread, B = 100, beside three one-thread trainings from P = 16
of the darkroom on): darkroom 1.08x / 0.78x / 0.77x at P = 1 / 4 / 16, bandit 1.08x / 1.14x /
1.40x (P = 1 runs the same path twice: its ratio is the timing's spread).

    python benchmarks/bench_stacked_eval.py [--points 1 4 16] [--tasks 100] [--device cpu]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pandas as pd
import torch

from spice_ray.agents import AgentSpec
from spice_ray.config import EvalConfig, FusionConfig, make_config
from spice_ray.data.tasks import generate_tasks
from spice_ray.evaluate import online as online_module
from spice_ray.evaluate import online_rows
from spice_ray.model import SpiceModel


def _problem(env_name: str, tasks: int, horizon: int, device: str):
    cfg = make_config("small", env_name, overrides=[f"env.horizon={horizon}"])
    env = cfg.env
    model = SpiceModel(cfg.model, env.num_actions, env.state_dim, env.horizon + 1,
                       generator=torch.Generator().manual_seed(0)).eval().to(device)
    data = generate_tasks(env, cfg.data, "validation", np.arange(tasks))
    eval_cfg = EvalConfig(num_tasks=tasks, online_horizon=horizon)
    return cfg, model, data, eval_cfg


def _specs(cfg, points: int) -> list[AgentSpec]:
    betas = np.linspace(0.0, 3.0, points) if points > 1 else [1.0]
    return [AgentSpec("spice", FusionConfig(**{**cfg.fusion.__dict__, "beta": float(b)}))
            for b in betas]


def _time(fn) -> tuple[float, pd.DataFrame]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--tasks", type=int, default=100)
    ap.add_argument("--envs", nargs="+", default=["darkroom", "bandit"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    online_module.STACK_ON_CPU = "all"  # measure the stacked path wherever it runs
    horizons = {"darkroom": 100, "bandit": 500}
    print(f"device {args.device}, {args.threads} thread(s), B = {args.tasks} tasks")
    print(f"{'env':9s} {'P':>3s} {'alone pt-steps/s':>17s} {'stacked pt-steps/s':>19s} "
          f"{'stacked/alone':>13s}")
    for name in args.envs:
        H = horizons[name]
        cfg, model, data, eval_cfg = _problem(name, args.tasks, H, args.device)
        warm = _specs(cfg, 2)  # the first calls pay torch's one-time set-up: not timed
        online_rows(cfg.env, eval_cfg, data, warm, model, final_only=True)
        for P in args.points:
            specs = _specs(cfg, P)

            def rows(specs, cfg=cfg, eval_cfg=eval_cfg, data=data, model=model):
                return online_rows(cfg.env, eval_cfg, data, specs, model, final_only=True)

            alone_s, alone = _time(lambda specs=specs: pd.concat(
                [rows([s]) for s in specs], ignore_index=True))
            stacked_s, stacked = _time(lambda specs=specs: rows(specs))
            pd.testing.assert_frame_equal(stacked, alone)  # the same scores, or no figure
            work = P * args.tasks * H
            print(f"{name:9s} {P:3d} {work / alone_s:17.0f} {work / stacked_s:19.0f} "
                  f"{alone_s / stacked_s:12.2f}x")


if __name__ == "__main__":
    main()
