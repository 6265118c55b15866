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

The settings inside ``config`` are also written as typed columns, after the schema's columns,
when a table is written (:func:`settings_columns`, the one place the settings' text is read):
one column per key (``beta``, ``tau``, ``width_scale``, ``c``, ...), numbers as float64, flags
as booleans and text as strings, missing (NaN / <NA>) where a row's method has no such setting.
So ``pandas.read_parquet`` of a table has them, ``load(..., settings=True)`` and the results CLI
return them, and ``--where "beta == 1"`` and ``--by method,beta`` work. ``config`` stays the
record and part of the key; every column that is not a schema column is a setting. A table
written before the settings were stored has them derived from ``config`` when read.
"""

from __future__ import annotations

import functools
import json
from typing import Any

import numpy as np
import pandas as pd

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


# the metric registry lives beside the layers that write metrics (evaluation has no pandas)
from spice_ray.common.metrics import (  # noqa: E402,F401 -- re-exported: results.schema's names
    METRICS,
    Metric,
    metric_info,
    register_metric,
)

ACCURACY_METRICS = ("action_accuracy", "stay_accuracy", "context_shows_goal")
"""The DPT* episode table's per-task metrics (``spice_ray.evaluate.accuracy``): the share of
cells where the action is optimal; 1 if the action on the goal cell is "stay" (else 0); 1 if
the task's context contains a reward (it shows the goal)."""

def settings_of(config: str | None) -> dict[str, Any]:
    """A row's ``config`` (or a sweep row's ``params``) as a dict: every module reads the
    settings column through here (the column's format is this module's business); {} for an
    empty or missing one. A fresh dict each call (each distinct text is parsed once).

    Raises:
        ValueError: text that is not a JSON object.
    """
    if not isinstance(config, str) or not config:
        return {}
    return dict(_parsed(config))


@functools.lru_cache(maxsize=4096)
def _parsed(config: str) -> dict[str, Any]:
    value = json.loads(config)
    if not isinstance(value, dict):
        raise ValueError(f"config {config[:80]!r} is invalid: a JSON object")
    return value


SETTING_PREFIX = "setting."
"""Prefix of a setting column whose key is also a schema column (none today)."""


def settings_columns(df: pd.DataFrame) -> pd.DataFrame:
    """The settings of every row's ``config`` as typed columns, aligned with ``df``'s index.

    One column per key found in any config (sorted): float64 where every value present is a
    number, boolean where every one is true/false, string otherwise (lists as their JSON);
    missing where a row's config lacks the key. Each distinct config is parsed once.
    """
    codes, configs = pd.factorize(df["config"].astype(object), use_na_sentinel=False)
    parsed = [json.loads(c) if isinstance(c, str) and c else {} for c in configs]
    keys = sorted({k for d in parsed for k in d})
    out = {}
    for key in keys:
        values = [d.get(key) for d in parsed]
        present = [v for v in values if v is not None]
        if present and all(isinstance(v, bool) for v in present):
            col = pd.array(values, dtype="boolean")
        elif all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in present):
            col = np.array([np.nan if v is None else float(v) for v in values])
        else:
            col = pd.array([None if v is None else v if isinstance(v, str)
                            else json.dumps(v) for v in values], dtype="string")
        name = SETTING_PREFIX + key if key in COLUMNS else key
        out[name] = col[codes] if len(codes) else col[:0]
    return pd.DataFrame(out, index=df.index)
