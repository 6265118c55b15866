"""Run configuration: frozen sections (``sections``), building and layering (``build``),
presets (``presets``)."""

from spice_ray.config.build import (
    config_hash,
    deep_merge,
    env_from_dict,
    from_dict,
    load_config,
    load_yaml,
    make_config,
    parse_set,
    preset_dict,
    resolve_run_dir,
)
from spice_ray.config.presets import PRESETS
from spice_ray.config.run import (
    WIDTH_SOURCES,
    EvalConfig,
    ExperimentConfig,
    FusionConfig,
    SweepConfig,
)
from spice_ray.config.sections import (
    HEAD_KERNELS,
    PRESET_NAMES,
    ConfigError,
    DataConfig,
    EnvConfig,
    ModelConfig,
    TrainConfig,
    to_plain,
    without_later_defaults,
)

__all__ = ["HEAD_KERNELS", "PRESETS", "PRESET_NAMES", "WIDTH_SOURCES", "ConfigError",
           "DataConfig", "EnvConfig",
           "EvalConfig", "FusionConfig", "ModelConfig", "ExperimentConfig", "SweepConfig",
           "TrainConfig", "config_hash", "deep_merge", "env_from_dict",
           "from_dict", "load_config", "load_yaml",
           "make_config", "parse_set", "preset_dict", "resolve_run_dir", "to_plain",
           "without_later_defaults"]

_RENAMED_WARNED: list[str] = []


def __getattr__(name: str):
    """``RunConfig``, the old name of :class:`ExperimentConfig` (renamed so it is never taken
    for Ray's ``RunConfig``): still importable, with one FutureWarning."""
    if name == "RunConfig":
        import warnings

        if not _RENAMED_WARNED:
            _RENAMED_WARNED.append(name)
            warnings.warn("spice_ray.config.RunConfig is renamed ExperimentConfig; the old "
                          "name still works for now", FutureWarning, stacklevel=2)
        return ExperimentConfig
    raise AttributeError(f"module 'spice_ray.config' has no attribute {name!r}")
