"""The whole study, end to end, on an embedded local Ray (or a cluster with --address auto).

    python pipelines/full_run.py                                # the `small` laptop preset
    python pipelines/full_run.py --preset smoke --out /tmp/smoke
    python pipelines/full_run.py --preset paper --address auto   # on `ray up cluster.yaml`
    python pipelines/full_run.py --preset paper --dry-run        # print the plan only

Stages: datasets (Ray Data; tiny ones in the driver) -> pretraining SPICE and DPT per seed,
plus the darkroom weight ablation (Ray Train) -> tuning every method's settings on
validation tasks (Ray actors; results/tuning.json) -> evaluation of every controller and
baseline on the eval tasks (Ray actors) -> result tables (results/*.parquet) -> figures
(figures/*.png) -> report.md. Each stage is skipped when its output is complete and matches
the config, so an interrupted run resumes where it stopped and a re-run does no work.
"""

from __future__ import annotations

import argparse
import logging
import shlex
import sys

# Only what the flags need at module level: --help and a bad flag answer before torch, pandas
# or Ray load (the study's modules are imported once the arguments parse).
from spice_ray.common.plugins import PluginError
from spice_ray.runtime.args import add_config_args

log = logging.getLogger("spice_ray.full_run")


def parser() -> argparse.ArgumentParser:
    """The command line (nothing heavy imported to build it)."""
    out = argparse.ArgumentParser(description=__doc__,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_args(out, env=False)
    out.add_argument("--experiments", default=None,
                     help="comma-separated experiments (default: the study's default set; "
                     "--list-experiments names every one, plugins' included)")
    out.add_argument("--list-experiments", action="store_true",
                     help="print every experiment's name, marking the default set, and exit")
    out.add_argument("--variant", default="", metavar="NAME",
                     help="run the experiments under NAME beside the ones --out holds (e.g. "
                     "another config of them): tables bandit--NAME_online ..., both in one "
                     "report")
    out.add_argument("--dry-run", action="store_true",
                     help="print the plan (stages, resources, sizes, times) and exit")
    out.add_argument("--figure-format", default="png",
                     help="comma-separated figure formats: every figure as a PNG (the "
                     "report's) and a copy in each other one, e.g. pdf or svg for a paper "
                     "(default: %(default)s)")
    return out


def cli(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    try:  # the experiments load the installed plugins: one that fails is one line, not a
        # traceback from this file's imports
        from spice_ray.study import plan_study, run_study
        from spice_ray.study.dryrun import describe_plan
        from spice_ray.study.experiments import DEFAULT_EXPERIMENTS, EXPERIMENTS
    except PluginError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
    from spice_ray.common.console import Console, fmt_seconds
    from spice_ray.config import ConfigError
    from spice_ray.results.figure_files import FORMATS
    from spice_ray.runtime import resources
    from spice_ray.runtime.cli import run_main, start_run

    if args.list_experiments:
        for name in EXPERIMENTS:
            print(f"{name}{'  (default)' if name in DEFAULT_EXPERIMENTS else ''}")
        return
    if args.experiments is None:
        args.experiments = ",".join(DEFAULT_EXPERIMENTS)
    formats = tuple(dict.fromkeys(["png", *(f.strip() for f in args.figure_format.split(",")
                                            if f.strip())]))
    bad = [f for f in formats if f not in FORMATS]
    if bad:
        print(f"error: --figure-format {bad[0]!r} is invalid: one of {', '.join(FORMATS)}",
              file=sys.stderr)
        raise SystemExit(2)
    try:  # every experiment's config is valid before Ray starts
        plan = plan_study(args.preset, args.out, args.config, args.overrides,
                          tuple(e for e in args.experiments.split(",") if e), args.variant)
    except ConfigError as exc:
        print(f"error: bad config: {exc}", file=sys.stderr)
        raise SystemExit(2) from exc
    plan.figure_formats = formats
    if args.dry_run:
        print(describe_plan(plan))
        problems = resources.size_problems(plan.configs.values(), plan.run_dir, args.address)
        if problems:
            print("error: " + "\nerror: ".join(problems), file=sys.stderr)
            raise SystemExit(2)
        return
    console = Console()
    lock = start_run(args.address, list(plan.configs.values()), plan.run_dir, console=console,
                     verbose=args.verbose, dashboard=args.dashboard)
    console.line(f"spice-ray study: preset {args.preset}, {', '.join(plan.configs)} -> "
                 f"{plan.run_dir} (logs: {plan.run_dir / 'logs'})")
    report = run_main(run_study, plan, console)
    lock.release()
    figures = sorted((plan.run_dir / "figures").glob("*.png"))
    console.line(f"report:  {report.resolve()}")
    console.line(f"figures: {(plan.run_dir / 'figures').resolve()} ({len(figures)} PNG files)")
    console.line(f"tables:  {(plan.run_dir / 'results').resolve()} "
                 f"(query: python -m spice_ray.results {shlex.quote(str(plan.run_dir))})")
    stages = ", ".join(f"{k} {fmt_seconds(v)}" for k, v in plan.timings.items() if k != "total")
    console.line(f"time:    {fmt_seconds(plan.timings.get('total', 0.0))} ({stages})")


if __name__ == "__main__":
    cli()
