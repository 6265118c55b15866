"""Template bandit: every task is a noisy copy of one arm-mean template, so a prior learned
from data knows which arm is usually best and a flat prior cannot.

Arm means mu_a = clip(m_a + 0.15 eps_a, 0, 1) with eps ~ N(0, 1) i.i.d. and the template
m = (0.7, 0.4, 0.4, ...): arm 0 is best in about 78% of tasks (A = 5). Rewards, behaviour policy
and labels are the ``bandit``'s (sigma = 0.3, H = 500, weak labels).

The exact posterior is per arm (the arms are independent) and is computed by enumeration over
a grid of 400 bins of [0, 1] plus the two atoms the clip puts at 0 and 1.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from spice_ray.common.rng import TaskStreams
from spice_ray.envs.bandit import Bandit
from spice_ray.envs.base import register
from spice_ray.envs.bayes import (
    ArmPosterior,
    inverse_cdf,
    log_likelihood,
    normalise_log,
    weighted_moments,
)

GRID_BINS = 400


@register
class BanditTemplate(Bandit):
    """Arm means scattered around one template (see the module docstring)."""

    name = "bandit_template"
    defaults = {**Bandit.defaults,
                "train": {**Bandit.defaults["train"], "shrink_prior": "data"},
                "data": {"label": "weak", "num_eval_tasks": 500},
                "eval": {"num_tasks": 500, "online_horizon": 500}}

    @dataclass(frozen=True)
    class Params(Bandit.Params):
        """Template bandit fields of the ``env`` config section."""

        best_mean: float = 0.7
        """m_0, the template's mean of arm 0."""
        other_mean: float = 0.4
        """m_a for every other arm."""
        spread: float = 0.15
        """Standard deviation of each arm's deviation from the template (> 0)."""

        def validate(self) -> None:
            super().validate()
            for field in ("best_mean", "other_mean"):
                value = getattr(self, field)
                if not 0 <= value <= 1:
                    raise ValueError(f"env.{field}={value!r} is invalid: a float in [0, 1]")
            if not self.spread > 0:
                raise ValueError(f"env.spread={self.spread!r} is invalid: a float > 0")

    def template(self) -> np.ndarray:
        """m [A]."""
        m = np.full(self.num_actions, float(self.params.other_mean))
        m[0] = self.params.best_mean
        return m

    def sample_means(self, streams: TaskStreams) -> np.ndarray:
        eps = streams.normal("template/eps", (self.num_actions,))
        return np.clip(self.template() + self.params.spread * eps, 0.0, 1.0)

    # ---- the exact posterior -------------------------------------------------------------

    @functools.cached_property
    def _grid(self) -> tuple[np.ndarray, np.ndarray]:
        """Support [G] (0, the bin midpoints, 1) and the prior's log mass per arm [A, G]."""
        edges = np.linspace(0.0, 1.0, GRID_BINS + 1)
        support = np.concatenate([[0.0], 0.5 * (edges[1:] + edges[:-1]), [1.0]])
        z = (edges[None, :] - self.template()[:, None]) / self.params.spread  # (A, G+1)
        cdf = _ndtr(z)
        mass = np.concatenate([cdf[:, :1], np.diff(cdf, axis=1), 1.0 - cdf[:, -1:]], axis=1)
        with np.errstate(divide="ignore"):
            return support, np.log(mass)

    def _weights(self, counts: np.ndarray, sums: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        support, log_prior = self._grid
        logw = log_prior[None] + log_likelihood(counts[..., None], sums[..., None], support,
                                                self.params.sigma**2)  # (B, A, G)
        return support, normalise_log(logw)

    def posterior_moments(self, counts: np.ndarray, sums: np.ndarray
                          ) -> tuple[np.ndarray, np.ndarray]:
        """Mean and variance [B, A] of each arm's mean given counts and sums [B, A]."""
        support, w = self._weights(counts, sums)
        return weighted_moments(w, support)

    def posterior_sample(self, counts: np.ndarray, sums: np.ndarray, draws: Any
                         ) -> np.ndarray:
        """Arm means [B, A] drawn from the posterior (independent arms, by inversion)."""
        support, w = self._weights(counts, sums)
        u = _ndtr(draws.normal((self.num_actions,)))  # (B, A) uniforms
        return inverse_cdf(w, support, u)

    def task_posterior(self, gamma: float = 0.0) -> ArmPosterior:
        """The exact posterior of B rollouts (``envs.bayes``)."""
        return ArmPosterior(self.num_actions, self.posterior_moments, self.posterior_sample)


def _ndtr(z: np.ndarray) -> np.ndarray:
    """The standard normal CDF (scipy's, imported on first use: the command lines list the
    environments before their --help, and scipy costs a second of start-up)."""
    from scipy.special import ndtr

    return ndtr(z)
