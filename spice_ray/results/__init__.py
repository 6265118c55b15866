"""Result tables: one tidy schema, load/summarise, query, figures and the report.

``spice_ray.results.load(run_dir, table)`` returns a pandas DataFrame of one table;
``python -m spice_ray.results RUN_DIR [TABLE] --by method --where "metric == 'x'"`` prints
summaries (mean, SEM, n) without writing Python.
"""

from __future__ import annotations

from spice_ray.common.lazy import lazy_exports

# each name loads its module on first use, so ``python -m spice_ray.results --help`` (and
# ``spice_ray.results.schema`` alone) does not load the rest
__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "schema": ("COLUMNS", "METRICS", "Metric", "register_metric"),
    "summary": ("final_values", "summarise", "task_means"),
    "tables": ("ResultsError", "describe", "list_experiments", "load", "write"),
})
