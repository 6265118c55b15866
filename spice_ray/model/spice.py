"""SPICE model: GPT-2 trunk + policy head + K-head value ensemble with randomised priors.

Positions and what they have seen. The sequence is [query, transition 1, ..., transition T];
position p (0..T) has seen the query and transitions 1..p. Its Q values are read as the values
of the state the agent is in after p transitions, s_{p+1} (for darkroom, token p holds
s'_p = s_{p+1}; bandits have no state), given the context 1..p.

No target leakage. Transition t's own reward r_t (and, for TD(n), r_t..r_{t+n-1}) sits inside
token t.., so the Q regressed on (s_t, a_t) must come from a position that has not seen token t:
position t-1. :func:`align_to_transitions` makes this explicit:

    q_pred[:, t-1] = q[:, t-1]   Q(s_t, .)      position t-1: query + transitions < t
    q_next[:, t-1] = q[:, t]     Q(s_{t+1}, .)  position t:   query + transitions <= t

``q_pred`` is what L_TD and L_shrink regress; it is unchanged by r_t (tested). ``q_next`` is only
used, detached, inside targets (the bootstrap max_a' Qbar(s_{t+n}, a') = q_next[:, t+n-1]); it
may depend on r_t, which is fine for a target. Position T appears only in ``q_next`` (and in the
policy loss and at test time, where it is the prior given the whole context).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from spice_ray.config import ModelConfig
from spice_ray.model.ensemble import ValueEnsemble, ensemble_mean_std
from spice_ray.model.tokens import query_features
from spice_ray.model.trunk import TrunkModel

VAR_FLOOR = 1e-6
"""Added to the predictive variance (its softplus), so its log-likelihood stays finite."""


@dataclass(frozen=True)
class SpiceOutput:
    """Outputs at every position ([B, T+1, ...]) or at one position ([B, ...]) when stepping.

    Attributes:
        logits: [B, T+1, A] policy logits.
        q: [B, T+1, K, A] every head's Q.
        prior_mean: [B, T+1, A] ensemble mean Qbar.
        prior_std: [B, T+1, A] ensemble std sigma_Q, unbiased (1 / (K - 1)).
        latent: [B, T+1, D] trunk hidden states h.
        pred_var: [B, T+1, A] the predictive variance of the next target per action
            (``model.var_head``), or None without that head.
    """

    logits: Tensor
    q: Tensor
    prior_mean: Tensor
    prior_std: Tensor
    latent: Tensor
    pred_var: Tensor | None = None


def align_to_transitions(x: Tensor) -> tuple[Tensor, Tensor]:
    """Split per-position values into leakage-free predictions and next-state values.

    Args:
        x: [B, T+1, ...] per position (e.g. q [B, T+1, K, A] or prior_mean [B, T+1, A]).

    Returns:
        (pred, next), both [B, T, ...]: for transition t (1-indexed), pred[:, t-1] = x[:, t-1]
        is the value at (s_t, .) from the position that has NOT seen token t (use it as the
        prediction), and next[:, t-1] = x[:, t] the value at s_{t+1} from the position that has
        seen token t (use it, detached, in targets only).
    """
    return x[:, :-1], x[:, 1:]


class SpiceModel(TrunkModel):
    """Trunk + policy head (D -> A) + :class:`ValueEnsemble` on the trunk latents.

    Args:
        config: trunk and head sizes (ensemble_size K, head_hidden, prior_scale alpha).
        num_actions: A.
        state_dim: S.
        max_len: positions (H + 1).
        generator: optional RNG for the init (default: torch's global RNG).
    """

    KIND = "spice"

    def __init__(
        self,
        config: ModelConfig,
        num_actions: int,
        state_dim: int,
        max_len: int,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__(config, num_actions, state_dim, max_len, generator)
        self.ensemble = ValueEnsemble(config.n_embd, num_actions, config.ensemble_size,
                                      config.head_hidden, config.prior_scale,
                                      depth=config.head_depth, generator=generator,
                                      kernel=config.head_kernel)
        # built last, so every other weight is initialised as without it (same generator draws)
        self.var_head = nn.Linear(config.n_embd, num_actions) if config.var_head else None
        if self.var_head is not None:
            with torch.no_grad():
                nn.init.normal_(self.var_head.weight, 0.0, 0.02, generator=generator)
                nn.init.zeros_(self.var_head.bias)

    def heads(self, latent: Tensor) -> SpiceOutput:
        """Policy logits, the ensemble's Q, mean and std (and the predictive variance, with
        the variance head) from latents [..., D]."""
        q = self.ensemble(latent)  # (..., K, A)
        prior_mean, prior_std = ensemble_mean_std(q)  # (..., A) x2
        pred_var = None
        if self.var_head is not None:  # softplus keeps it > 0 with a gradient everywhere
            pred_var = F.softplus(self.var_head(latent).float()) + VAR_FLOOR  # (..., A)
        return SpiceOutput(
            logits=self.policy_head(latent),  # (..., A)
            q=q,
            prior_mean=prior_mean,
            prior_std=prior_std,
            latent=latent,
            pred_var=pred_var,
        )

    def with_state_values(self, out: SpiceOutput, states: Tensor) -> SpiceOutput:
        """``out`` ([B, T+1, ...]) with position 0's values (every head's Q, their mean and
        std, the predictive variance) replaced by those of a query token holding ``states``
        [B, S] alone: the h = 0 prior of the state itself (``train.h0_prior="state"``). The
        policy logits and the latent stay the drawn query's. A one-token pass, so position 0
        of any sequence that starts with that token gives the same values (causal attention).
        """
        first = self.heads(self.trunk(query_features(states, self.num_actions)[:, None]))

        def swap(x: Tensor | None, x0: Tensor | None) -> Tensor | None:
            return None if x is None else torch.cat([x0.to(x.dtype), x[:, 1:]], 1)

        return dataclasses.replace(out, **{name: swap(getattr(out, name), getattr(first, name))
                                           for name in ("q", "prior_mean", "prior_std",
                                                        "pred_var")})

    def anchor_loss(self) -> Tensor:
        """The ensemble's anchor penalty (scalar)."""
        return self.ensemble.anchor_loss()

    @classmethod
    def head_activations(cls, config: ModelConfig, num_actions: int) -> int:
        """The K value heads' hidden layers dominate (the policy head is negligible)."""
        return config.ensemble_size * config.head_hidden * config.head_depth * 4
