"""Aggregates across experiments, as rliable reports them: normalised scores, the
interquartile mean, performance profiles and the probability of improvement, each with a
bootstrap interval.

The score of a method on one eval task and training seed is its final cumulative regret
normalised by the experiment's uniform-random agent: ``1 - R / mean(R_random)`` (0 = acting at
random, 1 = no regret; Random is in every tuned table for this). As in every table here, a
method's score on a task is its mean over training seeds. Experiments are crossed designs
(every trained model is evaluated on every task), so an interval resamples, within each
experiment independently, its eval tasks and its training seeds (then averages the drawn
seeds per task); methods without a training seed (the references) have the same score under
every seed.

The ``rliable`` package is not used: its 1.2 release needs ``arch < 8``, and arch 7.2 fails to
import against the pandas 3 this platform runs on (``deprecate_kwarg`` changed signature).
The statistics are the same few lines of numpy (the IQM is ``summary.iqm``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from spice_ray.common.metrics import CUMULATIVE_REGRET
from spice_ray.results.summary import RESAMPLES, iqm

REFERENCE = "Random"
"""The method whose mean final regret is each experiment's zero score."""
TAUS = np.linspace(0.0, 1.0, 101)
"""Score thresholds of the performance profile."""
METRIC = CUMULATIVE_REGRET


@dataclass(frozen=True)
class Scores:
    """Normalised scores: per experiment, per method, an array [seeds, tasks] (tasks in the
    same order for every method of an experiment)."""

    by_experiment: dict[str, dict[str, np.ndarray]]

    def methods_everywhere(self) -> list[str]:
        """Methods present in every experiment, in first-seen order."""
        exps = list(self.by_experiment.values())
        return [m for m in exps[0] if all(m in e for e in exps)] if exps else []

    def experiments_with(self, *methods: str) -> list[str]:
        return [e for e, s in self.by_experiment.items() if all(m in s for m in methods)]


def normalised_scores(tables: Mapping[str, pd.DataFrame], reference: str = REFERENCE
                      ) -> Scores:
    """Scores from each experiment's tuned table (experiment -> its rows).

    Raises:
        ValueError: an experiment without ``reference`` rows, or whose reference has no
            regret to normalise by; a method that misses some of the experiment's tasks.
    """
    out: dict[str, dict[str, np.ndarray]] = {}
    for exp, df in tables.items():
        sub = df[df["metric"] == METRIC]
        last = sub[sub["x"] == sub.groupby("method")["x"].transform("max")]
        ref = last[last["method"] == reference]["value"]
        if ref.empty:
            raise ValueError(f"{exp}: no {reference!r} rows to normalise by (methods: "
                             f"{', '.join(sorted(last['method'].unique()))})")
        scale = float(ref.mean())
        if not scale > 0:
            raise ValueError(f"{exp}: {reference}'s mean final regret is {scale}; scores "
                             "cannot be normalised by it")
        tasks = np.sort(last["task_id"].unique())
        wide = last.pivot_table(index=["method", "seed"], columns="task_id", values="value",
                                aggfunc="first")
        seeds = max(len(g) for _, g in wide.groupby(level="method"))
        per_method = {}
        for method in dict.fromkeys(last["method"]):
            block = wide.loc[method].reindex(columns=tasks).to_numpy(dtype=np.float64)
            if np.isnan(block).any():
                raise ValueError(f"{exp}: {method} lacks a final regret on some eval tasks")
            if len(block) == 1:  # no training seed: the same score under every seed
                block = np.repeat(block, seeds, axis=0)
            if len(block) != seeds:
                raise ValueError(f"{exp}: {method} has {len(block)} training seeds, others "
                                 f"{seeds}")
            per_method[method] = 1.0 - block / scale
        out[exp] = per_method
    return Scores(out)


def _resamples(shapes: list[tuple[int, int]], reps: int, seed: int
               ) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per experiment: seed indices [reps, seeds] and task indices [reps, tasks], drawn with
    replacement (one seeded stream, experiments in order)."""
    rng = np.random.default_rng(seed)
    return [(rng.integers(0, s, (reps, s)), rng.integers(0, t, (reps, t))) for s, t in shapes]


def _draws(arrays: list[list[np.ndarray]], reps: int, seed: int
           ) -> tuple[list[list[np.ndarray]], list[list[np.ndarray]]]:
    """Per method, per experiment: each task's seed mean [tasks] and its resampled seed means
    [reps, tasks] (each experiment's tasks and seeds drawn with replacement, the same draw for
    every method: paired)."""
    idx = _resamples([a.shape for a in arrays[0]], reps, seed)
    point = [[a.mean(axis=0) for a in per_exp] for per_exp in arrays]
    drawn = [[a[si[:, :, None], ti[:, None, :]].mean(axis=1)  # [reps, tasks]
              for a, (si, ti) in zip(per_exp, idx, strict=True)] for per_exp in arrays]
    return point, drawn


def _interval(arrays: list[list[np.ndarray]], statistic: Callable[..., np.ndarray], reps: int,
              seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Point estimate and 95% percentile interval of ``statistic(*task_scores)``.

    ``arrays``: per method, per experiment [seeds, tasks]. The statistic sees, per method, one
    score per task (its mean over the seeds), pooled over experiments, along the last axis
    (it reduces that axis: [..., tasks] -> [...] or [..., k]); a resample draws each
    experiment's tasks and seeds with replacement, the same draw for every method (paired)."""
    point, drawn = _draws(arrays, reps, seed)
    lo, hi = np.percentile(np.asarray(statistic(*[np.concatenate(d, axis=1) for d in drawn]),
                                      dtype=np.float64), [2.5, 97.5], axis=0)
    return np.asarray(statistic(*[np.concatenate(p) for p in point]), dtype=np.float64), lo, hi


def _per_experiment_interval(arrays: list[list[np.ndarray]],
                             statistic: Callable[..., np.ndarray], reps: int, seed: int
                             ) -> tuple[float, float, float]:
    """As :func:`_interval`, but the statistic is taken within each experiment and then
    averaged over experiments, so each experiment counts once whatever its task count."""
    point, drawn = _draws(arrays, reps, seed)
    n = len(arrays[0])
    est = np.mean([statistic(*[p[e] for p in point]) for e in range(n)])
    boot = np.mean([statistic(*[d[e] for d in drawn]) for e in range(n)], axis=0)
    lo, hi = np.percentile(boot, [2.5, 97.5])
    return float(est), float(lo), float(hi)


def aggregate_table(scores: Scores, reps: int = RESAMPLES, seed: int = 0) -> pd.DataFrame:
    """IQM and mean over tasks (after averaging seeds per task) of the normalised score of
    every method present in every experiment, with 95% intervals."""
    rows = []
    exps = list(scores.by_experiment)
    for method in scores.methods_everywhere():
        arrays = [[scores.by_experiment[e][method] for e in exps]]
        row = {"method": method, "experiments": len(exps),
               "tasks": sum(a.shape[1] for a in arrays[0])}
        for name, fn in (("IQM", iqm), ("mean", lambda v: np.mean(v, axis=-1))):
            point, lo, hi = _interval(arrays, fn, reps, seed)
            row |= {name: float(point), f"{name} low": float(lo), f"{name} high": float(hi)}
        rows.append(row)
    return pd.DataFrame(rows)


def probability_of_improvement(x: np.ndarray, y: np.ndarray) -> float:
    """P(X > Y) on a random task: the share of tasks where X's score is higher, ties counting
    half (x, y: [..., tasks], paired by task) -> [...]."""
    return (0.5 * (1.0 + np.sign(np.asarray(x) - np.asarray(y)))).mean(axis=-1)


def improvement_table(scores: Scores, method: str = "SPICE", reps: int = RESAMPLES,
                      seed: int = 0) -> pd.DataFrame:
    """P(``method`` scores higher than X) for every other method X, over the tasks of the
    experiments both are in (their count is a column), with a 95% interval: pooled over
    tasks (``P(better)``: an experiment with more tasks weighs more) and per experiment
    (``P(better), per experiment``: each experiment's own P, averaged, so each counts
    once)."""
    rows = []
    others = dict.fromkeys(m for s in scores.by_experiment.values() for m in s if m != method)
    for other in others:
        exps = scores.experiments_with(method, other)
        if not exps:
            continue
        arrays = [[scores.by_experiment[e][m] for e in exps] for m in (method, other)]
        point, lo, hi = _interval(arrays, probability_of_improvement, reps, seed)
        each, each_lo, each_hi = _per_experiment_interval(arrays, probability_of_improvement,
                                                          reps, seed)
        rows.append({"method": method, "other": other, "experiments": len(exps),
                     "P(better)": float(point), "low": float(lo), "high": float(hi),
                     "P(better), per experiment": each, "per experiment low": each_lo,
                     "per experiment high": each_hi})
    if not rows:
        return pd.DataFrame(rows)
    return pd.DataFrame(rows).sort_values("P(better)", ascending=False, ignore_index=True)


def performance_profile(scores: Scores, taus: np.ndarray = TAUS, reps: int = RESAMPLES,
                        seed: int = 0) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per method present in every experiment: the share of tasks whose score (averaged over
    seeds) is above each tau, with a 95% band; method -> (share, low, high), each
    [len(taus)]."""
    exps = list(scores.by_experiment)
    out = {}
    for method in scores.methods_everywhere():
        arrays = [[scores.by_experiment[e][method] for e in exps]]
        out[method] = _interval(arrays, lambda v: (v[..., None] > taus).mean(axis=-2),
                                reps, seed)
    return out


@dataclass(frozen=True)
class Aggregate:
    """Everything the aggregate figure and the report's sections show."""

    scores: Scores
    table: pd.DataFrame
    """:func:`aggregate_table`."""
    profile: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]
    """:func:`performance_profile`."""
    improvement: pd.DataFrame
    """:func:`improvement_table` of SPICE."""
    taus: np.ndarray
    """The profile's thresholds."""


def aggregate(scores: Scores, reps: int = RESAMPLES, seed: int = 0) -> Aggregate:
    return Aggregate(scores, aggregate_table(scores, reps, seed),
                     performance_profile(scores, TAUS, reps, seed),
                     improvement_table(scores, "SPICE", reps, seed), TAUS)


def study_aggregate(run_dir: Path, experiments: list[str], reps: int = RESAMPLES
                    ) -> list[tuple[str, str, pd.DataFrame]]:
    """The study's aggregate over its tuned tables (``<experiment>_tuned``): draws
    ``figures/aggregate.png`` (kept when its sidecar says it was drawn from the same tables
    by the same code) and returns the report's sections (title,
    text, table); none when fewer than two experiments have a tuned table with Random in
    it."""
    from spice_ray import results
    from spice_ray.common.artifacts import file_sha256
    from spice_ray.config import config_hash
    from spice_ray.results import plots
    from spice_ray.results.figure_files import is_drawn, mark_drawn
    from spice_ray.results.tables import list_experiments, load, table_path

    run_dir = Path(run_dir)
    have = set(list_experiments(run_dir))
    tables, left_out = {}, []
    for exp in experiments:
        if f"{exp}_tuned" not in have:
            continue
        df = load(run_dir, f"{exp}_tuned")
        if (df["method"] == REFERENCE).any():
            tables[exp] = df
        else:
            left_out.append(exp)
    if len(tables) < 2:
        return []
    result = aggregate(normalised_scores(tables), reps=reps)
    path = run_dir / "figures" / "aggregate.png"
    code = [file_sha256(Path(m.__file__)) for m in (plots, results.aggregate)]
    stamp = config_hash({"code": code, "reps": reps, "tables": {
        e: table_path(run_dir, f"{e}_tuned").with_suffix(".parquet.sha256").read_text()
        for e in tables}})
    if not is_drawn([path], stamp):
        plot_aggregate(result, path)
        mark_drawn([path], stamp)
    agg, imp = result.table, result.improvement
    fmt = "{:.3f} [{:.3f}, {:.3f}]".format
    agg_shown = pd.DataFrame({
        "method": agg["method"],
        "IQM [95% CI]": [fmt(*r) for r in agg[["IQM", "IQM low", "IQM high"]].to_numpy()],
        "mean [95% CI]": [fmt(*r) for r in agg[["mean", "mean low", "mean high"]].to_numpy()],
        "experiments": agg["experiments"]}).sort_values("method", key=_rank)
    imp_shown = pd.DataFrame({
        "SPICE vs": imp["other"],
        "P(SPICE better), each experiment once [95% CI]": [
            fmt(*r) for r in imp[["P(better), per experiment", "per experiment low",
                                  "per experiment high"]].to_numpy()],
        "P(SPICE better), each task once [95% CI]": [
            fmt(*r) for r in imp[["P(better)", "low", "high"]].to_numpy()],
        "experiments": imp["experiments"]}) if len(imp) else imp
    rel = path.relative_to(run_dir).as_posix()
    names = ", ".join(tables)
    text = (f"Normalised score = 1 - final regret / Random's mean final regret in the same "
            f"experiment (0 = acting at random, 1 = no regret), each method at its "
            f"validation-tuned setting, over the eval tasks of {names}; training seeds are "
            "averaged per task, and intervals resample tasks and seeds within each experiment "
            f"({reps} seeded resamples). The IQM is the mean of the middle half of the task "
            "scores. Only methods present in every experiment are aggregated."
            + (f" Left out (no Random row): {', '.join(left_out)}." if left_out else "")
            + f"\n\n![aggregate]({rel})")
    return [("Across experiments (normalised scores)", text, agg_shown),
            ("Probability of improvement", "P(SPICE scores higher than X) on a random eval "
             "task (seeds averaged per task, ties count half) over the experiments where X is "
             "evaluated: each experiment's P averaged (every experiment counts once), and "
             "pooled over their tasks (an experiment with more tasks weighs more); 0.5 = no "
             "better than X.", imp_shown)]


def _rank(labels: pd.Series) -> pd.Series:
    """Methods in the plots' order (``plots.METHOD_ORDER``), the others last."""
    from spice_ray.results.plots import METHOD_ORDER, method_of

    return labels.map(lambda label: METHOD_ORDER.index(method_of(label))
                      if method_of(label) else len(METHOD_ORDER))


def plot_aggregate(agg: Aggregate, path: Path) -> Path:
    """Across experiments: IQM and mean normalised score per method present everywhere, its
    performance profile, and P(SPICE better than X) over the experiments both are in, grouped
    by how many that is; every band and bar a 95% bootstrap interval."""
    from spice_ray.results.figure_files import save
    from spice_ray.results.plots import _order, method_of, plt, style

    table, profile, improve = agg.table, agg.profile, agg.improvement
    n_exp = len(agg.scores.by_experiment)
    # constrained: tight_layout's one spacing for every gap took the widest (the third
    # panel's labels) and left wide empty gaps between the first two
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8), layout="constrained",
                             gridspec_kw={"width_ratios": [1.1, 1.3, 1.4]})
    ax = axes[0]
    reference = "Random"  # 0 by construction: drawn, it would squeeze the others together
    methods = sorted((m for m in table["method"] if m != reference), key=_order)
    for i, m in enumerate(methods):
        r = table[table["method"] == m].iloc[0]
        for j, (stat, marker) in enumerate((("IQM", "o"), ("mean", "s"))):
            y = i + (0.15 if j else -0.15)
            ax.errorbar(r[stat], y, xerr=[[r[stat] - r[f"{stat} low"]],
                                          [r[f"{stat} high"] - r[stat]]],
                        fmt=marker, color=style(m)["color"], capsize=3,
                        markerfacecolor="white" if j else style(m)["color"])
    ax.set_yticks(range(len(methods)), methods, fontsize=8)
    ax.invert_yaxis()
    ax.set(xlabel="normalised score (0 = Random, 1 = no regret)\n"
                  "filled: IQM, open: mean", title=f"aggregate over {n_exp} experiments")
    ax.grid(alpha=0.3, axis="x")
    ax = axes[1]
    heads: dict[str | None, int] = {}  # a method's second curve (SPICE (paper)) gets a dash
    for m in methods:
        share, lo, hi = profile[m]
        head = method_of(m)
        st = style(m, heads.get(head, 0))
        heads[head] = heads.get(head, 0) + 1
        ax.plot(agg.taus, share, color=st["color"], ls=st["linestyle"], label=m, lw=1.5)
        ax.fill_between(agg.taus, lo, hi, color=st["color"], alpha=0.2, lw=0)
    shown = [agg.taus[np.argmax(profile[m][0] < 0.98)] for m in methods]  # where each drops
    ax.set_xlim(max(0.0, min(shown, default=0.0) - 0.05), 1.0)
    ax.set(xlabel="normalised score tau", ylabel="share of tasks with score > tau",
           title="performance profile")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower left", fontsize=7, frameon=False)
    ax = axes[2]
    if len(improve):  # grouped by the experiments both share (most first), then by P
        rows = improve.sort_values(["experiments", "P(better)"], ascending=[True, True],
                                   ignore_index=True)
        for i, r in rows.iterrows():
            ax.errorbar(r["P(better)"], i, xerr=[[r["P(better)"] - r["low"]],
                                                 [r["high"] - r["P(better)"]]],
                        fmt="o", color=style(r["other"])["color"], capsize=3)
        for i in np.flatnonzero(np.diff(rows["experiments"].to_numpy())):
            ax.axhline(i + 0.5, color="#999999", lw=0.6)  # a new number of shared experiments
        ax.set_yticks(range(len(rows)), [f"{o} ({k} exp.)" for o, k in
                                         zip(rows["other"], rows["experiments"], strict=True)],
                      fontsize=8)
        ax.axvline(0.5, color="#555555", lw=0.8, linestyle="--")
    ax.set(xlabel="P(SPICE scores higher than X)", title="probability of improvement")
    ax.grid(alpha=0.3, axis="x")
    tasks = sum(next(iter(s.values())).shape[1] for s in agg.scores.by_experiment.values())
    return save(fig, path, f"score = 1 - final regret / Random's mean final regret in the "
                            f"same experiment, each method at its validation-tuned setting; "
                            f"{tasks} eval tasks of {n_exp} experiments, training seeds "
                            "averaged per task; Random (0 by construction) is left out of the "
                            "first two panels.\nBars and bands: 95% bootstrap intervals "
                            "resampling tasks and seeds within each experiment; 'k exp.': the "
                            "experiments SPICE and X share.")
