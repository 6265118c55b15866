"""report.md: every figure, the headline numbers (final regret and offline suboptimality,
mean +- SEM over tasks after averaging seeds per task) and the config that produced them."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from spice_ray.common.artifacts import atomic_write_text
from spice_ray.common.metrics import (
    CUMULATIVE_REGRET,
    CUMULATIVE_RETURN,
    FINAL_REGRET,
    SUBOPTIMALITY,
)
from spice_ray.results.schema import settings_of
from spice_ray.results.summary import summarise
from spice_ray.results.tables import describe, list_experiments, load


def _fmt(mean: float, sem: float) -> str:
    return f"{mean:.3g} +- {sem:.2g}" if pd.notna(sem) else f"{mean:.3g}"


def _label(row: pd.Series) -> str:
    label = row["method"]
    if row.get("variant"):
        label += f" [{row['variant']}]"
    cfg = settings_of(row.get("config"))
    extra = {k: cfg[k] for k in ("beta", "beta_schedule") if k in cfg}
    if extra:
        settings = ", ".join(f"{k}={v}" for k, v in extra.items())
        # "SPICE (flat prior, beta=1.0)", not "SPICE (flat prior) (beta=1.0)"
        label = (label[:-1] + f", {settings})" if label.endswith(")") and " [" not in label
                 else f"{label} ({settings})")
    return label


def final_regret_table(df: pd.DataFrame, metric: str = CUMULATIVE_REGRET) -> pd.DataFrame:
    """Mean +- SEM of the last step's value per method/rule/config/variant."""
    sub = df[df["metric"] == metric]
    last = sub[sub["x"] == sub["x"].max()]
    summ = summarise(last, ["method", "variant", "rule", "config"])
    summ["label"] = summ.apply(_label, axis=1)
    return summ.sort_values("mean")


def offline_table(df: pd.DataFrame, hs: tuple[int, ...]) -> pd.DataFrame:
    """Suboptimality mean +- SEM at the requested context lengths (nearest measured h)."""
    sub = df[df["metric"] == SUBOPTIMALITY]
    measured = sorted(sub["x"].unique())
    picked = {h: min(measured, key=lambda m, h=h: abs(m - h)) for h in hs}
    rows = []
    summ = summarise(sub[sub["x"].isin(set(picked.values()))],
                     ["method", "variant", "rule", "config", "x"])
    summ["label"] = summ.apply(_label, axis=1)
    for label, g in summ.groupby("label", sort=False):
        row = {"method": label}
        for m in picked.values():
            r = g[g["x"] == m]
            row[f"h={m}"] = _fmt(float(r["mean"].iloc[0]), float(r["sem"].iloc[0])) \
                if len(r) else ""
        rows.append(row)
    return pd.DataFrame(rows)


def _cell(value: object) -> str:
    """One number format in every table: floats to 3 decimals, integers as they are."""
    if isinstance(value, float):
        return "nan" if value != value else f"{value:.3f}"
    return str(value)


def _md_table(df: pd.DataFrame) -> str:
    cols = list(df.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |"
              for row in df.itertuples(index=False)]
    return "\n".join(lines)


def write_report(run_dir: str | Path, figures: dict[str, list[Path]], configs: dict[str, str],
                 notes: list[str] | None = None, descriptions: dict[str, str] | None = None,
                 findings: dict[str, list[str]] | None = None,
                 horizon_points: tuple[int, ...] = (10, 50, 500),
                 order: list[str] | None = None,
                 sections: list[tuple[str, str, pd.DataFrame]] | None = None) -> Path:
    """Write ``<run_dir>/report.md`` (tables in ``order``, the study's, then any others) and
    ``<run_dir>/configs.md`` (every experiment's resolved config, the report's appendix);
    returns the report's path.

    Args:
        sections: (title, paragraph, table) shown before the tables (e.g. the settings chosen
            on validation tasks).
    """
    run_dir = Path(run_dir)
    out = ["# spice-ray study report", ""]
    out += [f"Run directory: `{run_dir.resolve()}`. Every number is mean +- SEM over evaluation "
            "tasks after averaging training seeds per task; per-seed rows are in `results/`.",
            ""]
    for note in notes or []:
        out += [f"- {note}"]
    out += [""]
    for title, text, table in sections or []:
        out += [f"## {title}", "", text, "", _md_table(table), ""]
    have = list_experiments(run_dir)
    have = [t for t in order or [] if t in have] + [t for t in have if t not in (order or [])]
    for exp in have:
        df = load(run_dir, exp)
        out += [f"## {exp}", "", (descriptions or {}).get(exp) or describe(run_dir, exp), ""]
        out += [*(f"- {line}" for line in (findings or {}).get(exp, [])), ""]
        metrics = set(df["metric"].unique())
        calibration = any(m.startswith("coverage_") for m in metrics)
        if SUBOPTIMALITY in metrics:
            out += ["Offline suboptimality (lower is better):", "",
                    _md_table(offline_table(df, horizon_points)), ""]
        for metric in (CUMULATIVE_REGRET, CUMULATIVE_RETURN, FINAL_REGRET):
            if metric in metrics and not calibration:
                t = final_regret_table(df, metric)
                if metric == FINAL_REGRET:
                    t = t.assign(sigma=t["config"].map(lambda c: settings_of(c).get("sigma")))
                    t = t.sort_values(["sigma", "mean"])
                    shown = t[["label", "sigma", "mean", "sem", "n", "seeds"]]
                else:
                    shown = t[["label", "mean", "sem", "n", "seeds"]]
                title = {CUMULATIVE_REGRET: "Final cumulative regret",
                         CUMULATIVE_RETURN: "Final cumulative return",
                         FINAL_REGRET: "Final regret by test-time sigma"}[metric]
                out += [f"{title}:", "", _md_table(shown), ""]
        if calibration:
            summ = summarise(df, ["metric", "x"])
            wide = summ.pivot(index="x", columns="metric", values="mean").round(3)
            out += ["Calibration by context length h (means over tasks):", "",
                    _md_table(wide.reset_index()), ""]
        for fig in figures.get(exp, []):
            out += [f"![{exp}]({fig.relative_to(run_dir).as_posix()})", ""]
    appendix = ["# Configs of the study", ""]
    for name, text in configs.items():
        appendix += [f"## {name}", "", "```yaml", text.rstrip(), "```", ""]
    atomic_write_text(run_dir / "configs.md", "\n".join(appendix))
    out += ["## Configs", "", "Every experiment's resolved config: [configs.md](configs.md).", ""]
    return atomic_write_text(run_dir / "report.md", "\n".join(out))
