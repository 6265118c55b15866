"""Independent jobs as Ray tasks, results as they finish (the figures stage's drawing).

A thin layer: the job function is an ordinary importable function that knows nothing of Ray,
and without a running Ray the same jobs run one after another in this process.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any


def map_unordered(fn: Callable[..., Any], jobs: Sequence[tuple[Any, ...]],
                  num_cpus: float = 1.0, min_jobs: int = 1) -> Iterator[Any]:
    """``fn(*job)`` for every job, as Ray tasks of ``num_cpus`` CPUs each when Ray is running
    and there are at least ``min_jobs`` jobs (as many at once as the cluster's CPUs allow),
    else in this process (a task's worker costs a process start and its imports, which a few
    short jobs do not repay); yields each result as its job finishes. A task's exception is
    raised here as itself (not wrapped in Ray's ``RayTaskError``), after which the other tasks
    are cancelled."""
    import ray

    if not jobs:
        return
    if len(jobs) < min_jobs or not ray.is_initialized():
        yield from (fn(*job) for job in jobs)
        return
    from ray.exceptions import RayTaskError

    remote = ray.remote(num_cpus=num_cpus, max_retries=0)(fn)
    pending = [remote.remote(*job) for job in jobs]
    try:
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            try:
                yield ray.get(done[0])
            except RayTaskError as exc:
                cause = getattr(exc, "cause", None)
                raise (cause if isinstance(cause, BaseException) else exc) from None
    finally:
        for ref in pending:
            ray.cancel(ref)
