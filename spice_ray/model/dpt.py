"""DPT (and AD-BC) model: the same GPT-2 trunk as SPICE with a policy head only."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

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

    def heads(self, latent: Tensor) -> DptOutput:
        """Policy logits from latents [..., D]."""
        return DptOutput(logits=self.policy_head(latent), latent=latent)
