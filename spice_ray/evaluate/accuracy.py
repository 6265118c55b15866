"""Per-action accuracy of a darkroom policy on its task's context: does it pick a shortest-path
action at every cell, and "stay" on the goal?

DPT* (DPT trained on optimal labels) can read its context and still never stay on the goal,
whose label is one training query in a hundred; its return alone cannot tell that from not
finding the goal. This scores the greedy action of the model's policy head at every cell of the
grid, with the task's whole context in front of it, against the set of optimal actions there.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

from spice_ray.config import EnvConfig
from spice_ray.envs import darkroom
from spice_ray.model.tokens import make_tokens


def darkroom_action_accuracy(model: torch.nn.Module, env: EnvConfig,
                             data: Mapping[str, np.ndarray]) -> dict[str, float]:
    """The greedy action's accuracy at every cell of every task of ``data`` (one split).

    Args:
        model: a model whose output has ``logits`` [B, T+1, A] (DPT).
        env: the darkroom's config (grid size).
        data: a split's columns, as ``store.load_split`` returns them (one row per task).

    Returns:
        ``accuracy``: the share of (task, cell) pairs where the greedy action is optimal;
        ``accuracy_goal_shown`` / ``accuracy_goal_hidden``: the same over tasks whose context
        does / does not contain a reward; ``stay_accuracy``: the share of tasks whose greedy
        action on the goal cell is "stay"; ``move_accuracy``: over the other cells; ``tasks``.
    """
    size = env.grid_size
    cells = darkroom.all_cells(size)
    goals = np.asarray(data["goal"], dtype=np.int64)
    n = len(goals)
    correct = np.zeros((n, len(cells)), dtype=bool)
    on_goal = np.zeros((n, len(cells)), dtype=bool)
    model.eval()
    for c, cell in enumerate(cells):
        batch = dict(data)
        state = np.broadcast_to(cell, goals.shape)
        batch["query_state"] = state.astype(np.asarray(data["query_state"]).dtype)
        with torch.no_grad():
            action = model(make_tokens(batch, env)).logits[:, -1].argmax(-1).numpy()
        best = darkroom.optimal_actions(goals, state)
        correct[:, c] = best[np.arange(n), action]
        on_goal[:, c] = (state == goals).all(1)
    shown = np.asarray(data["rewards"]).sum(1) > 0

    def share(mask: np.ndarray) -> float:
        return float(correct[mask].mean()) if mask.any() else float("nan")

    everywhere = np.ones_like(correct)
    return {"accuracy": share(everywhere),
            "accuracy_goal_shown": share(everywhere & shown[:, None]),
            "accuracy_goal_hidden": share(everywhere & ~shown[:, None]),
            "stay_accuracy": share(on_goal), "move_accuracy": share(~on_goal),
            "tasks": float(n)}
