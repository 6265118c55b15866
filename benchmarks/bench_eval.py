"""Online evaluation speed: KV-cache decoding vs full recomputation per step, and darkroom.

Baseline named: "recompute" = the same SPICE controller with ``use_cache=False``, which re-runs
the full forward over [query; context] at every step (what a rollout without the cache does).

Setup (paper size, random weights): 6 layers, width 64, 1 head, K = 7 value heads, A = 5.
* bandit: N tasks (default 200), H steps (default 500), SPICE posterior-UCB, uniform kernel.
  The cached run is one real rollout of all N x H steps. The recompute run costs O(H^3) and
  would take many minutes here, so by default one full-recompute step (all N tasks) is timed
  at a grid of context lengths t, interpolated linearly between them and summed over
  t = 0..H-1; a real rollout of the first ``--recompute-steps`` steps checks the estimate.
  ``--full-recompute`` times the real thing.
* darkroom: N tasks (default 100), H steps (default 100), SPICE (RBF on latents, n-step
  targets n = 5, gamma = 0.95) and DPT greedy; every step re-runs the trunk (the query is the
  current state).

Each phase runs in a fresh subprocess, so its peak resident memory (``ru_maxrss``) is its own;
tracemalloc cannot see torch's allocations. Torch runs on ``--threads`` threads (default 1:
the machine's 2 cores are shared). ``--device cuda`` puts the models on a GPU (what an
evaluation actor does with ``eval.actor_gpus``); the fusion's statistics stay on the CPU.

    python benchmarks/bench_eval.py [--tasks 200 --horizon 500 --dark-tasks 100 ...]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

import numpy as np
import torch

from spice_ray.agents import AgentSpec, SpiceAgent
from spice_ray.config import EvalConfig, FusionConfig, ModelConfig, make_config
from spice_ray.data.tasks import generate_tasks
from spice_ray.envs.bandit import BanditTasks
from spice_ray.evaluate import online_noise, online_rows, run_online
from spice_ray.model import DptModel, SpiceModel

BANDIT = make_config("small", "bandit").env.environment()

PAPER_MODEL = ModelConfig(n_layer=6, n_embd=64, n_head=1, ensemble_size=7, head_hidden=64)


def _maxrss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def _bandit_problem(args: argparse.Namespace):
    model = SpiceModel(PAPER_MODEL, 5, 1, args.horizon + 1,
                       generator=torch.Generator().manual_seed(0)).eval().to(args.device)
    ids = np.arange(args.tasks)
    means = np.random.default_rng(0).random((args.tasks, 5))
    noise = online_noise(1234, ids, args.horizon)  # (N, H) common random numbers
    return model, means, noise


def phase_cached(args: argparse.Namespace) -> dict:
    model, means, noise = _bandit_problem(args)
    rss0 = _maxrss_mib()
    agent = SpiceAgent(FusionConfig(), model=model, stateless=True, use_cache=True)
    t0 = time.perf_counter()
    actions = run_online(agent, BANDIT, BanditTasks(means, 0.3), args.horizon, noise, 1,
                         torch.Generator().manual_seed(0)).actions
    dt = time.perf_counter() - t0
    return {"seconds": dt, "env_steps": args.tasks * args.horizon,
            "steps_per_s": args.tasks * args.horizon / dt, "rss_before_mib": rss0,
            "peak_rss_mib": _maxrss_mib(), "actions_head": actions[0, :10].tolist()}


def _recompute_step_time(model, t: int, tasks: int, repeats: int = 1) -> float:
    """Seconds of one uncached act() with t transitions in context (all tasks)."""
    agent = SpiceAgent(FusionConfig(), model=model, stateless=True, use_cache=False)
    agent.reset(tasks, 5)
    zeros_a, zeros_r = torch.zeros(tasks, dtype=torch.long), torch.zeros(tasks)
    zeros_s = torch.zeros(tasks, 1)
    for _ in range(t):
        agent.observe(zeros_a, zeros_r, zeros_s, zeros_s)  # appends token features only: cheap
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        agent.act(t, zeros_s)
        best = min(best, time.perf_counter() - t0)
    return best


def phase_recompute(args: argparse.Namespace) -> dict:
    model, means, noise = _bandit_problem(args)
    rss0 = _maxrss_mib()
    out: dict = {"rss_before_mib": rss0}
    agent = SpiceAgent(FusionConfig(), model=model, stateless=True, use_cache=False)
    steps = args.horizon if args.full_recompute else min(args.recompute_steps, args.horizon)
    t0 = time.perf_counter()
    run_online(agent, BANDIT, BanditTasks(means, 0.3), steps, noise, 1,
               torch.Generator().manual_seed(0))
    out["real_steps"] = steps
    out["real_seconds"] = time.perf_counter() - t0
    if args.full_recompute:
        out["seconds"] = out["real_seconds"]
        out["extrapolated"] = False
    else:
        grid = np.unique(np.linspace(0, args.horizon - 1, args.recompute_points).astype(int))
        times = np.array([_recompute_step_time(model, int(t), args.tasks) for t in grid])
        per_step = np.interp(np.arange(args.horizon), grid, times)  # piecewise linear in t
        out.update({
            "grid_t": grid.tolist(), "grid_seconds": times.round(4).tolist(),
            "seconds": float(per_step.sum()), "extrapolated": True,
            "fit_predicts_real_seconds": float(per_step[:steps].sum()),
        })
    out["env_steps"] = args.tasks * args.horizon
    out["steps_per_s"] = out["env_steps"] / out["seconds"]
    out["peak_rss_mib"] = _maxrss_mib()
    return out


def _darkroom(args: argparse.Namespace, spec: AgentSpec) -> dict:
    cfg = make_config("small", "darkroom", overrides=[f"env.horizon={args.dark_horizon}"])
    env = cfg.env
    eval_cfg = EvalConfig(num_tasks=args.dark_tasks, online_horizon=args.dark_horizon)
    data = generate_tasks(env, cfg.data, "eval", np.arange(args.dark_tasks))
    cls = SpiceModel if spec.method == "spice" else DptModel
    model = cls(PAPER_MODEL, 5, 2, args.dark_horizon + 1,
                generator=torch.Generator().manual_seed(0)).eval().to(args.device)
    rss0 = _maxrss_mib()
    t0 = time.perf_counter()
    df = online_rows(env, eval_cfg, data, [spec], model)
    dt = time.perf_counter() - t0
    final = df[(df.metric == "cumulative_return") & (df.x == args.dark_horizon)]["value"].mean()
    steps = args.dark_tasks * args.dark_horizon
    return {"seconds": dt, "env_steps": steps, "steps_per_s": steps / dt,
            "rss_before_mib": rss0, "peak_rss_mib": _maxrss_mib(),
            "mean_final_return": float(final), "rows": len(df)}


def phase_darkroom_spice(args: argparse.Namespace) -> dict:
    fusion = make_config("small", "darkroom").fusion  # rbf on latents, n-step 5, gamma 0.95
    return _darkroom(args, AgentSpec("spice", fusion))


def phase_darkroom_dpt(args: argparse.Namespace) -> dict:
    return _darkroom(args, AgentSpec("dpt", sample=False))


PHASES = {"cached": phase_cached, "recompute": phase_recompute,
          "darkroom-spice": phase_darkroom_spice, "darkroom-dpt": phase_darkroom_dpt}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tasks", type=int, default=200)
    p.add_argument("--horizon", type=int, default=500)
    p.add_argument("--dark-tasks", type=int, default=100)
    p.add_argument("--dark-horizon", type=int, default=100)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cpu", help="where the models run (cpu or cuda)")
    p.add_argument("--recompute-points", type=int, default=9,
                   help="context lengths at which one recompute step is timed")
    p.add_argument("--recompute-steps", type=int, default=100,
                   help="real recompute rollout steps (validates the extrapolation)")
    p.add_argument("--full-recompute", action="store_true",
                   help="time the whole recompute rollout instead of extrapolating")
    p.add_argument("--phases", default=",".join(PHASES))
    p.add_argument("--phase", help=argparse.SUPPRESS)  # internal: run one phase, print JSON
    return p


def main() -> None:
    args = _parser().parse_args()
    if args.phase:
        torch.set_num_threads(args.threads)
        print(json.dumps(PHASES[args.phase](args)))
        return
    passthrough = [f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items()
                   if k not in ("phases", "phase", "full_recompute")]
    passthrough += ["--full-recompute"] if args.full_recompute else []
    results = {}
    for name in args.phases.split(","):
        proc = subprocess.run([sys.executable, __file__, *passthrough, "--phase", name],
                              capture_output=True, text=True)
        if proc.returncode:
            raise RuntimeError(f"phase {name} failed:\n{proc.stderr}")
        results[name] = json.loads(proc.stdout.strip().splitlines()[-1])
        r = results[name]
        print(f"{name:15s} {r['seconds']:8.2f} s  {r['steps_per_s']:10.0f} env-steps/s  "
              f"peak RSS {r['peak_rss_mib']:7.0f} MiB (before run {r['rss_before_mib']:.0f})",
              flush=True)
    print(f"\nsetup: 6 layers, width 64, K=7, A=5, torch threads={args.threads}, "
          f"models on {args.device}, "
          f"bandit N={args.tasks} H={args.horizon}, darkroom N={args.dark_tasks} "
          f"H={args.dark_horizon}")
    if "cached" in results and "recompute" in results:
        c, r = results["cached"], results["recompute"]
        ratio = r["seconds"] / c["seconds"]
        how = ("extrapolated from one recompute step at t in "
               f"{r['grid_t']} (linear interpolation); a real {r['real_steps']}-step recompute "
               f"rollout took {r['real_seconds']:.2f} s, the fit predicts "
               f"{r['fit_predicts_real_seconds']:.2f} s" if r["extrapolated"]
               else "measured over the whole rollout")
        print(f"bandit recompute total {r['seconds']:.1f} s: {how}")
        print(f"KV cache speed-up: {ratio:.1f}x (target >= 30x: "
              f"{'PASS' if ratio >= 30 else 'FAIL'}); cached run {c['seconds']:.1f} s "
              f"(target < 60 s: {'PASS' if c['seconds'] < 60 else 'FAIL'})")
    for name in ("darkroom-spice", "darkroom-dpt"):
        if name in results:
            s = results[name]["seconds"]
            print(f"{name} online N={args.dark_tasks} H={args.dark_horizon}: {s:.1f} s "
                  f"(target < 60 s: {'PASS' if s < 60 else 'FAIL'})")
    print("\nraw:", json.dumps(results))


if __name__ == "__main__":
    main()
