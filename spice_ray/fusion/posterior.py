"""Test-time Bayesian fusion: weighted evidence and the Normal-Normal posterior.

Paper sec. 3.3 and the appendix "Derivation of precision-additive Gaussian posterior". Per
action a, with kernel weights w_t in [0, 1]:

    c_a   = sum_t w_t 1[a_t = a]
    y~_a  = sum_t w_t 1[a_t = a] y_t / max(1, c_a)
    v_pri = max(sigma_Q^2, v_min)
    v_post = 1 / (1 / v_pri + c_a / sigma^2)
    m_post = v_post (mu_pri / v_pri + c_a y~_a / sigma^2)

This module is the project's only implementation of these formulas; the classical baselines
(``spice_ray.agents.classical``) and the learned agents call it. Everything is pure torch
and broadcasts over leading dims, with actions A on the last axis and context T on the last axis
of per-transition inputs.

The action rules that act on the posterior are in ``spice_ray.fusion.rules``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, NamedTuple

import torch
from torch import Tensor

from spice_ray.common.rng import StepDraws

RandomSource = torch.Generator | StepDraws
"""Where sampling rules draw from: a ``torch.Generator`` (draws depend on the whole batch) or a
:class:`~spice_ray.common.rng.StepDraws` (each task's draws depend on its own key only; rollouts use
these so results do not depend on how tasks are sharded)."""

NOISE_VAR_FLOOR = 1e-6
"""Smallest likelihood variance sigma^2 used in the posterior; sigma = 0 is floored to this."""



class Posterior(NamedTuple):
    """Per-action Gaussian posterior N(mean, var), both [..., A]."""

    mean: Tensor
    var: Tensor


# ---- evidence ----------------------------------------------------------------------------


def safe_mean(sums: Tensor, counts: Tensor) -> Tensor:
    """The paper's weighted mean y~ = sums / max(1, c); 0 where c = 0. Shapes broadcast."""
    return sums / counts.clamp_min(1.0)


def weighted_action_stats(
    weights: Tensor | None,
    actions: Tensor,
    targets: Tensor,
    num_actions: int,
    mask: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Kernel-weighted counts c_a and mean targets y~_a from a context.

    Note the paper's ``max(1, c_a)`` denominator: with fractional weights and c_a < 1 the mean is
    shrunk towards 0 (it is the weighted *sum*); with unit weights it only matters at c_a = 0,
    where y~_a = 0. The posterior multiplies y~ by c, so an unseen action contributes nothing.

    Args:
        weights: [..., T] kernel weights in [0, 1], or None for uniform (all ones).
        actions: long [..., T] actions in [0, A) (any value where ``mask`` is False).
        targets: float [..., T] targets y_t (rewards or n-step returns).
        num_actions: A.
        mask: optional bool [..., T]; False positions (padding, beyond a prefix) contribute
            nothing.

    Returns:
        (counts [..., A], weighted_mean [..., A]) in the targets' floating dtype.
    """
    dtype = targets.dtype if targets.is_floating_point() else torch.get_default_dtype()
    if weights is None:
        weights = torch.ones_like(targets, dtype=dtype)
    weights, actions, targets = torch.broadcast_tensors(weights.to(dtype), actions,
                                                        targets.to(dtype))
    if mask is not None:
        mask = mask.bool().expand_as(actions)
        weights = torch.where(mask, weights, torch.zeros((), dtype=dtype, device=weights.device))
        actions = torch.where(mask, actions, torch.zeros_like(actions))  # padding -> arm 0, w=0
    out_shape = actions.shape[:-1] + (num_actions,)
    zeros = torch.zeros(out_shape, dtype=dtype, device=targets.device)
    counts = zeros.scatter_add(-1, actions, weights)  # (..., A)
    sums = zeros.scatter_add(-1, actions, weights * targets)  # (..., A)
    return counts, safe_mean(sums, counts)


@dataclass
class RunningStats:
    """Running per-action counts and target sums for online use: O(A) work per step.

    Each :meth:`update` adds one new transition per task in place; nothing is recounted from the
    whole context. With unit weights (the uniform kernel, as for bandits, whose query never
    changes) it equals :func:`weighted_action_stats` on the full context. A weight per update is
    allowed only when past transitions' weights do not change as the query moves.

    Attributes:
        counts: [..., A] c_a.
        sums: [..., A] sum_t w_t 1[a_t = a] y_t.
        num_updates: transitions added so far (per task).
    """

    counts: Tensor
    sums: Tensor
    num_updates: int = field(default=0)

    @classmethod
    def zeros(
        cls,
        batch_shape: tuple[int, ...] | int,
        num_actions: int,
        dtype: torch.dtype = torch.float64,
        device: torch.device | str | None = None,
    ) -> RunningStats:
        """Empty statistics of shape [*batch_shape, A]."""
        if isinstance(batch_shape, int):
            batch_shape = (batch_shape,)
        shape = (*batch_shape, num_actions)
        return cls(torch.zeros(shape, dtype=dtype, device=device),
                   torch.zeros(shape, dtype=dtype, device=device))

    @property
    def mean(self) -> Tensor:
        """y~_a = sums / max(1, c_a), [..., A]."""
        return safe_mean(self.sums, self.counts)

    def update(self, actions: Tensor, targets: Tensor, weights: Tensor | None = None) -> None:
        """Add one transition per task in place.

        Args:
            actions: long [...] the action taken in each task.
            targets: float [...] its target (reward).
            weights: optional float [...] kernel weight; default 1.
        """
        index = actions.to(device=self.counts.device, dtype=torch.long).unsqueeze(-1)  # (..., 1)
        targets = targets.to(self.sums).unsqueeze(-1)  # (..., 1)
        if weights is None:
            w = torch.ones_like(targets)
        else:
            w = weights.to(self.counts).unsqueeze(-1)
        self.counts.scatter_add_(-1, index, w)
        self.sums.scatter_add_(-1, index, w * targets)
        self.num_updates += 1


Bootstrap = Literal["max", "mean"]
BOOTSTRAPS: tuple[str, ...] = ("max", "mean")


def bootstrap_values(q_mean: Tensor, how: Bootstrap = "max") -> Tensor:
    """V(s) from Q-bar(s, .) [..., A] -> [...]: ``max`` (the paper: the greedy policy's value)
    or ``mean`` (the uniform behaviour policy's value: no maximisation bias)."""
    if how == "max":
        return q_mean.amax(-1)
    if how == "mean":
        return q_mean.mean(-1)
    raise ValueError(f"bootstrap={how!r} is invalid: one of {', '.join(BOOTSTRAPS)}")


TAILS = ("truncate", "bootstrap", "inside")
"""What an n-step window cut by the context's end adds (``fusion.tail``, ``train.tail``):
nothing (the paper's indicator), the value at the last state it reaches, or ("inside") the
value at the last state that starts a transition of the context, after the rewards before it."""
TAIL_DEFAULT = "truncate"
"""The paper's: a window that runs past the context's end is not bootstrapped."""


def nstep_targets(
    rewards: Tensor,
    next_values: Tensor,
    n: int,
    gamma: float,
    mask: Tensor | None = None,
    tail: str = TAIL_DEFAULT,
) -> Tensor:
    """n-step bootstrapped targets over a context, truncated at the context end.

    With L the number of valid transitions (T, or the prefix length given by ``mask``):

        y_t = sum_{i < n, t + i <= L} gamma^i r_{t+i}  +  gamma^n 1[t + n <= L] next_values[t+n-1]

    (t 1-indexed), the paper's TD(n) target: the bootstrap is added only while s_{t+n} is the
    state of a transition inside the context.

    where ``next_values[t] = max_a' mu_pri(s'_t, a')`` is the prior mean's greedy value at the
    state *after* transition t (so ``next_values[t+n-1]`` is the value at s_{t+n}). Near the end
    of the context the return is truncated without a bootstrap (the indicator), exactly as in
    the formula above; episode boundaries inside the context are not treated specially.

    With ``tail="bootstrap"`` (a departure from the paper) a window cut by the context's end
    bootstraps from the state it reaches, the last transition's next state, instead:

        y_t = sum_{i < k} gamma^i r_{t+i}  +  gamma^k next_values[t+k-1],  k = min(n, L - t + 1)

    so the newest transitions' targets are on the same scale as the others' (truncated, the
    target of an action just taken is its one reward: staying on a goal just reached reads as
    worth 1 while the moves never tried keep their prior values).

    With ``tail="inside"`` a window cut by the context's end stops one transition earlier and
    bootstraps from the state that starts the last transition, s_L, whose value a model reads
    at a position some loss trains (in training, ``next_values[L-1]`` is position L, which no
    loss regresses); the last transition keeps its one reward:

        y_t = sum_{i < k} gamma^i r_{t+i}  +  gamma^k next_values[t+k-1],  k = min(n, L - t)
        (t < L),    y_L = r_L

    For n = 1 it is ``truncate``.

    Args:
        rewards: [..., T] rewards r_t.
        next_values: [..., T] bootstrap values at s'_t (e.g. ``prior_mean.amax(-1)`` evaluated at
            each transition's next state).
        n: number of reward steps (>= 1). n = 1, gamma = 0 gives y_t = r_t, and with gamma = 0
            ``next_values`` is never read.
        gamma: discount in [0, 1].
        mask: optional bool [..., T], a valid *prefix* per row; invalid rewards are ignored,
            invalid positions get target 0.

    Returns:
        [..., T] targets y_t.
    """
    if n < 1:
        raise ValueError(f"n={n!r} is invalid: an integer >= 1")
    if tail not in TAILS:
        raise ValueError(f"tail={tail!r} is invalid: one of {', '.join(TAILS)}")
    rewards, next_values = torch.broadcast_tensors(rewards, next_values)
    if mask is None:
        valid = torch.ones_like(rewards, dtype=torch.bool)
    else:
        valid = mask.bool().expand_as(rewards)
    zero = torch.zeros((), dtype=rewards.dtype, device=rewards.device)
    rewards = torch.where(valid, rewards, zero)
    num_steps = rewards.shape[-1]

    def shifted(x: Tensor, k: int, fill: float | bool) -> Tensor:
        """x[..., t + k] with ``fill`` beyond the end, [..., T]."""
        pad = torch.full((*x.shape[:-1], k), fill, dtype=x.dtype, device=x.device)
        return torch.cat([x, pad], dim=-1)[..., k:k + num_steps]

    k = None  # a cut window's rewards before its bootstrap, where the tail bootstraps it
    if gamma != 0.0 and tail != "truncate":
        # 0-indexed t: the window ends at the context's end L ("bootstrap") or before its last
        # transition ("inside"), then V at the state it reaches; k <= 0: no bootstrap (the
        # last transition under "inside", which keeps its reward)
        steps = torch.arange(num_steps, device=rewards.device)
        end = valid.sum(-1, keepdim=True) - int(tail == "inside")
        k = torch.minimum(torch.full_like(steps, n), end - steps)  # (..., T)
    kept = None if k is None else k.clamp_min(1)  # rewards kept (the last one at least)
    targets = torch.zeros_like(rewards)
    for i in range(n):
        term = gamma**i * shifted(rewards, i, 0.0)  # r_{t+i}, 0 past the end
        if kept is not None:
            term = torch.where(i < kept, term, zero)
        targets = targets + term
    if k is not None:
        boot = next_values.gather(-1, (steps + k - 1).clamp(0, num_steps - 1))
        targets = targets + torch.where(valid & (k >= 1),
                                        gamma ** k.clamp_min(0).to(rewards.dtype) * boot, zero)
    elif gamma != 0.0:  # gamma = 0: no bootstrap at all (next_values may be dummies, even NaN)
        boot_valid = shifted(valid, n, False)  # 1[t + n <= L]: s_{t+n} starts a transition
        boot = shifted(next_values, n - 1, 0.0)  # next_values[t + n - 1] = V(s_{t+n})
        targets = targets + torch.where(boot_valid, gamma**n * boot, zero)
    return torch.where(valid, targets, zero)


# ---- posterior ---------------------------------------------------------------------------


def prior_variance(prior_std: Tensor, v_min: float) -> Tensor:
    """v_pri = max(sigma_Q^2, v_min) from the ensemble's std (the floor of
    :func:`gaussian_posterior`)."""
    return prior_std.square().clamp_min(v_min)


def _on(x, dtype: torch.dtype, device: torch.device) -> Tensor:
    """``x`` as a tensor on ``device``; a Python number is filled there (a kernel, not a copy
    from the host: a step captured as a CUDA graph may not copy from pageable host memory)."""
    if isinstance(x, (int, float)):
        return torch.full((), float(x), dtype=dtype, device=device)
    return torch.as_tensor(x, dtype=dtype, device=device)


def gaussian_posterior(
    prior_mean: Tensor | float,
    prior_var: Tensor | float,
    counts: Tensor,
    weighted_mean: Tensor,
    noise_var: Tensor | float,
    v_min: float = 0.0,
) -> Posterior:
    """Normal-Normal posterior per action by precision additivity. All inputs broadcast to [..., A].

        v_pri  = max(prior_var, v_min)
        v_post = 1 / (1 / v_pri + c / sigma^2)
        m_post = v_post (mu_pri / v_pri + c y~ / sigma^2)

    ``noise_var`` (sigma^2, a variance) is floored at :data:`NOISE_VAR_FLOOR` = 1e-6, so sigma = 0
    gives a very confident but finite posterior instead of 0/0. With c = 0 the posterior is the
    (floored) prior. ``prior_var`` must be positive and finite (or ``v_min`` > 0); a huge value
    such as 1e12 emulates a flat prior.

    Args:
        prior_mean: mu_pri, e.g. the ensemble mean Q-bar [..., A].
        prior_var: sigma_Q^2 (a variance, not a std) [..., A].
        counts: c_a [..., A].
        weighted_mean: y~_a [..., A] (as from :func:`weighted_action_stats`).
        noise_var: likelihood variance sigma^2 (>= 0), float or tensor.
        v_min: floor of the prior variance (paper: 1e-2; 0 for the classical TS baseline).

    Returns:
        Posterior(mean [..., A], var [..., A]).
    """
    dtype = counts.dtype if counts.is_floating_point() else torch.get_default_dtype()
    device = counts.device
    prior_mean = _on(prior_mean, dtype, device)
    v_pri = _on(prior_var, dtype, device).clamp_min(v_min)  # v_pri
    noise_var = _on(noise_var, dtype, device).clamp_min(NOISE_VAR_FLOOR)
    counts = counts.to(dtype)
    precision = 1.0 / v_pri + counts / noise_var
    post_var = 1.0 / precision
    post_mean = post_var * (prior_mean / v_pri + counts * weighted_mean.to(dtype) / noise_var)
    return Posterior(post_mean, post_var)


# ---- action rules ------------------------------------------------------------------------
