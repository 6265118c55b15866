"""Result tables: one tidy schema, load/summarise, query, figures and the report.

``spice_ray.results.load(run_dir, table)`` returns a pandas DataFrame of one table;
``python -m spice_ray.results RUN_DIR [TABLE] --by method --where "metric == 'x'"`` prints
summaries (mean, SEM, n) without writing Python.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "schema": ("COLUMNS", "METRICS", "Metric", "register_metric"),
    "summary": ("final_values", "summarise", "task_means"),
    "tables": ("ResultsError", "describe", "list_experiments", "load", "write"),
}
_MODULE_OF = {name: module for module, names in _WHERE.items() for name in names}

__all__ = sorted(_MODULE_OF)


def __getattr__(name: str) -> Any:
    """Each exported name from its module on first use, so ``python -m spice_ray.results
    --help`` (and ``spice_ray.results.schema`` alone) does not load the rest."""
    if name in _MODULE_OF:
        value = getattr(importlib.import_module(f"{__name__}.{_MODULE_OF[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'spice_ray.results' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_MODULE_OF))
