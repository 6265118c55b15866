"""Fail fast on requests the cluster can never satisfy, and on runs that cannot fit on disk.

Ray queues a request it cannot place and waits forever: 64 Train workers on a 2-CPU laptop, or
an evaluation actor asking for 4 GPUs on a CPU-only machine, hang without a word. Before any
work, :func:`check_requests` compares every stage's request with what the cluster has (or, on
an autoscaling cluster, with what its node types can provide at most) and returns one line per
impossible request, naming the config field, the request and what is available.

Two rules per request:

* one unit (a Train worker, an actor, a placement-group bundle) must fit on a single node;
* gang-scheduled units (all Train workers of a fit, a trial's placement group)
  must fit in the cluster together, a trial's with :data:`RAY_DATA_CPUS` CPUs left for Ray
  Data's own read and write tasks (otherwise Ray Data stalls, "backpressured:
  ResourceBudget"); Train workers read their Parquet shards without Ray Data.

:func:`check_sizes` refuses a run whose datasets would not fit on the run directory's disk, or
whose bookkeeping would not fit in memory, naming both numbers.

Pure functions over plain dicts, except :func:`cluster_capacity`, which asks Ray.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import shutil
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spice_ray.common.placement import TRAINER, declared_labels
from spice_ray.config import ExperimentConfig

RAY_DATA_CPUS = 1.0
"""CPUs a data-streaming stage leaves free: each Ray Data read/write task asks for one."""
BOOTSTRAP_CONFIG = Path("~/ray_bootstrap_config.yaml")
"""Where ``ray up`` puts the launcher config (node types and their limits) on the head node."""
_BYTES_PER_SHARD_RECORD = 300
"""Driver memory per (split, shard) entry of the generation plan (tuples, dicts, sidecars)."""


@dataclass(frozen=True)
class Capacity:
    """What a cluster can offer.

    Attributes:
        nodes: resources of each node (or node type, on an autoscaling cluster).
        total: resources of the whole cluster (every node type at its ``max_workers``).
        unknown: resources whose amounts are not known (not checked).
        source: how the numbers were found, for messages.
    """

    nodes: tuple[Mapping[str, float], ...]
    total: Mapping[str, float]
    unknown: frozenset[str] = frozenset()
    source: str = "the cluster"


@dataclass(frozen=True)
class Request:
    """One stage's request: ``count`` units of ``bundle``, all at once when ``gang``."""

    what: str
    """The config fields behind it, with values, e.g. ``train.num_workers=4 x ...``."""
    unit: str
    """What one unit is, e.g. "Train worker"."""
    bundle: Mapping[str, float]
    count: int = 1
    gang: bool = True
    reserve_cpus: float = 0.0
    bundles: tuple[Mapping[str, float], ...] = field(default=())
    """Several different bundles (a placement group); overrides ``bundle`` and ``count``."""


def _fmt(res: Mapping[str, float]) -> str:
    return ", ".join(f"{v:g} {k}" for k, v in sorted(res.items()) if v) or "nothing"


def capacity_from_nodes(nodes: Iterable[Mapping[str, float]], source: str = "the cluster"
                        ) -> Capacity:
    """Capacity of a fixed set of nodes (e.g. ``ray.nodes()``'s alive nodes' resources)."""
    nodes = tuple(dict(n) for n in nodes)
    total: dict[str, float] = {}
    for node in nodes:
        for key, amount in node.items():
            total[key] = total.get(key, 0.0) + float(amount)
    return Capacity(nodes, total, source=source)


def capacity_from_launcher(config: Mapping[str, Any], source: str = "the cluster's node types"
                           ) -> Capacity:
    """Capacity of an autoscaling cluster from its launcher config (``available_node_types``):
    every type at its ``max_workers`` (the head type: once).

    CPU and GPU counts that the file leaves to auto-detection are unknown, so never refused.
    """
    types = config.get("available_node_types") or {}
    head = config.get("head_node_type")
    nodes, total = [], {}
    for name, spec in types.items():
        res = {k: float(v) for k, v in (spec.get("resources") or {}).items()}
        count = 1 if name == head else int(spec.get("max_workers", 0) or 0)
        nodes.append(res)
        for key, amount in res.items():
            total[key] = total.get(key, 0.0) + amount * count
    # Ray fills each type's CPU (and GPU, where there is one) into the bootstrap config; a type
    # without a CPU count was left to auto-detection, so neither count is known.
    vague = any("CPU" not in (spec.get("resources") or {}) for spec in types.values())
    unknown = frozenset(("CPU", "GPU")) if vague or not types else frozenset()
    return Capacity(tuple(nodes), total, unknown, source)


def cluster_capacity(address: str | None = None,
                     bootstrap: str | Path | None = None) -> Capacity:
    """The running Ray cluster's capacity.

    When joining a cluster (``address``) whose head holds the launcher's bootstrap config
    (``ray up``), the node types' limits count (an autoscaling cluster starts small);
    otherwise the alive nodes' resources.
    """
    import ray

    from spice_ray.config import load_yaml

    path = Path(bootstrap or BOOTSTRAP_CONFIG).expanduser()
    if address and path.is_file():
        return capacity_from_launcher(load_yaml(path), f"the node types of {path}")
    nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
    return capacity_from_nodes(nodes)


def _fits(bundle: Mapping[str, float], node: Mapping[str, float], unknown: frozenset[str]
          ) -> bool:
    return all(node.get(k, 0.0) + 1e-9 >= v for k, v in bundle.items()
               if v > 0 and k not in unknown)


def check_request(req: Request, cap: Capacity) -> str | None:
    """One line saying why ``req`` can never be scheduled on ``cap``, or None if it can."""
    bundles = req.bundles or tuple(req.bundle for _ in range(max(req.count, 0)))
    if not bundles:
        return None
    for bundle in dict.fromkeys(tuple(sorted(b.items())) for b in bundles):
        b = dict(bundle)
        if not any(_fits(b, node, cap.unknown) for node in cap.nodes):
            largest = {k: max((n.get(k, 0.0) for n in cap.nodes), default=0.0) for k in b}
            return (f"{req.what}: one {req.unit} asks for {_fmt(b)}, but no node of "
                    f"{cap.source} offers that (the most any node has: {_fmt(largest)})")
    if not req.gang:
        return None
    need: dict[str, float] = {}
    for b in bundles:
        for k, v in b.items():
            need[k] = need.get(k, 0.0) + float(v)
    for key, amount in sorted(need.items()):
        if amount <= 0 or key in cap.unknown:
            continue
        reserve = req.reserve_cpus if key == "CPU" else 0.0
        have = float(cap.total.get(key, 0.0))
        if amount + reserve > have + 1e-9:
            kept = f", {reserve:g} of them kept free for Ray Data's own tasks" if reserve else ""
            per = amount / len(bundles)
            fit = max(0, math.floor((have - reserve) / per + 1e-9)) if per > 0 else 0
            return (f"{req.what}: {len(bundles)} {req.unit}s ask for {amount:g} {key} at once, "
                    f"but {cap.source} has {have:g} {key}{kept}; at most {fit} fit")
    return None


def check_requests(requests: Iterable[Request], cap: Capacity) -> list[str]:
    """Every impossible request, one line each (duplicates once)."""
    return list(dict.fromkeys(msg for r in requests if (msg := check_request(r, cap))))


def stage_requests(cfg: ExperimentConfig,
                   stages: Sequence[str] = ("datasets", "pretrain", "evaluate"),
                   use_gpu: bool | None = None, labels: Mapping[str, Mapping[str, float]] = {}
                   ) -> list[Request]:
    """The requests ``cfg``'s stages make.

    Args:
        stages: any of "datasets", "pretrain", "evaluate".
        use_gpu: whether Train workers take a GPU (default ``train.use_gpu``; the caller passes
            the CPU fallback's decision).
        labels: node-label requests per stage kind ("datagen", "trainer"), as placed.
    """
    out = []
    d, t, e = cfg.data, cfg.train, cfg.eval
    if "datasets" in stages:
        out.append(Request(f"data.task_cpus={d.task_cpus:g}", "generation task",
                           {"CPU": d.task_cpus, **labels.get("datagen", {})}, 1, gang=False,
                           reserve_cpus=RAY_DATA_CPUS))
    if "pretrain" in stages and t.on_ray_train:
        gpu = t.use_gpu is True if use_gpu is None else use_gpu
        bundle = {"CPU": t.worker_cpus, **({"GPU": t.worker_gpus} if gpu else {}),
                  **labels.get("trainer", {})}
        out.append(Request(f"train.num_workers={t.num_workers} x train.worker_cpus="
                           f"{t.worker_cpus:g}" + (f", train.worker_gpus={t.worker_gpus:g} "
                                                   "(train.use_gpu)" if gpu else ""),
                           "Train worker", bundle, t.num_workers, gang=True))
        # no CPU kept back: a Train job streams nothing through Ray Data (its workers read
        # the Parquet shards themselves), and the datasets stage has ended before it starts
    if "evaluate" in stages:
        bundle = {"CPU": e.actor_cpus, **({"GPU": e.actor_gpus} if e.actor_gpus > 0 else {}),
                  **(labels.get("trainer", {}) if e.actor_gpus > 0 else {})}
        what = f"eval.actor_cpus={e.actor_cpus:g}" + (
            f", eval.actor_gpus={e.actor_gpus:g}" if e.actor_gpus > 0 else "")
        out.append(Request(what, "evaluation actor", bundle, 1, gang=False))
    return out


def sweep_request(cfg: ExperimentConfig, bundles: Sequence[Mapping[str, float]]) -> Request:
    """A sweep trial's placement group (all bundles at once)."""
    s = cfg.sweep
    return Request(f"sweep.actors_per_trial={s.actors_per_trial} x sweep.actor_cpus="
                   f"{s.actor_cpus:g}" + (f", eval.actor_gpus={cfg.eval.actor_gpus:g}"
                                          if cfg.eval.actor_gpus > 0 else ""),
                   "trial bundle", {}, gang=True, reserve_cpus=RAY_DATA_CPUS,
                   bundles=tuple(dict(b) for b in bundles))


# ---- sizes -------------------------------------------------------------------------------


def human_bytes(n: float) -> str:
    """``1536`` -> ``"1.5 KiB"``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} PiB"


def dataset_estimate(cfg: ExperimentConfig) -> tuple[int, int, int]:
    """(tasks, bytes on disk at most, (split, shard) entries) of ``cfg``'s dataset.

    Uncompressed bytes: an upper bound of what the zstd shards take.
    """
    from spice_ray.data import schema, store

    cols = schema.columns(cfg.env)
    sizes = store.split_sizes(cfg.data)
    tasks = sum(sizes.values())
    shards = sum(store.num_shards(n, cfg.data.shard_size) for n in sizes.values())
    return tasks, tasks * schema.raw_nbytes(cols), shards


def available_memory() -> int:
    """Bytes of memory available to new work (Linux ``MemAvailable``; free pages elsewhere)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _existing_parent(path: Path) -> Path:
    path = path.resolve()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_sizes(cfgs: Iterable[ExperimentConfig], run_dir: str | Path,
                free_disk: int | None = None, free_memory: int | None = None) -> list[str]:
    """Refuse datasets that cannot fit on ``run_dir``'s disk, or whose generation plan and
    eval split cannot fit in memory; one line each, naming the fields and both numbers.

    Datasets that already exist (a manifest in their directory) need no space.
    """
    from spice_ray.data import schema, store

    run_dir = Path(run_dir)
    if free_disk is None:
        free_disk = shutil.disk_usage(_existing_parent(run_dir)).free
    if free_memory is None:
        free_memory = available_memory()
    errors, disk, seen = [], 0, set()
    fields = []
    for cfg in cfgs:
        ds_dir = store.dataset_dir(run_dir / "datasets", cfg)
        if ds_dir in seen or (ds_dir / store.MANIFEST).exists():
            continue
        seen.add(ds_dir)
        tasks, nbytes, shards = dataset_estimate(cfg)
        disk += nbytes
        fields.append(f"{ds_dir.name}: {tasks} tasks")
        cols = schema.columns(cfg.env)
        memory = (cfg.data.num_eval_tasks * schema.raw_nbytes(cols) * 2
                  + shards * _BYTES_PER_SHARD_RECORD * (1 + cfg.data.concurrent_tasks))
        if memory > free_memory:
            errors.append(
                f"data.num_train_tasks={cfg.data.num_train_tasks}, data.shard_size="
                f"{cfg.data.shard_size}, data.num_eval_tasks={cfg.data.num_eval_tasks}: "
                f"dataset {ds_dir.name}'s generation plan and eval split need "
                f"~{human_bytes(memory)} of memory, but {human_bytes(free_memory)} is available")
    if disk > free_disk:
        errors.append(f"the datasets ({'; '.join(fields)}) need up to {human_bytes(disk)} on "
                      f"disk, but {_existing_parent(run_dir)} has {human_bytes(free_disk)} free; "
                      "lower data.num_train_tasks or choose another --out")
    return errors


@dataclass(frozen=True)
class ModelSize:
    """What one model of a config costs a Train worker.

    Attributes:
        kind: the model kind.
        params: trainable parameters (counted exactly on PyTorch's meta device: no memory).
        state_bytes: fp32 weights, gradients and AdamW's two moments (16 bytes a parameter),
            plus the frozen buffers (the ensemble's random prior networks).
        activation_bytes: activations kept for the backward pass of one worker's batch, an
            estimate for a GPT-2 block stack in fp32 (per layer and token: about 16 D numbers,
            plus 2 T per head for the attention scores) plus the value heads.
        batch: sequences per worker step.
    """

    kind: str
    params: int
    state_bytes: int
    activation_bytes: int
    batch: int

    @property
    def worker_bytes(self) -> int:
        return self.state_bytes + self.activation_bytes


def model_estimate(cfg: ExperimentConfig, kind: str) -> ModelSize:
    """Parameters and memory per Train worker of a ``kind`` model for ``cfg``."""

    from spice_ray.model.registry import model_class, model_shape

    model = model_shape(kind, cfg)
    params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    frozen = sum(p.numel() for p in model.parameters() if not p.requires_grad) + sum(
        b.numel() for b in model.buffers())
    m, tc = cfg.model, cfg.train
    workers = max(1, tc.num_workers)  # 0: in the driver process, one "worker"
    batch = math.ceil(tc.batch_size / workers)
    T = cfg.env.horizon + 1
    per_layer = batch * T * (16 * m.n_embd + 2 * m.n_head * T)
    heads = batch * T * model_class(kind).head_activations(m, cfg.env.num_actions)
    return ModelSize(kind, params, 16 * params + 4 * frozen,
                     4 * (m.n_layer * per_layer + heads), batch)


def check_models(cfgs: Iterable[ExperimentConfig], free_memory: int | None = None,
                 gpu_memory: int | None = None) -> list[str]:
    """Refuse, before any work, models whose training cannot fit in a worker: all
    ``train.num_workers`` CPU workers of a job in this machine's available memory (or one
    worker in its ``train.worker_gpus`` share of one GPU's memory with ``train.use_gpu``,
    where the GPU size is known). One line
    per config, naming the fields and both numbers."""
    from spice_ray.model.registry import MODELS

    cfgs = list(cfgs)
    if free_memory is None:
        free_memory = available_memory()
    if gpu_memory is None and any(c.train.use_gpu is not False for c in cfgs):
        import torch

        if torch.cuda.is_available():  # this machine's first GPU (a cluster's: not known here)
            gpu_memory = torch.cuda.get_device_properties(0).total_memory
    errors, seen = [], set()
    for cfg in cfgs:
        key = (cfg.model, cfg.env, cfg.train.batch_size, cfg.train.num_workers,
               cfg.train.use_gpu, cfg.train.worker_gpus)
        if key in seen:
            continue
        seen.add(key)
        size = max((model_estimate(cfg, kind) for kind in MODELS),
                   key=lambda s: s.worker_bytes)
        m = cfg.model
        fields = (f"model.n_layer={m.n_layer}, model.n_embd={m.n_embd}, train.batch_size="
                  f"{cfg.train.batch_size}")
        what = (f"a {size.kind} model of {size.params:,} parameters needs ~"
                f"{human_bytes(size.worker_bytes)} per Train worker (weights, gradients and "
                f"AdamW ~{human_bytes(size.state_bytes)}; activations of {size.batch} "
                f"sequences ~{human_bytes(size.activation_bytes)})")
        if cfg.train.on_gpu(gpu_memory is not None):
            share = cfg.train.worker_gpus  # workers sharing a GPU split its memory
            if gpu_memory is not None and size.worker_bytes > gpu_memory * share:
                errors.append(f"{fields}: {what}, but a GPU has {human_bytes(gpu_memory)}"
                              + (f" and train.worker_gpus={share:g} gives a worker "
                                 f"{human_bytes(int(gpu_memory * share))}" if share < 1
                                 else ""))
        elif size.worker_bytes * max(1, cfg.train.num_workers) > free_memory:
            workers = (f", x train.num_workers={cfg.train.num_workers}"
                       if cfg.train.num_workers > 1 else "")
            errors.append(f"{fields}: {what}{workers}, but {human_bytes(free_memory)} of "
                          "memory is available")
    return errors


def size_problems(cfgs: Iterable[ExperimentConfig], run_dir: str | Path, address: str | None
                  ) -> list[str]:
    """What cannot fit, known before Ray starts (a run and its dry run check the same):
    datasets on the run directory's disk and in memory, and, on this machine (no ``address``:
    a cluster's nodes are not known here), every model's training in a worker's memory."""
    cfgs = list(cfgs)
    problems = check_sizes(cfgs, run_dir)
    if address is None:
        problems += check_models(cfgs)
    return problems


def gpus_available(use_gpu: bool | str, cluster: dict[str, float] | None = None,
                   environ: dict[str, str] | None = None) -> bool:
    """Whether to train on GPUs: ``train.use_gpu`` (true, or "auto") and the cluster has (or
    will add) some.

    The paper preset asks for GPUs; on a CPU-only machine the same command trains on CPU with
    a warning instead of waiting forever for a GPU ("auto", the default, without one). An
    autoscaling cluster starts without GPU nodes, so a declared ``trainer`` label
    (``cluster.yaml``) counts as GPUs to come.
    """
    if use_gpu is False:
        return False
    if cluster is None:
        import ray

        cluster = ray.cluster_resources()
    if cluster.get("GPU", 0) > 0 or TRAINER in declared_labels(environ):
        return True
    if use_gpu is True:
        _warn_no_gpu()
    return False


@functools.cache
def _warn_no_gpu() -> None:
    """The CPU fallback's warning, once per process (every training job asks again)."""
    logging.getLogger(__name__).warning("train.use_gpu=true but the cluster has no GPU and "
                                        "declares no GPU nodes: training on CPU")
