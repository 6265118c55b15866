"""A package's public names, each loaded from its module on first use (PEP 562), so importing
the package (or one light module of it) does not import the rest: how ``spice_ray.config`` and
``spice_ray.results`` keep the command lines' ``--help`` free of torch and pandas."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, where: Mapping[str, tuple[str, ...]]
                 ) -> tuple[Callable[[str], Any], Callable[[], list[str]], list[str]]:
    """The ``__getattr__``, ``__dir__`` and ``__all__`` of ``package`` (its ``__name__``, called
    from its ``__init__``), whose names are ``where``: {submodule: (name, ...)}. A name is
    imported from its submodule the first time it is asked for, then kept in the package."""
    module_of = {name: module for module, names in where.items() for name in names}
    namespace = vars(sys.modules[package])

    def __getattr__(name: str) -> Any:
        if name not in module_of:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module_of[name]}"), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(module_of))

    return __getattr__, __dir__, sorted(module_of)
