"""How the platform runs Ray Tune, in one place: the tuning stage's grid
(``spice_ray.study.tune_grid``: trials that each score a run of grid points on validation
tasks, in a scratch experiment) and the sweeps (``spice_ray.sweep.driver``: trials that each
evaluate one configuration with their own actors, in a kept, restorable experiment) build
their ``Tuner`` with :func:`new_tuner` and fit it with :func:`fit`.

What both share: trial processes reused between trials (a trial process keeps the models it
loaded), at most ``max_concurrent`` trials at once, a stated number of re-runs for a trial
whose process died, our callbacks, and Tune's own console output (its banner, "View detailed
results here", the TensorBoard hint) sent to the run's log unless asked for.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

from spice_ray.common.console import printed_to_log


def new_tuner(trainable: Any, *, name: str, storage: str, max_concurrent: int,
              max_failures: int, callbacks: Sequence[Any] = (),
              param_space: Mapping[str, Any] | None = None, metric: str | None = None,
              mode: str | None = None, num_samples: int = 1, search_alg: Any = None,
              scheduler: Any = None, keep_checkpoints: int | None = None,
              verbose: int = 0) -> Any:
    """A ``tune.Tuner`` over ``trainable`` writing experiment ``name`` under ``storage``.

    Args:
        max_failures: re-runs of a trial whose process died (0: an errored trial stays so).
        keep_checkpoints: checkpoints kept per trial (None: Tune's default, all).
        verbose: Tune's own console output (0: none; :func:`fit` logs it).
    """
    from ray import tune

    return tune.Tuner(
        trainable, param_space=dict(param_space or {}),
        tune_config=tune.TuneConfig(metric=metric, mode=mode, num_samples=num_samples,
                                    max_concurrent_trials=max_concurrent,
                                    search_alg=search_alg, scheduler=scheduler,
                                    reuse_actors=True),
        run_config=tune.RunConfig(
            name=name, storage_path=storage, verbose=verbose,
            failure_config=tune.FailureConfig(max_failures=max_failures),
            checkpoint_config=tune.CheckpointConfig(num_to_keep=keep_checkpoints),
            callbacks=list(callbacks)))


def fit(tuner: Any, logger: str, quiet: bool = True, trial_logs: bool = True) -> Any:
    """``tuner.fit()``, Tune's prints sent to the logger named ``logger`` (the run's log)
    where ``quiet``; returns its ``ResultGrid``. ``trial_logs=False``: without the CSV, JSON
    and TensorBoard files Tune writes of every trial's results by default
    (``TUNE_DISABLE_AUTO_CALLBACK_LOGGERS``), for an experiment nobody reads.

    Tune's own SIGINT handler is left out (``TUNE_DISABLE_SIGINT_HANDLER``): it ended the fit
    quietly with trials unfinished, so a Ctrl-C in the tuning stage surfaced as "grid points
    have no score" with a traceback. The driver's handler (``runtime.cli.run_main``) then stops
    the run as in any other stage: one line, exit 130, the same command resumes.
    """
    switches = {_NO_TUNE_SIGINT: "1", **({} if trial_logs else {_NO_TRIAL_LOGS: "1"})}
    before = {name: os.environ.get(name) for name in switches}
    os.environ.update(switches)
    try:
        with printed_to_log(logging.getLogger(logger), enabled=quiet):
            return tuner.fit()
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


_NO_TUNE_SIGINT = "TUNE_DISABLE_SIGINT_HANDLER"
_NO_TRIAL_LOGS = "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS"
