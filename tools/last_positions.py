"""The darkroom read-out at the end of the context, where the value heads' TD(n) windows are cut.

    python -m tools.last_positions RUN darkroom_region --epoch 7 [--seeds 0,1,2] [--tasks 200]
        [--set SECTION.FIELD=VALUE ...]                       # from the repository root

``tools/darkroom_prior.py`` reads positions up to T - 1, the last one the online agent acts
from. This reads the epoch checkpoint ``--epoch`` of each seed's training at h = 50 (where
T > 50), T - 5, T - 1 and T on the validation walks: the share of goal-shown and not-shown
states where argmax Q-bar is an optimal action, and the mean Q-bar where the goal was shown.
Position T follows the last transition: no loss regresses its values (transition t's
prediction comes from position t - 1), yet with ``train.tail=bootstrap`` every window cut by
the context's end bootstraps from them (the paper's indicator never reads them: V(s_{t+n}) is
read at position t + n - 1 <= T - 1). No Ray; one thread.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from spice_ray.data.store import dataset_dir, load_split
from spice_ray.evaluate.darkroom_prior import exact_readout, learned_readout, optimal_set
from spice_ray.model.registry import load_model, torch_threads
from spice_ray.study.run_models import checkpoint_after, experiment_config


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", type=Path, help="a study's run directory")
    p.add_argument("experiment", help="a grid darkroom experiment of the run")
    p.add_argument("--epoch", type=int, required=True,
                   help="the checkpoint after this many epochs of training")
    p.add_argument("--seeds", default="0", help="training seeds, comma-separated")
    p.add_argument("--tasks", type=int, default=200, help="validation walks to read")
    p.add_argument("--set", action="append", default=[], dest="overrides",
                   metavar="SECTION.FIELD=VALUE")
    args = p.parse_args(argv)
    overrides = tuple(args.overrides)
    cfg = experiment_config(args.run, args.experiment, overrides)
    data = load_split(dataset_dir(args.run / "datasets", cfg), "validation", limit=args.tasks)
    env = cfg.env.environment()
    T = np.asarray(data["actions"]).shape[1]
    hs = np.unique(np.clip([50, T - 5, T - 1, T], 0, T))  # 50 only inside a context that long
    exact = exact_readout(env.goal_family(), data["goal"],
                          env.positions(np.asarray(data["states"])), data["rewards"], hs,
                          cfg.train.gamma)
    optimal = optimal_set(exact.q_star)  # (B, P, A)
    print(f"{args.experiment}, epoch {args.epoch}, {args.tasks} validation walks: argmax Q-bar "
          "optimal where the goal was shown / not shown (mean Q-bar where shown)")
    print("  seed  " + "  ".join(f"{f'h = {h}':>24s}" for h in hs))
    for seed in (int(s) for s in args.seeds.split(",")):
        try:
            checkpoint = checkpoint_after(args.run, args.experiment, seed, args.epoch,
                                          overrides)
        except ValueError as exc:
            raise SystemExit(f"error: --epoch {args.epoch}: {exc}") from None
        with torch_threads(1), torch.no_grad():
            model = load_model(checkpoint, cfg.env, "spice").eval()
            mean = learned_readout(model, cfg.env, data, hs)["prior_mean"]  # (B, P, A)
        hit = np.take_along_axis(optimal, mean.argmax(-1)[..., None], -1)[..., 0]
        cells = []
        for j in range(len(hs)):
            shown = exact.shown[:, j]
            cells.append(f"{hit[shown, j].mean():.3f} / {hit[~shown, j].mean():.3f} "
                         f"({mean[shown, j].mean():.2f})")
        print(f"  {seed:4d}  " + "  ".join(f"{c:>24s}" for c in cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
