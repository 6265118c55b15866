"""Result tables: one tidy schema, load/summarise, figures and the report.

``spice_ray.results.load(run_dir, experiment)`` returns a pandas DataFrame of one experiment;
``python -m spice_ray.results RUN_DIR [EXPERIMENT] --by method --where "metric == 'x'"`` prints
summaries (mean, SEM, n) without writing Python.
"""

from spice_ray.results.tables import (
    COLUMNS,
    EXPERIMENTS,
    ResultsError,
    list_experiments,
    load,
    summarise,
    task_means,
    write,
)

__all__ = ["COLUMNS", "EXPERIMENTS", "ResultsError", "list_experiments", "load", "summarise",
           "task_means", "write"]
