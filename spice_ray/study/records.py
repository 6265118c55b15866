"""What a study records beside its tables: the index of its final checkpoints (what
``SpicePolicy.from_run`` reads), what each model's training reached (steps, train and
validation loss) and where its time went (``logs/timing.json``)."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from spice_ray.common.artifacts import (
    MISSING,
    atomic_write_text,
    stays_inside,
    verify,
    write_checked_text,
)
from spice_ray.common.console import count
from spice_ray.common.errors import SpiceRayError
from spice_ray.config import ConfigError, ExperimentConfig, from_dict, load_config
from spice_ray.data import store
from spice_ray.model import checkpoint as ckpt
from spice_ray.train.loop import steps_per_epoch

log = logging.getLogger(__name__)

Finals = dict[tuple[str, str, str, int], Path]
"""{(experiment, model kind, variant, seed): final checkpoint}."""


CHECKPOINT_INDEX = "checkpoints/index.json"
"""Under a run directory: every final checkpoint of the study by experiment, model kind,
variant and seed (what ``SpicePolicy.from_run`` reads, so nobody globs hash-named paths)."""


class CheckpointIndexError(SpiceRayError, ValueError):
    """An entry of ``checkpoints/index.json`` that is not the shape the study writes, or that
    names a path outside the run's ``checkpoints/``."""


ENTRY_FIELDS: dict[str, type] = {"experiment": str, "kind": str, "variant": str, "seed": int,
                                 "path": str}
"""The fields of a checkpoint-index entry and their types."""


def checked_index_entry(run_dir: Path, entry: Any) -> dict[str, Any]:
    """``entry`` once it is the shape the study writes and its path stays inside the run's
    ``checkpoints/`` (a relative path, no ``..``, resolving there): an index re-signed with an
    absolute path or ``../outside/final`` loaded that checkpoint.

    Raises:
        CheckpointIndexError: naming the index, the entry and the field.
    """
    index = Path(run_dir) / CHECKPOINT_INDEX
    if not isinstance(entry, dict):
        raise CheckpointIndexError(f"{index}: an entry is a {type(entry).__name__}, not an "
                                   f"object with {', '.join(ENTRY_FIELDS)}")
    for field, kind in ENTRY_FIELDS.items():
        value = entry.get(field)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise CheckpointIndexError(f"{index}: an entry's {field!r} is {value!r:.80}, not "
                                       f"a {kind.__name__}")
    root = (Path(run_dir) / "checkpoints").resolve()
    if not stays_inside(run_dir, entry["path"], root):
        raise CheckpointIndexError(f"{index}: an entry's path {entry['path']!r:.200} is outside "
                                   f"the run's checkpoints/ ({root}): refused")
    return entry


def _listed(path: Path) -> list[Any]:
    """The entries the index file at ``path`` holds as it stands, vouched for or not; [] when
    it is missing or unreadable."""
    try:
        entries = json.loads(path.read_text())["checkpoints"]
    except (OSError, ValueError, KeyError, TypeError):
        return []
    return entries if isinstance(entries, list) else []


def index_entries(run_dir: Path) -> list[Any]:
    """The entries of the run's checkpoint index as written; [] when it is missing,
    unreadable, or not vouched for by its checksum sidecar (edited since written, or the
    sidecar gone).

    Raises:
        CheckpointIndexError: an entry of the wrong shape, or whose path leaves the run's
            ``checkpoints/`` (:func:`checked_index_entry`).
    """
    path = Path(run_dir) / CHECKPOINT_INDEX
    record, _ = verify(path)
    return [checked_index_entry(run_dir, e) for e in _listed(path)] if record is not None \
        else []


def write_checkpoint_index(run_dir: Path, finals: Finals) -> Path:
    """Record (merging with an earlier invocation's) the final checkpoints of ``finals``. An
    index edited since it was written is not merged: it is rebuilt from ``finals`` alone and
    said so, naming the experiments whose entries it drops (their next run lists them); so is
    one whose sidecar is gone."""
    path = run_dir / CHECKPOINT_INDEX
    record, why = verify(path)
    listed = _listed(path)
    entries = listed if record is not None else []  # missing or edited: this run's only
    if record is None and why != MISSING:
        # the edited file's experiment names, to say what is dropped (nothing else used)
        named = {str(e.get("experiment")) for e in listed} \
            if all(isinstance(e, dict) for e in listed) else set()
        dropped = sorted(named - {name for name, *_ in finals})
        log.warning("%s is not vouched for by its checksum (%s): rebuilt from this run's %s%s",
                    path, why, count(len(finals), "checkpoint"),
                    f"; not listed until they run again: {', '.join(dropped)}" if dropped else "")
    new = {(name, kind, variant, seed): str(Path(final).relative_to(run_dir))
           for (name, kind, variant, seed), final in finals.items()}
    kept = [e for e in entries if isinstance(e, dict) and
            (e.get("experiment"), e.get("kind"), e.get("variant"), e.get("seed")) not in new]
    # each model's training identity and last epoch (its meta.json's), so a reader can tell
    # a moved or swapped checkpoint directory from the one listed, and a final that a training
    # of the same model to another epoch has since republished (under a constant rate the
    # epochs are not in the identity: such trainings share one directory)
    metas = {k: ckpt.read_meta(run_dir / p) for k, p in new.items()}
    entries = kept + [{"experiment": k[0], "kind": k[1], "variant": k[2], "seed": k[3],
                       "path": p, "identity": metas[k].get("identity"),
                       "epoch": metas[k].get("epoch")}
                      for k, p in new.items()]
    # in one order whatever ran last, so the same models give the same bytes (the report's
    # freshness reads the index's checksum)
    entries.sort(key=lambda e: (str(e.get("experiment")), str(e.get("kind")),
                                str(e.get("variant")),
                                e["seed"] if isinstance(e.get("seed"), int) else -1))
    write_checked_text(path, json.dumps({"checkpoints": entries}, indent=1))
    return path


def _spread(x: np.ndarray) -> str:
    """' +- sd' over seeds (nothing for one seed)."""
    return f" +- {x.std(ddof=1):.2g}" if len(x) > 1 else ""


def training_table(finals: Finals) -> pd.DataFrame:
    """Per experiment and model (seeds together): optimiser steps per model and the last
    epoch's mean training loss against the validation loss at its end, and their gap (mean
    and spread over seeds), read from each final checkpoint's own record. A validation loss
    far above the training loss is memorised training tasks, not in-context learning."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for (name, kind, variant, _), path in sorted(finals.items()):
        meta = ckpt.read_meta(path)
        cfg = from_dict(meta["config"])
        groups.setdefault((name, kind + (f" [{variant}]" if variant else "")), []).append(
            {"steps": (int(meta["epoch"]) + 1) * steps_per_epoch(cfg),
             "tasks": cfg.data.num_train_tasks, "train": meta["metrics"].get("train_loss"),
             "val": meta["metrics"].get("val_loss")})
    rows = []
    for (name, model), runs in groups.items():
        train = np.array([r["train"] for r in runs], dtype=float)
        val = np.array([r["val"] for r in runs], dtype=float)
        gap = val - train
        rows.append({"experiment": name, "model": model, "seeds": len(runs),
                     "steps per model": runs[0]["steps"], "training tasks": runs[0]["tasks"],
                     "train loss": f"{train.mean():.3g}{_spread(train)}",
                     "validation loss": f"{val.mean():.3g}{_spread(val)}",
                     "validation - train": f"{gap.mean():+.3g}{_spread(gap)}"})
    return pd.DataFrame(rows)


def busy_seconds(work: Iterable[tuple[int, float]]) -> float:
    """Seconds of the busiest worker of a together job, from (worker, seconds) per model: a
    worker trains its models one after another and the workers run side by side."""
    per: dict[int, float] = {}
    for worker, seconds in work:
        per[worker] = per.get(worker, 0.0) + seconds
    return max(per.values(), default=0.0)


def timing_notes(experiments: list[str], stages: dict[str, float],
                 units: list[dict[str, Any]]) -> list[str]:
    """The stages' wall times, then one sentence per experiment: where its pretraining and
    evaluation time went (start-up and data against the seconds inside training, per model);
    from :func:`timing_of_work`."""
    walls = ["Stage wall times (of the last invocation that trained or evaluated): "
             + ", ".join(f"{k} {v:.0f} s" for k, v in stages.items() if k != "total")]
    out = []
    for name in experiments:
        mine = [u for u in units if u["experiment"] == name]
        if not mine:
            continue
        train = [u for u in mine if u["stage"] == "pretrain"]
        fit_units = [u for u in train if u.get("part") == "fit"]
        fits = [u["seconds"] for u in fit_units]
        other = sum(u["seconds"] for u in train) - sum(fits)
        busy = busy_seconds((u.get("worker", 0), u["seconds"]) for u in fit_units)
        workers = len({u.get("worker", 0) for u in fit_units})
        evals = sum(u["seconds"] for u in mine if u["stage"] == "evaluate")
        parts = [f"{name}: pretraining {other + busy:.0f} s"]
        if fits:
            side = f", {workers} workers side by side" if workers > 1 else ""
            parts.append(f"({other:.0f} s start-up and data, {count(len(fits), 'model')} "
                         f"{min(fits):.0f}-{max(fits):.0f} s each{side})")
        out.append(" ".join(parts) + f", evaluation {evals:.0f} s")
    return walls + (["Time per experiment (`logs/timing.json` has every unit): "
                     + "; ".join(out)] if out else [])


def did_work(units: list[dict[str, Any]]) -> bool:
    """Whether an invocation's ``units`` trained a model or evaluated anything (a re-run over a
    finished study does neither)."""
    return any(u.get("part") == "fit" or u["stage"] == "evaluate" for u in units)


def timing_of_work(run_dir: Path, timings: dict[str, float], units: list[dict[str, Any]]
                   ) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """(stage seconds, units) to report: this invocation's when it :func:`did_work`, else
    those ``logs/timing.json`` kept from the invocation that did (a re-run that only finds
    everything current must not report zeros as the study's cost)."""
    if did_work(units):
        return timings, units
    try:
        kept = json.loads((run_dir / "logs" / "timing.json").read_text())
        return dict(kept["stages"]), list(kept["units"])
    except (OSError, ValueError, KeyError, TypeError):
        return timings, units


def write_timing(run_dir: Path, timings: dict[str, float], units: list[dict[str, Any]]
                 ) -> Path:
    """``<run>/logs/timing.json``: where this invocation's time went, per stage and per model
    and evaluation (seconds), to guide the next speed-up by numbers; left as it is when this
    invocation did no work (:func:`did_work`) and the file exists."""
    path = run_dir / "logs" / "timing.json"
    if path.is_file() and not did_work(units):
        return path
    atomic_write_text(path, json.dumps(
        {"stages": {k: round(v, 3) for k, v in timings.items()},
         "units": [{**u, "seconds": round(u["seconds"], 3)} for u in units]}, indent=1))
    return path


_HOW_NOT_WHAT = {"out_dir": True, "track": True, "track_uri": True, "track_project": True,
                 "sweep": True, "data": store.EXECUTION_FIELDS + ("shard_size", "compression"),
                 "train": ("num_workers", "threads", "together", "population", "use_gpu",
                           "worker_cpus", "worker_gpus", "checkpoint_every", "max_failures"),
                 "eval": ("num_actors", "actor_cpus", "actor_gpus")}
"""Config fields that change how a study computes, not what its tables say (where it runs,
on how many workers, shards and trackers): a re-run may change them."""


def _what(config: dict[str, Any]) -> dict[str, Any]:
    """A config dict without :data:`_HOW_NOT_WHAT`."""
    out = {}
    for key, value in config.items():
        skip = _HOW_NOT_WHAT.get(key, ())
        if skip is True:
            continue
        out[key] = ({k: v for k, v in value.items() if k not in skip}
                    if isinstance(value, dict) else value)
    return out


def check_same_study(run_dir: Path, name: str, cfg: ExperimentConfig) -> None:
    """Refuse to run experiment ``name`` into a run directory that holds it with another
    config: its tables would be replaced while the report still mixed in the other
    experiments' results of the old config.

    Raises:
        ConfigError: naming the run directory, the experiment and the fields that differ.
    """
    path = Path(run_dir) / "configs" / f"{name}.yaml"
    if not path.is_file():
        return
    try:
        old = load_config(path).to_dict()
    except (ConfigError, OSError, ValueError):
        return  # unreadable: rewritten by this run, as a missing one would be
    diffs = store.diff_fields(_what(old), _what(cfg.to_dict()))
    if diffs:
        raise ConfigError(
            f"{run_dir} holds experiment {name} run with another config ("
            + "; ".join(diffs[:4]) + (f"; and {len(diffs) - 4} more" if len(diffs) > 4 else "")
            + "): its tables would be replaced and the report would mix the two. Use another "
            "--out for this config, --variant NAME to keep both in this run directory side by "
            f"side, or delete {run_dir} to replace that study")
