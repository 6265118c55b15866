"""spice-ray: SPICE (Shaping Policies In-Context with Ensemble prior) on Ray.

``spice_ray.SpicePolicy`` / ``spice_ray.DptPolicy`` deploy a trained checkpoint in your own
environment (``spice_ray.policy``); they are imported on first use.
"""

__version__ = "0.1.0"


def __getattr__(name: str):
    if name in ("SpicePolicy", "DptPolicy"):
        from spice_ray import policy

        return getattr(policy, name)
    raise AttributeError(f"module 'spice_ray' has no attribute {name!r}")
