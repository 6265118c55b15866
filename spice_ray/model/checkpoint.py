"""The checkpoint format: a directory that rebuilds a model with nothing else.

This module reads and writes the files; it imports no model class: the registry's
``spice_ray.model.registry.load_model`` is the one way to turn a checkpoint into a model.

Layout::

    <checkpoint>/
      meta.json         kind, architecture spec, run config, dataset content hash, epoch,
                        metrics, and the SHA-256 of every file below
      meta.json.sha256  the SHA-256 sidecar of meta.json (``spice_ray.common.artifacts``)
      weights.pt        model state_dict (tensors only; torch.load(weights_only=True))
      optimizer.pt      optimizer (+ scheduler) state, for resuming (weights_only as well)

Loading never unpickles arbitrary objects: ``weights_only=True`` only admits tensors and plain
containers, and every file is checked against its checksum first (meta.json against its
sidecar, the others against meta.json), so a corrupted, truncated or edited file is named
instead of half-loaded: an edited ``spec`` or ``config`` would rebuild a different model.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from spice_ray.common.artifacts import UnreadableFile, file_sha256, read_json, verify, write_sidecar
from spice_ray.common.errors import SpiceRayError
from spice_ray.config import EnvConfig, RunConfig

META = "meta.json"
WEIGHTS = "weights.pt"
OPTIMIZER = "optimizer.pt"


META_KEYS = ("kind", "spec", "config", "dataset_hash", "epoch", "files")
"""What every meta.json holds (``save_checkpoint`` writes them all)."""


class CheckpointError(SpiceRayError, RuntimeError):
    """A checkpoint is missing, corrupted, or does not fit the environment."""


def save_checkpoint(
    directory: str | Path,
    model: Any,
    cfg: RunConfig,
    dataset_hash: str,
    epoch: int,
    metrics: dict[str, float] | None = None,
    optimizer_state: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
) -> Path:
    """Write a checkpoint directory atomically (temp dir + rename) and return its path.

    Args:
        model: any module with ``KIND``, ``spec()`` and ``state_dict()`` (a TrunkModel).
    """
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = directory.with_name(f".{directory.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    torch.save(state, tmp / WEIGHTS)
    files = [WEIGHTS]
    if optimizer_state is not None:
        torch.save(optimizer_state, tmp / OPTIMIZER)
        files.append(OPTIMIZER)
    meta = {
        "kind": model.KIND,
        "spec": model.spec(),
        "config": cfg.to_dict(),
        "dataset_hash": dataset_hash,
        "epoch": int(epoch),
        "metrics": {k: float(v) for k, v in (metrics or {}).items()},
        "files": {name: file_sha256(tmp / name) for name in files},
        **(extra or {}),
    }
    write_meta(tmp, meta)
    if directory.exists():
        shutil.rmtree(directory)
    os.replace(tmp, directory)
    return directory


def write_meta(directory: str | Path, meta: dict[str, Any]) -> Path:
    """Write a checkpoint's meta.json and then its SHA-256 sidecar; returns meta.json's path."""
    path = Path(directory) / META
    path.write_text(json.dumps(meta, indent=1))
    write_sidecar(path)
    return path


def read_meta(directory: str | Path) -> dict[str, Any]:
    """meta.json of a checkpoint, verified against its SHA-256 sidecar.

    Raises:
        CheckpointError: one line naming the file: it is absent, fails its checksum (edited,
            corrupted, or written before checksums), is not JSON, or lacks a key.
    """
    path = Path(directory) / META
    if not path.is_file():
        raise CheckpointError(f"{path} does not exist: {directory} is not a checkpoint")
    record, reason = verify(path)
    if record is None:
        raise CheckpointError(f"checkpoint file {path} fails its SHA-256 checksum ({reason}): "
                              "edited or corrupted, so the checkpoint is not used")
    try:
        meta = read_json(path)
    except UnreadableFile as exc:  # "<path> is corrupted (...)"
        raise CheckpointError(f"checkpoint file {exc}") from exc
    missing = [key for key in META_KEYS if key not in meta]
    if missing or not isinstance(meta["spec"], dict) or not isinstance(meta["files"], dict):
        raise CheckpointError(f"checkpoint file {path} is incomplete: "
                              f"{', '.join(missing) or 'spec or files'} missing or malformed")
    return meta


def content_id(directory: str | Path) -> str:
    """A checkpoint by content, not by path: its job identity (or kind and epoch) and the
    SHA-256 of its weights as recorded in meta.json."""
    meta = read_meta(directory)
    who = meta.get("identity") or f"{meta.get('kind')}@{meta.get('epoch')}"
    return f"{who}:{meta.get('files', {}).get(WEIGHTS)}"


def _load_file(directory: Path, name: str, meta: dict[str, Any]) -> Any:
    path = directory / name
    expected = meta.get("files", {}).get(name)
    if not path.exists():
        raise CheckpointError(f"checkpoint file {path} is missing")
    if expected is None or file_sha256(path) != expected:
        raise CheckpointError(f"checkpoint file {path} fails its SHA-256 checksum "
                              "(corrupted or truncated)")
    state = torch.load(path, map_location="cpu", weights_only=True)
    if name == WEIGHTS:
        bad = [k for k, v in state.items()
               if torch.is_tensor(v) and v.is_floating_point() and not torch.isfinite(v).all()]
        if bad:
            raise CheckpointError(f"checkpoint file {path} holds non-finite values in "
                                  f"{', '.join(bad[:3])}: the model diverged before it was saved")
    return state


def check_env(meta: dict[str, Any], env: EnvConfig, where: str) -> None:
    """Refuse a checkpoint whose action count or state size differs from ``env``."""
    spec = meta["spec"]
    got = (int(spec["num_actions"]), int(spec["state_dim"]))
    want = (env.num_actions, env.state_dim)
    if got != want:
        raise CheckpointError(
            f"checkpoint {where} was trained for A={got[0]} actions and state dim S={got[1]}, "
            f"but env.name={env.name} has A={want[0]}, S={want[1]}")
    trained_h = int(spec["max_len"]) - 1
    if env.horizon > trained_h:
        raise CheckpointError(f"checkpoint {where} supports contexts up to {trained_h} "
                              f"transitions, env.horizon={env.horizon} is longer")


def load_state(directory: str | Path, expect_env: EnvConfig | None = None,
               kind: str | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(meta, verified weights) of a checkpoint, refusing the wrong environment or kind.

    Args:
        expect_env: refuse the checkpoint if its A or S does not match this environment.
        kind: refuse a checkpoint of another model kind ("spice" or "dpt").
    """
    directory = Path(directory)
    meta = read_meta(directory)
    if kind is not None and meta.get("kind") != kind:
        raise CheckpointError(f"checkpoint {directory} holds a {meta.get('kind')!r} model, "
                              f"not {kind!r}")
    if expect_env is not None:
        check_env(meta, expect_env, str(directory))
    return meta, _load_file(directory, WEIGHTS, meta)


def load_training_state(directory: str | Path) -> tuple[dict[str, Any], dict[str, Any],
                                                        dict[str, Any] | None]:
    """(meta, model state_dict, optimizer state or None) for resuming training."""
    directory = Path(directory)
    meta = read_meta(directory)
    weights = _load_file(directory, WEIGHTS, meta)
    opt = _load_file(directory, OPTIMIZER, meta) if OPTIMIZER in meta.get("files", {}) else None
    return meta, weights, opt
