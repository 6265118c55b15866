"""The training loop, shared by Ray Train workers and the plain in-process debug path.

``fit(job, ctx)`` owns the optimisation (model init from the seed, AdamW, optional cosine
schedule, gradient clipping, bf16 autocast on GPU, validation loss each epoch, checkpoints every
N epochs and at the end, resume from the last checkpoint). Everything that differs between a Ray
Train worker and a plain process -- where batches come from, how a model is wrapped, how metrics
and checkpoints are reported, where a resume checkpoint is found -- sits behind
:class:`LoopContext`.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import shutil
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor, nn

from spice_ray.common.artifacts import publish_dir
from spice_ray.common.errors import SpiceRayError
from spice_ray.common.faults import fault
from spice_ray.config import (
    ExperimentConfig,
    TrainConfig,
    config_hash,
    from_dict,
    without_later_defaults,
)
from spice_ray.data import store
from spice_ray.model import checkpoint as ckpt
from spice_ray.model.registry import build_model
from spice_ray.model.tokens import Tokens, make_tokens
from spice_ray.model.trunk import TrunkModel
from spice_ray.train.losses import IGNORED_FIELDS, loss_for
from spice_ray.train.stream import shard_batches, val_shard_batches

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class TrainJob:
    """One model to pretrain: plain values so it ships to Ray workers as a dict."""

    config: dict[str, Any]
    kind: str
    dataset_dir: str
    dataset_hash: str
    seed: int

    @property
    def cfg(self) -> ExperimentConfig:
        return from_dict(self.config)

    def identity(self) -> str:
        """Hash of everything that determines what the model learns; not how the steps are
        computed (workers, threads, device), which changes the weights only in rounding.

        Under a constant learning rate (no cosine schedule) the number of epochs is left out
        too: epoch e's weights are then the same whatever the last epoch is (batches are keyed
        by (seed, epoch)), so a longer training resumes from a shorter one's checkpoints (the
        scaling ladder's rungs) and ``settle_final`` still tells them apart by epoch. The
        train fields the kind's loss does not read (``losses.IGNORED_FIELDS``: DPT's, the value
        losses' later fields) are left out as well, so a variant of SPICE's value loss shares
        the DPT models of its experiment."""
        c = self.config
        skip = {"num_workers", "threads", "use_gpu", "worker_cpus", "worker_gpus", "together",
                "population", "max_failures", "checkpoint_every", "choose"}
        if not c["train"].get("cosine_schedule", False):
            skip.add("epochs")
        if not c["model"].get("var_head", False):
            skip.add("lambda_var")  # read only by the variance head's loss
        skip |= IGNORED_FIELDS.get(self.kind, frozenset())  # fields its loss does not read
        return config_hash({"kind": self.kind, "seed": self.seed, "data": self.dataset_hash,
                            "env": c["env"], "model": without_later_defaults("model", c["model"]),
                            "train": without_later_defaults("train", {
                                k: v for k, v in c["train"].items() if k not in skip})})


def steps_per_epoch(cfg: ExperimentConfig) -> int:
    """Optimiser steps per epoch, whatever the number of workers (each takes its share of a
    ``train.batch_size`` batch)."""
    return max(1, cfg.data.num_train_tasks // cfg.train.batch_size)


class TrainingDiverged(SpiceRayError, RuntimeError):
    """A loss, gradient norm or parameter became NaN or infinite; training stopped before the
    bad update, and no checkpoint of it is kept or marked final."""


def check_step_finite(loss: Tensor, grad_norm: Tensor, where: str,
                      components: Mapping[str, Tensor] | None = None, sync: bool = True
                      ) -> None:
    """Raise :class:`TrainingDiverged` if the loss or the gradient norm is not finite.

    One host sync per step. Under DDP (``sync`` and a process group) every rank takes the same
    decision (the flag is all-reduced), so no rank is left waiting in a collective; workers
    that each train their own model pass ``sync=False``.
    """
    bad = (~torch.isfinite(loss.detach().float()) | ~torch.isfinite(grad_norm.float())).float()
    if sync and torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.all_reduce(bad, op=torch.distributed.ReduceOp.MAX)
    if bad.item() > 0:
        parts = f" ({_fmt(components)})" if components else ""
        raise TrainingDiverged(f"training diverged at {where}: loss {float(loss.detach()):.4g}"
                               f"{parts}, "
                               f"gradient norm {float(grad_norm):.4g}; the update was not "
                               "applied")


def check_params_finite(model: nn.Module, where: str) -> None:
    """Raise :class:`TrainingDiverged` naming the first parameter with a non-finite value."""
    for name, p in model.named_parameters():
        if not torch.isfinite(p.detach()).all():
            raise TrainingDiverged(f"training diverged at {where}: parameter {name} is not "
                                   "finite")


class LoopContext(Protocol):
    """What the loop needs from its surroundings."""

    world_size: int
    rank: int
    device: torch.device

    def train_batches(self, epoch: int, batch_size: int) -> Iterator[dict[str, Any]]: ...

    def val_batches(self, batch_size: int) -> Iterator[dict[str, Any]]: ...

    def prepare(self, model: nn.Module) -> nn.Module: ...

    def resume_dir(self) -> Path | None: ...

    def scratch_dir(self) -> Path: ...

    def report(self, metrics: dict[str, float], checkpoint_dir: Path | None) -> None: ...


class StepObserver(Protocol):
    """Watches training on rank 0: progress displays and experiment trackers."""

    def step(self, step: int, total: int, epoch: int, components: Mapping[str, Tensor]
             ) -> None:
        """After optimiser step ``step`` (1-based, over all epochs) of ``total``."""

    def epoch(self, epoch: int, metrics: Mapping[str, float]) -> None:
        """After epoch ``epoch`` (0-based) with its train/val metrics."""


def unwrap(model: nn.Module) -> TrunkModel:
    """The TrunkModel inside a DDP wrapper (or the model itself)."""
    return model.module if hasattr(model, "module") else model  # type: ignore[return-value]


def compute_loss(model: nn.Module, batch: dict[str, Any], job_kind: str, cfg: ExperimentConfig,
                 device: torch.device) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Forward one batch and return (loss, detached components)."""
    tokens = make_tokens(batch, cfg.env, device=device)
    with torch.autocast(device_type=device.type, dtype=torch.bfloat16,
                        enabled=device.type == "cuda"):
        out = model(tokens)
        ids = batch["task_id"]  # a tensor from the stream; numpy (read-only) is copied
        ids = ids.to(device) if isinstance(ids, Tensor) else torch.tensor(ids, device=device)
        if cfg.train.value_target == "mean":
            tokens = expected_reward_tokens(tokens, batch)
        return loss_for(job_kind)(out, tokens, unwrap(model), ids, cfg.train)


def expected_reward_tokens(tokens: Tokens, batch: Mapping[str, Any]) -> Tokens:
    """``tokens`` with each context reward replaced by its arm's expected reward mu_{a_t}
    (the batch's ``means``: a stateless bandit's tasks), for the losses of
    ``train.value_target="mean"``; the model's forward has already read the sampled ones."""
    means = torch.as_tensor(np.asarray(batch["means"]), dtype=tokens.rewards.dtype,
                            device=tokens.rewards.device)
    return dataclasses.replace(tokens, rewards=means.gather(1, tokens.actions))


def make_optimizer(params: Iterable[nn.Parameter], tc: TrainConfig) -> torch.optim.AdamW:
    """AdamW with the job's learning rate and weight decay, as one fused kernel per step.

    ``fused=True`` updates every parameter in one pass (CPU and CUDA): the same update as the
    per-parameter loop up to rounding, 6x cheaper (0.2 vs 1.2 ms a step at the small config on
    one CPU thread, 2% of a darkroom SPICE step). Deterministic like the loop.
    """
    return torch.optim.AdamW(params, lr=tc.lr, weight_decay=tc.weight_decay, fused=True)


def optimiser_step(loss: Tensor, optimizer: torch.optim.Optimizer, params: Sequence[Tensor],
                   grad_clip: float, where: str, components: Mapping[str, Tensor] | None = None,
                   sync: bool = False) -> Tensor:
    """One update from ``loss``, as :func:`fit` makes it and the benchmarks and the dry run's
    step timer measure it: zero the gradients, backward, clip their norm to ``grad_clip`` (0:
    the norm is only measured), :func:`check_step_finite` (one host sync; ``sync``: all-reduced
    across data-parallel ranks), then the optimiser's step. Returns the gradient norm."""
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if grad_clip > 0:
        norm = torch.nn.utils.clip_grad_norm_(params, grad_clip)
    else:
        norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
    check_step_finite(loss, norm, where, components, sync=sync)
    optimizer.step()
    return norm


def _lr_lambda(total_steps: int, cosine: bool):
    def f(step: int) -> float:
        if not cosine:
            return 1.0
        return 0.5 * (1.0 + math.cos(math.pi * min(step, total_steps) / max(1, total_steps)))
    return f


def _fmt(comp: Mapping[str, Tensor]) -> str:
    return ", ".join(f"{k} {float(v):.4g}" for k, v in comp.items())


def _mean(parts: list[dict[str, torch.Tensor]]) -> dict[str, float]:
    if not parts:
        return {}
    return {k: float(torch.stack([p[k].float() for p in parts]).mean()) for k in parts[0]}


def fit(job: TrainJob, ctx: LoopContext, fault_epoch: int = -1,
        observers: Sequence[StepObserver] = ()) -> tuple[dict[str, float], TrunkModel]:
    """Pretrain ``job`` to its last epoch.

    Args:
        fault_epoch: test switch: raise once at the end of this epoch when not resuming.
        observers: told of every step and epoch (pass them on rank 0 only).

    Returns:
        (the last epoch's metrics plus ``start_epoch``, the trained model).
    """
    cfg = job.cfg
    tc = cfg.train
    torch_seed = int(np.random.SeedSequence([job.seed, 7]).generate_state(1)[0])
    model: nn.Module = build_model(job.kind, cfg,
                                        generator=torch.Generator().manual_seed(torch_seed))
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = make_optimizer(params, tc)
    per_worker = max(1, tc.batch_size // ctx.world_size)
    per_epoch = steps_per_epoch(cfg)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, _lr_lambda(tc.epochs * per_epoch, tc.cosine_schedule))
    start_epoch = 0
    resume = ctx.resume_dir()
    if resume is not None:
        meta, weights, opt_state = ckpt.load_training_state(resume)
        if meta.get("identity") not in (None, job.identity()):
            raise ckpt.CheckpointError(f"resume checkpoint {resume} belongs to another job")
        model.load_state_dict(weights)
        if opt_state is not None:
            optimizer.load_state_dict(opt_state["optimizer"])
            scheduler.load_state_dict(opt_state["scheduler"])
        start_epoch = int(meta["epoch"]) + 1
        log.info("resuming %s seed %d from %s (epoch %d)", job.kind, job.seed, resume,
                 start_epoch)
    model = ctx.prepare(model.to(ctx.device))
    metrics: dict[str, float] = {}
    for epoch in range(start_epoch, tc.epochs):
        model.train()
        where = f"{job.kind} seed {job.seed} epoch {epoch + 1}/{tc.epochs}"
        t0 = time.perf_counter()
        parts, seen = [], 0
        for step, batch in enumerate(ctx.train_batches(epoch, per_worker)):
            loss, comp = compute_loss(model, batch, job.kind, cfg, ctx.device)
            norm = optimiser_step(loss, optimizer, params, tc.grad_clip,
                                  f"{where} step {step + 1}", comp, sync=ctx.world_size > 1)
            scheduler.step()
            parts.append(comp)
            seen += len(batch["label"])
            for obs in observers:
                obs.step(epoch * per_epoch + step + 1, tc.epochs * per_epoch, epoch,
                         comp | {"grad_norm": norm.detach(),
                                 "lr": torch.tensor(scheduler.get_last_lr()[0])})
        if epoch == fault_epoch and resume is None:
            raise RuntimeError(f"injected training fault (train_epoch={fault_epoch})")
        elapsed = time.perf_counter() - t0
        model.eval()
        with torch.no_grad():
            val = _mean([compute_loss(model, b, job.kind, cfg, ctx.device)[1]
                         for b in ctx.val_batches(per_worker)])
        check_params_finite(model, f"{where}, after its last step")
        metrics = {f"train_{k}": v for k, v in _mean(parts).items()}
        metrics |= {f"val_{k}": v for k, v in val.items()}
        bad = sorted(k for k, v in metrics.items() if not math.isfinite(v))
        if bad:
            raise TrainingDiverged(f"training diverged at {where}: {', '.join(bad)} not finite")
        metrics |= {"epoch": float(epoch), "samples_per_s": seen * ctx.world_size / elapsed,
                    "lr": float(scheduler.get_last_lr()[0])}
        last = epoch == tc.epochs - 1
        ckpt_dir = None
        if ctx.rank == 0 and (last or (epoch + 1) % tc.checkpoint_every == 0):
            ckpt_dir = ctx.scratch_dir() / f"epoch-{epoch:04d}"
            ckpt.save_checkpoint(
                ckpt_dir, unwrap(model), cfg, job.dataset_hash, epoch, metrics,
                optimizer_state={"optimizer": optimizer.state_dict(),
                                 "scheduler": scheduler.state_dict()},
                extra={"identity": job.identity(), "seed": job.seed})
        ctx.report(metrics, ckpt_dir)
        for obs in observers:
            obs.epoch(epoch, metrics)
        log.info("%s seed %d epoch %d/%d loss %.4f val %.4f %.0f samples/s", job.kind,
                 job.seed, epoch + 1, tc.epochs, metrics.get("train_loss", float("nan")),
                 metrics.get("val_loss", float("nan")), metrics["samples_per_s"])
    return metrics | {"start_epoch": float(start_epoch)}, unwrap(model)


def fault_epoch_from_env() -> int:
    """The injected fault's epoch (``spice_ray.common.faults``, point ``train_epoch``), -1 when
    none."""
    return int(fault("train_epoch", -1))


class LocalContext:
    """Plain single-process loop (no Ray): for debugging and ``train.num_workers = 0``."""

    world_size = 1
    rank = 0
    verify_shards = True
    """Check the shards' checksums each epoch before reading them (in a Train worker the
    driver checked them before the job)."""

    def __init__(self, job: TrainJob, run_dir: Path, device: str = "cpu") -> None:
        self.job = job
        self.run_dir = Path(run_dir)
        self.device = torch.device(device)
        self.history: list[dict[str, float]] = []

    def train_batches(self, epoch: int, batch_size: int) -> Iterator[dict[str, Any]]:
        # a Train worker's stream (one worker of one), so where a model trains does not
        # change what it learns
        if self.verify_shards:
            store.split_files(self.job.dataset_dir, "train", verify=True)
        return shard_batches(self.job, epoch, batch_size, 0, 1)

    def val_batches(self, batch_size: int) -> Iterator[dict[str, Any]]:
        return val_shard_batches(self.job, batch_size, verify=self.verify_shards)

    def prepare(self, model: nn.Module) -> nn.Module:
        return model

    def scratch_dir(self) -> Path:
        return self.run_dir / "local"

    def resume_dir(self) -> Path | None:
        return latest_intact(sorted(self.scratch_dir().glob("epoch-*"), reverse=True),
                             self.job)

    def report(self, metrics: dict[str, float], checkpoint_dir: Path | None) -> None:
        self.history.append(metrics)


def latest_intact(candidates: Iterable[Path], job: TrainJob | None = None) -> Path | None:
    """The first checkpoint in ``candidates`` (newest first) whose files pass their checksums
    and, when ``job`` is given, that belongs to it: its training identity, at an epoch no later
    than the job's last (a shorter training of the same identity must not resume from a longer
    one's checkpoints). Unusable ones are logged and skipped.
    """
    for path in candidates:
        try:
            meta, _, _ = ckpt.load_training_state(path)
        except ckpt.CheckpointError as exc:
            log.warning("skipping unusable checkpoint %s: %s", path, exc)
            continue
        if job is not None and meta.get("identity") not in (None, job.identity()):
            log.warning("skipping checkpoint %s: it belongs to another job", path)
            continue
        if job is not None and int(meta.get("epoch", -1)) >= job.cfg.train.epochs:
            log.info("skipping checkpoint %s: epoch %s is past this training's last",
                     path, meta.get("epoch"))
            continue
        return path
    return None


def publish_final(src: Path, final_dir: Path) -> Path:
    """Copy the last checkpoint to the run's ``final`` directory (atomically)."""
    return publish_dir(final_dir, lambda tmp: shutil.copytree(src, tmp, dirs_exist_ok=True))
