"""State-similarity kernels w_t in [0, 1] between a query feature and context features.

SPICE (paper sec. 3.3) weights each context transition by how similar its state is to the query
state before counting it as evidence about the query's action values. The features are trunk
latents h (paper) or raw states; these functions do not care which.

Every function here is pure torch and broadcasts over leading batch dims:
query ``[..., D]``, context ``[..., T, D]``, optional mask ``[..., T]`` (True = a real
transition; False = padding or a position outside the prefix in use), result ``[..., T]``.
Masked positions get weight exactly 0.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

KernelName = Literal["uniform", "rbf", "cosine", "exact"]

_COSINE_EPS = 1e-8


def _apply_mask(weights: Tensor, mask: Tensor | None) -> Tensor:
    """Zero the weights of masked-out positions. weights, mask: [..., T]."""
    if mask is None:
        return weights
    return torch.where(mask.bool(), weights, torch.zeros((), dtype=weights.dtype,
                                                         device=weights.device))


def uniform_weights(query: Tensor, context: Tensor, mask: Tensor | None = None) -> Tensor:
    """Uniform kernel: every (unmasked) context transition has weight 1.

    This is the tau -> infinity limit of the RBF kernel and the paper's choice for bandits,
    where all states are the same. The counts c_a are then plain pull counts.

    Args:
        query: [..., D] query feature (only its dtype/device and batch shape are used).
        context: [..., T, D] context features.
        mask: optional bool [..., T]; False positions get weight 0.

    Returns:
        [..., T] weights in {0, 1}.
    """
    shape = torch.broadcast_shapes(query.shape[:-1], context.shape[:-2]) + context.shape[-2:-1]
    weights = torch.ones(shape, dtype=context.dtype, device=context.device)  # (..., T)
    return _apply_mask(weights, mask)


def rbf_weights(
    query: Tensor, context: Tensor, tau: float, mask: Tensor | None = None
) -> Tensor:
    """RBF kernel w_t = exp(-||q - h_t||^2 / (2 tau^2)).

    The squared distance is computed as the sum of squared differences (not via the
    ``|q|^2 + |h|^2 - 2 q.h`` expansion), so it is exact and never negative; w = 1 exactly at
    distance 0.

    Args:
        query: [..., D] query feature h_qry.
        context: [..., T, D] context features h_t.
        tau: bandwidth (> 0).
        mask: optional bool [..., T]; False positions get weight 0.

    Returns:
        [..., T] weights in (0, 1] (0 where masked or underflowing).
    """
    if not tau > 0:
        raise ValueError(f"tau={tau!r} is invalid: the RBF bandwidth must be > 0")
    sq_dist = (query.unsqueeze(-2) - context).pow(2).sum(-1)  # (..., T)
    weights = torch.exp(-sq_dist / (2.0 * tau * tau))
    return _apply_mask(weights, mask)


def cosine_weights(query: Tensor, context: Tensor, mask: Tensor | None = None) -> Tensor:
    """Cosine kernel clamped at zero: w_t = max(0, cos(q, h_t)).

    Design choice: the *positive part* of the cosine similarity rather than the affine map
    (1 + cos) / 2. With the affine map an orthogonal (unrelated) state would still count as half
    an observation; with the clamp, orthogonal and opposite directions contribute no evidence and
    identical directions count fully. A zero-norm vector (query or context) has cosine 0 with
    everything (norms are floored at 1e-8), hence weight 0 -- so do not use this kernel on the
    bandits' constant zero state; use the uniform kernel there.

    Args:
        query: [..., D] query feature.
        context: [..., T, D] context features.
        mask: optional bool [..., T]; False positions get weight 0.

    Returns:
        [..., T] weights in [0, 1].
    """
    q_norm = query.norm(dim=-1, keepdim=True).clamp_min(_COSINE_EPS)  # (..., 1)
    c_norm = context.norm(dim=-1).clamp_min(_COSINE_EPS)  # (..., T)
    cos = (query.unsqueeze(-2) * context).sum(-1) / (q_norm * c_norm)  # (..., T)
    weights = cos.clamp(0.0, 1.0)  # clamp(max=1) absorbs rounding just above 1
    return _apply_mask(weights, mask)


def exact_weights(query: Tensor, context: Tensor, mask: Tensor | None = None) -> Tensor:
    """Exact-match kernel: w_t = 1 when h_t equals the query exactly, else 0 (tabular
    counting over discrete states: the count-based explorer's kernel).

    Args:
        query: [..., D] query feature.
        context: [..., T, D] context features.
        mask: optional bool [..., T]; False positions get weight 0.

    Returns:
        [..., T] weights in {0, 1}.
    """
    same = (query.unsqueeze(-2) == context).all(-1)  # (..., T)
    return _apply_mask(same.to(context.dtype), mask)


KERNELS = {
    "uniform": lambda q, c, tau, mask: uniform_weights(q, c, mask),
    "rbf": rbf_weights,
    "cosine": lambda q, c, tau, mask: cosine_weights(q, c, mask),
    "exact": lambda q, c, tau, mask: exact_weights(q, c, mask),
}
"""The kernel registry: name -> weights(query, context, tau, mask). ``FusionConfig.kernel``
takes its allowed names from here; a new kernel is one function and one entry."""
BANDWIDTH_KERNELS = frozenset({"rbf"})
"""Kernels that read ``tau``; every other kernel ignores it (a sweep or a tuning grid does not
vary tau for them: the runs would be identical)."""


TAU_DEFAULT = 0.5
"""The RBF kernel's bandwidth where nothing sets it (``fusion.tau``'s default): declared once
here."""


def kernel_weights(
    query: Tensor,
    context: Tensor,
    kind: KernelName,
    tau: float = TAU_DEFAULT,
    mask: Tensor | None = None,
) -> Tensor:
    """Dispatch to one of the kernels by name (``FusionConfig.kernel`` / ``FusionConfig.tau``).

    Args:
        query: [..., D] query feature.
        context: [..., T, D] context features.
        kind: a name in :data:`KERNELS`.
        tau: RBF bandwidth; ignored by the other kernels.
        mask: optional bool [..., T]; False positions get weight 0.

    Returns:
        [..., T] weights in [0, 1].
    """
    try:
        weights = KERNELS[kind]
    except KeyError:
        raise ValueError(f"kernel={kind!r} is invalid: one of {', '.join(KERNELS)}") from None
    return weights(query, context, tau, mask)
