"""Result tables: one tidy schema, load/summarise, query, figures and the report.

``spice_ray.results.load(run_dir, table)`` returns a pandas DataFrame of one table;
``python -m spice_ray.results RUN_DIR [TABLE] --by method --where "metric == 'x'"`` prints
summaries (mean, SEM, n) without writing Python.
"""

from spice_ray.results.schema import COLUMNS, METRICS, Metric, register_metric
from spice_ray.results.summary import final_values, summarise, task_means
from spice_ray.results.tables import ResultsError, describe, list_experiments, load, write

__all__ = ["COLUMNS", "METRICS", "Metric", "ResultsError", "describe", "final_values",
           "list_experiments", "load", "register_metric", "summarise", "task_means", "write"]
