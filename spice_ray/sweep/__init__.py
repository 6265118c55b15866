"""Ray Tune sweeps over test-time fusion settings and retrained model variants.

``params``: trial parameters over a base config; ``resources``: a trial's placement group and
concurrency; ``trial``: one trial (evaluation actors in its placement group); ``driver``:
build or restore the Tuner (guarded), gather ``<out>/sweeps/<name>.parquet`` and its summary;
``callbacks``: the console's progress over trials; ``cli``: flags and start-up of sweeps/*.py.
"""

from spice_ray.sweep.cli import (
    add_sweep_args,
    format_best,
    format_result,
    main,
    preset_grid,
    start_sweep,
    sweep_kwargs,
)
from spice_ray.sweep.driver import (
    SWEEPS_DIR,
    SweepResult,
    check_restorable,
    load_result_grid,
    run_sweep,
    summarise_sweep,
)
from spice_ray.sweep.params import (
    SweepError,
    SweepFault,
    apply_params,
    expand_grid,
    flatten_params,
    params_json,
)
from spice_ray.sweep.resources import auto_max_concurrent, bundles_total, trial_bundles
from spice_ray.sweep.trial import (
    curve_steps,
    downsample,
    ensure_models,
    pretrain_grid,
    regret_stats,
    resolve_checkpoint,
)

__all__ = ["SWEEPS_DIR", "SweepError", "SweepFault", "SweepResult", "add_sweep_args",
           "apply_params", "auto_max_concurrent", "bundles_total", "check_restorable",
           "curve_steps", "downsample", "ensure_models", "expand_grid",
           "flatten_params", "format_best", "format_result", "load_result_grid", "main",
           "params_json",
           "preset_grid", "pretrain_grid",
           "regret_stats", "resolve_checkpoint", "run_sweep", "start_sweep", "summarise_sweep",
           "sweep_kwargs", "trial_bundles"]
