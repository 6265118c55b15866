"""Two run directories side by side: one table's methods paired task by task across runs.

``python -m spice_ray.results compare RUN_A RUN_B --table bandit_latent_tuned`` answers "did
this change (another preset, another seed set, a new fusion) move the numbers?" on the same
eval tasks: each method's final value per task (training seeds averaged per task) in A and in
B, their difference A - B with its SEM and a 95% bootstrap interval over tasks, and P(A lower
on a task). Two runs whose experiment's eval tasks differ (another environment config or data
seed: the eval split's content id differs) are refused: their task ids name different tasks.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from spice_ray.common.metrics import CUMULATIVE_REGRET, SUBOPTIMALITY
from spice_ray.results.summary import bootstrap_ci, final_values
from spice_ray.results.tables import ResultsError, load

METRICS = (CUMULATIVE_REGRET, SUBOPTIMALITY)
"""The final values compared (lower is better), the first a table has."""


def eval_split_id(run_dir: Path, experiment: str) -> str:
    """The content id of ``experiment``'s eval split in ``run_dir`` (from its config and
    dataset).

    Raises:
        ResultsError: the run has no config or no dataset for the experiment.
    """
    from spice_ray.config import ConfigError, load_config
    from spice_ray.data import store

    path = Path(run_dir) / "configs" / f"{experiment}.yaml"
    try:
        cfg = load_config(path)
    except (OSError, ConfigError) as exc:
        raise ResultsError(f"{run_dir}: cannot read {path} ({exc}): the eval tasks cannot be "
                           "checked, so the runs are not compared") from None
    dataset = store.dataset_dir(Path(run_dir) / "datasets", cfg)
    try:
        return store.split_id(dataset, "eval")
    except (OSError, store.DatasetError) as exc:
        raise ResultsError(f"{run_dir}: {experiment}'s dataset {dataset} is not readable "
                           f"({exc}): the eval tasks cannot be checked") from None


def experiment_of(run_dir: Path, table: str) -> str:
    """The experiment whose table ``table`` is (``<experiment>`` or ``<experiment>_<kind>``):
    the longest experiment with a config in ``run_dir/configs`` that names it.

    Raises:
        ResultsError: none does.
    """
    names = [p.stem for p in (Path(run_dir) / "configs").glob("*.yaml")]
    owners = [n for n in names if table == n or table.startswith(n + "_")]
    if not owners:
        raise ResultsError(f"{run_dir}: no experiment config in configs/ names table {table!r} "
                           f"(configs: {', '.join(sorted(names)) or 'none'}): the eval tasks "
                           "cannot be checked")
    return max(owners, key=len)


def _per_task(df: pd.DataFrame, metric: str) -> dict[str, pd.Series]:
    """Each method's final ``metric`` per task, seeds averaged (variants left out); a method
    with several settings in the table is keyed ``method [config]``."""
    final = final_values(df[df["variant"] == ""], metric)
    out = {}
    for method, rows in final.groupby("method", observed=True, sort=False):
        configs = rows["config"].unique()
        for config in configs:
            key = str(method) if len(configs) == 1 else f"{method} [{config}]"
            out[key] = rows[rows["config"] == config].groupby("task_id")["value"].mean()
    return out


def compare_runs(run_a: Path, run_b: Path, table: str, methods: list[str] | None = None
                 ) -> pd.DataFrame:
    """``table``'s methods in ``run_a`` against ``run_b``, paired by eval task.

    Returns:
        One row per method in both runs (or of ``methods``): its mean in A and in B, A - B
        (mean, SEM, 95% bootstrap interval), P(A lower on a task) with its interval, n tasks.

    Raises:
        ResultsError: a run lacks the table, the runs' eval tasks differ, no method is in
            both, or no final value to compare.
    """
    a, b = load(run_a, table), load(run_b, table)
    experiment = experiment_of(run_a, table)
    ids = eval_split_id(run_a, experiment), eval_split_id(run_b, experiment)
    if ids[0] != ids[1]:
        raise ResultsError(f"{experiment}'s eval tasks differ between {run_a} and {run_b} "
                           f"(eval split {ids[0][:12]} vs {ids[1][:12]}: another environment "
                           "config or data seed): their task ids name different tasks")
    metric = next((m for m in METRICS if m in set(a["metric"]) and m in set(b["metric"])),
                  None)
    if metric is None:
        raise ResultsError(f"{table} has no {' or '.join(METRICS)} in both runs")
    per_a, per_b = _per_task(a, metric), _per_task(b, metric)
    keys = [k for k in per_a if k in per_b]
    if methods:
        missing = [m for m in methods if m not in keys]
        if missing:
            raise ResultsError(f"{', '.join(missing)} not in {table} of both runs; both have: "
                               f"{', '.join(keys) or 'none'}")
        keys = list(methods)
    if not keys:
        raise ResultsError(f"no method of {table} is in both runs")
    rows = []
    for key in keys:
        x, y = per_a[key].align(per_b[key], join="inner")
        if len(x) < 2:
            continue
        d = (x - y).to_numpy()
        wins = 0.5 * (1.0 + np.sign(-d))  # A lower: 1, tie: 0.5
        lo, hi = bootstrap_ci(d)
        p_lo, p_hi = bootstrap_ci(wins)
        rows.append({"method": key, "metric": metric, "A": float(x.mean()),
                     "B": float(y.mean()), "A - B": float(d.mean()),
                     "sem": float(d.std(ddof=1) / np.sqrt(len(d))), "ci_low": lo,
                     "ci_high": hi, "P(A lower)": float(wins.mean()), "p_low": p_lo,
                     "p_high": p_hi, "tasks": len(d)})
    if not rows:
        raise ResultsError(f"no method of {table} has two tasks in common between the runs")
    return pd.DataFrame(rows)
