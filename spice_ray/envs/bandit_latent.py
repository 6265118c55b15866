"""Latent-phase bandit: one hidden angle sets every arm, so one arm's rewards tell about all
the others, and only a prior conditioned on the context can use that.

mu_a = 0.5 + 0.4 cos(theta - 2 pi a / A), theta ~ U[0, 2 pi) per task; every arm has the same
marginal distribution, so before any pull no arm is preferred. Rewards, behaviour policy and
labels are the ``bandit``'s (sigma = 0.3, H = 500, weak labels).

The exact posterior over theta is computed on a grid of 1024 angles (its prior is uniform).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from spice_ray.common.rng import TaskStreams
from spice_ray.envs.bandit import Bandit
from spice_ray.envs.base import register
from spice_ray.envs.bayes import ArmPosterior, exact_ties, normalise_log, rowwise_matmul

GRID_ANGLES = 1024


@register
class BanditLatent(Bandit):
    """Arm means on a cosine of one latent angle (see the module docstring)."""

    name = "bandit_latent"
    defaults = {**Bandit.defaults,
                "train": {**Bandit.defaults["train"], "shrink_prior": "data"},
                "data": {"label": "weak", "num_eval_tasks": 500},
                "eval": {"num_tasks": 500, "online_horizon": 500}}

    @dataclass(frozen=True)
    class Params(Bandit.Params):
        """Latent bandit fields of the ``env`` config section."""

        amplitude: float = 0.4
        """Amplitude of the cosine around 0.5 (in [0, 0.5])."""

        def validate(self) -> None:
            super().validate()
            if not 0 <= self.amplitude <= 0.5:
                raise ValueError(f"env.amplitude={self.amplitude!r} is invalid: a float in "
                                 "[0, 0.5]")

    def means_at(self, theta: np.ndarray) -> np.ndarray:
        """Arm means [..., A] at angles theta [...]."""
        a = np.arange(self.num_actions)
        return 0.5 + self.params.amplitude * np.cos(
            np.asarray(theta)[..., None] - 2.0 * np.pi * a / self.num_actions)

    def sample_means(self, streams: TaskStreams) -> np.ndarray:
        return self.means_at(2.0 * np.pi * streams.uniform("latent/theta"))

    # ---- the exact posterior -------------------------------------------------------------

    @functools.cached_property
    def _grid(self) -> np.ndarray:
        """Arm means [G, A] at the grid's angles."""
        return self.means_at(2.0 * np.pi * (np.arange(GRID_ANGLES) + 0.5) / GRID_ANGLES)

    def _weights(self, counts: np.ndarray, sums: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Posterior weights over the angle grid [B, G] and the arm means there [G, A]."""
        grid = self._grid
        # sum_a (mu_a S_a - n_a mu_a^2 / 2) / sigma^2, each task on its own (rowwise_matmul)
        logw = (rowwise_matmul(sums, grid.T) - 0.5 * rowwise_matmul(counts, (grid**2).T)
                ) / max(self.params.sigma**2, 1e-12)
        return normalise_log(logw), grid  # (B, G), (G, A)

    def posterior_moments(self, counts: np.ndarray, sums: np.ndarray
                          ) -> tuple[np.ndarray, np.ndarray]:
        """Mean and variance [B, A] of each arm's mean given counts and sums [B, A]."""
        w, grid = self._weights(counts, sums)
        mean = rowwise_matmul(w, grid)  # (B, A)
        var = np.maximum(rowwise_matmul(w, grid**2) - mean**2, 0.0)
        return exact_ties(mean), exact_ties(var)

    def posterior_sample(self, counts: np.ndarray, sums: np.ndarray, draws: Any
                         ) -> np.ndarray:
        """Arm means [B, A] at one angle drawn from the posterior."""
        w, grid = self._weights(counts, sums)
        return grid[draws.categorical(w)]

    def task_posterior(self, gamma: float = 0.0) -> ArmPosterior:
        """The exact posterior of B rollouts (``envs.bayes``)."""
        return ArmPosterior(self.num_actions, self.posterior_moments, self.posterior_sample)
