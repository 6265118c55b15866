"""Pretrain SPICE or DPT on a generated dataset, on Ray Train (or in-process with
--set train.num_workers=0).

    python pipelines/pretrain.py --preset small --env bandit --model spice
    python pipelines/pretrain.py --preset small --env darkroom --model dpt --set train.num_workers=2

The dataset is generated first if it is missing. Every seed of the config trains in one Ray
Train job (``train.together``; ``--set train.together=false`` for one job per seed). A re-run
resumes an interrupted training run from its last checkpoint, and skips a finished one. With
``--set 'train.choose=[lambda_q]'`` SPICE trains once per point of that loss-weight grid, the
candidates a study chooses among (``spice_ray.study.loss_weights``).
"""

from __future__ import annotations

import argparse

from spice_ray.common.console import Console
from spice_ray.data.generate import generate_stage
from spice_ray.model.checkpoint import read_meta
from spice_ray.runtime.cli import add_config_args, config_from_args, run_main, start_run
from spice_ray.study.experiment_spec import ModelRef
from spice_ray.study.loss_weights import candidates
from spice_ray.train.together import ModelSpec, pretrain_many


def cli(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_args(parser)
    parser.add_argument("--model", choices=("spice", "dpt"), default="spice")
    parser.add_argument("--seed", type=int, default=None,
                        help="training seed (default: every seed of the config)")
    args = parser.parse_args(argv)
    cfg = config_from_args(args)
    console = Console()
    lock = start_run(args.address, [cfg], cfg.out_dir, stages=("datasets", "pretrain"),
                     console=console, verbose=args.verbose, dashboard=args.dashboard)
    ds_dir = run_main(generate_stage, cfg, console=console, label="dataset").dataset_dir
    seeds = [args.seed] if args.seed is not None else list(cfg.seeds)
    # with train.choose, SPICE trains once per loss-weight grid point (the study's candidates)
    model = ModelRef(args.model)
    refs = (candidates(model, cfg) if args.model == "spice" else []) or [model]
    specs = [ModelSpec(m.config(cfg), m.kind, seed, m.label(seed)) for m in refs for seed in seeds]
    finals, _ = run_main(pretrain_many, specs, ds_dir, console=console, label=args.model)
    for final in finals:
        metrics = read_meta(final)["metrics"]
        print(f"checkpoint: {final}")
        print(f"  epoch {int(metrics['epoch']) + 1}: train loss {metrics['train_loss']:.4f}, "
              f"val loss {metrics['val_loss']:.4f}, {metrics['samples_per_s']:.0f} samples/s")
    lock.release()


if __name__ == "__main__":
    cli()
