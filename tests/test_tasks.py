"""runtime.tasks.map_unordered: independent jobs as Ray tasks, or in this process."""

from __future__ import annotations

import os
import sys

import pytest

from spice_ray.runtime.tasks import map_unordered


def _pid() -> int:
    return os.getpid()


def _ratio(a: float, b: float) -> float:
    return a / b


def test_jobs_run_as_ray_tasks_and_a_failure_is_raised_as_itself(ray_local) -> None:
    import ray.cloudpickle
    from ray.exceptions import RayTaskError

    # the workers cannot import this test module: ship its functions by value
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    pids = list(map_unordered(_pid, [()] * 4, min_jobs=2))
    assert len(pids) == 4 and os.getpid() not in pids  # in Ray's workers
    assert sorted(map_unordered(_ratio, [(k, 2) for k in range(4)], min_jobs=2)) == [
        0.0, 0.5, 1.0, 1.5]
    with pytest.raises(ZeroDivisionError) as caught:
        list(map_unordered(_ratio, [(1, 1), (1, 0), (2, 1)], min_jobs=2))
    assert not isinstance(caught.value, RayTaskError)
    # fewer jobs than min_jobs: one after another, here
    assert list(map_unordered(_pid, [()], min_jobs=2)) == [os.getpid()]
    assert list(map_unordered(_pid, [])) == []
