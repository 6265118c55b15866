"""Where a DPT* darkroom episode loses its return: the DPT paper's protocol, then one action fixed.

    python tools/dpt_star_episode.py RUN [--seed 0] [--checkpoint DIR] [--split validation|eval]

For the ``darkroom_dpt_star`` model of a study's run, on validation tasks unless ``--split``
says otherwise: the DPT paper's offline protocol (the task's own fixed context, one greedy
episode of ``eval.online_horizon`` steps from (0, 0), its own transitions not added), played
twice on the same tasks:
  1. as the model acts (the study's ``darkroom_dpt_star`` table, up to its random tie-breaks);
  2. the same, but "stay" forced whenever the agent stands on the goal: an oracle correction
     of one action, to tell "does not find the goal" from "finds it and walks off".
Printed for each: the return over all tasks and over the tasks whose context shows the goal,
how many of those the agent reaches, and its actions on the goal cell. A diagnosis, not a
baseline: the correction reads the goal. ``--checkpoint`` plays another checkpoint of that
model (an ``epoch-*`` one of a training still under way: where a long training stands).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from spice_ray.config import load_config
from spice_ray.data.store import load_split
from spice_ray.envs import darkroom
from spice_ray.model.registry import load_model
from spice_ray.model.tokens import make_tokens
from spice_ray.study.run_models import model_and_dataset

EXPERIMENT = "darkroom_dpt_star"
STAY = darkroom.ACTION_NAMES.index("stay")


def play(model, env, data: dict[str, np.ndarray], horizon: int, stay_on_goal: bool
         ) -> dict[str, np.ndarray]:
    """One greedy episode per task from (0, 0) on the task's fixed context."""
    goals = np.asarray(data["goal"], dtype=np.int64)
    size = env.params.grid_size
    state = np.zeros_like(goals)
    ret = np.zeros(len(goals))
    reached = np.zeros(len(goals), dtype=bool)
    on_goal_actions, stay_probs = [], []
    for _ in range(horizon):
        batch = dict(data)
        batch["query_state"] = state.astype(data["query_state"].dtype)
        with torch.no_grad():
            logits = model(make_tokens(batch, env)).logits[:, -1]
        action = logits.argmax(-1).numpy()
        on = (state == goals).all(1)
        stay_probs.append(torch.softmax(logits.float(), -1)[:, STAY].numpy()[on])
        if stay_on_goal:
            action = np.where(on, STAY, action)
        on_goal_actions.append(action[on])
        state = darkroom.move(state, action, size)
        hit = (state == goals).all(1)
        reached |= hit
        ret += hit
    return {"return": ret, "reached": reached, "stay_prob": np.concatenate(stay_probs),
            "on_goal": np.bincount(np.concatenate(on_goal_actions).astype(np.int64),
                                   minlength=darkroom.NUM_ACTIONS)}


def episode_inputs(run: Path, seed: int = 0, split: str = "validation",
                   checkpoint: Path | None = None):
    """(model, env config, tasks of ``split``, horizon) of the run's DPT* of training seed
    ``seed`` (or of ``checkpoint``, a checkpoint under the run's ``checkpoints/``)."""
    cfg = load_config(Path(run) / "configs" / f"{EXPERIMENT}.yaml")
    final, dataset = model_and_dataset(run, EXPERIMENT, "dpt", seed, checkpoint)
    data = load_split(dataset, split, limit=cfg.eval.num_tasks)
    return load_model(final, cfg.env, "dpt"), cfg.env, data, cfg.eval.online_horizon


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", type=Path, help="a study's run directory")
    p.add_argument("--seed", type=int, default=0, help="training seed of the model")
    p.add_argument("--split", choices=("train", "validation", "eval"), default="validation",
                   help="whose tasks: held-out goals (validation, the default: where a step "
                        "budget may be chosen; eval only to report) or the training goals")
    p.add_argument("--checkpoint", type=Path, help="another checkpoint of the run's model")
    args = p.parse_args()
    model, env, data, horizon = episode_inputs(args.run, args.seed, args.split, args.checkpoint)
    seen = np.asarray(data["rewards"]).sum(1) > 0
    print(f"{EXPERIMENT} DPT {args.checkpoint or f'seed {args.seed}'} of {args.run} "
          f"({len(seen)} {args.split} tasks; the "
          f"context shows the goal in {seen.sum()}):")
    for label, force in (("as it acts", False), ("stay forced on the goal", True)):
        out = play(model, env, data, horizon, force)
        names = ", ".join(f"{n} {c}" for n, c in zip(darkroom.ACTION_NAMES, out["on_goal"],
                                                     strict=True))
        print(f"  {label}: return {out['return'].mean():.2f} +- "
              f"{out['return'].std(ddof=1) / np.sqrt(len(seen)):.2f} (context shows the goal: "
              f"{out['return'][seen].mean():.2f}; reached in {out['reached'][seen].mean():.0%} "
              f"of those); actions on the goal: {names}; mean P(stay) there "
              + (f"{out['stay_prob'].mean():.3f}" if out["stay_prob"].size else "n/a"))


if __name__ == "__main__":
    main()
