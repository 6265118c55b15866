"""Dataset directories on disk: shard files, checksums, the manifest, and readers (no Ray).

Layout of one dataset directory::

    <dataset_dir>/
      spec.json                      what the directory is for (written before any shard)
      manifest.json                  written last: config, seed, schema version, per-shard
                                     checksums, row counts, content hash per split
      train/shard-00000.parquet      tasks [0, S) sorted by task_id
      train/shard-00000.parquet.sha256   sidecar: {"sha256", "rows", "bytes"}
      validation/...  eval/...

A shard is *valid* when its file and sidecar exist and the file's SHA-256 and row count match
the sidecar. Shards are written to a temporary name and renamed, so a killed writer leaves no
half shard under a final name; a truncated or corrupted shard fails its checksum.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from spice_ray.common import artifacts
from spice_ray.common.artifacts import file_sha256
from spice_ray.common.errors import SpiceRayError
from spice_ray.common.faults import fault
from spice_ray.config import DataConfig, EnvConfig, ExperimentConfig, config_hash, env_from_dict
from spice_ray.data import schema

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
SPEC = "spec.json"
# DataConfig fields that change how data is produced, not what it contains.
EXECUTION_FIELDS = ("concurrent_tasks", "task_cpus", "batch_size", "ray_data_min_tasks")


class DatasetError(SpiceRayError, RuntimeError):
    """A dataset directory is missing, corrupted, or does not match the requested config."""


def dataset_spec(env: EnvConfig, data: DataConfig) -> dict[str, Any]:
    """The config fields that determine a dataset directory's content and layout."""
    data_fields = {k: v for k, v in vars(data).items() if k not in EXECUTION_FIELDS}
    return {"schema_version": schema.SCHEMA_VERSION, "env": env.to_dict(),
            "data": data_fields}


def dataset_dir(root: str | Path, cfg: ExperimentConfig) -> Path:
    """Default dataset directory under ``root``: ``<env>-<label>-<hash of spec>``."""
    spec = dataset_spec(cfg.env, cfg.data)
    label = cfg.data.label.replace(":", "")
    return Path(root) / f"{cfg.env.name}-{label}-{config_hash(spec)}"


def split_sizes(data: DataConfig) -> dict[str, int]:
    """Tasks per split."""
    return {"train": data.num_train_tasks, "validation": data.num_val_tasks,
            "eval": data.num_eval_tasks}


def num_shards(num_rows: int, shard_size: int) -> int:
    return -(-num_rows // shard_size)


def shard_range(index: int, num_rows: int, shard_size: int) -> tuple[int, int]:
    """Task ids [lo, hi) of shard ``index``."""
    lo = index * shard_size
    return lo, min(lo + shard_size, num_rows)


def shard_path(ds_dir: Path, split: str, index: int) -> Path:
    return Path(ds_dir) / split / f"shard-{index:05d}.parquet"


def write_shard(path: Path, table: pa.Table, compression: str) -> dict[str, Any]:
    """Write one shard atomically and its checksum sidecar; return the sidecar record."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if fault("disk_full"):  # injected by tests (spice_ray.common.faults)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    def write(tmp: Path) -> None:
        pq.write_table(table, tmp, compression=None if compression == "none" else compression,
                       row_group_size=1024, write_statistics=["task_id"])

    return artifacts.write_checked(path, write, rows=table.num_rows)


def check_shard(path: Path, expected_rows: int) -> tuple[dict[str, Any] | None, str]:
    """Validate one shard against its sidecar.

    Returns:
        (sidecar record, "") when valid, else (None, reason) naming what is wrong.
    """
    record, reason = artifacts.verify(path)
    if record is None:
        return None, reason
    if record.get("rows") != expected_rows:
        return None, f"{record.get('rows')} rows, expected {expected_rows}"
    return record, ""


def write_spec(ds_dir: Path, spec: dict[str, Any]) -> None:
    """Record what a dataset directory is for, or refuse if it already holds another config."""
    ds_dir.mkdir(parents=True, exist_ok=True)
    path = ds_dir / SPEC
    if path.exists():
        check_spec(ds_dir, spec)
    else:
        artifacts.atomic_write_text(path, json.dumps(spec, indent=1, sort_keys=True))


def diff_fields(a: Any, b: Any, prefix: str = "") -> list[str]:
    """Each field where two nested dicts differ: ``"<path>: on disk <a>, requested <b>"``."""
    return _diff(a, b, prefix)


def _diff(a: Any, b: Any, prefix: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            out += _diff(a.get(k), b.get(k), f"{prefix}.{k}" if prefix else k)
        return out
    return [] if a == b else [f"{prefix}: on disk {a!r}, requested {b!r}"]


def spec_current(on_disk: Any, spec: dict[str, Any]) -> tuple[bool, str]:
    """Whether a dataset recorded with spec ``on_disk`` (a manifest's or ``spec.json``) is the
    dataset of ``spec``: the one freshness rule (``artifacts.is_current``) on the two specs'
    hashes. Returns (True, "") or (False, every field that differs, "<path>: on disk <a>,
    requested <b>")."""
    requested = json.loads(json.dumps(spec))
    recorded = {"spec": config_hash(on_disk)} if isinstance(on_disk, dict) else None
    ok, reason = artifacts.is_current(recorded, config_hash(requested), field="spec")
    if ok or recorded is None:
        return ok, reason
    return False, "; ".join(_diff(on_disk, requested)) or reason


def check_spec(ds_dir: Path, spec: dict[str, Any]) -> None:
    """Raise DatasetError naming every field where the directory's spec differs.

    An unreadable manifest is skipped (generation rewrites it from verified shards). An
    unreadable spec.json is rewritten when the directory's name carries this spec's hash (the
    default :func:`dataset_dir`), so its shards were made for this config; otherwise it is an
    error naming the file.
    """
    for name in (MANIFEST, SPEC):
        path = Path(ds_dir) / name
        if path.exists():
            try:
                on_disk = artifacts.read_json(path)
                if name == MANIFEST:
                    _check_manifest_shape(path, on_disk)
            except artifacts.UnreadableFile as exc:
                if name == MANIFEST:
                    continue
                if Path(ds_dir).name.endswith(f"-{config_hash(spec)}"):
                    log.warning("%s; rewriting it (the directory name carries this config's "
                                "hash)", exc)
                    artifacts.atomic_write_text(path, json.dumps(spec, indent=1, sort_keys=True))
                    return
                raise DatasetError(f"{exc}; delete {path} if {ds_dir} holds the dataset of "
                                   "this config, or use another directory") from exc
            current, diffs = spec_current(on_disk.get("spec", on_disk), spec)
            if not current:
                raise DatasetError(
                    f"dataset directory {ds_dir} was made for another config ({path.name}): "
                    f"{diffs}. Use another directory or the matching config.")
            return


def content_hash(ds_dir: Path, split: str, cols: tuple[schema.Column, ...],
                 shard_files: list[Path]) -> str:
    """SHA-256 of each column's bytes concatenated in task order, combined over columns.

    Independent of the shard size and of how the shards were written.
    """
    hashers = {c.name: hashlib.sha256() for c in cols}
    for path in shard_files:
        arrays = schema.from_table(cols, pq.read_table(path))
        for c in cols:
            hashers[c.name].update(np.ascontiguousarray(arrays[c.name]).tobytes())
    top = hashlib.sha256(split.encode())
    for c in cols:
        top.update(f"{c.name}:{c.dtype.str}:{c.shape}:{hashers[c.name].hexdigest()}".encode())
    return top.hexdigest()


@dataclass(frozen=True)
class Manifest:
    """A parsed manifest.json."""

    path: Path
    raw: dict[str, Any]

    @property
    def spec(self) -> dict[str, Any]:
        return self.raw["spec"]

    @property
    def env(self) -> EnvConfig:
        return env_from_dict(self.spec["env"])

    def split(self, name: str) -> dict[str, Any]:
        try:
            return self.raw["splits"][name]
        except KeyError as exc:
            raise DatasetError(f"{self.path}: no split {name!r}; has "
                               f"{sorted(self.raw['splits'])}") from exc

    def columns(self) -> tuple[schema.Column, ...]:
        return schema.columns(self.env)


def _check_manifest_shape(path: Path, raw: dict[str, Any]) -> None:
    """Raise UnreadableFile unless ``raw`` has the fields the readers use."""
    ok = isinstance(raw.get("spec"), dict) and isinstance(raw.get("splits"), dict)
    for split in (raw.get("splits") or {}).values() if ok else ():
        ok = ok and isinstance(split, dict) and isinstance(split.get("shards"), list) and all(
            isinstance(r, dict) and {"file", "bytes", "sha256"} <= set(r)
            for r in split["shards"]) and {"num_rows", "bytes", "content_hash"} <= set(split)
    if not ok:
        raise artifacts.UnreadableFile(f"{path} is corrupted: missing or malformed fields")
    root = path.parent.resolve()
    for split in raw["splits"].values():
        for rec in split["shards"]:
            if not artifacts.stays_inside(root, rec["file"]):
                raise artifacts.UnreadableFile(
                    f"{path}: a shard's file {rec['file']!r:.200} is outside the dataset "
                    f"directory ({root}): refused")


def load_manifest(ds_dir: str | Path) -> Manifest:
    """Read a finished dataset's manifest, with a clear error if it is absent."""
    path = Path(ds_dir) / MANIFEST
    if not path.exists():
        raise DatasetError(f"{path} does not exist: the dataset at {ds_dir} is missing or was "
                           "interrupted; run pipelines/generate_data.py to finish it")
    try:
        raw = artifacts.read_json(path)
        _check_manifest_shape(path, raw)
    except artifacts.UnreadableFile as exc:
        raise DatasetError(f"{exc}; re-run generation to rebuild it from the shards") from exc
    if raw["spec"].get("schema_version") != schema.SCHEMA_VERSION:
        raise DatasetError(f"{path}: schema version {raw.get('spec', {}).get('schema_version')}"
                           f", this code reads {schema.SCHEMA_VERSION}")
    return Manifest(path, raw)


def split_id(ds_dir: str | Path, split: str) -> str:
    """A split by content (the manifest's content hash), not by path."""
    return load_manifest(ds_dir).split(split)["content_hash"]


def split_files(ds_dir: str | Path, split: str, verify: bool = True) -> list[Path]:
    """The shard files of a split in task order; with ``verify`` each checksum is checked."""
    man = load_manifest(ds_dir)
    files = []
    for rec in man.split(split)["shards"]:
        path = Path(ds_dir) / rec["file"]
        if verify:
            if not path.exists():
                raise DatasetError(f"shard {path} is missing")
            if path.stat().st_size != rec["bytes"] or file_sha256(path) != rec["sha256"]:
                raise DatasetError(f"shard {path} fails its SHA-256 checksum (corrupted or "
                                   "truncated); re-run generation to regenerate it")
        files.append(path)
    return files


def load_split(ds_dir: str | Path, split: str, verify: bool = True,
               limit: int | None = None) -> dict[str, np.ndarray]:
    """Load a whole split (or its first ``limit`` tasks) into numpy arrays sorted by task_id."""
    man = load_manifest(ds_dir)
    cols = man.columns()
    tables = []
    rows = 0
    for path in split_files(ds_dir, split, verify):
        tables.append(pq.read_table(path))
        rows += tables[-1].num_rows
        if limit is not None and rows >= limit:
            break
    arrays = schema.from_table(cols, pa.concat_tables(tables))
    if limit is not None:
        arrays = {k: v[:limit] for k, v in arrays.items()}
    return arrays


def iter_batches(
    ds_dir: str | Path,
    split: str,
    batch_size: int,
    rng: np.random.Generator | None = None,
    drop_last: bool = False,
    verify: bool = True,
) -> Iterator[dict[str, np.ndarray]]:
    """Stream a split shard by shard as numpy batches (no Ray).

    With ``rng`` the shard order and the rows within each shard are shuffled; without it the
    rows come in file order (by task id), cut into consecutive batches across shards.
    ``verify=False`` skips the checksums, for a reader whose caller verified the shards.
    """
    man = load_manifest(ds_dir)
    cols = man.columns()
    files = split_files(ds_dir, split, verify=verify)
    order = rng.permutation(len(files)) if rng is not None else np.arange(len(files))
    carry: dict[str, np.ndarray] | None = None
    for i in order:
        arrays = schema.from_table(cols, pq.read_table(files[i]))
        if rng is not None:
            perm = rng.permutation(len(arrays["task_id"]))
            arrays = {k: v[perm] for k, v in arrays.items()}
        if carry is not None:
            arrays = {k: np.concatenate([carry[k], v]) for k, v in arrays.items()}
        n = len(arrays["task_id"])
        full = n - n % batch_size
        for lo in range(0, full, batch_size):
            yield {k: v[lo:lo + batch_size] for k, v in arrays.items()}
        carry = {k: v[full:] for k, v in arrays.items()} if full < n else None
    if carry is not None and not drop_last:
        yield carry


def dataset_bytes(ds_dir: str | Path) -> int:
    """Bytes of all shard files of a finished dataset."""
    man = load_manifest(ds_dir)
    return sum(rec["bytes"] for s in man.raw["splits"].values() for rec in s["shards"])
