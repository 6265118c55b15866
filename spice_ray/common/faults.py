"""Fault injection for tests, behind one switch.

The environment variable ``SPICE_RAY_FAULT`` holds a JSON object {point: value}; the code where
each fault happens asks :func:`fault` for its point and fails as told. An environment variable,
so the switch reaches Ray workers and subprocesses the way a real fault would. The points:

- ``train_epoch`` (int): training raises at the end of that epoch on its first attempt (the
  retry resumes from the last checkpoint);
- ``generate_after_shards`` (int): dataset generation stops with an error after finalising
  that many shards;
- ``disk_full`` (true): every shard write fails with ENOSPC;
- ``sweep_trial`` ({flattened param: value}): sweep trials whose params match raise;
- ``ray_start`` (int): that many local Ray start-ups fail as Ray's own start-up timeout does
  (``spice_ray.runtime.reach.start_local``);
- ``stop_before_run`` (true): an entry point stops once its arguments and config resolve,
  before it writes anything or starts Ray, with one line and exit 0
  (:func:`stop_before_run`: how the docs test runs every documented command line).

Nothing in it is executed: it is parsed as JSON and each value is checked by its reader.
"""

from __future__ import annotations

import json
import os
from typing import Any

FAULT_ENV = "SPICE_RAY_FAULT"
POINTS = ("train_epoch", "generate_after_shards", "disk_full", "sweep_trial", "ray_start",
          "stop_before_run")


def fault(point: str, default: Any = None) -> Any:
    """The value injected at ``point``, or ``default`` when the switch does not name it.

    Raises:
        ValueError: an unknown point, or a switch that is not a JSON object of known points.
    """
    if point not in POINTS:
        raise ValueError(f"fault point {point!r} is invalid: one of {', '.join(POINTS)}")
    raw = os.environ.get(FAULT_ENV, "")
    if not raw:
        return default
    try:
        values = json.loads(raw)
    except json.JSONDecodeError as e:
        raise ValueError(f"{FAULT_ENV}={raw!r} is invalid: a JSON object ({e})") from None
    unknown = sorted(set(values) - set(POINTS)) if isinstance(values, dict) else None
    if unknown is None or unknown:
        raise ValueError(f"{FAULT_ENV}={raw!r} is invalid: a JSON object of "
                         f"{', '.join(POINTS)}")
    return values.get(point, default)


def fault_switch(**points: Any) -> str:
    """The switch's value that injects ``points`` (for ``monkeypatch.setenv(FAULT_ENV, ...)``)."""
    unknown = sorted(set(points) - set(POINTS))
    if unknown:
        raise ValueError(f"fault points {unknown} are invalid: one of {', '.join(POINTS)}")
    return json.dumps(points)


STOPPED = "stopped before the run ({}): its arguments and config are valid"
"""The line :func:`stop_before_run` prints."""


def stop_before_run(what: str) -> None:
    """Exit 0 with one line when the switch names ``stop_before_run``: ``what`` (the entry
    point) has parsed its arguments and resolved its config, and nothing is written yet."""
    if fault("stop_before_run", False):
        print(STOPPED.format(what), flush=True)
        raise SystemExit(0)
