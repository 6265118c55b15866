"""Figures that reproduce the paper's plots from the result tables (matplotlib, Agg backend).

Every curve is the mean over tasks after averaging seeds per task, with a +- SEM band; bars
carry +- SEM error bars. Each ``plot_*`` function takes an experiment's table and a path and
returns the path of the PNG it wrote.
"""

from __future__ import annotations

import zlib
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib import ticker  # noqa: E402

from spice_ray.common.metrics import (
    CUMULATIVE_REGRET,
    CUMULATIVE_RETURN,
    FINAL_REGRET,
    SUBOPTIMALITY,
)
from spice_ray.results.analysis import (  # noqa: E402
    WIDTH_SOURCE_ORDER,
    width_of,
    width_source_of,
)
from spice_ray.results.figure_files import extra_formats, mark_drawn  # noqa: E402
from spice_ray.results.figure_files import save as _save  # noqa: E402
from spice_ray.results.labels import setting_label  # noqa: E402
from spice_ray.results.schema import settings_of
from spice_ray.results.summary import summarise  # noqa: E402
from spice_ray.results.tables import load  # noqa: E402

METHOD_ORDER = ("SPICE", "SPICE (flat prior)", "SPICE (oracle prior)",
                "SPICE (learned mean, exact sd)", "Bayes posterior-UCB", "Count-UCB", "DPT",
                "AD-BC", "UCB", "TS", "TS (true prior)", "LinUCB", "LinTS (true prior)", "Emp",
                "LCB", "Nearest-unvisited", "Hill-climbing", "Random", "PPO", "Optimal",
                "SPICE (context-free prior)", "SPICE (training-data prior)")
"""Every method's place in legends and tables, and its colour (:func:`style`): one colour per
method in every figure. A test checks that every method of the registry is here. A new method
goes at the end, so the others keep their colours."""

_COLOURS = ("#1f77b4", "#7f7f7f", "#2ca02c", "#17becf", "#9467bd", "#8c564b", "#d62728",
            "#ff7f0e", "#bcbd22", "#e377c2", "#c51b7d", "#01665e", "#a6761d", "#c49c94",
            "#5e3c99", "#b8860b", "#6b6ecf", "#000000", "#d95f02", "#525252", "#66a61e",
            "#4d004b")
"""One per method of :data:`METHOD_ORDER`, none pale on the white background (the reference
methods that had light tints, LinUCB's and LinTS's among them, were hard to see; tested)."""
_DASHES = ("-", "--", ":", "-.", (0, (5, 1, 1, 1)), (0, (1, 3)))
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">")
_MORE_COLOURS = ("#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#5254a3", "#8ca252",
                 "#bd9e39", "#ad494a", "#a55194", "#3182bd", "#e6550d", "#31a354", "#756bb1")
"""Methods outside :data:`METHOD_ORDER` (a newly registered agent): one of these, by a stable
hash of the method's name, so its colour is the same in every figure and none of the above."""
_VARIANT_COLOURS = {"none": "#e69f00", "iw": "#009e73", "adv": "#cc79a7", "epi": "#6a3d9a"}
"""The darkroom weight ablation's SPICE variants ("[iw]" in a label): saturated colours (Okabe
and Ito's orange, bluish green and reddish purple, and a dark violet) apart from SPICE's blue and
DPT's red, so five curves whose bands overlap stay told apart (pale tints merged into grey)."""


def method_of(label: str) -> str | None:
    """The method a curve label starts with (the longest match: "SPICE (flat prior) (...)" is
    "SPICE (flat prior)", not "SPICE"), or None."""
    heads = [m for m in METHOD_ORDER if label == m or label.startswith(m + " ")]
    return max(heads, key=len) if heads else None


def style(label: str, setting: int = 0) -> dict[str, object]:
    """Colour, marker and dash of a curve: the colour and marker are the method's (a weight
    ablation variant "[iw]" has its own colour), the dash tells a method's settings apart
    (``setting``: their index within the figure)."""
    method = method_of(label)
    if method:
        i = METHOD_ORDER.index(method)
        colour = _COLOURS[i % len(_COLOURS)]
    else:  # a method the order does not know: stable by its name (the label before settings)
        i = zlib.crc32(label.split(" (")[0].split(" [")[0].encode())
        colour = _MORE_COLOURS[i % len(_MORE_COLOURS)]
    for variant, c in _VARIANT_COLOURS.items():
        if f"[{variant}]" in label:
            colour = c
    return {"color": colour, "marker": _MARKERS[i % len(_MARKERS)],
            "linestyle": _DASHES[setting % len(_DASHES)]}


def band_note(df: pd.DataFrame, marks: str = "lines: mean; bands / bars") -> str:
    """What a figure's bands and error bars are: mean ± 1 SEM over N tasks × S seeds."""
    seeds = df.loc[df["seed"] >= 0, "seed"].nunique() if "seed" in df else 0
    return (f"{marks}: ± 1 SEM over {df['task_id'].nunique()} tasks"
            + (f" (seeds averaged per task, {seeds} seeds)" if seeds > 1 else ""))


_PLAIN = ticker.FuncFormatter(lambda v, _: f"{v:g}")
"""Tick labels as plain numbers ("1", "10", "0.7"), not "1.0" or "7x10^-1"."""


class _PlainLogMinor(ticker.LogFormatter):
    """Matplotlib's choice of which minor log ticks get a label (only on an axis that spans
    little, where the major ticks are too few), written as plain numbers."""

    def _num_to_string(self, x: float, vmin: float, vmax: float) -> str:
        return f"{x:g}"


def _plain_log_ticks(ax) -> None:
    """Plain labels on every log axis of ``ax``, major and minor ticks alike."""
    for axis, scale in ((ax.xaxis, ax.get_xscale()), (ax.yaxis, ax.get_yscale())):
        if scale == "log":
            axis.set_major_formatter(_PLAIN)
            axis.set_minor_formatter(_PlainLogMinor(labelOnlyBase=False,
                                                    minor_thresholds=(2, 0.5)))


def _legend(ax, title: str | None = None) -> None:
    """A legend outside the data, right of the axes."""
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False,
              title=title, title_fontsize=7)


def curve_labels(summary: pd.DataFrame) -> pd.Series:
    """A readable label per (method, variant, rule, config) curve."""
    parts = summary["method"].astype(str)
    if "variant" in summary and (summary["variant"] != "").any():
        parts = parts + summary["variant"].map(lambda v: f" [{v}]" if v else "")
    multi_cfg = summary.groupby(["method", "variant"])["config"].transform("nunique") > 1
    cfg = summary["config"].map(setting_label)
    parts = parts + np.where(multi_cfg & (cfg != ""), " (" + cfg + ")", "")
    return parts


def _order(label: str) -> tuple[int, str]:
    """Methods in :data:`METHOD_ORDER`, then the others by label."""
    head = method_of(label)
    return (METHOD_ORDER.index(head) if head else len(METHOD_ORDER), label)


def _curves(ax, df: pd.DataFrame, metric: str, logx: bool = False) -> list[str]:
    """Draw one mean curve with its SEM band per label; returns a note for every curve that
    is exactly another drawn after it (so hidden under it), e.g. a flat prior's greedy choice
    offline, which is Thompson sampling's posterior mean."""
    sub = df[df["metric"] == metric]
    summ = summarise(sub, ["method", "variant", "rule", "config", "x"])
    summ["label"] = curve_labels(summ)
    settings: dict[str | None, int] = {}
    drawn: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    hidden: dict[str, str] = {}
    for label in sorted(summ["label"].unique(), key=_order):
        s = summ[summ["label"] == label].sort_values("x")
        x, m, e = s["x"].to_numpy(), s["mean"].to_numpy(), s["sem"].fillna(0).to_numpy()
        for other, (ox, om) in drawn.items():
            if other not in hidden and np.array_equal(ox, x) and np.array_equal(om, m):
                hidden[other] = label
        drawn[label] = (x, m)
        head = method_of(label)
        st = style(label, settings.get(head, 0))
        settings[head] = settings.get(head, 0) + 1
        ax.plot(x, m, label=label, lw=1.5, color=st["color"], linestyle=st["linestyle"],
                marker=st["marker"], markevery=max(1, len(x) // 6), markersize=4)
        ax.fill_between(x, m - e, m + e, color=st["color"], alpha=0.15, lw=0)
    if logx:
        ax.set_xscale("log")
        _plain_log_ticks(ax)
    ax.grid(alpha=0.3)
    return [f"{under} equals {over} at every point (hidden under it)"
            for under, over in hidden.items()]


def _notes(note: str, *extra: list[str]) -> str:
    """A figure's band note and its curve notes (each once), one line each."""
    lines = [note]
    for notes in extra:
        lines += [n for n in notes if n not in lines]
    return "\n".join(lines)


def plot_offline(df: pd.DataFrame, path: Path, title: str) -> Path:
    """Offline suboptimality vs context length h (log x)."""
    fig, ax = plt.subplots(figsize=(5.5, 4))
    hidden = _curves(ax, df, SUBOPTIMALITY, logx=True)
    ax.set(xlabel="context length h", ylabel=r"suboptimality  $\mu^* - \mu(\hat{a})$", title=title)
    _legend(ax)
    return _save(fig, path, _notes(band_note(df[df["metric"] == SUBOPTIMALITY]), hidden))


def plot_online(df: pd.DataFrame, path: Path, title: str, zoom_methods=("UCB", "TS", "SPICE")
                ) -> Path:
    """Online cumulative regret: full scale (left) and zoomed to the best methods (right)."""
    fig, (full, zoom) = plt.subplots(1, 2, figsize=(10, 4))
    online = df[df["metric"] == CUMULATIVE_REGRET]
    for ax in (full, zoom):
        hidden = _curves(ax, online, CUMULATIVE_REGRET)
        ax.set(xlabel="step t", ylabel="cumulative regret")
    fig.suptitle(title, fontsize=11)
    full.set_title("full scale", fontsize=9)
    last = online[online["x"] == online["x"].max()]
    best = summarise(last[last["method"].isin(zoom_methods)], ["method"])
    if not best.empty and 1.6 * float(best["mean"].max()) < 0.8 * full.get_ylim()[1]:
        zoom.set_ylim(0, 1.6 * float(best["mean"].max()))
        shown = [m for m in zoom_methods if m in set(best["method"])]
        zoom.set_title(f"zoomed to {', '.join(shown)}", fontsize=9)
        _legend(zoom)
    else:  # nothing worth zooming into: one panel
        fig.delaxes(zoom)
        _legend(full)
    return _save(fig, path, _notes(band_note(online), hidden))


def plot_robustness(df: pd.DataFrame, path: Path, title: str) -> Path:
    """Final regret vs test-time sigma: a point and its +- SEM bar per method and setting at
    each sigma (dodged), on a log axis (DPT is far larger), settings in the labels."""
    sub = df[df["metric"] == FINAL_REGRET].copy()
    sub["sigma"] = sub["config"].map(lambda c: settings_of(c).get("sigma", np.nan))
    sub["label"] = [f"{m} ({t})" if (t := setting_label(c)) else m
                    for m, c in zip(sub["method"], sub["config"], strict=True)]
    summ = summarise(sub.drop(columns=["config"]), ["label", "method", "sigma"], pool=True)
    labels, sigmas = sorted(summ["label"].unique(), key=_order), sorted(summ["sigma"].unique())
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for i, label in enumerate(labels):
        s, look = summ[summ["label"] == label].set_index("sigma").reindex(sigmas), style(label)
        ax.errorbar(np.arange(len(sigmas)) - 0.35 + (i + 0.5) * 0.7 / len(labels), s["mean"],
                    yerr=s["sem"].fillna(0), fmt=look["marker"], color=look["color"],
                    capsize=2, markersize=5, linestyle="none", label=label)
    ax.set_xticks(np.arange(len(sigmas)), [f"σ = {s:g}" for s in sigmas])
    ax.set_yscale("log")
    _plain_log_ticks(ax)
    ax.set(ylabel="final cumulative regret (log scale)", xlabel="test-time reward noise",
           title=title)
    _legend(ax)
    ax.grid(alpha=0.3, axis="y")
    return _save(fig, path, band_note(sub, "points: mean; bars"))


def plot_online_return(df: pd.DataFrame, path: Path, title: str) -> Path:
    """Online cumulative return (left) and cumulative regret (right)."""
    fig, (ret, reg) = plt.subplots(1, 2, figsize=(10, 4))
    hidden = _curves(ret, df, CUMULATIVE_RETURN)
    ret.set(xlabel="step t", ylabel="cumulative return", title=f"{title}: return")
    hidden_regret = _curves(reg, df, CUMULATIVE_REGRET)
    reg.set(xlabel="step t", ylabel="cumulative regret", title=f"{title}: regret")
    _legend(reg)
    return _save(fig, path, _notes(band_note(df[df["metric"] == CUMULATIVE_REGRET]),
                                   hidden, hidden_regret))


def plot_weights(df: pd.DataFrame, path: Path, title: str) -> Path:
    """Darkroom weight ablation: cumulative regret per SPICE variant and DPT."""
    fig, ax = plt.subplots(figsize=(6, 4))
    hidden = _curves(ax, df, CUMULATIVE_REGRET)
    ax.set(xlabel="step t", ylabel="cumulative regret", title=title)
    _legend(ax)
    return _save(fig, path, _notes(band_note(df[df["metric"] == CUMULATIVE_REGRET]),
                                   hidden))


_SOURCE_DASHES = ("-", "-.", ":")
"""One dash per width source of the prior figure (paper, fitted, predictive), so none hides
another: with a third source a two-dash cycle drew the predictive curves as the paper's."""


def plot_calibration(df: pd.DataFrame, path: Path, title: str) -> Path:
    """Prior coverage vs h against the nominal levels (left); pseudo-counts and the
    warm-start term vs h (right)."""
    fig, (cov, npri) = plt.subplots(1, 2, figsize=(10, 4))
    widths = df["config"].map(width_source_of)
    scale = {w: width_of(df.loc[widths == w, "config"].iloc[0]) for w in widths.unique()}
    sources = {w: ("" if widths.nunique() == 1 else " (s = 1)" if w == "paper"
                   else " (predictive head)" if w == "predictive" else f" (s = {scale[w]:.3g})")
               for w in sorted(widths.unique(), key=WIDTH_SOURCE_ORDER.index)}  # paper first
    levels = sorted(m for m in df["metric"].unique() if m.startswith("coverage_"))
    for k, (width, source) in enumerate(sources.items()):
        for i, metric in enumerate(levels):
            level = int(metric.split("_")[1]) / 100
            s = summarise(df[(df["metric"] == metric) & (widths == width)], ["x"]
                          ).sort_values("x")
            (line,) = cov.plot(s["x"], s["mean"], label=f"{level:.0%} interval{source}",
                               color=f"C{i}", ls=_SOURCE_DASHES[k % len(_SOURCE_DASHES)])
            cov.fill_between(s["x"], s["mean"] - s["sem"], s["mean"] + s["sem"],
                             color=line.get_color(), alpha=0.2, lw=0)
            if k == 0:
                cov.axhline(level, color=line.get_color(), ls="--", lw=0.8)
    cov.set(xscale="log", xlabel="context length h", ylabel="coverage of true arm means",
            ylim=(0, 1.02), title=f"{title}: coverage (dashed: nominal)")
    cov.legend(fontsize=8)
    for k, (width, source) in enumerate(sources.items()):
        for i, (metric, label) in enumerate((
                ("n_pri_mean", r"$N_{\rm pri}$ (mean over arms)"),
                ("warm_start", r"warm start $\sum_a N_{\rm pri} |\mu_{\rm pri} - \mu_a|$"))):
            s = summarise(df[(df["metric"] == metric) & (widths == width)], ["x"]
                          ).sort_values("x")
            if not s.empty:
                npri.plot(s["x"], s["mean"], label=label + source, color=f"C{i}",
                          ls=_SOURCE_DASHES[k % len(_SOURCE_DASHES)])
                npri.fill_between(s["x"], s["mean"] - s["sem"], s["mean"] + s["sem"],
                                  color=f"C{i}", alpha=0.2)
    npri.set(xscale="log", yscale="log", xlabel="context length h",
             ylabel="pseudo-counts (log)", title=f"{title}: prior strength")
    npri.legend(fontsize=8)
    npri.grid(alpha=0.3)
    cov.grid(alpha=0.3)
    for ax in (cov, npri):
        _plain_log_ticks(ax)
    return _save(fig, path, band_note(df))


def plot_final_distribution(df: pd.DataFrame, path: Path, title: str,
                            metric: str = CUMULATIVE_REGRET) -> Path:
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
    ax.set_xticks(range(1, len(order) + 1), [labels.iloc[i] for i in order], rotation=35,
                  ha="right", fontsize=7)
    ax.set(ylabel=f"final {metric.replace('_', ' ')} per task", title=f"{title}: per task")
    scale = ""
    if _squashed(groups):  # Random's or DPT's boxes flattened every other box at 0
        ax.set_yscale("symlog", linthresh=1.0)
        ax.set_ylim(bottom=0)
        ax.yaxis.set_major_formatter(_PLAIN)
        scale = "; y axis logarithmic above 1, linear below (the boxes differ tenfold)"
    ax.grid(alpha=0.3, axis="y")
    return _save(fig, path, f"box: quartiles, whiskers 5-95%, triangle: mean; one point per "
                            f"task ({per_task['task_id'].nunique()} tasks, seeds averaged)"
                            + scale)


def _squashed(groups: list[np.ndarray]) -> bool:
    """Whether one linear axis would flatten most boxes: non-negative values whose largest
    95th percentile is over ten times the typical (median) box's."""
    if len(groups) < 3 or min(float(g.min()) for g in groups) < 0:
        return False
    tops = [float(np.percentile(g, 95)) for g in groups]
    return max(tops) > 10 * max(float(np.median(tops)), 1e-12)


def plot_visits(df: pd.DataFrame, path: Path, title: str, tasks: int = 3) -> Path:
    """Where each agent went: visit counts on the grid for the first ``tasks`` tasks (rows)
    and each method (columns), seed 0 (or the lowest seed)."""
    marks = df[df["metric"].isin(["start_cell", "goal_cell"])]
    marks = {(str(m), int(t)): int(v) for m, t, v in
             marks[["metric", "task_id", "value"]].drop_duplicates().itertuples(index=False)}
    sub = df[(df["metric"] == "visits")]
    sub = sub[sub["seed"] == sub.groupby("method")["seed"].transform("min")]
    methods = sorted(sub["method"].unique(), key=_order)
    ids = sorted(sub["task_id"].unique())[:tasks]
    size = int(round(np.sqrt(sub["x"].max() + 1)))
    fig, axes = plt.subplots(len(ids), len(methods), figsize=(2.1 * len(methods), 2.1 * len(ids)),
                             squeeze=False, layout="constrained")
    vmax, image = max([1.0, *sub[sub["task_id"].isin(ids)]["value"]]), None
    for r, task in enumerate(ids):
        for c, method in enumerate(methods):
            rows = sub[(sub["task_id"] == task) & (sub["method"] == method)]
            grid = np.zeros(size * size)
            grid[rows["x"].to_numpy()] = rows["value"].to_numpy()
            ax = axes[r, c]  # one colour scale for every panel, so agents compare
            image = ax.imshow(grid.reshape(size, size).T, origin="lower", cmap="viridis",
                              vmin=0, vmax=vmax)
            for axis in (ax.xaxis, ax.yaxis):  # cell ticks, a faint grid between cells
                axis.set_ticks(range(0, size, max(1, size // 5)))
                axis.set_ticks(np.arange(-0.5, size, 1), minor=True)
            ax.tick_params(labelsize=6, length=2)
            ax.tick_params(which="minor", length=0)
            ax.grid(which="minor", color="white", linewidth=0.2, alpha=0.3)
            if r == 0:
                ax.set_title(method, fontsize=8)
            if c == 0:
                ax.set_ylabel(f"task {task}", fontsize=8)
            for mark, style_ in (("start_cell", {"marker": "s", "facecolors": "none",
                                                 "edgecolors": "white", "s": 60}),
                                 ("goal_cell", {"marker": "*", "color": "red", "s": 90})):
                if (mark, int(task)) in marks:
                    cell = marks[(mark, int(task))]
                    ax.scatter([cell // size], [cell % size], linewidths=1.2, **style_)
    if image is not None:
        fig.colorbar(image, ax=axes, fraction=0.02, pad=0.01, label="visits",
                     ticks=ticker.MaxNLocator(integer=True))
    fig.suptitle(f"{title}: state visits per cell (x right, y up)", fontsize=10)
    shown = " white square: start; red star: goal;" if marks else ""
    return _save(fig, path, f"colour: visits of the cell in the task's rollout, one scale for "
                            f"every map (each model's lowest training seed);{shown} one map per "
                            "task and method")


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
"""Plot kinds by name (``Table.figures`` of ``spice_ray.study.experiments``)."""


def draw_table(run_dir: Path, name: str, kinds: tuple[str, ...], paths: list[Path],
               title: str, stamp: str, formats: tuple[str, ...] = ()) -> str:
    """Draw result table ``name``'s figures (:data:`PLOTS` ``kinds``) to ``paths``, with
    vector copies in ``formats``, and mark them drawn from ``stamp`` (``figure_files``);
    returns ``name``. One table's figures are one job of the figures stage: it reads the table
    from ``run_dir`` itself, so it runs in any process that sees the run directory."""
    with extra_formats(formats):
        df = load(run_dir, name)
        for kind, path in zip(kinds, paths, strict=True):
            PLOTS[kind](df, path, title)
        mark_drawn(paths, stamp)
    return name
