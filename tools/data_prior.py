"""A bandit family's context-free row with the prior estimated from training data, beside the
exact one: does knowing the population need the family's exact prior, or is it in the data?

    python tools/data_prior.py RUN bandit_latent [--confirm]

For a structured bandit experiment of a finished study (one with SPICE (context-free prior)
in its tuned table), the per-arm prior is estimated from the rewards of the experiment's
training tasks (``spice_ray.train.prior.data_arm_prior``: empirical Bayes by moments, what
SPICE could know without reading a context) and fed to SPICE's fusion and action rule as
"SPICE (training-data prior)": the context-free row's fusion, with the prior swapped. Its
setting is chosen on the validation tasks over the context-free row's own grid (beta, the
schedule), by the study's score (mean final cumulative regret); then it runs once on the eval
tasks and, with ``--confirm``, on the confirmation tasks (``pipelines/confirm.py``'s). Printed:
the estimated prior beside the exact one's h = 0 moments (mean over tasks), the validation
grid, and per split each row's final regret (+- SEM) with SPICE's in-context share against
the exact context-free row and against this one, paired by task, with the study's two-level
intervals. No Ray; nothing written.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd

from spice_ray.config import load_config
from spice_ray.data import store
from spice_ray.evaluate.online import online_rows
from spice_ray.results.analysis import (
    CONTEXT_FREE,
    FLAT,
    LEARNED,
    ORACLE,
    final_task_seeds,
    tuned_gap,
)
from spice_ray.results.schema import NO_SEED
from spice_ray.results.tables import ResultsError, load
from spice_ray.study.confirm import confirmation_tasks, table_name
from spice_ray.study.experiments import EXPERIMENTS
from spice_ray.study.tuning import chosen_specs, final_scores, grid_point, read_tuning
from spice_ray.train.prior import data_arm_prior

DATA = "SPICE (training-data prior)"


def candidates(run: Path, experiment: str) -> tuple[list, tuple, object]:
    """The context-free row's grid with the data prior swapped in (one candidate a point),
    the estimated prior, and the experiment's config."""
    cfg = load_config(run / "configs" / f"{experiment}.yaml")
    dataset = store.dataset_dir(run / "datasets", cfg)
    record = read_tuning(run).get(experiment)
    if record is None or CONTEXT_FREE not in record["methods"]:
        raise SystemExit(f"error: {run}: no tuning record of {CONTEXT_FREE} for {experiment}")
    base = next(c for c in chosen_specs(record, EXPERIMENTS[experiment], cfg, dataset)
                ["context_free"] if c.spec.label == CONTEXT_FREE).spec
    prior = data_arm_prior(cfg, dataset)
    out = []
    for point in record["methods"][CONTEXT_FREE]["grid"]:
        cand = grid_point(base, cfg.eval, record, point["setting"])
        spec = dataclasses.replace(cand.spec, method="spice-data-prior", prior=prior)
        out.append(dataclasses.replace(cand, spec=spec))
    return out, prior, cfg


def rows_on(cfg, cand, data) -> pd.DataFrame:
    """The candidate's final cumulative regret rows on ``data`` (a tuned table's shape)."""
    rows = online_rows(cfg.env, cand.eval_cfg, data, [cand.spec], None, NO_SEED,
                       final_only=True)
    return rows.assign(variant="")


def shares(rows: pd.DataFrame) -> dict[str, str]:
    """SPICE's in-context share against the exact context-free row and against the data
    prior's (relabelled as the context-free row), with their intervals."""
    out = {}
    for against in (CONTEXT_FREE, DATA):
        use = rows[rows["method"] != (DATA if against == CONTEXT_FREE else CONTEXT_FREE)]
        use = use.assign(method=use["method"].replace({DATA: CONTEXT_FREE}))
        gap = tuned_gap(final_task_seeds(use)).set_index("method").loc[LEARNED]
        text = (f"{gap['in_context_share']:.2f} [{gap['in_context_lo']:.2f}, "
                f"{gap['in_context_hi']:.2f}]")
        out[against] = text + ("" if gap["in_context_defined"] else
                               " (undefined: oracle not 2 SEMs ahead)")
    return out


def report(name: str, tuned: pd.DataFrame, data_rows: pd.DataFrame) -> None:
    keep = tuned["method"].isin([LEARNED, ORACLE, CONTEXT_FREE, FLAT])
    rows = pd.concat([tuned[keep], data_rows], ignore_index=True)
    wide = final_task_seeds(rows).wide()
    print(f"\n{name}: final cumulative regret, mean +- SEM over tasks (seeds averaged)")
    for m in wide.columns:
        v = wide[m].dropna()
        print(f"  {m:32s} {v.mean():7.3f} +- {v.std(ddof=1) / np.sqrt(len(v)):.3f} ({len(v)})")
    for against, text in shares(rows).items():
        print(f"  SPICE's in-context share against {against}: {text}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", type=Path, help="a finished study's run directory (read only)")
    p.add_argument("experiment", help="a structured bandit experiment of the run")
    p.add_argument("--confirm", action="store_true",
                   help="also on the confirmation tasks (needs RUN's <experiment>_confirm)")
    args = p.parse_args(argv)
    confirm = None
    if args.confirm:  # before any work: the confirmation table must exist
        try:
            confirm = load(args.run, table_name(args.experiment))
        except ResultsError as exc:
            raise SystemExit(f"error: {exc}; score it first: python pipelines/confirm.py "
                             f"--out {args.run} --experiments {args.experiment}") from None
    grid, prior, cfg = candidates(args.run, args.experiment)
    dataset = store.dataset_dir(args.run / "datasets", cfg)
    exact = cfg.environment().task_posterior(cfg.fusion.gamma)
    data = store.load_split(dataset, "validation", limit=cfg.eval.num_tasks)
    exact.reset(len(data["task_id"]))
    mean0, var0 = exact.moments(np.zeros(len(data["task_id"]), dtype=np.int64))
    print(f"{args.experiment}: per-arm prior from the training tasks' rewards")
    print("  mean " + " ".join(f"{m:.3f}" for m in prior[0]) + "   (exact h = 0: "
          + " ".join(f"{m:.3f}" for m in mean0.mean(0)) + ")")
    print("  sd   " + " ".join(f"{v ** 0.5:.3f}" for v in prior[1]) + "   (exact h = 0: "
          + " ".join(f"{v:.3f}" for v in np.sqrt(var0).mean(0)) + ")")
    scores = final_scores(pd.concat([rows_on(cfg, c, data) for c in grid], ignore_index=True))
    print("validation grid (mean final regret +- SEM):")
    for c, (_, s) in zip(grid, scores.iterrows(), strict=True):
        print(f"  {dict(c.setting)}: {s['mean']:.3f} +- {s['sem']:.3f}")
    chosen = grid[int(np.argmin(scores["mean"].to_numpy()))]
    print(f"chosen on validation: {dict(chosen.setting)}")
    splits = {"eval": (load(args.run, f"{args.experiment}_tuned"),
                       store.load_split(dataset, "eval", limit=cfg.eval.num_tasks))}
    if confirm is not None:
        splits["confirmation"] = (confirm, confirmation_tasks(cfg, confirm["task_id"].nunique()))
    for split, (table, tasks) in splits.items():
        report(f"{args.experiment}, {split} tasks", table, rows_on(cfg, chosen, tasks))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
