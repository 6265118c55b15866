"""The fusion's tunable settings, declared once: each with the config field it sets, its
grid (``spice_ray/config/grids.py``), its default (the field's, on ``FusionConfig``) and the
methods it applies to, so the tuning stage builds every method's grid from declarations and
never from a method's name.

- ``beta``: posterior-UCB's beta at every value of its grid, then the theory schedule
  beta_t = sqrt(2 log t) (a point of its own, keyed ``beta_schedule``); every fused method and
  every method whose results read beta (``Method.settings``).
- ``tau``: the RBF bandwidth, for fused methods whose kernel reads one
  (``fusion.BANDWIDTH_KERNELS``) over states.
- ``width``: the learned prior's width for methods whose prior is the learned sigma_Q
  (``Method.scales_width``: SPICE): the paper's (s = 1), the one fitted on the validation
  contexts without labels (scale and decay), its constant scale where the fit narrows it with
  h, and the predictive-variance head's where the model has one; the fitted points take the
  likelihood variance fitted with s where the evidence is n-step returns.
- ``noise``: the likelihood variance sigma^2 of the other fused methods on n-step evidence:
  the config's, the fitted one, and the grid's decades.

A method's own settings (UCB's c, a plugin's epsilon) are :class:`~spice_ray.agents.Tunable` s
on the method (``Method.tunables``), crossed after these. What the "fitted" points read
(:class:`Fitted`) is measured on validation contexts by the tuning stage.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from spice_ray.agents.base import AgentSpec
from spice_ray.config import FusionConfig
from spice_ray.config.grids import GRIDS, Grid
from spice_ray.fusion import (
    BANDWIDTH_KERNELS,
    BETA_FREE_SCHEDULES,
    WIDTH_SCALE_DEFAULT,
    needs_nstep,
)


@dataclass(frozen=True)
class Fitted:
    """What the tuning stage fitted on validation contexts, read by the "fitted" points."""

    width: Mapping[str, Any] | None = None
    """``fit_width``'s record (scale, decay, constant_scale, predictive); None: s = 1, which
    only counts the grid (the dry run)."""
    noise: float | None = None
    """The likelihood variance fitted with s; None keeps ``fusion.noise_var``."""

    @classmethod
    def of(cls, width: float | Mapping[str, Any] | None, noise: float | None) -> Fitted:
        """From a scale s or a width record, and a variance."""
        return cls(width if isinstance(width, Mapping) or width is None
                   else {"scale": float(width)}, noise)

    def width_record(self) -> Mapping[str, Any]:
        """The width record, the paper's s where nothing was fitted."""
        return self.width if self.width is not None else {"scale": WIDTH_SCALE_DEFAULT}


@dataclass(frozen=True)
class Point:
    """One value of a tunable: its key and value in the tuning record's setting, and the
    fusion fields it sets."""

    key: str
    value: Any
    fields: Mapping[str, Any]


def fits_noise(spec: AgentSpec) -> bool:
    """Whether ``spec``'s grid fits the likelihood variance (fused, n-step evidence)."""
    return spec.info.fused and needs_nstep(spec.fusion)


def _fitted_noise(spec: AgentSpec, fitted: Fitted) -> dict[str, Any]:
    return {"noise_var": float(fitted.noise)} \
        if fitted.noise is not None and fits_noise(spec) else {}


def beta_points(betas: tuple[float, ...]) -> list[Point]:
    """Posterior-UCB's beta: each fixed value of ``betas``, then each schedule that does not
    read beta, a point of its own: the crossing the tuning grid and the sweeps share."""
    return [Point("beta", b, {"beta_schedule": "fixed", "beta": b}) for b in betas] \
        + [Point("beta_schedule", s, {"beta_schedule": s}) for s in sorted(BETA_FREE_SCHEDULES)]


def _beta(spec: AgentSpec, fitted: Fitted) -> list[Point]:
    return beta_points(BETAS)


def _tau(spec: AgentSpec, fitted: Fitted) -> list[Point]:
    return [Point("tau", t, {"tau": t}) for t in TAUS]


def _width(spec: AgentSpec, fitted: Fitted) -> list[Point]:
    width, noise = fitted.width_record(), _fitted_noise(spec, fitted)
    names = (*WIDTHS, *(("constant",) if width.get("decay") else ()),  # the fit narrows the
             *(("predictive",) if width.get("predictive") else ()))  # width with h; a var head
    fields = {"paper": lambda: {},
              "fitted": lambda: {"width_scale": float(width["scale"]),
                                 "width_decay": float(width.get("decay", 0.0))} | noise,
              "constant": lambda: {"width_scale": float(width["constant_scale"])} | noise,
              "predictive": lambda: {"width_source": "predictive"} | noise}
    return [Point("width", name, fields[name]()) for name in names]


def _noise(spec: AgentSpec, fitted: Fitted) -> list[Point]:
    fitted_var = _fitted_noise(spec, fitted)
    return [Point("noise", n, {} if n == "paper" else fitted_var if n == "fitted"
                  else {"noise_var": n}) for n in NOISES]


@dataclass(frozen=True)
class FusionTunable:
    """A fusion setting the tuning stage chooses (see the module docstring)."""

    name: str
    grid: Grid
    """Its values (``grid.tuning``) and the config field it sets (``grid.field``)."""
    applies: Callable[[AgentSpec], bool]
    """Whether a method (as the spec describes it) reads the setting."""
    points: Callable[[AgentSpec, Fitted], list[Point]]
    """Its grid points for a spec, given what was fitted on validation contexts."""

    @property
    def default(self) -> Any:
        """The value where it is not tuned: the field's default on ``FusionConfig``."""
        return {f.name: f.default for f in dataclasses.fields(FusionConfig)}[
            self.grid.field.partition(".")[2]]


BETAS = GRIDS["beta"].tuning
"""Fixed beta values of the grid (the theory schedule is one more point)."""
TAUS = GRIDS["tau"].tuning
"""Kernel bandwidths of the grid (kernels that read one, over states only)."""
WIDTHS = GRIDS["width"].tuning
"""The learned prior's width on the grid: the paper's sigma_Q and the fitted one (and
"constant" and "predictive" where they exist)."""
NOISES = GRIDS["noise_var"].tuning
"""sigma^2 of the other fused methods where targets are n-step returns."""

FUSION_TUNABLES: tuple[FusionTunable, ...] = (
    FusionTunable("beta", GRIDS["beta"],
                  lambda s: s.info.fused or "beta" in s.info.settings, _beta),
    FusionTunable("tau", GRIDS["tau"],
                  lambda s: s.info.fused and s.fusion.kernel in BANDWIDTH_KERNELS
                  and s.fusion.kernel_space == "state", _tau),
    FusionTunable("width", GRIDS["width"], lambda s: s.info.fused and s.info.scales_width,
                  _width),
    FusionTunable("noise", GRIDS["noise_var"],
                  lambda s: fits_noise(s) and not s.info.scales_width, _noise),
)
"""The fusion's tunables in the order the grid crosses them (beta slowest)."""
