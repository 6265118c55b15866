"""The checkpoint format: a directory that rebuilds a model with nothing else.

This module reads and writes the files; it imports no model class: the registry's
``spice_ray.model.registry.load_model`` is the one way to turn a checkpoint into a model. One
format serves every model the platform writes: a training checkpoint (``final/`` and the
``epoch-*`` ones), and a policy's ``save_pretrained`` folder, which adds its options and a
model card.

Layout::

    <checkpoint>/
      meta.json          kind, architecture spec, run config, dataset content hash, epoch,
                         metrics, the names of the files below (a policy's: also its options)
      model.safetensors  the model's state_dict (safetensors: tensors only, reading runs no code)
      optimizer.pt       optimizer (+ scheduler) state, for resuming (torch.load, weights_only)
      README.md          a policy's model card (``save_pretrained`` only)
      *.sha256           a SHA-256 sidecar per file, the format of every artifact
                         (``spice_ray.common.artifacts.publish_dir`` writes the directory)

Loading never unpickles arbitrary objects, and every file is checked against its sidecar
first, so a corrupted, truncated or edited file is named instead of half-loaded: an edited
``spec`` or ``config`` would rebuild a different model. Checkpoints written before 2026-11-26
hold their weights in ``weights.pt`` (``torch.load(weights_only=True)``: tensors and plain
containers only) and still load; checkpoints written before the sidecars (meta.json's
``files`` mapping each name to its SHA-256) too, checked against that mapping.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from spice_ray.common.artifacts import (
    UnreadableFile,
    file_sha256,
    publish_dir,
    read_json,
    verify,
    write_checked_text,
)
from spice_ray.common.errors import SpiceRayError
from spice_ray.config import EnvConfig, ExperimentConfig

META = "meta.json"
WEIGHTS = "model.safetensors"
"""The model's weights, in every checkpoint this version writes."""
LEGACY_WEIGHTS = "weights.pt"
"""Where checkpoints written before 2026-11-26 hold their weights (read, never written)."""
OPTIMIZER = "optimizer.pt"


META_KEYS = ("kind", "spec", "config", "dataset_hash", "epoch", "files")
"""What every meta.json holds (``save_checkpoint`` writes them all)."""


class CheckpointError(SpiceRayError, RuntimeError):
    """A checkpoint is missing, corrupted, or does not fit the environment."""


def _umask() -> int:
    """The process's umask, read without changing it (Linux), else set and restored."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def save_checkpoint(
    directory: str | Path,
    model: Any,
    cfg: ExperimentConfig,
    dataset_hash: str,
    epoch: int,
    metrics: dict[str, float] | None = None,
    optimizer_state: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
    texts: dict[str, str] | None = None,
) -> Path:
    """Write a checkpoint directory atomically (temp dir + rename) and return its path.

    Args:
        model: any module with ``KIND``, ``spec()`` and ``state_dict()`` (a TrunkModel).
        extra: more fields of meta.json (a policy's options, the training identity).
        texts: more files by name, e.g. a model card (each listed and checksummed).
    """
    from safetensors.torch import save_file

    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}

    def write(tmp: Path) -> None:
        save_file(state, str(tmp / WEIGHTS))
        os.chmod(tmp / WEIGHTS, 0o666 & ~_umask())  # safetensors writes 0600; as its siblings
        files = [WEIGHTS]
        if optimizer_state is not None:
            torch.save(optimizer_state, tmp / OPTIMIZER)
            files.append(OPTIMIZER)
        for name, text in (texts or {}).items():
            (tmp / name).write_text(text)
            files.append(name)
        meta = {
            "kind": model.KIND,
            "spec": model.spec(),
            "config": cfg.to_dict(),
            "dataset_hash": dataset_hash,
            "epoch": int(epoch),
            "metrics": {k: float(v) for k, v in (metrics or {}).items()},
            "files": files,
            **(extra or {}),
        }
        (tmp / META).write_text(json.dumps(meta, indent=1))

    # every file, meta.json included, gets its SHA-256 sidecar as every other artifact does
    return publish_dir(directory, write)


def write_meta(directory: str | Path, meta: dict[str, Any]) -> Path:
    """Write ``meta.json`` and its SHA-256 sidecar into an existing checkpoint directory,
    atomically (the sidecar after the file, as every checked write)."""
    path = Path(directory) / META
    write_checked_text(path, json.dumps(meta, indent=1))
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
    files = meta.get("files")
    if missing or not isinstance(meta["spec"], dict) or not (
            isinstance(files, dict) or (isinstance(files, list)
                                        and all(isinstance(f, str) for f in files))):
        raise CheckpointError(f"checkpoint file {path} is incomplete: "
                              f"{', '.join(missing) or 'spec or files'} missing or malformed")
    return meta


def _checked_sha256(directory: Path, name: str, meta: dict[str, Any]) -> str:
    """The SHA-256 of a checkpoint file, checked against its sidecar (or, for a checkpoint
    written before sidecars, against meta.json's mapping); a CheckpointError names it."""
    path = directory / name
    if name not in meta["files"]:
        raise CheckpointError(f"checkpoint file {path} is not listed in {directory / META}")
    if not path.is_file():
        raise CheckpointError(f"checkpoint file {path} is missing")
    if isinstance(meta["files"], dict):  # the format before sidecars
        digest = file_sha256(path)
        if digest != meta["files"][name]:
            raise CheckpointError(f"checkpoint file {path} fails its SHA-256 checksum "
                                  "(corrupted or truncated)")
        return digest
    record, reason = verify(path)
    if record is None:
        raise CheckpointError(f"checkpoint file {path} fails its SHA-256 checksum ({reason})")
    return str(record["sha256"])


def drop_optimizer(directory: str | Path) -> Path:
    """Make a checkpoint weights-only: its weights checked against their sidecar, then
    ``optimizer.pt`` taken off meta.json's list of files (meta.json rewritten with its sidecar)
    and deleted if present. The result loads, scores and settles as a training's final like
    any checkpoint; it cannot resume a training. For shipping a training's earlier
    checkpoints at a third of their size (a device run packs them so), and for one whose
    optimiser file was left behind.

    Raises:
        CheckpointError: naming the file, when meta.json or the weights fail their check.
    """
    directory = Path(directory)
    meta = read_meta(directory)
    _checked_sha256(directory, weights_file(meta), meta)
    if isinstance(meta["files"], dict):
        raise CheckpointError(f"{directory / META} is of the format before sidecars: not "
                              "rewritten")
    if OPTIMIZER in meta["files"]:
        write_meta(directory, {**meta, "files": [f for f in meta["files"] if f != OPTIMIZER]})
    for name in (OPTIMIZER, OPTIMIZER + ".sha256"):
        (directory / name).unlink(missing_ok=True)
    return directory


def weights_file(meta: dict[str, Any]) -> str:
    """The name of a checkpoint's weights file (:data:`WEIGHTS`, or an older checkpoint's
    :data:`LEGACY_WEIGHTS`), from its meta.json's list of files."""
    return LEGACY_WEIGHTS if LEGACY_WEIGHTS in meta["files"] and WEIGHTS not in meta["files"] \
        else WEIGHTS


def content_id(directory: str | Path) -> str:
    """A checkpoint by content, not by path: its job identity (or kind and epoch) and the
    SHA-256 of its weights (checked against their sidecar)."""
    meta = read_meta(directory)
    who = meta.get("identity") or f"{meta.get('kind')}@{meta.get('epoch')}"
    return f"{who}:{_checked_sha256(Path(directory), weights_file(meta), meta)}"


def nonfinite_names(state: dict[str, Any]) -> list[str]:
    """The floating-point tensors of a state dict that hold a NaN or an infinity."""
    return [k for k, v in state.items()
            if torch.is_tensor(v) and v.is_floating_point() and not torch.isfinite(v).all()]


def _load_file(directory: Path, name: str, meta: dict[str, Any]) -> Any:
    _checked_sha256(directory, name, meta)
    path = directory / name
    if name == WEIGHTS:
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            state = load_file(str(path))
        except (SafetensorError, OSError) as exc:
            raise CheckpointError(f"checkpoint file {path} is not safetensors weights "
                                  f"({exc})") from None
    else:
        import pickle

        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError:  # torch's message advises weights_only=False: never
            raise CheckpointError(f"checkpoint file {path} holds pickled objects other than "
                                  "tensors and plain containers: refused, nothing in it was "
                                  "run") from None
    if name in (WEIGHTS, LEGACY_WEIGHTS):
        bad = nonfinite_names(state)
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
    return meta, _load_file(directory, weights_file(meta), meta)


def load_training_state(directory: str | Path) -> tuple[dict[str, Any], dict[str, Any],
                                                        dict[str, Any] | None]:
    """(meta, model state_dict, optimizer state or None) for resuming training."""
    directory = Path(directory)
    meta = read_meta(directory)
    weights = _load_file(directory, weights_file(meta), meta)
    opt = _load_file(directory, OPTIMIZER, meta) if OPTIMIZER in meta["files"] else None
    return meta, weights, opt
