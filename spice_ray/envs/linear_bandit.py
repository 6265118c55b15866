"""DPT's linear bandit: arm means are a linear function of a per-task parameter, so every pull
informs every arm through theta.

A = 10 arms with features phi_a ~ N(0, I/d), d = 2, drawn once from ``env.feature_seed`` and
shared by all tasks; theta ~ N(0, I/d) per task; mu_a = <phi_a, theta>; rewards N(mu_a, sigma^2)
with sigma = 0.3; H = 200. Behaviour policy and labels are the ``bandit``'s.

The exact posterior is Bayesian linear regression: precision P = d I + sum_a n_a phi_a phi_a^T
/ sigma^2, mean P^-1 sum_a S_a phi_a / sigma^2.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from spice_ray.common.rng import TaskStreams
from spice_ray.envs.bandit import Bandit
from spice_ray.envs.base import register
from spice_ray.envs.bayes import ArmPosterior, exact_ties, rowwise_matmul


@register
class LinearBandit(Bandit):
    """Arm means <phi_a, theta> (see the module docstring)."""

    name = "linear_bandit"
    defaults = {**Bandit.defaults,
                "train": {**Bandit.defaults["train"], "shrink_prior": "data"},
                "env": {"horizon": 200},
                "data": {"label": "weak", "num_eval_tasks": 500},
                "eval": {"num_tasks": 500, "online_horizon": 200}}

    @dataclass(frozen=True)
    class Params(Bandit.Params):
        """Linear bandit fields of the ``env`` config section."""

        num_arms: int = 10
        """Arms A (in [2, 255])."""
        dim: int = 2
        """d, the dimension of theta and of the arm features (in [1, 64])."""
        feature_seed: int = 0
        """Seed of the arm features, shared by every task (>= 0)."""

        def validate(self) -> None:
            super().validate()
            if not 1 <= self.dim <= 64:
                raise ValueError(f"env.dim={self.dim!r} is invalid: an integer in [1, 64]")
            if self.feature_seed < 0:
                raise ValueError(f"env.feature_seed={self.feature_seed!r} is invalid: >= 0")

    def arm_features(self) -> np.ndarray:
        """phi [A, d], the same for every task."""
        rng = np.random.default_rng(np.random.SeedSequence([self.params.feature_seed, 2101]))
        d = self.params.dim
        return rng.normal(0.0, 1.0 / np.sqrt(d), size=(self.num_actions, d))

    def sample_means(self, streams: TaskStreams) -> np.ndarray:
        d = self.params.dim
        theta = streams.normal("linear/theta", (d,)) / np.sqrt(d)  # (B, d)
        return theta @ self.arm_features().T

    # ---- the exact posterior -------------------------------------------------------------

    def theta_posterior(self, counts: np.ndarray, sums: np.ndarray
                        ) -> tuple[np.ndarray, np.ndarray]:
        """Posterior mean [B, d] and covariance [B, d, d] of theta given counts, sums [B, A]."""
        phi, d = self.arm_features(), self.params.dim
        noise_var = max(self.params.sigma**2, 1e-12)
        precision = d * np.eye(d) + np.einsum("ba,ai,aj->bij", counts, phi, phi) / noise_var
        cov = np.linalg.inv(precision)
        mean = np.einsum("bij,bj->bi", cov, rowwise_matmul(sums, phi) / noise_var)
        return mean, 0.5 * (cov + cov.transpose(0, 2, 1))

    def posterior_moments(self, counts: np.ndarray, sums: np.ndarray
                          ) -> tuple[np.ndarray, np.ndarray]:
        """Mean and variance [B, A] of each arm's mean."""
        phi = self.arm_features()
        mean, cov = self.theta_posterior(counts, sums)
        return (exact_ties(rowwise_matmul(mean, phi.T)),
                exact_ties(np.einsum("ai,bij,aj->ba", phi, cov, phi)))

    def posterior_sample(self, counts: np.ndarray, sums: np.ndarray, draws: Any
                         ) -> np.ndarray:
        """Arm means [B, A] at one theta drawn from the posterior (LinTS with the true prior)."""
        mean, cov = self.theta_posterior(counts, sums)
        z = draws.normal((self.params.dim,))  # (B, d)
        theta = mean + np.einsum("bij,bj->bi", np.linalg.cholesky(cov), z)
        return rowwise_matmul(theta, self.arm_features().T)

    def task_posterior(self, gamma: float = 0.0) -> ArmPosterior:
        """The exact posterior of B rollouts (``envs.bayes``)."""
        return ArmPosterior(self.num_actions, self.posterior_moments, self.posterior_sample)
