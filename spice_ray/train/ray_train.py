"""Ray Train driver: a TorchTrainer over the Parquet train split, one worker per GPU (or CPU).

The loop itself is :func:`spice_ray.train.loop.fit`; this module only supplies the Ray side of
:class:`~spice_ray.train.loop.LoopContext` (the workers' batches, DDP wrapping, ``ray.train.report``
with checkpoints, ``ray.train.get_checkpoint`` for resume) and the pretraining stage that picks
Ray or the plain in-process loop and publishes the final checkpoint.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from spice_ray.common.artifacts import is_current
from spice_ray.common.console import SILENT, Bar, Console
from spice_ray.common.placement import TRAINER, placement_resources
from spice_ray.config import ExperimentConfig, TrainConfig
from spice_ray.data import store
from spice_ray.model import checkpoint as ckpt
from spice_ray.model.tokens import make_tokens
from spice_ray.runtime import tracking
from spice_ray.runtime.resources import gpus_available
from spice_ray.runtime.tracking import TrainTracker
from spice_ray.train.loop import (
    LocalContext,
    StepObserver,
    TrainingDiverged,
    TrainJob,
    fault_epoch_from_env,
    fit,
    latest_intact,
    publish_final,
    steps_per_epoch,
)
from spice_ray.train.prior import resolve_config
from spice_ray.train.progress import ProgressReporter, QueueDrain, TrainBar, describe_loss
from spice_ray.train.stream import shard_batches, val_shard_batches

log = logging.getLogger(__name__)


def verify_dataset(dataset_dir: str | Path) -> None:
    """Check the train and validation shards against their manifest in the driver, before a
    job whose workers read them unverified (a bad shard fails here, naming the file, instead
    of inside every worker's retries).

    Raises:
        store.DatasetError: naming the shard that fails its checksum.
    """
    for split in ("train", "validation"):
        store.split_files(dataset_dir, split, verify=True)


class RayContext:
    """LoopContext inside a Ray Train worker (one model, its batches shared by the workers)."""

    def __init__(self, job: TrainJob, run_dir: Path) -> None:
        import ray.train
        import ray.train.torch

        tctx = ray.train.get_context()
        self.job = job
        self.run_dir = Path(run_dir)
        self.world_size = tctx.get_world_size()
        self.rank = tctx.get_world_rank()
        self.device = ray.train.torch.get_device()
        # Under the run directory, not /tmp: removed when the worker ends, and by the driver
        # after the fit even when a worker was killed.
        self._scratch = scratch_root(self.run_dir) / f"rank-{self.rank}"
        shutil.rmtree(self._scratch, ignore_errors=True)
        self._scratch.mkdir(parents=True)

    def train_batches(self, epoch: int, batch_size: int) -> Iterator[dict[str, Any]]:
        return shard_batches(self.job, epoch, batch_size, self.rank, self.world_size)

    def val_batches(self, batch_size: int) -> Iterator[dict[str, Any]]:
        return val_shard_batches(self.job, batch_size)

    def prepare(self, model: nn.Module) -> nn.Module:
        import ray.train.torch

        return ray.train.torch.prepare_model(model)

    def scratch_dir(self) -> Path:
        return self._scratch

    def resume_dir(self) -> Path | None:
        """Ray Train's last checkpoint if intact, else the newest intact one this run kept
        (a corrupted file is named in the log and skipped, not loaded)."""
        import ray.train

        candidates = []
        checkpoint = ray.train.get_checkpoint()
        if checkpoint is not None:
            local = self._scratch / "resume"
            with checkpoint.as_directory() as d:
                shutil.copytree(d, local, dirs_exist_ok=True)
            candidates.append(local)
        candidates += sorted((self.run_dir / RAY_DIR).glob("checkpoint_*"), reverse=True)
        return latest_intact(candidates, self.job)

    def report(self, metrics: dict[str, float], checkpoint_dir: Path | None) -> None:
        import ray.train

        if checkpoint_dir is None:
            ray.train.report(metrics)
        else:
            ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(
                str(checkpoint_dir)))


def start_tracking(job: TrainJob) -> tracking.Run | None:
    """The tracked run of one model's training (``track``; None when off), named
    ``<dataset>/<kind>-seed<k>-<identity>`` in the group ``pretrain``."""
    name = f"{Path(job.dataset_dir).name}/{job.kind}-seed{job.seed}-{job.identity()[:8]}"
    return tracking.start(job.cfg, "pretrain", name, {"kind": job.kind, "seed": job.seed,
                                                      **job.cfg.to_dict()})


def probe_outputs(model: nn.Module, job: TrainJob, num_tasks: int = 4) -> list[float]:
    """Flattened policy logits (and prior means for SPICE) on the first validation tasks: a
    fingerprint to compare an in-memory model with its reloaded checkpoint."""
    cfg = job.cfg
    batch = store.load_split(job.dataset_dir, "validation", limit=num_tasks)
    tokens = make_tokens(batch, cfg.env)
    model = model.cpu().float().eval()
    with torch.no_grad():
        out = model(tokens)
    parts = [out.logits] + ([out.prior_mean] if hasattr(out, "prior_mean") else [])
    return torch.cat([p.reshape(-1) for p in parts]).tolist()


def train_worker(config: dict[str, Any]) -> dict[str, Any]:
    """``train_loop_per_worker`` of the TorchTrainer; rank 0 returns metrics and a probe.

    A diverged run returns ``{"diverged": message}`` instead of raising, so that Ray Train does
    not retry a failure that would only repeat (every rank stops at the same step).
    """
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S")
    torch.set_num_threads(int(config["threads"]))
    job = TrainJob(**config["job"])
    ctx = RayContext(job, Path(config["run_dir"]))
    observers: list[StepObserver] = []
    if ctx.rank == 0 and config.get("progress") is not None:
        observers.append(ProgressReporter(config["progress"].put_nowait, job.cfg.train.epochs))
    run = start_tracking(job) if ctx.rank == 0 else None
    if run is not None:
        observers.append(TrainTracker(run))
    t0 = time.perf_counter()
    try:
        metrics, model = fit(job, ctx, fault_epoch=int(config.get("fault_epoch", -1)),
                             observers=observers)
    except TrainingDiverged as exc:
        return {"diverged": str(exc)} if ctx.rank == 0 else {}
    finally:
        shutil.rmtree(ctx.scratch_dir(), ignore_errors=True)
        if run is not None:
            run.finish()
    if ctx.rank != 0:
        return {}
    return {"metrics": metrics, "probe": probe_outputs(model, job),
            "fit_seconds": time.perf_counter() - t0}


def threads_per_worker(cfg: ExperimentConfig, workers: int | None = None) -> int:
    """Torch threads of each of ``workers`` Train workers (default ``train.num_workers``):
    ``train.threads`` when set, else the cluster's CPUs shared out, at most 8. A model's
    weights depend on it bit for bit (CPU matrix products split their work by thread)."""
    import ray

    if cfg.train.threads:
        return cfg.train.threads
    cpus = ray.cluster_resources().get("CPU", 1.0)
    n = max(1, cfg.train.num_workers if workers is None else workers)
    return max(1, min(math.floor(cpus / n), 8))


def worker_resources(tc: TrainConfig, use_gpu: bool) -> dict[str, float]:
    """One Train worker's resources: ``train.worker_cpus`` CPUs, ``train.worker_gpus`` of a
    GPU when training on GPUs, and the ``trainer`` label of ``cluster.yaml``'s GPU nodes when
    the cluster has them."""
    return ({"CPU": tc.worker_cpus} | ({"GPU": tc.worker_gpus} if use_gpu else {})
            | placement_resources(TRAINER))


@dataclasses.dataclass
class TrainResult:
    """The published final checkpoint and what rank 0 returned (metrics, probe outputs)."""

    final: Path
    worker_return: dict[str, Any] | None = None


RAY_DIR = "ray"
"""Ray Train's run name: its checkpoints live in ``<run_dir>/ray/checkpoint_*``."""


def scratch_root(run_dir: Path) -> Path:
    """Where Train workers stage checkpoints before Ray Train persists them."""
    return Path(run_dir) / "scratch"


def fit_trainer(trainer: Any) -> Any:
    """``trainer.fit()`` keeping our SIGINT handler (``cli.run_main``'s: "stopped", exit 130):
    Ray Train V2 installs its own in ``fit`` (abort, ``sys.exit(0)``, left installed), so a
    Ctrl-C while pretraining ended a study "failed", status 1, silent. Its (private) hook is
    skipped."""
    if threading.current_thread() is threading.main_thread():
        trainer._register_sigint_handler = lambda controller: None
        before = signal.getsignal(signal.SIGINT)
        try:
            return trainer.fit()
        finally:
            signal.signal(signal.SIGINT, before)
    return trainer.fit()


def train_with_ray(job: TrainJob, run_dir: Path, bar: Bar | None = None) -> TrainResult:
    """Fit ``job`` on a TorchTrainer and publish ``run_dir/final``.

    A re-run with the same ``run_dir`` resumes from the last checkpoint Ray Train kept there;
    a worker failure is retried ``train.max_failures`` times from the last checkpoint. Rank 0
    sends its progress to ``bar`` through a Ray queue (a zero-CPU actor).
    """
    import ray.train
    from ray.train.torch import TorchTrainer
    from ray.util.queue import Queue

    cfg = job.cfg
    tc = cfg.train
    use_gpu = gpus_available(tc.use_gpu)
    verify_dataset(job.dataset_dir)
    queue = Queue(actor_options={"num_cpus": 0}) if bar is not None else None
    resources = worker_resources(tc, use_gpu)
    trainer = TorchTrainer(
        train_worker,
        train_loop_config={"job": dataclasses.asdict(job), "threads": threads_per_worker(cfg),
                           "fault_epoch": fault_epoch_from_env(),
                           "run_dir": str(run_dir.resolve()), "progress": queue},
        scaling_config=ray.train.ScalingConfig(num_workers=tc.num_workers, use_gpu=use_gpu,
                                               resources_per_worker=resources),
        run_config=ray.train.RunConfig(
            name=RAY_DIR,
            storage_path=str(run_dir.resolve()),
            failure_config=ray.train.FailureConfig(max_failures=tc.max_failures),
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=2),
        ),
    )
    try:
        if queue is not None and bar is not None:
            with QueueDrain(queue, TrainBar(bar)):
                result = fit_trainer(trainer)
        else:
            result = fit_trainer(trainer)
    finally:  # workers remove their own scratch; this catches killed ones
        shutil.rmtree(scratch_root(run_dir), ignore_errors=True)
        if queue is not None:
            queue.shutdown()
    returned = result.return_value or {}
    if "diverged" in returned:
        raise TrainingDiverged(returned["diverged"])
    if result.checkpoint is None:
        raise ckpt.CheckpointError(f"training {run_dir} finished without a checkpoint")
    with result.checkpoint.as_directory() as d:
        final = publish_final(Path(d), run_dir / "final")
    return TrainResult(final, returned)


def train_local(job: TrainJob, run_dir: Path, bar: Bar | None = None) -> TrainResult:
    """Fit ``job`` in this process (no Ray); resumes from ``run_dir/local``."""
    ctx = LocalContext(job, run_dir)
    observers: list[StepObserver] = ([ProgressReporter(TrainBar(bar), job.cfg.train.epochs)]
                                     if bar is not None else [])
    run = start_tracking(job)
    if run is not None:
        observers.append(TrainTracker(run))
    try:
        metrics, model = fit(job, ctx, fault_epoch=fault_epoch_from_env(), observers=observers)
    finally:
        if run is not None:
            run.finish()
    last = ctx.resume_dir()
    if last is None:
        raise ckpt.CheckpointError(f"training {run_dir} finished without a checkpoint")
    final = publish_final(last, run_dir / "final")
    return TrainResult(final, {"metrics": metrics, "probe": probe_outputs(model, job),
                               "history": ctx.history})


def settle_final(final_dir: Path, job: TrainJob) -> bool:
    """Settle ``final_dir`` and say whether it now holds the finished model of exactly this
    job, with intact files. Not a pure check: a final checkpoint of this job whose files fail
    their checksums is republished from the run's newest intact checkpoint of the last epoch
    when there is one (logged); otherwise it is removed, and training resumes from the newest
    intact checkpoint.
    """
    try:
        meta = ckpt.read_meta(final_dir)
    except ckpt.CheckpointError:
        return False
    last = job.cfg.train.epochs - 1
    if (not is_current(meta, job.identity(), field="identity")[0]
            or int(meta.get("epoch", -1)) != last):
        return False
    try:
        ckpt.load_training_state(final_dir)
        return True
    except ckpt.CheckpointError as exc:
        log.warning("%s; looking for an intact copy", exc)
    run_dir = final_dir.parent
    candidates = sorted([*(run_dir / RAY_DIR).glob("checkpoint_*"),
                         *(run_dir / "local").glob("epoch-*")],
                        key=lambda p: p.stat().st_mtime, reverse=True)
    source = latest_intact(candidates, job)
    if source is not None and int(ckpt.read_meta(source)["epoch"]) == last:
        publish_final(source, final_dir)
        log.warning("%s: republished from the intact checkpoint %s", final_dir, source)
        return True
    shutil.rmtree(final_dir)
    log.warning("%s: removed; training resumes from the newest intact checkpoint", final_dir)
    return False


def plan_job(cfg: ExperimentConfig, kind: str, seed: int, dataset_dir: str | Path,
             checkpoints_root: str | Path | None = None) -> tuple[TrainJob, Path]:
    """The job for one model and its run directory ``<root>/<dataset>/<kind>-<id>-seed<k>``.

    Raises:
        CheckpointError: if the dataset's environment does not match ``cfg.env``.
    """
    dataset_dir = Path(dataset_dir).resolve()  # shipped to Train workers: must be absolute
    man = store.load_manifest(dataset_dir)
    ckpt.check_env({"spec": {"num_actions": man.env.num_actions, "state_dim": man.env.state_dim,
                             "max_len": man.env.horizon + 1}}, cfg.env, str(dataset_dir))
    cfg = resolve_config(cfg, dataset_dir)
    job = TrainJob(cfg.to_dict(), kind, str(dataset_dir),
                   man.split("train")["content_hash"], seed)
    root = Path(checkpoints_root or Path(cfg.out_dir) / "checkpoints").resolve()
    return job, root / dataset_dir.name / f"{kind}-{job.identity()[:8]}-seed{seed}"


def pretrain(cfg: ExperimentConfig, kind: str, seed: int, dataset_dir: str | Path,
             checkpoints_root: str | Path | None = None, console: Console = SILENT,
             label: str = "") -> Path:
    """Pretrain one model (skipped when its final checkpoint is current); returns ``final``.

    ``train.num_workers = 0`` runs the loop in this process without Ray; otherwise a
    TorchTrainer with that many workers (one GPU each with ``train.use_gpu``). An interrupted
    run resumes from its directory's last checkpoint.

    Args:
        console: shows a progress bar named ``label`` (steps, epoch, loss components, ETA)
            and a summary line.
    """
    job, run_dir = plan_job(cfg, kind, seed, dataset_dir, checkpoints_root)
    label = label or f"{kind} seed {seed}"
    final = run_dir / "final"
    if settle_final(final, job):
        log.info("%s: final checkpoint is current, skipped", final)
        console.line(f"  {label}: checkpoint is current, skipped")
        return final
    run_dir.mkdir(parents=True, exist_ok=True)
    job.cfg.write(run_dir)  # as trained: data-derived values filled in
    tc = job.cfg.train
    bar = console.bar(label, tc.epochs * steps_per_epoch(job.cfg), "step")
    try:
        result = (train_local(job, run_dir, bar) if not cfg.train.on_ray_train
                  else train_with_ray(job, run_dir, bar))
    except BaseException as exc:
        bar.abort(exc)
        raise
    metrics = (result.worker_return or {}).get("metrics", {})
    bar.close(f"{tc.epochs} epochs, {describe_loss(metrics, 'train_')}, val "
              f"{metrics.get('val_loss', float('nan')):.3f}" if metrics else "done")
    return result.final
