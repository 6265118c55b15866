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

from spice_ray.results.labels import metric_name, setting_label
from spice_ray.results.schema import metric_info
from spice_ray.results.summary import task_means
from spice_ray.results.tables import ResultsError

Z_95 = 1.96


def _escape_latex(text: str) -> str:
    for char, repl in (("\\", r"\textbackslash{}"), ("&", r"\&"), ("%", r"\%"), ("#", r"\#"),
                       ("_", r"\_"), ("$", r"\$"), ("{", r"\{"), ("}", r"\}")):
        text = text.replace(char, repl)
    return text


def ranked(df: pd.DataFrame, summary: pd.DataFrame) -> pd.DataFrame:
    """``summary`` (mean, sem, n and a ``label`` column per row) with ``best`` (the lowest mean,
    or highest where the metric's registered direction says so: ``results.schema.METRICS``)
    and ``tied`` (paired test against the best row),
    best first.

    Raises:
        ResultsError: the rows hold more than one metric or more than one x.
    """
    for column, hint in (("metric", "--where \"metric == '...'\""),
                         ("x", "--at last, or --where 'x == ...'")):
        if column in df and df[column].nunique() > 1:
            raise ResultsError(f"a paper table shows one {column}; these rows hold "
                               f"{df[column].nunique()}: choose one with {hint}")
    higher = "metric" in df and len(df) > 0 and all(
        metric_info(m).higher_is_better for m in df["metric"].unique())
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


def short_labels(table: pd.DataFrame, tex: bool = False) -> pd.Series:
    """A label per row as short as tells the rows apart: the method (and its weight variant),
    then its settings (:func:`spice_ray.results.labels.setting_parts`) only where the method
    has rows with other settings; the table's own ``label`` where that leaves two rows alike
    or the rows carry no ``method`` and ``config``."""
    if not {"method", "config"} <= set(table.columns):
        return table["label"].astype(str)
    escape = _escape_latex if tex else str
    base = table["method"].astype(str).map(escape)
    if "variant" in table:
        base = base + table["variant"].fillna("").map(lambda v: f" [{escape(v)}]" if v else "")
    several = table.groupby(base)["config"].transform("nunique") > 1
    extra = table["config"].map(lambda c: setting_label(c, tex))
    out = pd.Series([f"{b[:-1]}, {e})" if s and e and b.endswith(")")
                     else f"{b} ({e})" if s and e else b
                     for b, e, s in zip(base, extra, several, strict=True)], index=table.index)
    alike = out.duplicated(keep=False)
    if alike.any():
        fallback = table["label"].astype(str).map(escape) if "label" in table else out
        out = out.where(~alike, fallback)
    return out


def render(table: pd.DataFrame, fmt: str, metric: str = "", digits: int = 2) -> str:
    """A :func:`ranked` table as ``markdown`` or ``latex`` (booktabs) text, rows named by
    :func:`short_labels` and the metric by its name (``Cumulative regret``)."""
    tex = fmt == "latex"
    labels = short_labels(table, tex)
    cells = []
    for (_, row), label in zip(table.iterrows(), labels, strict=True):
        value = f"{row['mean']:.{digits}f} ± {row['sem']:.{digits}f}"
        cells.append((label, value, int(row["n"]), bool(row["best"]), bool(row["tied"])))
    note = ("best in bold; † not distinguishable from the best (paired by task, "
            f"|mean difference| <= {Z_95} SEM)")
    name = metric_name(metric) if metric else "Value"
    if fmt == "markdown":
        lines = [f"| Method | {name} (mean ± SEM) | Tasks |", "|---|---:|---:|"]
        for label, value, n, best, tied in cells:
            value = f"**{value}**" if best else value + (" †" if tied else "")
            lines.append(f"| {label} | {value} | {n} |")
        return "\n".join(lines + ["", note])
    lines = [f"% {note}", r"\begin{tabular}{lrr}", r"\toprule",
             rf"Method & {_escape_latex(name)} & Tasks \\", r"\midrule"]
    for label, value, n, best, tied in cells:
        value = value.replace("±", r"$\pm$")
        value = rf"\textbf{{{value}}}" if best else value + (r"$^\dagger$" if tied else "")
        lines.append(rf"{label} & {value} & {n} \\")
    return "\n".join([*lines, r"\bottomrule", r"\end{tabular}"])
