"""Analyses that turn a result table into sentences for the report (bsuite's ``score(df)``).

Each function takes one table's rows and returns sentences; the experiments name them beside
their tables (``spice_ray.study.experiments``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import numpy as np
import pandas as pd

from spice_ray.common.metrics import CUMULATIVE_REGRET, SUBOPTIMALITY
from spice_ray.results.schema import ACCURACY_METRICS, settings_columns, settings_of
from spice_ray.results.summary import (
    TaskSeedValues,
    final_values,
    hierarchical_interval,
    mean_ratio,
    task_means,
    win_share,
)

LEARNED, FLAT = "SPICE", "SPICE (flat prior)"
PAPER = "SPICE (paper)"
"""SPICE at the paper's width (its beta tuned the same way), beside SPICE in tuned tables."""
_PRIOR_KEYS = ("prior_mean", "prior_var", "kernel_space")
"""Fields a pair may differ in: the flat prior's own, and what the kernel compares (the flat
agent has no network, so it always compares raw states; bandits have no states at all)."""


def _fusion(config: str) -> str:
    """The fusion settings of a config that a pair must share."""
    cfg = {k: v for k, v in settings_of(config).items() if k not in _PRIOR_KEYS}
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
    if CUMULATIVE_REGRET in metrics:
        points = [(CUMULATIVE_REGRET, None, "final cumulative regret")]
    elif SUBOPTIMALITY in metrics:  # the prior matters most before evidence piles up
        xs = sorted(df.loc[df["metric"] == SUBOPTIMALITY, "x"].unique())
        points = [(SUBOPTIMALITY, int(h), f"suboptimality at context length h={h}")
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


ORACLE = "SPICE (oracle prior)"
CONTEXT_FREE = "SPICE (context-free prior)"
"""The family's exact prior before any context under SPICE's fusion: the in-context share's
baseline (what knowing the population gives without reading the context)."""
GAP_STEP = 50
"""The early step at which the prior gap is also reported (besides the final step)."""


def _gap_share(values: TaskSeedValues, learned: str, base: str, best: str,
               groups: Mapping[int, int] | None) -> tuple[float, float, float]:
    """mean(base - learned) / mean(base - best) over tasks (seeds averaged per task), with
    its 95% interval from the two-level bootstrap (:func:`hierarchical_interval`: training
    seeds, then tasks, by goal where ``groups`` maps task ids to goals)."""
    v = values.values
    cluster = None if groups is None else np.array([groups[t] for t in values.task_ids])
    return hierarchical_interval(mean_ratio, [v[base] - v[learned], v[base] - v[best]],
                                 cluster)


def gap_closed(df: pd.DataFrame, metric: str = CUMULATIVE_REGRET) -> pd.DataFrame:
    """The share of the flat-to-oracle gap the learned prior closes, per beta, at step
    :data:`GAP_STEP` and at the final step: (flat - SPICE) / (flat - oracle), the three rows
    paired by task (training seeds averaged per task first), with a percentile interval of
    the two-level bootstrap over training seeds and tasks (:func:`hierarchical_interval`;
    seeded, so the same rows give the same interval).

    Returns:
        One row per (beta, x): flat_minus_spice and flat_minus_oracle (mean and SEM over
        tasks), gap_closed, its 95% interval lo / hi, and n tasks. Empty without the three rows.
    """
    sub = df[(df["metric"] == metric) & (df["variant"] == "")
             & df["method"].isin([LEARNED, FLAT, ORACLE])]
    if sub.empty:
        return pd.DataFrame()
    settings = settings_columns(sub)  # each distinct config parsed once, not every row
    schedule = (settings["beta_schedule"].fillna("fixed") if "beta_schedule" in settings
                else "fixed")
    sub = sub.assign(beta=settings.get("beta"), schedule=schedule)
    sub = sub[sub["schedule"] == "fixed"]
    final = int(sub["x"].max())
    out = []
    for (beta, x), rows in sub[sub["x"].isin([GAP_STEP, final])].groupby(["beta", "x"]):
        values = TaskSeedValues.from_rows(rows[["method", "seed", "task_id", "value"]])
        if not {LEARNED, FLAT, ORACLE} <= set(values.values):
            continue
        values = _complete(values, (LEARNED, FLAT, ORACLE))
        wide = values.wide()
        d_spice = (wide[FLAT] - wide[LEARNED]).to_numpy()
        d_oracle = (wide[FLAT] - wide[ORACLE]).to_numpy()
        n = len(d_spice)
        ratio, lo, hi = _gap_share(values, LEARNED, FLAT, ORACLE, None)
        sem = np.sqrt(1.0 / n) if n > 1 else np.nan
        out.append({"beta": float(beta), "x": int(x), "n": n,
                    "flat_minus_spice": d_spice.mean(),
                    "flat_minus_spice_sem": d_spice.std(ddof=1) * sem,
                    "flat_minus_oracle": d_oracle.mean(),
                    "flat_minus_oracle_sem": d_oracle.std(ddof=1) * sem,
                    "gap_closed": ratio, "lo": float(lo), "hi": float(hi)})
    return pd.DataFrame(out)


def prior_gap(df: pd.DataFrame) -> list[str]:
    """Sentences: the share of the flat-to-oracle gap SPICE's learned prior closes (see
    :func:`gap_closed`), and whether flat - SPICE is resolved (>= 3 paired SEMs)."""
    metric = CUMULATIVE_REGRET
    table = gap_closed(df, metric)
    out = []
    for r in table.itertuples():
        resolved = abs(r.flat_minus_spice) >= 3 * r.flat_minus_spice_sem
        positive_gap = r.flat_minus_oracle > 2 * r.flat_minus_oracle_sem
        share = (f"the learned prior closes {r.gap_closed:.2f} of the gap (95% bootstrap "
                 f"interval {r.lo:.2f} to {r.hi:.2f})" if positive_gap else
                 "no share can be stated: the oracle prior does not beat the flat one by 2 "
                 "SEMs here")
        out.append(
            f"Prior gap at beta={r.beta:g}, t={r.x}: flat - SPICE {r.flat_minus_spice:+.3g} +- "
            f"{r.flat_minus_spice_sem:.2g} ({'resolved' if resolved else 'not resolved'} at 3 "
            f"paired SEMs), flat - oracle {r.flat_minus_oracle:+.3g} +- "
            f"{r.flat_minus_oracle_sem:.2g}, n={r.n} tasks: {share}.")
    return out


def prior_fit(df: pd.DataFrame, hs: tuple[int, ...] = (0, 20)) -> list[str]:
    """Sentences: is the prior learned? The learned prior against the exact posterior given
    the same eval context, at context lengths ``hs`` (means over tasks and seeds)."""
    if "oracle_rmse" not in set(df["metric"]):
        return []
    sources = df["config"].map(width_source_of)
    out = []
    for source in sorted(sources.unique(), key=WIDTH_SOURCE_ORDER.index):  # the paper's first
        cfg = settings_of(df.loc[sources == source, "config"].iloc[0])
        if sources.nunique() == 1:
            label = ""
        elif source == "paper":
            label = " (paper width, s = 1)"
        elif source == "predictive":
            label = " (width from the predictive-variance head)"
        else:
            decay = float(cfg.get("width_decay", 0.0))
            shape = f", narrowing as (1 + {decay:.3g} h)^-1/2" if decay else ""
            label = f" (width fitted on validation, s = {width_of(cfg):.3g}{shape})"
        out += _prior_fit_at(df[sources == source], hs, label)
    return out


WIDTH_SOURCE_ORDER = ("paper", "fitted", "predictive")
"""The prior's width sources (:func:`width_source_of`), in the order tables and figures show
them."""


def width_of(config: str | dict) -> float:
    """The learned prior's width scale in a row's config (1, the paper's, when absent)."""
    cfg = settings_of(config) if isinstance(config, str) else config
    return float(cfg.get("width_scale", 1.0))  # absent: the paper's (fusion.WIDTH_SCALE_DEFAULT)


def width_source_of(config: str) -> str:
    """Which width a row's learned prior used (:data:`WIDTH_SOURCE_ORDER`): "paper" (the
    ensemble's sigma_Q), "fitted" (sigma_Q scaled or narrowed as fitted on validation) or
    "predictive" (the model's predictive-variance head)."""
    cfg = settings_of(config)
    if cfg.get("width_source", "ensemble") != "ensemble":
        return str(cfg["width_source"])
    return "paper" if width_of(cfg) == width_of({}) and not cfg.get("width_decay") else "fitted"


def _prior_fit_at(df: pd.DataFrame, hs: tuple[int, ...], source: str) -> list[str]:
    means = df.groupby(["metric", "x"])["value"].mean()
    out = []
    for h in hs:
        if ("oracle_rmse", h) not in means:
            continue
        out.append(
            f"Learned prior{source} at h={h} against the exact posterior: RMSE of Q-bar "
            f"{means['oracle_rmse', h]:.3f}, sigma_Q / posterior sd "
            f"{means['oracle_sd_ratio', h]:.2f}, posterior mean inside Q-bar +- 1.645 sigma_Q "
            f"for {means['oracle_coverage_90', h]:.0%} of arms, prior pseudo-counts N_pri "
            f"{means['n_pri_mean', h]:.2f} (exact posterior's "
            f"{means['oracle_n_pri_mean', h]:.2f}).")
    return out


def tuned_comparison(df: pd.DataFrame, groups: Mapping[int, int] | None = None) -> list[str]:
    """The tuned table in sentences: the methods ranked by final cumulative regret, and every
    other method minus SPICE, paired by task (seeds averaged per task first), with P(SPICE
    beats it on a task). Each method appears once, at its own validation-chosen setting, so
    pairs are by task only. Every interval is the two-level bootstrap's
    (:func:`hierarchical_interval`): training seeds, then tasks, so it holds the spread between
    trainings as well as between tasks.

    Args:
        groups: task id -> cluster (the darkroom's goal): then the tasks are resampled by
            goal, then within a goal, and the sentences say so.
    """
    values = final_task_seeds(df)
    if values is None:
        return []
    wide = values.wide()
    ranked = wide.mean().sort_values()
    out = ["Ranked by final cumulative regret (each method at its validation-chosen setting): "
           + ", ".join(f"{m} {v:.3g}" for m, v in ranked.items()) + "."]
    if LEARNED not in wide:
        return out
    diffs = []
    for method in ranked.index:
        if method == LEARNED:
            continue
        pair = _complete(values, (LEARNED, method))
        if len(pair.task_ids) < 2:
            continue
        d = pair.wide()
        d = d[method] - d[LEARNED]
        cluster = None if groups is None else np.array([groups[t] for t in pair.task_ids])
        wins, lo, hi = hierarchical_interval(win_share, [pair.values[LEARNED],
                                                         pair.values[method]], cluster)
        diffs.append(f"{method} {d.mean():+.3g} +- {d.std(ddof=1) / np.sqrt(len(d)):.2g} "
                     f"(P(SPICE better) {wins:.2f}, {lo:.2f} to {hi:.2f})")
    clusters = ("" if groups is None else
                f", the {len(set(groups.values()))} goals resampled, then tasks within a goal")
    if diffs:
        out.append(f"Each method minus {LEARNED}, paired by task (mean +- SEM over "
                   f"{len(wide)} tasks, positive: SPICE has less regret; P(SPICE has less "
                   "regret on a task) with its 95% interval resampling training seeds, then "
                   f"tasks{clusters}): " + "; ".join(diffs) + ".")
    gaps = tuned_gap(values, groups)
    if not gaps.empty:
        shares = [("" if r.method == LEARNED else f"{r.method}: ")
                  + f"{r.gap_closed:.2f} (95% interval {r.lo:.2f} to {r.hi:.2f})"
                  for r in gaps.itertuples()]
        if not gaps["defined"].all():
            shares = ["no share can be stated: the tuned oracle prior does not beat the tuned "
                      "flat one by 2 SEMs"]
        out.append("Gap closed at the tuned settings, (flat - SPICE) / (flat - oracle) paired "
                   "by task (intervals resample training seeds, then tasks"
                   f"{clusters}): " + "; ".join(shares) + ".")
        if CONTEXT_FREE in wide:
            shares = [("" if r.method == LEARNED else f"{r.method}: ")
                      + (f"{r.in_context_share:.2f} (95% interval {r.in_context_lo:.2f}"
                         f" to {r.in_context_hi:.2f})" if r.in_context_defined else
                         "none can be stated (the oracle prior does not beat the context-free "
                         "one by 2 SEMs)")
                      for r in gaps.itertuples()]
            out.append("In-context share at the tuned settings, (context-free - SPICE) / "
                       "(context-free - oracle) paired by task, the part of the oracle's gain "
                       "over knowing the population that SPICE gets by reading the context: "
                       + "; ".join(shares) + ".")
    return out


def final_by_task(df: pd.DataFrame) -> pd.DataFrame:
    """A tuned table's final cumulative regret, one row per task and one column per method
    (training seeds averaged per task; variants left out). Empty without that metric."""
    values = final_task_seeds(df)
    return pd.DataFrame() if values is None else values.wide()


def final_task_seeds(df: pd.DataFrame) -> TaskSeedValues | None:
    """A tuned table's final cumulative regret per task and training seed for each method
    (variants left out; a method without training seeds repeats its value for every seed);
    None without that metric."""
    final = final_values(df, CUMULATIVE_REGRET)
    final = final[final["variant"] == ""]
    if final.empty:
        return None
    return TaskSeedValues.from_rows(final[["method", "seed", "task_id", "value"]])


def _complete(values: TaskSeedValues, methods: tuple[str, ...]) -> TaskSeedValues:
    """``methods`` of ``values`` on the tasks where each has a value for some seed."""
    keep = np.all([np.isfinite(values.values[m]).any(axis=1) for m in methods], axis=0)
    return TaskSeedValues(values.task_ids[keep], values.seeds,
                          {m: values.values[m][keep] for m in methods})


def tuned_gap(values: TaskSeedValues | pd.DataFrame,
              groups: Mapping[int, int] | None = None) -> pd.DataFrame:
    """The share of the flat-to-oracle gap that SPICE and SPICE (paper) close at their tuned
    settings, from per-task final regrets.

    With the context-free row (:data:`CONTEXT_FREE`) also the **in-context share**,
    (context-free - SPICE) / (context-free - oracle) paired by task: the part of what the
    oracle adds over knowing the population that SPICE gets by reading the context.

    Args:
        values: per task and training seed (:func:`final_task_seeds`), or per task with seeds
            already averaged (one column per method): then the intervals resample tasks only.
        groups: task id -> cluster (the darkroom's goal), or None.

    Returns:
        One row per learned method present: flat_minus_spice (mean, SEM over tasks of the
        seed means), gap_closed with its 95% interval lo / hi (the two-level bootstrap of
        :func:`hierarchical_interval`: seeds, then tasks or goals; seeded), n tasks, and
        ``defined``: whether the oracle prior beats the flat one by 2 paired SEMs (otherwise
        the share means nothing); with the context-free row, in_context_share with
        in_context_lo / in_context_hi and ``in_context_defined`` (the oracle beats the
        context-free prior by 2 paired SEMs); NaN without it. Empty without the flat and
        oracle columns.
    """
    if isinstance(values, pd.DataFrame):
        values = TaskSeedValues.from_wide(values)
    if not {FLAT, ORACLE} <= set(values.values):
        return pd.DataFrame()
    out = []
    for learned in (m for m in (LEARNED, PAPER) if m in values.values):
        both = _complete(values, (learned, FLAT, ORACLE))
        wide = both.wide()
        d_spice = (wide[FLAT] - wide[learned]).to_numpy()
        d_oracle = (wide[FLAT] - wide[ORACLE]).to_numpy()
        ratio, lo, hi = _gap_share(both, learned, FLAT, ORACLE, groups)
        n = len(d_spice)
        row = {"method": learned, "n": n, "flat_minus_spice": d_spice.mean(),
               "flat_minus_spice_sem": d_spice.std(ddof=1) / np.sqrt(n),
               "gap_closed": ratio, "lo": lo, "hi": hi,
               "defined": bool(d_oracle.mean() > 2 * d_oracle.std(ddof=1) / np.sqrt(n)),
               "in_context_share": np.nan, "in_context_lo": np.nan, "in_context_hi": np.nan,
               "in_context_defined": False}
        if CONTEXT_FREE in values.values:
            free = _complete(values, (learned, CONTEXT_FREE, ORACLE))
            d_best = (free.wide()[CONTEXT_FREE] - free.wide()[ORACLE]).to_numpy()
            share, s_lo, s_hi = _gap_share(free, learned, CONTEXT_FREE, ORACLE, groups)
            m = len(d_best)
            row |= {"in_context_share": share, "in_context_lo": s_lo, "in_context_hi": s_hi,
                    "in_context_defined": bool(m > 1 and d_best.mean()
                                               > 2 * d_best.std(ddof=1) / np.sqrt(m))}
        out.append(row)
    return pd.DataFrame(out)


def accuracy_by_task(df: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """Per method, the grid accuracy rows of a table (``spice_ray.evaluate.accuracy``) as one
    row per task and a column per metric, training seeds averaged per task first."""
    per_task = task_means(df[df["metric"].isin(ACCURACY_METRICS)].drop(
        columns=["config", "rule"]))
    return {str(method): rows.pivot_table(index="task_id", columns="metric", values="value")
            for method, rows in per_task.groupby("method", sort=False)}


def action_accuracy(df: pd.DataFrame) -> list[str]:
    """Sentences: each method's per-action accuracy on the grid with the task's whole context
    (``spice_ray.evaluate.accuracy``), over all tasks and split by whether the context shows
    the goal, and how often it stays on the goal (means over tasks, seeds averaged first)."""
    if "action_accuracy" not in set(df["metric"]):
        return []
    out = []
    for method, wide in accuracy_by_task(df).items():
        shown = wide["context_shows_goal"] > 0
        split = ", ".join(f"{wide.loc[mask, 'action_accuracy'].mean():.2f} where the context "
                          f"{word} the goal ({int(mask.sum())} tasks)"
                          for mask, word in ((shown, "shows"), (~shown, "does not show"))
                          if mask.any())
        stay = wide["stay_accuracy"]
        out.append(f"{method}: its action at a cell is optimal for "
                   f"{wide['action_accuracy'].mean():.2f} of cells, given the task's whole "
                   f"context ({split}); on the goal it stays in {stay.mean():.0%} of tasks"
                   + (f" ({stay[shown].mean():.0%} of those whose context shows it)."
                      if shown.any() else "."))
    return out
