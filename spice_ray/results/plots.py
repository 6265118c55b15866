"""Figures that reproduce the paper's plots from the result tables (matplotlib, Agg backend).

Every curve is the mean over tasks after averaging seeds per task, with a +- SEM band; bars
carry +- SEM error bars. Each ``plot_*`` function takes an experiment's table and a path and
returns the path of the PNG it wrote.
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from spice_ray.artifacts import atomic_path  # noqa: E402
from spice_ray.results.summary import summarise  # noqa: E402

METHOD_ORDER = ("SPICE", "SPICE (flat prior)", "Count-UCB", "DPT", "AD-BC", "UCB", "TS", "Emp",
                "LCB", "Random", "PPO")


def _config_label(config: str) -> str:
    try:
        cfg = json.loads(config)
    except (TypeError, json.JSONDecodeError):
        return str(config)
    keep = {k: v for k, v in cfg.items() if k in ("beta", "beta_schedule", "kernel", "tau")}
    return ", ".join(f"{k}={v}" for k, v in keep.items())


def curve_labels(summary: pd.DataFrame) -> pd.Series:
    """A readable label per (method, variant, rule, config) curve."""
    parts = summary["method"].astype(str)
    if "variant" in summary and (summary["variant"] != "").any():
        parts = parts + summary["variant"].map(lambda v: f" [{v}]" if v else "")
    multi_cfg = summary.groupby(["method", "variant"])["config"].transform("nunique") > 1
    cfg = summary["config"].map(_config_label)
    parts = parts + np.where(multi_cfg & (cfg != ""), " (" + cfg + ")", "")
    return parts


def _order(label: str) -> tuple[int, str]:
    """Methods in :data:`METHOD_ORDER` (the longest name that starts the label: "SPICE (flat
    prior) (beta=1.0)" is "SPICE (flat prior)", not "SPICE"), then the others by label."""
    heads = [m for m in METHOD_ORDER if label == m or label.startswith(m + " ")]
    head = max(heads, key=len) if heads else None
    return (METHOD_ORDER.index(head) if head else len(METHOD_ORDER), label)


def _curves(ax, df: pd.DataFrame, metric: str, logx: bool = False) -> None:
    sub = df[df["metric"] == metric]
    summ = summarise(sub, ["method", "variant", "rule", "config", "x"])
    summ["label"] = curve_labels(summ)
    for label in sorted(summ["label"].unique(), key=_order):
        s = summ[summ["label"] == label].sort_values("x")
        x, m, e = s["x"].to_numpy(), s["mean"].to_numpy(), s["sem"].fillna(0).to_numpy()
        (line,) = ax.plot(x, m, label=label, lw=1.5)
        ax.fill_between(x, m - e, m + e, color=line.get_color(), alpha=0.2, lw=0)
    if logx:
        ax.set_xscale("log")
    ax.grid(alpha=0.3)


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    try:
        with atomic_path(path) as tmp:  # never a half PNG; a full disk names the file
            fig.savefig(tmp, dpi=120, format="png")
    finally:
        plt.close(fig)
    return path


def plot_offline(df: pd.DataFrame, path: Path, title: str) -> Path:
    """Offline suboptimality vs context length h (log x)."""
    fig, ax = plt.subplots(figsize=(5.5, 4))
    _curves(ax, df, "suboptimality", logx=True)
    ax.set(xlabel="context length h", ylabel="suboptimality  mu* - mu(a_hat)", title=title)
    ax.legend(fontsize=8)
    return _save(fig, path)


def plot_online(df: pd.DataFrame, path: Path, title: str, zoom_methods=("UCB", "TS", "SPICE")
                ) -> Path:
    """Online cumulative regret: full scale (left) and zoomed to the best methods (right)."""
    fig, (full, zoom) = plt.subplots(1, 2, figsize=(10, 4))
    online = df[df["metric"] == "cumulative_regret"]
    for ax in (full, zoom):
        _curves(ax, online, "cumulative_regret")
        ax.set(xlabel="step t", ylabel="cumulative regret")
    full.set_title(f"{title} (full scale)")
    zoom.set_title(f"{title} (zoomed)")
    last = online[online["x"] == online["x"].max()]
    best = summarise(last[last["method"].isin(zoom_methods)], ["method"])
    if not best.empty:
        zoom.set_ylim(0, 1.6 * float(best["mean"].max()))
    full.legend(fontsize=8)
    return _save(fig, path)


def plot_robustness(df: pd.DataFrame, path: Path, title: str) -> Path:
    """Final regret vs test-time sigma, one bar group per sigma (log y: DPT is far larger)."""
    sub = df[df["metric"] == "final_regret"].copy()
    sub["sigma"] = sub["config"].map(lambda c: json.loads(c).get("sigma", np.nan))
    summ = summarise(sub, ["method", "rule", "sigma"])
    methods = sorted(summ["method"].unique(), key=lambda m: _order(m))
    sigmas = sorted(summ["sigma"].unique())
    fig, ax = plt.subplots(figsize=(6.5, 4))
    width = 0.8 / max(1, len(methods))
    for i, method in enumerate(methods):
        s = summ[summ["method"] == method].set_index("sigma").reindex(sigmas)
        ax.bar(np.arange(len(sigmas)) + i * width, s["mean"], width, yerr=s["sem"].fillna(0),
               label=method, capsize=2)
    ax.set_xticks(np.arange(len(sigmas)) + 0.4 - width / 2, [f"sigma={s:g}" for s in sigmas])
    ax.set_yscale("log")
    ax.set(ylabel="final cumulative regret", title=title)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    return _save(fig, path)


def plot_online_return(df: pd.DataFrame, path: Path, title: str) -> Path:
    """Online cumulative return (left) and cumulative regret (right)."""
    fig, (ret, reg) = plt.subplots(1, 2, figsize=(10, 4))
    _curves(ret, df, "cumulative_return")
    ret.set(xlabel="step t", ylabel="cumulative return", title=f"{title}: return")
    _curves(reg, df, "cumulative_regret")
    reg.set(xlabel="step t", ylabel="cumulative regret", title=f"{title}: regret")
    ret.legend(fontsize=8)
    return _save(fig, path)


def plot_weights(df: pd.DataFrame, path: Path, title: str) -> Path:
    """Darkroom weight ablation: cumulative regret per SPICE variant and DPT."""
    fig, ax = plt.subplots(figsize=(6, 4))
    _curves(ax, df, "cumulative_regret")
    ax.set(xlabel="step t", ylabel="cumulative regret", title=title)
    ax.legend(fontsize=8)
    return _save(fig, path)


def plot_calibration(df: pd.DataFrame, path: Path, title: str) -> Path:
    """Prior coverage vs h against the nominal levels (left); pseudo-counts and the
    warm-start term vs h (right)."""
    fig, (cov, npri) = plt.subplots(1, 2, figsize=(10, 4))
    for metric in sorted(m for m in df["metric"].unique() if m.startswith("coverage_")):
        level = int(metric.split("_")[1]) / 100
        s = summarise(df[df["metric"] == metric], ["x"]).sort_values("x")
        (line,) = cov.plot(s["x"], s["mean"], label=f"{level:.0%} interval")
        cov.fill_between(s["x"], s["mean"] - s["sem"], s["mean"] + s["sem"],
                         color=line.get_color(), alpha=0.2, lw=0)
        cov.axhline(level, color=line.get_color(), ls="--", lw=0.8)
    cov.set(xscale="log", xlabel="context length h", ylabel="coverage of true arm means",
            ylim=(0, 1.02), title=f"{title}: coverage (dashed: nominal)")
    cov.legend(fontsize=8)
    for metric, label in (("n_pri_mean", "N_pri (mean over arms)"),
                          ("warm_start", "warm start sum_a N_pri |mu_pri - mu_a|")):
        s = summarise(df[df["metric"] == metric], ["x"]).sort_values("x")
        if not s.empty:
            npri.plot(s["x"], s["mean"], label=label)
            npri.fill_between(s["x"], s["mean"] - s["sem"], s["mean"] + s["sem"], alpha=0.2)
    npri.set(xscale="log", yscale="log", xlabel="context length h",
             title=f"{title}: prior strength")
    npri.legend(fontsize=8)
    npri.grid(alpha=0.3)
    cov.grid(alpha=0.3)
    return _save(fig, path)


def plot_final_distribution(df: pd.DataFrame, path: Path, title: str,
                            metric: str = "cumulative_regret") -> Path:
    """Per-task final values, one box per curve (seeds averaged per task): the spread and the
    heavy tail that a mean hides (e.g. tasks that lock onto a wrong arm)."""
    sub = df[df["metric"] == metric]
    last = sub[sub["x"] == sub["x"].max()]
    per_task = last.groupby(["method", "variant", "rule", "config", "task_id"],
                            observed=True)["value"].mean().reset_index()
    curves = per_task.groupby(["method", "variant", "rule", "config"], observed=True)
    labels = curve_labels(curves.size().reset_index())
    order = sorted(range(len(labels)), key=lambda i: _order(labels.iloc[i]))
    groups = [g["value"].to_numpy() for _, g in curves]
    fig, ax = plt.subplots(figsize=(max(5.0, 1.1 * len(groups)), 4))
    ax.boxplot([groups[i] for i in order], whis=(5, 95), showmeans=True,
               flierprops={"markersize": 3})
    ax.set_xticks(range(1, len(order) + 1), [labels.iloc[i] for i in order], rotation=30,
                  ha="right", fontsize=8)
    ax.set(ylabel=f"final {metric.replace('_', ' ')} per task",
           title=f"{title}: per-task distribution (whiskers 5-95%, triangle = mean)")
    ax.grid(alpha=0.3, axis="y")
    return _save(fig, path)


def plot_visits(df: pd.DataFrame, path: Path, title: str, tasks: int = 3) -> Path:
    """Where each agent went: visit counts on the grid for the first ``tasks`` tasks (rows)
    and each method (columns), seed 0 (or the lowest seed)."""
    sub = df[(df["metric"] == "visits")]
    sub = sub[sub["seed"] == sub.groupby("method")["seed"].transform("min")]
    methods = sorted(sub["method"].unique(), key=_order)
    ids = sorted(sub["task_id"].unique())[:tasks]
    size = int(round(np.sqrt(sub["x"].max() + 1)))
    fig, axes = plt.subplots(len(ids), len(methods), figsize=(2.1 * len(methods), 2.1 * len(ids)),
                             squeeze=False)
    for r, task in enumerate(ids):
        for c, method in enumerate(methods):
            rows = sub[(sub["task_id"] == task) & (sub["method"] == method)]
            grid = np.zeros(size * size)
            grid[rows["x"].to_numpy()] = rows["value"].to_numpy()
            ax = axes[r, c]
            ax.imshow(grid.reshape(size, size).T, origin="lower", cmap="viridis")
            ax.set_xticks([])
            ax.set_yticks([])
            if r == 0:
                ax.set_title(method, fontsize=8)
            if c == 0:
                ax.set_ylabel(f"task {task}", fontsize=8)
    fig.suptitle(f"{title}: state visits (x right, y up)", fontsize=10)
    return _save(fig, path)


PLOTS = {
    "offline": plot_offline,
    "online": plot_online,
    "robustness": plot_robustness,
    "online_return": plot_online_return,
    "weights": plot_weights,
    "calibration": plot_calibration,
    "distribution": plot_final_distribution,
    "visits": plot_visits,
}
"""Plot kinds by name (``Table.figures`` of ``spice_ray.experiments``)."""
