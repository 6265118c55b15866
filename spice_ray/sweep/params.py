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
from typing import TYPE_CHECKING, Any

from spice_ray.common.errors import SpiceRayError

if TYPE_CHECKING:
    from spice_ray.config import ExperimentConfig

PARAM_SECTIONS = ("fusion", "model", "train", "eval")
"""Config sections a trial may override."""
VARIANT_KEY = "variant"
"""Trial parameter selecting a weight-ablation variant (none, iw, adv, epi, all)."""


class SweepError(SpiceRayError, RuntimeError):
    """A sweep could not complete (errored trials, changed inputs, missing checkpoints)."""


class SweepFault(RuntimeError):
    """Raised on purpose by a trial selected by the fault-injection switch (tests)."""


@dataclasses.dataclass(frozen=True)
class Conditional:
    """A sampled key of a search space that exists only under a condition on keys before it.

    ``{"fusion": {"beta_schedule": tune.choice(["fixed", "sqrt2logt"]),
    "beta": Conditional(tune.loguniform(0.1, 10), when={"fusion.beta_schedule": ("fixed",)},
    otherwise=1.0)}}`` samples beta only for the fixed schedule; with sqrt2logt (which ignores
    beta) the trial carries ``otherwise``, so two trials that run the same configuration have the
    same parameters, and the searcher learns nothing about a beta that was never used. Only
    ``sweep.search=random|optuna`` take one (:mod:`spice_ray.sweep.search`).
    """

    domain: Any
    """The Tune domain sampled when the condition holds (``tune.loguniform``, ``choice``...)."""
    when: Mapping[str, tuple[Any, ...]]
    """Dotted key -> the values under which this key is sampled (every key must match); each
    key comes earlier in the space."""
    otherwise: Any
    """The value when the condition fails: the setting the configuration does not read."""

    def holds(self, values: Mapping[str, Any]) -> bool:
        """Whether the condition holds for the dotted values drawn so far."""
        return all(values.get(key) in allowed for key, allowed in self.when.items())


def apply_params(base: ExperimentConfig, params: Mapping[str, Any]) -> ExperimentConfig:
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
    from spice_ray.config import deep_merge, from_dict

    sections = {k: v for k, v in params.items() if k in PARAM_SECTIONS}
    cfg = from_dict(deep_merge(base.to_dict(), sections)) if sections else base
    variant = params.get(VARIANT_KEY)
    if variant is None:
        return cfg
    from spice_ray.study.experiments import WEIGHT_VARIANTS

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


def _is_domain(value: Any) -> bool:
    """A Tune search-space domain (``tune.uniform``, ``loguniform``, ``choice``, ...)."""
    return hasattr(value, "sample") and hasattr(value, "get_sampler")


def _is_sampler(value: Any) -> bool:
    """A key Tune or the searcher samples: a domain, or a :class:`Conditional` one."""
    return _is_domain(value) or isinstance(value, Conditional)


def _walk(space: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for key, value in space.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and not _is_grid(value):
            out += _walk(value, f"{name}.")
        else:
            out.append((name, value))
    return out


def samplers(space: Mapping[str, Any]) -> list[str]:
    """Dotted keys of the space's random samplers."""
    return [k for k, v in _walk(space) if _is_sampler(v)]


def grids(space: Mapping[str, Any]) -> list[str]:
    """Dotted keys of the space's ``tune.grid_search`` entries."""
    return [k for k, v in _walk(space) if _is_grid(v)]


def check_space(space: Mapping[str, Any], search: str) -> None:
    """Refuse a space the search cannot run: samplers in a grid search, grid searches in a
    sampled search (the searcher samples every key), a random search with nothing to sample,
    or a :class:`Conditional` whose condition names a key that does not come before it.

    Raises:
        SweepError: naming the key and the setting to change.
    """
    sampled, gridded = samplers(space), grids(space)
    seen: set[str] = set()
    for key, value in _walk(space):
        if isinstance(value, Conditional):
            later = [k for k in value.when if k not in seen]
            if later:
                raise SweepError(f"search space key {key!r} is sampled when {later[0]!r} has "
                                 "given values, but that key does not come before it; put it "
                                 "earlier in the space")
        seen.add(key)
    if search == "grid" and sampled:
        raise SweepError(f"search space key {sampled[0]!r} is a random sampler; set "
                         "sweep.search=random or sweep.search=optuna to sample it")
    if search in ("random", "optuna") and not sampled:
        raise SweepError(f"sweep.search={search} needs random samplers (tune.uniform, "
                         "tune.loguniform, tune.choice) in the search space; this one is a "
                         "grid: use sweep.search=grid")
    if search in ("random", "optuna") and gridded:
        raise SweepError(f"search space key {gridded[0]!r} is a grid search, which a sampled "
                         f"search (sweep.search={search}) cannot run; use tune.choice([...]) "
                         "for it")


def count_trials(space: Mapping[str, Any], num_samples: int) -> int:
    """Trials Tune will run: grid points x ``num_samples`` (samplers do not multiply)."""
    n = 1
    for _, value in _walk(space):
        if _is_grid(value):
            n *= len(value["grid_search"])
    return n * num_samples


def space_json(space: Mapping[str, Any]) -> str:
    """A search space as key-sorted JSON, samplers described by their class and bounds (not
    their memory address): the same space gives the same text in every process."""

    def describe(value: Any) -> Any:
        if isinstance(value, Conditional):
            return {"conditional": describe(value.domain),
                    "when": {k: list(v) for k, v in sorted(value.when.items())},
                    "otherwise": value.otherwise}
        if _is_domain(value):
            out = {"domain": type(value).__name__,
                   "sampler": type(value.get_sampler()).__name__}
            for attr in ("lower", "upper", "categories"):
                if hasattr(value, attr):
                    out[attr] = getattr(value, attr)
            inner = getattr(value.get_sampler(), "base", None)
            if inner is not None:
                out["base"] = inner
            q = getattr(value.get_sampler(), "q", None)
            if q is not None:
                out["q"] = q
            return out
        if isinstance(value, Mapping):
            return {k: describe(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [describe(v) for v in value]
        return value

    return json.dumps(describe(space), sort_keys=True, separators=(",", ":"), default=str)


def expand_grid(space: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every trial's parameters of a search space built from ``tune.grid_search`` (nested).

    Raises:
        SweepError: the space holds a random sampler (e.g. ``tune.uniform``): its trials are
            only known as Tune samples them.
    """
    keys = list(space)
    options: list[list[Any]] = []
    for key in keys:
        value = space[key]
        if _is_grid(value):
            choices = list(value["grid_search"])
        elif isinstance(value, Mapping):
            choices = expand_grid(value)
        elif _is_sampler(value):
            raise SweepError(f"search space key {key!r} is a random sampler: its trials are "
                             "not known before Tune samples them")
        else:
            choices = [value]
        options.append(choices)
    return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*options)]


def _matches(params: Mapping[str, Any], selector: Mapping[str, Any] | None) -> bool:
    if not selector:
        return False
    flat = flatten_params(params)
    return all(k in flat and flat[k] == v for k, v in selector.items())


