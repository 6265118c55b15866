"""Ray Tune sweeps over test-time fusion settings and retrained model variants.

``params``: trial parameters over a base config; ``resources``: a trial's placement group and
concurrency; ``trial``: one trial (evaluation actors in its placement group); ``driver``:
build or restore the Tuner (guarded), gather ``<out>/sweeps/<name>.parquet`` and its summary;
``callbacks``: the console's progress over trials; ``cli``: flags and start-up of sweeps/*.py.

Each name below loads its module on first use, so a sweep script's ``--help`` and an argument
error answer before torch, pandas or Ray load.
"""

from __future__ import annotations

from spice_ray.common.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "cli": ("add_sweep_args", "format_best", "format_result", "main", "preset_grid",
            "start_sweep", "sweep_kwargs"),
    "driver": ("SWEEPS_DIR", "SweepResult", "check_restorable", "load_result_grid", "run_sweep",
               "summarise_sweep"),
    "params": ("SweepError", "SweepFault", "apply_params", "expand_grid", "flatten_params",
               "params_json"),
    "resources": ("auto_max_concurrent", "bundles_total", "trial_bundles"),
    "trial": ("curve_steps", "downsample", "ensure_models", "pretrain_grid", "regret_stats",
              "resolve_checkpoint"),
})
