"""Pretrain a study's models as populations, in this process, without Ray.

    python tools/population_train.py RUN --experiments darkroom,darkroom_region \\
        [--preset small] [--variant NAME] [--set SECTION.FIELD=VALUE ...] [--kinds spice,dpt] \\
        [--variants main,none,adv,epi] \\
        [--device cuda] [--stop-after SECONDS] [--graph auto|on|off] [--alone] [--threads N]

The models an experiment trains (every kind, variant and seed, as ``full_run.py`` plans them)
are grouped into populations of one kind, architecture, loss and resume epoch
(``spice_ray.train.population``), and each population trains as one: on a GPU one step costs
about one model's step. Every population trains in this one process, a step of each in turn
(``fit_populations``), so on a GPU their captured steps queue back to back instead of
time-slicing the device between processes. ``--plan`` prints each population and where it
would resume, and trains nothing. Checkpoints go where the study's pretraining stage puts them
(``RUN/checkpoints/<dataset>/<kind>-<id>-seed<k>/local/epoch-*``, and ``final`` when a model
reaches its last epoch), so ``python pipelines/full_run.py --out RUN`` with the same settings
finds them current (or resumes them) and goes on with tuning and evaluation. The datasets
must already be in ``RUN/datasets`` (``pipelines/generate_data.py``); nothing is generated
here. ``--alone`` trains each model by itself instead, one after another, with the training
loop every Train worker runs (``train_local``: same checkpoints, resumable): on a CPU a
stacked SPICE step costs about twice its models' steps alone (its value heads lose their
compiled kernel under vmap). ``--threads`` sets torch's threads (0: torch's default).
``--stop-after`` (populations only): after the first epoch that ends past it, every model of
the population writes its checkpoint and the tool exits 0 saying so; the same command resumes.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

import torch

from spice_ray.common.errors import SpiceRayError
from spice_ray.data import store
from spice_ray.study.experiments import EXPERIMENTS
from spice_ray.study.loss_weights import trained_models
from spice_ray.study.stages import plan_study
from spice_ray.train.loop import publish_final, steps_per_epoch
from spice_ray.train.population import fit_populations, population_key, resume_epoch
from spice_ray.train.ray_train import plan_job, settle_final, train_local


def cli(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path)
    parser.add_argument("--experiments", required=True)
    parser.add_argument("--preset", default="small")
    parser.add_argument("--set", action="append", default=[], dest="overrides",
                        metavar="SECTION.FIELD=VALUE")
    parser.add_argument("--variant", default="",
                        help="the study variant the models belong to (full_run.py --variant)")
    parser.add_argument("--kinds", default="", help="only these model kinds (default: all)")
    parser.add_argument("--variants", default=None,
                        help="only these variants: main (the experiment's own SPICE or DPT) "
                             "and weight-ablation names, e.g. main,none (default: all)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--stop-after", type=float, default=None, metavar="SECONDS")
    parser.add_argument("--plan", action="store_true",
                        help="print each population and the epoch it would resume at; train "
                             "nothing")
    parser.add_argument("--graph", choices=("auto", "on", "off"), default="auto",
                        help="capture each population's step as a CUDA graph (auto: on a GPU "
                             "with a constant learning rate)")
    parser.add_argument("--alone", action="store_true",
                        help="train each model by itself, one after another (faster on a CPU)")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch threads of this process (default 0: torch's own)")
    args = parser.parse_args(argv)
    if args.threads < 0:
        parser.error(f"--threads must be >= 0, got {args.threads}")
    if args.threads:
        torch.set_num_threads(args.threads)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    t_start = time.perf_counter()
    try:
        plan = plan_study(args.preset, args.run, None, args.overrides,
                          tuple(e for e in args.experiments.split(",") if e),
                          variant=args.variant)
        kinds = {k for k in args.kinds.split(",") if k}
        variants = (None if args.variants is None else
                    {"" if v == "main" else v for v in args.variants.split(",")})
        groups: dict[str, list[tuple]] = {}
        for name, cfg in plan.configs.items():
            dataset = store.dataset_dir(plan.run_dir / "datasets", cfg)
            store.load_manifest(dataset)  # refuses a missing or foreign dataset by name
            for m in trained_models(EXPERIMENTS[name], cfg):
                if m.same_as or (kinds and m.kind not in kinds) or (
                        variants is not None and m.variant not in variants):
                    continue
                for seed in cfg.seeds:
                    job, run_dir = plan_job(m.config(cfg), m.kind, seed, dataset)
                    if settle_final(run_dir / "final", job):
                        print(f"{name} {m.label(seed)}: checkpoint is current, skipped")
                        continue
                    run_dir.mkdir(parents=True, exist_ok=True)
                    job.cfg.write(run_dir)
                    # models at different epochs never share a population: it resumes at the
                    # newest epoch all its models have, so one behind would restart the rest
                    key = (population_key(job), resume_epoch([job], [run_dir]))
                    groups.setdefault(key, []).append((f"{name} {m.label(seed)}", job, run_dir))
        populations = [([n for n, _, _ in g], [j for _, j, _ in g], [d for _, _, d in g])
                       for g in groups.values()]
        if args.plan:  # a population's models share their resume epoch (its key's second half)
            for (_, start), (names, jobs, _) in zip(groups, populations, strict=True):
                print(f"population of {len(jobs)} ({', '.join(names)}): resumes at epoch "
                      f"{start + 1} of {jobs[0].cfg.train.epochs} "
                      f"({start * steps_per_epoch(jobs[0].cfg):,} steps done)")
            return 0
        if args.alone:
            return _train_alone(populations)
        left = (None if args.stop_after is None
                else max(0.0, args.stop_after - (time.perf_counter() - t_start)))
        t0 = time.perf_counter()
        # every population in this one process, a step of each in turn (fit_populations)
        results = fit_populations([(jobs, dirs) for _, jobs, dirs in populations], args.device,
                                  stop_after=left,
                                  graph={"auto": None, "on": True, "off": False}[args.graph])
        for (names, jobs, dirs), result in zip(populations, results, strict=True):
            epochs = jobs[0].cfg.train.epochs
            print(f"population of {len(jobs)} ({', '.join(names)}) on {args.device}: epochs "
                  f"{result.start_epoch + 1}-{result.last_epoch + 1} of {epochs} in "
                  f"{time.perf_counter() - t0:.0f} s beside {len(populations) - 1} other(s), "
                  f"{result.steps_per_s * len(jobs):.1f} model-steps/s "
                  f"({result.steps_per_s:.1f} steps/s); val loss "
                  + ", ".join(f"{m.get('val_loss', float('nan')):.4f}"
                              for m in result.metrics))
            if result.stopped_early:
                print(f"  stopped after epoch {result.last_epoch + 1} (--stop-after): the same "
                      "command resumes")
                continue
            for run_dir in dirs:
                last = sorted((run_dir / "local").glob("epoch-*"))[-1]
                publish_final(last, run_dir / "final")
    except SpiceRayError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


def _train_alone(populations: list[tuple[list[str], list, list]]) -> int:
    """Each model by itself with the Train workers' loop, one after another, in this process."""
    for names, jobs, dirs in populations:
        for name, job, run_dir in zip(names, jobs, dirs, strict=True):
            t0 = time.perf_counter()
            result = train_local(job, run_dir)
            metrics = (result.worker_return or {}).get("metrics", {})
            print(f"{name} alone: {job.cfg.train.epochs} epochs, final {result.final}, "
                  f"{time.perf_counter() - t0:.0f} s; val loss "
                  f"{metrics.get('val_loss', float('nan')):.4f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(cli())
