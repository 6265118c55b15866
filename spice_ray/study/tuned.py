"""The tuned table: every tuned method once, at its validation choice, on the eval tasks.

After the tuning stage has chosen (``results/tuning.json``, :mod:`spice_ray.study.tuning`), each
method of an experiment's tuned evaluations runs once per training seed at its choice (and
SPICE also at the paper's width, "SPICE (paper)") on the eval split: the
``<experiment>_tuned`` table, the study's headline. It runs in the evaluation stage, after the
experiment's other tables, with its own progress bar and console line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from spice_ray.common.artifacts import is_current
from spice_ray.common.console import SILENT, Console, count
from spice_ray.config import ExperimentConfig, config_hash
from spice_ray.data import store
from spice_ray.evaluate.actors import EvalPool
from spice_ray.results.choices import paper_choice
from spice_ray.results.schema import NO_SEED
from spice_ray.results.tables import table_path, write
from spice_ray.study.experiments import EXPERIMENTS
from spice_ray.study.records import Finals
from spice_ray.study.tuning import Candidate, chosen_specs, run_candidates


def tuned_runs(name: str, cfg: ExperimentConfig, dataset: Path, finals: Finals,
               record: dict[str, Any]) -> list[tuple[list[Candidate], str | None, int]]:
    """The evaluations of experiment ``name``'s tuned table: (the methods at their choices,
    the checkpoint they read or None, training seed), one per evaluation and seed."""
    exp = EXPERIMENTS[name]
    runs = []
    for ev_name, cands in chosen_specs(record, exp, cfg, dataset).items():
        ev = exp.evaluation(ev_name)
        for seed in cfg.seeds if ev.model else (NO_SEED,):
            source = str(finals[(name, ev.model.kind, ev.model.variant, seed)]) \
                if ev.model else None
            runs.append((cands, source, seed))
    return runs


def evaluate_tuned(name: str, cfg: ExperimentConfig, dataset: Path, finals: Finals, pool: EvalPool,
                   record: dict[str, Any], console: Console = SILENT) -> pd.DataFrame:
    """Every tuned method once, at its choice, on the eval tasks (rows for the
    ``<name>_tuned`` table); ``console`` shows a bar over the evaluations."""
    data = store.load_split(dataset, "eval", limit=cfg.eval.num_tasks)
    runs = tuned_runs(name, cfg, dataset, finals, record)
    methods = {c.spec.label for cands, _, _ in runs for c in cands}
    bar = console.bar(f"{name}: {count(len(methods), 'method')} at their validation choices",
                      len(runs), "evaluation")
    frames = []
    for cands, source, seed in runs:
        try:
            frames.append(run_candidates(cands, source, cfg, data, seed, pool))
        except BaseException as exc:
            bar.abort(exc)
            raise
        bar.update(1)
    bar.close(f"1 table: {EXPERIMENTS[name].tuned_table().name}")
    return pd.concat(frames, ignore_index=True).assign(variant="")


def tuned_inputs(cfg: ExperimentConfig, dataset: Path, record: dict[str, Any]) -> str:
    """What an experiment's tuned table is made from: its tuning record, every choice (the
    paper-width ones too) and the eval tasks."""
    chosen = {label: m["chosen"] for label, m in record["methods"].items()}
    chosen |= {f"{label} (paper)": paper for label, m in record["methods"].items()
               if (paper := paper_choice(m)) is not None}
    return config_hash({"tuning": record["inputs"], "chosen": chosen,
                        "data": store.split_id(dataset, "eval"), "tasks": cfg.eval.num_tasks})


def tuned_table_current(name: str, cfg: ExperimentConfig, run_dir: Path, dataset: Path,
                        record: dict[str, Any]) -> bool:
    """Whether experiment ``name``'s tuned table is current for ``record`` (True where it
    has none: nothing would be built from the record)."""
    table = EXPERIMENTS[name].tuned_table()
    return table is None or is_current(table_path(run_dir, table.name),
                                       tuned_inputs(cfg, dataset, record))[0]


def write_tuned_table(name: str, cfg: ExperimentConfig, run_dir: Path, dataset: Path,
                      finals: Finals, pool: EvalPool, record: dict[str, Any],
                      console: Console = SILENT) -> bool:
    """Evaluate experiment ``name``'s tuned methods on the eval tasks and write its
    ``<name>_tuned`` table (skipped when current); returns whether it evaluated (False: the
    table was current, or the experiment has none)."""
    table = EXPERIMENTS[name].tuned_table()
    if table is None:
        return False
    inputs = tuned_inputs(cfg, dataset, record)
    if is_current(table_path(run_dir, table.name), inputs)[0]:
        console.line(f"  {name}: {table.name} current, skipped")
        return False
    df = evaluate_tuned(name, cfg, dataset, finals, pool, record, console)
    df = df[df["metric"].isin(table.metrics)]
    write(run_dir, table.name, df, inputs=inputs, description=table.description)
    return True
