"""Building configs: YAML files, ``--set`` overrides, presets and type checks.

Layering, lowest first: dataclass defaults -> the environment's defaults (its ``defaults``)
-> the preset (smoke / small / paper) -> a YAML file -> ``extra`` -> ``--set
section.field=value`` overrides. Values are checked against the dataclass annotations (a YAML
``"lots"`` for an int is refused; ``3e-3`` is a float), unknown keys are errors naming the
allowed ones, and the ``env`` section's extra keys are the environment's own fields.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
import types
import typing
from pathlib import Path
from typing import Any, Literal

import yaml

from spice_ray import envs
from spice_ray.config.presets import PRESETS
from spice_ray.config.run import RunConfig
from spice_ray.config.sections import (
    PRESET_NAMES,
    ConfigError,
    EnvConfig,
    _check,
    _fail,
    to_plain,
)

_FLOAT_RE = re.compile(r"^[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?$")


def config_hash(obj: dict[str, Any]) -> str:
    """Stable short hash of a plain (JSON-able) dict."""
    text = json.dumps(to_plain(obj), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# ---- building from dicts, with type checks ---------------------------------------------


def _coerce(path: str, value: Any, tp: Any) -> Any:
    """Check ``value`` against the annotation ``tp`` and return it in canonical form."""
    origin = typing.get_origin(tp)
    if tp is EnvConfig:
        if not isinstance(value, dict):
            _fail(path, value, "a mapping of env fields")
        return _build_env(value, path)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            _fail(path, value, f"a mapping of {tp.__name__} fields")
        return _build(tp, value, path)
    if origin is Literal:
        allowed = typing.get_args(tp)
        _check(value in allowed, path, value, f"one of {', '.join(map(str, allowed))}")
        return value
    if origin is tuple:
        (item_tp, _ellipsis) = typing.get_args(tp)
        if not isinstance(value, (list, tuple)):
            _fail(path, value, f"a list of {item_tp.__name__}")
        return tuple(_coerce(f"{path}[{i}]", v, item_tp) for i, v in enumerate(value))
    if origin in (typing.Union, types.UnionType):
        raise TypeError(f"unsupported annotation {tp} at {path}")
    if tp is bool:
        _check(isinstance(value, bool), path, value, "true or false")
        return value
    if tp is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
        if not ok and isinstance(value, float) and value.is_integer():
            return int(value)
        _check(ok, path, value, "an integer")
        return value
    if tp is float:
        if isinstance(value, str) and _FLOAT_RE.match(value.strip()):
            value = float(value)  # YAML 1.1 reads "3e-3" (no dot) as a string
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        _check(ok, path, value, "a number")
        _check(math.isfinite(float(value)), path, value, "a finite number")
        return float(value)
    if tp is str:
        _check(isinstance(value, str), path, value, "a string")
        return value
    raise TypeError(f"unsupported annotation {tp} at {path}")


def _build_env(values: dict[str, Any], prefix: str = "env") -> EnvConfig:
    """The ``env`` section: ``name`` picks the environment, whose ``Params`` take every key
    but ``name`` and ``horizon``."""
    name = _coerce(f"{prefix}.name", values.get("name", EnvConfig.name), str)
    try:
        cls = envs.env_class(name)
    except KeyError as exc:
        raise ConfigError(exc.args[0]) from None
    own = {k: v for k, v in values.items() if k not in ("name", "horizon")}
    allowed = ["name", "horizon", *(f.name for f in dataclasses.fields(cls.Params))]
    for key in own:
        if key not in allowed:
            raise ConfigError(f"unknown key {prefix}.{key!r} for env.name={name}; allowed keys: "
                              f"{', '.join(allowed)}")
    params = _build(cls.Params, own, prefix)
    horizon = _coerce(f"{prefix}.horizon", values.get("horizon", EnvConfig.horizon), int)
    return EnvConfig(name=name, horizon=horizon, params=params)


def _build(cls: type, values: dict[str, Any], prefix: str = "") -> Any:
    """Build dataclass ``cls`` from a (partial) dict; unknown keys are errors."""
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs: dict[str, Any] = {}
    for key, value in values.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if key not in names:
            raise ConfigError(f"unknown key {path!r}; allowed keys: {', '.join(names)}")
        kwargs[key] = _coerce(path, value, hints[key])
    return cls(**kwargs)


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
            raise ConfigError(f"--set {item!r}: expected section.field=value")
        key, raw = item.split("=", 1)
        key = key.strip()
        if not key or any(not part for part in key.split(".")):
            raise ConfigError(f"--set {item!r}: empty key")
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError as exc:
            raise ConfigError(f"--set {key}: cannot parse value {raw!r}: {exc}") from exc
        if isinstance(value, str) and key == "data.label":
            value = raw.strip()  # keep 'mix:0.8' a string
        node = out
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {key}: {part} is not a section")
        node[parts[-1]] = value
    return out


def preset_dict(preset: str, env: str) -> dict[str, Any]:
    """The nested override dict a preset applies for an environment: the environment's own
    ``defaults`` (paper scale), then the preset's entry for it."""
    if preset not in PRESET_NAMES:
        raise ConfigError(f"preset={preset!r} is invalid: one of {', '.join(PRESET_NAMES)}")
    try:
        cls = envs.env_class(env)
    except KeyError as exc:
        raise ConfigError(exc.args[0]) from None
    base = deep_merge({"env": {"name": env}}, {k: dict(v) for k, v in cls.defaults.items()})
    return deep_merge(base, deep_merge({"preset": preset}, PRESETS[preset].get(env, {})))


def make_config(
    preset: str = "small",
    env: str = "bandit",
    yaml_path: str | Path | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    extra: dict[str, Any] | None = None,
) -> RunConfig:
    """Resolve defaults -> env defaults -> preset -> YAML -> ``extra`` -> ``--set`` overrides.

    Raises:
        ConfigError: naming the first offending field, before anything runs.
    """
    values = preset_dict(preset, env)
    if yaml_path is not None:
        values = deep_merge(values, load_yaml(yaml_path))
    if extra:
        values = deep_merge(values, extra)
    values = deep_merge(values, parse_set(list(overrides)))
    return _build(RunConfig, values)


def load_yaml(path: str | Path, error: type[Exception] = ConfigError,
              allow_empty: bool = True) -> dict[str, Any]:
    """Read a YAML mapping, with a clear error naming the file.

    Args:
        error: exception class raised for a missing, unparsable or non-mapping file.
        allow_empty: an empty file is ``{}`` (config overrides) rather than an error.
    """
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_bytes().decode("utf-8"))
    except FileNotFoundError as exc:
        raise error(f"config file {path} does not exist") from exc
    except IsADirectoryError as exc:
        raise error(f"config file {path} is a directory, not a YAML file") from exc
    except UnicodeDecodeError as exc:
        raise error(f"config file {path} is not UTF-8 text ({exc.reason} at byte "
                    f"{exc.start})") from exc
    except OSError as exc:
        raise error(f"config file {path} cannot be read: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise error(f"config file {path} is not valid YAML: {exc}") from exc
    if data is None and allow_empty:
        return {}
    if not isinstance(data, dict):
        raise error(f"config file {path} must hold a mapping, got {type(data).__name__}")
    return data


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
        _fail("out_dir", user, "a non-empty path")
    if out is not None and not str(out).strip():
        _fail("--out", str(out), "a non-empty path")
    if out is not None and user is not None and Path(user).resolve() != Path(out).resolve():
        raise ConfigError(f"out_dir={user!r} (from --set or --config) conflicts with --out "
                          f"{str(out)!r}; give the run directory once, with --out")
    chosen = out if out is not None else (user if user is not None else Path("runs") / preset)
    return Path(chosen).resolve()


def env_from_dict(values: dict[str, Any]) -> EnvConfig:
    """An EnvConfig from its flat dict (``EnvConfig.to_dict()``, a manifest's ``env``)."""
    return _build_env(dict(values))


def from_dict(values: dict[str, Any]) -> RunConfig:
    """Build a RunConfig from a complete or partial nested dict (e.g. a saved config.yaml)."""
    return _build(RunConfig, values)


def load_config(path: str | Path) -> RunConfig:
    """Load a resolved config.yaml written by :meth:`RunConfig.write`."""
    try:
        return from_dict(load_yaml(path))
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from exc
