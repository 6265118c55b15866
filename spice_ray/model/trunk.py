"""Causal GPT-2-style transformer trunk over [query; transitions] with a KV cache.

nanoGPT-shaped: pre-LayerNorm blocks, learned positional embeddings, one linear token embedding
(no vocabulary table: tokens are feature vectors [s, onehot(a), s', r], see ``tokens.py``).

Full forward: features [B, L, F] -> hidden states [B, L, D], output at position t having seen
positions 0..t. Incremental decoding: ``init_cache`` preallocates per-layer K/V tensors of the
maximum length, and ``forward(x, cache)`` appends x's positions after ``cache.length`` without
recomputing the prefix, so an online rollout of H steps costs O(H^2 D) instead of O(H^3 D).

The query token sits at position 0 and every later position attends to it, so a cache is valid
only while the query is unchanged (bandits: the constant zero state). A rollout whose query
changes every step (DPT-style darkroom, query = current state) must re-run the full forward on
[new query; context so far] instead.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, ClassVar, Self

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from spice_ray.config import ModelConfig, without_later_defaults
from spice_ray.model.tokens import (
    Tokens,
    query_features,
    sequence_features,
    token_dim,
    transition_features,
)


@dataclass
class KVCache:
    """Preallocated keys and values of every layer; mutable (``length`` grows as tokens append).

    Attributes:
        k: [n_layer, B, nh, M, hs] keys, M the maximum length.
        v: [n_layer, B, nh, M, hs] values.
        length: positions filled so far (the next token's position).
    """

    k: Tensor
    v: Tensor
    length: int = 0

    @property
    def max_len(self) -> int:
        """M, the preallocated length."""
        return int(self.k.shape[3])


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with an optional KV cache."""

    def __init__(self, n_embd: int, n_head: int, dropout: float) -> None:
        super().__init__()
        self.n_head = n_head
        self.n_embd = n_embd
        self.dropout = dropout
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.resid_dropout = nn.Dropout(dropout)
        self.plain = False
        """Attention in plain tensor operations instead of ``scaled_dot_product_attention``
        (the same function up to rounding): ``torch.func.vmap`` has no batching rule for SDPA's
        fused kernels and would loop over the mapped models, but batches these into one call
        over every model's sequences. A population's functional template sets it
        (:mod:`spice_ray.train.population`)."""

    def forward(self, x: Tensor, cache: KVCache | None = None, layer: int = 0) -> Tensor:
        """[B, L, D] -> [B, L, D]; with a cache, x holds positions cache.length.. (not advanced)."""
        B, L, D = x.shape
        nh, hs = self.n_head, D // self.n_head
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)  # 3 x (B, L, D)
        q = q.view(B, L, nh, hs).transpose(1, 2)  # (B, nh, L, hs)
        k = k.view(B, L, nh, hs).transpose(1, 2)  # (B, nh, L, hs)
        v = v.view(B, L, nh, hs).transpose(1, 2)  # (B, nh, L, hs)
        dropout_p = self.dropout if self.training else 0.0
        if cache is None and self.plain:
            if dropout_p > 0:
                raise ValueError("plain attention has no dropout: model.dropout must be 0 "
                                 "to train in a population")
            scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))  # (B, nh, L, L)
            causal = torch.ones(L, L, dtype=torch.bool, device=x.device).tril()
            y = scores.masked_fill(~causal, float("-inf")).softmax(-1) @ v  # (B, nh, L, hs)
        elif cache is None:
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)
        else:
            start, end = cache.length, cache.length + L
            cache.k[layer, :, :, start:end] = k
            cache.v[layer, :, :, start:end] = v
            k = cache.k[layer, :, :, :end]  # (B, nh, end, hs)
            v = cache.v[layer, :, :, :end]  # (B, nh, end, hs)
            q = q.to(k.dtype)
            if L == 1:  # one new token sees the whole prefix and itself: no mask
                y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p)
            elif start == 0:
                y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)
            else:  # SDPA's is_causal aligns top-left; new query i sits at absolute start + i
                rows = torch.arange(start, end, device=x.device).unsqueeze(1)  # (L, 1)
                cols = torch.arange(end, device=x.device).unsqueeze(0)  # (1, end)
                y = F.scaled_dot_product_attention(q, k, v, attn_mask=rows >= cols,
                                                   dropout_p=dropout_p)
        y = y.transpose(1, 2).contiguous().view(B, L, D)  # (B, L, D): re-assemble heads
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    """GPT-2 feed-forward: D -> 4D -> D with GELU."""

    def __init__(self, n_embd: int, dropout: float) -> None:
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.c_proj = nn.Linear(4 * n_embd, n_embd)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        """[..., D] -> [..., D]."""
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x))))


class Block(nn.Module):
    """Pre-LayerNorm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, n_embd: int, n_head: int, dropout: float) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head, dropout)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = MLP(n_embd, dropout)

    def forward(self, x: Tensor, cache: KVCache | None = None, layer: int = 0) -> Tensor:
        """[B, L, D] -> [B, L, D]."""
        x = x + self.attn(self.ln_1(x), cache, layer)
        return x + self.mlp(self.ln_2(x))


class Trunk(nn.Module):
    """GPT-2 trunk: features [B, L, F] -> hidden states [B, L, D] (after a final LayerNorm).

    Args:
        state_dim: S.
        num_actions: A (the token holds onehot(a), so F = 2S + A + 1).
        n_layer: transformer blocks.
        n_embd: width D.
        n_head: attention heads (D divisible by it).
        dropout: dropout probability (0 in the paper).
        max_len: positions the learned positional embedding covers (H + 1: query + H).
        generator: optional RNG for the weight init (default: torch's global RNG).
    """

    def __init__(
        self,
        state_dim: int,
        num_actions: int,
        n_layer: int,
        n_embd: int,
        n_head: int,
        dropout: float,
        max_len: int,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__()
        if n_embd % n_head:
            raise ValueError(f"n_embd={n_embd} is invalid: divisible by n_head={n_head}")
        self.state_dim = state_dim
        self.num_actions = num_actions
        self.n_layer = n_layer
        self.n_embd = n_embd
        self.n_head = n_head
        self.max_len = max_len
        self.embed = nn.Linear(token_dim(state_dim, num_actions), n_embd)
        self.wpe = nn.Embedding(max_len, n_embd)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(n_embd, n_head, dropout) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        self._init_weights(generator)

    @torch.no_grad()
    def _init_weights(self, generator: torch.Generator | None) -> None:
        # GPT-2 init: N(0, 0.02), zero biases, residual projections scaled by 1/sqrt(2 n_layer).
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * self.n_layer) if name.endswith("c_proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std, generator=generator)
            # LayerNorm weights keep their ones.

    def forward(self, x: Tensor, cache: KVCache | None = None) -> Tensor:
        """Hidden states of positions cache.length .. cache.length + L - 1 (0.. without a cache).

        Args:
            x: [B, L, F] token features.
            cache: optional KV cache; if given, the L tokens are appended to it and
                ``cache.length`` advances by L. Inference only (use under ``torch.no_grad()``).

        Returns:
            [B, L, D], position i having seen all earlier positions (cached ones included).
        """
        B, L, _ = x.shape
        start = 0 if cache is None else cache.length
        limit = self.max_len if cache is None else min(self.max_len, cache.max_len)
        if start + L > limit:
            raise ValueError(f"sequence of {start + L} positions exceeds max_len={limit}")
        pos = torch.arange(start, start + L, device=x.device)  # (L,)
        h = self.drop(self.embed(x) + self.wpe(pos))  # (B, L, D)
        for i, block in enumerate(self.blocks):
            h = block(h, cache, i)
        if cache is not None:
            cache.length += L
        return self.ln_f(h)

    def init_cache(
        self,
        batch_size: int,
        max_len: int | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> KVCache:
        """An empty cache for ``batch_size`` sequences of up to ``max_len`` positions.

        Defaults: ``self.max_len``, and the device and dtype of the trunk's parameters (pass
        ``torch.bfloat16`` when stepping under bf16 autocast).
        """
        ref = self.embed.weight
        M = self.max_len if max_len is None else max_len
        shape = (self.n_layer, batch_size, self.n_head, M, self.n_embd // self.n_head)
        kw = {"device": device or ref.device, "dtype": dtype or ref.dtype}
        return KVCache(k=torch.zeros(shape, **kw), v=torch.zeros(shape, **kw))

    def step(self, features: Tensor, cache: KVCache) -> Tensor:
        """Append one token [B, F] to the cache; its hidden state [B, D]."""
        return self(features.unsqueeze(1), cache).squeeze(1)

    def encode(self, tokens: Tokens) -> Tensor:
        """Full forward of [query; transitions]: [B, T+1, D]; position t saw the first t."""
        return self(sequence_features(tokens, self.num_actions).to(self.embed.weight.dtype))

    def step_query(self, query_state: Tensor, cache: KVCache) -> Tensor:
        """Append the query token [s_qry, 0, 0, 0] ([B, S]) at the cache's position: [B, D]."""
        dtype = self.embed.weight.dtype
        return self.step(query_features(query_state.to(dtype), self.num_actions), cache)

    def step_transition(
        self, state: Tensor, action: Tensor, reward: Tensor, next_state: Tensor, cache: KVCache
    ) -> Tensor:
        """Append one transition ([B, S], [B], [B], [B, S]) to the cache: [B, D]."""
        dtype = self.embed.weight.dtype
        x = transition_features(state.to(dtype), action, reward, next_state.to(dtype),
                                self.num_actions)  # (B, F)
        return self.step(x, cache)


class TrunkModel(nn.Module):
    """Base of SPICE and DPT: a :class:`Trunk` built from a ModelConfig plus heads on its latents.

    Subclasses set ``KIND`` and implement ``heads(latent)``, which maps latents [..., D] to an
    output dataclass with the same leading shape. This base provides the full forward, the
    incremental (KV-cache) API for online rollouts, and ``spec``/``from_spec`` so a checkpoint can
    rebuild the model from plain values.

    Args:
        config: trunk and head sizes.
        num_actions: A.
        state_dim: S.
        max_len: positions (H + 1: the query plus H transitions).
        generator: optional RNG for the init (default: torch's global RNG).
    """

    KIND: ClassVar[str] = ""

    def __init__(
        self,
        config: ModelConfig,
        num_actions: int,
        state_dim: int,
        max_len: int,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__()
        self.config = config
        self.num_actions = num_actions
        self.state_dim = state_dim
        self.max_len = max_len
        self.trunk = Trunk(state_dim, num_actions, config.n_layer, config.n_embd, config.n_head,
                           config.dropout, max_len, generator=generator)
        # Both SPICE and DPT have a policy head (D -> A); SPICE adds its value ensemble.
        self.policy_head = nn.Linear(config.n_embd, num_actions)
        with torch.no_grad():
            nn.init.normal_(self.policy_head.weight, 0.0, 0.02, generator=generator)
            nn.init.zeros_(self.policy_head.bias)

    def heads(self, latent: Tensor) -> Any:
        """Outputs of every head from latents [..., D]."""
        raise NotImplementedError

    @classmethod
    def head_activations(cls, config: ModelConfig, num_actions: int) -> int:
        """Floats the heads keep per position for the backward pass (the training memory
        estimate); the base: the policy head's logits and their gradients."""
        return 4 * num_actions

    def forward(self, tokens: Tokens) -> Any:
        """Outputs at every position 0..T (position t saw the query and t transitions)."""
        return self.heads(self.trunk.encode(tokens))

    def spec(self) -> dict[str, Any]:
        """Plain values that rebuild this architecture with :meth:`from_spec`."""
        return {
            "kind": self.KIND,
            "config": without_later_defaults("model", dataclasses.asdict(self.config)),
            "num_actions": self.num_actions,
            "state_dim": self.state_dim,
            "max_len": self.max_len,
        }

    @classmethod
    def from_spec(cls, spec: dict[str, Any], generator: torch.Generator | None = None) -> Self:
        """A freshly initialised model of the architecture ``spec`` describes."""
        if spec.get("kind") != cls.KIND:
            raise ValueError(f"spec kind {spec.get('kind')!r} is not {cls.KIND!r}")
        return cls(ModelConfig(**spec["config"]), int(spec["num_actions"]),
                   int(spec["state_dim"]), int(spec["max_len"]), generator=generator)

    def init_cache(
        self,
        batch_size: int,
        max_len: int | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> KVCache:
        """An empty KV cache (see :meth:`Trunk.init_cache`); start a rollout with step_query."""
        return self.trunk.init_cache(batch_size, max_len, device, dtype)

    def step_query(self, query_state: Tensor, cache: KVCache) -> Any:
        """Append the query token ([B, S]); outputs of that position ([B, ...])."""
        return self.heads(self.trunk.step_query(query_state, cache))

    def step_transition(
        self, state: Tensor, action: Tensor, reward: Tensor, next_state: Tensor, cache: KVCache
    ) -> Any:
        """Append one transition ([B, S], [B], [B], [B, S]); outputs of the new position."""
        return self.heads(self.trunk.step_transition(state, action, reward, next_state, cache))
