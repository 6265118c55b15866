"""Evaluation: test-time controllers, batched offline/online protocols, calibration, Ray actors.

``spice_ray.evaluate.actors`` (Ray fan-out) is not imported here; import it explicitly.
"""

from spice_ray.evaluate.calibration import (
    CalibrationStats,
    calibration_rows,
    calibration_stats,
    prior_pseudocounts,
)
from spice_ray.evaluate.controllers import (
    BanditOracle,
    ContextRunner,
    Controller,
    ControllerSpec,
    DarkroomOracle,
    PolicyController,
    SpiceController,
    make_controller,
)
from spice_ray.evaluate.rollout import (
    ROW_COLUMNS,
    bandit_offline_rows,
    bandit_online_rows,
    concat_rows,
    darkroom_online_rows,
    offline_context_lengths,
    online_noise,
    run_online_darkroom,
    tidy_rows,
)

__all__ = [
    "ROW_COLUMNS",
    "BanditOracle",
    "CalibrationStats",
    "ContextRunner",
    "Controller",
    "ControllerSpec",
    "DarkroomOracle",
    "PolicyController",
    "SpiceController",
    "bandit_offline_rows",
    "bandit_online_rows",
    "calibration_rows",
    "calibration_stats",
    "concat_rows",
    "darkroom_online_rows",
    "make_controller",
    "offline_context_lengths",
    "online_noise",
    "prior_pseudocounts",
    "run_online_darkroom",
    "tidy_rows",
]
