"""Darkroom gridworld (the DPT benchmark), batched and pure (numpy, no per-task loop).

A size x size grid (default 10x10), state (x, y) integers, 5 actions (+x, -x, +y, -y, stay),
moves clipped at the walls, reward 1 when the state *after* the step is the goal, else 0. The
goal cells are split 80/20 into train/test with a fixed seed; a test task is a held-out goal
plus a start state. Pretraining contexts are uniform-random roll-ins of length H from a random
start (so pi_b = 1/5 for every action and SPICE's importance weight is identically 1), or, with
``env.rollin=uniform`` (the DPT paper's), H transitions from independently drawn cells; the
query state is uniform over the grid and independent of the context.

Regret, two readings (``env.reading``):

* ``walker`` (default): r*_t - r_t, r*_t the reward an optimal policy collects at step t from
  the same start (it walks the Manhattan path, then stays). An agent that does not know the
  goal cannot go much below ~36 over H = 100 (walk to the nearest unvisited cell, then stay).
* ``state`` (the paper's text: "the reward of the chosen action compared to the reward of the
  environment's optimal action at the same state"): max_a r(s_t, a) - r(s_t, a_t), non-zero
  only next to or on the goal.

The walker/state helpers here take the reward as a function of the next cell, so the
continuous Darkroom (``darkroom_continuous``) reuses them with its smooth reward.

Defaults chosen from measurements (``defaults``; the paper's readings stay available): the
kernel compares raw states (``fusion.kernel_space=state``, RBF tau = 0.7). The paper's reading,
the trunk's output for the query token alone (``kernel_space=latent``), gets no state-dependent
training signal (the query state is independent of every target) and collapses: grid
neighbours end up ~0.03-0.18 apart, every cell pools the evidence of most others, and regret
equals a uniform kernel's. The shrinkage prior of training comes from the data's own targets
(``train.shrink_prior=data``: mean ~0.04, variance ~0.07) instead of the bandit's 0.5 and 1/12.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from spice_ray.common.rng import TaskStreams
from spice_ray.envs.base import Column, Encoded, Environment, register
from spice_ray.envs.labels import make_labels

NUM_ACTIONS = 5
STATE_DIM = 2
# (dx, dy) per action: +x, -x, +y, -y, stay.
MOVES = np.array([[1, 0], [-1, 0], [0, 1], [0, -1], [0, 0]], dtype=np.int64)
ACTION_NAMES = ("+x", "-x", "+y", "-y", "stay")
READINGS = ("walker", "state")
ROLLINS = ("walk", "uniform")


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


def hold_out(pool: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
    """(the rest, the last ``count`` cells) of a permuted goal pool; ``count`` 0: (pool, pool),
    i.e. validation tasks share the training goals (the paper's reading)."""
    if count == 0:
        return pool, pool
    if not 0 < count < len(pool):
        raise ValueError(f"holding out {count} validation goals of {len(pool)} leaves none "
                         "to train on")
    return pool[:-count], pool[-count:]


def split_goals(size: int, train_fraction: float, val_fraction: float, seed: int
                ) -> dict[str, np.ndarray]:
    """Goal cells of each split: the test goals are the ``1 - train_fraction`` share of
    :func:`goal_split`; of the rest, ``val_fraction`` of all cells are validation goals (so
    the test goals do not depend on it), the others training goals."""
    if train_fraction == 1:  # no goal held out: every split draws from every cell
        cells = all_cells(size)
        return {"train": cells, "validation": cells, "eval": cells}
    train, test = goal_split(size, train_fraction, seed)
    train, val = hold_out(train, int(round(val_fraction * size * size)))
    return {"train": train, "validation": val, "eval": test}


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


def move(states: np.ndarray, actions: np.ndarray, size: int) -> np.ndarray:
    """The cells after one move per task (clipped at the walls), int64 [..., 2]."""
    return np.clip(np.asarray(states, dtype=np.int64) + MOVES[np.asarray(actions)], 0, size - 1)


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
    nxt = move(states, actions, tasks.size)
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


def optimal_actions(goals: np.ndarray, states: np.ndarray) -> np.ndarray:
    """Every shortest-path action at each state, bool [B, 5]: the moves that bring x or y
    closer to the goal, and "stay" alone on the goal itself."""
    d = np.asarray(goals, dtype=np.int64) - np.asarray(states, dtype=np.int64)  # (B, 2)
    on_goal = (d == 0).all(1)
    return np.stack([d[:, 0] > 0, d[:, 0] < 0, d[:, 1] > 0, d[:, 1] < 0, on_goal], axis=1)


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


RewardOfCell = Callable[[DarkroomTasks, np.ndarray], np.ndarray]
"""r(cell [..., 2]) for each task's goal (broadcast over leading dims): the reward of arriving."""


def goal_reward(tasks: DarkroomTasks, cells: np.ndarray) -> np.ndarray:
    """The gridworld's reward: 1 on the goal, else 0; cells [B, ..., 2] -> [B, ...]."""
    goals = tasks.goals.reshape((tasks.num_tasks,) + (1,) * (cells.ndim - 2) + (2,))
    return np.all(cells == goals, axis=-1).astype(np.float64)


def walker_rewards(tasks: DarkroomTasks, horizon: int, reward: RewardOfCell,
                   optimal: Callable[[DarkroomTasks, np.ndarray], np.ndarray]) -> np.ndarray:
    """Rewards [B, H] of ``optimal``'s actions from each start (the walker reading's r*_t)."""
    cells = tasks.starts.copy()
    out = np.empty((tasks.num_tasks, horizon), dtype=np.float64)
    for t in range(horizon):
        cells = move(cells, optimal(tasks, cells), tasks.size)
        out[:, t] = reward(tasks, cells[:, None])[:, 0]
    return out


def grid_regret(tasks: DarkroomTasks, cells: np.ndarray, rewards: np.ndarray, horizon: int,
                reading: str, reward: RewardOfCell,
                optimal: Callable[[DarkroomTasks, np.ndarray], np.ndarray]) -> np.ndarray:
    """Per-step regret [B, N] on a grid under either reading.

    Args:
        cells: int [B, N, 2] the cell each action was taken in.
        rewards: [B, N] rewards received.
        horizon: steps per episode; the walker's reward sequence restarts every episode.
        reading: "walker" or "state".
        reward: the reward of arriving in a cell.
        optimal: the optimal action in a cell.
    """
    rewards = np.asarray(rewards, dtype=np.float64)
    n = rewards.shape[1]
    if reading == "walker":
        best = walker_rewards(tasks, horizon, reward, optimal)  # (B, H)
        return np.tile(best, (1, -(-n // horizon)))[:, :n] - rewards
    if reading == "state":
        reachable = move(np.asarray(cells)[:, :, None, :], np.arange(NUM_ACTIONS)[None, None],
                         tasks.size)  # (B, N, A, 2)
        best = reward(tasks, reachable).max(axis=-1)  # (B, N)
        return best - rewards
    raise ValueError(f"regret reading {reading!r} is invalid: one of {', '.join(READINGS)}")


@register
class Darkroom(Environment):
    """The DPT Darkroom gridworld (paper sec. 6)."""

    name = "darkroom"
    labels = ("optimal", "weak-last", "mix")
    protocols = ("online", "episode")
    regret_readings = READINGS
    defaults = {
        "env": {"horizon": 100},
        "data": {"label": "weak-last", "num_eval_tasks": 100},
        "train": {"td_n": 5, "gamma": 0.95, "epochs": 50, "shrink_prior": "data"},
        "fusion": {"kernel": "rbf", "kernel_space": "state", "tau": 0.7, "target": "nstep",
                   "td_n": 5, "gamma": 0.95},
        "eval": {"num_tasks": 100, "online_horizon": 100, "dpt_sample": False},
    }

    @dataclass(frozen=True)
    class Params:
        """Darkroom fields of the ``env`` config section."""

        grid_size: int = 10
        """Side length (in [2, 255]); states are (x, y) in [0, grid_size)^2."""
        train_goal_fraction: float = 0.8
        """Fraction of goal cells not held out for the test (eval) tasks, in (0, 1]; 1 holds
        no goal out (then ``val_goal_fraction`` must be 0): the splits are different tasks
        on the same goals, so a split's statistics rest on every cell, not on the few held
        out."""
        val_goal_fraction: float = 0.1
        """Fraction of all goal cells taken from those for the validation tasks, disjoint from
        training and test goals (0: validation shares the training goals, the paper's
        reading); the default splits 100 cells 70 / 10 / 20."""
        goal_split_seed: int = 0
        """Seed of the fixed train/test goal split."""
        reading: str = "walker"
        """Regret reported as the main table: walker (an optimal walker from the same start)
        or state (max_a r(s_t, a) - r(s_t, a_t)); the other reading's table is made too."""
        rollin: str = "walk"
        """How a context's transitions are drawn: walk (one H-step uniform-random walk from
        the start; SPICE's reading, the default) or uniform (each transition from its own
        uniformly drawn cell with a uniform action, the DPT paper's roll-in: at H = 100 a
        context then holds a goal reward in ~64% of tasks, a walk in ~32%)."""

        def validate(self) -> None:
            if not 2 <= self.grid_size <= 255:
                raise ValueError(f"env.grid_size={self.grid_size!r} is invalid: an integer in "
                                 "[2, 255]")
            if not 0 < self.train_goal_fraction <= 1:
                raise ValueError(f"env.train_goal_fraction={self.train_goal_fraction!r} is "
                                 "invalid: a float in (0, 1]")
            if self.train_goal_fraction == 1 and self.val_goal_fraction != 0:
                raise ValueError(f"env.val_goal_fraction={self.val_goal_fraction!r} is invalid "
                                 "with env.train_goal_fraction=1 (no goal held out): 0")
            if not 0 <= self.val_goal_fraction < self.train_goal_fraction:
                raise ValueError(f"env.val_goal_fraction={self.val_goal_fraction!r} is invalid: "
                                 f"in [0, train_goal_fraction={self.train_goal_fraction})")
            if self.goal_split_seed < 0:
                raise ValueError(f"env.goal_split_seed={self.goal_split_seed!r} is invalid: "
                                 ">= 0")
            if self.rollin not in ROLLINS:
                raise ValueError(f"env.rollin={self.rollin!r} is invalid: one of "
                                 f"{', '.join(ROLLINS)}")
            if self.reading not in READINGS:
                raise ValueError(f"env.reading={self.reading!r} is invalid: one of "
                                 f"{', '.join(READINGS)}")

    @property
    def num_actions(self) -> int:
        return NUM_ACTIONS

    @property
    def num_states(self) -> int:
        """The grid's cells."""
        return self.grid * self.grid

    @property
    def grid(self) -> int:
        """The grid side: states are cells (x, y) (grid searchers need this)."""
        return int(self.params.grid_size)

    @property
    def state_dim(self) -> int:
        return STATE_DIM

    @property
    def state_bounds(self) -> tuple[float, float]:
        """Cells (x, y) in [0, grid - 1]."""
        return (0.0, float(self.grid - 1))

    def columns(self) -> tuple[Column, ...]:
        h, u8 = self.horizon, np.dtype(np.uint8)
        # a walk's next states are its states shifted by one; independent draws need both
        trajectory = ((Column("states", u8, (h + 1, 2)),) if self.params.rollin == "walk" else
                      (Column("states", u8, (h, 2)), Column("next_states", u8, (h, 2))))
        return (
            Column("task_id", np.dtype(np.int64), ()),
            Column("goal", u8, (2,)),
            *trajectory,
            Column("actions", u8, (h,)),
            Column("rewards", u8, (h,)),
            Column("query_state", u8, (2,)),
            Column("optimal_action", u8, ()),
            Column("label", u8, ()),
        )

    def goal_pool(self, split: str) -> np.ndarray:
        """The goals of ``split``: training, validation or held-out test goals."""
        p = self.params
        return split_goals(p.grid_size, p.train_goal_fraction, p.val_goal_fraction,
                           p.goal_split_seed)[split]

    def sample_tasks(self, streams: TaskStreams, split: str) -> DarkroomTasks:
        """Goals of ``split`` and uniform starts (the region family overrides the goals)."""
        return sample_tasks(streams, self.goal_pool(split), self.params.grid_size)

    def generate(self, data: Any, split: str, streams: TaskStreams) -> dict[str, np.ndarray]:
        size = self.params.grid_size
        tasks = self.sample_tasks(streams, split)
        actions = streams.integers("behaviour/actions", NUM_ACTIONS, (self.horizon,))
        trajectory: dict[str, np.ndarray]
        if self.params.rollin == "walk":
            states, rewards = rollout_states(tasks, tasks.starts, actions)
            trajectory = {"states": states}
        else:  # independent cells: the first one is the task's start
            cells = np.stack([streams.integers("rollin/x", size, (self.horizon,)),
                              streams.integers("rollin/y", size, (self.horizon,))], axis=-1)
            cells[:, 0] = tasks.starts
            after = move(cells, actions, size)
            rewards = goal_reward(tasks, after)
            trajectory = {"states": cells, "next_states": after}
        query = np.stack([streams.integers("query/x", size), streams.integers("query/y", size)],
                         axis=1)
        optimal = optimal_action(tasks, query)
        labels = make_labels(data.label, streams, optimal, actions, NUM_ACTIONS)
        return {"goal": tasks.goals, **trajectory, "actions": actions, "rewards": rewards,
                "query_state": query, "optimal_action": optimal, "label": labels}

    def encode(self, batch: Mapping[str, Any]) -> Encoded:
        states = batch["states"]  # walk: (B, T+1, 2) s_1..s_{T+1}; uniform: (B, T, 2)
        b = states.shape[0]
        probs = np.full((b, NUM_ACTIONS), 1.0 / NUM_ACTIONS, dtype=np.float32)
        if "next_states" in batch:
            return Encoded(batch["query_state"], states, batch["next_states"], probs)
        return Encoded(batch["query_state"], states[:, :-1], states[:, 1:], probs)

    def eval_tasks(self, data: Mapping[str, np.ndarray]) -> DarkroomTasks:
        return DarkroomTasks(np.asarray(data["goal"], dtype=np.int64),
                             np.asarray(data["states"][:, 0], dtype=np.int64),
                             self.params.grid_size)

    def reset(self, tasks: DarkroomTasks) -> np.ndarray:
        return reset(tasks)

    def step(self, tasks: DarkroomTasks, states: np.ndarray, actions: np.ndarray,
             noise: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return step(tasks, states, actions)

    def optimal_action(self, tasks: DarkroomTasks, states: np.ndarray) -> np.ndarray:
        return optimal_action(tasks, states)

    def regret(self, tasks: DarkroomTasks, states: np.ndarray, actions: np.ndarray,
               rewards: np.ndarray, horizon: int, reading: str | None = None) -> np.ndarray:
        return grid_regret(tasks, np.asarray(states, dtype=np.int64), rewards, horizon,
                           reading or self.reading(), goal_reward, optimal_action)

    def positions(self, states: np.ndarray) -> np.ndarray:
        return np.asarray(states, dtype=np.int64)

    def goal_prior(self) -> np.ndarray:
        """The goal distribution over every cell [size*size] (x-major) that a prior learned
        from this family could know: uniform (the held-out cells are not known to it)."""
        cells = self.params.grid_size ** 2
        return np.full(cells, 1.0 / cells)

    def goal_family(self) -> dict[str, Any]:
        """What the darkroom prior read-out needs (``spice_ray.evaluate.darkroom_prior``):
        ``size``, ``goal_prior`` [G] and ``arrival_rewards`` [G, S] (the reward of arriving in
        cell s when the goal is g: 1 on the goal, x-major cells)."""
        size = self.params.grid_size
        return {"size": size, "goal_prior": self.goal_prior(),
                "arrival_rewards": np.eye(size * size)}

    def landmarks(self, tasks: DarkroomTasks) -> dict[str, np.ndarray]:
        return {"start": np.asarray(tasks.starts, np.int64),
                "goal": np.asarray(tasks.goals, np.int64)}
