"""Several models of one dataset in one Ray Train job (``train.together``).

Each worker of the job trains whole models, one after another (model i on worker i mod n), so
the job's fixed start-up -- worker group, the workers' imports, compile warm-up --
is paid once for all of them instead of once per model, and with n workers n models train side
by side. A model's batches, threads and checkpoints are those it would have alone on a
one-worker job with the same threads, so its weights are the same bit for bit (tested). On 2
cores, two one-thread workers side by side make 1.31x the model-steps per second of one
two-thread worker on the darkroom's models and 1.10x on the bandit's (``benchmarks/
bench_cores.py``); a batch three times larger costs about three times one seed's step, so
on a CPU seeds are not vectorised into one model.

With ``train.population`` the models of one kind and config train instead as populations
(``spice_ray.train.population``): their weights stacked, one step for all, which is what fills
a launch-bound GPU; here only the Ray side of that (workers that each train whole populations)
and the driver's in-process path.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from spice_ray.common.artifacts import atomic_write_text
from spice_ray.common.console import SILENT, Bar, Console, count
from spice_ray.config import ExperimentConfig, TrainConfig
from spice_ray.config.sections import AUTO
from spice_ray.model import checkpoint as ckpt
from spice_ray.runtime.resources import gpus_available
from spice_ray.runtime.tracking import TrainTracker
from spice_ray.train.loop import (
    LocalContext,
    StepObserver,
    TrainingDiverged,
    TrainJob,
    fault_epoch_from_env,
    fit,
    publish_final,
    steps_per_epoch,
)
from spice_ray.train.progress import ProgressReporter, QueueDrain, TrainBar
from spice_ray.train.ray_train import (
    fit_trainer,
    plan_job,
    pretrain,
    settle_final,
    start_tracking,
    threads_per_worker,
    verify_dataset,
    worker_resources,
)

log = logging.getLogger(__name__)


class SeedContext(LocalContext):
    """LoopContext of one model that a Ray Train worker trains whole (``train.together``).

    Batches come from the worker's dataset shards exactly as for a one-worker
    :class:`RayContext` (so the weights are the same), but the worker is a world of its own
    (no DDP wrapper, no collective), and the checkpoints live in the model's own run directory
    (``<run_dir>/local/epoch-*``, as in the plain loop), where a retried worker resumes.
    """

    verify_shards = False  # the driver verified them before the job (verify_dataset)

    def __init__(self, job: TrainJob, run_dir: Path) -> None:
        import ray.train.torch

        super().__init__(job, run_dir)
        self.device = ray.train.torch.get_device()


DIVERGED = "diverged.txt"
"""In a model's run directory: why its training diverged (``train.together``: a worker that
trains several models writes it and goes on with the next one; the driver raises)."""

FIT_TIMING = "fit.json"
"""In a model's run directory: the seconds its ``fit`` took in its last training
(``train.together``), to tell a job's start-up from its compute."""


def _worker_start(config: dict[str, Any]) -> tuple[int, int]:
    """A Train worker of a together or population job: its log format and torch threads;
    returns (rank, world size)."""
    import ray.train

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S")
    torch.set_num_threads(int(config["threads"]))
    tctx = ray.train.get_context()
    return tctx.get_world_rank(), tctx.get_world_size()


def train_models_worker(config: dict[str, Any]) -> dict[str, Any]:
    """``train_loop_per_worker`` of a together job: this worker trains the models
    ``config["models"][rank::world_size]`` whole, one after another, each skipped when its
    final checkpoint is current (a retried worker resumes the unfinished one from its
    checkpoints). Rank 0 reports its steps to the driver's bar.
    """

    rank, world = _worker_start(config)
    offset = 0
    for item in config["models"][rank::world]:
        job, run_dir = TrainJob(**item["job"]), Path(item["run_dir"])
        steps = job.cfg.train.epochs * steps_per_epoch(job.cfg)
        (run_dir / DIVERGED).unlink(missing_ok=True)
        if settle_final(run_dir / "final", job):
            offset += steps
            continue
        ctx = SeedContext(job, run_dir)
        observers: list[StepObserver] = []
        if rank == 0 and config.get("progress") is not None:
            observers.append(ProgressReporter(config["progress"].put_nowait,
                                              job.cfg.train.epochs, offset=offset,
                                              model=item["name"]))
        run = start_tracking(job)
        if run is not None:
            observers.append(TrainTracker(run))
        t0 = time.perf_counter()
        try:
            fit(job, ctx, fault_epoch=int(config.get("fault_epoch", -1)), observers=observers)
        except TrainingDiverged as exc:  # the others still train; the driver raises
            atomic_write_text(run_dir / DIVERGED, str(exc))
            continue
        finally:
            offset += steps
            if run is not None:
                run.finish()
        last = ctx.resume_dir()
        if last is None:
            raise ckpt.CheckpointError(f"training {run_dir} finished without a checkpoint")
        publish_final(last, run_dir / "final")
        atomic_write_text(run_dir / FIT_TIMING, json.dumps(
            {"fit_seconds": time.perf_counter() - t0, "threads": int(config["threads"])}))
    return {}


def train_together(models: list[tuple[str, TrainJob, Path]], bar: Bar | None = None) -> None:
    """Train ``models`` ((name, job, run directory); one dataset and one ``train`` placement)
    in one TorchTrainer whose workers each train whole models: ``min(len(models),
    train.num_workers)`` workers, model i on worker i mod n, each with
    :func:`threads_per_worker` threads for that many workers. Each publishes
    ``<run_dir>/final``.

    Raises:
        TrainingDiverged: naming every model whose training diverged (after the others ran).
    """
    cfg = models[0][1].cfg
    workers = min(len(models), max(1, cfg.train.num_workers))
    run_job(train_models_worker,
            {"models": [{"name": name, "job": dataclasses.asdict(job),
                         "run_dir": str(run_dir.resolve())} for name, job, run_dir in models],
             "threads": threads_per_worker(cfg, workers), "fault_epoch": fault_epoch_from_env()},
            cfg, workers, models[0][1].dataset_dir, models[0][2], bar)
    diverged = [(run_dir / DIVERGED).read_text() for _, _, run_dir in models
                if (run_dir / DIVERGED).exists()]
    if diverged:
        raise TrainingDiverged("; ".join(diverged))
    for _, job, run_dir in models:
        if not settle_final(run_dir / "final", job):
            raise ckpt.CheckpointError(f"training {run_dir} finished without a final "
                                       "checkpoint")


def train_population_group(members: list[tuple[str, TrainJob, Path]], device: torch.device,
                           observers: list[StepObserver] | None = None) -> None:
    """Train one population (``spice_ray.train.population``) unless every member's final is
    current, and publish each member's ``final``. A divergence is written to each member's
    run directory (:data:`DIVERGED`), as a together worker does, for the driver to raise."""
    from spice_ray.train.population import fit_population

    jobs = [job for _, job, _ in members]
    dirs = [run_dir for _, _, run_dir in members]
    if all(settle_final(d / "final", j) for j, d in zip(jobs, dirs, strict=True)):
        return
    for d in dirs:
        (d / DIVERGED).unlink(missing_ok=True)
    t0 = time.perf_counter()
    try:
        fit_population(jobs, dirs, device, observers=observers or [])
    except TrainingDiverged as exc:
        for d in dirs:
            atomic_write_text(d / DIVERGED, str(exc))
        return
    for d in dirs:
        last = sorted((d / "local").glob("epoch-*"))
        if not last:
            raise ckpt.CheckpointError(f"training {d} finished without a checkpoint")
        publish_final(last[-1], d / "final")
        # each member's share, so a worker's fits add up to its busy time
        atomic_write_text(d / FIT_TIMING, json.dumps(
            {"fit_seconds": (time.perf_counter() - t0) / len(members),
             "population": len(members)}))


def train_populations_worker(config: dict[str, Any]) -> dict[str, Any]:
    """``train_loop_per_worker`` of a population job: this worker trains the populations
    ``config["populations"][rank::world_size]`` one after another on its device."""
    import ray.train.torch

    rank, world = _worker_start(config)
    offset = 0
    for group in config["populations"][rank::world]:
        members = [(item["name"], TrainJob(**item["job"]), Path(item["run_dir"]))
                   for item in group]
        cfg = members[0][1].cfg
        observers: list[StepObserver] = []
        if rank == 0 and config.get("progress") is not None:
            observers.append(ProgressReporter(config["progress"].put_nowait, cfg.train.epochs,
                                              offset=offset,
                                              model=f"{members[0][0]} +{len(members) - 1}"))
        train_population_group(members, ray.train.torch.get_device(), observers)
        offset += cfg.train.epochs * steps_per_epoch(cfg)
    return {}


def population_groups(models: list[tuple[str, TrainJob, Path]]
                      ) -> list[list[tuple[str, TrainJob, Path]]]:
    """``models`` grouped into populations of one kind and config, in first-seen order."""
    from spice_ray.train.population import population_key

    groups: dict[str, list[tuple[str, TrainJob, Path]]] = {}
    for item in models:
        groups.setdefault(population_key(item[1]), []).append(item)
    return list(groups.values())


def train_populations(models: list[tuple[str, TrainJob, Path]], bar: Bar | None = None
                      ) -> None:
    """Train ``models`` as populations (:func:`population_groups`): in this process with
    ``train.num_workers=0`` (on the GPU with ``train.use_gpu`` when there is one), else in one
    Ray Train job of ``min(populations, num_workers)`` workers, population i on worker i mod
    n. Each model's ``final`` is published.

    Raises:
        TrainingDiverged: naming every population whose training diverged.
    """
    groups = population_groups(models)
    tc = models[0][1].cfg.train
    if not tc.on_ray_train:
        device = torch.device("cuda" if training_on_gpu(tc) else "cpu")
        for group in groups:
            observers = ([ProgressReporter(TrainBar(bar), tc.epochs,
                                           model=f"{group[0][0]} +{len(group) - 1}")]
                         if bar is not None else [])
            train_population_group(group, device, observers)
    else:
        _population_job(groups, bar)
    diverged = sorted({(run_dir / DIVERGED).read_text() for _, _, run_dir in models
                       if (run_dir / DIVERGED).exists()})
    if diverged:
        raise TrainingDiverged("; ".join(diverged))
    for _, job, run_dir in models:
        if not settle_final(run_dir / "final", job):
            raise ckpt.CheckpointError(f"training {run_dir} finished without a final "
                                       "checkpoint")


def _population_job(groups: list[list[tuple[str, TrainJob, Path]]], bar: Bar | None) -> None:
    """One TorchTrainer whose workers train whole populations."""
    cfg = groups[0][0][1].cfg
    workers = min(len(groups), max(1, cfg.train.num_workers))
    run_job(train_populations_worker,
            {"populations": [[{"name": name, "job": dataclasses.asdict(job),
                               "run_dir": str(run_dir.resolve())}
                              for name, job, run_dir in group] for group in groups],
             "threads": threads_per_worker(cfg, workers)},
            cfg, workers, groups[0][0][1].dataset_dir, groups[0][0][2], bar)


def run_job(loop: Callable[[dict[str, Any]], dict[str, Any]], loop_config: dict[str, Any],
            cfg: ExperimentConfig, workers: int, dataset_dir: str, storage: Path,
            bar: Bar | None) -> None:
    """One TorchTrainer of ``workers`` workers running ``loop`` (each trains whole models or
    populations, never talking to the others) on the dataset's verified shards, its Ray
    state under ``storage``, its progress drained to ``bar``."""
    import ray.train
    from ray.train.torch import TorchConfig, TorchTrainer
    from ray.util.queue import Queue

    tc = cfg.train
    use_gpu = gpus_available(tc.use_gpu)
    verify_dataset(dataset_dir)
    queue = Queue(actor_options={"num_cpus": 0}) if bar is not None else None
    trainer = TorchTrainer(
        loop,
        train_loop_config={**loop_config, "progress": queue},
        scaling_config=ray.train.ScalingConfig(num_workers=workers, use_gpu=use_gpu,
                                               resources_per_worker=worker_resources(
                                                   tc, use_gpu)),
        # the workers never communicate, and NCCL refuses two ranks on one GPU
        # (train.worker_gpus < 1): the process group Ray Train sets up is gloo's
        torch_config=TorchConfig(backend="gloo"),
        run_config=ray.train.RunConfig(
            name=TOGETHER_DIR, storage_path=str(storage.resolve()),
            failure_config=ray.train.FailureConfig(max_failures=tc.max_failures)),
    )
    try:
        if queue is not None and bar is not None:
            with QueueDrain(queue, TrainBar(bar)):
                fit_trainer(trainer)
        else:
            fit_trainer(trainer)
    finally:
        if queue is not None:
            queue.shutdown()


TOGETHER_DIR = "ray-together"
"""Ray Train's run name of a together job, under its first model's run directory."""


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """One model of :func:`pretrain_many`: its config (a variant's train settings applied),
    kind, seed and display name."""

    cfg: ExperimentConfig
    kind: str
    seed: int
    name: str = ""


def on_local_gpu(tc: TrainConfig, gpu: bool) -> TrainConfig:
    """``tc`` on a machine that has (``gpu``) or has not its own GPU. With ``use_gpu`` "auto"
    and a GPU: on it, as populations unless ``population`` is false, and those in the driver
    (``num_workers`` 0: one process fills one GPU best, several time-slice it). Otherwise
    unchanged: a cluster's GPUs are looked for when its jobs start (:func:`training_on_gpu`)."""
    if not gpu or tc.use_gpu != AUTO:
        return tc
    population = tc.populations(True)
    return dataclasses.replace(tc, use_gpu=True, population=population,
                               num_workers=0 if population else tc.num_workers)


def training_on_gpu(tc: TrainConfig) -> bool:
    """Whether ``tc``'s models train on GPUs: in the driver (``num_workers=0``) this process's
    GPU, in Ray Train jobs the cluster's (:func:`~spice_ray.runtime.resources.gpus_available`,
    Ray started); ``train.use_gpu`` decides, "auto" by whether there are any."""
    if tc.on_ray_train:
        return gpus_available(tc.use_gpu)
    gpu = torch.cuda.is_available()
    return tc.on_gpu(gpu) and gpu


def pretrain_many(models: list[ModelSpec], dataset_dir: str | Path,
                  checkpoints_root: str | Path | None = None, console: Console = SILENT,
                  label: str = "") -> tuple[list[Path], dict[str, Any]]:
    """Pretrain several models of one dataset (each skipped when current); returns their
    ``final`` checkpoints, in order, and a timing record.

    With ``train.together`` (and Ray workers) the models that need training run in one Ray
    Train job (:func:`train_together`), one progress bar and one summary line for all of
    them; otherwise each is :func:`pretrain`-ed on its own.

    The timing record: ``{"seconds": wall, "models": {name: fit seconds}, "worker": {name:
    the worker that trained it}, "jobs": n}`` (fit seconds of together jobs only); a worker's
    models train one after another and the workers side by side, so a job's start-up is
    ``seconds`` minus the busiest worker's fits (``records.busy_seconds``).
    """
    t0 = time.perf_counter()
    planned = [(m, *plan_job(m.cfg, m.kind, m.seed, dataset_dir, checkpoints_root))
               for m in models]
    tc = models[0].cfg.train
    population = tc.population if tc.population != AUTO else training_on_gpu(tc)
    if not population and (not tc.together or not tc.on_ray_train):
        finals = [pretrain(m.cfg, m.kind, m.seed, dataset_dir, checkpoints_root, console,
                           f"{label} {m.name}".strip()) for m in models]
        return finals, {"seconds": time.perf_counter() - t0, "models": {}, "worker": {},
                        "jobs": len(models)}
    todo = [(m.name or f"{m.kind} seed {m.seed}", job, run_dir)
            for m, job, run_dir in planned if not settle_final(run_dir / "final", job)]
    finals = [run_dir / "final" for _, _, run_dir in planned]
    if not todo:
        console.line(f"  {label}: {count(len(models), 'checkpoint')} current, skipped")
        return finals, {"seconds": time.perf_counter() - t0, "models": {}, "worker": {},
                        "jobs": 0}
    for _, job, run_dir in todo:
        run_dir.mkdir(parents=True, exist_ok=True)
        job.cfg.write(run_dir)  # as trained: data-derived values filled in
    skipped = len(models) - len(todo)
    if population:
        groups = population_groups(todo)
        workers = min(len(groups), max(1, tc.num_workers)) if tc.on_ray_train else 1
        steps = sum(g[0][1].cfg.train.epochs * steps_per_epoch(g[0][1].cfg)
                    for g in groups[::workers])
        what = (f"{count(len(todo), 'model')} as {count(len(groups), 'population')}"
                + (" in one job" if tc.on_ray_train else ""))
    else:
        workers = min(len(todo), max(1, tc.num_workers))
        steps = sum(job.cfg.train.epochs * steps_per_epoch(job.cfg)
                    for _, job, _ in todo[::workers])
        what = f"{count(len(todo), 'model')} in one job"
    bar = console.bar(f"{label}: {what}" + (f" ({skipped} current)" if skipped else ""), steps,
                      "step")
    try:
        (train_populations if population else train_together)(todo, bar)
    except BaseException as exc:
        bar.abort(exc)
        raise
    vals = [ckpt.read_meta(run_dir / "final")["metrics"].get("val_loss", float("nan"))
            for _, _, run_dir in todo]
    bar.close(f"val loss {min(vals):.3f}" + (f"-{max(vals):.3f}" if len(vals) > 1 else ""))
    fit_seconds = {}
    for name, _, run_dir in todo:
        try:
            fit_seconds[name] = float(json.loads((run_dir / FIT_TIMING).read_text())
                                      ["fit_seconds"])
        except (OSError, ValueError, KeyError, TypeError):
            pass
    return finals, {"seconds": time.perf_counter() - t0, "models": fit_seconds,
                    "worker": ({name: i % workers for i, g in enumerate(groups)
                                for name, _, _ in g} if population else
                               {name: i % workers for i, (name, _, _) in enumerate(todo)}),
                    "jobs": 1 if tc.on_ray_train or not population else 0}

