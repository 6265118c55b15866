"""The Gymnasium ids of the environments, registered without importing them: ``import
spice_ray`` calls :func:`register_ids`, so ``gymnasium.make("spice_ray/<name>-v0")`` works
after it; the environment code loads on ``make`` (``spice_ray.data.tasks.gym_env``)."""

from __future__ import annotations

GYM_NAMESPACE = "spice_ray"

GYM_ENVS = ("bandit", "bandit_latent", "bandit_template", "darkroom", "darkroom_continuous",
            "darkroom_region", "linear_bandit")
"""The environments registered (``spice_ray.envs.base.names()``, tested)."""


def register_ids(names: tuple[str, ...] = GYM_ENVS) -> list[str]:
    """Register ``spice_ray/<name>-v0`` for each of ``names`` (default: the package's own
    environments; ``spice_ray.envs.base.register`` passes a plugin's when its class registers)
    (idempotent); returns the ids ([] without Gymnasium, a dependency only a broken install
    lacks)."""
    try:
        import gymnasium
    except ImportError:
        return []
    ids = []
    for name in names:
        env_id = f"{GYM_NAMESPACE}/{name}-v0"
        if env_id not in gymnasium.registry:
            gymnasium.register(id=env_id, entry_point="spice_ray.data.tasks:gym_env",
                               vector_entry_point="spice_ray.data.tasks:gym_vector_env",
                               kwargs={"name": name})
        ids.append(env_id)
    return ids
