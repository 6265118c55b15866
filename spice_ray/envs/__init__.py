"""Environments: one protocol (:class:`~spice_ray.envs.base.Environment`) and its registry.

Every module in this package is imported here, so an environment registers itself by being a
file in this folder (``@register`` on its class); nothing else lists them.
"""

import importlib
import pkgutil

from spice_ray.envs.base import Environment, env_class, make, names, register

for _module in pkgutil.iter_modules(__path__):
    if _module.name not in ("base", "labels", "gym"):
        importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["Environment", "env_class", "make", "names", "register"]
