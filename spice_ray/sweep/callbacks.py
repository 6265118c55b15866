"""Tune callbacks of a sweep: its console progress (imported with Ray Tune, on demand).

Tune pickles its callbacks with the experiment (``tuner.pkl``) and a restore brings them back,
so :class:`TrialProgress` keeps no console: it finds the console of the current process by the
sweep's name (:func:`attach`).
"""

from __future__ import annotations

from typing import Any

from ray.tune import Callback

from spice_ray.common.console import SILENT, Bar, Console

_CONSOLES: dict[str, Console] = {}


def attach(name: str, console: Console) -> None:
    """Show sweep ``name``'s progress on ``console`` in this process."""
    _CONSOLES[name] = console


class TrialProgress(Callback):
    """A console bar over a sweep's trials: running regret as chunks report, one unit per
    finished (or stopped, or errored) trial."""

    def __init__(self, name: str, total: int) -> None:
        self.name, self.total = name, total
        self._bar: Bar | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"name": self.name, "total": self.total}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["name"], state["total"])

    def _progress(self) -> Bar:
        if self._bar is None:
            console = _CONSOLES.get(self.name, SILENT)
            self._bar = console.bar(f"sweep {self.name}", self.total, "trial")
        return self._bar

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict,
                        **info: Any) -> None:
        regret = result.get("regret_mean")
        if regret is not None:
            self._progress().update(status=f"{trial.trial_id} chunk {result.get('chunk', 1)}/"
                                    f"{result.get('chunks', 1)}: regret {regret:.2f}")

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._progress().update(1)

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._progress().update(1, status=f"{trial.trial_id} errored")

    def on_experiment_end(self, trials: list, **info: Any) -> None:
        stopped = sum(1 for t in trials
                      if (t.last_result or {}).get("chunk", 1)
                      < (t.last_result or {}).get("chunks", 1))
        errored = sum(1 for t in trials if t.status == "ERROR")
        self._progress().close(f"{len(trials)} trials"
                               + (f", {stopped} stopped early" if stopped else "")
                               + (f", {errored} errored" if errored else ""))
        self._bar = None
