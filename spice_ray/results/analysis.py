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
_PRIOR_KEYS = ("prior_mean", "prior_var")


def _fusion(config: str) -> str:
    """The fusion settings of a config, without the flat prior's own fields."""
    cfg = {k: v for k, v in json.loads(config).items() if k not in _PRIOR_KEYS}
    return json.dumps(cfg, sort_keys=True)


def paired_difference(df: pd.DataFrame, method_a: str, method_b: str, metric: str
                      ) -> tuple[float, float, int] | None:
    """Mean and SEM over tasks of (a - b) at the last x of ``metric``, for rows of the two
    methods with the same fusion settings (seeds averaged per task first); None without a pair.
    """
    final = final_values(df, metric)
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
    metric = next((m for m in ("cumulative_regret", "suboptimality") if m in set(df["metric"])),
                  None)
    if metric is None:
        return []
    got = paired_difference(df, FLAT, LEARNED, metric)
    if got is None:
        return []
    mean, sem, n = got
    what = "final cumulative regret" if metric == "cumulative_regret" else \
        "suboptimality at the longest context"
    verdict = ("lowers" if mean - 2 * sem > 0 else "raises" if mean + 2 * sem < 0
               else "does not change (within 2 SEM)")
    return [f"What the learned prior adds: {FLAT} minus {LEARNED}, {what}, paired by task: "
            f"{mean:+.3g} +- {sem:.2g} (n={n} tasks); the learned prior {verdict} it."]
