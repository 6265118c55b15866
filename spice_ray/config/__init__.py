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
from spice_ray.config.run import EvalConfig, FusionConfig, RunConfig, SweepConfig
from spice_ray.config.sections import (
    HEAD_KERNELS,
    PRESET_NAMES,
    ConfigError,
    DataConfig,
    EnvConfig,
    ModelConfig,
    TrainConfig,
    to_plain,
)

__all__ = ["HEAD_KERNELS", "PRESETS", "PRESET_NAMES", "ConfigError", "DataConfig", "EnvConfig",
           "EvalConfig", "FusionConfig", "ModelConfig", "RunConfig", "SweepConfig",
           "TrainConfig", "config_hash", "deep_merge", "env_from_dict",
           "from_dict", "load_config", "load_yaml",
           "make_config", "parse_set", "preset_dict", "resolve_run_dir", "to_plain"]
