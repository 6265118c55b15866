"""The result-table schema, storage under ``<run_dir>/results/<experiment>.parquet``, and
summaries (seeds averaged per task first, then mean +- SEM over tasks, the paper's way).

Schema: one row per measured value (tidy).

| column     | dtype   | meaning                                                            |
|------------|---------|--------------------------------------------------------------------|
| experiment | string  | named experiment (see EXPERIMENTS)                                 |
| env        | string  | bandit or darkroom                                                 |
| method     | string  | SPICE, DPT, AD-BC, Emp, UCB, LCB, TS, PPO, ...                     |
| controller | string  | action rule (ucb, greedy, thompson, sample, ...)                   |
| config     | string  | compact JSON of the settings that change the result (sigma, beta)  |
| variant    | string  | model variant (e.g. the weight ablation "iw"), "" for the default   |
| seed       | int64   | training seed of the checkpoint (baselines: paired with the seed)  |
| task_id    | int64   | eval task                                                          |
| metric     | string  | suboptimality, cumulative_regret, cumulative_return, coverage_90...|
| x          | int64   | context length h (offline) or step t (online); -1 when unused      |
| value      | float64 | the measurement                                                    |

Each (experiment, env, method, controller, config, variant, seed, task_id, metric, x) key
appears at most once; :func:`write` refuses duplicates and non-finite values.

Every table has a SHA-256 sidecar ``<table>.parquet.sha256`` (``spice_ray.artifacts``) that
also records the hash of the inputs it was computed from. :func:`load` refuses a table whose
checksum does not match (truncated, bit-flipped or half-written), naming the file; the study
recomputes such a table instead of reusing it.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from spice_ray import artifacts
from spice_ray.errors import SpiceRayError

COLUMNS = ("experiment", "env", "method", "controller", "config", "variant", "seed", "task_id",
           "metric", "x", "value")
KEY = COLUMNS[:-1]
DTYPES = {"experiment": "string", "env": "string", "method": "string", "controller": "string",
          "config": "string", "variant": "string", "seed": "int64", "task_id": "int64",
          "metric": "string", "x": "int64", "value": "float64"}

EXPERIMENTS = {
    "bandit_offline": "bandit A=5 weak labels: offline suboptimality vs context length h",
    "bandit_online": "bandit A=5 weak labels: online cumulative regret",
    "bandit_robustness": "bandit A=5: final online regret vs test-time sigma",
    "bandit20_offline": "bandit A=20 weakmix80: offline suboptimality vs h",
    "bandit20_online": "bandit A=20 weakmix80: online cumulative regret",
    "bandit20_robustness": "bandit A=20 weakmix80: final online regret vs sigma",
    "darkroom_online": "darkroom weak-last: online cumulative regret and return",
    "darkroom_weights": "darkroom: SPICE weight ablation (none / iw / adv / epi / all)",
    "calibration": "bandit A=5: ensemble prior coverage, pseudo-counts, warm-start term",
}


SWEEPS_PREFIX = "sweeps/"
"""Table names starting with this read ``<run_dir>/sweeps/<name>.parquet`` (sweep tables)."""
_NAME_RE = re.compile(r"^(sweeps/)?[A-Za-z0-9][A-Za-z0-9_-]*$")


class ResultsError(SpiceRayError, ValueError):
    """A result table is missing, malformed or fails its checksum."""


def results_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "results"


def check_name(name: str) -> str:
    """Refuse a table name that is not a plain name (e.g. ``../datasets/x``).

    Raises:
        ResultsError: naming the value.
    """
    if not _NAME_RE.match(name):
        raise ResultsError(f"table name {name!r} is invalid: letters, digits, '_' and '-' "
                           f"only (sweep tables: {SWEEPS_PREFIX}<name>)")
    return name


def table_path(run_dir: str | Path, experiment: str) -> Path:
    """``<run_dir>/results/<experiment>.parquet`` (or ``<run_dir>/sweeps/<name>.parquet``)."""
    check_name(experiment)
    if experiment.startswith(SWEEPS_PREFIX):
        return Path(run_dir) / f"{experiment}.parquet"
    return results_dir(run_dir) / f"{experiment}.parquet"


def check_finite(df: pd.DataFrame, what: str, column: str = "value") -> None:
    """Refuse rows whose ``column`` is NaN or infinite: no table holds a non-finite result.

    Raises:
        ResultsError: naming the table, the count and an example row.
    """
    bad = ~np.isfinite(df[column].to_numpy(dtype=np.float64))
    if bad.any():
        example = df[bad].head(1).to_dict("records")
        raise ResultsError(f"{what}: {int(bad.sum())} of {len(df)} values are NaN or infinite "
                           f"(e.g. {example}); refusing to write a table with non-finite "
                           "results")


def conform(df: pd.DataFrame, experiment: str | None = None) -> pd.DataFrame:
    """Add defaults for optional columns, order and type them, and check the key is unique."""
    df = df.copy()
    if experiment is not None:
        df["experiment"] = experiment
    defaults = {"variant": "", "config": "{}", "controller": "", "x": -1, "seed": -1}
    for col, default in defaults.items():
        df[col] = df[col].fillna(default) if col in df.columns else default
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        raise ResultsError(f"result rows lack columns {missing}")
    df = df[list(COLUMNS)].astype(DTYPES)
    dup = df.duplicated(list(KEY), keep=False)
    if dup.any():
        example = df[dup].head(3).to_dict("records")
        raise ResultsError(f"{int(dup.sum())} result rows share a key, e.g. {example}")
    return df.reset_index(drop=True)


def write(run_dir: str | Path, experiment: str, df: pd.DataFrame, inputs: str | None = None
          ) -> Path:
    """Write one experiment's table atomically with its checksum sidecar; returns its path.

    Args:
        inputs: hash of what the table was computed from, recorded in the sidecar (see
            :func:`spice_ray.artifacts.is_current`).

    Raises:
        ResultsError: duplicated keys or non-finite values.
    """
    path = table_path(run_dir, experiment)
    table = conform(df, experiment)
    check_finite(table, str(path))
    write_frame(path, table, inputs=inputs)
    return path


def write_frame(path: str | Path, df: pd.DataFrame, **record: object) -> Path:
    """Any DataFrame to Parquet (zstd) atomically, with a checksum sidecar holding ``record``."""
    artifacts.write_checked(
        path, lambda tmp: df.to_parquet(tmp, index=False, compression="zstd"),
        rows=len(df), **record)
    return Path(path)


def read_frame(path: str | Path) -> pd.DataFrame:
    """A Parquet table written by :func:`write_frame`, after checking its checksum.

    Raises:
        ResultsError: the file is missing, fails its checksum, or cannot be parsed.
    """
    path = Path(path)
    record, reason = artifacts.verify(path)
    if record is None:
        if reason == "missing":
            raise ResultsError(f"{path} does not exist")
        raise ResultsError(f"{path} fails its checksum ({reason}); refusing to read it. "
                           "Re-run the stage that wrote it (e.g. pipelines/full_run.py with "
                           "the same --out) to recompute it")
    try:
        return pd.read_parquet(path)
    except (OSError, ValueError, pa.ArrowException) as exc:
        raise ResultsError(f"{path} cannot be read as Parquet: {exc}") from exc


def _check_run_dir(run_dir: str | Path) -> Path:
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ResultsError(f"run directory {run_dir} does not exist")
    return run_dir


def list_experiments(run_dir: str | Path) -> list[str]:
    """Experiments with a table in ``run_dir``.

    Raises:
        ResultsError: ``run_dir`` does not exist.
    """
    _check_run_dir(run_dir)
    return sorted(p.stem for p in results_dir(run_dir).glob("*.parquet"))


def list_sweeps(run_dir: str | Path) -> list[str]:
    """Sweep tables in ``run_dir``, as names :func:`load` accepts (``sweeps/<name>``)."""
    _check_run_dir(run_dir)
    return sorted(f"{SWEEPS_PREFIX}{p.stem}" for p in (Path(run_dir) / "sweeps").glob("*.parquet"))


def load(run_dir: str | Path, experiment: str | None = None) -> pd.DataFrame:
    """One experiment's table (or all of them concatenated when ``experiment`` is None).

    ``experiment`` may also name a sweep table, ``sweeps/<name>`` (returned as stored).

    Raises:
        ResultsError: the run directory or table does not exist, the name is not a plain
            table name, or the table fails its checksum.
    """
    _check_run_dir(run_dir)
    names = [check_name(experiment)] if experiment else list_experiments(run_dir)
    if not names:
        raise ResultsError(f"no result tables under {results_dir(run_dir)}")
    frames = []
    for name in names:
        path = table_path(run_dir, name)
        if not path.exists():
            have = ", ".join(list_experiments(run_dir) + list_sweeps(run_dir)) or "none"
            raise ResultsError(f"{path} does not exist; experiments in {run_dir}: {have}")
        frames.append(read_frame(path))
    if experiment and experiment.startswith(SWEEPS_PREFIX):
        return frames[0]
    return pd.concat(frames, ignore_index=True).astype(DTYPES)


def _keys(df: pd.DataFrame) -> list[str]:
    """Key columns of ``df``: the schema's key plus any derived column (e.g. sigma)."""
    return [c for c in df.columns if c not in ("value", "seed")]


def task_means(df: pd.DataFrame) -> pd.DataFrame:
    """Average over training seeds per task (the paper's first step)."""
    keys = _keys(df)
    return df.groupby(keys, dropna=False, observed=True)["value"].mean().reset_index()


def summarise(df: pd.DataFrame, by: list[str] | tuple[str, ...] | None = None) -> pd.DataFrame:
    """Mean, SEM and n over tasks, after averaging seeds per task.

    Args:
        by: grouping columns (default: every key column except seed and task_id).

    Returns:
        One row per group with columns ``mean``, ``sem``, ``n`` (tasks) and ``seeds``.
    """
    seeds = df.groupby(_keys(df), dropna=False,
                       observed=True)["seed"].nunique().rename("seeds").reset_index()
    per_task = task_means(df).merge(seeds, how="left")
    if by is None:
        by = [c for c in KEY if c not in ("seed", "task_id")]
    by = list(by)
    unknown = [c for c in by if c not in per_task.columns]
    if unknown:
        raise ResultsError(f"cannot group by {unknown}; columns are {list(per_task.columns)}")
    g = per_task.groupby(by, dropna=False, observed=True)
    out = g["value"].agg(mean="mean", std="std", n="count").reset_index()
    out["sem"] = out["std"] / np.sqrt(out["n"].clip(lower=1))
    out["seeds"] = g["seeds"].max().to_numpy()
    return out.drop(columns="std")[[*by, "mean", "sem", "n", "seeds"]]
