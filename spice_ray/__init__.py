"""spice-ray: SPICE (Shaping Policies In-Context with Ensemble prior) on Ray.

``spice_ray.SpicePolicy`` / ``spice_ray.DptPolicy`` deploy a trained checkpoint in your own
environment (``spice_ray.policy``); they are imported on first use. Importing the package
registers every environment with Gymnasium as ``spice_ray/<name>-v0`` (ids only: the
environment code loads on ``gymnasium.make``).
"""

__version__ = "0.1.0"

GYM_ENVS = ("bandit", "bandit_latent", "bandit_template", "darkroom", "darkroom_continuous",
            "darkroom_region", "linear_bandit")
"""The environments registered with Gymnasium (``spice_ray.envs.base.names()``, tested)."""


def _register_gym_ids() -> None:
    """``spice_ray/<name>-v0`` for every environment, without importing the environments
    (what ``spice_ray.envs.gym.register_gym_envs`` registers; idempotent)."""
    try:
        import gymnasium
    except ImportError:  # a dependency: only a broken install lacks it
        return
    for name in GYM_ENVS:
        env_id = f"spice_ray/{name}-v0"
        if env_id not in gymnasium.registry:
            gymnasium.register(id=env_id, entry_point="spice_ray.data.tasks:gym_env",
                               vector_entry_point="spice_ray.data.tasks:gym_vector_env",
                               kwargs={"name": name})


_register_gym_ids()


def __getattr__(name: str):
    if name in ("SpicePolicy", "DptPolicy"):
        from spice_ray import policy

        return getattr(policy, name)
    raise AttributeError(f"module 'spice_ray' has no attribute {name!r}")
