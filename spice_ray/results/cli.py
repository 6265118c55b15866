"""The results command line's work (``python -m spice_ray.results``): its arguments are parsed
in ``spice_ray.results.__main__``, which imports this module only once they are valid, so
``--help`` and a bad flag answer before pandas loads."""


from __future__ import annotations

import argparse
import sys

import pandas as pd

from spice_ray.common.console import count
from spice_ray.common.errors import excerpt
from spice_ray.common.metrics import CUMULATIVE_REGRET, SUBOPTIMALITY
from spice_ray.results import paper
from spice_ray.results.query import QueryError, columns_named, filter_rows, values_hint
from spice_ray.results.report import _label as row_label
from spice_ray.results.schema import COLUMNS, settings_of
from spice_ray.results.summary import LABEL_KEYS, STATS, improvement, summarise
from spice_ray.results.tables import (
    ResultsError,
    describe,
    list_experiments,
    list_sweeps,
    load,
    table_problem,
)


def _print_as_file(out: pd.DataFrame, fmt: str) -> bool:
    """Print ``out`` as CSV or JSON records when ``fmt`` asks for one (True), else nothing."""
    if fmt == "csv":
        print(out.to_csv(index=False), end="")
    elif fmt == "json":
        print(out.to_json(orient="records", indent=1))
    return fmt in ("csv", "json")


def compare_runs_main(args: argparse.Namespace) -> int:
    """``compare RUN_A RUN_B --table T [--methods A,B]``: one table's methods in two runs,
    paired by eval task (:func:`spice_ray.results.across.compare_runs`)."""
    from spice_ray.results.across import compare_runs

    try:
        out = compare_runs(args.run_a, args.run_b, args.table,
                           [m for m in (args.methods or "").split(",") if m] or None)
    except ResultsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not _print_as_file(out, args.format):
        print(f"{args.table}: A = {args.run_a}, B = {args.run_b}; final {out['metric'].iloc[0]}"
              " per task (seeds averaged), paired by task; 95% bootstrap intervals over tasks")
        print(out.drop(columns="metric").to_string(index=False, float_format=lambda v:
                                                   f"{v:.4g}"))
    return 0


def run(args: argparse.Namespace) -> int:
    """The query ``args`` ask for (parsed by ``spice_ray.results.__main__``): a listing, a
    summary, rows, a paper table or P(a beats b); 2 with one ``error:`` line on bad input."""
    if args.stat not in STATS:
        print(f"error: --stat {excerpt(args.stat)} is invalid: one of {', '.join(STATS)}",
              file=sys.stderr)
        return 2
    try:
        if args.experiment is None:
            names = list_experiments(args.run_dir) + list_sweeps(args.run_dir)
            if not names:
                raise ResultsError(f"no result tables under {args.run_dir}")
            bad = []
            for name in names:
                problem = table_problem(args.run_dir, name)
                if problem is None:
                    print(f"{name:22s} {describe(args.run_dir, name)}")
                else:
                    bad.append(name)
                    print(f"{name:22s} UNREADABLE: {problem}")
            if bad:
                raise ResultsError(f"{count(len(bad), 'table')} of {args.run_dir} cannot be "
                                   f"read as written ({', '.join(bad[:4])}"
                                   f"{', ...' if len(bad) > 4 else ''}): the stage that "
                                   "writes it recomputes it when the study runs again")
            return 0
        added: list[str] = []
        if args.experiment == "compare":
            out = compare(args.run_dir, args.methods, args.table)
            args.raw = True
            df = out
        else:
            if args.methods:
                raise ResultsError(f"unexpected arguments {args.methods}: only 'compare' "
                                   "takes methods")
            df = load(args.run_dir, args.experiment, settings=True)  # each setting typed
            if not args.experiment.startswith("sweeps/"):
                added = [c for c in df.columns if c not in COLUMNS]
        whole = df
        if args.where and args.experiment != "compare":
            try:
                df = filter_rows(df, args.where)
            except QueryError as exc:
                raise ResultsError(f"--where {excerpt(args.where)}: {exc}") from exc
        if args.at is not None and args.experiment != "compare":
            df = _at(df, args.at)
        if df.empty:
            named = (columns_named(args.where) if args.where else []) + (
                ["x"] if args.at is not None else [])
            hint = values_hint(whole, list(dict.fromkeys(named)))
            print("no rows match" + (f"; in {args.experiment}: {hint}" if hint else ""),
                  file=sys.stderr)
            return 1
        by = args.by.split(",") if args.by else None
        if by and len(set(by)) < len(by):
            raise ResultsError(f"--by {excerpt(args.by)} names a column twice")
        if not args.raw and not {"value", "seed", "task_id"} <= set(df.columns):
            if by or args.stat != "sem" or args.format in ("markdown", "latex"):
                raise ResultsError(f"{args.experiment} holds summaries, not per-task values, "
                                   "so --by, --stat and --format markdown|latex do not apply; "
                                   "without them it prints as stored (--where works)")
            args.raw = True  # a summary table (e.g. a sweep's *_summary): shown as stored
        # the typed settings served --where (and --by where named); the rows keep config
        df = df.drop(columns=[c for c in added if c not in (by or [])])
        out = df if args.raw else summarise(df, by, args.stat, pool=args.pool)
        keys = by if by else [c for c in out.columns if c in ("experiment", "env", "method")]
        if not args.raw and "method" in out.columns and \
                any(c in out.columns and c not in keys for c in LABEL_KEYS):
            out.insert(len(keys), "label", out.apply(row_label, axis=1))  # as the report reads
        if args.format in ("markdown", "latex"):
            if args.raw or args.stat != "sem" or not by:
                raise ResultsError(f"--format {args.format} summarises rows: give --by (e.g. "
                                   "--by method) and the default --stat sem, not --raw")
            if "label" not in out:
                out.insert(0, "label", out[by].astype(str).agg(", ".join, axis=1))
            print(paper.render(paper.ranked(df, out), args.format, str(df["metric"].iloc[0])))
            return 0
    except ResultsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    # on screen the label says what config does (csv and json keep the JSON)
    if not _print_as_file(out, args.format):
        drop = [c for c in ("config", "method") if "label" in out and c in out]
        drop += [c for c in ("experiment", "env") if c in out and out[c].nunique() == 1]
        shown = out.drop(columns=drop)  # the label names the method and its settings
        with pd.option_context("display.max_rows", 500, "display.width", 200,
                               "display.max_columns", 20):
            print(shown.to_string(index=False))
        steps = out["x"].nunique() if "x" in out.columns else 0
        if steps > 20 and args.at is None:
            print(f"({steps} values of x per row group: --at last, or --at N, keeps one)",
                  file=sys.stderr)
    return 0


def _at(df: pd.DataFrame, at: str) -> pd.DataFrame:
    """The rows at one x per metric: its last step ("last") or the given x."""
    if "x" not in df.columns or "metric" not in df.columns:
        raise ResultsError("--at needs the columns x and metric, which this table has not")
    if at == "last":
        return df[df["x"] == df.groupby("metric")["x"].transform("max")]
    try:
        x = float(at)
    except ValueError:
        raise ResultsError(f"--at {excerpt(at)} is invalid: 'last' or a number") from None
    return df[df["x"] == x]


def _settings(config: str, siblings: list[str]) -> str:
    """The fields of a config that differ among a method's configs (e.g. beta_schedule)."""
    if len(siblings) < 2:
        return ""
    mine = settings_of(config)
    others = [settings_of(c) for c in siblings]
    return ", ".join(f"{k}={v}" for k, v in sorted(mine.items())
                     if any(o.get(k) != v for o in others))


def compare(run_dir: str, methods: list[str], table: str | None = None) -> pd.DataFrame:
    """P(first method beats the second on a random task) per table where both have a final
    cumulative regret or suboptimality (lower is better), with a 95% bootstrap interval."""
    if len(methods) != 2:
        raise ResultsError("compare takes two methods, e.g. compare SPICE DPT")
    rows = []
    for name in [table] if table else list_experiments(run_dir):
        df = load(run_dir, name)
        df = df[df["variant"] == ""]  # the main models (not ablation variants)
        metric = next((m for m in (CUMULATIVE_REGRET, SUBOPTIMALITY)
                       if m in set(df["metric"])), None)
        if metric is None or not set(methods) <= set(df[df["metric"] == metric]["method"]):
            continue
        configs = {m: sorted(set(df[(df["method"] == m) & (df["metric"] == metric)]["config"]))
                   for m in methods}
        for ca in configs[methods[0]]:
            for cb in configs[methods[1]]:
                pair = df[((df["method"] == methods[0]) & (df["config"] == ca))
                          | ((df["method"] == methods[1]) & (df["config"] == cb))]
                got = improvement(pair, methods[0], methods[1], metric)
                settings = " vs ".join(filter(None, (_settings(ca, configs[methods[0]]),
                                                     _settings(cb, configs[methods[1]]))))
                rows.append({"table": name, "metric": metric, "settings": settings,
                             f"P({methods[0]} beats {methods[1]})":
                                 round(got["probability"], 4),
                             "ci_low": round(got["ci_low"], 4),
                             "ci_high": round(got["ci_high"], 4), "tasks": got["n"]})
    if not rows:
        raise ResultsError(f"no table has both {methods[0]!r} and {methods[1]!r}")
    return pd.DataFrame(rows)
