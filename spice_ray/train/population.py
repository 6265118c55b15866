"""Models of one architecture and one loss trained as one (``train.population``).

A study trains many small models of a handful of shapes: seeds, and the same SPICE on the
darkroom and the region darkroom. Alone, each step of such a model is a few hundred small kernel
launches, so a GPU sits mostly idle. Here the M models' parameters are stacked on a leading
model axis (``torch.func.stack_module_state``) and one step is ``torch.func.vmap`` of the loss
over that axis: every layer is one batched call for all M models (attention one call over
``[M*B, heads, T, d]``), so a step costs about what one model's step costs while the GPU is
launch-bound.

Each model keeps what it has alone (:func:`spice_ray.train.loop.fit`): its initial weights from
its seed, its own batches (its dataset, in the order its seed gives, :func:`epoch_order`), its
own AdamW state (AdamW is elementwise, so one optimiser over the stacked tensors is M
optimisers), its own gradient-norm clip, divergence check, validation loss and checkpoints, in
the platform's one format in its own run directory (``<run_dir>/local/epoch-*``). So a model
trained in a population resumes alone and the other way round, and nothing downstream changes.
What differs is rounding: the batched products and the plain attention (which vmap can batch;
``CausalSelfAttention.plain``) sum in another order than the alone path, so the weights agree
within a tolerance (tests), not bit for bit.

Nothing here needs Ray: the batches live on the training device for the whole run (no host
work per step), and the divergence check reads one flag per model at the end of each epoch
instead of syncing every step (a bad step's model stops updating at once; the epoch then
fails naming it and the step, and no checkpoint of it is written).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.func import functional_call, stack_module_state, vmap

from spice_ray.common.errors import SpiceRayError
from spice_ray.config import config_hash
from spice_ray.model import checkpoint as ckpt
from spice_ray.model.registry import build_model
from spice_ray.model.tokens import Tokens
from spice_ray.train.loop import (
    StepObserver,
    TrainingDiverged,
    TrainJob,
    _lr_lambda,
    latest_intact,
    make_optimizer,
    steps_per_epoch,
)
from spice_ray.train.losses import loss_for
from spice_ray.train.population_data import (
    TOKEN_FIELDS,
    epoch_order,
    load_all,
    population_batch,
)
from spice_ray.train.population_step import (
    Stepper,
    check_params_finite,
    save_all,
    stack_opt_state,
    validate,
)

log = logging.getLogger(__name__)

SHARED_TRAIN_FIELDS_SKIPPED = ("num_workers", "threads", "use_gpu", "worker_cpus", "worker_gpus",
                               "together", "population", "max_failures", "checkpoint_every",
                               "choose")
"""Train fields that may differ inside a population (how it runs, not what each model
learns)."""


class PopulationError(SpiceRayError, ValueError):
    """Models that cannot train as one population (names the field that differs)."""


def population_key(job: TrainJob) -> str:
    """What the models of one population share: kind, architecture, loss and schedule, and the
    shape of their tokens. Seeds and datasets may differ."""
    c = job.config
    env = job.cfg.env.environment()
    train = {k: v for k, v in c["train"].items() if k not in SHARED_TRAIN_FIELDS_SKIPPED}
    return config_hash({"kind": job.kind, "model": c["model"], "train": train,
                        "tokens": [env.state_dim, env.num_actions, job.cfg.env.horizon]})


def check_population(jobs: Sequence[TrainJob]) -> None:
    """Raise :class:`PopulationError` unless every job can train beside the first."""
    if not jobs:
        raise PopulationError("a population needs at least one model")
    first = jobs[0]
    for job in jobs[1:]:
        if population_key(job) == population_key(first):
            continue
        for section in ("model", "train"):
            for k, v in job.config[section].items():
                if k in SHARED_TRAIN_FIELDS_SKIPPED:
                    continue
                if first.config[section].get(k) != v:
                    raise PopulationError(
                        f"{job.kind} seed {job.seed} cannot train beside {first.kind} seed "
                        f"{first.seed}: {section}.{k} is {v!r} against "
                        f"{first.config[section].get(k)!r}")
        raise PopulationError(f"{job.kind} seed {job.seed} cannot train beside {first.kind} "
                              f"seed {first.seed}: the kind or the token shape differs")
    if float(first.cfg.model.dropout) > 0:
        raise PopulationError(f"model.dropout is {first.cfg.model.dropout}: a population "
                              "trains without dropout (its attention has none)")


class _LossOf(nn.Module):
    """A model and its kind's training loss as one module, so ``functional_call`` swaps the
    parameters for the whole loss (the anchor penalty reads them too)."""

    def __init__(self, model: nn.Module, kind: str, train_cfg: Any) -> None:
        super().__init__()
        self.m = model
        self.kind = kind
        self.train_cfg = train_cfg

    def forward(self, *fields_and_ids: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        *fields, ids = fields_and_ids
        tokens = Tokens(**dict(zip(TOKEN_FIELDS, fields, strict=True)))
        out = self.m(tokens)
        return loss_for(self.kind)(out, tokens, self.m, ids, self.train_cfg)


def functional_template(kind: str, cfg: Any) -> _LossOf:
    """The population's stateless template: the model's code with plain attention and the
    ensemble's layer-stack path (both batchable by vmap), on the meta device."""
    model = build_model(kind, cfg).to("meta")
    for mod in model.modules():
        if hasattr(mod, "plain"):
            mod.plain = True
        if hasattr(mod, "kernel") and hasattr(mod, "ensemble_size"):
            mod.kernel = "eager"
    return _LossOf(model, kind, cfg.train)


def _initial_model(job: TrainJob) -> nn.Module:
    """The model ``fit`` starts from: its weights from the job's seed."""
    torch_seed = int(np.random.SeedSequence([job.seed, 7]).generate_state(1)[0])
    return build_model(job.kind, job.cfg, generator=torch.Generator().manual_seed(torch_seed))


@dataclasses.dataclass
class PopulationResult:
    """What :func:`fit_population` did: each model's last metrics, the epoch it resumed at,
    and whether it stopped early at ``stop_after`` (resumable) instead of its last epoch."""

    metrics: list[dict[str, float]]
    start_epoch: int
    last_epoch: int
    stopped_early: bool
    steps_per_s: float


class Population:
    """M models of one kind and config as stacked weights, their one AdamW, and one training
    step for all of them (:meth:`step`).

    Args:
        kind, cfg: the models' kind and config (the first job's: they share both).
        models: the M models, initialised or loaded (their weights are copied in).
        device: where the stacked weights live and the steps run.
    """

    def __init__(self, kind: str, cfg: Any, models: Sequence[nn.Module],
                 device: torch.device) -> None:
        self.kind, self.cfg, self.device = kind, cfg, device
        tc = cfg.train
        self.M = len(models)
        self.names = [n for n, p in models[0].named_parameters() if p.requires_grad]
        params, buffers = stack_module_state([m.to(device) for m in models])
        self.params = {n: v.detach().requires_grad_(n in self.names) for n, v in params.items()}
        self.buffers = buffers
        self.trainable = [self.params[n] for n in self.names]
        self.optimizer = make_optimizer(self.trainable, tc)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, _lr_lambda(tc.epochs * steps_per_epoch(cfg), tc.cosine_schedule))
        self.template = functional_template(kind, cfg)
        self._p = {f"m.{k}": v for k, v in self.params.items()}
        self._b = {f"m.{k}": v for k, v in self.buffers.items()}
        template = self.template

        def one_loss(p: dict[str, Tensor], b: dict[str, Tensor], *batch: Tensor):
            return functional_call(template, (p, b), batch)

        self._loss = vmap(one_loss)
        # no autocast weight cache: a captured step (CUDA graph) must not keep one across
        # replays, and each stacked weight is cast once per step anyway
        self.autocast = dict(device_type=device.type, dtype=torch.bfloat16,
                             enabled=device.type == "cuda", cache_enabled=False)
        self.first_bad = torch.full((self.M,), -1, dtype=torch.long, device=device)
        self.step_t = torch.zeros((), dtype=torch.long, device=device)
        """The global step of the last update, on the device (a captured step counts it)."""

    def load_optimizer(self, states: list[dict[str, Any]], scheduler: dict[str, Any]) -> None:
        """The models' own AdamW states (as ``fit`` saves them) into the stacked one."""
        stack_opt_state(states, self.optimizer, self.names, self.params)
        self.scheduler.load_state_dict(scheduler)

    def update(self, fields: Sequence[Tensor], ids: Tensor
               ) -> tuple[Tensor, dict[str, Tensor], Tensor]:
        """One optimiser step of every model on its own batch (token fields [M, B, ...] in
        :data:`TOKEN_FIELDS` order, task ids [M, B]), without the learning-rate schedule;
        returns (losses [M], detached loss components [M] each, gradient norms [M]). Only
        device work: no host sync and no host state, so a CUDA graph can capture it."""
        self.step_t.add_(1)
        with torch.autocast(**self.autocast):
            loss, parts = self._loss(self._p, self._b, *fields, ids)
        self.optimizer.zero_grad(set_to_none=True)
        loss.sum().backward()
        norm = _clip_per_model(self.trainable, self.cfg.train.grad_clip, loss, self.first_bad,
                               self.step_t)
        self.optimizer.step()
        return loss.detach(), {k: v.detach() for k, v in parts.items()}, norm

    def step(self, fields: Sequence[Tensor], ids: Tensor
             ) -> tuple[Tensor, dict[str, Tensor], Tensor]:
        """:meth:`update`, then the learning-rate schedule's step."""
        out = self.update(fields, ids)
        self.scheduler.step()
        return out

    def model_state(self, m: int) -> dict[str, Tensor]:
        """Model ``m``'s ``state_dict``."""
        return ({k: v[m].detach() for k, v in self.params.items()}
                | {k: v[m].detach() for k, v in self.buffers.items()})


def fit_population(jobs: Sequence[TrainJob], run_dirs: Sequence[Path],
                   device: str | torch.device = "cpu", stop_after: float | None = None,
                   observers: Sequence[StepObserver] = (),
                   clock=time.perf_counter, graph: bool | None = None) -> PopulationResult:
    """Pretrain ``jobs`` as one population, each into its run directory's ``local/``.

    Resumes from the newest epoch that every model has an intact checkpoint of (or from the
    start). ``stop_after`` (seconds): after the first epoch that ends past it, write every
    model's checkpoint of that epoch and return (a later call resumes there). ``graph``:
    capture the step as a CUDA graph (:class:`Stepper`); ``None`` does so on a GPU when the
    learning rate is constant (a cosine rate would be a constant in the graph).

    Raises:
        PopulationError: the jobs cannot train as one (names the field), or ``graph`` is asked
            for with ``train.cosine_schedule`` on.
        TrainingDiverged: naming each model whose loss or gradient norm became non-finite,
            with its step; no checkpoint of that epoch is written.
    """
    return _drive([_training(jobs, run_dirs, device, stop_after, observers, clock, graph)])[0]


def fit_populations(groups: Sequence[tuple[Sequence[TrainJob], Sequence[Path]]],
                    device: str | torch.device = "cpu", stop_after: float | None = None,
                    clock=time.perf_counter, graph: bool | None = None
                    ) -> list[PopulationResult]:
    """Several populations (each ``(jobs, run_dirs)``) trained in this one process, their
    steps taken in turn: one step of each, then the next. Each trains exactly as
    :func:`fit_population` trains it alone (the populations share nothing but the device),
    but on a GPU their captured steps queue back to back from one process, where populations
    in separate processes time-slice the GPU (three processes of captured darkroom steps ran
    at about what one population alone runs). Same errors as :func:`fit_population`."""
    return _drive([_training(jobs, dirs, device, stop_after, (), clock, graph)
                   for jobs, dirs in groups])


def _drive(trainings: list) -> list[PopulationResult]:
    """Run the generators of :func:`_training` in turn, one step each, to their ends."""
    results: list[Any] = [None] * len(trainings)
    live = list(range(len(trainings)))
    while live:
        for i in list(live):
            try:
                next(trainings[i])
            except StopIteration as done:
                results[i] = done.value
                live.remove(i)
    return results


def _training(jobs: Sequence[TrainJob], run_dirs: Sequence[Path], device: str | torch.device,
              stop_after: float | None, observers: Sequence[StepObserver], clock,
              graph: bool | None):
    """:func:`fit_population` as a generator that yields after every training step and
    returns its :class:`PopulationResult`."""
    check_population(jobs)
    device = torch.device(device)
    t_start = clock()
    cfg = jobs[0].cfg
    tc = cfg.train
    M, B = len(jobs), tc.batch_size
    per_epoch = steps_per_epoch(cfg)
    models = [_initial_model(job) for job in jobs]
    start_epoch, opt_states, sched_state = _resume(jobs, run_dirs, models)
    if graph and tc.cosine_schedule:
        raise PopulationError("train.cosine_schedule is on: a captured step (graph) keeps the "
                              "learning rate constant; train this population without one")
    if graph is None:
        graph = device.type == "cuda" and not tc.cosine_schedule
    pop = Population(jobs[0].kind, cfg, models, device)
    if opt_states is not None:
        pop.load_optimizer(opt_states, sched_state)
    pop.step_t.fill_(start_epoch * per_epoch)
    train = load_all(jobs, "train", device)
    rows = {job.dataset_dir: train[job.dataset_dir].num_rows for job in jobs}
    if len(set(rows.values())) > 1:  # a population steps together: equal epochs
        raise PopulationError("the models' training splits differ in size: "
                              + ", ".join(f"{d} {n} rows" for d, n in rows.items()))
    val = load_all(jobs, "validation", device)
    stepper = Stepper(pop, lambda idx: population_batch(jobs, train, idx), graph)
    metrics: list[dict[str, float]] = [{} for _ in jobs]
    steps_done, t_steps = 0, 0.0
    epoch = start_epoch - 1
    stopped = False
    for epoch in range(start_epoch, tc.epochs):
        t0 = clock()
        order = torch.as_tensor(np.stack([
            epoch_order(train[job.dataset_dir].chunk_rows, B,
                        np.random.default_rng([job.seed, epoch]),
                        train[job.dataset_dir].num_rows)
            for job in jobs]), device=device)  # (M, steps, B)
        stepper.reset_sums()
        for step in range(order.shape[1]):
            stepper.run(order[:, step])
            yield
            for obs in observers:
                obs.step(epoch * per_epoch + step + 1, tc.epochs * per_epoch, epoch,
                         {k: v[0] for k, v in stepper.parts.items()}
                         | {"grad_norm": stepper.norm[0]})
        sums = stepper.sums or {}
        steps = order.shape[1]
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        elapsed = clock() - t0
        steps_done += steps
        t_steps += elapsed
        bad = pop.first_bad.tolist()
        if any(s >= 0 for s in bad):
            raise TrainingDiverged("training diverged: " + "; ".join(
                f"{job.kind} seed {job.seed} at step {s} (epoch {epoch + 1}/{tc.epochs}): its "
                "loss or gradient norm was not finite" for job, s in zip(jobs, bad, strict=True)
                if s >= 0))
        check_params_finite(pop.params, jobs, epoch)
        val_parts = validate(pop, jobs, val, B)
        last = epoch == tc.epochs - 1
        stopped = (stop_after is not None and not last and clock() - t_start > stop_after)
        train_means = {k: (v / max(1, steps)).tolist() for k, v in sums.items()}
        for m, job in enumerate(jobs):
            mets = {f"train_{k}": v[m] for k, v in train_means.items()}
            mets |= {f"val_{k}": v[m] for k, v in val_parts.items()}
            nonfinite = sorted(k for k, v in mets.items() if not math.isfinite(v))
            if nonfinite:
                raise TrainingDiverged(f"training diverged at {job.kind} seed {job.seed} epoch "
                                       f"{epoch + 1}/{tc.epochs}: {', '.join(nonfinite)} not "
                                       "finite")
            mets |= {"epoch": float(epoch), "samples_per_s": steps * B / elapsed,
                     "lr": float(pop.scheduler.get_last_lr()[0])}
            metrics[m] = mets
        for obs in observers:
            obs.epoch(epoch, metrics[0])
        if last or stopped or (epoch + 1) % tc.checkpoint_every == 0:
            save_all(pop, jobs, run_dirs, models, epoch, metrics)
        log.info("population of %d (%s): epoch %d/%d, %.0f model-steps/s, val loss %s",
                 M, jobs[0].kind, epoch + 1, tc.epochs, M * steps / elapsed,
                 ", ".join(f"{m['val_loss']:.4f}" for m in metrics))
        if stopped:
            break
    return PopulationResult(metrics, start_epoch, epoch, stopped,
                            steps_done / t_steps if t_steps else 0.0)


def _clip_per_model(grads_of: list[Tensor], clip: float, loss: Tensor, first_bad: Tensor,
                    step: Tensor) -> Tensor:
    """Each model's gradient norm [M]; clips each model's gradients to ``clip`` (0: measure
    only) as ``clip_grad_norm_`` does alone, and zeroes the gradients of a model whose loss or
    norm is not finite, recording the step in ``first_bad`` (no host sync)."""
    grads = [p.grad for p in grads_of]
    M = loss.shape[0]
    sq = torch.stack([g.detach().float().pow(2).reshape(M, -1).sum(1) for g in grads]).sum(0)
    norm = sq.sqrt()  # (M,)
    bad = ~torch.isfinite(norm) | ~torch.isfinite(loss.detach().float())
    first_bad.copy_(torch.where(bad & (first_bad < 0), step, first_bad))
    coef = (clip / (norm + 1e-6)).clamp(max=1.0) if clip > 0 else torch.ones_like(norm)
    coef = torch.where(bad, 0.0, coef)
    for g in grads:
        shape = (M,) + (1,) * (g.dim() - 1)
        g.copy_(torch.where(bad.view(shape), 0.0, g * coef.view(shape).to(g.dtype)))
    return norm


def resume_epoch(jobs: Sequence[TrainJob], run_dirs: Sequence[Path]) -> int:
    """The epoch :func:`fit_population` would start these models at (0: from scratch)."""
    return _start(_resumable(jobs, run_dirs))


def _start(found: list[dict[int, Path]]) -> int:
    """The epoch to start at: after the newest one every model can resume from (0: none)."""
    common = set(found[0]).intersection(*found[1:]) if found else set()
    return max(common) + 1 if common else 0


def _resumable(jobs: Sequence[TrainJob], run_dirs: Sequence[Path]) -> list[dict[int, Path]]:
    """Per model, its intact checkpoints that a training can resume from (with their
    optimiser state: a weights-only one scores and settles as a final, but cannot resume), by
    epoch."""
    found: list[dict[int, Path]] = []
    for job, run_dir in zip(jobs, run_dirs, strict=True):
        mine: dict[int, Path] = {}
        for path in sorted((Path(run_dir) / "local").glob("epoch-*"), reverse=True):
            if latest_intact([path], job) is not None:
                meta = ckpt.read_meta(path)
                if ckpt.OPTIMIZER in meta["files"]:
                    mine[int(meta["epoch"])] = path
        found.append(mine)
    return found


def _resume(jobs: Sequence[TrainJob], run_dirs: Sequence[Path], models: list[nn.Module]
            ) -> tuple[int, list[dict[str, Any]] | None, dict[str, Any] | None]:
    """Load the newest epoch every model has a resumable checkpoint of into ``models``;
    returns (the epoch to start at, the models' optimiser states, the scheduler's state)."""
    found = _resumable(jobs, run_dirs)
    start = _start(found)
    if not start:
        return 0, None, None
    epoch = start - 1
    opt_states, sched = [], None
    for model, mine in zip(models, found, strict=True):
        _, weights, opt = ckpt.load_training_state(mine[epoch])
        model.load_state_dict(weights)
        opt_states.append(opt["optimizer"])
        sched = opt["scheduler"]
    log.info("population resumes after epoch %d from %s", epoch + 1,
             ", ".join(str(found[i][epoch]) for i in range(len(jobs))))
    return epoch + 1, opt_states, sched
