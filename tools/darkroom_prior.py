"""Does a darkroom family's learned prior read the goal from its context? The read-out, per
checkpoint.

    python tools/darkroom_prior.py RUN darkroom_region [--seeds 0,1,2] [--tasks 200]
                                   [--split validation|eval] [--every-checkpoint]
                                   [--checkpoint DIR] [--csv FILE]
                                   [--set SECTION.FIELD=VALUE ...]

For a grid darkroom family (``darkroom``, ``darkroom_region``, ``darkroom_continuous``; walk
contexts), each SPICE model of the run reads the first ``--tasks`` contexts of the validation
split (the default: what it shows may choose a step budget; ``--split eval`` only to report)
and at h = 0, 10, 25, 50 and 99 (the last position the agent acts from) prints
(``spice_ray.evaluate.darkroom_prior``), for all contexts and split by whether the walk has
arrived on the goal: the share of states where argmax Q-bar is an optimal action, beside the
exact posterior's (``bayes``: the best a prior could do with the context) and the context-free
prior's (``blind``: the family's goal distribution, no context), and (goal cell) of the walks
that have arrived, the share whose argmax Q-bar on first arriving is stay; the RMSE against
the task's optimal values Q* and the mean of Q-bar and of Q* (their scales); the spread over
states of max Q-bar and of V* and their correlation (whether the values follow the states);
and per width source the 90% coverage of Q* and the mean N_pri. ``--every-checkpoint`` reads each
``epoch-*`` checkpoint of each seed's training (under way or finished) and ends with one line
per checkpoint: the share where the goal was shown, over h >= 10 and seeds, the label-free
number a step budget can be chosen by, and the goal-cell share beside it. ``--csv`` also
writes every row. ``--set`` changes the run's config of the experiment before its models are
found, e.g. ``--set train.lambda_shrink=0`` reads the models ``tools/population_train.py``
trained with that setting beside the study's own. No Ray; one thread.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pandas as pd
import torch

from spice_ray.common.errors import SpiceRayError
from spice_ray.data.store import load_split
from spice_ray.evaluate.darkroom_prior import (
    SHOWN_FROM,
    darkroom_prior_rows,
    goal_cell_pooled,
    pooled_shares,
)
from spice_ray.model.checkpoint import read_meta
from spice_ray.model.registry import load_model, torch_threads
from spice_ray.study.run_models import (
    epoch_checkpoints,
    experiment_config,
    model_and_dataset,
)


def readout(run: Path, experiment: str, seed: int, tasks: int, split: str,
            checkpoint: Path | None = None, overrides: tuple[str, ...] = ()) -> pd.DataFrame:
    """The read-out rows of one checkpoint (the final one by default), with its seed and
    training steps."""
    cfg = experiment_config(run, experiment, overrides)
    ckpt, dataset = model_and_dataset(run, experiment, "spice", seed, checkpoint)
    data = load_split(dataset, split, limit=tasks)
    with torch_threads(1), torch.no_grad():
        model = load_model(ckpt, cfg.env, "spice").eval()
        rows = darkroom_prior_rows(model, cfg.env, data, cfg.fusion, cfg.train.gamma)
    meta = read_meta(ckpt)
    epoch = int(meta["metrics"]["epoch"]) + 1 if "metrics" in meta else None
    steps = epoch * -(-cfg.data.num_train_tasks // cfg.train.batch_size) if epoch else None
    return rows.assign(seed=seed, epoch=epoch, steps=steps, checkpoint=str(ckpt), split=split)


def show(rows: pd.DataFrame) -> str:
    """The printed table of one checkpoint's rows."""
    widths = sorted({c[len("coverage_90_"):] for c in rows if c.startswith("coverage_90_")})
    stay = "goal_cell_share" in rows
    head = ("    h  context           n   optimal action: learned  bayes  blind"
            + ("  goal cell" if stay else "") + "   "
            "RMSE vs Q*: learned  bayes  blind   mean: Q-bar  Q*   V sd: learned  V*  corr"
            + "".join(f"   cov90 / N_pri ({w})" for w in widths))
    lines = [head]
    for r in rows.itertuples(index=False):
        r = r._asdict()
        lines.append(f"  {r['h']:3d}  {r['context']:14s} {r['n']:4d}   {r['optimal_share']:23.3f}"
                     f"  {r['optimal_share_bayes']:5.3f}  {r['optimal_share_blind']:5.3f}"
                     + (f"  {r['goal_cell_share']:9.3f}" if stay else "") +
                     f"   {r['rmse']:19.3f}  {r['rmse_bayes']:5.3f}  {r['rmse_blind']:5.3f}"
                     f"   {r['mean_learned']:11.3f}  {r['mean_q_star']:5.2f}"
                     f"   {r.get('v_sd_learned', float('nan')):13.3f}"
                     f"  {r.get('v_sd_q_star', float('nan')):4.2f}"
                     f"  {r.get('v_corr', float('nan')):5.2f}"
                     + "".join(f"   {r[f'coverage_90_{w}']:5.3f} / {r[f'n_pri_{w}']:<8.3g}"
                               for w in widths))
    return "\n".join(lines)


def budget_score(rows: pd.DataFrame) -> pd.DataFrame:
    """Per checkpoint (epoch, steps): the optimal share where the goal was shown, at
    h >= :data:`SHOWN_FROM`, pooled over states and seeds, and per seed (``pooled_shares``)."""
    shares = pooled_shares(rows)
    shown = shares[shares["context"] == "goal shown"]
    table = shown.pivot(index="steps", columns="seed", values="optimal_share")
    table = table.drop(columns=-1).assign(pooled=table[-1]).rename_axis(columns=None)
    epoch = rows.drop_duplicates("steps").set_index("steps")["epoch"]
    out = table.reset_index()
    out.insert(0, "epoch", out["steps"].map(epoch))
    out["goal cell"] = out["steps"].map(goal_cell_pooled(rows))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", type=Path, help="a study's run directory")
    p.add_argument("experiment", help="a darkroom experiment of the run")
    p.add_argument("--seeds", default="0", help="training seeds, comma-separated")
    p.add_argument("--tasks", type=int, default=200, help="contexts to read")
    p.add_argument("--split", choices=("validation", "eval"), default="validation",
                   help="whose contexts (default: %(default)s)")
    p.add_argument("--checkpoint", type=Path, help="another checkpoint of the run's model")
    p.add_argument("--every-checkpoint", action="store_true",
                   help="read every epoch checkpoint of each seed's training")
    p.add_argument("--csv", type=Path, help="also write every row to this file")
    p.add_argument("--set", action="append", default=[], dest="overrides",
                   metavar="SECTION.FIELD=VALUE", help="change the experiment's config first")
    args = p.parse_args(argv)
    if not re.fullmatch(r"\d+(,\d+)*", args.seeds):
        raise SystemExit(f"error: --seeds {args.seeds[:80]!r} is invalid: e.g. 0,1,2")
    seeds = [int(s) for s in args.seeds.split(",")]
    frames = []
    for seed in seeds:
        try:  # a missing run, experiment or config is one line naming it
            ckpts = (epoch_checkpoints(args.run, args.experiment, seed, tuple(args.overrides))
                     if args.every_checkpoint else [args.checkpoint])
        except (OSError, ValueError, SpiceRayError) as exc:
            raise SystemExit(f"error: {exc}") from None
        for ckpt in ckpts:
            try:
                rows = readout(args.run, args.experiment, seed, args.tasks, args.split, ckpt,
                               tuple(args.overrides))
            except (OSError, ValueError, SpiceRayError) as exc:  # e.g. no final model yet
                raise SystemExit(f"error: {exc}" + ("" if args.every_checkpoint else
                                 " (a training under way: --every-checkpoint)")) from None
            frames.append(rows)
            print(f"{args.experiment} SPICE seed {seed}, epoch {rows['epoch'].iloc[0]} "
                  f"({rows['steps'].iloc[0]} steps), {args.split} contexts of {args.run}")
            print(show(rows))
    rows = pd.concat(frames, ignore_index=True)
    print(f"\noptimal share where the goal was shown (h >= {SHOWN_FROM}) and (goal cell) the "
          "share of walks whose argmax Q-bar on first arriving at the goal is stay (or a move "
          "into a wall), by checkpoint:")
    print(budget_score(rows).to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    if args.csv:
        rows.to_csv(args.csv, index=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
