"""Placing work by node label, the one part of cluster management the library needs.

The AWS launcher file (``cluster.yaml``) tags each node type with one custom resource, a
*label*: ``head`` on the head node, ``datagen`` on the CPU nodes that generate datasets,
``trainer`` on the GPU nodes that train and evaluate. Code asks for a label through
:func:`placement_resources`, which returns a tiny request (``{"datagen": 0.001}``) only when
the cluster can provide that label, so the same code runs on a laptop (no labels, no
requirement) and on the cluster (work lands on the right node type)::

    ds.map_batches(fn, resources=placement_resources(DATAGEN), ...)
    ScalingConfig(use_gpu=True, resources_per_worker={"GPU": 1, **placement_resources(TRAINER)})

A label is a *selector*, not a concurrency limit: a node advertises 1 unit and each request
takes 0.001, so up to 1000 tasks/actors can hold it at once; CPU/GPU still bound concurrency.
:func:`node_usage` shows which nodes ran labelled work. Checking launcher files and running a
multi-node cluster on one machine are tools, not library code: see ``tools/cluster.py``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

HEAD = "head"
"""Label of the head node: drivers and zero-CPU coordinator actors only."""
DATAGEN = "datagen"
"""Label of the CPU worker nodes that run Ray Data dataset generation."""
TRAINER = "trainer"
"""Label of the GPU worker nodes that run Ray Train workers and GPU evaluation actors."""

LABEL_REQUEST = 0.001
"""Amount of a label one task/actor requests: a selector, not a limit (a node offers 1)."""

LABELS_ENV = "SPICE_RAY_CLUSTER_LABELS"
"""Comma-separated labels the cluster can provide even before such a node is up.

``cluster.yaml`` sets it in every container (docker ``run_options``), so that a driver on an
autoscaling cluster that has only its head running still asks for ``datagen``/``trainer`` and
the autoscaler launches that node type (``ray.cluster_resources()`` alone would show no label
yet, and unlabelled CPU work could scale up GPU nodes instead).
"""

def resource_labels() -> tuple[str, ...]:
    """The label names used in ``cluster.yaml``: ``("head", "datagen", "trainer")``."""
    return (HEAD, DATAGEN, TRAINER)


def declared_labels(environ: Mapping[str, str] | None = None) -> frozenset[str]:
    """Labels declared through :data:`LABELS_ENV` (empty when unset)."""
    raw = (os.environ if environ is None else environ).get(LABELS_ENV, "")
    return frozenset(part.strip() for part in raw.split(",") if part.strip())


def placement_resources(
    kind: str,
    cluster_resources: Mapping[str, float] | None = None,
    environ: Mapping[str, str] | None = None,
) -> dict[str, float]:
    """Custom-resource request that places work of ``kind`` on its node type, when there is one.

    Args:
        kind: one of :func:`resource_labels` (``"head"``, ``"datagen"``, ``"trainer"``).
        cluster_resources: the cluster's resources; default ``ray.cluster_resources()``
            (Ray must then be initialised).
        environ: environment to read :data:`LABELS_ENV` from; default ``os.environ``.

    Returns:
        ``{kind: 0.001}`` if the cluster has that resource or declares it through
        :data:`LABELS_ENV`, else ``{}`` (a laptop or a plain local cluster: no requirement).

    Raises:
        ValueError: ``kind`` is not a known label.
        RuntimeError: ``cluster_resources`` is omitted and Ray is not initialised.
    """
    if kind not in resource_labels():
        raise ValueError(f"unknown placement kind {kind!r}: one of {', '.join(resource_labels())}")
    if kind in declared_labels(environ):
        return {kind: LABEL_REQUEST}
    if cluster_resources is None:
        import ray

        if not ray.is_initialized():
            raise RuntimeError("placement_resources() needs ray.init() first "
                               "(or pass cluster_resources=...)")
        cluster_resources = ray.cluster_resources()
    return {kind: LABEL_REQUEST} if cluster_resources.get(kind, 0) > 0 else {}


# ---- launcher config: Ray's schema and this project's policy ---------------------------------




def actor_bundle(cpus: float, gpus: float,
                 cluster_resources: Mapping[str, float] | None = None) -> dict[str, float]:
    """An evaluation actor's resources as one placement bundle: its CPUs and, where it asks
    for GPUs, the GPUs and the GPU nodes' label (:func:`placement_resources`, consulted only
    then: Ray must be initialised unless ``cluster_resources`` is given)."""
    bundle = {"CPU": float(cpus)}
    if gpus > 0:
        bundle |= {"GPU": float(gpus), **placement_resources(TRAINER, cluster_resources)}
    return bundle


def _node_id() -> str:
    """Runs remotely: the ID of the node executing it."""
    import ray

    return ray.get_runtime_context().get_node_id()


def labelled_nodes() -> dict[str, list[str]]:
    """For each label, the IDs of the alive nodes that advertise it (Ray must be initialised)."""
    import ray

    out: dict[str, list[str]] = {label: [] for label in resource_labels()}
    for node in ray.nodes():
        if node.get("Alive"):
            for label in resource_labels():
                if node.get("Resources", {}).get(label, 0) > 0:
                    out[label].append(node["NodeID"])
    return {k: sorted(v) for k, v in out.items()}


def node_usage(
    address: str | None = None,
    labels: Sequence[str] = (DATAGEN, TRAINER),
    tasks_per_label: int = 4,
    timeout_s: float = 60.0,
) -> dict[str, list[str]]:
    """Run small zero-CPU tasks that each require one label; report the nodes that ran them.

    Args:
        address: Ray address to join if Ray is not initialised yet (e.g. ``"auto"`` or
            ``"127.0.0.1:6379"``); joined without ``num_cpus`` and shut down afterwards.
            Ignored when Ray is already initialised.
        labels: labels to exercise; each task requests ``{label: LABEL_REQUEST}`` directly
            (not through :func:`placement_resources`), so a missing label is an error.
        tasks_per_label: tasks submitted per label.
        timeout_s: how long to wait for all tasks.

    Returns:
        ``{label: sorted unique node IDs that ran a task requiring it}``.

    Raises:
        TimeoutError: some tasks did not finish in time (typically: no alive node has the
            label and no autoscaler adds one), naming the labels still pending.
    """
    import ray

    joined = False
    if not ray.is_initialized():
        ray.init(address=address or "auto", log_to_driver=False, logging_level="ERROR")
        joined = True
    try:
        task = ray.remote(num_cpus=0)(_node_id)
        refs = {label: [task.options(resources={label: LABEL_REQUEST}).remote()
                        for _ in range(tasks_per_label)] for label in labels}
        every = [r for rs in refs.values() for r in rs]
        _, pending = ray.wait(every, num_returns=len(every), timeout=timeout_s)
        if pending:
            for ref in pending:  # do not leave demand behind for an autoscaler to chase
                ray.cancel(ref)
            late = sorted({label for label, rs in refs.items() if set(rs) & set(pending)})
            raise TimeoutError(f"tasks requiring {late} did not finish in {timeout_s} s: "
                               "does an alive node advertise those labels?")
        return {label: sorted(set(ray.get(rs))) for label, rs in refs.items()}
    finally:
        if joined:
            ray.shutdown()


