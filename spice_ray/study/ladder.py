"""The scaling ladder: does in-context learning appear with more training steps?

One model per family and seed is trained once through a geometric ladder of step budgets
(multiples of the preset's own steps for that model). Each rung is a study run of its own
(``<out>/<family>/rung-<m>x``: datasets, pretraining, tuning on validation tasks, evaluation,
report), and a rung's training resumes from the rung below's final checkpoint, copied into its
model directory: under a constant learning rate a model's training identity leaves out the
number of epochs (``TrainJob.identity``), so the checkpoint is the same job's at an earlier
epoch, and rung m's model is bit for bit the model a straight m-epoch training gives.

Every rung draws ``steps x batch`` distinct training tasks once (one epoch is the preset's
whole training), so the top rung sees each task ``m`` times rather than ``5m`` or ``10m``; the
train and validation losses of each rung show whether it memorises.

What a rung measures, from its own tables and checkpoints:

* SPICE families (``bandit_latent``, ``bandit_template``): train and validation loss; the
  learned prior's RMSE against the exact posterior mean and its 90% coverage of the true means
  at h in :data:`HS` (at the paper's width and at the width fitted on validation); final regret
  of SPICE, SPICE (paper), the flat and oracle priors at their validation-chosen settings, and
  the share of the flat-to-oracle gap SPICE closes, with its bootstrap interval.
* DPT* (``darkroom_dpt_star``): losses, the DPT paper's return, and its action's accuracy at
  every cell of the held-out goals' grids, "stay" on the goal included, from its study table
  (:mod:`spice_ray.evaluate.accuracy`).
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from spice_ray.common.artifacts import atomic_path, atomic_write_text, publish_dir, write_checked
from spice_ray.common.metrics import CUMULATIVE_RETURN
from spice_ray.config import ConfigError
from spice_ray.data import store
from spice_ray.model import checkpoint as ckpt
from spice_ray.results.analysis import (
    FLAT,
    LEARNED,
    ORACLE,
    PAPER,
    accuracy_by_task,
    final_by_task,
    tuned_gap,
    width_source_of,
)
from spice_ray.results.choices import fitted_decay, fitted_scale
from spice_ray.results.summary import final_values, task_means
from spice_ray.results.tables import load
from spice_ray.study import plan_study
from spice_ray.study.tuning import read_tuning
from spice_ray.train.loop import steps_per_epoch

FAMILIES = {"bandit_latent": "spice", "bandit_template": "spice", "darkroom_dpt_star": "dpt"}
"""The ladder's experiments and the model kind each trains."""
MULTIPLES = (1, 3, 9, 30)
"""Rungs, as multiples of the preset's steps for the model (``small``: 1,200 SPICE steps on
the structured bandits, 1,560 DPT* steps)."""
HS = (0, 5, 10, 20, 50)
"""Context lengths at which the learned prior is compared with the exact posterior."""
COLUMNS = ("family", "multiple", "steps", "seeds", "quantity", "h", "value", "lo", "hi")
"""The ladder table's columns: one row per rung and quantity (``h`` -1 where it has none;
``lo``/``hi`` a 95% interval where one is computed, else NaN)."""


@dataclass(frozen=True)
class Rung:
    """One rung of one family: a study run of its own."""

    family: str
    multiple: int
    steps: int
    run_dir: Path
    overrides: tuple[str, ...]
    datasets: tuple[Path, ...] = ()
    """The dataset directories its study reads (under ``<run_dir>/datasets``)."""


def plan_ladder(out: str | Path, families: Sequence[str], multiples: Sequence[int],
                preset: str = "small", seeds: Sequence[int] = (0,),
                overrides: Sequence[str] = ()) -> list[Rung]:
    """Every rung's run directory and ``--set`` overrides, each config validated.

    Raises:
        ConfigError: an unknown family, a bad multiple, a cosine schedule (its rate depends on
            the last epoch, so rungs could not share their training), or a bad override.
    """
    for f in families:
        if f not in FAMILIES:
            raise ConfigError(f"family {f!r} is invalid: one of {list(FAMILIES)}")
    if not multiples or any(m < 1 for m in multiples) or list(multiples) != sorted(
            set(multiples)):
        raise ConfigError(f"rungs {list(multiples)} are invalid: increasing integers >= 1")
    if not seeds:
        raise ConfigError("seeds is empty: name at least one training seed")
    out = Path(out)
    rungs = []
    for family in families:
        base = plan_study(preset, out / family / "plan", None, list(overrides), (family,))
        cfg = base.configs[family]
        if cfg.train.cosine_schedule:
            raise ConfigError("train.cosine_schedule=true is invalid for the ladder: the rate "
                              "would depend on the last epoch, so a rung could not resume "
                              "from the one below")
        steps = cfg.train.epochs * steps_per_epoch(cfg)
        for m in multiples:
            sets = (*overrides, f"data.num_train_tasks={steps * cfg.train.batch_size}",
                    f"train.epochs={m}", "train.checkpoint_every=1",
                    f"seeds=[{','.join(str(s) for s in seeds)}]")
            run_dir = out / family / f"rung-{m}x"
            plan = plan_study(preset, run_dir, None, list(sets), (family,))  # validates
            datasets = tuple(store.dataset_dir(run_dir / "datasets", c)
                             for c in plan.configs.values())
            rungs.append(Rung(family, m, steps * m, run_dir, sets, datasets))
    return rungs


def seed_rung(below: Path, run_dir: Path) -> list[Path]:
    """Copy every final checkpoint of the rung ``below`` into the same model directory of
    ``run_dir``, as the epoch checkpoint its training resumes from (models that already have a
    final checkpoint there are left alone). Returns the checkpoints written."""
    written = []
    for final in sorted((below / "checkpoints").glob("*/*/final")):
        model_dir = run_dir / final.relative_to(below).parent
        if (model_dir / "final").exists():
            continue
        epoch = int(ckpt.read_meta(final)["epoch"])
        target = model_dir / "local" / f"epoch-{epoch:04d}"
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            publish_dir(target, lambda tmp, src=final: shutil.copytree(src, tmp,
                                                                      dirs_exist_ok=True))
            written.append(target)
    return written


def seed_datasets(below: Path, rung: Rung) -> list[Path]:
    """Copy the datasets of the rung ``below`` that ``rung`` reads (every rung trains on the
    preset's one training set) into its run directory, so its dataset stage finds every shard
    current (each verified against its checksum there) instead of generating them again.
    Returns the dataset directories written."""
    written = []
    for target in rung.datasets:
        source = below / "datasets" / target.name
        if source.is_dir() and not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            # the shards keep their own sidecars, which the dataset stage checks
            publish_dir(target, lambda tmp, src=source: shutil.copytree(src, tmp,
                                                                       dirs_exist_ok=True),
                        sidecars=False)
            written.append(target)
    return written


def _row(rung: Rung, seeds: int, quantity: str, value: float, h: int = -1,
         lo: float = math.nan, hi: float = math.nan) -> dict[str, object]:
    return {"family": rung.family, "multiple": rung.multiple, "steps": rung.steps,
            "seeds": seeds, "quantity": quantity, "h": h, "value": float(value),
            "lo": float(lo), "hi": float(hi)}


def _mean_row(rung: Rung, seeds: int, quantity: str, values: pd.Series) -> dict[str, object]:
    """The mean over tasks of ``values`` with its +-1.96 SEM interval."""
    mean, sem = values.mean(), values.std(ddof=1) / np.sqrt(len(values))
    return _row(rung, seeds, quantity, mean, lo=mean - 1.96 * sem, hi=mean + 1.96 * sem)


def _finals(rung: Rung) -> list[Path]:
    kind = FAMILIES[rung.family]
    return sorted((rung.run_dir / "checkpoints").glob(f"*/{kind}-*-seed*/final"))


def _loss_rows(rung: Rung, finals: list[Path]) -> list[dict[str, object]]:
    metrics = [ckpt.read_meta(f)["metrics"] for f in finals]
    keys = [k for k in ("train_loss", "val_loss", "train_td", "val_td", "train_policy",
                        "val_policy") if all(k in m for m in metrics)]
    return [_row(rung, len(finals), k, np.mean([m[k] for m in metrics])) for k in keys]


def _prior_rows(rung: Rung, seeds: int) -> list[dict[str, object]]:
    df = load(rung.run_dir, f"{rung.family}_prior")
    sources = df["config"].map(width_source_of)
    means = {tag: df[(sources == tag) & df["x"].isin(HS)].groupby(["metric", "x"])["value"]
             .mean() for tag in ("paper", "fitted")}
    out = []
    for quantity, tag, metric in (("prior_rmse", "paper", "oracle_rmse"),
                                  ("coverage_90_paper", "paper", "coverage_90"),
                                  ("coverage_90_fitted", "fitted", "coverage_90")):
        out += [_row(rung, seeds, quantity, means[tag][metric, h], h) for h in HS
                if (metric, h) in means[tag]]
    record = read_tuning(rung.run_dir).get(rung.family)
    if fitted_scale(record) is not None:
        out += [_row(rung, seeds, "width_scale", fitted_scale(record)),
                _row(rung, seeds, "width_decay", fitted_decay(record))]
    return out


def _tuned_rows(rung: Rung, seeds: int) -> list[dict[str, object]]:
    wide = final_by_task(load(rung.run_dir, f"{rung.family}_tuned"))
    out = []
    for method, name in ((LEARNED, "regret_spice"), (PAPER, "regret_spice_paper"),
                         (FLAT, "regret_flat"), (ORACLE, "regret_oracle")):
        if method in wide:
            out.append(_mean_row(rung, seeds, name, wide[method].dropna()))
    for r in tuned_gap(wide).itertuples():
        name = "gap_closed" if r.method == LEARNED else "gap_closed_paper"
        out.append(_row(rung, seeds, name, r.gap_closed if r.defined else math.nan,
                        lo=r.lo, hi=r.hi))
    return out


def _dpt_rows(rung: Rung, finals: list[Path]) -> list[dict[str, object]]:
    df = load(rung.run_dir, rung.family)
    ret = task_means(final_values(df[df["method"] == "DPT"], CUMULATIVE_RETURN).drop(
        columns=["config", "rule"]))["value"]
    out = [_mean_row(rung, len(finals), "return", ret)]
    wide = accuracy_by_task(df)["DPT"]
    shown = wide["context_shows_goal"] > 0
    for name, values in (("accuracy", wide["action_accuracy"]),
                         ("accuracy_goal_shown", wide.loc[shown, "action_accuracy"]),
                         ("accuracy_goal_hidden", wide.loc[~shown, "action_accuracy"]),
                         ("stay_accuracy", wide["stay_accuracy"]),
                         ("stay_accuracy_goal_shown", wide.loc[shown, "stay_accuracy"])):
        out.append(_row(rung, len(finals), name, values.mean() if len(values) else math.nan))
    return out


def rung_rows(rung: Rung) -> pd.DataFrame:
    """What one finished rung measured (:data:`COLUMNS`)."""
    finals = _finals(rung)
    if not finals:
        raise FileNotFoundError(f"{rung.run_dir}: no final {FAMILIES[rung.family]} checkpoint")
    rows = _loss_rows(rung, finals)
    if FAMILIES[rung.family] == "dpt":
        rows += _dpt_rows(rung, finals)
    else:
        rows += _prior_rows(rung, len(finals)) + _tuned_rows(rung, len(finals))
    return pd.DataFrame(rows, columns=list(COLUMNS))


TABLE = "scaling.parquet"
"""The ladder's table under its output directory (with a SHA-256 sidecar)."""


def write_ladder(out: str | Path, table: pd.DataFrame) -> list[Path]:
    """The ladder's table, a markdown summary and a figure under ``out``."""
    out = Path(out)
    write_checked(out / TABLE, lambda tmp: table.to_parquet(tmp, index=False))
    atomic_write_text(out / "scaling.md", ladder_markdown(table))
    return [out / TABLE, out / "scaling.md", plot_ladder(table, out / "scaling.png")]


def _fmt(value: float, lo: float = math.nan, hi: float = math.nan) -> str:
    if not math.isfinite(value):
        return "-"
    text = f"{value:.3g}"
    return text + (f" [{lo:.2f}, {hi:.2f}]" if math.isfinite(lo) and math.isfinite(hi) else "")


def ladder_markdown(table: pd.DataFrame) -> str:
    """One markdown table per family: a row per quantity (and h), a column per rung."""
    parts = ["# Scaling ladder", "",
             "Each rung trains the rung below's model further (same seeds, constant rate); "
             "every setting chosen on validation tasks; intervals are 95% (bootstrap over "
             "tasks for the gap closed, +-1.96 SEM over tasks for regret and return).", ""]
    for family, rows in table.groupby("family", sort=False):
        rungs = sorted(rows["multiple"].unique())
        steps = rows.groupby("multiple")["steps"].first()
        seeds = rows.groupby("multiple")["seeds"].first()
        cells: dict[str, dict[int, str]] = {}
        for r in rows.itertuples():
            name = r.quantity if r.h < 0 else f"{r.quantity}, h={r.h}"
            cells.setdefault(name, {})[r.multiple] = _fmt(r.value, r.lo, r.hi)
        parts += [f"## {family}", "",
                  "| quantity | " + " | ".join(f"{m}x: {steps[m]:,} steps, {seeds[m]} seed"
                                                 f"{'s' if seeds[m] > 1 else ''}"
                                                 for m in rungs) + " |",
                  "|---|" + "---|" * len(rungs)]
        for name, by_rung in cells.items():
            parts.append(f"| {name} | " + " | ".join(by_rung.get(m, "-") for m in rungs)
                         + " |")
        parts.append("")
    return "\n".join(parts)


def plot_ladder(table: pd.DataFrame, path: Path) -> Path:
    """Four panels against training steps (log scale): validation loss; the SPICE prior's
    RMSE against the exact posterior mean at h = 0 and 20; the gap closed at the tuned
    settings; DPT*'s return and per-action accuracy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(16, 3.6))

    def curve(ax, rows, label, **kw):
        rows = rows.sort_values("steps")
        ax.plot(rows["steps"], rows["value"], marker="o", label=label, **kw)
        if rows["lo"].notna().any():
            ax.fill_between(rows["steps"], rows["lo"], rows["hi"], alpha=0.15)

    for family, rows in table.groupby("family", sort=False):
        q = rows["quantity"]
        curve(axes[0], rows[q == "val_loss"], family)
        for h, style in ((0, "--"), (20, "-")):
            sel = rows[(q == "prior_rmse") & (rows["h"] == h)]
            if not sel.empty:
                curve(axes[1], sel, f"{family} h={h}", linestyle=style)
        if (q == "gap_closed").any():
            curve(axes[2], rows[q == "gap_closed"], family)
        if (q == "return").any():
            curve(axes[3], rows[q == "return"], "DPT* return")
            ax2 = axes[3].twinx()
            for key, style in (("accuracy", "-"), ("stay_accuracy_goal_shown", ":")):
                sel = rows[q == key].sort_values("steps")
                ax2.plot(sel["steps"], sel["value"], linestyle=style, color="grey",
                         marker="x", label=key.replace("_", " "))
            ax2.set_ylim(0, 1)
            ax2.set_ylabel("accuracy (grey)")
            ax2.legend(fontsize=7, loc="lower right")
    titles = ("validation loss", "prior RMSE vs exact posterior mean",
              "gap closed (tuned on validation)", "DPT* return (DPT paper protocol)")
    from matplotlib import ticker

    for ax, title in zip(axes, titles, strict=True):
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:,.0f}"))
        ax.xaxis.set_minor_formatter(ticker.NullFormatter())
        ax.set_xlabel("training steps")
        ax.set_title(title, fontsize=9)
        if ax.lines:
            ax.legend(fontsize=7)
    axes[2].axhline(0, color="black", linewidth=0.5)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120)
    plt.close(fig)
    return path
