"""The one model registry: kind name -> model class, and building models from configs,
checkpoint payloads or checkpoint directories."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from spice_ray.config import EnvConfig, RunConfig
from spice_ray.model.checkpoint import CheckpointError, load_state
from spice_ray.model.dpt import DptModel
from spice_ray.model.spice import SpiceModel
from spice_ray.model.trunk import TrunkModel

MODELS: dict[str, type[TrunkModel]] = {"spice": SpiceModel, "dpt": DptModel}
"""Model kinds: ``spice`` (policy head and value ensemble) and ``dpt`` (policy head only; it
is AD-BC when trained on weak labels)."""

ModelSource = str | Path | Mapping[str, Any]
"""A checkpoint directory, or a payload {"spec": model.spec(), "state_dict": ...}."""


def model_class(kind: str) -> type[TrunkModel]:
    """The class of a model kind.

    Raises:
        ValueError: naming the kinds.
    """
    try:
        return MODELS[kind]
    except KeyError:
        raise ValueError(f"model kind {kind!r} is invalid: one of {', '.join(MODELS)}") from None


def build_model(kind: str, cfg: RunConfig, generator: torch.Generator | None = None
                ) -> TrunkModel:
    """A freshly initialised model of ``kind`` for ``cfg``'s environment and sizes."""
    return model_class(kind)(cfg.model, cfg.env.num_actions, cfg.env.state_dim,
                             cfg.env.horizon + 1, generator=generator)


def load_model(directory: str | Path, expect_env: EnvConfig | None = None,
               kind: str | None = None) -> TrunkModel:
    """Rebuild a model from a checkpoint directory (weights verified, weights_only load)."""
    meta, state = load_state(directory, expect_env, kind)
    model = model_class(meta["kind"]).from_spec(meta["spec"])
    model.load_state_dict(state)
    return model.eval()


def model_payload(model: TrunkModel) -> dict[str, Any]:
    """An in-memory checkpoint: the architecture spec and CPU weights (buffers included)."""
    return {"spec": model.spec(),
            "state_dict": {k: v.detach().cpu() for k, v in model.state_dict().items()}}


def from_source(source: ModelSource, expect_env: EnvConfig | None = None) -> TrunkModel:
    """A model from a checkpoint directory or a :func:`model_payload`.

    Raises:
        CheckpointError: the checkpoint or payload does not fit ``expect_env``.
    """
    if not isinstance(source, Mapping):
        return load_model(Path(source), expect_env=expect_env)
    spec = source["spec"]
    if expect_env is not None and (spec["num_actions"], spec["state_dim"]) != (
            expect_env.num_actions, expect_env.state_dim):
        raise CheckpointError(f"model has {spec['num_actions']} actions and state dim "
                              f"{spec['state_dim']}; env {expect_env.name} needs "
                              f"{expect_env.num_actions} and {expect_env.state_dim}")
    model = model_class(spec.get("kind", "")).from_spec(spec)
    model.load_state_dict(source["state_dict"])
    return model.eval()
