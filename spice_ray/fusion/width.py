"""A label-free scale of the learned prior's width: one s on sigma_Q fitted to observed targets.

The fused posterior reads the prior N(Q-bar, max((s sigma_Q)^2, v_min)); s = 1 is the paper.
The ensemble's spread is not calibrated, so s is fitted on validation contexts without labels:
each transition t's target y_t is predicted by the prior of the position that has not seen it
(Q-bar_{t-1}(a_t), sigma_Q,{t-1}(a_t)), and s maximises the marginal likelihood of the targets,

    log L(s) = sum_i log N(y_i; m_i, s^2 v_i + sigma^2),     v_i = sigma_Q,i^2,

with sigma^2 the fusion's likelihood variance (floored at :data:`NOISE_VAR_FLOOR`, as the
posterior floors it). In u = s^2 the derivative is

    d log L / du = 1/2 sum_i v_i ((y_i - m_i)^2 - w_i) / w_i^2,     w_i = u v_i + sigma^2.

Plain tensor functions: no Ray, no I/O, no model. Everything is float64 on the CPU.
"""

from __future__ import annotations

import math
from typing import Any, Protocol

import torch
from torch import Tensor

from spice_ray.fusion.posterior import NOISE_VAR_FLOOR

GRID_PER_DECADE = 24
"""Points per decade of s of the coarse log grid (ratio 10^(1/24) ~ 1.10 between points)."""
_BISECTION_STEPS = 200
"""At most this many halvings of the bracket on log s (it stops at float64 resolution)."""
_CHUNK_ELEMENTS = 1 << 22
"""Grid points x targets evaluated at once (bounds the memory of the grid search)."""
_LOG_2PI = math.log(2.0 * math.pi)


WIDTH_SCALE_DEFAULT = 1.0
"""The prior width's scale s of the paper (sigma_Q itself; ``fusion.width_scale``'s default):
declared once here; results leave the scale out of their config at this value."""
WIDTH_DECAY_DEFAULT = 0.0
"""The width's decay with the context length (``fusion.width_decay``): constant, the paper's."""
WIDTH_SOURCE_DEFAULT = "ensemble"
"""Where the learned prior's sd comes from (``fusion.width_source``): the ensemble, the paper's."""
WIDTH_FIELDS = {"width_scale": WIDTH_SCALE_DEFAULT, "width_decay": WIDTH_DECAY_DEFAULT,
                "width_source": WIDTH_SOURCE_DEFAULT}
"""The learned prior's width settings and their defaults (the paper's width)."""


def width_settings(fusion: Any) -> dict[str, Any]:
    """The width settings of ``fusion`` that are not at their default (:data:`WIDTH_FIELDS`):
    what a row's config records of the width, so a config at the paper's width (and every
    table written before a field existed) is unchanged."""
    return {name: getattr(fusion, name) for name, default in WIDTH_FIELDS.items()
            if getattr(fusion, name) != default}


def width_profile(h: Tensor, decay: float) -> Tensor:
    """g(h) = (1 + decay h)^(-1/2), float64: how the learned prior's width narrows with the
    context length h (``FusionConfig.width_decay``; 0: constant, the paper's). A Normal
    posterior's sd falls as 1 / sqrt(n0 + n) with n observations; the ensemble's spread
    sigma_Q does not, so the fitted width may take this shape with n0 = 1 / decay."""
    return (1.0 + float(decay) * torch.as_tensor(h, dtype=torch.float64)) ** -0.5


def scaled_prior_std(prior_std: Tensor, width_scale: float, decay: float = 0.0,
                     h: Tensor | int | None = None) -> Tensor:
    """s g(h) sigma_Q: the learned prior's std scaled by ``FusionConfig.width_scale`` and, with
    a ``decay`` > 0, narrowed by :func:`width_profile` at context length ``h`` (broadcast
    against ``prior_std``), any shape.

    With s = 1 and no decay the tensor itself is returned (same values, dtype and device, so
    the posterior is bit-identical to the unscaled one); otherwise the product in float64 (the
    posterior's dtype), on the tensor's device.
    """
    if width_scale == WIDTH_SCALE_DEFAULT and decay == WIDTH_DECAY_DEFAULT:
        return prior_std
    out = prior_std.to(torch.float64) * float(width_scale)
    if decay != WIDTH_DECAY_DEFAULT:
        if h is None:
            raise ValueError("a width decay needs the context length h")
        out = out * width_profile(torch.as_tensor(h), decay).to(out.device)
    return out


class WidthSettings(Protocol):
    """What :func:`learned_prior_std` reads of the fusion's settings (the run config's
    ``fusion`` section has these fields and more)."""

    width_source: str
    width_scale: float
    width_decay: float
    noise_var: float


def learned_prior_std(fusion: WidthSettings, prior_std: Tensor, h: Tensor | int | None = None,
                      pred_var: Tensor | None = None) -> Tensor:
    """The learned prior's sd the fusion uses, by ``fusion.width_source``:

    - "ensemble" (the paper): s g(h) sigma_Q, :func:`scaled_prior_std` of ``prior_std``;
    - "predictive": s sqrt(max(v - sigma^2, 0)) from the model's predictive variance v of the
      next target (``pred_var``), less the likelihood variance sigma^2 (``fusion.noise_var``,
      floored as the posterior floors it): what remains of the target's spread once its noise
      is taken out is the uncertainty about its mean. (v_min floors it in the posterior.)

    Args:
        fusion: width_source, width_scale, width_decay, noise_var.
        prior_std: sigma_Q, any shape.
        h: the context length(s), broadcast against ``prior_std`` (a decay needs it).
        pred_var: the predictive variance, shape of ``prior_std`` (the predictive source
            needs it).

    Raises:
        ValueError: the predictive source without ``pred_var`` (a model without a variance
            head: ``model.var_head``).
    """
    if fusion.width_source == "predictive":
        if pred_var is None:
            raise ValueError("fusion.width_source=predictive needs a model with a predictive-"
                             "variance head (model.var_head=true); this model has none")
        noise = max(float(fusion.noise_var), NOISE_VAR_FLOOR)
        sd = (pred_var.to(torch.float64) - noise).clamp(min=0.0).sqrt()
        return sd * float(fusion.width_scale)
    return scaled_prior_std(prior_std, fusion.width_scale, fusion.width_decay, h)


def _as_float64(x: Tensor) -> Tensor:
    return torch.as_tensor(x).detach().to("cpu", torch.float64)


def _inputs(mean: Tensor, std: Tensor, targets: Tensor, noise_var: float,
            mask: Tensor | None) -> tuple[Tensor, Tensor, float]:
    """Checked, flattened inputs: squared residuals r^2 [N], prior variances v [N], sigma^2."""
    noise_var = float(noise_var)
    if not math.isfinite(noise_var) or noise_var < 0:
        raise ValueError(f"noise_var={noise_var!r} is invalid: a finite float >= 0")
    named = {"mean": _as_float64(mean), "std": _as_float64(std),
             "targets": _as_float64(targets)}
    shape = named["targets"].shape
    for name, x in named.items():
        if x.shape != shape:
            raise ValueError(f"{name} has shape {tuple(x.shape)}, targets {tuple(shape)}: "
                             "mean, std and targets must have one shape")
    if mask is not None:
        mask = torch.as_tensor(mask).to("cpu")
        if mask.shape != shape:
            raise ValueError(f"mask has shape {tuple(mask.shape)}, targets {tuple(shape)}")
        named = {name: x[mask.bool()] for name, x in named.items()}  # (N,) each
    else:
        named = {name: x.reshape(-1) for name, x in named.items()}  # (N,) each
    if named["targets"].numel() == 0:
        raise ValueError("targets is empty" + (" where mask is True" if mask is not None else "")
                         + ": the width needs at least one target")
    for name, x in named.items():
        if not bool(torch.isfinite(x).all()):
            raise ValueError(f"{name} has non-finite values (NaN or inf)")
    if bool((named["std"] < 0).any()):
        raise ValueError("std has negative values: it is a standard deviation (>= 0)")
    r2 = (named["targets"] - named["mean"]).square()  # (N,)
    return r2, named["std"].square(), max(noise_var, NOISE_VAR_FLOOR)


def _log_lik(u: Tensor, r2: Tensor, v: Tensor, noise: float) -> Tensor:
    """Summed log-likelihood at each u = s^2 of ``u`` [G] -> [G] (chunked over G)."""
    step = max(1, _CHUNK_ELEMENTS // max(1, r2.numel()))
    out = []
    for lo in range(0, u.numel(), step):
        w = u[lo:lo + step, None] * v[None, :] + noise  # (g, N)
        out.append(-0.5 * (torch.log(w) + r2[None, :] / w).sum(-1) - 0.5 * r2.numel() * _LOG_2PI)
    return torch.cat(out)


def _grad(u: float, r2: Tensor, v: Tensor, noise: float) -> float:
    """d log L / du at u = s^2."""
    w = u * v + noise  # (N,)
    return float(0.5 * (v * (r2 - w) / w.square()).sum())


def fit_width_scale(mean: Tensor, std: Tensor, targets: Tensor, noise_var: float, *,
                    mask: Tensor | None = None,
                    bounds: tuple[float, float] = (1e-3, 1e3)) -> float:
    """The s >= 0 maximising sum log N(y; mean, s^2 std^2 + noise_var) over the targets.

    A coarse log grid on s over ``bounds`` (:data:`GRID_PER_DECADE` points a decade) picks the
    best point; the root of d log L / du between its neighbours is then found by bisection on
    log s, to float64 resolution (kept only if it beats the grid point: the likelihood need not
    be unimodal). The value at s = 0 is compared last: when the likelihood is largest there
    (e.g. the residuals are no larger than the noise), the result is 0.0, a prior of width
    v_min alone. At the upper bound the result is ``bounds[1]``. Ties go to the smaller s
    (std all zero gives 0.0). Deterministic; float64 internally.

    Args:
        mean: predictions m_i, e.g. Q-bar_{t-1}(a_t) [...] (any shape, same for all three).
        std: prior std sigma_Q,{t-1}(a_t) (>= 0), shape of ``mean``.
        targets: observed targets y_t, shape of ``mean``.
        noise_var: likelihood variance sigma^2 (>= 0; floored at :data:`NOISE_VAR_FLOOR`).
        mask: optional bool, shape of ``mean``: only True entries count (the others may hold
            anything, NaN included).
        bounds: (lo, hi), 0 < lo < hi, the range of s searched besides s = 0.

    Returns:
        s as a float: 0.0 or in [lo, hi].

    Raises:
        ValueError: naming the argument: non-finite values, negative std or noise_var, shapes
            that differ, no target, or bad bounds.
    """
    lo, hi = (float(b) for b in bounds)
    if not (math.isfinite(lo) and math.isfinite(hi) and 0 < lo < hi):
        raise ValueError(f"bounds={bounds!r} is invalid: finite (lo, hi) with 0 < lo < hi")
    r2, v, noise = _inputs(mean, std, targets, noise_var, mask)
    num = int(math.ceil(GRID_PER_DECADE * math.log10(hi / lo))) + 1
    log_s = torch.linspace(math.log(lo), math.log(hi), num, dtype=torch.float64)  # (G,)
    ll = _log_lik(torch.exp(2.0 * log_s), r2, v, noise)  # (G,)
    i = int(torch.argmax(ll))  # the first maximum: ties go to the smaller s
    best_log_s, best_ll = float(log_s[i]), float(ll[i])

    def grad(x: float) -> float:
        return _grad(math.exp(2.0 * x), r2, v, noise)

    # Bisect d log L / du (the sign of d log L / d log s) on each side of the best grid point
    # where it changes sign from + to -: a local maximum lies inside.
    for a, b in ((i - 1, i), (i, i + 1)):
        if a < 0 or b >= num:
            continue
        left, right = float(log_s[a]), float(log_s[b])
        if not (grad(left) > 0 > grad(right)):
            continue
        for _ in range(_BISECTION_STEPS):
            mid = 0.5 * (left + right)
            if not left < mid < right:
                break  # float64 resolution reached
            if grad(mid) > 0:
                left = mid
            else:
                right = mid
        x = 0.5 * (left + right)
        value = float(_log_lik(torch.tensor([math.exp(2.0 * x)], dtype=torch.float64),
                               r2, v, noise)[0])
        if value > best_ll:
            best_log_s, best_ll = x, value
    at_zero = float(_log_lik(torch.zeros(1, dtype=torch.float64), r2, v, noise)[0])
    if at_zero >= best_ll:
        return 0.0
    return min(max(math.exp(best_log_s), lo), hi)


def width_log_likelihood(mean: Tensor, std: Tensor, targets: Tensor, noise_var: float,
                         scale: float, *, mask: Tensor | None = None) -> float:
    """Mean log N(y; mean, scale^2 std^2 + noise_var) per target (inputs as
    :func:`fit_width_scale`; ``noise_var`` floored the same way).

    Raises:
        ValueError: as :func:`fit_width_scale`, or ``scale`` not finite and >= 0.
    """
    scale = float(scale)
    if not math.isfinite(scale) or scale < 0:
        raise ValueError(f"scale={scale!r} is invalid: a finite float >= 0")
    r2, v, noise = _inputs(mean, std, targets, noise_var, mask)
    u = torch.tensor([scale * scale], dtype=torch.float64)
    return float(_log_lik(u, r2, v, noise)[0]) / r2.numel()


NOISE_GRID_PER_DECADE = 12
"""Points per decade of sigma^2 of :func:`fit_width_and_noise`'s profile grid."""
_GOLDEN_STEPS = 40
"""Golden-section steps on log sigma^2 between the best grid point's neighbours (each shrinks
the bracket by 0.618: 40 leave it about 1e-9 of sigma^2 wide)."""


def fit_width_and_noise(mean: Tensor, std: Tensor, targets: Tensor, *,
                        mask: Tensor | None = None,
                        bounds: tuple[float, float] = (1e-3, 1e3),
                        noise_bounds: tuple[float, float] = (1e-4, 1e4)) -> tuple[float, float]:
    """(s, sigma^2) maximising sum log N(y; mean, s^2 std^2 + sigma^2) jointly, label-free.

    Where the evidence targets are n-step returns rather than rewards, the fusion's likelihood
    variance sigma^2 is the return's variance about its mean, which no config constant knows;
    the same one-step-ahead predictions that fit s identify it, because the prior part s^2
    std^2 changes from target to target and sigma^2 does not. The profile likelihood
    max_s log L(s, sigma^2) (each s by :func:`fit_width_scale`) is maximised over a log grid of
    sigma^2 in ``noise_bounds`` (:data:`NOISE_GRID_PER_DECADE` a decade), then refined by
    golden-section search on log sigma^2 between the best point's neighbours (kept only if it
    beats the grid point). Ties go to the smaller sigma^2. When std is constant over the
    targets, only s^2 std^2 + sigma^2 is identified and the smallest sigma^2 of the ridge's
    grid points wins. Deterministic; float64 internally.

    Args:
        mean, std, targets, mask, bounds: as :func:`fit_width_scale` (``bounds`` for s).
        noise_bounds: (lo, hi), 0 < lo < hi, the range of sigma^2 allowed; the search covers
            its part between 1e-4 and 4 times the mean squared residual (sigma^2's optimum at
            s = 0; an optimum beyond 4 times it is returned at that edge) and above the
            posterior's floor (:data:`NOISE_VAR_FLOOR`).

    Returns:
        (s, sigma^2): s as :func:`fit_width_scale` returns it at that sigma^2.

    Raises:
        ValueError: as :func:`fit_width_scale`, or bad ``noise_bounds``.
    """
    lo, hi = (float(b) for b in noise_bounds)
    if not (math.isfinite(lo) and math.isfinite(hi) and 0 < lo < hi):
        raise ValueError(f"noise_bounds={noise_bounds!r} is invalid: finite (lo, hi) with "
                         "0 < lo < hi")
    lo = max(lo, NOISE_VAR_FLOOR)
    r2, v, _ = _inputs(mean, std, targets, lo, mask)  # checked, flattened once
    zeros = torch.zeros_like(r2)

    def profile(log_noise: float) -> tuple[float, float]:
        """(best s, log L at it) for sigma^2 = exp(log_noise)."""
        noise = math.exp(log_noise)
        s = fit_width_scale(zeros, v.sqrt(), r2.sqrt(), noise, bounds=bounds)
        u = torch.tensor([s * s], dtype=torch.float64)
        return s, float(_log_lik(u, r2, v, noise)[0])

    # sigma^2 alone (s = 0) would be the mean squared residual: the grid spans 1e-4 to 4
    # times it (inside noise_bounds); an optimum beyond is returned at the grid's edge
    scale = float(r2.mean())
    lo, hi = max(lo, 1e-4 * scale), max(min(hi, 4.0 * scale), lo * 1.0001)
    num = max(2, int(math.ceil(NOISE_GRID_PER_DECADE * math.log10(hi / lo))) + 1)
    grid = torch.linspace(math.log(lo), math.log(hi), num, dtype=torch.float64).tolist()
    fits = [profile(x) for x in grid]
    i = max(range(num), key=lambda j: (fits[j][1], -j))  # the first maximum
    best = (fits[i][1], grid[i], fits[i][0])
    left, right = grid[max(i - 1, 0)], grid[min(i + 1, num - 1)]
    ratio = (math.sqrt(5.0) - 1.0) / 2.0
    a, b = right - ratio * (right - left), left + ratio * (right - left)
    fa, fb = profile(a), profile(b)
    for _ in range(_GOLDEN_STEPS):
        if not left < a < b < right:
            break  # float64 resolution reached
        if fa[1] >= fb[1]:
            right, b, fb = b, a, fa
            a = right - ratio * (right - left)
            fa = profile(a)
        else:
            left, a, fa = a, b, fb
            b = left + ratio * (right - left)
            fb = profile(b)
    for x, (s, value) in ((a, fa), (b, fb)):
        if value > best[0]:
            best = (value, x, s)
    return best[2], min(max(math.exp(best[1]), lo), hi)


_DECAY_ROUNDS = 4
"""Rounds of :func:`fit_width_decay`'s coordinate ascent when sigma^2 is fitted too."""
DECAYS = (0.0, *(10.0 ** (k / 4.0) for k in range(-12, 5)))
"""The width decays :func:`fit_width_decay` compares: 0 (a constant width) and 1e-3 to 10 at
four points a decade (n0 = 1 / decay from 1,000 transitions down to 0.1)."""


def fit_width_decay(mean: Tensor, std: Tensor, targets: Tensor, h: Tensor,
                    noise_var: float | None, *, mask: Tensor | None = None,
                    decays: tuple[float, ...] = DECAYS,
                    bounds: tuple[float, float] = (1e-3, 1e3)) -> tuple[float, float, float]:
    """(s, decay, sigma^2) maximising sum log N(y; mean, s^2 g(h)^2 std^2 + sigma^2), label-free,
    with g = :func:`width_profile`: for each decay of ``decays`` the scale s is fitted as for a
    constant width, and the decay with the highest likelihood wins (the first on a tie, so 0
    when nothing is gained). One scale cannot fit a prior whose right width falls several-fold
    over the context while sigma_Q stays flat; this shape can.

    With ``noise_var`` None, sigma^2 is fitted too, by coordinate ascent: (s, sigma^2) jointly
    at the current decay (:func:`fit_width_and_noise`), then the decay with sigma^2 held, until
    the decay repeats (at most :data:`_DECAY_ROUNDS` rounds; each round can only raise the
    likelihood, and it starts from the constant width's joint fit).

    Args:
        mean, std, targets, mask, bounds: as :func:`fit_width_scale`.
        h: the context length each prediction was made at (the position that has not seen its
            target), shape of ``mean``.
        noise_var: sigma^2, or None to fit it too.

    Raises:
        ValueError: as :func:`fit_width_scale`, a negative decay or h, or no decay.
    """
    if not decays or any(not math.isfinite(d) or d < 0 for d in decays):
        raise ValueError(f"decays={decays!r} is invalid: finite values >= 0, at least one")
    h = torch.as_tensor(h, dtype=torch.float64)
    if h.shape != torch.as_tensor(mean).shape or bool((h < 0).any()):
        raise ValueError("h must have the shape of mean and hold context lengths >= 0")
    std = torch.as_tensor(std, dtype=torch.float64)

    def best_decay(noise: float) -> tuple[float, float]:
        """(decay, s) of the highest likelihood at sigma^2 = noise (the first on a tie)."""
        best: tuple[float, float, float] | None = None  # (log L, decay, s)
        for decay in decays:
            narrowed = std * width_profile(h, decay)
            s = fit_width_scale(mean, narrowed, targets, noise, mask=mask, bounds=bounds)
            value = width_log_likelihood(mean, narrowed, targets, noise, s, mask=mask)
            if best is None or value > best[0]:
                best = (value, float(decay), s)
        assert best is not None
        return best[1], best[2]

    if noise_var is not None:
        decay, s = best_decay(float(noise_var))
        return s, decay, float(noise_var)
    decay = 0.0 if 0.0 in decays else decays[0]
    s, noise = fit_width_and_noise(mean, std * width_profile(h, decay), targets, mask=mask,
                                   bounds=bounds)
    for _ in range(_DECAY_ROUNDS):
        new, _ = best_decay(noise)
        if new == decay:
            break
        decay = new
        s, noise = fit_width_and_noise(mean, std * width_profile(h, decay), targets,
                                       mask=mask, bounds=bounds)
    return s, decay, noise
