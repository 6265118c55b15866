"""Query result tables from the shell.

    python -m spice_ray.results RUN_DIR                         # list experiments
    python -m spice_ray.results RUN_DIR bandit_online --by method \
        --where "metric == 'cumulative_regret' and x == 500"
    python -m spice_ray.results RUN_DIR bandit_offline --by method,x --format csv
"""

from __future__ import annotations

import argparse
import sys

import pandas as pd

from spice_ray.results.query import QueryError, filter_rows
from spice_ray.results.summary import summarise
from spice_ray.results.tables import ResultsError, describe, list_experiments, list_sweeps, load


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m spice_ray.results", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir")
    p.add_argument("experiment", nargs="?")
    p.add_argument("--by", default=None,
                   help="comma-separated grouping columns (default: all but seed and task_id)")
    p.add_argument("--where", default=None,
                   help="row filter: column names, literals, comparisons, and/or/not, in, "
                        "arithmetic; e.g. \"metric == 'cumulative_regret' and x == 500\"")
    p.add_argument("--format", choices=("table", "csv", "json"), default="table")
    p.add_argument("--raw", action="store_true", help="print rows instead of summaries")
    args = p.parse_args(argv)
    try:
        if args.experiment is None:
            names = list_experiments(args.run_dir) + list_sweeps(args.run_dir)
            if not names:
                raise ResultsError(f"no result tables under {args.run_dir}")
            for name in names:
                print(f"{name:22s} {describe(args.run_dir, name)}")
            return 0
        df = load(args.run_dir, args.experiment)
        if args.where:
            try:
                df = filter_rows(df, args.where)
            except QueryError as exc:
                raise ResultsError(f"--where {args.where!r}: {exc}") from exc
        if df.empty:
            print("no rows match", file=sys.stderr)
            return 1
        out = df if args.raw else summarise(df, args.by.split(",") if args.by else None)
    except ResultsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.format == "csv":
        print(out.to_csv(index=False), end="")
    elif args.format == "json":
        print(out.to_json(orient="records", indent=1))
    else:
        with pd.option_context("display.max_rows", 500, "display.width", 200,
                               "display.max_columns", 20):
            print(out.to_string(index=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
