"""Dataset generation on Ray Data: range -> map_batches tasks -> write_parquet -> shards.

The flow for one split:

1. check every expected shard against its checksum sidecar; valid shards are kept, invalid ones
   are named in the log and deleted;
2. ``ray.data.range(num_tasks)`` -> ``map_batches(generate_batch)``: each Ray Data task (at
   most ``data.concurrent_tasks`` at once) turns a batch of task ids into a pyarrow table vectorised
   (tasks of valid shards are skipped) -> ``write_parquet(staging, partition_cols=["part"])``;
   a dataset below ``data.ray_data_min_tasks`` tasks is staged the same way by the driver
   (a pipeline's start-up would cost more than the work);
3. each staged shard is sorted by task_id and rewritten under its final name (atomic rename +
   SHA-256 sidecar), so the final bytes do not depend on the number of workers or on Ray's block
   order.

The manifest (config, seed, schema version, per-shard checksums, row counts, content hash) is
written last; a directory without it is an interrupted generation that a re-run resumes.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from spice_ray.common.artifacts import atomic_write_text
from spice_ray.common.console import SILENT, Console, count
from spice_ray.common.faults import fault
from spice_ray.common.placement import DATAGEN, placement_resources
from spice_ray.common.rng import SPLITS
from spice_ray.config import DataConfig, ExperimentConfig, env_from_dict
from spice_ray.data import schema, store
from spice_ray.data.tasks import generate_tasks

log = logging.getLogger(__name__)

class TaskBatchGenerator:
    """A batch of global row ids -> a pyarrow table of generated tasks (:func:`generate_batch`).

    Rows of all splits are numbered consecutively (train, then validation, then eval); each
    output row carries ``part``, the index of its (split, shard) in ``parts``, which becomes
    the Hive partition of the staged files. Rows of parts that are already valid are skipped.
    """

    def __init__(self, env: dict[str, Any], data: dict[str, Any],
                 parts: list[tuple[str, int]]) -> None:
        self.env = env_from_dict(env)
        self.data = DataConfig(**data)
        self.cols = schema.columns(self.env)
        sizes = store.split_sizes(self.data)
        self.offsets = np.cumsum([0] + [sizes[s] for s in SPLITS])  # (4,)
        self.part_of = {key: k for k, key in enumerate(parts)}

    def __call__(self, batch: dict[str, np.ndarray]) -> pa.Table:
        rows = np.asarray(batch["id"], dtype=np.int64)
        split_idx = np.searchsorted(self.offsets, rows, side="right") - 1
        tables = []
        for s in np.unique(split_idx):  # at most 3 iterations: one per split in the batch
            split = SPLITS[s]
            ids = rows[split_idx == s] - self.offsets[s]
            part = np.array([self.part_of.get((split, int(sh)), -1)
                             for sh in ids // self.data.shard_size], dtype=np.int32)
            ids, part = ids[part >= 0], part[part >= 0]
            if len(ids) == 0:
                continue
            table = schema.to_table(self.cols, generate_tasks(self.env, self.data, split, ids))
            tables.append(table.append_column("part", pa.array(part)))
        if not tables:
            empty = schema.to_table(self.cols, {c.name: np.zeros((0, *c.shape), c.dtype)
                                                for c in self.cols})
            return empty.append_column("part", pa.array([], pa.int32()))
        return pa.concat_tables(tables)


def generate_batch(batch: dict[str, np.ndarray], env: dict[str, Any], data: dict[str, Any],
                   parts: list[tuple[str, int]]) -> pa.Table:
    """Ray Data task: :class:`TaskBatchGenerator` of one batch."""
    return TaskBatchGenerator(env, data, parts)(batch)


@dataclass
class GenerationReport:
    """What a generation call did."""

    dataset_dir: Path
    generated: dict[str, list[int]] = field(default_factory=dict)
    skipped: dict[str, list[int]] = field(default_factory=dict)
    invalid: dict[str, dict[int, str]] = field(default_factory=dict)
    seconds: float = 0.0
    bytes_on_disk: int = 0
    num_tasks: int = 0


def _finalise_shard(staging: Path, ds_dir: Path, part: int, split: str, index: int, lo: int,
                    hi: int, cols: tuple[schema.Column, ...], compression: str) -> dict[str, Any]:
    """Sort one staged (split, shard) by task_id and write it under its final name."""
    part_dir = staging / f"part={part}"
    files = sorted(part_dir.glob("*.parquet")) if part_dir.exists() else []
    if not files:
        raise store.DatasetError(f"generation produced no rows for {split} shard {index}")
    table = pa.concat_tables([pq.read_table(f, schema=schema.arrow_schema(cols))
                              for f in files]).sort_by("task_id")
    ids = table.column("task_id").to_numpy()
    if not np.array_equal(ids, np.arange(lo, hi)):
        raise store.DatasetError(f"{split} shard {index}: staged task ids do not cover "
                                 f"[{lo}, {hi}) exactly")
    return store.write_shard(store.shard_path(ds_dir, split, index), table, compression)


def _signed_shards(ds_dir: Path, cfg: ExperimentConfig) -> dict[tuple[str, int], str]:
    """{(split, shard): sha256} of the dataset's manifest where it is readable and of this
    config ({} otherwise): the checksums the shards were generated with."""
    try:
        man = store.load_manifest(ds_dir)
        if not store.spec_current(man.spec, store.dataset_spec(cfg.env, cfg.data))[0]:
            return {}
        return {(split, i): str(r["sha256"]) for split in SPLITS
                for i, r in enumerate(man.split(split)["shards"])}
    except (store.DatasetError, KeyError, TypeError, AttributeError):
        return {}


def find_missing_shards(cfg: ExperimentConfig, ds_dir: Path, splits: tuple[str, ...],
                        report: GenerationReport,
                        signed: dict[tuple[str, int], str] | None = None
                        ) -> list[tuple[str, int]]:
    """Check every expected shard; delete and return the (split, shard) pairs to generate.

    Args:
        signed: the manifest's checksum of each shard (:func:`_signed_shards`): a shard whose
            own sidecar vouches for other bytes was edited and re-signed, and is regenerated
            (a shard is a deterministic function of the config and seed), never trusted.
    """
    missing: list[tuple[str, int]] = []
    absent: list[Path] = []
    for split in splits:
        n = store.split_sizes(cfg.data)[split]
        report.invalid[split], report.generated[split], report.skipped[split] = {}, [], []
        for i in range(store.num_shards(n, cfg.data.shard_size)):
            lo, hi = store.shard_range(i, n, cfg.data.shard_size)
            path = store.shard_path(ds_dir, split, i)
            record, reason = store.check_shard(path, hi - lo)
            want = (signed or {}).get((split, i))
            if record is not None and want is not None and record.get("sha256") != want:
                record, reason = None, ("its sidecar vouches for other bytes than the "
                                        "manifest's checksum (edited and re-signed?)")
            if record is not None:
                report.skipped[split].append(i)
                continue
            missing.append((split, i))
            report.generated[split].append(i)
            if reason != "missing":
                report.invalid[split][i] = reason
                log.warning("%s: %s; regenerating it", path, reason)
                path.unlink(missing_ok=True)
            else:
                absent.append(path)
    if absent and any(report.skipped.values()):  # part of a dataset gone: say which part
        shown = ", ".join(str(p.relative_to(ds_dir)) for p in absent[:5])
        more = f" and {len(absent) - 5} more" if len(absent) > 5 else ""
        log.warning("%s: %d of its shards missing (%s%s); regenerating them", ds_dir,
                    len(absent), shown, more)
    return missing


def uses_ray_data(data: DataConfig) -> bool:
    """Whether a dataset of ``data`` is generated by Ray Data tasks (else in the driver:
    ``data.ray_data_min_tasks``)."""
    return sum(store.split_sizes(data).values()) >= data.ray_data_min_tasks


def generation_means(datas: list[DataConfig]) -> str:
    """How datasets of these configs are generated, in a few words: by Ray Data, or in the
    driver for those below ``data.ray_data_min_tasks`` tasks."""
    n, ray_data = len(datas), sum(uses_ray_data(d) for d in datas)
    if ray_data == n:
        return "Ray Data"
    if ray_data == 0:
        return f"in the driver: {'each' if n > 1 else 'it'} below data.ray_data_min_tasks tasks"
    return f"Ray Data; {n - ray_data} in the driver, below data.ray_data_min_tasks tasks"


def _stage_in_driver(gen: TaskBatchGenerator, total_rows: int, batch_size: int,
                     staging: Path) -> None:
    """What the Ray Data pipeline stages, written by this process: the same batches of row
    ids, the same tables, under the same ``part=<k>`` directories."""
    for n, lo in enumerate(range(0, total_rows, batch_size)):
        table = gen({"id": np.arange(lo, min(lo + batch_size, total_rows), dtype=np.int64)})
        for part in np.unique(table.column("part").to_numpy()):
            rows = table.filter(pc.equal(table.column("part"), part)).drop(["part"])
            part_dir = staging / f"part={part}"
            part_dir.mkdir(parents=True, exist_ok=True)
            pq.write_table(rows, part_dir / f"batch-{n:06d}.parquet", compression="none")


def generate_shards(cfg: ExperimentConfig, ds_dir: Path, parts: list[tuple[str, int]],
                    on_shard: Callable[[], None] | None = None) -> None:
    """Generate the given (split, shard) parts with one Ray Data pipeline (in this process
    below ``data.ray_data_min_tasks`` tasks), then finalise them (``on_shard`` is called as
    each is written)."""
    env, data = cfg.env, cfg.data
    sizes = store.split_sizes(data)
    total_rows = sum(sizes.values())
    cols = schema.columns(env)
    staging = ds_dir / "_staging"
    shutil.rmtree(staging, ignore_errors=True)  # leftovers of an interrupted run
    if uses_ray_data(data):
        _stage_with_ray_data(cfg, ds_dir, parts, total_rows, staging)
    else:
        log.info("%s: generating %d shards in the driver (%d tasks, below "
                 "data.ray_data_min_tasks=%d)", ds_dir.name, len(parts), total_rows,
                 data.ray_data_min_tasks)
        _stage_in_driver(TaskBatchGenerator(env.to_dict(), dict(vars(data)), parts),
                         total_rows, data.batch_size, staging)

    fault_after = int(fault("generate_after_shards", -1))  # tests (spice_ray.common.faults)
    todo = parts if fault_after < 0 else parts[:fault_after]
    with ThreadPoolExecutor(max_workers=2) as pool:  # pyarrow releases the GIL
        futures = []
        for k, (split, i) in enumerate(todo):
            lo, hi = store.shard_range(i, sizes[split], data.shard_size)
            futures.append(pool.submit(_finalise_shard, staging, ds_dir, k, split, i, lo, hi,
                                       cols, data.compression))
        for fut in futures:
            fut.result()
            if on_shard is not None:
                on_shard()
    if len(todo) < len(parts):
        raise RuntimeError(f"injected fault (generate_after_shards={fault_after}): stopped after "
                           f"{len(todo)} of {len(parts)} shards")
    shutil.rmtree(staging, ignore_errors=True)


def _stage_with_ray_data(cfg: ExperimentConfig, ds_dir: Path, parts: list[tuple[str, int]],
                         total_rows: int, staging: Path) -> None:
    """``range -> map_batches(generate_batch) -> write_parquet(staging, partition_cols)``."""
    import ray

    env, data = cfg.env, cfg.data
    log.info("%s: generating %d shards, %d tasks at once", ds_dir.name, len(parts),
             data.concurrent_tasks)
    blocks = max(2 * data.concurrent_tasks, min(len(parts) * 4, -(-total_rows // data.batch_size)))
    label = placement_resources(DATAGEN)  # the CPU nodes of cluster.yaml, when present
    label_args = {"resources": label} if label else {}
    ds = ray.data.range(total_rows, override_num_blocks=blocks)
    # Plain Ray Data tasks (at most concurrent_tasks at once), retried by Ray if a worker dies.
    # An actor pool (ActorPoolStrategy + TaskBatchGenerator as a callable class) was measured on
    # 2 cores: no faster (bandit 100k tasks 20.8 s vs 20.9 s) and ~4 s slower per dataset to
    # start (darkroom 9.8 s vs 5.8 s), since an environment costs microseconds to build per
    # batch; and Ray 2.60 prints an error-level "constructor arguments in the object store and
    # max_restarts > 0" line per actor on the user's terminal even with a 10-byte argument (its
    # cause is Ray Data's own actor argument, ray-project/ray#57733). Switch when a label policy
    # needs per-worker state (e.g. labels from a trained model).
    ds = ds.map_batches(
        generate_batch,
        fn_kwargs={"env": env.to_dict(), "data": dict(vars(data)), "parts": parts},
        batch_size=data.batch_size,
        batch_format="numpy",
        compute=ray.data.TaskPoolStrategy(size=data.concurrent_tasks),
        num_cpus=data.task_cpus,
        **label_args,
    )
    ds.write_parquet(str(staging), partition_cols=["part"], compression="none")


def write_manifest(cfg: ExperimentConfig, ds_dir: Path) -> dict[str, Any]:
    """Checksum every shard and write manifest.json (atomically) last."""
    env, data = cfg.env, cfg.data
    cols = schema.columns(env)
    splits: dict[str, Any] = {}
    for split, n in store.split_sizes(data).items():
        records, files = [], []
        for i in range(store.num_shards(n, data.shard_size)):
            lo, hi = store.shard_range(i, n, data.shard_size)
            path = store.shard_path(ds_dir, split, i)
            record, reason = store.check_shard(path, hi - lo)
            if record is None:
                raise store.DatasetError(f"{path}: {reason}")
            records.append(record)
            files.append(path)
        splits[split] = {
            "num_rows": n,
            "shard_size": data.shard_size,
            "shards": records,
            "bytes": sum(r["bytes"] for r in records),
            "content_hash": store.content_hash(ds_dir, split, cols, files),
        }
    manifest = {
        "spec": store.dataset_spec(env, data),
        "seed": data.seed,
        "columns": [{"name": c.name, "dtype": c.dtype.str, "shape": list(c.shape)}
                    for c in cols],
        "raw_bytes_per_task": schema.raw_nbytes(cols),
        "splits": splits,
    }
    atomic_write_text(ds_dir / store.MANIFEST, json.dumps(manifest, indent=1))
    return manifest


def _manifest_still_valid(ds_dir: Path, cfg: ExperimentConfig) -> bool:
    try:
        man = store.load_manifest(ds_dir)
        for split in SPLITS:
            store.split_files(ds_dir, split, verify=True)
        return store.spec_current(man.spec, store.dataset_spec(cfg.env, cfg.data))[0]
    except store.DatasetError:
        return False


def generate_dataset(cfg: ExperimentConfig, ds_dir: str | Path, splits: tuple[str, ...] = SPLITS,
                     on_shard: Callable[[], None] | None = None) -> GenerationReport:
    """Generate (or resume, or verify) the dataset for ``cfg`` in ``ds_dir``; ``on_shard`` is
    called as each missing shard is written.

    Needs a running Ray (``ray.init``) unless every shard is already valid.

    Raises:
        DatasetError: if ``ds_dir`` holds a dataset of another config (fields named).
    """
    t0 = time.perf_counter()
    ds_dir = Path(ds_dir)
    spec = store.dataset_spec(cfg.env, cfg.data)
    try:
        store.write_spec(ds_dir, spec)
    except OSError as exc:
        raise store.DatasetError(f"cannot write dataset directory {ds_dir}: {exc}") from exc
    report = GenerationReport(dataset_dir=ds_dir)
    if _manifest_still_valid(ds_dir, cfg):
        for split in splits:
            n = store.split_sizes(cfg.data)[split]
            report.skipped[split] = list(range(store.num_shards(n, cfg.data.shard_size)))
            report.generated[split] = []
        log.info("%s: complete and valid, nothing to do", ds_dir)
    else:
        signed = _signed_shards(ds_dir, cfg)
        (ds_dir / store.MANIFEST).unlink(missing_ok=True)
        parts = find_missing_shards(cfg, ds_dir, splits, report, signed)
        if parts:
            generate_shards(cfg, ds_dir, parts, on_shard)
        write_manifest(cfg, ds_dir)
    report.seconds = time.perf_counter() - t0
    report.bytes_on_disk = store.dataset_bytes(ds_dir)
    report.num_tasks = sum(store.split_sizes(cfg.data)[s] for s in splits)
    return report


def datasets_root(cfg: ExperimentConfig) -> Path:
    """``<out_dir>/datasets``: where a run keeps its datasets."""
    return Path(cfg.out_dir) / "datasets"


def generate_stage(cfg: ExperimentConfig, dataset_root: Path | None = None,
                   console: Console = SILENT, label: str = "") -> GenerationReport:
    """The datasets stage of every entry point: generate (or resume, or verify) the dataset of
    ``cfg`` under ``<out_dir>/datasets``, with a progress bar named ``label`` on ``console``
    (shards written); a no-op when the dataset is complete and matches the config."""
    ds_dir = store.dataset_dir(dataset_root or datasets_root(cfg), cfg)
    total = sum(store.num_shards(n, cfg.data.shard_size)
                for n in store.split_sizes(cfg.data).values())
    bar = console.bar(label or ds_dir.name, total, "shard")
    try:
        report = generate_dataset(cfg, ds_dir, on_shard=lambda: bar.update(1))
    except BaseException as exc:
        bar.abort(exc)
        raise
    cfg.write(ds_dir)
    made = sum(len(v) for v in report.generated.values())
    kept = sum(len(v) for v in report.skipped.values())
    log.info("%s: %d shards generated, %d already valid, %.1f s", ds_dir, made, kept,
             report.seconds)
    bar.close(f"{report.num_tasks} tasks, {count(made, 'shard')} written, {kept} already "
              "valid" if made else f"{report.num_tasks} tasks, all {count(kept, 'shard')} "
              "current")
    return report
