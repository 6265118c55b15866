"""Short names for what a table or figure shows: a method's settings ("β=1", "β_t=√(2 ln t)",
"rbf τ=0.7") and a metric ("Cumulative regret"), in plain Unicode for figures and screens
and in LaTeX for a paper's tables (``tex=True``)."""

from __future__ import annotations

from typing import Any

from spice_ray.results.schema import metric_info, settings_of


def metric_name(metric: str) -> str:
    """``cumulative_regret`` -> "Cumulative regret": the registered label
    (``results.schema.METRICS``), else the name with spaces, first letter capitalised."""
    return metric_info(metric).label


def setting_parts(cfg: dict[str, Any], tex: bool = False) -> list[str]:
    """The settings that tell one method's rows apart, short: the exploration bonus (beta or
    its schedule; a fixed schedule is implied) and a kernel other than the uniform one."""
    parts = []
    if cfg.get("beta_schedule") == "sqrt2logt":
        parts.append(r"$\beta_t{=}\sqrt{2\ln t}$" if tex else "β_t=√(2 ln t)")
    elif cfg.get("beta_schedule") == "sqrt_log_sat":
        b = f"{cfg['beta']:g}"  # written with its schedule (AgentSpec.config_dict)
        parts.append(rf"$\beta_t{{=}}{b}\sqrt{{\ln SAt}}$" if tex else f"β_t={b}√(ln SAt)")
    elif "beta" in cfg:
        parts.append(rf"$\beta{{=}}{cfg['beta']:g}$" if tex else f"β={cfg['beta']:g}")
    if cfg.get("kernel") not in (None, "uniform"):
        kernel = str(cfg["kernel"]).replace("_", r"\_") if tex else str(cfg["kernel"])
        if "tau" in cfg:
            kernel += rf" $\tau{{=}}{cfg['tau']:g}$" if tex else f" τ={cfg['tau']:g}"
        parts.append(kernel)
    return parts


def setting_label(config: str, tex: bool = False) -> str:
    """:func:`setting_parts` of a row's JSON ``config``, joined ("" when it says none; a string
    that is not JSON is returned as it is)."""
    try:
        cfg = settings_of(config)
    except ValueError:  # not JSON, or not an object
        return str(config)
    return ", ".join(setting_parts(cfg, tex)) if cfg or config else str(config)
