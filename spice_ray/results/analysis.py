"""Analyses that turn a result table into sentences for the report (bsuite's ``score(df)``).

Each function takes one table's rows and returns sentences; the experiments name them beside
their tables (``spice_ray.experiments``).
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from spice_ray.results.summary import final_values, task_means

LEARNED, FLAT = "SPICE", "SPICE (flat prior)"
_PRIOR_KEYS = ("prior_mean", "prior_var", "kernel_space")
"""Fields a pair may differ in: the flat prior's own, and what the kernel compares (the flat
agent has no network, so it always compares raw states; bandits have no states at all)."""


def _fusion(config: str) -> str:
    """The fusion settings of a config that a pair must share."""
    cfg = {k: v for k, v in json.loads(config).items() if k not in _PRIOR_KEYS}
    return json.dumps(cfg, sort_keys=True)


def paired_difference(df: pd.DataFrame, method_a: str, method_b: str, metric: str,
                      x: int | None = None) -> tuple[float, float, int] | None:
    """Mean and SEM over tasks of (a - b) at the last x of ``metric`` (or at ``x``), for rows of
    the two methods with the same fusion settings (seeds averaged per task first); None
    without a pair.
    """
    sub = df[df["metric"] == metric]
    final = final_values(df, metric) if x is None else sub[sub["x"] == x]
    rows = final[final["method"].isin([method_a, method_b]) & (final["variant"] == "")]
    if rows.empty:
        return None
    rows = rows.assign(fusion=rows["config"].map(_fusion))
    per_task = task_means(rows.drop(columns=["config", "rule"]))
    wide = per_task.pivot_table(index=["fusion", "task_id"], columns="method", values="value")
    if method_a not in wide or method_b not in wide:
        return None
    diff = (wide[method_a] - wide[method_b]).dropna()
    if diff.empty:
        return None
    return float(diff.mean()), float(diff.std(ddof=1) / np.sqrt(len(diff))), int(len(diff))


def prior_contribution(df: pd.DataFrame) -> list[str]:
    """What the learned prior adds: the flat-prior row's final value minus SPICE's, paired by
    task at the same fusion settings (positive: the learned prior lowers regret or
    suboptimality)."""
    metrics = set(df["metric"])
    if "cumulative_regret" in metrics:
        points = [("cumulative_regret", None, "final cumulative regret")]
    elif "suboptimality" in metrics:  # the prior matters most before evidence piles up
        xs = sorted(df.loc[df["metric"] == "suboptimality", "x"].unique())
        points = [("suboptimality", int(h), f"suboptimality at context length h={h}")
                  for h in (xs[0], xs[-1])]
    else:
        return []
    out = []
    for metric, x, what in points:
        got = paired_difference(df, FLAT, LEARNED, metric, x)
        if got is None:
            continue
        mean, sem, n = got
        verdict = ("lowers" if mean - 2 * sem > 0 else "raises" if mean + 2 * sem < 0
                   else "does not change (within 2 SEM)")
        out.append(f"What the learned prior adds: {FLAT} minus {LEARNED}, {what}, paired by "
                   f"task: {mean:+.3g} +- {sem:.2g} (n={n} tasks); the learned prior {verdict} "
                   "it.")
    return out
