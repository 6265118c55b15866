"""Trial parameters: nested dicts of config sections, applied over a base config and validated.

Trial parameters (the Tune ``param_space`` / ``result.config``) look like
``{"fusion": {"kernel": "rbf", "tau": 0.5}}`` or ``{"model": {"ensemble_size": 4}}``; the
sections fusion, model, train and eval are merged over the base config, and the special key
``"variant"`` selects a weight-ablation variant (``"all"`` switches every weight on).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Mapping
from typing import Any

from spice_ray.config import RunConfig, deep_merge, from_dict
from spice_ray.errors import SpiceRayError
from spice_ray.experiments import WEIGHT_VARIANTS

PARAM_SECTIONS = ("fusion", "model", "train", "eval")
"""Config sections a trial may override."""
VARIANT_KEY = "variant"
"""Trial parameter selecting a weight-ablation variant (none, iw, adv, epi, all)."""


class SweepError(SpiceRayError, RuntimeError):
    """A sweep could not complete (errored trials, changed inputs, missing checkpoints)."""


class SweepFault(RuntimeError):
    """Raised on purpose by a trial selected by the fault-injection switch (tests)."""



def apply_params(base: RunConfig, params: Mapping[str, Any]) -> RunConfig:
    """The base config with a trial's overrides applied and validated.

    Args:
        base: the sweep's base config.
        params: trial parameters: sections of :data:`PARAM_SECTIONS` (nested dicts of fields)
            and optionally :data:`VARIANT_KEY`.

    Raises:
        SweepError: a key that is neither a section nor the variant.
        ConfigError: an override is invalid (names the field).
    """
    unknown = set(params) - set(PARAM_SECTIONS) - {VARIANT_KEY}
    if unknown:
        raise SweepError(f"trial parameters {sorted(unknown)} are invalid: use the sections "
                         f"{', '.join(PARAM_SECTIONS)} or {VARIANT_KEY!r}")
    sections = {k: v for k, v in params.items() if k in PARAM_SECTIONS}
    cfg = from_dict(deep_merge(base.to_dict(), sections)) if sections else base
    variant = params.get(VARIANT_KEY)
    if variant is None:
        return cfg
    if variant == "all":
        return cfg.replace(train=dataclasses.replace(cfg.train, use_iw=True, use_adv=True,
                                                     use_epi=True))
    if variant not in WEIGHT_VARIANTS:
        raise SweepError(f"{VARIANT_KEY}={variant!r} is invalid: one of "
                         f"{', '.join([*WEIGHT_VARIANTS, 'all'])}")
    iw, adv, epi = WEIGHT_VARIANTS[variant]
    return cfg.replace(train=dataclasses.replace(cfg.train, use_iw=iw, use_adv=adv, use_epi=epi))


def flatten_params(params: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"fusion": {"tau": 0.5}}`` -> ``{"fusion.tau": 0.5}``."""
    out: dict[str, Any] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten_params(value, f"{name}."))
        else:
            out[name] = value
    return out


def params_json(params: Mapping[str, Any]) -> str:
    """Compact, key-sorted JSON of trial parameters (the ``params`` column)."""
    return json.dumps(params, sort_keys=True, separators=(",", ":"), default=str)


def _is_grid(value: Any) -> bool:
    return isinstance(value, Mapping) and set(value) == {"grid_search"}


def expand_grid(space: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every trial's parameters of a search space built from ``tune.grid_search`` (nested).

    Only grid searches and constants are supported (the sweeps here are plain grids).

    Raises:
        SweepError: the space holds a random sampler (e.g. ``tune.uniform``).
    """
    keys = list(space)
    options: list[list[Any]] = []
    for key in keys:
        value = space[key]
        if _is_grid(value):
            choices = list(value["grid_search"])
        elif isinstance(value, Mapping):
            choices = expand_grid(value)
        elif hasattr(value, "sample"):
            raise SweepError(f"search space key {key!r} is a random sampler; only "
                             "tune.grid_search is supported")
        else:
            choices = [value]
        options.append(choices)
    return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*options)]


def _matches(params: Mapping[str, Any], selector: Mapping[str, Any] | None) -> bool:
    if not selector:
        return False
    flat = flatten_params(params)
    return all(k in flat and flat[k] == v for k, v in selector.items())


