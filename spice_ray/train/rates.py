"""Training speed measured on this machine, for the dry run's time estimates.

:func:`step_seconds` times real optimiser steps (the training loss of the model kind, AdamW,
a batch of generated tasks of the configured shape) in this process, as one Train worker would
run them: one torch thread on CPU, bf16 autocast on a GPU. Nothing is written.
"""

from __future__ import annotations

import dataclasses
import math
import time

import numpy as np
import torch

from spice_ray.config import ExperimentConfig
from spice_ray.data.tasks import generate_tasks
from spice_ray.model.registry import build_model, torch_threads
from spice_ray.train.loop import compute_loss, make_optimizer, optimiser_step

_MEASURED: dict[str, float] = {}
"""Step times already measured in this process, by what they depend on."""


def step_seconds(cfg: ExperimentConfig, kind: str, steps: int = 1, device: str = "cpu") -> float:
    """Median seconds of one optimiser step of a ``kind`` model for ``cfg`` on ``device``
    (after one warm-up step), with each worker's share of ``train.batch_size``; measured once
    per model size, environment shape (actions, state width, horizon) and batch in a
    process."""
    env = cfg.env
    key = repr((kind, device, steps, cfg.model, env.num_actions, env.state_dim, env.horizon,
                cfg.train.batch_size, cfg.train.num_workers, cfg.train.together,
                cfg.train.head_targets))
    if key not in _MEASURED:
        _MEASURED[key] = _measure(cfg, kind, steps, device)
    return _MEASURED[key]


def _measure(cfg: ExperimentConfig, kind: str, steps: int, device: str) -> float:
    # data-parallel workers share a batch; together, each worker steps whole models
    workers = 1 if cfg.train.together else max(1, cfg.train.num_workers)
    batch_size = math.ceil(cfg.train.batch_size / workers)
    batch = generate_tasks(cfg.env, cfg.data, "train", np.arange(batch_size))
    with torch_threads(1):  # as in a Train worker
        model = build_model(kind, cfg, torch.Generator().manual_seed(0)).to(device)
        params = [p for p in model.parameters() if p.requires_grad]
        optimiser = make_optimizer(params, cfg.train)
        times = []
        for _ in range(steps + 1):
            t0 = time.perf_counter()
            loss, comp = compute_loss(model, batch, kind, cfg, torch.device(device))
            optimiser_step(loss, optimiser, params, cfg.train.grad_clip, "step timing", comp)
            if device != "cpu":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
    return float(np.median(times[1:]))


def attention_flops(cfg: ExperimentConfig, batch_size: int) -> float:
    """FLOPs of causal self-attention's matmuls in one forward + backward, every layer.

    Per layer and sequence of L = T + 1 positions, the L (L + 1) / 2 query-key pairs a causal
    mask keeps each cost 2 D FLOPs in each of QK^T and PV (forward) and in each of dP, dV, dQ
    and dK (backward): 12 D L (L + 1) / 2. ``torch.utils.flop_counter`` has no formula for
    the CPU flash-attention kernel, so these are added to its count.
    """
    L = cfg.env.horizon + 1
    return cfg.model.n_layer * batch_size * 6.0 * cfg.model.n_embd * L * (L + 1)


def counted_flops(cfg: ExperimentConfig, kind: str, num_tasks: int) -> float:
    """Matmul FLOPs of a forward + backward of a ``kind`` model for ``cfg`` on a batch of
    ``num_tasks`` generated tasks, as ``torch.utils.flop_counter`` counts them (the eager
    heads: the same math as the fused ones, countable; causal attention not included)."""
    key = repr((kind, cfg, num_tasks))
    if key not in _COUNTED:
        _COUNTED[key] = _count_flops(cfg, kind, num_tasks)
    return _COUNTED[key]


_COUNTED: dict[str, float] = {}
"""FLOPs already counted in this process, by kind, config and task count."""


def _count_flops(cfg: ExperimentConfig, kind: str, num_tasks: int) -> float:
    from torch.utils.flop_counter import FlopCounterMode

    _without_compiler_guard()
    counted = cfg.replace(model=dataclasses.replace(cfg.model, head_kernel="eager"))
    batch = generate_tasks(counted.env, counted.data, "train", np.arange(num_tasks))
    model = build_model(kind, counted, torch.Generator().manual_seed(0))
    counter = FlopCounterMode(display=False)
    with counter:
        loss, _ = compute_loss(model, batch, kind, counted, torch.device("cpu"))
        loss.backward()
    return float(counter.get_total_flops())


def _without_compiler_guard() -> None:
    """Let ``FlopCounterMode`` count without importing torch's compiler stack.

    torch wraps every dispatch mode's ``__torch_dispatch__`` so that ``torch.compile`` leaves
    it alone, and the wrapper imports ``torch._dynamo`` (4 s here, sympy included) the first
    time it runs, to build the guard it then keeps on the wrapped function. Nothing in a FLOP
    count is compiled, so the function is given itself as that guard (for the rest of the
    process: nothing in the platform compiles under a ``FlopCounterMode``); where torch no
    longer wraps it so (another version), this does nothing and the count imports as before."""
    from torch.utils import flop_counter

    mode = getattr(flop_counter, "_FlopCounterMode", None)
    raw = getattr(getattr(mode, "__torch_dispatch__", None), "__wrapped__", None)
    if callable(raw) and not hasattr(raw, "__dynamo_disable"):
        setattr(raw, "__dynamo_disable", raw)  # the name torch's wrapper caches its guard as


def step_flops(cfg: ExperimentConfig, kind: str, batch_size: int | None = None) -> float:
    """Matmul FLOPs of one optimiser step's forward + backward of a ``kind`` model for
    ``cfg`` at ``batch_size`` (default ``train.batch_size``): :func:`counted_flops` of one
    task times the batch (every FLOP of a step is per task), plus :func:`attention_flops`.
    Counted on the CPU: the math is the same on any device."""
    batch_size = cfg.train.batch_size if batch_size is None else batch_size
    return counted_flops(cfg, kind, 1) * batch_size + attention_flops(cfg, batch_size)
