"""The one model registry: kind name -> model class, and building models from configs,
checkpoint payloads or checkpoint directories."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from spice_ray.config import EnvConfig, ExperimentConfig
from spice_ray.model.checkpoint import META, CheckpointError, load_state
from spice_ray.model.dpt import DptModel
from spice_ray.model.spice import SpiceModel
from spice_ray.model.trunk import TrunkModel

MODELS: dict[str, type[TrunkModel]] = {"spice": SpiceModel, "dpt": DptModel}
"""Model kinds: ``spice`` (policy head and value ensemble) and ``dpt`` (policy head only; it
is AD-BC when trained on weak labels)."""

ModelSource = str | Path | Mapping[str, Any]
"""A checkpoint directory, or a payload {"spec": model.spec(), "state_dict": ...}."""


@contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """Run the block's torch operators on ``count`` intra-op threads, then give the caller's
    count back (also after an error). Model forwards that must match an evaluation actor's or a
    Train worker's (one thread) run inside it: at two threads the compiled heads' results
    depended on scheduling when the CPU was contended."""
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


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


def model_shape(kind: str, cfg: ExperimentConfig) -> TrunkModel:
    """A ``kind`` model for ``cfg`` on the meta device: its architecture, parameter shapes and
    spec, with no memory and no value drawn (torch's meta ``normal_`` costs ~1 s the first
    time in a process, a lazy import, which every command and actor that checks a model paid)."""
    normal = torch.nn.init.normal_
    # only meta tensors skip the draw: a model built at the same time elsewhere in the process
    # is still initialised
    torch.nn.init.normal_ = lambda tensor, *args, **kwargs: (
        tensor if tensor.is_meta else normal(tensor, *args, **kwargs))
    try:
        with torch.device("meta"):
            return build_model(kind, cfg)
    finally:
        torch.nn.init.normal_ = normal


def model_payload(model: TrunkModel) -> dict[str, Any]:
    """An in-memory checkpoint: the architecture spec and CPU weights (buffers included)."""
    return {"spec": model.spec(),
            "state_dict": {k: v.detach().cpu() for k, v in model.state_dict().items()}}


def planned_spec(meta: dict[str, Any], where: Path, memory: int | None = None
                 ) -> dict[str, Any]:
    """A checkpoint's architecture, once it is the one its own run config builds and, given
    ``memory`` (bytes), its fp32 weights fit in it: checked before the model is allocated, so
    a hand-edited ``max_len`` or width is refused, not allocated.

    Raises:
        CheckpointError: naming the file and the field.
    """
    from spice_ray.common.errors import excerpt
    from spice_ray.config import ConfigError, from_dict

    try:
        cfg = from_dict(meta["config"])
    except (KeyError, TypeError, ValueError, AttributeError, ConfigError) as exc:
        raise CheckpointError(f"{where}: field config is not a run config "
                              f"({excerpt(str(exc))})") from None
    shape = model_shape(str(meta.get("kind")), cfg)  # no memory: the architecture only
    expected = shape.spec()
    if meta.get("spec") != expected:
        got = meta.get("spec") if isinstance(meta.get("spec"), dict) else {}
        fields = sorted(k for k in set(expected) | set(got) if got.get(k) != expected.get(k))
        raise CheckpointError(f"{where}: field spec ({', '.join(fields) or 'its type'}) is "
                              "not the architecture its run config builds: edited by hand?")
    weights = 4 * sum(t.numel() for t in (*shape.parameters(), *shape.buffers()))
    if memory is not None and weights > memory:
        raise CheckpointError(f"{where}: the model's weights need ~{weights / 2**30:.1f} GiB, "
                              "more than this machine's available memory")
    return expected


def load_model(source: ModelSource, expect_env: EnvConfig | None = None,
               kind: str | None = None, memory: int | None = None) -> TrunkModel:
    """The one way to load a model: from a checkpoint directory (``spice_ray.model.
    checkpoint``'s format, which training, the study and ``save_pretrained`` all write: every
    file checked against its checksum, the architecture against its run config, the weights
    for finiteness) or an in-memory :func:`model_payload`; in eval mode.

    Args:
        expect_env: a model built for another A or state width is refused.
        kind: the model kind it must be ("spice", "dpt"); None: any.
        memory: refuse a checkpoint whose weights would need more bytes than this.

    Raises:
        CheckpointError: the checkpoint or payload is not of ``kind``, does not fit
            ``expect_env`` or ``memory``, or its files are not what its meta.json says.
    """
    if not isinstance(source, Mapping):
        return load_checkpoint(source, expect_env, kind, memory)[0]
    spec, state = source["spec"], source["state_dict"]
    if kind is not None and spec.get("kind") != kind:
        raise CheckpointError(f"model payload is of kind {spec.get('kind')!r}, not {kind!r}")
    if expect_env is not None and (spec["num_actions"], spec["state_dim"]) != (
            expect_env.num_actions, expect_env.state_dim):
        raise CheckpointError(f"model has {spec['num_actions']} actions and state dim "
                              f"{spec['state_dim']}; env {expect_env.name} needs "
                              f"{expect_env.num_actions} and {expect_env.state_dim}")
    return _with_weights(spec, state, "the payload")


def load_checkpoint(directory: str | Path, expect_env: EnvConfig | None = None,
                    kind: str | None = None, memory: int | None = None
                    ) -> tuple[TrunkModel, dict[str, Any]]:
    """:func:`load_model` of a checkpoint directory, with the ``meta.json`` it was checked
    against (its run config, seed, origin): read once, so what a caller reads is what was
    verified."""
    directory = Path(directory)
    meta, state = load_state(directory, expect_env, kind)
    spec = planned_spec(meta, directory / META, memory)
    return _with_weights(spec, state, str(directory)), meta


def _with_weights(spec: dict[str, Any], state: dict[str, Any], where: str) -> TrunkModel:
    """The model ``spec`` describes, holding ``state``, in eval mode."""
    model = model_class(spec.get("kind", "")).from_spec(spec)
    try:
        model.load_state_dict(state)
    except RuntimeError as exc:
        raise CheckpointError(f"{where} does not hold this model's weights: "
                              f"{str(exc).splitlines()[0][:200]}") from None
    return model.eval()
