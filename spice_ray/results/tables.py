"""Result tables on disk: ``<run_dir>/results/<table>.parquet``, checked on every read.

The row schema is ``spice_ray.results.schema``. Every key appears at most once in a table;
:func:`write` refuses duplicates and non-finite values.

Every table has a SHA-256 sidecar ``<table>.parquet.sha256`` (``spice_ray.common.artifacts``) that
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

from spice_ray.common import artifacts
from spice_ray.common.errors import SpiceRayError
from spice_ray.results.schema import COLUMNS, DTYPES, KEY, settings_columns

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
    defaults = {"variant": "", "config": "{}", "rule": "", "x": -1, "seed": -1}
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


def write(run_dir: str | Path, experiment: str, df: pd.DataFrame, inputs: str | None = None,
          description: str = "") -> Path:
    """Write one experiment's table atomically with its checksum sidecar; returns its path.
    The schema's columns come first, then each setting as a typed column
    (``schema.settings_columns``).

    Args:
        inputs: hash of what the table was computed from, recorded in the sidecar (see
            :func:`spice_ray.common.artifacts.is_current`).
        description: one line saying what the table holds (listed by the results CLI).

    Raises:
        ResultsError: duplicated keys or non-finite values.
    """
    path = table_path(run_dir, experiment)
    table = conform(df, experiment)
    check_finite(table, str(path))
    write_frame(path, pd.concat([table, settings_columns(table)], axis=1), inputs=inputs,
                description=description)
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


def describe(run_dir: str | Path, name: str) -> str:
    """The one-line description recorded with a table ("" when none or unreadable)."""
    record, _ = artifacts.verify(table_path(run_dir, name))
    return str((record or {}).get("description", ""))


def table_problem(run_dir: str | Path, name: str) -> str | None:
    """Why a table cannot be read as written (it fails its checksum sidecar, or has none), or
    None when it is sound."""
    record, why = artifacts.verify(table_path(run_dir, name))
    return None if record is not None else why


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


def load(run_dir: str | Path, experiment: str | None = None, settings: bool = False
         ) -> pd.DataFrame:
    """One experiment's table (or all of them concatenated when ``experiment`` is None).

    ``experiment`` may also name a sweep table, ``sweeps/<name>`` (returned as stored).
    The schema's columns only, unless ``settings=True``: then each setting as a typed column
    too, as one table stores them (a table written before they were stored, or all tables
    together, has them derived from ``config`` by ``schema.settings_columns``, so a key is
    typed over every row returned).

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
            names = list_experiments(run_dir) + list_sweeps(run_dir)
            have = ", ".join(names[:8]) + (f", ... ({len(names)} in all: "
                                           f"python -m spice_ray.results {run_dir})"
                                           if len(names) > 8 else "") if names else "none"
            raise ResultsError(f"no table {experiment or name!r} in {run_dir} ({path} does not "
                               f"exist); its tables: {have}")
        frame = read_frame(path)
        if not name.startswith(SWEEPS_PREFIX):
            lacking = [c for c in COLUMNS if c not in frame.columns]
            if lacking:
                raise ResultsError(f"{path} lacks the result columns {lacking}: it is not a "
                                   "result table")
        frames.append(frame)
    if experiment and experiment.startswith(SWEEPS_PREFIX):
        return frames[0]
    df = pd.concat([f[list(COLUMNS)] for f in frames], ignore_index=True).astype(DTYPES)
    if not settings:
        return df
    stored = frames[0].drop(columns=list(COLUMNS))
    if experiment and len(stored.columns):
        return pd.concat([df, stored.reset_index(drop=True)], axis=1)
    return pd.concat([df, settings_columns(df)], axis=1)
