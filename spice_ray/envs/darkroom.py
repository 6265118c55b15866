"""Darkroom gridworld (the DPT benchmark), batched and pure (numpy, no per-task loop).

PROTOCOL.md: a size x size grid (default 10x10), state (x, y) integers, 5 actions
(+x, -x, +y, -y, stay), moves clipped at the walls, reward 1 when the state *after* the step is
the goal, else 0. The goal cells are split 80/20 into train/test with a fixed seed; a test task
is a held-out goal plus a start state.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from spice_ray.rng import TaskStreams

NUM_ACTIONS = 5
STATE_DIM = 2
# (dx, dy) per action: +x, -x, +y, -y, stay.
MOVES = np.array([[1, 0], [-1, 0], [0, 1], [0, -1], [0, 0]], dtype=np.int64)
ACTION_NAMES = ("+x", "-x", "+y", "-y", "stay")


@dataclass(frozen=True)
class DarkroomTasks:
    """A batch of Darkroom tasks.

    Attributes:
        goals: int64 [B, 2] goal cells.
        starts: int64 [B, 2] start cells.
        size: grid side length.
    """

    goals: np.ndarray
    starts: np.ndarray
    size: int = 10

    @property
    def num_tasks(self) -> int:
        return int(self.goals.shape[0])


def all_cells(size: int) -> np.ndarray:
    """Every cell, int64 [size*size, 2], x-major."""
    xs, ys = np.meshgrid(np.arange(size), np.arange(size), indexing="ij")
    return np.stack([xs.ravel(), ys.ravel()], axis=1)


def goal_split(size: int, train_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Fixed train/test split of the goal cells.

    Returns:
        (train_goals [G_train, 2], test_goals [G_test, 2]); the permutation depends on ``seed``.
    """
    cells = all_cells(size)
    perm = np.random.default_rng(np.random.SeedSequence([seed, size])).permutation(len(cells))
    n_train = int(round(train_fraction * len(cells)))
    if not 0 < n_train < len(cells):
        raise ValueError(f"train_fraction={train_fraction} leaves an empty goal split")
    return cells[perm[:n_train]], cells[perm[n_train:]]


def sample_tasks(streams: TaskStreams, goal_pool: np.ndarray, size: int) -> DarkroomTasks:
    """Goal uniform over ``goal_pool`` [G, 2], start uniform over the grid."""
    goal_idx = streams.integers("darkroom/goal", len(goal_pool))
    starts = np.stack(
        [streams.integers("darkroom/start_x", size), streams.integers("darkroom/start_y", size)],
        axis=1,
    )
    return DarkroomTasks(goal_pool[goal_idx], starts, size)


def reset(tasks: DarkroomTasks) -> np.ndarray:
    """Start states, int64 [B, 2]."""
    return tasks.starts.copy()


def step(
    tasks: DarkroomTasks, states: np.ndarray, actions: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """One move per task.

    Args:
        states: int [B, 2].
        actions: int [B] in [0, 5).

    Returns:
        (next_states int64 [B, 2], rewards float64 [B]); reward is 1 iff next state == goal.
    """
    nxt = np.clip(np.asarray(states, dtype=np.int64) + MOVES[np.asarray(actions)], 0,
                  tasks.size - 1)
    rewards = np.all(nxt == tasks.goals, axis=1).astype(np.float64)
    return nxt, rewards


def optimal_action(tasks: DarkroomTasks, states: np.ndarray) -> np.ndarray:
    """A shortest-path action toward the goal (x first, then y, stay on the goal), int64 [B]."""
    d = tasks.goals - np.asarray(states, dtype=np.int64)  # (B, 2)
    return np.select(
        [d[:, 0] > 0, d[:, 0] < 0, d[:, 1] > 0, d[:, 1] < 0],
        [0, 1, 2, 3],
        default=4,
    ).astype(np.int64)


def optimal_rewards(tasks: DarkroomTasks, horizon: int, starts: np.ndarray | None = None
                    ) -> np.ndarray:
    """Reward r*_t of the optimal policy from the start at steps t = 1..H, [B, H].

    It walks the Manhattan path (distance d) and then stays, so r*_t = 1 for t >= d, except
    that d = 0 (start on the goal) gives 1 from the first step on.
    """
    s0 = tasks.starts if starts is None else np.asarray(starts)
    dist = np.abs(tasks.goals - s0).sum(axis=1)  # (B,)
    t = np.arange(1, horizon + 1)
    return (t[None, :] >= np.maximum(dist, 1)[:, None]).astype(np.float64)


def rollout_states(tasks: DarkroomTasks, starts: np.ndarray, actions: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Follow an action sequence from ``starts``.

    Args:
        starts: int [B, 2].
        actions: int [B, H].

    Returns:
        (states int64 [B, H+1, 2] with states[:, t+1] = step(states[:, t], actions[:, t]),
         rewards float64 [B, H]).
    """
    b, h = actions.shape
    states = np.empty((b, h + 1, 2), dtype=np.int64)
    rewards = np.empty((b, h), dtype=np.float64)
    states[:, 0] = starts
    for t in range(h):  # loop over time, vectorised over tasks
        states[:, t + 1], rewards[:, t] = step(tasks, states[:, t], actions[:, t])
    return states, rewards
