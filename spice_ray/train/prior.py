"""The shrinkage prior of the TD(n) targets from the training data itself
(``train.shrink_prior=data``): their mean and variance instead of fixed values."""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import numpy as np
import torch

from spice_ray.config import ExperimentConfig
from spice_ray.data import store


def data_shrink_prior(cfg: ExperimentConfig, dataset_dir: str | Path) -> tuple[float, float]:
    """Mean and variance of the train split's TD(n) reward targets (no bootstrap term):
    sum_{i<n, t+i<=T} gamma^i r_{t+i}, over every transition whose n rewards are in context.
    Computed once per (split content, n, gamma) in a process.

    Where the dataset stores the tasks' true action values (bandits: the arm means) and the
    targets are the rewards themselves (n = 1, gamma = 0), the pooled moments of those values:
    the reward targets' variance would add the reward noise sigma^2 to the prior's."""
    content = store.split_id(dataset_dir, "train")
    if cfg.train.td_n == 1 and cfg.train.gamma == 0:
        values = _value_stats(str(dataset_dir), content, cfg.env)
        if values is not None:
            return values
    return _target_stats(str(dataset_dir), content, cfg.train.td_n, cfg.train.gamma)


@functools.lru_cache(maxsize=16)
def _value_stats(dataset_dir: str, content: str, env_cfg: object, batch_size: int = 4096
                 ) -> tuple[float, float] | None:
    env = env_cfg.environment()
    total, total_sq, count = 0.0, 0.0, 0
    for batch in store.iter_batches(dataset_dir, "train", batch_size):
        values = env.value_samples(batch)
        if values is None:
            return None
        total += float(values.sum())
        total_sq += float((values * values).sum())
        count += values.size
    mean = total / max(count, 1)
    return mean, max(total_sq / max(count, 1) - mean * mean, 1e-6)


@functools.lru_cache(maxsize=16)
def _target_stats(dataset_dir: str, content: str, n: int, gamma: float,
                  batch_size: int = 4096) -> tuple[float, float]:
    from spice_ray.fusion import nstep_targets

    total, total_sq, count = 0.0, 0.0, 0
    for batch in store.iter_batches(dataset_dir, "train", batch_size):
        r = torch.as_tensor(np.asarray(batch["rewards"], dtype=np.float64))  # (B, T)
        y = nstep_targets(r, torch.zeros_like(r), n, gamma)[:, : max(1, r.shape[1] - n + 1)]
        total += float(y.sum())
        total_sq += float((y * y).sum())
        count += y.numel()
    mean = total / max(count, 1)
    return mean, max(total_sq / max(count, 1) - mean * mean, 1e-6)


def arm_moment_sums(actions: np.ndarray, rewards: np.ndarray, num_actions: int) -> np.ndarray:
    """Per arm, the sums :func:`arm_prior_from_sums` needs from a batch of bandit contexts
    (actions and rewards [B, T]): [A, 6] of (tasks that pulled it, sum and sum of squares of
    their mean rewards, sum of 1 / pulls, the within-task sum of squares, its degrees of
    freedom). Sums over batches add."""
    actions = np.asarray(actions, dtype=np.int64)
    rewards = np.asarray(rewards, dtype=np.float64)
    onehot = actions[..., None] == np.arange(num_actions)  # (B, T, A)
    n = onehot.sum(1)  # (B, A) pulls
    total = (onehot * rewards[..., None]).sum(1)
    squares = (onehot * (rewards * rewards)[..., None]).sum(1)
    seen = n > 0
    mean = np.where(seen, total / np.maximum(n, 1), 0.0)
    within = np.where(seen, squares - n * mean * mean, 0.0)
    return np.stack([seen.sum(0), (mean * seen).sum(0), (mean * mean * seen).sum(0),
                     np.where(seen, 1.0 / np.maximum(n, 1), 0.0).sum(0), within.sum(0),
                     np.maximum(n - 1, 0).sum(0)], axis=1).astype(np.float64)


def arm_prior_from_sums(sums: np.ndarray, floor: float = 1e-6
                        ) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """A per-arm Normal prior estimated from the rewards of training tasks (empirical Bayes,
    by moments): arm a's mean is the average over tasks of its mean reward; its variance the
    spread of those task means less what the reward noise adds to it (the pooled within-task
    variance over the pulls: sigma^2 E[1 / n]), at least ``floor``. What SPICE could know of a
    family's arms from its own training data, without reading a context."""
    tasks, s1, s2, inv_n, within, dof = sums.T
    if (tasks < 2).any():
        raise ValueError(f"arms {np.flatnonzero(tasks < 2).tolist()} are pulled in fewer than "
                         "2 training tasks: no prior can be estimated for them")
    mean = s1 / tasks
    spread = s2 / tasks - mean * mean
    noise = within / np.maximum(dof, 1)
    var = np.maximum(spread - noise * inv_n / tasks, floor)
    return tuple(float(m) for m in mean), tuple(float(v) for v in var)


def data_arm_prior(cfg: ExperimentConfig, dataset_dir: str | Path
                   ) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """:func:`arm_prior_from_sums` over the train split of a bandit dataset (computed once per
    split content in a process)."""
    return _arm_prior(str(dataset_dir), store.split_id(dataset_dir, "train"),
                      cfg.env.num_actions)


@functools.lru_cache(maxsize=16)
def _arm_prior(dataset_dir: str, content: str, num_actions: int, batch_size: int = 4096
               ) -> tuple[tuple[float, ...], tuple[float, ...]]:
    sums = np.zeros((num_actions, 6))
    for batch in store.iter_batches(dataset_dir, "train", batch_size):
        sums += arm_moment_sums(batch["actions"], batch["rewards"], num_actions)
    return arm_prior_from_sums(sums)


def resolve_config(cfg: ExperimentConfig, dataset_dir: str | Path) -> ExperimentConfig:
    """``cfg`` with what depends on the data filled in: ``train.shrink_prior="data"`` sets
    ``shrink_prior_mean`` / ``shrink_prior_var`` from :func:`data_shrink_prior`."""
    if cfg.train.shrink_prior != "data":
        return cfg
    mean, var = data_shrink_prior(cfg, dataset_dir)
    return cfg.replace(train=dataclasses.replace(cfg.train, shrink_prior_mean=round(mean, 6),
                                                 shrink_prior_var=round(var, 6)))
