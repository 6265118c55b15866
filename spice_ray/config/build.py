"""Building configs: YAML files, ``--set`` overrides, presets and type checks.

Layering, lowest first: dataclass defaults -> the environment's defaults (its ``defaults``)
-> the preset (smoke / small / paper) -> a YAML file -> ``extra`` -> ``--set
section.field=value`` overrides. Values are checked against the dataclass annotations (a YAML
``"lots"`` for an int is refused; ``3e-3`` is a float), unknown keys are errors naming the
allowed ones, and the ``env`` section's extra keys are the environment's own fields.

Every value a user writes (a YAML file, a ``--set`` value) is parsed by
``spice_ray.config.yamlfile.parse_yaml``, within limits that make hostile input cheap to
refuse.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
import types
import typing
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from spice_ray import envs
from spice_ray.common.errors import EXCERPT_CHARS, Excerpt, excerpt
from spice_ray.config.presets import PRESET_NAMES, PRESETS
from spice_ray.config.run import ExperimentConfig
from spice_ray.config.sections import (
    ConfigError,
    EnvConfig,
    _check,
    _fail,
    to_plain,
)
from spice_ray.config.yamlfile import MAX_KEY_CHARS, load_yaml, parse_yaml

_FLOAT_RE = re.compile(r"^[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?$")


def config_hash(obj: dict[str, Any]) -> str:
    """Stable short hash of a plain (JSON-able) dict."""
    text = json.dumps(to_plain(obj), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# ---- parsing user YAML, within limits ------------------------------------------------------

# ---- building from dicts, with type checks ---------------------------------------------


def _coerce(path: str, value: Any, tp: Any) -> Any:
    """Check ``value`` against the annotation ``tp`` and return it in canonical form."""
    origin = typing.get_origin(tp)
    shown = Excerpt(value)  # a refusal shows an excerpt, never the whole value
    if tp is EnvConfig:
        if not isinstance(value, dict):
            _fail(path, shown, "a mapping of env fields")
        return _build_env(value, path)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            _fail(path, shown, f"a mapping of {tp.__name__} fields")
        return _build(tp, value, path)
    if origin is Literal:
        allowed = typing.get_args(tp)
        # by type as well as value: 1 is not true, and "true" in YAML is the bool
        _check(any(value == a and type(value) is type(a) for a in allowed), path, shown,
               f"one of {', '.join(_literal_text(a) for a in allowed)}")
        return value
    if origin is tuple:
        (item_tp, _ellipsis) = typing.get_args(tp)
        if not isinstance(value, (list, tuple)):
            _fail(path, shown, f"a list of {item_tp.__name__}")
        return tuple(_coerce(f"{path}[{i}]", v, item_tp) for i, v in enumerate(value))
    if origin in (typing.Union, types.UnionType):
        raise TypeError(f"unsupported annotation {tp} at {path}")
    if tp is bool:
        _check(isinstance(value, bool), path, shown, "true or false")
        return value
    if tp is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
        if not ok and isinstance(value, float) and value.is_integer():
            return int(value)
        _check(ok, path, shown, "an integer")
        return value
    if tp is float:
        if isinstance(value, str) and _FLOAT_RE.match(value.strip()):
            value = float(value)  # YAML 1.1 reads "3e-3" (no dot) as a string
            shown = Excerpt(value)
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        _check(ok, path, shown, "a number")
        _check(math.isfinite(float(value)), path, shown, "a finite number")
        return float(value)
    if tp is str:
        _check(isinstance(value, str), path, shown, "a string")
        return value
    raise TypeError(f"unsupported annotation {tp} at {path}")


def _literal_text(value: Any) -> str:
    """A Literal's allowed value as a user types it (YAML's true / false for bools)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def _build_env(values: dict[str, Any], prefix: str = "env") -> EnvConfig:
    """The ``env`` section: ``name`` picks the environment, whose ``Params`` take every key
    but ``name`` and ``horizon``."""
    name = _coerce(f"{prefix}.name", values.get("name", EnvConfig.name), str)
    try:
        cls = envs.env_class(name)
    except KeyError as exc:
        raise _shortened(ConfigError(exc.args[0]), [name]) from None
    own = {k: v for k, v in values.items() if k not in ("name", "horizon")}
    allowed = ["name", "horizon", *(f.name for f in dataclasses.fields(cls.Params))]
    for key in own:
        if key not in allowed:
            raise ConfigError(f"unknown key {prefix}.{excerpt(key)} for env.name={name}; "
                              f"allowed keys: {', '.join(allowed)}")
    params = _build(cls.Params, own, prefix)
    horizon = _coerce(f"{prefix}.horizon", values.get("horizon", EnvConfig.horizon), int)
    try:
        return EnvConfig(name=name, horizon=horizon, params=params)
    except ConfigError as exc:
        raise _shortened(exc, [horizon, *dataclasses.astuple(params)]) from None


RENAMED = {"data.num_actors": "data.concurrent_tasks", "data.actor_cpus": "data.task_cpus"}
"""Old config keys that still work (a warning, once per key and process) under their new
names: configs and checkpoints written before the rename keep loading."""
_WARNED: set[str] = set()


def _renamed(values: dict[str, Any], prefix: str) -> dict[str, Any]:
    """``values`` with deprecated keys of section ``prefix`` under their new names.

    Raises:
        ConfigError: a key is given under both names.
    """
    out = dict(values)
    for old, new in RENAMED.items():
        section, old_key = old.rsplit(".", 1)
        new_key = new.rsplit(".", 1)[1]
        if section != prefix or old_key not in out:
            continue
        if new_key in out:
            raise ConfigError(f"{old} and {new} are both given; {old} is the old name of "
                              f"{new}: keep one")
        if old not in _WARNED:
            _WARNED.add(old)
            warnings.warn(f"config key {old} is renamed {new}; the old name still works for "
                          "now", FutureWarning, stacklevel=4)
        out[new_key] = out.pop(old_key)
    return out


def _build(cls: type, values: dict[str, Any], prefix: str = "") -> Any:
    """Build dataclass ``cls`` from a (partial) dict; unknown keys are errors (old names of
    renamed keys are taken, with a warning: :data:`RENAMED`)."""
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs: dict[str, Any] = {}
    for key, value in _renamed(values, prefix).items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if key not in names:
            raise ConfigError(f"unknown key {excerpt(path)}; allowed keys: {', '.join(names)}")
        kwargs[key] = _coerce(path, value, hints[key])
    try:
        return cls(**kwargs)
    except ConfigError as exc:
        raise _shortened(exc, kwargs.values()) from None


def _shortened(exc: ConfigError, values: Iterable[Any]) -> ConfigError:
    """``exc`` with every long value of ``values`` in its message cut to an excerpt: a
    section's own checks (``__post_init__``) name the value in full, and a user's value (a
    label, a list of seeds) can be thousands of characters long."""
    message = str(exc)
    for value in values:
        if isinstance(value, (str, tuple)):  # only these can be long once type-checked
            for text in (repr(value), str(value)):  # {value!r}, else {value}
                if len(text) > EXCERPT_CHARS and text in message:
                    message = message.replace(text, excerpt(value))
                    break
    return ConfigError(message)


def deep_merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in update.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def parse_set(items: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """Turn ``["data.num_train_tasks=2000", ...]`` into a nested dict (values parsed as YAML)."""
    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"--set {excerpt(item)}: expected section.field=value")
        key, raw = item.split("=", 1)
        key = key.strip()
        if not key or any(not part for part in key.split(".")):
            raise ConfigError(f"--set {excerpt(item)}: empty key")
        if len(key) > MAX_KEY_CHARS:
            raise ConfigError(f"--set {excerpt(key)}: a key over {MAX_KEY_CHARS} characters")
        value = parse_yaml(raw, f"--set {key}") if raw.strip() else ""
        if isinstance(value, str) and key == "data.label":
            value = raw.strip()  # keep 'mix:0.8' a string
        node = out
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {key}: {excerpt(part)} is not a section")
        node[parts[-1]] = value
    return out


def preset_entry(preset: str, cls: type) -> dict[str, Any]:
    """What ``preset`` changes for environment class ``cls``: the nearest class along its bases
    (itself first) with an entry, ``PRESETS[preset][name]`` before that class's own
    ``presets``; none: nothing (its defaults). So a subclass of the bandit runs at the bandit's
    scales unless it declares its own, as it inherits the bandit's ``defaults``."""
    for klass in cls.__mro__:
        name = klass.__dict__.get("name")
        if isinstance(name, str) and name in PRESETS[preset]:
            return dict(PRESETS[preset][name])
        own = klass.__dict__.get("presets", {})
        if preset in own:
            return dict(own[preset])
    return {}


def preset_dict(preset: str, env: str) -> dict[str, Any]:
    """The nested override dict a preset applies for an environment: the environment's own
    ``defaults`` (paper scale), then the preset's entry for it (:func:`preset_entry`)."""
    if preset not in PRESET_NAMES:
        raise ConfigError(f"preset={preset!r} is invalid: one of {', '.join(PRESET_NAMES)}")
    try:
        cls = envs.env_class(env)
    except KeyError as exc:
        raise ConfigError(exc.args[0]) from None
    base = deep_merge({"env": {"name": env}}, {k: dict(v) for k, v in cls.defaults.items()})
    return deep_merge(base, deep_merge({"preset": preset}, preset_entry(preset, cls)))


def make_config(
    preset: str = "small",
    env: str = "bandit",
    yaml_path: str | Path | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    extra: dict[str, Any] | None = None,
) -> ExperimentConfig:
    """Resolve defaults -> env defaults -> preset -> YAML -> ``extra`` -> ``--set`` overrides.

    Raises:
        ConfigError: naming the first offending field, before anything runs.
    """
    file = load_yaml(yaml_path) if yaml_path is not None else {}
    sets = parse_set(list(overrides))
    for source, given in ((f"config file {yaml_path}", file), ("--set", sets)):
        _refuse_contradiction(source, "preset", given.get("preset"), preset, "--preset")
        named = given.get("env", {}).get("name") if isinstance(given.get("env"), dict) else None
        _refuse_contradiction(source, "env.name", named, env, "--env or --experiments")
    values = deep_merge(deep_merge(preset_dict(preset, env), file), extra or {})
    return _build(ExperimentConfig, deep_merge(values, sets))


def _refuse_contradiction(source: str, field: str, given: Any, chosen: str, flag: str) -> None:
    """What the command line chose (the preset, the environment: they decide every other
    default) is not overridden in silence by ``source``."""
    if given is not None and given != chosen:
        raise ConfigError(f"{field}={excerpt(given)} in {source} contradicts {field}="
                          f"{chosen!r} chosen by {flag}: choose it there")


def resolve_run_dir(out: str | Path | None, preset: str, yaml_path: str | Path | None = None,
                    overrides: list[str] | tuple[str, ...] = ()) -> Path:
    """The absolute run directory: ``--out``, else ``out_dir`` from ``--set``/YAML, else
    ``runs/<preset>``. Absolute because Ray workers run in other working directories.

    Raises:
        ConfigError: ``--out`` is empty, or ``out_dir`` is set to another directory as well
            (one run would be split over two directories).
    """
    user = parse_set(list(overrides)).get("out_dir")
    if user is None and yaml_path is not None:
        user = load_yaml(yaml_path).get("out_dir")
    if user is not None and (not isinstance(user, str) or not user.strip()):
        _fail("out_dir", Excerpt(user), "a non-empty path")
    if out is not None and not str(out).strip():
        _fail("--out", str(out), "a non-empty path")
    if out is not None and user is not None and Path(user).resolve() != Path(out).resolve():
        raise ConfigError(f"out_dir={excerpt(user)} (from --set or --config) conflicts with "
                          f"--out {excerpt(str(out))}; give the run directory once, with --out")
    chosen = out if out is not None else (user if user is not None else Path("runs") / preset)
    return Path(chosen).resolve()


def env_from_dict(values: dict[str, Any]) -> EnvConfig:
    """An EnvConfig from its flat dict (``EnvConfig.to_dict()``, a manifest's ``env``)."""
    return _build_env(dict(values))


def from_dict(values: dict[str, Any]) -> ExperimentConfig:
    """Build an ExperimentConfig from a complete or partial nested dict (a saved config.yaml)."""
    return _build(ExperimentConfig, values)


def with_overrides(cfg: ExperimentConfig, overrides: list[str] | tuple[str, ...] = ()
                   ) -> ExperimentConfig:
    """``cfg`` with ``--set`` style ``SECTION.FIELD=VALUE`` overrides applied (``cfg`` itself
    when there are none).

    Raises:
        ConfigError: an override is invalid (names the field).
    """
    return from_dict(deep_merge(cfg.to_dict(), parse_set(list(overrides)))) if overrides else cfg


def load_config(path: str | Path) -> ExperimentConfig:
    """Load a resolved config.yaml written by :meth:`ExperimentConfig.write`."""
    try:
        return from_dict(load_yaml(path))
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from exc
