"""spice-ray: SPICE (Shaping Policies In-Context with Ensemble prior) on Ray.

``spice_ray.SpicePolicy`` / ``spice_ray.DptPolicy`` deploy a trained checkpoint in your own
environment (``spice_ray.study.policy``); they are imported on first use. Importing the package
registers every environment with Gymnasium as ``spice_ray/<name>-v0`` (ids only: the
environment code loads on ``gymnasium.make``; ``spice_ray.common.gym_ids``).
"""

from spice_ray.common.gym_ids import register_ids as _register_gym_ids

__version__ = "0.1.0"

_register_gym_ids()


def __getattr__(name: str):
    if name in ("SpicePolicy", "DptPolicy"):
        from spice_ray.study import policy

        return getattr(policy, name)
    raise AttributeError(f"module 'spice_ray' has no attribute {name!r}")
