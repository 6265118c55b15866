"""Run configuration: frozen sections (``sections``), building and layering (``build``),
presets (``presets``).

The names below are importable from here and load their module on first use (``from
spice_ray.config import make_config`` imports ``build``), so ``spice_ray.config.presets`` and
``spice_ray.config.grids`` stay cheap for the command lines' ``--help``.
"""

from __future__ import annotations

from typing import Any

from spice_ray.common.lazy import lazy_exports

_exported, __dir__, __all__ = lazy_exports(__name__, {
    "build": ("config_hash", "deep_merge", "env_from_dict", "from_dict", "load_config",
              "load_yaml", "make_config", "parse_set", "preset_dict", "resolve_run_dir",
              "with_overrides"),
    "presets": ("PRESETS", "PRESET_NAMES"),
    "run": ("WIDTH_SOURCES", "EvalConfig", "ExperimentConfig", "FusionConfig", "SweepConfig"),
    "sections": ("HEAD_KERNELS", "ConfigError", "DataConfig", "EnvConfig", "ModelConfig",
                 "TrainConfig", "to_plain", "without_later_defaults"),
})

_RENAMED_WARNED: list[str] = []


def __getattr__(name: str) -> Any:
    """Each exported name from its module, on first use; ``RunConfig``, the old name of
    :class:`ExperimentConfig` (renamed so it is never taken for Ray's ``RunConfig``), still
    importable with one FutureWarning."""
    if name == "RunConfig":
        import warnings

        if not _RENAMED_WARNED:
            _RENAMED_WARNED.append(name)
            warnings.warn("spice_ray.config.RunConfig is renamed ExperimentConfig; the old "
                          "name still works for now", FutureWarning, stacklevel=2)
        return _exported("ExperimentConfig")
    return _exported(name)
