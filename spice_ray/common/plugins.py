"""Extensions from outside the package: Python entry points of the group ``spice_ray.plugins``.

An installed distribution that declares, in its ``pyproject.toml``::

    [project.entry-points."spice_ray.plugins"]
    my_agents = "my_package.spice_plugin"

has ``my_package.spice_plugin`` imported once per process, the first time a registry is asked
for a name it does not hold and when the study's experiments are built. Importing it registers
what it brings: an agent (``spice_ray.agents.register_method``), an environment
(``spice_ray.envs.register``), a model kind (``spice_ray.model.registry`` and
``spice_ray.train.losses.register_loss``), and its rows in the study's experiments
(``spice_ray.study.experiments.add_evaluation``). Every process that looks a name up loads the same
plugins (the driver, Ray actors and Train workers alike), so nothing has to be shipped to them.

Only installed distributions are read (``importlib.metadata``): nothing named in a run
directory, a config or on a command line is ever imported.
"""

from __future__ import annotations

import importlib.metadata
import logging

from spice_ray.common.errors import SpiceRayError

GROUP = "spice_ray.plugins"
"""The entry-point group a plugin declares."""

log = logging.getLogger(__name__)

_loaded: dict[str, str] = {}
"""Entry-point name -> its module, marked before the import so a plugin that imports a
registry which loads plugins does not load itself again."""


class PluginError(SpiceRayError, ImportError):
    """An installed plugin failed to load; the message names it and its module."""


def load_plugins() -> dict[str, str]:
    """Import every installed plugin not imported yet; returns all loaded (name -> module).

    Raises:
        PluginError: a plugin's import raised, naming the plugin, its module and the error.
    """
    for ep in importlib.metadata.entry_points(group=GROUP):
        if ep.name in _loaded:
            continue
        _loaded[ep.name] = ep.value
        try:
            ep.load()
        except Exception as exc:  # whatever the plugin's import raised: name the plugin
            raise PluginError(f"plugin {ep.name!r} (module {ep.value}, entry point group "
                              f"{GROUP}) failed to load: {type(exc).__name__}: {exc}") from exc
        log.info("loaded plugin %s (%s)", ep.name, ep.value)
    return dict(_loaded)
