"""Choose ``train.lambda_q`` on validation tasks, label-free, from models trained at each value.

    python tools/loss_weight.py --preset small --env bandit_latent --set env.horizon=200 \
        --runs lq1=/tmp/lq/bandit_latent_1 lq10=/tmp/lq/bandit_latent_10

Each run directory holds SPICE checkpoints (``pipelines/pretrain.py``) of one setting of the
loss weights; every seed found is pooled. Printed per run:

- the criterion (no label read): the mean validation log-likelihood of each logged target
  under the prior of the position that has not seen it, at the width scale s fitted on the same
  contexts (``spice_ray.evaluate.width.fit_pooled_width``), and that s; the run with the
  highest value is chosen;
- a diagnostic that reads the labels (never used to choose): the RMSE of Q-bar against the
  exact posterior mean at context lengths 0, 5, 10, 20 and 50, and the 90% coverage of the
  exact posterior mean by Q-bar +- 1.645 s sigma_Q, where the environment has an exact posterior.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from spice_ray.config import make_config
from spice_ray.data import store
from spice_ray.evaluate.calibration import calibration_stats
from spice_ray.evaluate.width import fit_pooled_width
from spice_ray.model.registry import load_model

HS = np.array([0, 5, 10, 20, 50])


def _finals(run: Path) -> dict[int, Path]:
    found = sorted(run.glob("checkpoints/*/spice-*-seed*/final"))
    return {int(p.parent.name.rsplit("seed", 1)[1]): p for p in found}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="small")
    p.add_argument("--env", required=True)
    p.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE")
    p.add_argument("--runs", nargs="+", required=True, metavar="NAME=DIR")
    p.add_argument("--tasks", type=int, default=200, help="validation tasks read")
    args = p.parse_args(argv)
    cfg = make_config(args.preset, args.env, overrides=args.set)
    rows = []
    for item in args.runs:
        name, _, run = item.partition("=")
        if not run:
            p.error(f"--runs {item!r}: expected NAME=DIR")
        finals = _finals(Path(run))
        datasets = sorted(Path(run).glob("datasets/*"))
        if not finals or len(datasets) != 1:
            p.error(f"--runs {item!r}: no SPICE checkpoint or not one dataset under {run}")
        data = store.load_split(datasets[0], "validation", limit=args.tasks)
        unlabelled = {k: v for k, v in data.items()
                      if k not in ("label", "means", "optimal_action", "theta")}
        fit = fit_pooled_width(finals, unlabelled, cfg.env, cfg.fusion)
        rmse, cover = [], []
        fusion = cfg.fusion.__class__(**{**cfg.fusion.__dict__, "width_scale": fit["scale"]})
        for source in finals.values():
            stats = calibration_stats(load_model(source, cfg.env, kind="spice"), cfg.env, data,
                                      fusion, hs=HS[HS < data["actions"].shape[1]])
            if stats.oracle_mean is None:
                break
            err = stats.prior_mean - stats.oracle_mean  # (B, P, A)
            rmse.append(np.sqrt((err ** 2).mean((0, 2))))
            cover.append((np.abs(err) <= 1.645 * stats.prior_std).mean((0, 2)))
        rows.append((name, fit, np.mean(rmse, 0) if rmse else None,
                     np.mean(cover, 0) if cover else None, sorted(finals)))
    print(f"{args.env}: validation tasks {args.tasks}, context lengths {HS.tolist()}")
    for name, fit, rmse, cover, seeds in rows:
        line = (f"  {name:8s} seeds {seeds}: log-lik {fit['log_lik']:+.4f} per target at "
                f"s = {fit['scale']:.3f} (paper width {fit['log_lik_paper']:+.4f})")
        if rmse is not None:
            line += ("; RMSE vs exact " + " ".join(f"{x:.3f}" for x in rmse)
                     + "; 90% coverage " + " ".join(f"{x:.2f}" for x in cover))
        print(line)
    best = max(rows, key=lambda r: r[1]["log_lik"])
    print(f"chosen (highest validation log-likelihood, no label read): {best[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
