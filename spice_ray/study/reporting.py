"""Stages 5 and 6: the figures and the report, over every experiment the run directory holds.

A run directory may hold experiments run by several invocations (``--experiments bandit``,
then ``--experiments darkroom``, or the same experiment under ``--variant``): the figures,
the aggregate and ``report.md`` always cover all of them, each with its own config, findings
and checkpoints, so a partial re-run never rewrites the report from part of the study.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from spice_ray.common.artifacts import file_sha256, is_current, write_sidecar
from spice_ray.common.plugins import load_plugins
from spice_ray.config import ConfigError, ExperimentConfig, config_hash, load_config
from spice_ray.data import store
from spice_ray.results import plots
from spice_ray.results.analysis import LEARNED, final_task_seeds, tuned_gap
from spice_ray.results.choices import choices_table
from spice_ray.results.figure_files import current_formats, is_drawn
from spice_ray.results.report import final_regret_table, write_report
from spice_ray.results.tables import list_experiments, load, table_path
from spice_ray.study.experiments import EXPERIMENTS, VARIANT, Table, experiment_named
from spice_ray.study.records import (
    CheckpointIndexError,
    Finals,
    did_work,
    index_entries,
    timing_notes,
    timing_of_work,
    training_table,
)
from spice_ray.study.tuning import SCORE, read_tuning, task_groups

log = logging.getLogger(__name__)


def tables_of(configs: dict[str, ExperimentConfig], datasets: dict[str, Path] | None = None
              ) -> list[Table]:
    """Every table of these experiments in report order: per experiment its tuned table (the
    headline), then the others. With ``datasets``, tuned tables of tasks that share goals
    state intervals over goals (:func:`spice_ray.study.tuning.task_groups`)."""
    out = []
    for name, cfg in configs.items():
        exp = EXPERIMENTS[name]
        groups = task_groups(datasets[name], cfg) if datasets and name in datasets else None
        out += [t for t in (exp.tuned_table(groups),) if t is not None] + exp.tables_for(cfg)
    return out


def run_configs(run_dir: Path, configs: dict[str, ExperimentConfig]
                ) -> dict[str, ExperimentConfig]:
    """``configs``, then every other experiment the run directory holds: a readable
    ``configs/<name>.yaml`` of a registered experiment (a ``--variant`` is registered from
    its name) with at least one of its tables written."""
    out = dict(configs)
    have = set(list_experiments(run_dir))
    for path in sorted((Path(run_dir) / "configs").glob("*.yaml")):
        name = path.stem
        if name in out:
            continue
        try:
            exp = experiment_named(name)
            cfg = load_config(path)
        except (ValueError, ConfigError, OSError) as exc:
            log.warning("report: %s left out (%s)", path, exc)
            continue
        if any(t.name in have for t in tables_of({name: cfg})):
            out[exp.name] = cfg
    order = list(EXPERIMENTS)  # each experiment, then its variants
    return dict(sorted(out.items(), key=lambda item: (
        order.index(item[0].partition(VARIANT)[0]), item[0])))


def aggregated(configs: dict[str, ExperimentConfig]) -> list[str]:
    """The experiments the aggregate pools: one per task set, so not a variant beside its
    experiment (every one where the run holds only variants)."""
    return [n for n in configs if VARIANT not in n] or list(configs)


def indexed_finals(run_dir: Path) -> Finals:
    """The final checkpoints the run's checkpoint index lists (``records.index_entries``:
    none when it is missing or fails its checksum, and the report's training table then has
    this invocation's models only)."""
    try:
        return {(e["experiment"], e["kind"], e["variant"], e["seed"]): Path(run_dir) / e["path"]
                for e in index_entries(run_dir) if (Path(run_dir) / e["path"]).is_dir()}
    except CheckpointIndexError as exc:
        log.warning("%s: the report's training table has this invocation's models only", exc)
        return {}


def figure_tables(run_dir: Path, configs: dict[str, ExperimentConfig]) -> list[Table]:
    """The tables of ``configs`` that declare figures and are written in ``run_dir``."""
    return [t for t in tables_of(configs)
            if t.figures and table_path(run_dir, t.name).exists()]


def draw_figures(run_dir: Path, tables: list[Table],
                 progress: Callable[[str], None] | None = None,
                 map_jobs: MapJobs | None = None) -> dict[str, list[Path]]:
    """The PNGs each of ``tables`` declares (:func:`figure_tables`), under
    ``<run_dir>/figures``; a table's figures are kept when their sidecars say they were drawn
    from the same table (its checksum sidecar) by the same plotting code
    (``figure_files.is_drawn``). The tables to draw are independent jobs
    (:func:`spice_ray.results.plots.draw_table`) run by ``map_jobs`` (the figures stage: Ray
    tasks side by side; default: one after another here); ``progress`` is called with each
    table's name once its figures are kept or drawn."""
    code = file_sha256(Path(plots.__file__))
    formats = current_formats()
    out: dict[str, list[Path]] = {}
    jobs = []
    for table in tables:
        paths = [run_dir / "figures" / (f"{table.name}.png" if i == 0
                                        else f"{table.name}_{kind}.png")
                 for i, kind in enumerate(table.figures)]
        sidecar = table_path(run_dir, table.name).with_name(f"{table.name}.parquet.sha256")
        stamp = config_hash({"table": sidecar.read_text(), "code": code,
                             "title": table.title, "kinds": table.figures})
        out[table.name] = paths
        if not is_drawn(paths, stamp):
            jobs.append((run_dir, table.name, tuple(table.figures), paths, table.title, stamp,
                         formats))
        elif progress is not None:
            progress(table.name)
    for name in (map_jobs or _one_by_one)(plots.draw_table, jobs):
        if progress is not None:
            progress(name)
    return out


SIDE_BY_SIDE_TABLES = 16
"""Tables to draw from which the figures stage draws them side by side as Ray tasks (below,
the task workers' start-up is not repaid: smoke's 30 tables 13.3 s against 16.9 s one after
another, its bandit's 7 tables 4.8 against 2.4 s)."""

MapJobs = Callable[[Callable[..., str], list[tuple[Any, ...]]], Iterable[str]]
"""Runs ``fn(*job)`` for every job and yields each result (``runtime.tasks.map_unordered``)."""


def _one_by_one(fn: Callable[..., str], jobs: list[tuple[Any, ...]]) -> Iterator[str]:
    return (fn(*job) for job in jobs)


def _anchor(title: str) -> str:
    """The link target a Markdown renderer gives a ``## title`` heading (GitHub's rule)."""
    return "#" + "".join(c for c in title.lower().replace(" ", "-") if c.isalnum() or c in "-_")


def _interval(row: Any, key: str, lo: str, hi: str, defined: str) -> str:
    if not row[defined] or not np.isfinite(row[key]):
        return "none can be stated"
    return f"{row[key]:.2f} [{row[lo]:.2f}, {row[hi]:.2f}]"


def summary_section(run_dir: Path, configs: dict[str, ExperimentConfig],
                    datasets: dict[str, Path], tables: list[Table], have: set[str],
                    sections: list[str]) -> tuple[str, str, pd.DataFrame] | None:
    """The report's first screen: per experiment's tuned table (every method at its
    validation choice, on eval tasks), the best method, SPICE and its rank, and the gap closed
    and in-context share with their two-level intervals (as its section states them: over
    goals where tasks share one), each linked to its section, and links to the report's
    ``sections`` (their titles) and tables; None without a tuned table."""
    rows = []
    for name, cfg in configs.items():
        table = EXPERIMENTS[name].tuned_table()
        if table is None or table.name not in have:
            continue
        df = load(run_dir, table.name)
        ranked = final_regret_table(df[df["variant"] == ""]).drop_duplicates("method")
        if ranked.empty:
            continue
        best = ranked.iloc[0]
        spice = ranked[ranked["method"] == LEARNED]
        row = {"experiment": f"[{name}]({_anchor(table.name)})", "methods": len(ranked),
               "best (final regret)": f"{best['method']} {best['mean']:.3g} +- {best['sem']:.2g}",
               "SPICE": "-", "gap closed": "-", "in-context share": "-"}
        if len(spice):
            rank = int(np.flatnonzero(ranked["method"].to_numpy() == LEARNED)[0]) + 1
            row["SPICE"] = (f"{spice['mean'].iloc[0]:.3g} +- {spice['sem'].iloc[0]:.2g} "
                            f"(rank {rank})")
        values = final_task_seeds(df)
        groups = task_groups(datasets[name], cfg) if datasets[name].is_dir() else None
        gap = tuned_gap(values, groups) if values is not None else pd.DataFrame()
        gap = gap[gap["method"] == LEARNED] if len(gap) else gap
        if len(gap):
            g = gap.iloc[0]
            row["gap closed"] = _interval(g, "gap_closed", "lo", "hi", "defined")
            if np.isfinite(g["in_context_share"]) or g["in_context_defined"]:
                row["in-context share"] = _interval(g, "in_context_share", "in_context_lo",
                                                    "in_context_hi", "in_context_defined")
        rows.append(row)
    if not rows:
        return None
    others = [t.name for t in tables if t.name in have]
    text = ("Each experiment's headline: every method at the setting chosen on validation "
            "tasks, run once on the eval tasks (final cumulative regret, mean +- SEM over "
            "tasks with training seeds averaged per task; rank among the methods). Gap closed "
            "= (flat - SPICE) / (flat - oracle prior), in-context share = (context-free - "
            "SPICE) / (context-free - oracle prior), both paired by task, with 95% intervals "
            "resampling training seeds, then tasks (goals where tasks share one); \"none can "
            "be stated\" where the oracle prior does not beat the baseline by 2 SEMs. Below: "
            + "".join(f"[{title.lower()}]({_anchor(title)}), " for title in sections)
            + "every table (" + ", ".join(f"[{t}]({_anchor(t)})" for t in others)
            + ") and [every config](configs.md).")
    return "Summary", text, pd.DataFrame(rows)


def _code_id() -> str:
    """A hash of the code the report is written by: every module of the package and of each
    loaded plugin (their experiments, tables and analyses shape the report)."""
    import importlib
    import sys

    root = Path(__file__).resolve().parents[1]
    files = sorted(root.rglob("*.py"))
    for value in sorted(load_plugins().values()):  # an entry point: "module" or "module:attr"
        module = value.split(":")[0].strip()
        found = sys.modules.get(module) or importlib.import_module(module)
        if getattr(found, "__file__", None):
            files.append(Path(found.__file__))
    return config_hash({str(f.relative_to(root)) if f.is_relative_to(root) else f.name:
                        file_sha256(f) for f in files})


def report_inputs(run_dir: Path, configs: dict[str, ExperimentConfig],
                  figures: dict[str, list[Path]]) -> str:
    """What ``report.md`` is written from, as one hash: the run directory (the report names
    it), every result file's checksum (tables and ``tuning.json``), the checkpoint index,
    every experiment's config, the figures it embeds and the code (:func:`_code_id`). A re-run
    that did no work and finds this unchanged keeps the report (its timings are those of the
    invocation that did the work, which wrote the report and ``logs/timing.json`` together)."""
    def checksum(path: Path) -> str | None:
        return file_sha256(path) if path.is_file() else None

    return config_hash({
        "run": str(Path(run_dir).resolve()),
        "results": {p.name: checksum(p) for p in sorted((run_dir / "results").glob("*.sha256"))},
        "index": checksum(run_dir / "checkpoints" / "index.json"),
        "configs": {name: cfg.to_yaml() for name, cfg in configs.items()},
        "figures": {name: [p.name for p in paths] for name, paths in sorted(figures.items())},
        "code": _code_id()})


def write_study_report(run_dir: Path, configs: dict[str, ExperimentConfig], finals: Finals,
                       figures: dict[str, list[Path]], across: list[Any],
                       timings: dict[str, float], units: list[dict[str, Any]]) -> Path:
    """``report.md`` over ``configs`` (every experiment of the run: :func:`run_configs`), with
    the settings chosen on validation, the pretraining table of every indexed model and
    ``finals``, the aggregate sections ``across`` and each table's findings; kept as it is
    when this invocation did no work and its :func:`report_inputs` are unchanged (its checksum
    sidecar records them), so a re-run over a finished study writes nothing."""
    inputs = report_inputs(run_dir, configs, figures)
    path = Path(run_dir) / "report.md"
    if (not did_work(units) and is_current(path, inputs)[0]
            and (Path(run_dir) / "configs.md").is_file()):
        log.info("report.md is current (its tables, figures, configs and code are unchanged)")
        return path
    path = _write_study_report(run_dir, configs, finals, figures, across, timings, units)
    write_sidecar(path, inputs=inputs)
    return path


def _write_study_report(run_dir: Path, configs: dict[str, ExperimentConfig], finals: Finals,
                        figures: dict[str, list[Path]], across: list[Any],
                        timings: dict[str, float], units: list[dict[str, Any]]) -> Path:
    first = next(iter(configs.values()))
    presets = {name: f"`{cfg.preset}`, training seeds {list(cfg.seeds)}"
               for name, cfg in configs.items()}
    same = len(set(presets.values())) == 1
    notes = [f"preset {presets[next(iter(configs))]}" if same else  # else each its own
             "presets: " + "; ".join(f"{name} {text}" for name, text in presets.items()),
             *dict.fromkeys(n for name in configs for n in EXPERIMENTS[name].notes),
             *timing_notes(list(configs), *timing_of_work(run_dir, timings, units))]
    datasets = {name: store.dataset_dir(Path(run_dir) / "datasets", cfg)  # a moved run's too
                for name, cfg in configs.items()}
    tables = tables_of(configs, {k: v for k, v in datasets.items() if v.is_dir()})
    have = set(list_experiments(run_dir))
    descriptions = {t.name: t.description for t in tables}
    findings = {t.name: t.analysis(load(run_dir, t.name)) for t in tables
                if t.analysis and t.name in have}
    choices = choices_table(read_tuning(run_dir))
    sections = [("Settings chosen on validation tasks",
                 f"Each method's setting, chosen by the {SCORE} on the grid of "
                 "`spice_ray.study.tuning` (the same grid for SPICE and every reference); every "
                 "validation score is in `results/tuning.json`. The `*_tuned` tables run each "
                 "method once, at its choice, on the eval tasks; the other tables show every "
                 "setting of a fixed grid on the eval tasks, for sensitivity, not for ranking.",
                 choices)] if len(choices) else []
    sections.append(("Pretraining: steps and the train / validation gap",
                     "Per model (seeds together: mean +- sd): optimiser steps, training tasks, "
                     "the last epoch's mean training loss and the validation loss at its end "
                     "(validation tasks the model never trained on). A validation loss well "
                     "above the training loss is memorised training tasks.",
                     training_table({**{k: v for k, v in indexed_finals(run_dir).items()
                                        if k[0] in configs}, **finals})))
    sections += across
    summary = summary_section(run_dir, configs, datasets, tables, have,
                              [title for title, _, _ in sections])
    return write_report(run_dir, figures, {name: cfg.to_yaml() for name, cfg in configs.items()},
                        notes, descriptions, findings, horizon_points=(10, 50, first.env.horizon),
                        order=[t.name for t in tables],
                        sections=[summary, *sections] if summary else sections)
