"""The one row schema of every result table: one row per measured value (tidy).

| column     | dtype   | meaning                                                            |
|------------|---------|--------------------------------------------------------------------|
| experiment | string  | named experiment (the table's name)                                |
| env        | string  | the registered environment                                         |
| method     | string  | SPICE, SPICE (flat prior), DPT, AD-BC, Emp, UCB, LCB, TS, ...      |
| rule       | string  | action rule (ucb, greedy, thompson, sample, ...)                   |
| config     | string  | compact JSON of the settings that change the result (sigma, beta)  |
| variant    | string  | model variant (e.g. the weight ablation "iw"), "" for the default   |
| seed       | int64   | training seed of the checkpoint (-1 for methods without one)       |
| task_id    | int64   | eval task                                                          |
| metric     | string  | suboptimality, cumulative_regret, cumulative_return, coverage_90...|
| x          | int64   | context length h (offline) or step t (online); -1 when unused      |
| value      | float64 | the measurement                                                    |

Each key (every column but ``value``) appears at most once in a table. Evaluation produces
:data:`ROW_COLUMNS` (no experiment, no variant); the study adds both when it writes a table.
"""

from __future__ import annotations

COLUMNS = ("experiment", "env", "method", "rule", "config", "variant", "seed", "task_id",
           "metric", "x", "value")
KEY = COLUMNS[:-1]
DTYPES = {"experiment": "string", "env": "string", "method": "string", "rule": "string",
          "config": "string", "variant": "string", "seed": "int64", "task_id": "int64",
          "metric": "string", "x": "int64", "value": "float64"}
ROW_COLUMNS = tuple(c for c in COLUMNS if c not in ("experiment", "variant"))
"""The columns evaluation produces."""
ROW_KEY = ROW_COLUMNS[:-1]
NO_SEED = -1
"""``seed`` of rows of methods without a training seed (classical and reference agents)."""
