"""Dataset batches -> model inputs, and the per-token feature vector [s, onehot(a), s', r].

A sequence is the query token followed by the context transitions (paper sec. 3.2):

    position 0:  [s_qry, 0,          0,   0  ]   the query alone
    position t:  [s_t,   onehot(a_t), s'_t, r_t]  transition t = 1..T

so the trunk output at position t has seen the query and the first t transitions.

State encoding is the environment's (``Environment.encode``): bandits have no state (a constant
1-dim zero); Darkroom states are the raw integer (x, y) grid coordinates cast to float,
unscaled, as in the DPT reference (the input linear layer learns any scaling it needs, and the
trunk's init keeps the first activations small: weights ~ N(0, 0.02)).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor


@dataclass(frozen=True)
class Tokens:
    """One batch of (query, context, label) sequences as float/long torch tensors.

    Attributes:
        query_state: [B, S] query state s_qry.
        states: [B, T, S] s_t of each context transition.
        actions: [B, T] long, a_t.
        rewards: [B, T] float, r_t.
        next_states: [B, T, S] s'_t (== s_{t+1} in a logged trajectory).
        label: [B] long, the training label a*.
        behaviour_probs: [B, A] behaviour propensities pi_b(a) (uniform 1/A for darkroom).
    """

    query_state: Tensor
    states: Tensor
    actions: Tensor
    rewards: Tensor
    next_states: Tensor
    label: Tensor
    behaviour_probs: Tensor

    @property
    def batch_size(self) -> int:
        """B."""
        return int(self.actions.shape[0])

    @property
    def context_len(self) -> int:
        """T, the number of context transitions."""
        return int(self.actions.shape[1])

    def to(self, device: torch.device | str) -> Tokens:
        """The same batch on ``device``."""
        return Tokens(**{f.name: getattr(self, f.name).to(device) for f in fields(self)})

    def prefix(self, length: int) -> Tokens:
        """The batch with only the first ``length`` context transitions (0 <= length <= T)."""
        if not 0 <= length <= self.context_len:
            raise ValueError(f"prefix length {length} is invalid: in [0, {self.context_len}]")
        return Tokens(
            query_state=self.query_state,
            states=self.states[:, :length],
            actions=self.actions[:, :length],
            rewards=self.rewards[:, :length],
            next_states=self.next_states[:, :length],
            label=self.label,
            behaviour_probs=self.behaviour_probs,
        )


def _tensor(x: Any, dtype: torch.dtype, device: torch.device | str | None) -> Tensor:
    if isinstance(x, np.ndarray):
        x = torch.from_numpy(x if x.flags.writeable and x.flags.c_contiguous else np.array(x))
    return torch.as_tensor(x, device=device).to(dtype)


def make_tokens(
    batch: Mapping[str, Any],
    env: Any,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
) -> Tokens:
    """Turn a dataset batch (numpy arrays or torch tensors) into :class:`Tokens`.

    Args:
        batch: dataset columns: ``actions`` [B, T], ``rewards`` [B, T], ``label`` [B] and
            whatever the environment's ``encode`` reads (its states, propensities).
        env: the environment (an ``Environment``, or an EnvConfig): it says what the query
            state, the context states and the behaviour propensities are.
        device: target device (default: where the arrays are, CPU for numpy).
        dtype: float dtype of states, rewards and propensities.

    Raises:
        ValueError: a column's shape does not fit the environment (names the column).
    """
    env = env.environment() if hasattr(env, "environment") else env
    actions = _tensor(batch["actions"], torch.long, device)  # (B, T)
    rewards = _tensor(batch["rewards"], dtype, device)  # (B, T)
    label = _tensor(batch["label"], torch.long, device)  # (B,)
    B, T = actions.shape
    dev = actions.device
    enc = env.encode(batch)
    out = {name: _tensor(getattr(enc, name), dtype, dev)
           for name in ("query_state", "states", "next_states", "behaviour_probs")}
    S, A = env.state_dim, env.num_actions
    want = {"query_state": (B, S), "states": (B, T, S), "next_states": (B, T, S),
            "behaviour_probs": (B, A)}
    for name, shape in want.items():
        if tuple(out[name].shape) != shape:
            raise ValueError(f"{name} of env.name={env.name} has shape "
                             f"{tuple(out[name].shape)}, expected {shape}")
    return Tokens(actions=actions, rewards=rewards, label=label, **out)


def token_dim(state_dim: int, num_actions: int) -> int:
    """F = 2S + A + 1, the width of one token's feature vector [s, onehot(a), s', r]."""
    return 2 * state_dim + num_actions + 1


def transition_features(
    states: Tensor, actions: Tensor, rewards: Tensor, next_states: Tensor, num_actions: int
) -> Tensor:
    """[s, onehot(a), s', r] for any leading shape.

    Args:
        states: [..., S]. actions: [...] long. rewards: [...]. next_states: [..., S].
        num_actions: A.

    Returns:
        [..., 2S + A + 1] in the dtype of ``states``.
    """
    onehot = F.one_hot(actions.long(), num_actions).to(states.dtype)  # (..., A)
    return torch.cat([states, onehot, next_states, rewards.to(states.dtype).unsqueeze(-1)], -1)


def query_features(query_state: Tensor, num_actions: int) -> Tensor:
    """The query token [s_qry, 0, 0, 0]: [..., S] -> [..., 2S + A + 1]."""
    S = query_state.shape[-1]
    pad = query_state.new_zeros(*query_state.shape[:-1], num_actions + S + 1)
    return torch.cat([query_state, pad], -1)


def sequence_features(tokens: Tokens, num_actions: int) -> Tensor:
    """Query token then transitions: [B, T+1, 2S + A + 1]."""
    q = query_features(tokens.query_state, num_actions).unsqueeze(1)  # (B, 1, F)
    x = transition_features(tokens.states, tokens.actions, tokens.rewards, tokens.next_states,
                            num_actions)  # (B, T, F)
    return torch.cat([q, x], 1)  # (B, T+1, F)
