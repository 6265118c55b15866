"""References that know the task family but no posterior: LinUCB over the linear bandit's arm
features, a nearest-unvisited-cell searcher for grids, and a hill climber for smooth rewards.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from spice_ray.agents.base import Method, Tunable, register_method, to_numpy
from spice_ray.config.grids import GRIDS
from spice_ray.envs.darkroom import all_cells
from spice_ray.fusion import RandomSource, argmax_ties, tie_draws

STAY = 4
"""The grid's "stay" action (moves +x, -x, +y, -y, stay)."""


class LinUCB:
    """LinUCB over fixed arm features: ridge estimate theta = V^-1 sum_a S_a phi_a with
    V = ridge I + sum_a n_a phi_a phi_a^T; score phi_a . theta + c sqrt(phi_a^T V^-1 phi_a).

    Args:
        features: phi [A, d].
        c: width scale (>= 0). ridge: the regulariser (> 0).
    """

    name = "linucb"

    def __init__(self, features: np.ndarray, c: float = 1.0, ridge: float = 1.0) -> None:
        if c < 0 or ridge <= 0:
            raise ValueError(f"LinUCB c={c!r} must be >= 0 and ridge={ridge!r} > 0")
        self.features, self.c, self.ridge = np.asarray(features, np.float64), c, ridge

    def reset(self, num_tasks: int, num_actions: int, draws: RandomSource | None = None
              ) -> None:
        self.counts = np.zeros((num_tasks, num_actions))
        self.sums = np.zeros((num_tasks, num_actions))
        self._draws = draws

    def observe(self, actions: Tensor, rewards: Tensor, states: Tensor | None = None,
                next_states: Tensor | None = None) -> None:
        a, rows = to_numpy(actions), np.arange(len(actions))
        self.counts[rows, a] += 1.0
        self.sums[rows, a] += to_numpy(rewards)

    def act(self, t: int, states: Tensor | None = None) -> Tensor:
        phi = self.features  # (A, d)
        gram = self.ridge * np.eye(phi.shape[1]) + np.einsum("ba,ai,aj->bij", self.counts,
                                                             phi, phi)  # (B, d, d)
        inv = np.linalg.inv(gram)
        theta = np.einsum("bij,bj->bi", inv, self.sums @ phi)  # (B, d)
        width = np.sqrt(np.maximum(np.einsum("ai,bij,aj->ba", phi, inv, phi), 0.0))
        scores = torch.from_numpy(theta @ phi.T + self.c * width)  # (B, A)
        return argmax_ties(scores, tie_draws(self._draws, scores))


class NearestUnvisited:
    """Walks to the nearest cell it has not visited (random among equally near ones), and to
    the goal, then stays, once a reward has shown where it is: a goal-blind searcher.

    Args:
        size: grid side; states are cells (x, y).
    """

    name = "nearest"

    def __init__(self, size: int) -> None:
        self.size = int(size)
        self.cells = all_cells(self.size)  # (G, 2), x-major

    def reset(self, num_tasks: int, num_actions: int, draws: RandomSource | None = None
              ) -> None:
        if not hasattr(draws, "categorical"):
            raise ValueError("the nearest-unvisited searcher needs per-task StepDraws")
        self.visited = np.zeros((num_tasks, len(self.cells)), dtype=bool)
        self.goal = np.full(num_tasks, -1, dtype=np.int64)
        self._draws = draws

    def _index(self, cells: np.ndarray) -> np.ndarray:
        cells = np.asarray(cells, dtype=np.int64)
        return cells[:, 0] * self.size + cells[:, 1]

    def observe(self, actions: Tensor, rewards: Tensor, states: Tensor, next_states: Tensor
                ) -> None:
        rows, nxt = np.arange(len(actions)), self._index(to_numpy(next_states))
        self.visited[rows, self._index(to_numpy(states))] = True
        self.visited[rows, nxt] = True
        found = to_numpy(rewards) > 0
        self.goal[found] = nxt[found]

    def act(self, t: int, states: Tensor) -> Tensor:
        s = to_numpy(states).astype(np.int64)  # (B, 2)
        rows = np.arange(len(s))
        self.visited[rows, self._index(s)] = True
        dist = np.abs(self.cells[None] - s[:, None]).sum(-1).astype(np.float64)  # (B, G)
        dist[self.visited] = np.inf
        dist[self.visited.all(axis=1)] = 0.0  # everything seen: wander
        ties = dist == dist.min(axis=1, keepdims=True)
        target = self.cells[self._draws.categorical(ties / ties.sum(axis=1, keepdims=True))]
        known = self.goal >= 0
        target[known] = self.cells[self.goal[known]]
        d = target - s
        action = np.select([d[:, 0] > 0, d[:, 0] < 0, d[:, 1] > 0, d[:, 1] < 0], [0, 1, 2, 3],
                           default=STAY)
        return torch.from_numpy(action.astype(np.int64))


REVERSE = np.array([1, 0, 3, 2, STAY])
"""The move that undoes each move of a grid (+x <-> -x, +y <-> -y; stay stays)."""


class HillClimb:
    """Climbs the reward without knowing the goal: keeps moving while a move raised the
    reward, steps back after one that lowered it, and from the best state so far tries the
    moves it has not tried there (random among them), staying once every move from it lowered
    the reward (a peak). For a smooth single-peaked reward (the continuous Darkroom) this is
    the obvious goal-blind reference; states are compared by value, so it works on any
    encoding of the cells (grid coordinates or feature vectors).
    """

    name = "hill-climb"

    def reset(self, num_tasks: int, num_actions: int, draws: RandomSource | None = None
              ) -> None:
        if not hasattr(draws, "categorical"):
            raise ValueError("the hill-climbing reference needs per-task StepDraws")
        self._draws = draws
        self.reward = np.full(num_tasks, -np.inf)  # of arriving where the agent is
        self.best = np.full(num_tasks, -np.inf)
        self.last = np.full(num_tasks, STAY, dtype=np.int64)
        self.climbing = np.zeros(num_tasks, dtype=bool)  # the last move raised the reward
        self.tried: list[dict[bytes, set[int]]] = [{} for _ in range(num_tasks)]

    def observe(self, actions: Tensor, rewards: Tensor, states: Tensor, next_states: Tensor
                ) -> None:
        a, r = to_numpy(actions).astype(np.int64), to_numpy(rewards).astype(np.float64)
        s, s2 = to_numpy(states), to_numpy(next_states)
        returned = a == REVERSE[self.last]
        for b in range(len(a)):
            moved = not np.array_equal(s[b], s2[b])
            if a[b] != STAY and (not moved or r[b] <= self.reward[b]):
                self.tried[b].setdefault(s[b].tobytes(), set()).add(int(a[b]))
            # a step back to a better state is not a climb to continue
            self.climbing[b] = moved and r[b] > self.reward[b] and not (
                returned[b] and r[b] <= self.best[b])
        self.reward = r
        self.best = np.maximum(self.best, r)
        self.last = a

    def act(self, t: int, states: Tensor) -> Tensor:
        s = to_numpy(states)
        action = np.full(len(s), STAY, dtype=np.int64)
        untried = np.ones((len(s), STAY), dtype=bool)
        for b in range(len(s)):
            for move in self.tried[b].get(s[b].tobytes(), ()):
                untried[b, move] = False
        probs = untried / np.maximum(untried.sum(1, keepdims=True), 1)
        probs[~untried.any(1)] = 1.0 / STAY  # a peak: the draw is not used
        pick = self._draws.categorical(probs)
        for b in range(len(s)):
            if self.climbing[b] and untried[b, self.last[b]]:
                action[b] = self.last[b]
            elif self.reward[b] < self.best[b] and self.last[b] != STAY:
                action[b] = REVERSE[self.last[b]]  # back to the better state
            elif untried[b].any():
                action[b] = pick[b]
        return torch.from_numpy(action)


register_method("linucb", Method("LinUCB", lambda spec, env, b: LinUCB(env.arm_features(),
                                                                       b.eval_cfg.ucb_c),
                                 requires="arm_features",
                                 constants=lambda cfg: {"c": cfg.ucb_c},
                                 tunables=(Tunable.of(GRIDS["ucb_c"], "c"),)))
"""Ridge-regression UCB (c = ``eval.ucb_c``, ridge 1) over the linear bandit's arm features."""
register_method("nearest", Method("Nearest-unvisited",
                                  lambda spec, env, b: NearestUnvisited(env.grid),
                                  requires="grid"))
"""Walks to the nearest unvisited cell of a grid (to the goal once found)."""
register_method("hill-climb", Method("Hill-climbing", lambda spec, env, b: HillClimb()))
"""Climbs a smooth reward without knowing the goal (the continuous Darkroom's goal-blind
reference)."""
