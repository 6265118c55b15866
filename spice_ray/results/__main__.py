"""Query result tables from the shell.

    python -m spice_ray.results RUN_DIR                         # list experiments
    python -m spice_ray.results RUN_DIR bandit_online --by method \
        --where "metric == 'cumulative_regret' and x == 500"
    python -m spice_ray.results RUN_DIR bandit_offline --by method,x --format csv
    python -m spice_ray.results RUN_DIR bandit_online --by method --stat bootstrap
    python -m spice_ray.results RUN_DIR bandit_online --by method --pool  # settings in one row
    python -m spice_ray.results RUN_DIR bandit_online --by method,beta --where "beta >= 1"
    python -m spice_ray.results RUN_DIR compare SPICE DPT       # P(SPICE beats DPT) per table
    python -m spice_ray.results compare RUN_A RUN_B --table bandit_latent_tuned  # two runs
    python -m spice_ray.results RUN_DIR bandit_online --by method --at last \
        --where "metric == 'cumulative_regret'" --format latex   # a table for the paper
"""

from __future__ import annotations

import argparse
import sys

# Nothing heavy at module level: the arguments parse (--help, a bad flag) before pandas loads;
# the work is in spice_ray.results.cli.


def compare_main(argv: list[str]) -> int:
    """``compare RUN_A RUN_B --table T [--methods A,B]``: one table's methods in two runs,
    paired by eval task (``spice_ray.results.across.compare_runs``)."""
    p = argparse.ArgumentParser(prog="python -m spice_ray.results compare",
                                description="One table's methods in two run directories, "
                                "paired by eval task (refused when the runs' eval tasks "
                                "differ).")
    p.add_argument("run_a")
    p.add_argument("run_b")
    p.add_argument("--table", required=True, help="a table both runs hold, e.g. "
                   "bandit_latent_tuned")
    p.add_argument("--methods", default=None, help="comma-separated (default: every method "
                   "in both)")
    p.add_argument("--format", choices=("text", "csv", "json"), default="text")
    args = p.parse_args(argv)
    from spice_ray.results.cli import compare_runs_main

    return compare_runs_main(args)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["compare"]:
        return compare_main(argv[1:])
    p = argparse.ArgumentParser(prog="python -m spice_ray.results", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir")
    p.add_argument("experiment", nargs="?", help="a table, or 'compare'")
    p.add_argument("methods", nargs="*", help="compare: the two methods (e.g. SPICE DPT)")
    p.add_argument("--stat", default="sem",
                   help="sem: mean +- SEM (the paper's); bootstrap: mean and a 95%% bootstrap "
                        "interval over tasks; iqm: interquartile mean and its interval")
    p.add_argument("--table", default=None, help="compare: only this table")
    p.add_argument("--by", default=None,
                   help="comma-separated grouping columns (default: all but seed and task_id); "
                        "with method, a method's settings (config, rule, variant) stay apart "
                        "and each row gets the report's label")
    p.add_argument("--pool", action="store_true",
                   help="group by exactly --by, pooling a method's settings into one row")
    p.add_argument("--where", default=None,
                   help="row filter: column names (the schema's, and each setting of config "
                        "as its own column: beta, tau, width_scale, c, ...), literals, "
                        "comparisons, and/or/not, in, arithmetic; e.g. \"metric == "
                        "'cumulative_regret' and x == 500\"")
    p.add_argument("--format", choices=("table", "csv", "json", "markdown", "latex"),
                   default="table",
                   help="markdown / latex: one metric at one x, mean +- SEM, the best row in "
                        "bold, a dagger on rows the paired test cannot tell from it")
    p.add_argument("--at", default=None,
                   help="keep one x per metric: 'last' (each metric's final step) or a number")
    p.add_argument("--raw", action="store_true", help="print rows instead of summaries")
    args = p.parse_args(argv)
    from spice_ray.results.cli import run

    return run(args)


def _piped_main() -> int:
    """:func:`main`, quiet when its reader goes away (``... | head``): the rest of the
    output is not wanted, so exit 0 without a traceback, as a shell tool would."""
    import os
    import sys

    try:
        code = main()
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        # stdout's buffer would fail again when Python closes it at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    raise SystemExit(_piped_main())
