"""The one summary of result rows: average training seeds per task, then mean +- SEM over
tasks (the paper's convention). The report, the figures, the results CLI and the sweeps all
call :func:`summarise`."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from spice_ray.results.schema import KEY
from spice_ray.results.tables import ResultsError


def _keys(df: pd.DataFrame) -> list[str]:
    """Columns identifying a value apart from its seed: every column but value and seed."""
    return [c for c in df.columns if c not in ("value", "seed")]


def task_means(df: pd.DataFrame) -> pd.DataFrame:
    """Average over training seeds per task (the paper's first step)."""
    return df.groupby(_keys(df), dropna=False, observed=True)["value"].mean().reset_index()


def summarise(df: pd.DataFrame, by: Sequence[str] | None = None) -> pd.DataFrame:
    """Mean, SEM and n over tasks, after averaging seeds per task.

    Args:
        df: rows with ``value``, ``seed``, ``task_id`` and key columns (a result table, a sweep
            table, or any subset of one).
        by: grouping columns (default: every key column of the result schema except seed and
            task_id that ``df`` has).

    Returns:
        One row per group with columns ``mean``, ``sem``, ``n`` (tasks) and ``seeds``; the SEM
        of a single task is NaN.

    Raises:
        ResultsError: a grouping column is not in the rows.
    """
    seeds = df.groupby(_keys(df), dropna=False,
                       observed=True)["seed"].nunique().rename("seeds").reset_index()
    per_task = task_means(df).merge(seeds, how="left")
    if by is None:
        by = [c for c in KEY if c not in ("seed", "task_id") and c in per_task.columns]
    by = list(by)
    unknown = [c for c in by if c not in per_task.columns]
    if unknown:
        raise ResultsError(f"cannot group by {unknown}; columns are {list(per_task.columns)}")
    g = per_task.groupby(by, dropna=False, observed=True)
    out = g["value"].agg(mean="mean", std="std", n="count").reset_index()
    out["sem"] = out["std"] / np.sqrt(out["n"].clip(lower=1))
    out["seeds"] = g["seeds"].max().to_numpy()
    return out.drop(columns="std")[[*by, "mean", "sem", "n", "seeds"]]


def final_values(df: pd.DataFrame, metric: str) -> pd.DataFrame:
    """The rows of ``metric`` at each curve's last x (e.g. final cumulative regret)."""
    sub = df[df["metric"] == metric]
    return sub[sub["x"] == sub["x"].max()]
