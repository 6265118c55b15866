"""Where SPICE's per-action prior comes from: one strategy object per reading.

:class:`SpiceAgent <spice_ray.agents.spice.SpiceAgent>` is the fusion (kernel evidence, the
Normal-Normal posterior, the action rule) plus one :class:`Prior`:

- :class:`LearnedPrior`: the value ensemble's N(Q-bar, max((s sigma_Q)^2, v_min)) at the current
  position (paper sec. 3.3), its width as ``fusion.width_source`` says;
- :class:`FlatPrior`: one constant N(mu_0, v_0) for every action and state (the prior ablation
  and the count-based explorer: no network);
- :class:`ExactPrior`: the environment's exact task posterior given the whole context (the
  oracle prior, the best any learned prior could give);
- :class:`ContextFreePrior`: that posterior before any context, at the current state (the
  family's h = 0 marginal: knowing the population without reading the context);
- :class:`LearnedMeanExactSd`: the ensemble's mean with the exact posterior's sd (a diagnostic:
  does a calibrated width let the fusion use the mean?).

Each says its moments at the current step, the values V(s') that n-step targets bootstrap
from, and (where it has one) its moments at every context length of the offline protocol.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor

from spice_ray.agents.base import to_numpy
from spice_ray.agents.runner import ContextView
from spice_ray.config import FusionConfig
from spice_ray.envs.bayes import TaskPosterior
from spice_ray.fusion import STATS_DTYPE, bootstrap_values, learned_prior_std


class Prior(Protocol):
    """SPICE's prior: moments per action, [B, A] on the CPU in float64 (or the model's dtype
    for a learned one)."""

    def reset(self, num_tasks: int) -> None: ...

    def observe(self, actions: Tensor, rewards: Tensor, states: Tensor, next_states: Tensor
                ) -> None: ...

    def moments(self, view: ContextView, states: Tensor, h: int, shape: tuple[int, int]
                ) -> tuple[Tensor, Tensor]:
        """(mean, sd) at the current step, h transitions into the context."""
        ...

    def next_values(self, view: ContextView, fusion: FusionConfig) -> Tensor:
        """V(s_{t+1}) [B, T] of the context's transitions, for n-step targets."""
        ...

    def offline_moments(self, outputs: dict[str, Tensor], hs: Tensor, shape: tuple[int, ...]
                        ) -> tuple[Tensor, Tensor]:
        """(mean, sd) [B, P, A] after the first hs[j] transitions of fixed contexts, from the
        model's heads at those positions (``outputs``)."""
        ...


class _Stateless:
    """A prior that reads nothing from the transitions it is shown."""

    def reset(self, num_tasks: int) -> None:
        pass

    def observe(self, actions: Tensor, rewards: Tensor, states: Tensor, next_states: Tensor
                ) -> None:
        pass


@dataclass(frozen=True)
class FlatPrior(_Stateless):
    """The same prior N(mean, var) for every action and state (no network); or, with a mean
    and a variance per action (tuples of A), the same per-action prior in every state and
    task (a prior estimated from training data that never reads the context)."""

    mean: float | tuple[float, ...]
    var: float | tuple[float, ...]

    def moments(self, view: ContextView, states: Tensor, h: int, shape: tuple[int, int]
                ) -> tuple[Tensor, Tensor]:
        return self._full(shape)

    def next_values(self, view: ContextView, fusion: FusionConfig) -> Tensor:
        best = max(self.mean) if isinstance(self.mean, tuple) else self.mean  # max_a mean
        return torch.full(view.rewards.shape, best, dtype=STATS_DTYPE)

    def offline_moments(self, outputs: dict[str, Tensor], hs: Tensor, shape: tuple[int, ...]
                        ) -> tuple[Tensor, Tensor]:
        return self._full(shape)

    def _full(self, shape: tuple[int, ...]) -> tuple[Tensor, Tensor]:
        if not isinstance(self.mean, tuple):
            return (torch.full(shape, self.mean, dtype=STATS_DTYPE),
                    torch.full(shape, self.var ** 0.5, dtype=STATS_DTYPE))
        if len(self.mean) != shape[-1]:
            raise ValueError(f"a per-action prior of {len(self.mean)} actions for "
                             f"{shape[-1]} actions")
        mean = torch.tensor(self.mean, dtype=STATS_DTYPE)  # (A,): the last dim
        sd = torch.tensor([v ** 0.5 for v in self.var], dtype=STATS_DTYPE)
        return mean.expand(shape).clone(), sd.expand(shape).clone()


class LearnedPrior(_Stateless):
    """The value ensemble's prior at the current position (the model's heads), its width from
    ``fusion.width_source`` (the ensemble's sigma_Q scaled by ``width_scale`` and narrowed with
    h by ``width_decay``, or the predictive-variance head's)."""

    def __init__(self, fusion: FusionConfig) -> None:
        self.fusion = fusion

    def moments(self, view: ContextView, states: Tensor, h: int, shape: tuple[int, int]
                ) -> tuple[Tensor, Tensor]:
        head = view.head
        return head.prior_mean, learned_prior_std(self.fusion, head.prior_std, h, head.pred_var)

    def next_values(self, view: ContextView, fusion: FusionConfig) -> Tensor:
        assert view.prior_means is not None
        return bootstrap_values(view.prior_means, fusion.bootstrap)  # (B, T)

    def offline_moments(self, outputs: dict[str, Tensor], hs: Tensor, shape: tuple[int, ...]
                        ) -> tuple[Tensor, Tensor]:
        return outputs["prior_mean"], learned_prior_std(self.fusion, outputs["prior_std"],
                                                        hs[None, :, None], outputs.get("pred_var"))


class ExactPrior:
    """The environment's exact task posterior at the current state given the whole context
    (the oracle prior): it observes every transition itself."""

    def __init__(self, posterior: TaskPosterior) -> None:
        self.posterior = posterior

    def reset(self, num_tasks: int) -> None:
        self.posterior.reset(num_tasks)

    def observe(self, actions: Tensor, rewards: Tensor, states: Tensor, next_states: Tensor
                ) -> None:
        self.posterior.observe(*(to_numpy(x) for x in (actions, rewards, states, next_states)))

    def moments(self, view: ContextView, states: Tensor, h: int, shape: tuple[int, int]
                ) -> tuple[Tensor, Tensor]:
        mean, var = self.posterior.moments(to_numpy(states))
        return (torch.from_numpy(mean).to(STATS_DTYPE),
                torch.from_numpy(var).to(STATS_DTYPE).sqrt())

    def next_values(self, view: ContextView, fusion: FusionConfig) -> Tensor:
        return torch.from_numpy(self.posterior.next_values()).to(STATS_DTYPE)

    def offline_moments(self, outputs: dict[str, Tensor], hs: Tensor, shape: tuple[int, ...]
                        ) -> tuple[Tensor, Tensor]:
        raise ValueError("the exact posterior prior has no offline curve (it follows an "
                         "online context)")


class ContextFreePrior(ExactPrior):
    """The family's exact prior before any context, at the current state: the h = 0 marginal
    of the task posterior, never conditioned on what the rollout shows (what knowing the
    population gives without reading the context; the fusion's own evidence is then the only
    thing that reads it). Of the transitions it is shown it keeps only V(s') for the n-step
    targets, the context-free prior's own max value at each next state, computed once as the
    transition arrives (the prior never changes, so neither does that value)."""

    def __init__(self, posterior: TaskPosterior) -> None:
        super().__init__(posterior)
        self._values: list[np.ndarray] = []

    def reset(self, num_tasks: int) -> None:
        self.posterior.reset(num_tasks)
        self._values = []

    def observe(self, actions: Tensor, rewards: Tensor, states: Tensor, next_states: Tensor
                ) -> None:
        self._values.append(self.posterior.moments(to_numpy(next_states))[0].max(-1))  # (B,)

    def next_values(self, view: ContextView, fusion: FusionConfig) -> Tensor:
        if not self._values:
            return torch.zeros((view.rewards.shape[0], 0), dtype=STATS_DTYPE)
        return torch.from_numpy(np.stack(self._values, 1)).to(STATS_DTYPE)  # (B, T)


class LearnedMeanExactSd(ExactPrior):
    """The learned prior's mean with the exact task posterior's sd (a diagnostic)."""

    def moments(self, view: ContextView, states: Tensor, h: int, shape: tuple[int, int]
                ) -> tuple[Tensor, Tensor]:
        exact_var = self.posterior.moments(to_numpy(states))[1]
        return view.head.prior_mean, torch.from_numpy(exact_var).to(STATS_DTYPE).sqrt()

    def next_values(self, view: ContextView, fusion: FusionConfig) -> Tensor:
        assert view.prior_means is not None  # the learned values, as the learned prior's
        return bootstrap_values(view.prior_means, fusion.bootstrap)

    def offline_moments(self, outputs: dict[str, Tensor], hs: Tensor, shape: tuple[int, ...]
                        ) -> tuple[Tensor, Tensor]:
        raise ValueError("the learned mean with the exact sd has no offline curve (the exact "
                         "sd follows an online context)")


def make_prior(fusion: FusionConfig, model: Any,
               prior: FlatPrior | ContextFreePrior | TaskPosterior | None,
               exact_width: TaskPosterior | None) -> Prior:
    """The strategy of a SpiceAgent's arguments (a model, a flat or context-free prior or an
    exact posterior, and the exact-width diagnostic)."""
    if isinstance(prior, FlatPrior | ContextFreePrior):
        return prior
    if prior is not None:
        return ExactPrior(prior)
    if exact_width is not None:
        return LearnedMeanExactSd(exact_width)
    return LearnedPrior(fusion)
