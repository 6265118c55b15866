"""Sampled sweeps (``sweep.search=random|optuna``): conditional spaces, distinct configurations.

Both sampled searches run through Tune's ``OptunaSearch`` with a define-by-run space
(:class:`SpaceSampler`) built from the sweep's declarative space, so a :class:`Conditional`
key is drawn only when its condition holds (beta only for a schedule that reads it, tau only
for a kernel that reads it): ``optuna`` with Optuna's TPE sampler, ``random`` with its
independent uniform sampler, both seeded by ``sweep.seed``. Tune's own random search
(``BasicVariantGenerator``) could express a condition only through ``tune.sample_from``
functions, which draw from an unseeded global stream.

A sampled search can still draw one configuration twice (a space whose only free keys are
categorical, or a condition that leaves none free: kernel uniform with the sqrt2logt schedule is
one configuration however it is reached). :class:`DistinctConfigs` keeps such a draw from
becoming a trial: the searcher is told the result the configuration already has (or will
have, when it is still running) and asked again; when it offers nothing new after
:data:`MAX_REDRAWS` tries the search ends early, with fewer trials than ``sweep.num_samples``.

This module imports Ray Tune: the driver imports it when a sweep starts.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping
from typing import Any

from ray.tune.search import Searcher

from spice_ray.sweep.params import Conditional, SweepError, _is_sampler, _walk, params_json

log = logging.getLogger(__name__)

MAX_REDRAWS = 200
"""Draws a suggestion may take to find a configuration not yet run before the search ends."""


def _distribution(domain: Any) -> Any:
    """The Optuna distribution of a Tune ``domain`` (Tune's own conversion)."""
    from ray.tune.search.optuna import OptunaSearch

    return OptunaSearch.convert_search_space({"x": domain})["x"]


def _suggest(trial: Any, name: str, dist: Any) -> Any:
    """One value of an Optuna distribution from an Optuna trial, under ``name``."""
    import optuna

    if isinstance(dist, optuna.distributions.CategoricalDistribution):
        return trial.suggest_categorical(name, dist.choices)
    if isinstance(dist, optuna.distributions.IntDistribution):
        return trial.suggest_int(name, dist.low, dist.high, step=dist.step, log=dist.log)
    return trial.suggest_float(name, dist.low, dist.high, step=dist.step, log=dist.log)


class SpaceSampler:
    """Optuna define-by-run function of a declarative search space (nested dicts of Tune
    domains, :class:`Conditional` keys and constants), keys drawn in the space's order.

    Returns the constants (and each failed condition's ``otherwise``) for ``OptunaSearch`` to
    merge with the drawn values; names are dotted keys with ``/`` (Tune unflattens them).
    """

    def __init__(self, space: Mapping[str, Any]) -> None:
        self.items = _walk(space)
        self.distributions = {  # converted once, not at every draw
            key: _distribution(value.domain if isinstance(value, Conditional) else value)
            for key, value in self.items if _is_sampler(value)}

    def __call__(self, trial: Any) -> dict[str, Any]:
        values: dict[str, Any] = {}
        constants: dict[str, Any] = {}
        for key, value in self.items:
            name = key.replace(".", "/")
            if isinstance(value, Conditional) and not value.holds(values):
                values[key] = constants[name] = value.otherwise
            elif key in self.distributions:
                values[key] = _suggest(trial, name, self.distributions[key])
            else:
                values[key] = constants[name] = value
        return constants


class DistinctConfigs(Searcher):
    """A Tune ``Searcher`` wrapper that never suggests a configuration already suggested.

    A repeated draw is not run: the inner searcher is told the result the configuration
    already has (at once when it finished, when it finishes otherwise) and asked again, up to
    :data:`MAX_REDRAWS` times, after which the search ends (``Searcher.FINISHED``). An errored
    trial frees its configuration for a later draw. Its state (configurations seen, their
    results) is saved with the inner searcher's, so a restored sweep does not repeat a trial
    finished before the interruption either.
    """

    def __init__(self, searcher: Searcher, max_redraws: int = MAX_REDRAWS) -> None:
        self.searcher = searcher
        self.max_redraws = max_redraws
        self.inner_id: dict[str, str] = {}
        """Tune's trial id -> the inner searcher's id of the draw it runs."""
        self.key_of: dict[str, str] = {}
        """Tune's trial id -> its configuration (``params_json``)."""
        self.results: dict[str, dict[str, Any]] = {}
        """Configuration -> its final result, once finished."""
        self.waiting: dict[str, list[str]] = {}
        """Configuration still running -> inner ids of repeated draws to tell its result."""
        self.repeats = 0
        """Repeated draws not run."""
        super().__init__(metric=searcher.metric, mode=searcher.mode)

    # --- what Tune calls -------------------------------------------------------------------
    def set_search_properties(self, metric: str | None, mode: str | None, config: dict,
                              **spec: Any) -> bool:
        ok = self.searcher.set_search_properties(metric, mode, config, **spec)
        self._metric, self._mode = self.searcher.metric, self.searcher.mode
        return ok

    def set_max_concurrency(self, max_concurrent: int) -> bool:
        return self.searcher.set_max_concurrency(max_concurrent)

    def suggest(self, trial_id: str) -> Any:
        for attempt in range(self.max_redraws):
            inner = trial_id if attempt == 0 else f"{trial_id}_repeat{attempt}"
            config = self.searcher.suggest(inner)
            if not isinstance(config, dict):  # None (ask later) or FINISHED
                return config
            key = params_json(config)
            if key in self.results:
                self.repeats += 1
                self.searcher.on_trial_complete(inner, result=self.results[key])
            elif key in self.waiting:
                self.repeats += 1
                self.waiting[key].append(inner)
            else:
                self.inner_id[trial_id], self.key_of[trial_id] = inner, key
                self.waiting[key] = []
                return config
        log.warning("the searcher drew only configurations already run in %d draws; the "
                    "search ends with the distinct ones (%d)", self.max_redraws,
                    len(self.results) + len(self.waiting))
        return self.FINISHED

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        if trial_id in self.inner_id:
            self.searcher.on_trial_result(self.inner_id[trial_id], result)

    def on_trial_complete(self, trial_id: str, result: dict | None = None,
                          error: bool = False) -> None:
        if trial_id not in self.inner_id:
            return
        inner, key = self.inner_id.pop(trial_id), self.key_of.pop(trial_id)
        self.searcher.on_trial_complete(inner, result=result, error=error)
        repeats = self.waiting.pop(key, [])
        if error or result is None:
            for other in repeats:  # their configuration may be drawn again later
                self.searcher.on_trial_complete(other, result=None, error=True)
            return
        self.results[key] = {k: result[k] for k in (self.metric,) if k in result}
        for other in repeats:
            self.searcher.on_trial_complete(other, result=self.results[key])

    # --- saved with the experiment: Tune stores a wrapper's state (any searcher with a
    # ``searcher`` attribute) beside its inner searcher's, and sets it back on restore -------
    def get_state(self) -> dict[str, Any]:
        return copy.deepcopy({k: v for k, v in self.__dict__.items() if k != "searcher"})

    def set_state(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)


def make_searcher(search: str, space: Mapping[str, Any], seed: int, metric: str) -> Any:
    """The Tune search algorithm of ``sweep.search``: None for a grid (Tune's variant
    generator expands it), else :class:`DistinctConfigs` over ``OptunaSearch`` with the
    space as a define-by-run function, TPE (``optuna``) or uniform (``random``), seeded.

    Raises:
        SweepError: optuna is not installed.
    """
    if search == "grid":
        return None
    try:
        import optuna
        from ray.tune.search.optuna import OptunaSearch
    except ImportError as exc:
        raise SweepError(f"sweep.search={search} needs the optuna package: pip install "
                         "'spice-ray[search]'") from exc
    # Optuna's own INFO lines ("A new study created ...") go to the run's log, not stderr
    optuna.logging.disable_default_handler()
    optuna.logging.enable_propagation()
    sampler = (optuna.samplers.TPESampler(seed=seed) if search == "optuna"
               else optuna.samplers.RandomSampler(seed=seed))
    return DistinctConfigs(OptunaSearch(space=SpaceSampler(space), metric=metric, mode="min",
                                        sampler=sampler))
