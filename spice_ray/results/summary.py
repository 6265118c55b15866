"""The one summary of result rows: average training seeds per task, then a statistic over tasks.

``stat="sem"`` (the paper's convention, the default) gives mean +- SEM. ``"bootstrap"`` gives
the mean with a percentile bootstrap confidence interval and ``"iqm"`` the interquartile mean
with its bootstrap interval, both from ``scipy.stats.bootstrap``: tasks and training seeds are
resampled independently (each model is evaluated on every task), so the interval covers the
variation between trained models as well as between tasks. :func:`improvement` is the
probability that one method beats another on a random task, paired by task, with its interval.
The report, the figures, the results CLI and the sweeps all call :func:`summarise`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from spice_ray.results.schema import KEY, NO_SEED, metric_info
from spice_ray.results.tables import ResultsError


def _keys(df: pd.DataFrame) -> list[str]:
    """Columns identifying a value apart from its seed: every column but value and seed."""
    return [c for c in df.columns if c not in ("value", "seed")]


def task_means(df: pd.DataFrame) -> pd.DataFrame:
    """Average over training seeds per task (the paper's first step)."""
    return df.groupby(_keys(df), dropna=False, observed=True)["value"].mean().reset_index()


STATS = ("sem", "bootstrap", "iqm")
RESAMPLES = 2000
"""Bootstrap resamples; the generator is seeded, so intervals are the same on every call."""


def iqm(values: np.ndarray, axis: int = -1) -> np.ndarray:
    """Interquartile mean: the mean of the middle 50% of the values."""
    from scipy import stats  # here: scipy's import costs seconds a plan or a listing skips

    return stats.trim_mean(values, 0.25, axis=axis)


def bootstrap_ci(values: np.ndarray, statistic=np.mean, confidence: float = 0.95,
                 seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of ``statistic`` over tasks; (nan, nan) for fewer than
    two tasks.

    Args:
        values: [T] one value per task, or [T, S] per task and training seed (NaN where a
            seed has no value). With several seeds, tasks and seeds are resampled
            independently (the two factors are crossed: every model is evaluated on every
            task), and the statistic is taken over the resampled tasks' seed means.
        statistic: of a vector of task values (``np.mean``, :func:`iqm`).
    """
    values = np.asarray(values, dtype=np.float64)
    if values.ndim == 2 and values.shape[1] == 1:
        values = values[:, 0]
    if len(values) < 2:
        return float("nan"), float("nan")
    finite = values[np.isfinite(values)]
    if np.all(finite == finite[0]):
        return float(finite[0]), float(finite[0])
    from scipy import stats  # here: scipy's import costs seconds a plan or a listing skips

    rng = np.random.default_rng(seed)
    if values.ndim == 1:
        res = stats.bootstrap((values,), statistic, n_resamples=RESAMPLES,
                              confidence_level=confidence, method="percentile",
                              vectorized=True, axis=-1, random_state=rng)
    else:
        def crossed(tasks: np.ndarray, seeds: np.ndarray) -> float:
            grid = values[tasks.astype(np.int64)][:, seeds.astype(np.int64)]  # (T, S)
            have = np.isfinite(grid)
            counts = have.sum(axis=1)  # a task none of the drawn seeds has drops out
            means = np.where(have, grid, 0.0).sum(axis=1)[counts > 0] / counts[counts > 0]
            return float(statistic(means))

        res = stats.bootstrap((np.arange(values.shape[0]), np.arange(values.shape[1])),
                              crossed, n_resamples=RESAMPLES, confidence_level=confidence,
                              method="percentile", vectorized=False, paired=False,
                              random_state=rng)
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def cluster_bootstrap_ci(values: np.ndarray, groups: np.ndarray, statistic=np.mean,
                         confidence: float = 0.95, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of ``statistic`` over tasks that come in clusters (e.g.
    darkroom tasks sharing a goal): each resample draws the clusters with replacement, then
    tasks with replacement within each drawn cluster, so tasks of one cluster are not counted
    as independent draws. (nan, nan) for fewer than two clusters.

    Args:
        values: [T] one value per task (seeds averaged).
        groups: [T] the cluster of each task.
    """
    values = np.asarray(values, dtype=np.float64)
    groups = np.asarray(groups)
    members = [np.flatnonzero(groups == g) for g in np.unique(groups)]
    if len(members) < 2:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    sizes = np.array([len(m) for m in members])
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    flat = np.concatenate(members)
    out = np.empty(RESAMPLES)
    for i in range(RESAMPLES):
        picked = rng.integers(0, len(members), len(members))
        # each drawn cluster g's tasks: rng.choice(members[g], n_g), drawn for all of them in
        # one call with a bound per draw, which takes the generator's numbers in the same
        # order as one call per cluster would (the same intervals; 7x faster)
        n = sizes[picked]
        within = rng.integers(0, np.repeat(n, n))
        out[i] = statistic(values[flat[np.repeat(starts[picked], n) + within]])
    alpha = (1 - confidence) / 2
    low, high = np.quantile(out, [alpha, 1 - alpha])
    return float(low), float(high)


def hierarchical_draws(n_tasks: int, n_seeds: int, groups: np.ndarray | None,
                       resamples: int, rng: np.random.Generator
                       ) -> tuple[np.ndarray, np.ndarray]:
    """Resampling weights of a two-level bootstrap: training seeds drawn with replacement,
    and, independently, tasks drawn with replacement, by cluster where tasks come in clusters
    (the clusters drawn with replacement, then each drawn cluster's tasks with replacement
    among its members).

    Drawing a cluster c times and n_g of its tasks each time is c * n_g uniform draws among
    its members, so a cluster's task counts are one multinomial of that size.

    Args:
        groups: [T] each task's cluster, or None (each task its own).

    Returns:
        (W [R, T], V [R, S]): how often each task and each seed is drawn in each resample.
    """
    seeds = rng.multinomial(n_seeds, np.full(n_seeds, 1.0 / n_seeds), size=resamples)
    if groups is None:
        tasks = rng.multinomial(n_tasks, np.full(n_tasks, 1.0 / n_tasks), size=resamples)
        return tasks.astype(np.float64), seeds.astype(np.float64)
    groups = np.asarray(groups)
    members = [np.flatnonzero(groups == g) for g in np.unique(groups)]
    drawn = rng.multinomial(len(members), np.full(len(members), 1.0 / len(members)),
                            size=resamples)  # [R, G]
    tasks = np.zeros((resamples, n_tasks))
    for g, idx in enumerate(members):
        tasks[:, idx] = rng.multinomial(drawn[:, g] * len(idx), np.full(len(idx), 1 / len(idx)))
    return tasks, seeds.astype(np.float64)


def _seed_means(values: np.ndarray, seed_weights: np.ndarray) -> np.ndarray:
    """Each task's mean over the drawn seeds: values [T, S] (NaN where a seed has no value),
    seed_weights [R, S] -> [R, T] (NaN where no drawn seed has a value)."""
    have = np.isfinite(values)
    total = np.where(have, values, 0.0) @ seed_weights.T  # (T, R)
    count = have.astype(np.float64) @ seed_weights.T
    with np.errstate(invalid="ignore", divide="ignore"):
        return (total / count).T


def hierarchical_interval(statistic, arrays: Sequence[np.ndarray],
                          groups: np.ndarray | None = None, resamples: int = RESAMPLES,
                          seed: int = 0, confidence: float = 0.95
                          ) -> tuple[float, float, float]:
    """A statistic of paired per-task values and its percentile interval under the two-level
    bootstrap of :func:`hierarchical_draws`: the spread between trainings (seeds) and between
    tasks (or clusters of tasks) both count.

    Args:
        statistic: ``statistic(means, weights) -> [R]``: ``means`` one [R, T] array per input
            (each task's mean over the drawn seeds), ``weights`` [R, T] how often each task is
            drawn (0 where left out); NaN means carry zero weight.
        arrays: [T, S] values per task and training seed, tasks and seeds in the same order in
            every array (a method without training seeds repeats its value in every column).
        groups: [T] each task's cluster (e.g. the darkroom goal it shares), or None.

    Returns:
        (point, low, high): the statistic of the seed means over all tasks, and its interval
        (NaN without two tasks; resamples whose statistic is not finite are left out).
    """
    arrays = [np.asarray(a, dtype=np.float64) for a in arrays]
    n_tasks, n_seeds = arrays[0].shape
    ones_s, ones_t = np.ones((1, n_seeds)), np.ones((1, n_tasks))
    point = float(np.asarray(statistic([_seed_means(a, ones_s) for a in arrays], ones_t))[0])
    clusters = n_tasks if groups is None else len(np.unique(groups))
    if n_tasks < 2 or clusters < 2:
        return point, float("nan"), float("nan")
    weights, seed_weights = hierarchical_draws(n_tasks, n_seeds, groups, resamples,
                                               np.random.default_rng(seed))
    boot = np.asarray(statistic([_seed_means(a, seed_weights) for a in arrays], weights),
                      dtype=np.float64)
    boot = boot[np.isfinite(boot)]
    if not len(boot):
        return point, float("nan"), float("nan")
    alpha = (1 - confidence) / 2
    low, high = np.quantile(boot, [alpha, 1 - alpha])
    return point, float(low), float(high)


def weighted_mean(values: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Per resample, the mean of [R, T] ``values`` under [R, T] draw ``weights`` (NaN values
    carry no weight)."""
    have = np.isfinite(values)
    w = np.where(have, weights, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (np.where(have, values, 0.0) * w).sum(1) / w.sum(1)


def mean_ratio(means: Sequence[np.ndarray], weights: np.ndarray) -> np.ndarray:
    """mean(a) / mean(b) per resample over the tasks both have (:func:`hierarchical_interval`
    statistic of ``[a, b]``)."""
    a, b = means
    both = np.isfinite(a) & np.isfinite(b)
    w = np.where(both, weights, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (np.where(both, a, 0.0) * w).sum(1) / (np.where(both, b, 0.0) * w).sum(1)


def win_share(means: Sequence[np.ndarray], weights: np.ndarray) -> np.ndarray:
    """P(a < b on a task) per resample, ties counting half (:func:`hierarchical_interval`
    statistic of ``[a, b]``: a wins with the lower value)."""
    a, b = means
    wins = 0.5 * (1.0 + np.sign(b - a))  # NaN where either is missing
    return weighted_mean(wins, weights)


@dataclass(frozen=True)
class TaskSeedValues:
    """One value per task and training seed for each method (e.g. final cumulative regret),
    tasks and seeds in the same order for every method: what :func:`hierarchical_interval`
    resamples."""

    task_ids: np.ndarray
    """[T] the tasks, in row order."""
    seeds: tuple[int, ...]
    """The training seeds, in column order."""
    values: dict[str, np.ndarray]
    """method -> [T, S]; a method without a training seed has its one value in every column,
    so it moves with the tasks only."""

    @classmethod
    def from_rows(cls, rows: pd.DataFrame) -> TaskSeedValues:
        """From rows of one metric at one x (``method``, ``seed``, ``task_id``, ``value``):
        a method's rows at seed :data:`spice_ray.results.schema.NO_SEED` fill every seed's
        column."""
        seeds = tuple(sorted(int(s) for s in rows["seed"].unique() if int(s) != NO_SEED)) \
            or (NO_SEED,)
        tasks = np.sort(rows["task_id"].unique())
        values = {}
        for method, sub in rows.groupby("method", sort=False, observed=True):
            grid = _task_by_seed(sub).reindex(index=tasks)
            if list(grid.columns) == [NO_SEED]:
                values[str(method)] = np.repeat(grid.to_numpy(np.float64), len(seeds), axis=1)
            else:
                values[str(method)] = grid.reindex(columns=list(seeds)).to_numpy(np.float64)
        return cls(tasks, seeds, values)

    @classmethod
    def from_wide(cls, wide: pd.DataFrame) -> TaskSeedValues:
        """From per-task values already averaged over seeds (one column per method, tasks as
        the index): one pseudo-seed, so intervals resample tasks only."""
        return cls(wide.index.to_numpy(), (0,),
                   {str(m): wide[m].to_numpy(np.float64)[:, None] for m in wide.columns})

    def wide(self) -> pd.DataFrame:
        """Per task, each method's mean over seeds (the tables' convention)."""
        return pd.DataFrame({m: _nanmean_rows(v) for m, v in self.values.items()},
                            index=pd.Index(self.task_ids, name="task_id"))


def _nanmean_rows(v: np.ndarray) -> np.ndarray:
    """Row means ignoring NaN, NaN for an all-NaN row (without numpy's warning)."""
    have = np.isfinite(v)
    count = have.sum(1)
    out = np.full(len(v), np.nan)
    out[count > 0] = np.where(have, v, 0.0).sum(1)[count > 0] / count[count > 0]
    return out


def _task_by_seed(rows: pd.DataFrame) -> pd.DataFrame:
    """A group's mean value per task (rows, sorted) and seed (columns, sorted), NaN where a
    seed lacks a task: ``pivot_table``'s frame, three times faster (the report makes one per
    method and table)."""
    return rows.groupby(["task_id", "seed"], observed=True)["value"].mean().unstack("seed")


def _task_seed_matrix(rows: pd.DataFrame) -> np.ndarray:
    """A group's values as a [tasks, seeds] matrix (NaN where a seed lacks a task)."""
    return _task_by_seed(rows).to_numpy(dtype=np.float64)


LABEL_KEYS = ("variant", "rule", "config")
"""The key columns beside ``method`` that tell one method's rows apart: the report groups its
rows by method and these, and labels each (``spice_ray.results.report._label``)."""


def _settings_apart(per_task: pd.DataFrame, by: list[str]) -> list[str]:
    """The :data:`LABEL_KEYS` not in ``by`` that take several values within a group of ``by``
    (e.g. SPICE at a fixed beta and at the sqrt(2 log t) schedule); none unless ``by`` groups
    by method."""
    if "method" not in by:
        return []
    groups = per_task.groupby(by, dropna=False, observed=True)
    return [c for c in LABEL_KEYS if c in per_task.columns and c not in by
            and groups[c].nunique(dropna=False).max() > 1]


def _refuse_several_x(per_task: pd.DataFrame, by: list[str]) -> None:
    """ResultsError naming the x values when a group of ``by`` spans several of them."""
    if "x" not in per_task.columns or "x" in by or per_task.empty:
        return
    spans = per_task.groupby(by, dropna=False, observed=True)["x"].nunique()
    if spans.max() > 1:
        xs = sorted(per_task["x"].unique())
        shown = ", ".join(f"{x:g}" for x in xs[:6]) + (", ..." if len(xs) > 6 else "")
        raise ResultsError(f"the rows of one group are at {len(xs)} values of x ({shown}): "
                           "add x to the grouping (--by ...,x), pick one (--at last, "
                           "--where \"x == ...\"), or pool them explicitly (--pool)")


def summarise(df: pd.DataFrame, by: Sequence[str] | None = None, stat: str = "sem", *,
              pool: bool = False) -> pd.DataFrame:
    """A statistic over tasks, after averaging seeds per task.

    Args:
        df: rows with ``value``, ``seed``, ``task_id`` and key columns (a result table, a sweep
            table, or any subset of one).
        by: grouping columns (default: every key column of the result schema except seed and
            task_id that ``df`` has). When they include ``method``, the :data:`LABEL_KEYS`
            that differ within a group are added after them, so that two settings of a method
            are two rows, as in the report, never one row over twice the tasks. Two
            metrics in a group are never pooled: ``metric`` is added after ``by``.
        stat: "sem": columns ``mean``, ``sem``; "bootstrap": ``mean``, ``ci_low``,
            ``ci_high`` (95%); "iqm": ``iqm``, ``ci_low``, ``ci_high``.
        pool: group by exactly ``by``, pooling a method's settings (and context lengths or
            steps ``x``) into one row, each task counted once (its values averaged).

    Returns:
        One row per group with the grouping columns, the stat's columns, ``n`` (tasks) and
        ``seeds``; the SEM of a single task is NaN.

    Raises:
        ResultsError: a grouping column is not in the rows, or (without ``pool``) a group
            holds rows at several ``x``: a mean over context lengths or steps is no statistic
            of one (add ``x`` to ``by``, or filter one).
    """
    # each task's mean over seeds and how many seeds it has, in one pass
    per_task = df.groupby(_keys(df), dropna=False, observed=True).agg(
        value=("value", "mean"), seeds=("seed", "nunique")).reset_index()
    if by is None:
        by = [c for c in KEY if c not in ("seed", "task_id") and c in per_task.columns]
    by = list(by)
    unknown = [c for c in by if c not in per_task.columns]
    if unknown:
        raise ResultsError(f"cannot group by {unknown}; columns are {list(per_task.columns)}")
    if stat not in STATS:
        raise ResultsError(f"stat={stat!r} is invalid: one of {', '.join(STATS)}")
    if "metric" in per_task.columns and "metric" not in by and len(per_task) and \
            per_task.groupby(by, dropna=False, observed=True)["metric"].nunique().max() > 1:
        by.append("metric")  # a return and a regret in one mean is no statistic: never pooled
    if not pool:
        by += _settings_apart(per_task, by)
        _refuse_several_x(per_task, by)
    # one value per task in each group (what a pooled group averages over its settings and
    # steps), so n counts tasks, not task-settings, and the estimate is the one bootstrapped
    per_task = per_task.groupby([*by, "task_id"], dropna=False, observed=True).agg(
        value=("value", "mean"), seeds=("seeds", "max")).reset_index()
    g = per_task.groupby(by, dropna=False, observed=True)
    out = g["value"].agg(mean="mean", std="std", n="count").reset_index()
    out["seeds"] = g["seeds"].max().to_numpy()
    if stat == "sem":
        out["sem"] = out["std"] / np.sqrt(out["n"].clip(lower=1))
        return out.drop(columns="std")[[*by, "mean", "sem", "n", "seeds"]]
    fn = np.mean if stat == "bootstrap" else iqm
    # the raw rows grouped the same way (same keys, same order) keep each task's seeds apart
    cis = [bootstrap_ci(_task_seed_matrix(rows), fn)
           for _, rows in df.groupby(by, dropna=False, observed=True)]
    out["ci_low"] = [c[0] for c in cis]
    out["ci_high"] = [c[1] for c in cis]
    if stat == "iqm":
        out["iqm"] = [float(iqm(v.to_numpy())) for _, v in g["value"]]
        return out[[*by, "iqm", "ci_low", "ci_high", "n", "seeds"]]
    return out[[*by, "mean", "ci_low", "ci_high", "n", "seeds"]]


def improvement(df: pd.DataFrame, method_a: str, method_b: str, metric: str,
                lower_is_better: bool | None = None) -> dict[str, float]:
    """P(a beats b on a random task): the fraction of tasks where ``a``'s final ``metric`` is
    better than ``b``'s (ties count a half), paired by task after averaging seeds per task,
    with a 95% bootstrap interval over tasks. Better is the metric's registered direction
    (``results.schema.METRICS``) unless ``lower_is_better`` says.

    Raises:
        ResultsError: a method has no rows of ``metric``, or they share no task.
    """
    final = final_values(df, metric)
    per = {}
    for method in (method_a, method_b):
        rows = final[final["method"] == method]
        if rows.empty:
            raise ResultsError(f"no {metric} rows of method {method!r}; methods are "
                               f"{sorted(final['method'].unique())}")
        per[method] = rows.groupby("task_id")["value"].mean()
    a, b = per[method_a].align(per[method_b], join="inner")
    if a.empty:
        raise ResultsError(f"{method_a} and {method_b} share no task")
    if lower_is_better is None:
        lower_is_better = not metric_info(metric).higher_is_better
    sign = -1.0 if lower_is_better else 1.0
    wins = 0.5 * (1 + np.sign(sign * (a.to_numpy() - b.to_numpy())))  # 1, 0.5 or 0 per task
    low, high = bootstrap_ci(wins)
    return {"probability": float(wins.mean()), "ci_low": low, "ci_high": high,
            "n": int(len(wins))}


def final_values(df: pd.DataFrame, metric: str) -> pd.DataFrame:
    """The rows of ``metric`` at each curve's last x (e.g. final cumulative regret)."""
    sub = df[df["metric"] == metric]
    return sub[sub["x"] == sub["x"].max()]
