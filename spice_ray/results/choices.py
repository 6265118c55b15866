"""What a study's tuning record says (``results/tuning.json``, written by
``spice_ray.study.tuning``): the choices as a report table, the paper-width choice beside a
width-tuned method, the fitted width scale, and whether a record can be trusted as it is.
Plain functions of the record's dict: no evaluation, no I/O."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pandas as pd

from spice_ray.common.metrics import CUMULATIVE_REGRET
from spice_ray.results.summary import final_values, task_means
from spice_ray.results.tables import list_experiments, load


def best_index(grid: list[dict[str, Any]]) -> int:
    """The grid point a choice must be: the lowest mean validation score, the first in grid
    order on a tie (``grid``: records {"setting", "mean", ...} in grid order, non-empty)."""
    return min(range(len(grid)), key=lambda i: (float(grid[i]["mean"]), i))


RESOLVE_SES = 2.0
"""A grid point within this many standard errors of the best (its paired difference over the
validation tasks) is one the validation set cannot tell from it."""


def resolution(grid: list[dict[str, Any]]) -> dict[str, Any]:
    """How firmly the validation set makes a choice (``grid``: records {"setting", "mean",
    "paired_se"} in grid order, non-empty; ``paired_se`` is the SEM over tasks of the point's
    difference from the lowest-mean point, 0 for that point).

    The points within :data:`RESOLVE_SES` paired SEs of the lowest mean are "tied" with it;
    the choice is resolved when none is. Either way it is the lowest mean (the first in grid
    order on an exact tie), and the record says whether it is resolved. A fixed order among the
    tied points (the first in grid order: smaller beta, the paper's width) was tried on the
    template bandit's `small` study and rejected: it moved the flat, context-free and Bayes rows
    to points 0.4-0.9 worse on validation while SPICE's tied set began with its best, so it
    handicapped the references every share is measured against.

    Returns:
        {"chosen", "best", "runner_up" (the second-lowest mean, None for a one-point grid),
        "margin" (runner-up mean - best mean), "se" (its paired SEM), "tied" (how many points
        the validation set cannot tell from the best, the best included), "resolved"}.
    """
    best = best_index(grid)
    low = float(grid[best]["mean"])
    tied = [i for i, g in enumerate(grid)
            if i == best or float(g["mean"]) - low <= RESOLVE_SES * float(g["paired_se"])]
    others = [i for i in range(len(grid)) if i != best]
    runner = min(others, key=lambda i: (float(grid[i]["mean"]), i)) if others else None
    return {"chosen": dict(grid[best]["setting"]), "best": dict(grid[best]["setting"]),
            "runner_up": None if runner is None else dict(grid[runner]["setting"]),
            "margin": None if runner is None else float(grid[runner]["mean"]) - low,
            "se": None if runner is None else float(grid[runner]["paired_se"]),
            "tied": len(tied), "resolved": len(tied) == 1}


def paper_choice(method: dict[str, Any]) -> dict[str, Any] | None:
    """The setting a width-tuned method's record chose among its paper-width points
    (:func:`best_index` of them), or None for a method without a width axis: "SPICE (paper)"
    runs there."""
    paper = [g for g in method["grid"] if g["setting"].get("width") == "paper"]
    if not paper:
        return None
    return dict(paper[best_index(paper)]["setting"])


def _width(record: dict[str, Any] | None) -> dict[str, Any] | None:
    """The width record (``fit_width``'s) of an experiment's tuning record, or None."""
    return next((m["width"] for m in (record or {}).get("methods", {}).values()
                 if "width" in m), None)


def fitted_scale(record: dict[str, Any] | None) -> float | None:
    """The width scale an experiment's tuning record fitted (``tune_experiment``), or None
    when it has none (no learned SPICE, or not tuned)."""
    width = _width(record)
    return None if width is None else float(width["scale"])


def fitted_decay(record: dict[str, Any] | None) -> float:
    """How the fitted width narrows with the context length (``fusion.width_decay``) in an
    experiment's tuning record; 0 (constant) when none was fitted."""
    return float((_width(record) or {}).get("decay", 0.0))


def fitted_noise(record: dict[str, Any] | None) -> float | None:
    """The likelihood variance an experiment's tuning record fitted with the width scale
    (where the evidence targets are n-step returns), or None when it fitted none."""
    noise = (record or {}).get("noise_var")
    return float(noise["fitted"]) if noise else None


def record_problem(record: dict[str, Any]) -> str | None:
    """Why an experiment's record of ``tuning.json`` cannot be used as it is (a choice that is
    not the one :func:`resolution` makes of its grid's validation scores; a record from before
    choices were resolved; a paper-width choice that is not the best paper-width point; a
    record that is not the shape :func:`tune_experiment` writes), or None."""
    try:
        for label, method in record["methods"].items():
            grid = method["grid"]
            if grid and any("paired_se" not in g for g in grid):
                return (f"holds {label}'s scores without their paired standard errors (written "
                        "before choices were resolved)")
            made = resolution(grid) if grid else {"chosen": {}}
            if made["chosen"] != method["chosen"]:
                return (f"says {label} chose {method['chosen']}, not the choice its grid's "
                        f"scores make, {made['chosen']}")
            if grid and method.get("resolution") != made:
                return f"says {label}'s choice is {method.get('resolution')}, not {made}"
            paper = paper_choice(method)
            if method.get("paper", paper) != paper:
                return f"says {label}'s paper-width choice is {method['paper']}, not its best"
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        return f"is not a tuning record ({type(exc).__name__}: {exc})"
    return None


def choices_table(tuning: dict[str, Any]) -> pd.DataFrame:
    """One row per experiment and method: the chosen setting, its validation score, and how
    firmly the validation set makes the choice (:func:`resolution`: the runner-up's margin
    over the best with its paired SEM; "unresolved" where other points are within
    :data:`RESOLVE_SES` paired SEs: the lowest mean is then the validation set's noise-level
    pick)."""
    rows = []

    def row(exp: str, label: str, grid: list[dict[str, Any]], chosen: dict[str, Any],
            note: str = "", made: dict[str, Any] | None = None) -> None:
        best = next(g for g in grid if g["setting"] == chosen)
        firm = "-"
        if made is not None and made["runner_up"] is not None:
            firm = (f"{made['margin']:.3g} +- {made['se']:.2g}: "
                    + ("resolved" if made["resolved"] else
                       f"unresolved ({made['tied']} points within 2 paired SEs)"))
        rows.append({"experiment": exp, "method": label,
                     "chosen": (", ".join(f"{k}={v}" for k, v in chosen.items()) or "-") + note,
                     "grid points": len(grid),
                     "validation regret": f"{best['mean']:.3g} +- {best['sem']:.2g}",
                     "runner-up margin": firm})

    for exp, rec in tuning.items():
        noise = fitted_noise(rec)
        sigma2 = f"sigma^2={noise:.3g}" if noise is not None else ""
        model = (rec.get("models") or {}).get("spice")
        if model:  # the loss weights, chosen first (spice_ray.study.loss_weights)
            best = next(g for g in model["grid"] if g["setting"] == model["chosen"])
            rows.append({"experiment": exp, "method": "SPICE's loss weights",
                         "chosen": ", ".join(f"{k}={v:g}" for k, v in model["chosen"].items())
                         + f" (log-lik {best['log_lik']:+.4f} per reward, no label read)",
                         "grid points": len(model["grid"]), "validation regret": "-",
                         "runner-up margin": "-"})
        for label, m in rec.get("methods", {}).items():
            note = ""
            if m["chosen"].get("width") == "fitted":
                note = f" (s={m['width']['scale']:.3g}" + (f", {sigma2})" if sigma2 else ")")
            elif m["chosen"].get("noise") == "fitted":
                note = f" ({sigma2})"
            row(exp, label, m["grid"], m["chosen"], note, m.get("resolution"))
            paper = paper_choice(m)
            if paper is not None:  # the paper's width, its beta chosen on the same grid
                row(exp, f"{label} (paper)", [g for g in m["grid"]
                                              if g["setting"].get("width") == "paper"], paper)
    return pd.DataFrame(rows)


def _key(text: str) -> str:
    """A metric or parameter name every tracker accepts (letters, digits, _ - . /)."""
    return re.sub(r"[^A-Za-z0-9_\-./]+", "_", text).strip("_")


def headline(run_dir: Path, experiments: list[str], records: dict[str, Any]
             ) -> tuple[dict[str, float], dict[str, Any]]:
    """The study's headline as tracker metrics and parameters: each tuned method's mean final
    regret over the eval tasks (``<experiment>/<method>/final_regret``) and the setting it was
    chosen at (``<experiment>/<method>/<name>``, from the tuning ``records``)."""
    have = set(list_experiments(run_dir))
    metrics: dict[str, float] = {}
    for exp in experiments:
        if f"{exp}_tuned" not in have:
            continue
        final = task_means(final_values(load(run_dir, f"{exp}_tuned"), CUMULATIVE_REGRET))
        for method, value in final.groupby("method")["value"].mean().items():
            metrics[f"{_key(exp)}/{_key(str(method))}/final_regret"] = float(value)
    tuning = {exp: r for exp, r in records.items() if exp in experiments}
    params = {f"{_key(exp)}/{_key(label)}/{_key(name)}": value
              for exp, record in tuning.items()
              for label, method in record.get("methods", {}).items()
              for name, value in method["chosen"].items()}
    params |= {f"{_key(exp)}/{_key(label)}/width_{key}": value
               for exp, record in tuning.items()
               for label, method in record.get("methods", {}).items()
               if method["chosen"].get("width") == "fitted"
               for key, value in method["width"].items() if key in ("scale", "decay")}
    params |= {f"{_key(exp)}/noise_var_fitted": record["noise_var"]["fitted"]
               for exp, record in tuning.items() if "noise_var" in record}
    return metrics, params
