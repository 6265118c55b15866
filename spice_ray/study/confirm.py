"""The confirmation split: the tuned tables scored once more, on tasks nobody has looked at.

Every setting of the study is chosen on validation tasks; a few were fixed by a person after
reading eval tables (``docs/design.md``, "Settings fixed after looking at eval"). The eval
split cannot confirm those: it is the split they were read from. The confirmation split can:
fresh tasks of the eval split's distribution (the same held-out goals on the darkrooms, new
draws of everything else), task ids from :data:`CONFIRM_OFFSET` on, which no dataset holds,
no tool reads and no choice was made on. Each tuned method runs once, at the choice
``results/tuning.json`` records, under every training seed's final checkpoint, in this process:
the ``<experiment>_confirm`` table (final cumulative regret per task and seed), written once
and then read back; and beside the eval table's numbers, the headline of both
(:func:`confirm_lines`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from spice_ray.common.metrics import CUMULATIVE_REGRET
from spice_ray.config import ExperimentConfig, config_hash
from spice_ray.data.tasks import generate_tasks
from spice_ray.results.analysis import (
    CONTEXT_FREE,
    FLAT,
    LEARNED,
    ORACLE,
    PAPER,
    final_task_seeds,
    tuned_gap,
)
from spice_ray.study.records import Finals
from spice_ray.study.tuned import tuned_runs

CONFIRM_OFFSET = 1_000_000_000
"""The confirmation tasks' ids start here: eval-split draws (keyed by data seed, split and
task id) that no dataset of any preset holds (the largest holds 100,000 tasks a split)."""
TABLE_SUFFIX = "_confirm"
METRIC = CUMULATIVE_REGRET


def table_name(experiment: str) -> str:
    """The confirmation table of ``experiment``."""
    return f"{experiment}{TABLE_SUFFIX}"


def confirmation_tasks(cfg: ExperimentConfig, n: int) -> dict[str, np.ndarray]:
    """``n`` fresh tasks of ``cfg``'s eval distribution (the columns an eval split holds)."""
    return generate_tasks(cfg.env, cfg.data, "eval", CONFIRM_OFFSET + np.arange(n))


def confirmation_inputs(record: dict[str, Any], n: int) -> str:
    """What a confirmation table is computed from: the tuning record's inputs and choices
    and the number of tasks (the tasks themselves follow from the config the record hashes)."""
    chosen = {label: m["chosen"] for label, m in record["methods"].items()}
    return config_hash({"tuning": record["inputs"], "chosen": chosen, "tasks": n,
                        "offset": CONFIRM_OFFSET})


def evaluate_confirmation(name: str, cfg: ExperimentConfig, dataset: Path, finals: Finals,
                          record: dict[str, Any], n: int) -> pd.DataFrame:
    """Every tuned method of experiment ``name`` at its recorded choice (and SPICE at the
    paper's width), on ``n`` confirmation tasks under each training seed's final checkpoint:
    rows of the final cumulative regret (the tuned table's columns)."""
    from spice_ray.evaluate.online import online_rows
    from spice_ray.model.registry import load_model

    data = confirmation_tasks(cfg, n)
    frames = []
    for cands, source, seed in tuned_runs(name, cfg, dataset, finals, record):
        model = None if source is None else load_model(source, cfg.env).eval()
        by_eval: dict[Any, list[Any]] = {}
        for c in cands:
            by_eval.setdefault(c.eval_cfg, []).append(c.spec)
        for eval_cfg, specs in by_eval.items():
            frames.append(online_rows(cfg.env, eval_cfg, data, specs, model, seed,
                                      final_only=True))
    rows = pd.concat(frames, ignore_index=True)
    return rows.assign(experiment=name, variant="")


def confirm_lines(name: str, eval_rows: pd.DataFrame, confirm_rows: pd.DataFrame,
                  groups: dict[int, int] | None = None) -> list[str]:
    """Markdown: each method's mean final regret (+- SEM over tasks, seeds averaged per task)
    on the eval and the confirmation tasks, and SPICE's gap closed and in-context share on
    both, with their two-level bootstrap intervals.

    Args:
        groups: eval task id -> goal, for the eval intervals (the confirmation tasks are
            resampled by task: their goals are the eval split's, drawn afresh).
    """
    values = {"eval": final_task_seeds(eval_rows), "confirmation": final_task_seeds(confirm_rows)}
    wide = {k: (v.wide() if v is not None else pd.DataFrame()) for k, v in values.items()}
    methods = [m for m in wide["eval"].columns if m in wide["confirmation"].columns]
    methods.sort(key=lambda m: wide["eval"][m].mean())

    def cell(w: pd.DataFrame, m: str) -> str:
        v = w[m].dropna()
        return f"{v.mean():.3g} +- {v.std(ddof=1) / np.sqrt(len(v)):.2g} ({len(v)})"

    out = [f"### {name}", "", "| method | eval (tasks) | confirmation (tasks) |", "|---|---|---|"]
    out += [f"| {m} | {cell(wide['eval'], m)} | {cell(wide['confirmation'], m)} |"
            for m in methods]
    gaps = {k: (tuned_gap(v, groups if k == "eval" else None) if v is not None
                else pd.DataFrame()) for k, v in values.items()}
    if all(len(g) for g in gaps.values()):
        out += ["", "| share (SPICE) | eval | confirmation |", "|---|---|---|"]
        for what, col in (("gap closed", "gap_closed"), ("in-context share", "in_context_share")):
            cells = []
            for g in gaps.values():
                row = g.set_index("method").loc[LEARNED]
                lo = "lo" if col == "gap_closed" else "in_context_lo"
                hi = "hi" if col == "gap_closed" else "in_context_hi"
                ok = row["defined"] if col == "gap_closed" else row["in_context_defined"]
                cells.append(f"{row[col]:.2f} [{row[lo]:.2f}, {row[hi]:.2f}]"
                             + ("" if ok else " (undefined: oracle not 2 SEMs ahead)"))
            out.append(f"| {what} | {cells[0]} | {cells[1]} |")
    present = set(methods)
    missing = [m for m in (LEARNED, PAPER, FLAT, ORACLE, CONTEXT_FREE)
               if m in wide["eval"] and m not in present]
    if missing:
        out.append(f"\nNot on the confirmation tasks: {', '.join(missing)}.")
    return out + [""]
