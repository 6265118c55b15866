"""Whole pretraining tasks for given task ids: a pure function of (config, split, ids).

Every draw comes from :class:`spice_ray.rng.TaskStreams` keyed by (seed, split, task_id), so a
task's content does not depend on how tasks are batched; the environment decides what a task,
its behaviour roll-in and its label are (``Environment.generate``).
"""

from __future__ import annotations

import numpy as np

from spice_ray.config import DataConfig, EnvConfig
from spice_ray.rng import TaskStreams


def generate_tasks(env: EnvConfig, data: DataConfig, split: str, task_ids: np.ndarray
                   ) -> dict[str, np.ndarray]:
    """All columns for ``task_ids`` of ``split``."""
    ids = np.asarray(task_ids, dtype=np.int64)
    cols = env.environment().generate(data, split, TaskStreams.from_seed(data.seed, split, ids))
    cols["task_id"] = ids
    return cols
