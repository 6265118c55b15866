"""The one model registry: kind name -> model class, and building models from configs,
checkpoint payloads or checkpoint directories."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from spice_ray.config import EnvConfig, ExperimentConfig
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


def build_model(kind: str, cfg: ExperimentConfig, generator: torch.Generator | None = None
                ) -> TrunkModel:
    """A freshly initialised model of ``kind`` for ``cfg``'s environment and sizes."""
    return model_class(kind)(cfg.model, cfg.env.num_actions, cfg.env.state_dim,
                             cfg.env.horizon + 1, generator=generator)


def model_payload(model: TrunkModel) -> dict[str, Any]:
    """An in-memory checkpoint: the architecture spec and CPU weights (buffers included)."""
    return {"spec": model.spec(),
            "state_dict": {k: v.detach().cpu() for k, v in model.state_dict().items()}}


def load_model(source: ModelSource, expect_env: EnvConfig | None = None,
               kind: str | None = None) -> TrunkModel:
    """The one way to load a model: from a checkpoint directory (weights checksummed, loaded
    with ``weights_only``) or an in-memory :func:`model_payload`; in eval mode.

    Args:
        expect_env: a model built for another A or state width is refused.
        kind: the model kind it must be ("spice", "dpt"); None: any.

    Raises:
        CheckpointError: the checkpoint or payload is not of ``kind`` or does not fit
            ``expect_env``.
    """
    if not isinstance(source, Mapping):
        meta, state = load_state(Path(source), expect_env, kind)
        spec = meta["spec"]
    else:
        spec, state = source["spec"], source["state_dict"]
        if kind is not None and spec.get("kind") != kind:
            raise CheckpointError(f"model payload is of kind {spec.get('kind')!r}, not {kind!r}")
        if expect_env is not None and (spec["num_actions"], spec["state_dim"]) != (
                expect_env.num_actions, expect_env.state_dim):
            raise CheckpointError(f"model has {spec['num_actions']} actions and state dim "
                                  f"{spec['state_dim']}; env {expect_env.name} needs "
                                  f"{expect_env.num_actions} and {expect_env.state_dim}")
    model = model_class(spec.get("kind", "")).from_spec(spec)
    model.load_state_dict(state)
    return model.eval()
