"""What a study's tuning record says (``results/tuning.json``, written by
``spice_ray.tuning``): the choices as a report table, the paper-width choice beside a
width-tuned method, the fitted width scale, and whether a record can be trusted as it is.
Plain functions of the record's dict: no evaluation, no I/O."""

from __future__ import annotations

from typing import Any

import pandas as pd


def paper_choice(method: dict[str, Any]) -> dict[str, Any] | None:
    """The setting a width-tuned method's record chose among its paper-width points (the
    lowest validation score, the first in grid order on a tie), or None for a method without
    a width axis: "SPICE (paper)" runs there."""
    paper = [g for g in method["grid"] if g["setting"].get("width") == "paper"]
    if not paper:
        return None
    return dict(min(enumerate(paper), key=lambda ig: (ig[1]["mean"], ig[0]))[1]["setting"])


def fitted_scale(record: dict[str, Any] | None) -> float | None:
    """The width scale an experiment's tuning record fitted (``tune_experiment``), or None
    when it has none (no learned SPICE, or not tuned)."""
    for method in (record or {}).get("methods", {}).values():
        if "width" in method:
            return float(method["width"]["scale"])
    return None


def record_problem(record: dict[str, Any]) -> str | None:
    """Why an experiment's record of ``tuning.json`` cannot be used as it is (a choice that is
    not its grid's lowest validation score, the first in grid order on a tie; a paper-width
    choice that is not the best paper-width point; a record that is not the shape
    :func:`tune_experiment` writes), or None."""
    try:
        for label, method in record["methods"].items():
            grid = method["grid"]
            if grid:
                best = min(range(len(grid)), key=lambda i: (float(grid[i]["mean"]), i))
                if grid[best]["setting"] != method["chosen"]:
                    return (f"says {label} chose {method['chosen']}, not its grid's best "
                            f"{grid[best]['setting']}")
            if method.get("paper", paper_choice(method)) != paper_choice(method):
                return f"says {label}'s paper-width choice is {method['paper']}, not its best"
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        return f"is not a tuning record ({type(exc).__name__}: {exc})"
    return None


def choices_table(tuning: dict[str, Any]) -> pd.DataFrame:
    """One row per experiment and method: the chosen setting and its validation score."""
    rows = []
    for exp, rec in tuning.items():
        for label, m in rec.get("methods", {}).items():
            chosen = m["chosen"]
            best = next(g for g in m["grid"] if g["setting"] == chosen)
            setting = ", ".join(f"{k}={v}" for k, v in chosen.items()) or "-"
            if chosen.get("width") == "fitted":
                setting += f" (s={m['width']['scale']:.3g})"
            rows.append({"experiment": exp, "method": label, "chosen": setting,
                         "grid points": len(m["grid"]),
                         "validation regret": f"{best['mean']:.3g} +- {best['sem']:.2g}"})
            paper = paper_choice(m)
            if paper is not None:  # the paper's width, its beta chosen on the same grid
                best = next(g for g in m["grid"] if g["setting"] == paper)
                rows.append({"experiment": exp, "method": f"{label} (paper)",
                             "chosen": ", ".join(f"{k}={v}" for k, v in paper.items()),
                             "grid points": sum(g["setting"].get("width") == "paper"
                                                for g in m["grid"]),
                             "validation regret": f"{best['mean']:.3g} +- {best['sem']:.2g}"})
    return pd.DataFrame(rows)
