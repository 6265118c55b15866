"""Loss weights chosen on validation tasks, per experiment, without reading a label.

The paper leaves the weight of the value loss beside the policy loss (``train.lambda_q``) open,
and the two share the trunk, so the weight decides how much of the trunk learns to follow the
context. Where ``train.choose`` names loss-weight grids (``spice_ray/config/grids.py``), the
experiment's SPICE model trains once per grid point and seed (a *candidate*, variant
``lambda_q=10``), and before the fusion's settings are tuned the candidates are scored on the
validation split by the criterion below; the winner becomes the experiment's SPICE model (its
``variant=""`` checkpoints) for tuning, evaluation, the checkpoint index and ``from_run``. The
scores and the choice go to ``results/tuning.json`` beside the fusion's choices
(``<experiment>.models.spice``), and a record whose choice is not its grid's best is scored
again, never used.

The criterion is the one the width is fitted by: the mean log-likelihood of every logged reward
target of the validation contexts under N(Q-bar, s^2 sigma_Q^2 + sigma^2) of the position that
has not yet seen it, at the width scale s fitted on the same contexts, every seed's model
pooled (``spice_ray.study.tuning.fit_width``). It rewards a prior mean that follows the context
and a width that says how far it is off, and reads no label (no true mean, no optimal action).
"""

from __future__ import annotations

import itertools
import logging
import math
from pathlib import Path
from typing import Any

from spice_ray.agents import AgentSpec
from spice_ray.common.artifacts import is_current
from spice_ray.common.console import SILENT, Console
from spice_ray.config import ExperimentConfig, config_hash
from spice_ray.config.grids import GRIDS
from spice_ray.data import store
from spice_ray.model import checkpoint as ckpt
from spice_ray.study.experiment_spec import Experiment, ModelRef
from spice_ray.study.records import Finals

log = logging.getLogger(__name__)

CRITERION = ("mean validation log-likelihood per reward target under the fitted prior "
             "(no label read), every seed's model pooled")


def grid_points(cfg: ExperimentConfig) -> list[dict[str, float]]:
    """Every point of the loss-weight grids ``train.choose`` names, in grid order (the
    first grid varies slowest); [] when it names none."""
    fields = [GRIDS[name].field.split(".", 1)[1] for name in cfg.train.choose]
    values = [GRIDS[name].tuning for name in cfg.train.choose]
    return [dict(zip(fields, point, strict=True)) for point in itertools.product(*values)] \
        if fields else []


def variant_name(point: dict[str, Any]) -> str:
    """A candidate's variant name, e.g. ``lambda_q=10``."""
    return ",".join(f"{k}={v:g}" for k, v in point.items())


def candidates(model: ModelRef, cfg: ExperimentConfig) -> list[ModelRef]:
    """``model`` once per point of the grids ``train.choose`` names (variant ``lambda_q=10``,
    its train settings the point's, with nothing left to choose), or [] when it names none."""
    return [ModelRef(model.kind, variant_name(p), {**model.train, **p, "choose": ()})
            for p in grid_points(cfg)]


def trained_models(exp: Experiment, cfg: ExperimentConfig) -> tuple[ModelRef, ...]:
    """The models experiment ``exp`` trains under ``cfg``: its own, except that where
    ``train.choose`` names grids its main SPICE model is one candidate per grid point."""
    out: list[ModelRef] = []
    for m in exp.models:
        main = (m.kind, m.variant) == ("spice", "")
        out += (candidates(m, cfg) if main else []) or [m]
    return tuple(out)


def record_problem(record: Any, points: list[dict[str, float]]) -> str | None:
    """Why a ``models.spice`` record cannot be used (not this grid, not the shape
    :func:`choose_model` writes, or a choice that is not its grid's best), or None."""
    try:
        grid = record["grid"]
        if [g["setting"] for g in grid] != points:
            return "was scored on another grid"
        scores = [float(g["log_lik"]) for g in grid]
        best = grid[scores.index(max(scores))]["setting"]
        if record["chosen"] != best:
            return f"says {record['chosen']} was chosen, not its grid's best {best}"
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        return f"is not a loss-weight record ({type(exc).__name__}: {exc})"
    return None


def choose_model(name: str, cfg: ExperimentConfig, dataset: Path, finals: Finals,
                 previous: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """Score experiment ``name``'s candidates on its validation split and make the best one
    its SPICE model: ``finals[(name, "spice", "", seed)]`` is set to the chosen candidate's
    checkpoint of each seed.

    Returns:
        The ``models.spice`` record of ``tuning.json`` ({"inputs", "criterion", "grid":
        [{"setting", "log_lik", "scale", "targets"}], "chosen"}), ``previous`` when it was
        scored from the same checkpoints and data and is sound; None when ``train.choose``
        names no grid.
    """
    from spice_ray.study.tuning import fit_width

    points = grid_points(cfg)
    if not points:
        return None
    variants = [variant_name(p) for p in points]
    inputs = config_hash({
        "ckpts": {f"{v}/{seed}": ckpt.content_id(finals[(name, "spice", v, seed)])
                  for v in variants for seed in cfg.seeds},
        "data": store.split_id(dataset, "validation"), "tasks": cfg.eval.num_tasks,
        "criterion": CRITERION})
    record = previous
    problem = record_problem(previous, points) if previous else None
    if problem is not None:
        log.warning("[tune] %s: the loss-weight choice in tuning.json %s: scored again", name,
                    problem)
    if problem is not None or not is_current(previous, inputs)[0]:
        data = store.load_split(dataset, "validation", limit=cfg.eval.num_tasks)
        spec = AgentSpec("spice", fusion=cfg.fusion)
        grid = []
        for point, variant in zip(points, variants, strict=True):
            fit = fit_width(spec, cfg, data, {seed: str(finals[(name, "spice", variant, seed)])
                                              for seed in cfg.seeds})
            grid.append({"setting": point, "log_lik": float(fit["log_lik"]),
                         "scale": float(fit["scale"]), "targets": int(fit["targets"])})
        scores = [g["log_lik"] for g in grid]
        bad = [v for v, x in zip(variants, scores, strict=True) if not math.isfinite(x)]
        if bad:
            raise ValueError(f"experiment {name}: the validation log-likelihood of SPICE "
                             f"[{bad[0]}] is not finite: its checkpoints cannot be scored")
        record = {"inputs": inputs, "criterion": CRITERION, "grid": grid,
                  "chosen": grid[scores.index(max(scores))]["setting"]}
        log.info("[tune] %s: SPICE model %s (%s)", name, variant_name(record["chosen"]),
                 ", ".join(f"{v}: {g['log_lik']:+.4f}" for v, g in zip(variants, grid,
                                                                      strict=True)))
    chosen = variant_name(record["chosen"])
    for seed in cfg.seeds:
        finals[(name, "spice", "", seed)] = finals[(name, "spice", chosen, seed)]
    return record


def check_choose(name: str, exp: Experiment, cfg: ExperimentConfig) -> None:
    """Refuse ``train.choose`` where nothing would choose: an experiment without a tuning
    stage or without a main SPICE model.

    Raises:
        ConfigError: naming the experiment.
    """
    from spice_ray.config import ConfigError

    if cfg.train.choose and not (exp.tuned and any((m.kind, m.variant) == ("spice", "")
                                                   for m in exp.models)):
        raise ConfigError(f"experiment {name}: train.choose={list(cfg.train.choose)} is "
                          "invalid: it has no tuning stage and SPICE model to choose for; "
                          "leave it empty there")


def choose_models(configs: dict[str, ExperimentConfig], run_dir: Path,
                  datasets: dict[str, Path], finals: Finals, console: Console = SILENT
                  ) -> dict[str, dict[str, Any]]:
    """:func:`choose_model` for every experiment whose ``train.choose`` names grids (the
    previous records read from the run's ``tuning.json``), and the checkpoint index rewritten
    so that it lists each chosen model as the experiment's SPICE model; returns the records by
    experiment."""
    from spice_ray.study.records import write_checkpoint_index
    from spice_ray.study.tuning import read_tuning

    old = read_tuning(run_dir)
    out = {}
    for name, cfg in configs.items():
        models = old.get(name, {}).get("models") if isinstance(old.get(name), dict) else None
        previous = models.get("spice") if isinstance(models, dict) else None  # else rescored
        record = choose_model(name, cfg, datasets[name], finals,
                              previous if isinstance(previous, dict) else None)
        if record is not None:
            out[name] = record
            best = next(g for g in record["grid"] if g["setting"] == record["chosen"])
            console.line(f"  {name}: SPICE's loss weights {variant_name(record['chosen'])} "
                         f"of {len(record['grid'])} (validation log-lik "
                         f"{best['log_lik']:+.4f} per reward)"
                         + (", current, skipped" if record is previous else ""))
    if out:
        write_checkpoint_index(run_dir, finals)
    return out
