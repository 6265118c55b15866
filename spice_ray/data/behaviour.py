"""Behaviour policies, label rules and whole-task generation: pure numpy, no Ray, no I/O.

Every draw comes from :class:`spice_ray.rng.TaskStreams` keyed by (seed, split, task_id), so a
task's content does not depend on how tasks are batched.
"""

from __future__ import annotations

import numpy as np

from spice_ray.config import DataConfig, EnvConfig, parse_label
from spice_ray.envs import bandit, darkroom
from spice_ray.rng import TaskStreams


def dirichlet_mixture(streams: TaskStreams, num_arms: int, omega: float
                      ) -> tuple[np.ndarray, np.ndarray]:
    """Per-task behaviour distribution p = (1 - omega) Dir(1) + omega delta_{i*}.

    Returns:
        (probs float64 [B, A] summing to 1, favoured arm i* int64 [B] uniform over arms).
    """
    g = streams.exponential("behaviour/dirichlet", (num_arms,))  # Dir(1) = normalised Exp(1)
    dirichlet = g / g.sum(axis=1, keepdims=True)
    favoured = streams.integers("behaviour/favoured", num_arms)
    probs = (1.0 - omega) * dirichlet
    probs[np.arange(len(streams)), favoured] += omega
    return probs, favoured


def make_labels(
    label: str,
    streams: TaskStreams,
    optimal: np.ndarray,
    actions: np.ndarray,
    favoured: np.ndarray | None = None,
    behaviour_probs: np.ndarray | None = None,
    num_actions: int | None = None,
) -> np.ndarray:
    """Apply a label rule.

    Args:
        label: optimal | weak | weakmix80 | mix:q | weak-last.
        optimal: int [B] optimal action at the query.
        actions: int [B, H] context actions.
        favoured: int [B] bandit favoured arm i* (needed by ``weak``).
        behaviour_probs: [B, A] behaviour distribution; ``mix`` draws its non-optimal labels
            from it (bandits). Without it they are uniform over ``num_actions`` (darkroom).

    Returns:
        int64 [B] labels.
    """
    kind, q = parse_label(label)
    if kind == "optimal":
        return optimal.astype(np.int64)
    if kind == "weak-last":
        return actions[:, -1].astype(np.int64)
    if kind == "weak":
        if favoured is None:
            raise ValueError("label 'weak' needs the bandit favoured arm")
        return favoured.astype(np.int64)
    # mix:q -- the optimal action with probability q, else a behaviour draw.
    if behaviour_probs is not None:
        other = streams.categorical("label/other", behaviour_probs, 1)[:, 0]
    else:
        if num_actions is None:
            raise ValueError("label 'mix' needs behaviour_probs or num_actions")
        other = streams.integers("label/other", num_actions)
    use_opt = streams.uniform("label/coin") < q
    return np.where(use_opt, optimal, other).astype(np.int64)


def generate_bandit(env: EnvConfig, data: DataConfig, streams: TaskStreams
                    ) -> dict[str, np.ndarray]:
    """Bandit tasks with behaviour contexts and labels, columns as in ``schema``."""
    a, h = env.num_arms, env.horizon
    tasks = bandit.sample_tasks(streams, a, env.sigma)
    probs, favoured = dirichlet_mixture(streams, a, data.behaviour_omega)
    actions = streams.categorical("behaviour/actions", probs, h)  # (B, H)
    noise = streams.normal("context/noise", (h,))
    rewards = bandit.expected_reward(tasks, actions) + env.sigma * noise
    optimal = bandit.optimal_action(tasks)
    labels = make_labels(data.label, streams, optimal, actions, favoured, probs)
    return {
        "means": tasks.means,
        "behaviour_probs": probs,
        "favoured_arm": favoured,
        "actions": actions,
        "rewards": rewards,
        "optimal_action": optimal,
        "label": labels,
    }


def generate_darkroom(env: EnvConfig, data: DataConfig, split: str, streams: TaskStreams
                      ) -> dict[str, np.ndarray]:
    """Darkroom uniform-random roll-ins; train/validation use train goals, eval held-out goals."""
    train_goals, test_goals = darkroom.goal_split(env.grid_size, env.train_goal_fraction,
                                                  env.goal_split_seed)
    pool = test_goals if split == "eval" else train_goals
    tasks = darkroom.sample_tasks(streams, pool, env.grid_size)
    actions = streams.integers("behaviour/actions", darkroom.NUM_ACTIONS, (env.horizon,))
    states, rewards = darkroom.rollout_states(tasks, tasks.starts, actions)
    query = np.stack([streams.integers("query/x", env.grid_size),
                      streams.integers("query/y", env.grid_size)], axis=1)
    optimal = darkroom.optimal_action(tasks, query)
    labels = make_labels(data.label, streams, optimal, actions,
                         num_actions=darkroom.NUM_ACTIONS)
    return {
        "goal": tasks.goals,
        "states": states,
        "actions": actions,
        "rewards": rewards,
        "query_state": query,
        "optimal_action": optimal,
        "label": labels,
    }


def generate_tasks(env: EnvConfig, data: DataConfig, split: str, task_ids: np.ndarray
                   ) -> dict[str, np.ndarray]:
    """All columns for ``task_ids`` of ``split``: a pure function of (config, split, ids)."""
    ids = np.asarray(task_ids, dtype=np.int64)
    streams = TaskStreams.from_seed(data.seed, split, ids)
    if env.name == "bandit":
        cols = generate_bandit(env, data, streams)
    else:
        cols = generate_darkroom(env, data, split, streams)
    cols["task_id"] = ids
    return cols
