"""Metrics by name: what a ``metric`` value in a result row means (its label, which way is
better) and the names the study writes, declared once (:data:`CUMULATIVE_REGRET`, ...), so a
row, a table's header, a figure's axis and a plugin's own metric read one registry
(:func:`register_metric`). No pandas, no Ray: evaluation writes these names."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Metric:
    """What a ``metric`` value means wherever it is shown: its name in tables and figures and
    which way is better."""

    name: str
    """The ``metric`` column's value."""
    label: str
    """Its name in a table's header or a figure's axis."""
    higher_is_better: bool = False
    """False for regrets, losses and errors; True for returns and accuracies."""


METRICS: dict[str, Metric] = {}
"""Every metric by name (:func:`register_metric`): the study's below, and a plugin's own."""


def register_metric(metric: Metric) -> Metric:
    """Add ``metric`` to :data:`METRICS` (the same entry again is a no-op).

    Raises:
        ValueError: its name is taken by a different entry.
    """
    if METRICS.get(metric.name, metric) != metric:
        raise ValueError(f"metric {metric.name!r} is already registered as "
                         f"{METRICS[metric.name]}")
    METRICS[metric.name] = metric
    return metric


def metric_info(name: str) -> Metric:
    """The registered :class:`Metric` of ``name``; for a name nobody registered, one that
    reads as the name with spaces (first letter capitalised), lower better."""
    if name in METRICS:
        return METRICS[name]
    text = str(name).replace("_", " ")
    return Metric(str(name), text[:1].upper() + text[1:])


CUMULATIVE_REGRET = "cumulative_regret"
"""The online protocols' regret summed over steps (under the environment's configured reading)."""
CUMULATIVE_RETURN = "cumulative_return"
"""The online protocols' reward summed over steps (MDPs)."""
SUBOPTIMALITY = "suboptimality"
"""The offline protocol's gap between the best arm's value and the chosen one's."""
FINAL_REGRET = "final_regret"
"""A sweep's or a robustness table's regret at the horizon."""

for _metric in (
        Metric(CUMULATIVE_REGRET, "Cumulative regret"),
        Metric(FINAL_REGRET, "Final regret"),
        Metric(SUBOPTIMALITY, "Suboptimality"),
        Metric(CUMULATIVE_RETURN, "Return", higher_is_better=True),
        Metric("return", "Return", higher_is_better=True),
        Metric("final_return", "Final return", higher_is_better=True),
        Metric("action_accuracy", "Action accuracy", higher_is_better=True),
        Metric("stay_accuracy", "Stay accuracy", higher_is_better=True),
        Metric("context_shows_goal", "Context shows goal", higher_is_better=True),
        Metric("prior_rmse", "Prior RMSE")):
    register_metric(_metric)
