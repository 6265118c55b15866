"""Generate an offline dataset (train / validation / eval Parquet shards) on Ray Data.

    python pipelines/generate_data.py --preset small --env bandit
    python pipelines/generate_data.py --preset paper --env darkroom --set data.concurrent_tasks=4

A re-run with the same config skips valid shards and regenerates missing or corrupted ones.
"""

from __future__ import annotations

import argparse

from spice_ray.common.console import Console
from spice_ray.data.generate import generate_stage
from spice_ray.runtime.cli import add_config_args, config_from_args, run_main, start_run
from spice_ray.runtime.resources import human_bytes


def cli(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_args(parser)
    args = parser.parse_args(argv)
    cfg = config_from_args(args)  # a bad config stops here, before Ray starts
    console = Console()
    lock = start_run(args.address, [cfg], cfg.out_dir, stages=("datasets",), console=console,
                     verbose=args.verbose, dashboard=args.dashboard)
    report = run_main(generate_stage, cfg, console=console, label="dataset")
    lock.release()
    print(f"dataset: {report.dataset_dir}")
    print(f"size: {report.num_tasks} tasks, {human_bytes(report.bytes_on_disk)} on disk "
          f"({report.bytes_on_disk / report.num_tasks:.0f} B/task), {report.seconds:.1f} s")


if __name__ == "__main__":
    cli()
