"""Tables a paper takes: one metric at one x, a row per method and setting, ``mean +- SEM``,
the best row in bold and a mark on every row the paired comparison cannot tell from the best.

    python -m spice_ray.results RUN bandit_online --by method --at last \\
        --where "metric == 'cumulative_regret'" --format latex

The comparison is paired by task (after averaging seeds per task): a row is marked when
|mean difference to the best row| <= 1.96 x the SEM of the per-task differences (a two-sided
paired z-test at 5%), i.e. it is statistically tied with the best.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from spice_ray.results.summary import task_means
from spice_ray.results.tables import ResultsError

HIGHER_IS_BETTER = frozenset({"cumulative_return", "return", "final_return"})
"""Metrics where a larger value is better (every other metric is a regret or a loss)."""
Z_95 = 1.96


def _escape_latex(text: str) -> str:
    for char, repl in (("\\", r"\textbackslash{}"), ("&", r"\&"), ("%", r"\%"), ("#", r"\#"),
                       ("_", r"\_"), ("$", r"\$"), ("{", r"\{"), ("}", r"\}")):
        text = text.replace(char, repl)
    return text


def ranked(df: pd.DataFrame, summary: pd.DataFrame) -> pd.DataFrame:
    """``summary`` (mean, sem, n and a ``label`` column per row) with ``best`` (the lowest mean,
    or highest for :data:`HIGHER_IS_BETTER`) and ``tied`` (paired test against the best row),
    best first.

    Raises:
        ResultsError: the rows hold more than one metric or more than one x.
    """
    for column, hint in (("metric", "--where \"metric == '...'\""),
                         ("x", "--at last, or --where 'x == ...'")):
        if column in df and df[column].nunique() > 1:
            raise ResultsError(f"a paper table shows one {column}; these rows hold "
                               f"{df[column].nunique()}: choose one with {hint}")
    higher = bool(df["metric"].isin(HIGHER_IS_BETTER).all()) if "metric" in df else False
    per_task = task_means(df)
    keys = [c for c in summary.columns if c in per_task.columns and c not in ("value",)]
    out = summary.reset_index(drop=True).copy()
    best = int(out["mean"].idxmax() if higher else out["mean"].idxmin())
    out["best"] = out.index == best

    def tasks_of(row: pd.Series) -> pd.Series:
        mask = np.ones(len(per_task), dtype=bool)
        for k in keys:
            mask &= (per_task[k] == row[k]).to_numpy()
        return per_task[mask].groupby("task_id")["value"].mean()

    reference = tasks_of(out.loc[best])
    tied = []
    for i, row in out.iterrows():
        if i == best:
            tied.append(False)
            continue
        a, b = tasks_of(row).align(reference, join="inner")
        d = (a - b).to_numpy()
        se = d.std(ddof=1) / np.sqrt(len(d)) if len(d) > 1 else np.nan
        tied.append(bool(len(d) > 1 and abs(d.mean()) <= Z_95 * se))
    out["tied"] = tied
    return out.sort_values("mean", ascending=not higher, kind="stable")


def render(table: pd.DataFrame, fmt: str, metric: str = "", digits: int = 2) -> str:
    """A :func:`ranked` table as ``markdown`` or ``latex`` (booktabs) text."""
    cells = []
    for _, row in table.iterrows():
        value = f"{row['mean']:.{digits}f} ± {row['sem']:.{digits}f}"
        cells.append((str(row["label"]), value, int(row["n"]), bool(row["best"]),
                      bool(row["tied"])))
    note = ("best in bold; † not distinguishable from the best (paired by task, "
            f"|mean difference| <= {Z_95} SEM)")
    if fmt == "markdown":
        lines = [f"| method | {metric or 'value'} (mean ± SEM) | tasks |", "|---|---:|---:|"]
        for label, value, n, best, tied in cells:
            value = f"**{value}**" if best else value + (" †" if tied else "")
            lines.append(f"| {label} | {value} | {n} |")
        return "\n".join(lines + ["", note])
    lines = [f"% {note}", r"\begin{tabular}{lrr}", r"\toprule",
             rf"Method & {_escape_latex(metric or 'value')} & Tasks \\", r"\midrule"]
    for label, value, n, best, tied in cells:
        value = value.replace("±", r"$\pm$")
        value = rf"\textbf{{{value}}}" if best else value + (r"$^\dagger$" if tied else "")
        lines.append(rf"{_escape_latex(label)} & {value} & {n} \\")
    return "\n".join([*lines, r"\bottomrule", r"\end{tabular}"])
