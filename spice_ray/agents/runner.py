"""The growing context of B online rollouts and the model's outputs over it.

* Stateless environments (the query token never changes): with ``use_cache`` the KV cache is
  primed with one ``step_query`` and extended by one ``step_transition`` per observed
  transition, so a step costs O(T D) instead of a full forward; without it the full forward
  over [query; context] is recomputed every step (the reference the cache is tested and
  benchmarked against).
* Otherwise the query is the *current* state and sits at position 0, so every position's
  output changes when the agent moves and nothing can be cached; each step re-runs the trunk
  on [current state; context so far] (transition features are built once, when observed). The
  heads run only where needed: the last position for the prior and the policy, every position
  when the n-step targets need the prior mean's bootstrap values.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from spice_ray.fusion import STATS_DTYPE
from spice_ray.model.tokens import query_features, token_dim, transition_features
from spice_ray.model.trunk import TrunkModel


class _Growing:
    """A [B, capacity, *shape] buffer that doubles its capacity when full."""

    def __init__(self, batch: int, shape: tuple[int, ...], dtype: torch.dtype,
                 device: torch.device, capacity: int = 64) -> None:
        self.data = torch.zeros((batch, capacity, *shape), dtype=dtype, device=device)
        self.length = 0

    def append(self, x: Tensor) -> None:
        """Append x [B, *shape] at index ``length``."""
        if self.length == self.data.shape[1]:
            B, cap, *shape = self.data.shape
            grown = self.data.new_zeros((B, 2 * cap, *shape))  # (B, 2 cap, ...)
            grown[:, :cap] = self.data
            self.data = grown
        self.data[:, self.length] = x.to(self.data.dtype)
        self.length += 1

    def view(self, lo: int = 0, hi: int | None = None) -> Tensor:
        """Entries [lo, hi) (default: all appended), [B, hi - lo, *shape]."""
        return self.data[:, lo:self.length if hi is None else hi]


def _select(out: Any, index: int) -> Any:
    """The same output dataclass with every field indexed at position ``index`` ([:, index])."""
    return type(out)(**{f.name: None if (x := getattr(out, f.name)) is None else x[:, index]
                        for f in dataclasses.fields(out)})


@dataclass(frozen=True)
class ContextView:
    """The model's view of the current step: outputs at the current position and the context.

    The context is the last T transitions (all of them unless the rollout outgrew the model's
    positions, see :class:`ContextRunner`). Positions: 0 is the query, t has seen transitions
    1..t, so the current position is T.

    Attributes:
        head: ``model.heads`` at position T (a SpiceOutput or DptOutput), fields [B, ...].
        actions: long [B, T] context actions a_t.
        rewards: float64 [B, T] context rewards r_t.
        states: [B, T, S] context states s_t.
        latents: [B, T+1, D] trunk latents of positions 0..T, or None when not kept.
        prior_means: [B, T, A] prior mean Q-bar at positions 1..T (the values at s_{t+1} given
            transitions <= t), or None when not kept.
    """

    head: Any
    actions: Tensor
    rewards: Tensor
    states: Tensor
    latents: Tensor | None = None
    prior_means: Tensor | None = None


class ContextRunner:
    """The growing context of B online rollouts and the model's outputs over it.

    Args:
        model: a SpiceModel or DptModel (put in eval mode by the caller).
        stateless: the environment has one constant state, so the query token never changes
            and the KV cache can be used; otherwise the query is the current state and every
            step re-runs the trunk on [current state; context so far].
        use_cache: stateless environments only: incremental decoding with the KV cache.
        keep_latents: also return the latents of every position (latent-space kernels).
        keep_prior_means: also return the prior mean at every position (n-step bootstraps).

    Context window: the trunk has ``model.max_len`` positions, so at most ``max_len - 1``
    transitions fit after the query. A longer rollout (darkroom with several ``episodes``, a
    deployed policy run past the trained horizon) conditions on the most recent ``max_len - 1``
    transitions: a sliding window. With the cache, the runner leaves cached decoding when the
    window is full (a cache cannot drop its oldest position) and re-runs the trunk from then on.
    """

    def __init__(self, model: TrunkModel, stateless: bool, use_cache: bool = True,
                 keep_latents: bool = False, keep_prior_means: bool = False) -> None:
        self.model = model
        self.use_cache = bool(use_cache) and stateless
        self.cached = self.use_cache
        self.keep_latents = keep_latents
        self.keep_prior_means = keep_prior_means
        ref = model.trunk.embed.weight
        self.device, self.dtype = ref.device, ref.dtype
        self.window = model.max_len - 1
        self.t = 0

    def reset(self, num_tasks: int) -> None:
        """Empty contexts for ``num_tasks`` tasks (and, cached, the query token appended)."""
        B, S, dev = num_tasks, self.model.state_dim, self.device
        self.num_tasks = B
        self.t = 0
        self.cached = self.use_cache
        self._actions = _Growing(B, (), torch.long, dev)
        self._rewards = _Growing(B, (), STATS_DTYPE, dev)
        self._states = _Growing(B, (S,), self.dtype, dev)
        self._pending: list[tuple[Tensor, Tensor, Tensor, Tensor]] = []
        if self.cached:
            self._cache = self.model.init_cache(B)
            self._latents = _Growing(B, (self.model.trunk.n_embd,), self.dtype, dev)
            self._pms = _Growing(B, (self.model.num_actions,), self.dtype, dev)
            self._next = _Growing(B, (S,), self.dtype, dev)  # for leaving the cache
            with torch.no_grad():
                self._head = self.model.step_query(self._zero_states(), self._cache)
            self._keep(self._head, first=True)
        else:
            feat = token_dim(S, self.model.num_actions)
            self._feats = _Growing(B, (feat,), self.dtype, dev)

    def _zero_states(self) -> Tensor:
        return torch.zeros(self.num_tasks, self.model.state_dim, dtype=self.dtype,
                           device=self.device)

    def _keep(self, out: Any, first: bool = False) -> None:
        """Cached mode: remember the new position's latent / prior mean if asked to."""
        if self.keep_latents:
            self._latents.append(out.latent)
        if self.keep_prior_means and not first:  # prior means are kept for positions 1..T
            self._pms.append(out.prior_mean)

    def append(self, states: Tensor | None, actions: Tensor, rewards: Tensor,
               next_states: Tensor | None) -> None:
        """Add one transition per task ([B, S] or None for the zero state, [B], [B])."""
        if self.cached and self.t == self.window:
            self._leave_cache()
        s = self._zero_states() if states is None else states.to(self.device, self.dtype)
        s2 = self._zero_states() if next_states is None else next_states.to(self.device,
                                                                             self.dtype)
        a = actions.to(self.device, torch.long)
        r = rewards.to(self.device, STATS_DTYPE)
        self._actions.append(a)
        self._rewards.append(r)
        self._states.append(s)
        if self.cached:
            self._next.append(s2)
            self._pending.append((s, a, r, s2))  # the model steps lazily, when next asked
        else:
            self._feats.append(transition_features(s, a, r.to(self.dtype), s2,
                                                   self.model.num_actions))
        self.t += 1

    def _leave_cache(self) -> None:
        """The window is full: build the transition features of the context so far and go on
        uncached (the query of a stateless environment is the zero state either way)."""
        self.view()  # step the pending transitions, so the latents kept so far are complete
        A = self.model.num_actions
        feats = transition_features(self._states.view(), self._actions.view(),
                                    self._rewards.view().to(self.dtype), self._next.view(), A)
        self._feats = _Growing(self.num_tasks, (feats.shape[-1],), self.dtype, self.device,
                               capacity=max(64, 2 * feats.shape[1]))
        self._feats.data[:, :feats.shape[1]] = feats
        self._feats.length = feats.shape[1]
        self.cached = False
        del self._cache, self._next

    @torch.no_grad()
    def view(self, query_states: Tensor | None = None) -> ContextView:
        """Outputs at the current position for the query ([B, S]; None = the zero state)."""
        lo = max(0, self.t - self.window)
        latents = prior_means = None
        if self.cached:
            for s, a, r, s2 in self._pending:
                self._head = self.model.step_transition(s, a, r.to(self.dtype), s2, self._cache)
                self._keep(self._head)
            self._pending.clear()
            head = self._head
            if self.keep_latents:
                latents = self._latents.view()  # (B, T+1, D)
            if self.keep_prior_means:
                prior_means = self._pms.view()  # (B, T, A)
        else:
            q = self._zero_states() if query_states is None else query_states.to(
                self.device, self.dtype)
            x = torch.cat([query_features(q, self.model.num_actions).unsqueeze(1),
                           self._feats.view(lo)], dim=1)  # (B, T+1, F)
            latent = self.model.trunk(x)  # (B, T+1, D)
            if self.keep_prior_means and latent.shape[1] > 1:
                seq = self.model.heads(latent[:, 1:])  # positions 1..T
                prior_means = seq.prior_mean  # (B, T, A)
                head = _select(seq, -1)
            else:
                head = self.model.heads(latent[:, -1])
                if self.keep_prior_means:  # empty context: no positions 1..T
                    prior_means = head.prior_mean.new_zeros(self.num_tasks, 0,
                                                            self.model.num_actions)
            if self.keep_latents:
                latents = latent
        return ContextView(head=head, actions=self._actions.view(lo),
                           rewards=self._rewards.view(lo), states=self._states.view(lo),
                           latents=latents, prior_means=prior_means)


