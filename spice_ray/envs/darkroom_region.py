"""Region Darkroom: goals cluster in one corner, so a prior learned from training goals tells
an agent where to search first, even for goals it never saw.

Darkroom 10x10, H = 100, as ``darkroom`` (moves, reward 1 on arriving at the goal, uniform
behaviour roll-ins, weak-last labels, both regret readings), but a task's goal lies with
probability 0.9 in the block x >= size - 4, y >= size - 4 (16 cells) and with probability 0.1
uniformly among the other cells. The goal split is stratified by region: each region's cells
are split ``train_goal_fraction`` / rest, so evaluation goals are never trained on but follow the
same distribution (about 13 train / 3 eval block cells and 67 / 17 outside at the defaults;
with so few held-out block cells an eval split's tasks sit on 2-3 of them).
``env.train_goal_fraction=1`` (with ``env.val_goal_fraction=0``) holds no goal out: the
splits are different tasks on every cell of the family's distribution, which measures reading
the context on this population with a split's tasks spread over all 16 block cells.

The exact posterior over the goal given the context (:class:`GoalPosterior`) uses the
family's own goal distribution over all cells (a learned prior cannot know which cells were
held out): a visited cell without reward is not the goal, a rewarded one is. The values that
follow from it are the optimal ones for each goal, Q*_g(s, a) = gamma^d(s', g) / (1 - gamma)
(d the Manhattan distance from the next cell s'), averaged over the posterior.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from spice_ray.common.rng import TaskStreams
from spice_ray.envs.base import register
from spice_ray.envs.darkroom import Darkroom, DarkroomTasks, all_cells, hold_out, move


def region_mask(size: int, block: int) -> np.ndarray:
    """bool [size*size]: the cells (x-major) of the block x >= size - block, y >= size - block."""
    cells = all_cells(size)
    return np.all(cells >= size - block, axis=1)


def stratified_split(size: int, block: int, train_fraction: float, seed: int,
                     val_fraction: float = 0.0) -> dict[str, dict[str, np.ndarray]]:
    """Per region ("block", "outside"): its goal cells [G, 2] of each split ("train",
    "validation", "eval"), the same proportions in each region."""
    cells, inside = all_cells(size), region_mask(size, block)
    rng = np.random.default_rng(np.random.SeedSequence([seed, size, block]))
    out = {}
    for region, mask in (("block", inside), ("outside", ~inside)):
        pool = cells[mask][rng.permutation(int(mask.sum()))]
        if train_fraction == 1:  # no goal held out: every split draws from every cell
            out[region] = {"train": cells[mask], "validation": cells[mask], "eval": cells[mask]}
            continue
        n_train = int(round(train_fraction * len(pool)))
        if not 0 < n_train < len(pool):
            raise ValueError(f"train_fraction={train_fraction} leaves an empty goal split in "
                             f"the {region} region")
        train, val = hold_out(pool[:n_train], int(round(val_fraction * len(pool))))
        out[region] = {"train": train, "validation": val, "eval": pool[n_train:]}
    return out


@register
class DarkroomRegion(Darkroom):
    """Darkroom with goals concentrated in one block (see the module docstring)."""

    name = "darkroom_region"

    @dataclass(frozen=True)
    class Params(Darkroom.Params):
        """Region Darkroom fields of the ``env`` config section."""

        block: int = 4
        """Side of the goal block in the corner x, y >= grid_size - block (in [1, grid_size))."""
        block_prob: float = 0.9
        """Probability that a task's goal lies in the block (in [0, 1])."""

        def validate(self) -> None:
            super().validate()
            if not 1 <= self.block < self.grid_size:
                raise ValueError(f"env.block={self.block!r} is invalid: an integer in [1, "
                                 f"grid_size={self.grid_size})")
            if not 0 <= self.block_prob <= 1:
                raise ValueError(f"env.block_prob={self.block_prob!r} is invalid: a float in "
                                 "[0, 1]")

    def goal_pools(self, split: str) -> tuple[np.ndarray, np.ndarray]:
        """(block goals, outside goals) of ``split``: training, validation or held-out."""
        p = self.params
        parts = stratified_split(p.grid_size, p.block, p.train_goal_fraction,
                                 p.goal_split_seed, p.val_goal_fraction)
        return parts["block"][split], parts["outside"][split]

    def goal_pool(self, split: str) -> np.ndarray:
        return np.concatenate(self.goal_pools(split))

    def sample_tasks(self, streams: TaskStreams, split: str) -> DarkroomTasks:
        size = self.params.grid_size
        block, outside = self.goal_pools(split)
        in_block = streams.uniform("region/in_block") < self.params.block_prob
        goals = np.where(in_block[:, None],
                         block[streams.integers("region/block_goal", len(block))],
                         outside[streams.integers("region/outside_goal", len(outside))])
        starts = np.stack([streams.integers("darkroom/start_x", size),
                           streams.integers("darkroom/start_y", size)], axis=1)
        return DarkroomTasks(goals, starts, size)

    def goal_prior(self) -> np.ndarray:
        """The family's goal distribution over every cell [size*size] (x-major)."""
        inside = region_mask(self.params.grid_size, self.params.block)
        p = self.params.block_prob
        return np.where(inside, p / inside.sum(), (1.0 - p) / (~inside).sum())

    def task_posterior(self, gamma: float = 0.95) -> GoalPosterior:
        """The exact posterior over goals of B rollouts (``envs.bayes``)."""
        return GoalPosterior(self.params.grid_size, self.goal_prior(), gamma)


class GoalPosterior:
    """The posterior over the goal cell of B Darkroom rollouts and the values it implies.

    Args:
        size: grid side.
        prior: goal prior over cells [size*size] (x-major).
        gamma: discount of the values Q*_g(s, a) = gamma^d(s', g) / (1 - gamma) (< 1).
    """

    def __init__(self, size: int, prior: np.ndarray, gamma: float) -> None:
        if not 0 <= gamma < 1:
            raise ValueError(f"gamma={gamma!r} is invalid: in [0, 1)")
        self.size, self.prior, self.gamma = int(size), np.asarray(prior, np.float64), gamma
        self.cells = all_cells(self.size)  # (G, 2)
        # Q*_g(s, a) of every cell s (x-major, as _index numbers them), built once: a step
        # gathers its rows instead of recomputing B x A x G distances and powers
        nxt = move(self.cells[:, None, :], np.arange(5)[None, :], self.size)  # (G, A, 2)
        dist = np.abs(nxt[:, :, None, :] - self.cells[None, None]).sum(-1)  # (G, A, G)
        self._table = self.gamma**dist / (1.0 - self.gamma)
        self.reset(0)

    def reset(self, num_tasks: int) -> None:
        self.weights = np.tile(self.prior, (num_tasks, 1))  # (B, G)
        self._next: list[np.ndarray] = []

    def _index(self, cells: np.ndarray) -> np.ndarray:
        cells = np.asarray(cells, dtype=np.int64)
        return cells[..., 0] * self.size + cells[..., 1]

    def observe(self, actions: np.ndarray, rewards: np.ndarray, states: np.ndarray,
                next_states: np.ndarray) -> None:
        rows, cell = np.arange(len(actions)), self._index(next_states)
        found = np.asarray(rewards) > 0
        hit = np.zeros_like(self.weights)
        hit[rows, cell] = 1.0
        # a rewarded arrival pins the goal; an unrewarded one rules its cell out
        self.weights = np.where(found[:, None], self.weights * hit, self.weights * (1.0 - hit))
        self.weights /= np.maximum(self.weights.sum(axis=1, keepdims=True), 1e-300)
        self._next.append(self.moments(next_states)[0].max(axis=1))

    def _values(self, states: np.ndarray) -> np.ndarray:
        """Q*_g(s, a) [B, A, G] at states [B, 2] for every goal."""
        return self._table[self._index(states)]

    def moments(self, states: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        q = self._values(states)
        w = self.weights[:, None, :]
        mean = (w * q).sum(-1)
        return mean, np.maximum((w * q * q).sum(-1) - mean**2, 0.0)

    def sample(self, states: np.ndarray, draws: Any) -> np.ndarray:
        goal = draws.categorical(self.weights)  # (B,)
        q = self._values(states)
        return q[np.arange(len(goal)), :, goal]

    def next_values(self) -> np.ndarray:
        return np.stack(self._next, axis=1) if self._next else np.zeros((len(self.weights), 0))
