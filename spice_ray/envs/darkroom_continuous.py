"""Continuous Darkroom (paper appendix "Darkroom Pretraining and Testing"), batched and pure.

The appendix describes states as d-dimensional feature vectors (default d = 10), discrete
actions with deterministic dynamics, a smooth reward peaked at a latent goal, H = 100,
N = 100 held-out tasks and 20% of goals held out. The choices made here:

* Underneath is the size x size grid of :mod:`spice_ray.envs.darkroom` (cells, 5 actions
  +x, -x, +y, -y, stay, moves clipped at the walls, the same fixed 80/20 goal split).
* A state is phi(cell) = W cell + c in R^d, with W a fixed random d x 2 matrix with
  orthonormal columns and c a fixed random offset (both from ``env.embed_seed``): an
  isometric embedding, so distances between states are grid distances, while no single
  coordinate is a grid coordinate. The cell is recovered exactly as round(W^T (phi - c)).
* The reward of arriving in a cell is exp(-||cell - goal||^2 / (2 width^2)), width 1.5 by
  default: 1 on the goal, 0.8 next to it, and never exactly 0.
* The optimal action moves along the axis with the larger offset to the goal (x on ties; stay
  on the goal). Every shortest path arrives at the same step, but under a smooth reward the one
  that always shrinks the larger offset passes closest to the goal at every step, so it
  collects the most reward on the way and maximises each step's reward.
* Pretraining contexts are uniform-random roll-ins from a random start (pi_b = 1/5); the
  query state is a uniform random cell's phi. Labels: optimal (the optimal action at the
  query), weak-last, mix:q.
* Regret readings as in Darkroom: ``walker`` (the rewards of an optimal walker from the same
  start, which collects the smooth reward on its way) and ``state``
  (max_a r(s_t, a) - r(s_t, a_t)).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from spice_ray.common.rng import TaskStreams
from spice_ray.envs import darkroom
from spice_ray.envs.base import Column, Encoded, Environment, register
from spice_ray.envs.labels import make_labels


@dataclass(frozen=True)
class ContinuousTasks:
    """Grid tasks (goals, starts) and the embedding of cells into states.

    Attributes:
        grid: the underlying gridworld tasks.
        weight: float64 [d, 2] W, orthonormal columns.
        offset: float64 [d] c.
        width: reward width.
    """

    grid: darkroom.DarkroomTasks
    weight: np.ndarray
    offset: np.ndarray
    width: float

    @property
    def num_tasks(self) -> int:
        return self.grid.num_tasks

    def select(self, index: int) -> ContinuousTasks:
        """Task ``index`` as a batch of one (the embedding is shared, not per task)."""
        one = slice(index, index + 1)
        grid = dataclasses.replace(self.grid, goals=self.grid.goals[one],
                                   starts=self.grid.starts[one])
        return dataclasses.replace(self, grid=grid)

    def embed(self, cells: np.ndarray) -> np.ndarray:
        """phi(cell) [..., d] of cells [..., 2]."""
        return np.asarray(cells, dtype=np.float64) @ self.weight.T + self.offset

    def cells(self, states: np.ndarray) -> np.ndarray:
        """The cells [..., 2] (int64) of states [..., d]."""
        return np.rint((np.asarray(states, dtype=np.float64) - self.offset)
                       @ self.weight).astype(np.int64)

    def reward(self, tasks: darkroom.DarkroomTasks, cells: np.ndarray) -> np.ndarray:
        """The smooth reward of arriving in cells [B, ..., 2] -> [B, ...]."""
        goals = tasks.goals.reshape((tasks.num_tasks,) + (1,) * (cells.ndim - 2) + (2,))
        d2 = ((np.asarray(cells) - goals) ** 2).sum(-1)
        return np.exp(-d2 / (2.0 * self.width ** 2))


def optimal_action(tasks: darkroom.DarkroomTasks, cells: np.ndarray) -> np.ndarray:
    """Move along the axis with the larger offset to the goal (x on ties), stay on it, [B]."""
    d = tasks.goals - np.asarray(cells, dtype=np.int64)  # (B, 2)
    along_x = np.abs(d[:, 0]) >= np.abs(d[:, 1])
    step = np.where(along_x, np.where(d[:, 0] > 0, 0, 1), np.where(d[:, 1] > 0, 2, 3))
    return np.where((d == 0).all(axis=1), 4, step).astype(np.int64)


def embedding(dim: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(W [dim, 2] with orthonormal columns, c [dim]) from ``seed``."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, dim, 2]))
    q, _ = np.linalg.qr(rng.standard_normal((dim, 2)))
    return q, rng.standard_normal(dim)


@register
class ContinuousDarkroom(Environment):
    """Darkroom with feature-vector states and a smooth reward (see the module docstring)."""

    name = "darkroom_continuous"
    labels = ("optimal", "weak-last", "mix")
    regret_readings = darkroom.READINGS
    defaults = darkroom.Darkroom.defaults
    """Darkroom's: states embed grid cells isometrically, so the raw-state RBF's tau = 0.7 means
    the same neighbourhood here."""

    @dataclass(frozen=True)
    class Params:
        """Continuous-Darkroom fields of the ``env`` config section."""

        state_dim: int = 10
        """d, the length of a state vector (>= 2)."""
        grid_size: int = 10
        """Side of the underlying grid (in [2, 255])."""
        reward_width: float = 1.5
        """Width of the reward bump around the goal, in cells (> 0)."""
        embed_seed: int = 0
        """Seed of the fixed cell -> state embedding."""
        train_goal_fraction: float = 0.8
        """Fraction of goal cells not held out for the test (eval) tasks, in (0, 1)."""
        val_goal_fraction: float = 0.1
        """Fraction of all goal cells for the validation tasks (as ``darkroom``'s)."""
        goal_split_seed: int = 0
        """Seed of the fixed train/test goal split."""
        reading: str = "walker"
        """Regret reported as the main table: walker or state (see the module docstring)."""

        def validate(self) -> None:
            checks = [(self.state_dim >= 2, "state_dim", "an integer >= 2"),
                      (2 <= self.grid_size <= 255, "grid_size", "an integer in [2, 255]"),
                      (self.reward_width > 0, "reward_width", "a float > 0"),
                      (self.embed_seed >= 0, "embed_seed", ">= 0"),
                      (0 < self.train_goal_fraction < 1, "train_goal_fraction",
                       "a float in (0, 1)"),
                      (0 <= self.val_goal_fraction < self.train_goal_fraction,
                       "val_goal_fraction", "in [0, train_goal_fraction)"),
                      (self.goal_split_seed >= 0, "goal_split_seed", ">= 0"),
                      (self.reading in darkroom.READINGS, "reading",
                       f"one of {', '.join(darkroom.READINGS)}")]
            for ok, name, allowed in checks:
                if not ok:
                    raise ValueError(f"env.{name}={getattr(self, name)!r} is invalid: {allowed}")

    @property
    def num_actions(self) -> int:
        return darkroom.NUM_ACTIONS

    @property
    def num_states(self) -> int:
        """The cells of the grid underneath (each has one feature vector)."""
        return int(self.params.grid_size) ** 2

    @property
    def state_dim(self) -> int:
        return int(self.params.state_dim)

    @property
    def state_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """Per coordinate, its range over the grid: states are linear in the cell, so over
        the four corners."""
        weight, offset = embedding(self.state_dim, self.params.embed_seed)
        g = self.params.grid_size - 1
        corners = np.array([[0, 0], [0, g], [g, 0], [g, g]], dtype=np.float64) @ weight.T \
            + offset
        return corners.min(0), corners.max(0)

    def _tasks(self, grid: darkroom.DarkroomTasks) -> ContinuousTasks:
        weight, offset = embedding(self.state_dim, self.params.embed_seed)
        return ContinuousTasks(grid, weight, offset, float(self.params.reward_width))

    def columns(self) -> tuple[Column, ...]:
        h, d = self.horizon, self.state_dim
        u8, f32 = np.dtype(np.uint8), np.dtype(np.float32)
        return (
            Column("task_id", np.dtype(np.int64), ()),
            Column("goal", u8, (2,)),
            Column("cells", u8, (h + 1, 2)),
            Column("states", f32, (h + 1, d)),
            Column("actions", u8, (h,)),
            Column("rewards", f32, (h,)),
            Column("query_state", f32, (d,)),
            Column("optimal_action", u8, ()),
            Column("label", u8, ()),
        )

    def generate(self, data: Any, split: str, streams: TaskStreams) -> dict[str, np.ndarray]:
        p = self.params
        goals = darkroom.split_goals(p.grid_size, p.train_goal_fraction, p.val_goal_fraction,
                                     p.goal_split_seed)[split]
        grid = darkroom.sample_tasks(streams, goals, p.grid_size)
        tasks = self._tasks(grid)
        actions = streams.integers("behaviour/actions", darkroom.NUM_ACTIONS, (self.horizon,))
        cells, _ = darkroom.rollout_states(grid, grid.starts, actions)  # (B, H+1, 2)
        rewards = tasks.reward(grid, cells[:, 1:])  # (B, H)
        query = np.stack([streams.integers("query/x", p.grid_size),
                          streams.integers("query/y", p.grid_size)], axis=1)
        optimal = optimal_action(grid, query)
        labels = make_labels(data.label, streams, optimal, actions, darkroom.NUM_ACTIONS)
        return {"goal": grid.goals, "cells": cells, "states": tasks.embed(cells),
                "actions": actions, "rewards": rewards, "query_state": tasks.embed(query),
                "optimal_action": optimal, "label": labels}

    def encode(self, batch: Mapping[str, Any]) -> Encoded:
        states = batch["states"]  # (B, T+1, d)
        probs = np.full((states.shape[0], darkroom.NUM_ACTIONS), 1.0 / darkroom.NUM_ACTIONS,
                        dtype=np.float32)
        return Encoded(batch["query_state"], states[:, :-1], states[:, 1:], probs)

    def eval_tasks(self, data: Mapping[str, np.ndarray]) -> ContinuousTasks:
        cells = np.asarray(data["cells"], dtype=np.int64)
        return self._tasks(darkroom.DarkroomTasks(np.asarray(data["goal"], dtype=np.int64),
                                                  cells[:, 0], self.params.grid_size))

    def reset(self, tasks: ContinuousTasks) -> np.ndarray:
        return tasks.embed(tasks.grid.starts)

    def step(self, tasks: ContinuousTasks, states: np.ndarray, actions: np.ndarray,
             noise: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        cells = darkroom.move(tasks.cells(states), actions, tasks.grid.size)
        return tasks.embed(cells), tasks.reward(tasks.grid, cells[:, None])[:, 0]

    def optimal_action(self, tasks: ContinuousTasks, states: np.ndarray) -> np.ndarray:
        return optimal_action(tasks.grid, tasks.cells(states))

    def regret(self, tasks: ContinuousTasks, states: np.ndarray, actions: np.ndarray,
               rewards: np.ndarray, horizon: int, reading: str | None = None) -> np.ndarray:
        return darkroom.grid_regret(tasks.grid, tasks.cells(states), rewards, horizon,
                                    reading or self.reading(), tasks.reward, optimal_action)

    def goal_family(self) -> dict[str, Any]:
        """As :meth:`spice_ray.envs.darkroom.Darkroom.goal_family`: goals uniform over the
        grid, the smooth reward exp(-||s - g||^2 / (2 width^2)) of arriving in cell s."""
        size = self.params.grid_size
        cells = darkroom.all_cells(size)  # (S, 2), x-major
        d2 = ((cells[:, None, :] - cells[None, :, :]) ** 2).sum(-1)  # (G, S)
        return {"size": size, "goal_prior": np.full(size * size, 1.0 / size**2),
                "arrival_rewards": np.exp(-d2 / (2.0 * float(self.params.reward_width) ** 2))}

    def positions(self, states: np.ndarray) -> np.ndarray:
        weight, offset = embedding(self.state_dim, self.params.embed_seed)
        return np.rint((np.asarray(states, dtype=np.float64) - offset) @ weight).astype(
            np.int64)
