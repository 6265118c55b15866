"""The parts of a population's training around its update (``spice_ray.train.population``):
the step as a CUDA graph (:class:`Stepper`), each model's slice of the stacked AdamW state
(read for its checkpoint, written back on resume), the finiteness check of the stacked
weights, the validation loss per model and the checkpoints in the platform's one format."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn
from torch.func import functional_call

from spice_ray.model import checkpoint as ckpt
from spice_ray.train.loop import TrainingDiverged, TrainJob
from spice_ray.train.population_data import Split

if TYPE_CHECKING:
    from spice_ray.train.population import Population


def model_opt_state(optimizer: torch.optim.Optimizer, names: list[str],
                     stacked: Mapping[str, Tensor], m: int) -> dict[str, Any]:
    """Model ``m``'s slice of the stacked AdamW state, as its own AdamW's ``state_dict``
    (parameters numbered in ``names`` order, as ``fit``'s optimiser numbers them)."""
    full = optimizer.state_dict()
    group = {k: v for k, v in full["param_groups"][0].items() if k != "params"}
    group["capturable"] = False  # as ``fit`` makes it (a captured step sets it on)
    state = {}
    for i, name in enumerate(names):
        s = optimizer.state.get(stacked[name])
        if not s:
            continue
        state[i] = {k: (v[m].detach().clone() if k != "step" else v.detach().clone())
                    for k, v in s.items()}
    return {"state": state, "param_groups": [{**group, "params": list(range(len(names)))}]}


def stack_opt_state(states: list[dict[str, Any]], optimizer: torch.optim.Optimizer,
                     names: list[str], stacked: Mapping[str, Tensor]) -> None:
    """Load M models' own AdamW states into the stacked optimiser."""
    first = states[0]
    if any(len(s["state"]) != len(first["state"]) for s in states):
        raise ckpt.CheckpointError("the models' optimiser states differ in size: they did not "
                                   "stop at the same step")
    params = [stacked[n] for n in names]
    full = {"state": {}, "param_groups": [{**{k: v for k, v in
                                              first["param_groups"][0].items()
                                              if k != "params"},
                                           "params": list(range(len(params)))}]}
    for i in first["state"]:
        full["state"][i] = {k: (torch.stack([s["state"][i][k] for s in states])
                                if k != "step" else first["state"][i][k])
                            for k in first["state"][i]}
    optimizer.load_state_dict(full)


class Stepper:
    """Steps a population on batches gathered by row index, eagerly or as one CUDA graph.

    ``run(rows)`` copies the [M, B] row indices into a fixed device buffer, then runs one
    training step from it: the batch gather, :meth:`Population.update` and the sums of the
    loss components. With ``graph`` (CUDA only), the first :data:`WARMUP` steps run eagerly
    on a side stream (as CUDA graph capture wants: the libraries' lazy set-up happens there),
    the next is captured once and replayed for every later step, so a step costs one launch
    instead of a few thousand: at these model sizes the GPU is bound by launches, not
    arithmetic. The graph replays exactly the kernels of the eager step on the same buffers,
    so both paths do the same arithmetic. The learning-rate schedule steps on the host
    after each update (a constant rate is a constant in the graph; see :func:`fit_population`).
    """

    WARMUP = 3

    def __init__(self, pop: Population, batch_of, graph: bool = False) -> None:
        self.pop, self.batch_of = pop, batch_of
        self.graph = graph and pop.device.type == "cuda"
        self.idx = torch.zeros((pop.M, pop.cfg.train.batch_size), dtype=torch.long,
                               device=pop.device)
        self.sums: dict[str, Tensor] | None = None
        self.norm: Tensor | None = None
        self.parts: dict[str, Tensor] = {}
        self._graph: Any = None
        self._warm = 0

    def _body(self) -> None:
        fields, ids = self.batch_of(self.idx)
        _, parts, norm = self.pop.update(fields, ids)
        if self.sums is None:
            self.sums = {k: torch.zeros_like(v, dtype=torch.float32) for k, v in parts.items()}
        for k, v in parts.items():
            self.sums[k].add_(v.float())
        self.parts, self.norm = parts, norm

    def reset_sums(self) -> None:
        for v in (self.sums or {}).values():
            v.zero_()

    def run(self, rows: Tensor) -> None:
        self.idx.copy_(rows)
        if not self.graph:
            self._body()
        elif self._graph is not None:
            self._graph.replay()
        elif self._warm < self.WARMUP:
            side = torch.cuda.Stream(self.pop.device)
            side.wait_stream(torch.cuda.current_stream(self.pop.device))
            with torch.cuda.stream(side):
                self._body()
            torch.cuda.current_stream(self.pop.device).wait_stream(side)
            self._warm += 1
        else:
            for group in self.pop.optimizer.param_groups:
                group["capturable"] = True  # AdamW's check; fused AdamW is capturable as is
            self.pop.optimizer.zero_grad(set_to_none=True)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                self._body()
            self._graph = graph
            graph.replay()  # capture records the step without running it
        self.pop.scheduler.step()


@torch.no_grad()
def check_params_finite(params: Mapping[str, Tensor], jobs: Sequence[TrainJob], epoch: int
                         ) -> None:
    """Raise :class:`TrainingDiverged` naming the first model and parameter that is not
    finite."""
    M = len(jobs)
    ok = torch.stack([torch.isfinite(p).reshape(M, -1).all(1) for p in params.values()])
    if bool(ok.all()):
        return
    for m, job in enumerate(jobs):
        for (name, _), good in zip(params.items(), ok[:, m].tolist(), strict=True):
            if not good:
                raise TrainingDiverged(f"training diverged at {job.kind} seed {job.seed} "
                                       f"epoch {epoch + 1}: parameter {name} is not finite")


@torch.no_grad()
def validate(pop: Population, jobs: Sequence[TrainJob], val: Mapping[str, Split],
              batch_size: int) -> dict[str, list[float]]:
    """Each model's mean loss components over its validation split in file order, in batches
    of ``batch_size`` (the last one short), as ``fit`` scores it."""
    out: dict[str, list[float]] = {}
    for m, job in enumerate(jobs):
        split = val[job.dataset_dir]
        p = {k: v[m] for k, v in pop._p.items()}
        b = {k: v[m] for k, v in pop._b.items()}
        parts = []
        for lo in range(0, split.num_rows, batch_size):
            idx = torch.arange(lo, min(lo + batch_size, split.num_rows),
                               device=split.task_id.device)
            fields, ids = split.take(idx)
            with torch.autocast(**pop.autocast):
                parts.append(functional_call(pop.template, (p, b), (*fields, ids))[1])
        for k in parts[0]:
            out.setdefault(k, []).append(float(torch.stack([q[k].float() for q in parts])
                                               .mean()))
    return out


def save_all(pop: Population, jobs: Sequence[TrainJob], run_dirs: Sequence[Path],
              models: list[nn.Module], epoch: int, metrics: list[dict[str, float]]) -> None:
    """Every model's checkpoint of ``epoch``, as ``fit`` writes it alone."""
    for m, (job, run_dir, model) in enumerate(zip(jobs, run_dirs, models, strict=True)):
        model.load_state_dict(pop.model_state(m))
        ckpt.save_checkpoint(
            Path(run_dir) / "local" / f"epoch-{epoch:04d}", model, job.cfg, job.dataset_hash,
            epoch, metrics[m],
            optimizer_state={"optimizer": model_opt_state(pop.optimizer, pop.names,
                                                           pop.params, m),
                             "scheduler": pop.scheduler.state_dict()},
            extra={"identity": job.identity(), "seed": job.seed})
