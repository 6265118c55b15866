"""Training progress on the driver's console, from wherever the loop runs.

Rank 0 of the loop carries a :class:`ProgressReporter` (a
:class:`~spice_ray.train.loop.StepObserver`) that hands a small snapshot (step, epoch, loss
components) to a sink at most once per ``interval_s``. In-process the sink updates the bar
directly; under Ray Train it is a ``ray.util.queue.Queue`` that a driver thread drains
(:class:`QueueDrain`) while ``TorchTrainer.fit`` blocks.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from torch import Tensor

from spice_ray.common.console import Bar

SHOWN = ("loss", "policy", "td", "shrink", "anchor", "var")
"""Loss components shown on the console (SPICE, "var" with a variance head; DPT has loss and
policy only)."""


def describe_loss(values: Mapping[str, float], prefix: str = "") -> str:
    """``loss 0.412 (policy 0.300, td 0.050, ...)`` from components (optionally prefixed,
    e.g. ``train_``)."""
    total = values.get(f"{prefix}loss")
    if total is None:
        return ""
    parts = [f"{k} {values[prefix + k]:.3f}" for k in SHOWN[1:] if prefix + k in values]
    if prefix + "td" not in values:  # DPT: the loss is the policy loss
        parts = []
    return f"loss {total:.3f}" + (f" ({', '.join(parts)})" if parts else "")


class ProgressReporter:
    """StepObserver that sends a snapshot to ``sink`` every ``interval_s`` and at the end.

    Models trained one after another on one bar (the seeds of a model, ``train.together``)
    report their steps after ``offset`` steps of the models before them, and name themselves
    (``model``, e.g. "seed 1")."""

    def __init__(self, sink: Callable[[dict[str, Any]], None], epochs: int,
                 interval_s: float = 1.0, clock: Callable[[], float] = time.monotonic,
                 offset: int = 0, model: str = "") -> None:
        self.sink, self.epochs, self.interval_s, self.clock = sink, epochs, interval_s, clock
        self.offset, self.model = offset, model
        self._last = -float("inf")

    def step(self, step: int, total: int, epoch: int, components: Mapping[str, Tensor]
             ) -> None:
        now = self.clock()
        if now - self._last < self.interval_s and step < total:
            return
        self._last = now
        self.sink({"step": self.offset + step, "total": total, "epoch": epoch,
                   "epochs": self.epochs, "model": self.model,
                   "loss": {k: float(components[k]) for k in SHOWN if k in components}})

    def epoch(self, epoch: int, metrics: Mapping[str, float]) -> None:
        pass


class TrainBar:
    """Shows snapshots of :class:`ProgressReporter` on a console bar."""

    def __init__(self, bar: Bar) -> None:
        self.bar = bar

    def __call__(self, snapshot: dict[str, Any]) -> None:
        status = f"epoch {snapshot['epoch'] + 1}/{snapshot['epochs']}"
        if snapshot.get("model"):
            status = f"{snapshot['model']} {status}"
        loss = describe_loss(snapshot["loss"])
        self.bar.update(done=int(snapshot["step"]), status=f"{status}, {loss}" if loss
                        else status)


class QueueDrain:
    """A driver thread that feeds a Ray queue's snapshots to ``show`` until stopped."""

    def __init__(self, queue: Any, show: Callable[[dict[str, Any]], None],
                 interval_s: float = 0.5) -> None:
        self.queue, self.show, self.interval_s = queue, show, interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="train-progress", daemon=True)

    def __enter__(self) -> QueueDrain:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._drain()

    def _drain(self) -> None:
        try:
            size = self.queue.qsize()
            items = self.queue.get_nowait_batch(size) if size else []
        except Exception:  # noqa: BLE001 - the queue actor is gone: nothing left to show
            return
        if items:
            self.show(items[-1])

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._drain()
