"""A trial's resources: its placement group and how many trials fit on the cluster at once.

A trial is a Tune function-trainable actor that does little itself; its evaluation actors do the
work. Each trial therefore reserves a placement group ``[{"CPU": 0}] + [{"CPU": actor_cpus}] *
actors_per_trial`` (:func:`trial_resources`). Tune schedules the trial actor with
``placement_group_capture_child_tasks=True``, so the actors ``evaluate_parallel`` creates land
in the trial's bundles. The number of concurrent trials is derived from the cluster's
resources (:func:`auto_max_concurrent`: whole trials that fit after one CPU is kept back for
Ray's own tasks and the driver) unless set. On 2 CPUs: 1 trial x 2 actors x 0.5 CPU = 1 CPU.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from spice_ray.config import ExperimentConfig

if TYPE_CHECKING:
    from ray.tune import PlacementGroupFactory

RESERVE_CPUS = 1.0
"""CPUs :func:`auto_max_concurrent` keeps free for Ray's own tasks and the driver."""


def trial_bundles(cfg: ExperimentConfig, train_in_trial: bool = False,
                  cluster: Mapping[str, float] | None = None) -> list[dict[str, float]]:
    """Placement-group bundles of one trial: a head bundle for the trial actor, then one bundle
    per evaluation actor (``sweep.actor_cpus`` CPUs, plus ``eval.actor_gpus`` GPUs if set).

    The head bundle is empty (``{"CPU": 0}``) unless the trial trains in-process, when it
    reserves ``train.worker_cpus``. GPU actors also carry the ``trainer`` node label that
    ``evaluate_parallel`` requests on labelled clusters (``spice_ray.common.placement``), so that
    they     still fit their bundles.

    Args:
        cfg: the sweep's config.
        train_in_trial: trials train in-process.
        cluster: cluster resources for the label check (default: ``ray.cluster_resources()``;
            only consulted when ``eval.actor_gpus`` > 0).
    """
    head = {"CPU": float(cfg.train.worker_cpus) if train_in_trial else 0.0}
    from spice_ray.common.placement import actor_bundle

    actor = actor_bundle(cfg.sweep.actor_cpus, cfg.eval.actor_gpus, cluster)
    return [head] + [dict(actor) for _ in range(cfg.sweep.actors_per_trial)]


def trial_resources(cfg: ExperimentConfig, train_in_trial: bool = False) -> PlacementGroupFactory:
    """The trial's :class:`ray.tune.PlacementGroupFactory` (see :func:`trial_bundles`)."""
    from ray import tune

    return tune.PlacementGroupFactory(trial_bundles(cfg, train_in_trial))


def bundles_total(bundles: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Sum of a trial's bundles per resource."""
    total: dict[str, float] = {}
    for bundle in bundles:
        for key, amount in bundle.items():
            total[key] = total.get(key, 0.0) + float(amount)
    return total


def auto_max_concurrent(
    bundles: Sequence[Mapping[str, float]],
    cluster: Mapping[str, float] | None = None,
    num_trials: int | None = None,
    reserve_cpus: float = RESERVE_CPUS,
) -> int:
    """How many trials fit on the cluster at once (at least 1, at most ``num_trials``).

    Per resource a trial needs (CPU, GPU, ...): whole trials that fit in the cluster's total,
    with ``reserve_cpus`` CPUs kept back for Ray's own tasks, the driver and Tune.

    Args:
        bundles: one trial's bundles (:func:`trial_bundles`).
        cluster: total resources (default: ``ray.cluster_resources()``).
        num_trials: the sweep's trial count, an upper bound.
        reserve_cpus: CPUs not given to trials.
    """
    if cluster is None:
        import ray

        cluster = ray.cluster_resources()
    limits = []
    for key, amount in bundles_total(bundles).items():
        if amount <= 0:
            continue
        have = float(cluster.get(key, 0.0)) - (reserve_cpus if key == "CPU" else 0.0)
        limits.append(math.floor(have / amount + 1e-9))
    n = max(1, min(limits)) if limits else max(1, num_trials or 1)
    return min(n, num_trials) if num_trials else n


