"""The whole study, end to end, on an embedded local Ray (or a cluster with --address auto).

    python pipelines/full_run.py                    # the `small` preset, a few minutes
    python pipelines/full_run.py --preset paper --address auto

Stages: datasets (bandit A=5 weak labels, bandit A=20 weakmix80, darkroom weak-last). Each stage
is skipped when its output directory already holds a complete, matching result, so an
interrupted run resumes where it stopped.

Status: only the dataset stage exists so far; pretraining, evaluation, tables, figures and the
report are added by later stages of the project and will be chained here.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

from spice_ray.cli import add_config_args, human_bytes, init_ray, setup_logging
from spice_ray.config import ConfigError, RunConfig, make_config
from spice_ray.stages import generate_stage

log = logging.getLogger("spice_ray.full_run")


def experiment_configs(base_args: argparse.Namespace) -> dict[str, RunConfig]:
    """The study's experiments, each a validated RunConfig (all built before any work)."""
    out = {"out_dir": str(base_args.out or Path("runs") / base_args.preset)}
    specs = {
        "bandit": ("bandit", []),
        "bandit20": ("bandit", ["env.num_arms=20", "data.label=weakmix80"]),
        "darkroom": ("darkroom", []),
    }
    cfgs = {}
    for name, (env, extra_sets) in specs.items():
        try:
            cfgs[name] = make_config(base_args.preset, env, yaml_path=base_args.config,
                                     overrides=[*extra_sets, *base_args.overrides], extra=out)
        except ConfigError as exc:
            print(f"error: bad config for experiment {name}: {exc}", file=sys.stderr)
            raise SystemExit(2) from exc
    return cfgs


def main(cfgs: dict[str, RunConfig]) -> Path:
    """Run every stage that exists; returns the run directory."""
    run_dir = Path(next(iter(cfgs.values())).out_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    for name, cfg in cfgs.items():
        cfg.write(run_dir / "configs", f"{name}.yaml")
    t0 = time.perf_counter()
    for name, cfg in cfgs.items():
        log.info("stage 1/1 datasets: %s", name)
        report = generate_stage(cfg)
        print(f"[datasets] {name}: {report.dataset_dir} "
              f"({human_bytes(report.bytes_on_disk)}, {report.seconds:.1f} s)")
    log.info("done in %.1f s", time.perf_counter() - t0)
    return run_dir


def cli(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_args(parser, env=False)
    args = parser.parse_args(argv)
    cfgs = experiment_configs(args)  # every config is valid before Ray starts
    setup_logging()
    init_ray(args.address)
    run_dir = main(cfgs)
    print(f"run directory: {run_dir.resolve()}")
    print("note: this version runs the dataset stage only; training, evaluation and figures "
          "come in later releases")


if __name__ == "__main__":
    cli()
