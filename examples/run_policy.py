"""Act with a trained SPICE policy in Gymnasium environments, without any gradient step.

    python pipelines/full_run.py --preset smoke --out runs/smoke    # once: makes checkpoints
    python examples/run_policy.py runs/smoke                        # trains nothing

For every SPICE checkpoint in the run directory, builds a few held-out tasks of its environment,
wraps each in the Gymnasium view of that environment (``spice_ray.envs.gym.TaskEnv``) and plays
one episode with ``spice_ray.SpicePolicy``: act, step, observe. Prints the return and regret
per task and the policy's final posterior for the first task.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from spice_ray import SpicePolicy
from spice_ray.config import from_dict
from spice_ray.data.tasks import generate_tasks
from spice_ray.envs.gym import TaskEnv
from spice_ray.model.checkpoint import read_meta


def play(final: Path, num_tasks: int, rule: str) -> None:
    cfg = from_dict(read_meta(final)["config"])
    env = cfg.environment()
    data = generate_tasks(cfg.env, cfg.data, "eval", np.arange(num_tasks))
    tasks = env.eval_tasks(data)
    policy = SpicePolicy.from_checkpoint(final, rule=rule)
    print(f"{env.name}: {final}")
    for i in range(num_tasks):
        gym_env = TaskEnv(env, tasks, i, horizon=cfg.eval.online_horizon)
        obs, _ = gym_env.reset(seed=i)
        policy.reset(draws=i)
        total, regret, done = 0.0, 0.0, False
        while not done:
            action = policy.act(obs)
            nxt, reward, terminated, truncated, info = gym_env.step(action)
            policy.observe(obs, action, reward, nxt)
            total, regret = total + reward, regret + info["regret"]
            obs, done = nxt, terminated or truncated
        print(f"  task {i}: return {total:7.2f}   regret {regret:7.2f}")
        if i == 0:
            mean, var = policy.posterior(None if env.stateless else obs)
            print(f"    posterior after the episode: mean {np.round(mean, 3)}, "
                  f"std {np.round(np.sqrt(var), 3)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--tasks", type=int, default=3)
    parser.add_argument("--rule", choices=("greedy", "ucb", "thompson"), default="ucb")
    args = parser.parse_args(argv)
    finals = sorted(args.run_dir.glob("checkpoints/*/spice-*-seed*/final"))
    if not finals:
        print(f"error: no SPICE checkpoint under {args.run_dir}/checkpoints; run "
              f"`python pipelines/full_run.py --preset smoke --out {args.run_dir}` first",
              file=sys.stderr)
        return 2
    seen = set()
    for final in finals:  # one checkpoint per environment (the main SPICE model)
        name = from_dict(read_meta(final)["config"]).env.name
        if name not in seen and read_meta(final)["config"]["train"]["use_epi"]:
            seen.add(name)
            play(final, args.tasks, args.rule)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
