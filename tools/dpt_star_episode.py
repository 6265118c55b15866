"""Where a DPT* darkroom episode loses its return: the DPT paper's protocol, then one action
fixed; and DPT*'s step budget chosen on validation tasks.

    python tools/dpt_star_episode.py RUN [--seeds 0,1,2] [--split validation|eval|train]
                                     [--checkpoint DIR | --epoch E | --every-checkpoint]
                                     [--tasks N] [--csv FILE] [--plot PNG]

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
model (an ``epoch-*`` one of a training still under way: where a long training stands);
``--epoch E`` the checkpoint after E epochs of every seed in ``--seeds``, and then their mean
return with a 95% interval that resamples the trainings (seeds) and the tasks, clustered by
goal (the split's tasks share a few held-out goals).

``--every-checkpoint`` plays every ``epoch-*`` checkpoint of every seed (as it acts, on the
validation tasks by default) and ends with one line per checkpoint and the step budget
:func:`choose_budget` takes from them: the checkpoint of the highest return averaged over the
seeds on the same tasks (fewer steps on a tie). Under a constant learning rate a checkpoint is
what a training of that many epochs ends with, so that budget is DPT*'s scored one, chosen
with no label of eval; then ``--epoch E --split eval`` reports it. No Ray; one thread.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from spice_ray.common.errors import SpiceRayError
from spice_ray.data.store import load_split
from spice_ray.envs import darkroom
from spice_ray.model.registry import load_model, torch_threads
from spice_ray.model.tokens import make_tokens
from spice_ray.results.summary import hierarchical_interval, weighted_mean
from spice_ray.study.run_models import (
    checkpoint_after,
    epoch_checkpoints,
    experiment_config,
    model_and_dataset,
    trained_epochs,
)
from spice_ray.train.loop import steps_per_epoch

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
                   checkpoint: Path | None = None, tasks: int | None = None):
    """(model, env config, tasks of ``split``, horizon) of the run's DPT* of training seed
    ``seed`` (or of ``checkpoint``, a checkpoint under the run's ``checkpoints/``); the first
    ``tasks`` of the split (default: as many as the study evaluates, ``eval.num_tasks``)."""
    cfg = experiment_config(run, EXPERIMENT)
    final, dataset = model_and_dataset(run, EXPERIMENT, "dpt", seed, checkpoint)
    data = load_split(dataset, split, limit=tasks or cfg.eval.num_tasks)
    return load_model(final, cfg.env, "dpt"), cfg.env, data, cfg.eval.online_horizon


def _epochs(n: int) -> str:
    return f"{n} epoch" + ("" if n == 1 else "s")


def choose_budget(table: pd.DataFrame) -> pd.Series:
    """The step budget by validation return: the row of :func:`budget_table` ``table`` with
    the highest return averaged over seeds and tasks; the fewer steps on a tie."""
    best = table["mean"].max()
    return table[table["mean"] == best].sort_values("steps").iloc[0]


def budget_table(returns: pd.DataFrame) -> pd.DataFrame:
    """Of per-task rows (``epoch``, ``steps``, ``seed``, ``task``, ``return``), per checkpoint:
    each seed's mean return over the tasks, their mean (``mean``) and the standard error of
    the seed-averaged task returns (``sem``).

    Raises:
        ValueError: some checkpoint lacks a seed or a task the others have (its mean would
            not be over the same tasks and trainings).
    """
    counts = returns.groupby("steps")[["seed", "task"]].nunique()
    full = (counts["seed"] == returns["seed"].nunique()) & \
        (counts["task"] == returns["task"].nunique())
    if not full.all():
        raise ValueError("checkpoints at steps " + ", ".join(map(str, counts.index[~full]))
                         + " lack a seed or task the others have: play every seed's "
                         "checkpoint on the same tasks")
    per_seed = returns.pivot_table(index="steps", columns="seed", values="return",
                                   aggfunc="mean")
    per_task = returns.groupby(["steps", "task"])["return"].mean()
    sem = per_task.groupby(level="steps").agg(lambda v: v.std(ddof=1) / np.sqrt(len(v)))
    table = per_seed.rename(columns=lambda k: f"seed {k}").rename_axis(columns=None)
    table = table.assign(mean=per_seed.mean(axis=1), sem=sem).reset_index()
    epochs = returns.drop_duplicates("steps").set_index("steps")["epoch"]
    table.insert(0, "epoch", table["steps"].map(epochs))
    return table


def task_rows(out: dict[str, np.ndarray], env, data, **keys) -> pd.DataFrame:
    """Per-task rows of a :func:`play` of ``data``'s tasks: ``task``, ``goal`` (the cell's
    index), ``return``, whether the context shows the goal, and ``keys``."""
    goals = np.asarray(data["goal"], dtype=np.int64)
    return pd.DataFrame({"task": np.arange(len(goals)),
                         "goal": goals[:, 0] * env.params.grid_size + goals[:, 1],
                         "return": out["return"],
                         "shown": np.asarray(data["rewards"]).sum(1) > 0} | keys)


def seeds_interval(rows: pd.DataFrame) -> tuple[float, float, float]:
    """Mean return over seeds and tasks and its 95% interval, resampling seeds and tasks
    (clustered by goal): ``summary.hierarchical_interval``."""
    values = rows.pivot(index="task", columns="seed", values="return")
    goals = rows.drop_duplicates("task").set_index("task").loc[values.index, "goal"]
    return hierarchical_interval(lambda means, w: weighted_mean(means[0], w),
                                 [values.to_numpy()], goals.to_numpy())


def plot_budget(table: pd.DataFrame, chosen: pd.Series, path: Path, split: str) -> Path:
    """Return per checkpoint, each seed and their mean (+- SEM over tasks), the budget
    marked: what ``--every-checkpoint`` chose from."""
    from spice_ray.results.figure_files import plt, save

    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for col in [c for c in table.columns if c.startswith("seed ")]:
        ax.plot(table["steps"], table[col], lw=0.8, alpha=0.6, marker=".", label=col)
    ax.errorbar(table["steps"], table["mean"], yerr=table["sem"], color="black", lw=1.6,
                capsize=2, label="mean over seeds")
    ax.axvline(chosen["steps"], color="grey", ls="--", lw=0.8,
               label=f"budget: {int(chosen['steps']):,} steps")
    ax.set_xlabel("training steps")
    ax.set_ylabel(f"return ({split} tasks)")
    ax.set_title("DPT* by the DPT paper's protocol, per checkpoint", fontsize=10)
    ax.legend(fontsize=7, frameon=False)
    return save(fig, Path(path), f"one greedy episode of each {split} task from (0, 0) on its "
                "fixed context; error bars: SEM over tasks of the seeds' mean")


def diagnose(model, env, data, horizon: int, label: str) -> dict[str, np.ndarray]:
    """The two plays of one checkpoint, printed (as it acts, and with stay forced); returns
    the first."""
    seen = np.asarray(data["rewards"]).sum(1) > 0
    print(f"{label} ({len(seen)} tasks; the context shows the goal in {seen.sum()}):")
    plays = {}
    for name, force in (("as it acts", False), ("stay forced on the goal", True)):
        with torch_threads(1):
            out = plays[force] = play(model, env, data, horizon, force)
        names = ", ".join(f"{n} {c}" for n, c in zip(darkroom.ACTION_NAMES, out["on_goal"],
                                                     strict=True))
        print(f"  {name}: return {out['return'].mean():.2f} +- "
              f"{out['return'].std(ddof=1) / np.sqrt(len(seen)):.2f} (context shows the goal: "
              f"{out['return'][seen].mean():.2f}; reached in {out['reached'][seen].mean():.0%} "
              f"of those); actions on the goal: {names}; mean P(stay) there "
              + (f"{out['stay_prob'].mean():.3f}" if out["stay_prob"].size else "n/a"))
    return plays[False]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", type=Path, help="a study's run directory")
    p.add_argument("--seeds", "--seed", default="0",
                   help="training seeds of the models, comma-separated (default: 0)")
    p.add_argument("--split", choices=("train", "validation", "eval"), default="validation",
                   help="whose tasks: held-out goals (validation, the default: where a step "
                        "budget may be chosen; eval only to report) or the training goals")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--checkpoint", type=Path, help="another checkpoint of the run's model")
    which.add_argument("--epoch", type=int,
                       help="every seed's checkpoint after this many epochs of training")
    which.add_argument("--every-checkpoint", action="store_true",
                       help="play every epoch checkpoint of every seed and choose the budget")
    p.add_argument("--tasks", type=int, default=0,
                   help="the split's first N tasks (default: every validation task, or as "
                        "many as the study evaluates on the other splits)")
    p.add_argument("--csv", type=Path, help="also write the per-task returns to this file")
    p.add_argument("--plot", type=Path,
                   help="with --every-checkpoint: also draw the return per checkpoint (PNG)")
    args = p.parse_args(argv)
    if not re.fullmatch(r"\d+(,\d+)*", args.seeds):
        raise SystemExit(f"error: --seeds {args.seeds[:80]!r} is invalid: e.g. 0,1,2")
    if args.plot and not args.every_checkpoint:
        raise SystemExit("error: --plot draws what --every-checkpoint plays: give both")
    if args.tasks < 0:
        raise SystemExit(f"error: --tasks {args.tasks} is invalid: an integer >= 0")
    seeds = [int(s) for s in args.seeds.split(",")]
    try:
        cfg = experiment_config(args.run, EXPERIMENT)
        tasks = args.tasks or (cfg.data.num_val_tasks if args.split == "validation"
                               else cfg.eval.num_tasks)
        per_epoch = steps_per_epoch(cfg)
        frames = []
        for seed in seeds:
            if args.checkpoint is not None or (args.epoch is None
                                               and not args.every_checkpoint):
                model, env, data, horizon = episode_inputs(args.run, seed, args.split,
                                                           args.checkpoint, tasks)
                diagnose(model, env, data, horizon, f"{EXPERIMENT} DPT "
                         f"{args.checkpoint or f'seed {seed}'} of {args.run}, {args.split}")
                continue
            if args.epoch is not None:
                trained = {args.epoch: checkpoint_after(args.run, EXPERIMENT, seed,
                                                        args.epoch, kind="dpt")}
            else:
                trained = {trained_epochs(c): c
                           for c in epoch_checkpoints(args.run, EXPERIMENT, seed, kind="dpt")}
            for epochs, ckpt in sorted(trained.items()):
                model, env, data, horizon = episode_inputs(args.run, seed, args.split, ckpt,
                                                           tasks)
                if args.epoch is not None:
                    acted = diagnose(model, env, data, horizon, f"{EXPERIMENT} DPT seed "
                                     f"{seed}, {_epochs(epochs)} ({epochs * per_epoch:,} "
                                     f"steps), {args.split}")
                else:
                    with torch_threads(1):
                        acted = play(model, env, data, horizon, False)
                rows = task_rows(acted, env, data, seed=seed, epoch=epochs,
                                 steps=epochs * per_epoch)
                if args.every_checkpoint:
                    print(f"seed {seed}, {_epochs(epochs)} ({epochs * per_epoch:,} steps): "
                          f"return {rows['return'].mean():.2f} on {len(rows)} {args.split} "
                          "tasks", flush=True)
                frames.append(rows)
    except (OSError, ValueError, KeyError, SpiceRayError) as exc:
        raise SystemExit(f"error: {exc}") from None
    if not frames:
        return 0
    rows = pd.concat(frames, ignore_index=True)
    if args.csv:
        rows.to_csv(args.csv, index=False)
    if args.every_checkpoint:
        try:
            table = budget_table(rows)
        except ValueError as exc:
            raise SystemExit(f"error: {exc}") from None
        chosen = choose_budget(table)
        print(f"\nreturn by checkpoint ({args.split} tasks, as it acts):")
        print(table.to_string(index=False, float_format=lambda v: f"{v:.2f}"))
        if args.plot:
            print(f"figure: {plot_budget(table, chosen, args.plot, args.split)}")
        print(f"budget: {int(chosen['steps']):,} steps ({_epochs(int(chosen['epoch']))}), the "
              f"highest {args.split} return averaged over seeds {args.seeds} "
              f"({chosen['mean']:.2f} +- {chosen['sem']:.2f})")
    else:
        point, low, high = seeds_interval(rows)
        print(f"\nDPT* after {_epochs(args.epoch)}, seeds {args.seeds}, {len(data['goal'])} "
              f"{args.split} tasks: return {point:.2f} [{low:.2f}, {high:.2f}] (95%: seeds and "
              "tasks resampled, tasks clustered by goal)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
