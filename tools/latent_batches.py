"""Is a task's result the same whatever batch it runs in? The latent bandit's model-free exact-prior
rows on ``small``'s eval tasks, run in 1, 2 and 4 batches.

    python tools/latent_batches.py [--beta 1]

Prints, for SPICE (oracle prior) and Bayes posterior-UCB at ``--beta``, the mean final
cumulative regret over the 500 eval tasks of ``small``'s latent bandit, run as one batch, as
2 x 250 and as 4 x 125 (``spice_ray.evaluate.online.online_rows``; the same keyed noise and
draws per task). Equal rows are what ``tests/test_batch_invariance.py`` asserts at smoke size.
No Ray, nothing written; one thread; a few minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import dataclasses

import numpy as np
import torch

from spice_ray.agents import AgentSpec
from spice_ray.config import make_config
from spice_ray.data.tasks import generate_tasks
from spice_ray.evaluate.online import online_rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--beta", type=float, default=1.0, help="posterior-UCB's beta")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    cfg = make_config("small", "bandit_latent")
    n = cfg.eval.num_tasks
    data = generate_tasks(cfg.env, cfg.data, "eval", np.arange(n))
    for method in ("spice-oracle", "bayes-ucb"):
        spec = AgentSpec(method, fusion=dataclasses.replace(cfg.fusion, beta=args.beta))
        for parts in (1, 2, 4):
            finals = []
            for ids in np.array_split(np.arange(n), parts):
                rows = online_rows(cfg.env, cfg.eval, {k: v[ids] for k, v in data.items()},
                                   [spec], final_only=True)
                rows = rows[rows.metric == "cumulative_regret"].sort_values("task_id")
                finals.append(rows["value"].to_numpy())
            print(f"{spec.label} beta {args.beta:g}, {n} eval tasks in {parts} batch(es): "
                  f"mean final regret {np.concatenate(finals).mean():.4f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
