"""Does a run's learned prior follow the context? The prior's mean against the exact posterior's.

    python tools/prior_follow.py RUN bandit_template [--seed 0] [--tasks 500] [--checkpoint DIR]
                                 [--split validation|eval]

For a structured bandit family with an exact posterior (``bandit_latent``, ``bandit_template``,
``linear_bandit``), the SPICE model of training seed ``--seed`` reads the first ``--tasks``
contexts of the validation split (the default: what it shows may choose a setting; ``--split
eval`` only to report, never to choose), and at h = 0, 5, 10, 20, 50, 100 and 200 transitions
(those within the horizon) prints (``spice_ray.evaluate.calibration.context_follow``): the slope
of the prior's move away from the family's mean on the exact posterior's move (1: it follows the
context, 0: it ignores it), the prior's RMSE against the exact posterior mean over tasks and
arms, and the RMSE of a prior that reads nothing of the context (the family's mean).
``--checkpoint`` reads another checkpoint of the run's model instead (an ``epoch-*`` one: when
the prior began to follow). No Ray, nothing written; one thread.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from spice_ray.config import load_config
from spice_ray.data.store import load_split
from spice_ray.evaluate.calibration import calibration_stats, context_follow
from spice_ray.model.registry import load_model, torch_threads
from spice_ray.study.run_models import model_and_dataset

LENGTHS = (0, 5, 10, 20, 50, 100, 200)


def follow_table(run: Path, experiment: str, seed: int = 0, tasks: int = 500,
                 checkpoint: Path | None = None, split: str = "validation") -> str:
    """The printed table for the run's SPICE model of ``seed`` in ``experiment`` (or for
    ``checkpoint``, a checkpoint under the run's ``checkpoints/``), on ``split``'s contexts."""
    cfg = load_config(Path(run) / "configs" / f"{experiment}.yaml")
    final, dataset = model_and_dataset(run, experiment, "spice", seed, checkpoint)
    data = load_split(dataset, split, limit=tasks)
    hs = np.array([h for h in LENGTHS if h <= cfg.env.horizon])
    with torch_threads(1), torch.no_grad():
        stats = calibration_stats(load_model(final, cfg.env, "spice").eval(), cfg.env, data,
                                  cfg.fusion, hs)
    if stats.oracle_mean is None:
        raise SystemExit(f"error: {experiment}'s environment has no exact posterior")
    fit = context_follow(stats.prior_mean, stats.oracle_mean)
    lines = [f"{experiment} SPICE {checkpoint or f'seed {seed}'} of {run} "
             f"({len(data['task_id'])} {split} tasks)",
             "      h   slope   RMSE vs exact posterior mean   RMSE, context ignored"]
    lines += [f"  {h:5d}  {s:6.3f}  {r:29.4f}  {b:22.4f}"
              for h, s, r, b in zip(hs, fit["slope"], fit["rmse"], fit["rmse_blind"],
                                    strict=True)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", type=Path, help="a study's run directory (or a ladder's rung)")
    p.add_argument("experiment", help="a structured bandit experiment of the run")
    p.add_argument("--seed", type=int, default=0, help="training seed of the model")
    p.add_argument("--tasks", type=int, default=500, help="contexts to read")
    p.add_argument("--checkpoint", type=Path, help="another checkpoint of the run's model")
    p.add_argument("--split", choices=("eval", "validation"), default="validation",
                   help="whose contexts (default: %(default)s, where what it shows may choose "
                        "a setting; eval only to report)")
    args = p.parse_args(argv)
    print(follow_table(args.run, args.experiment, args.seed, args.tasks, args.checkpoint,
                       args.split))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
