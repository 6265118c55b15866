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


def resolve_config(cfg: ExperimentConfig, dataset_dir: str | Path) -> ExperimentConfig:
    """``cfg`` with what depends on the data filled in: ``train.shrink_prior="data"`` sets
    ``shrink_prior_mean`` / ``shrink_prior_var`` from :func:`data_shrink_prior`."""
    if cfg.train.shrink_prior != "data":
        return cfg
    mean, var = data_shrink_prior(cfg, dataset_dir)
    return cfg.replace(train=dataclasses.replace(cfg.train, shrink_prior_mean=round(mean, 6),
                                                 shrink_prior_var=round(var, 6)))
