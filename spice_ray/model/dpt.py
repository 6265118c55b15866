"""DPT (and AD-BC) model: the same GPT-2 trunk as SPICE with a policy head only."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from spice_ray.config import ModelConfig
from spice_ray.model.trunk import TrunkModel


@dataclass(frozen=True)
class DptOutput:
    """Outputs at every position ([B, T+1, ...]) or one position ([B, ...]) when stepping.

    Attributes:
        logits: [B, T+1, A] policy logits.
        latent: [B, T+1, D] trunk hidden states.
    """

    logits: Tensor
    latent: Tensor


class DptModel(TrunkModel):
    """Trunk + policy head (D -> A); the ModelConfig's ensemble fields are ignored.

    Args:
        config: trunk sizes.
        num_actions: A.
        state_dim: S.
        max_len: positions (H + 1).
        generator: optional RNG for the init (default: torch's global RNG).
    """

    KIND = "dpt"

    def __init__(
        self,
        config: ModelConfig,
        num_actions: int,
        state_dim: int,
        max_len: int,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__(config, num_actions, state_dim, max_len, generator)
        self.policy_head = nn.Linear(config.n_embd, num_actions)
        with torch.no_grad():
            nn.init.normal_(self.policy_head.weight, 0.0, 0.02, generator=generator)
            nn.init.zeros_(self.policy_head.bias)

    def heads(self, latent: Tensor) -> DptOutput:
        """Policy logits from latents [..., D]."""
        return DptOutput(logits=self.policy_head(latent), latent=latent)
