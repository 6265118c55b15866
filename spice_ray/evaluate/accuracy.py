"""Per-action accuracy on a grid: does an agent, with a task's whole context in front of it,
pick a shortest-path action at every cell, and "stay" on the goal?

DPT* (DPT trained on optimal labels) can read its context and still never stay on the goal,
whose label is one training query in a hundred; its return alone cannot tell that from not
finding the goal. The episode protocol (``spice_ray.evaluate.episode``) adds these rows for
every agent it scores on a grid: the agent, after observing the task's fixed context, is asked
for its action at every cell, and each action is scored against the set of optimal actions
there (``envs.darkroom.optimal_actions``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from spice_ray.envs import darkroom
from spice_ray.results.schema import ACCURACY_METRICS

METRICS = ACCURACY_METRICS
"""The per-task metrics this module computes, declared with the result schema."""


def grid_accuracy(agent: Any, goals: np.ndarray, size: int, steps: int, dtype: np.dtype
                  ) -> tuple[np.ndarray, np.ndarray]:
    """The agent's action at every cell of a ``size`` x ``size`` grid, per task.

    Args:
        agent: reset and holding each task's context (it is asked ``act(steps, states)`` once
            per cell, every task at that cell; a randomised agent's draws are keyed by step,
            so it draws alike at every cell of a task).
        goals: int [B, 2] goal cells.
        steps: the context length the agent has seen (its ``t``).
        dtype: the states' dtype in this environment.

    Returns:
        (action_accuracy float [B], stay_accuracy float [B]): the share of cells where the
        action is optimal, and whether it is "stay" on the goal cell.
    """
    goals = np.asarray(goals, dtype=np.int64)
    n = len(goals)
    correct = np.zeros((n, size * size), dtype=bool)
    stay = np.zeros(n)
    for c, cell in enumerate(darkroom.all_cells(size)):
        states = np.broadcast_to(cell, goals.shape)
        actions = agent.act(steps, torch.as_tensor(states.astype(dtype))).numpy()
        correct[:, c] = darkroom.optimal_actions(goals, states)[np.arange(n), actions]
        on_goal = (states == goals).all(1)
        stay[on_goal] = correct[on_goal, c]
    return correct.mean(1), stay
