"""The study's experiments, declared as data (as bsuite declares its sweeps).

Each is an :class:`~spice_ray.study.experiment_spec.Experiment` (its environment, the models it
trains, the evaluations it runs and the tables their rows become; the types live in
``spice_ray.study.experiment_spec`` and are importable from here too). The study
(``spice_ray.study``) runs any experiment alike; adding one is an entry in :data:`EXPERIMENTS`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

import pandas as pd

from spice_ray import envs
from spice_ray.agents import AgentSpec
from spice_ray.common.metrics import (
    CUMULATIVE_REGRET,
    CUMULATIVE_RETURN,
    FINAL_REGRET,
    SUBOPTIMALITY,
)
from spice_ray.common.plugins import load_plugins
from spice_ray.config import ExperimentConfig, FusionConfig
from spice_ray.config.grids import FIXED_BETAS
from spice_ray.evaluate.accuracy import METRICS as ACCURACY_METRICS
from spice_ray.evaluate.calibration import METRICS as CALIBRATION_METRICS
from spice_ray.evaluate.calibration import ORACLE_METRICS
from spice_ray.results.analysis import action_accuracy, prior_contribution, prior_fit, prior_gap
from spice_ray.results.schema import settings_columns
from spice_ray.study.experiment_spec import Evaluation, Experiment, ModelRef, Select, Table

DARKROOM_BETAS = FIXED_BETAS["paper_table"]
WEIGHT_VARIANTS = {  # name -> (use_iw, use_adv, use_epi); "all" is the main SPICE model
    "none": (False, False, False),
    "iw": (True, False, False),
    "adv": (False, True, False),
    "epi": (False, False, True),
}


# ---- agents ----------------------------------------------------------------------------------


def _spice(cfg: ExperimentConfig) -> list[AgentSpec]:
    return [AgentSpec("spice", fusion=cfg.fusion)]


def _dpt(cfg: ExperimentConfig) -> list[AgentSpec]:
    return [AgentSpec.dpt(cfg.eval)]


def _bandit_baselines(cfg: ExperimentConfig) -> list[AgentSpec]:
    return [AgentSpec(m) for m in ("emp", "ucb", "lcb", "ts")]


def _flat_fusion(cfg: ExperimentConfig) -> FusionConfig:
    """SPICE's fusion for the model-free references: the same settings, on raw states."""
    return dataclasses.replace(cfg.fusion, kernel_space="state")


def _spice_flat(cfg: ExperimentConfig) -> list[AgentSpec]:
    """SPICE's fusion and rule with a constant prior (the study fills in the prior)."""
    return [AgentSpec("spice-flat", fusion=_flat_fusion(cfg))]


def _spice_theory(cfg: ExperimentConfig) -> list[AgentSpec]:
    """SPICE with the theory schedule beta_t = sqrt(2 log t)."""
    return [AgentSpec("spice", fusion=dataclasses.replace(cfg.fusion,
                                                          beta_schedule="sqrt2logt"))]


def _count(cfg: ExperimentConfig) -> list[AgentSpec]:
    """Tabular posterior-UCB over exact states with the constant prior."""
    return [AgentSpec("count", fusion=dataclasses.replace(cfg.fusion, kernel="exact",
                                                          kernel_space="state"))]


def _random(cfg: ExperimentConfig) -> list[AgentSpec]:
    return [AgentSpec("random")]


def _hill_climb(cfg: ExperimentConfig) -> list[AgentSpec]:
    return [AgentSpec("hill-climb")]


def _spice_betas(cfg: ExperimentConfig) -> list[AgentSpec]:
    return [AgentSpec("spice", fusion=dataclasses.replace(cfg.fusion, beta=b))
            for b in DARKROOM_BETAS]


def _main_beta(rows: pd.DataFrame, cfg: ExperimentConfig) -> pd.Series:
    return settings_columns(rows)["beta"] == cfg.fusion.beta


def _variants(uniform_behaviour: bool = False) -> tuple[ModelRef, ...]:
    """The weight-ablation models. Under a uniform behaviour policy the importance weight is
    identically 1, so "iw" trains exactly as "none" and reuses its checkpoints."""
    return tuple(ModelRef("spice", name, {"use_iw": iw, "use_adv": adv, "use_epi": epi},
                          same_as="none" if uniform_behaviour and name == "iw" else "")
                 for name, (iw, adv, epi) in WEIGHT_VARIANTS.items())


# ---- the experiments -------------------------------------------------------------------------


def bandit_experiment(name: str, title: str, overrides: tuple[str, ...] = (),
                      preset_overrides: Mapping[str, tuple[str, ...]] | None = None,
                      calibration: bool = False, env: str = "bandit") -> Experiment:
    """A bandit experiment on ``env`` (a plugin's too): offline, online and robustness tables
    (and the prior's calibration): SPICE and DPT per seed, the classical baselines once."""
    spice_protocols = ("offline", "online", "robustness") + (("calibration",)
                                                            if calibration else ())
    evaluations = (
        Evaluation("baselines", _bandit_baselines, ("offline", "online", "robustness")),
        Evaluation("spice", _spice, spice_protocols, ModelRef("spice")),
        Evaluation("spice_theory", _spice_theory, ("online",), ModelRef("spice")),
        Evaluation("dpt", _dpt, ("offline", "online", "robustness"), ModelRef("dpt")),
        Evaluation("flat", _spice_flat, ("offline", "online")),
        Evaluation("random", _random, ("online",)),  # the zero of the normalised scores
    )
    main = tuple(Select(e) for e in ("baselines", "spice", "dpt"))
    tables = [
        Table(f"{name}_offline", f"{title}: offline suboptimality vs context length h",
              (SUBOPTIMALITY,), (*main, Select("flat")), ("offline",), f"{title} offline",
              analysis=prior_contribution),
        Table(f"{name}_online", f"{title}: online cumulative regret", (CUMULATIVE_REGRET,),
              (*main, Select("spice_theory"), Select("flat")), ("online", "distribution"),
              f"{title} online", analysis=prior_contribution),
        Table(f"{name}_robustness", f"{title}: final online regret vs test-time sigma",
              (FINAL_REGRET,), main, ("robustness",), f"{title}: final regret vs sigma"),
    ]
    if calibration:
        tables.append(Table("calibration", f"{title}: ensemble prior coverage, pseudo-counts, "
                            "warm-start term", CALIBRATION_METRICS, (Select("spice"),),
                            ("calibration",), f"{title} prior"))
    return Experiment(name, env, (ModelRef("spice"), ModelRef("dpt")), evaluations,
                      tuple(tables), overrides, preset_overrides or {},
                      tuned=("spice", "dpt", "flat", "baselines", "random"))


DARKROOM_ROWS = tuple(Select(e) for e in ("spice", "dpt", "flat", "count", "random", "ppo"))

DARKROOM = Experiment(
    name="darkroom",
    env="darkroom",
    models=(ModelRef("spice"), ModelRef("dpt"), *_variants(uniform_behaviour=True)),
    evaluations=(
        Evaluation("spice", _spice_betas, ("online",), ModelRef("spice")),
        Evaluation("dpt", _dpt, ("online",), ModelRef("dpt")),
        *(Evaluation(m.variant, _spice, ("online",), m)
          for m in _variants(uniform_behaviour=True)),
        Evaluation("flat", _spice_flat, ("online",)),
        Evaluation("count", _count, ("online",)),
        Evaluation("random", _random, ("online",)),
    ),
    tables=(
        Table("darkroom_online", "darkroom weak-last: online cumulative regret and return",
              (CUMULATIVE_REGRET, CUMULATIVE_RETURN), DARKROOM_ROWS,
              ("online_return", "distribution"), "Darkroom", analysis=prior_contribution),
        Table("darkroom_online", "darkroom weak-last: online cumulative regret and return",
              (CUMULATIVE_REGRET, CUMULATIVE_RETURN), DARKROOM_ROWS,
              ("online_return", "distribution"), "Darkroom", analysis=prior_contribution,
              other_readings=True),
        Table("darkroom_visits", "darkroom: state visits per task and cell (x = x * size + y) "
              "over the online horizon, and each task's start and goal cell (start_cell, "
              "goal_cell: value = x * size + y)", ("visits", "start_cell", "goal_cell"),
              (Select("spice", _main_beta), *(Select(e) for e in ("dpt", "flat", "count",
                                                                  "random"))),
              ("visits",), "Darkroom"),
        *(Table("darkroom_weights", "darkroom: SPICE weight ablation (none / iw / adv / epi / "
                "all)", (CUMULATIVE_REGRET,),
                (Select("spice", _main_beta, "all"),
                 *(Select(v) for v in WEIGHT_VARIANTS), Select("dpt")),
                ("weights",), "Darkroom weight ablation", other_readings=other)
          for other in (False, True)),
    ),
    notes=("Darkroom: with weak-last labels DPT and AD-BC are the same model (same trunk, loss "
           "and labels), reported once as DPT.",
           "Darkroom: the behaviour policy is uniform (pi_b = 1/5 for every action), so the "
           "importance weight is identically 1 and the weight ablation's iw trains exactly as "
           "none (bit for bit, tested): its rows are the none models' again, not trained "
           "twice.",
           "Darkroom reference rows: SPICE (flat prior) is SPICE's fusion and action rule "
           "with one constant prior (the shrinkage prior the model trains with) and no "
           "network; Count-UCB is the same posterior-UCB over exact states (tabular); "
           "Random acts uniformly."),
    tuned=("spice", "dpt", "flat", "count", "random"),
)
"""Darkroom; ``Select("ppo")`` takes the single-task PPO reference's rows when
``eval.ppo_episodes > 0`` (the ``ppo`` extra)."""

DARKROOM_SCALE = dataclasses.replace(
    DARKROOM,
    name="darkroom_scale",
    models=(ModelRef("spice"), ModelRef("dpt")),
    evaluations=tuple(e for e in DARKROOM.evaluations
                      if e.name in ("spice", "dpt", "flat", "count", "random")),
    tables=tuple(dataclasses.replace(t, name=t.name.replace("darkroom", "darkroom_scale", 1),
                                     title=f"{t.title} (SPICE and DPT only)")
                 for t in DARKROOM.tables if not t.name.startswith("darkroom_weights")),
    notes=(DARKROOM.notes[0], DARKROOM.notes[2],
           "darkroom_scale: the darkroom experiment without its weight ablation (SPICE and "
           "DPT only, the same dataset and the same checkpoints as `darkroom` under the same "
           "settings), for budgets where training the ablation's three extra models per seed "
           "costs more than the question is worth."),
)
"""Darkroom, SPICE and DPT only: the same tasks, models and tables as ``darkroom`` less the
weight ablation. Not in the default study."""

DARKROOM_CONTINUOUS = Experiment(
    name="darkroom_continuous",
    env="darkroom_continuous",
    models=(ModelRef("spice"), ModelRef("dpt")),
    evaluations=(Evaluation("spice", _spice, ("online",), ModelRef("spice")),
                 Evaluation("dpt", _dpt, ("online",), ModelRef("dpt")),
                 Evaluation("flat", _spice_flat, ("online",)),
                 Evaluation("hill", _hill_climb, ("online",)),
                 Evaluation("random", _random, ("online",))),
    tables=(Table("darkroom_continuous_online", "continuous darkroom (d=10 feature-vector "
                  "states, smooth reward): online cumulative regret and return",
                  (CUMULATIVE_REGRET, CUMULATIVE_RETURN),
                  tuple(Select(e) for e in ("spice", "dpt", "flat", "hill", "random")),
                  ("online_return", "distribution"), "Continuous Darkroom",
                  analysis=prior_contribution),),
    notes=("Continuous Darkroom: the paper reports a cumulative regret at step 100 of about 24 "
           "for SPICE with epistemic weights and 76 for DPT (its weight ablation); ours are in "
           "`darkroom_continuous_tuned` under the walker reading. Hill-climbing is a goal-blind "
           "reference: it climbs the smooth reward from the start, so any agent that finds the "
           "goal by reward alone can reach its regret without a prior.",),
    tuned=("spice", "dpt", "flat", "hill", "random"),
)
"""The paper's continuous Darkroom (d = 10 feature-vector states, a smooth reward)."""

DARKROOM_DPT_STAR = Experiment(
    name="darkroom_dpt_star",
    env="darkroom",
    models=(ModelRef("dpt"),),
    evaluations=(Evaluation("dpt", _dpt, ("episode",), ModelRef("dpt")),
                 Evaluation("random", _random, ("episode",))),
    tables=(Table("darkroom_dpt_star", "darkroom, DPT trained on optimal labels (DPT*) under "
                  "the DPT paper's offline protocol: one episode from the corner (0, 0) acting "
                  "greedily on a fixed context of H transitions from independently drawn cells "
                  "with uniform actions (the DPT paper's roll-in)",
                  (CUMULATIVE_RETURN, CUMULATIVE_REGRET, *ACCURACY_METRICS),
                  (Select("dpt"), Select("random")), ("online_return",),
                  "DPT* on Darkroom (DPT paper protocol)", analysis=action_accuracy),),
    overrides=("data.label=optimal", "env.rollin=uniform", "train.query_position=false"),
    notes=("DPT* (darkroom_dpt_star): the DPT paper reports a return of about 61.5 for DPT on "
           "this protocol (10x10 grid, H = 100, held-out goals, one episode from (0, 0) on a "
           "fixed context of random transitions); the optimal return from (0, 0) is H minus "
           "the goal's distance. A large miss would mean the baseline, not the method, is "
           "broken.",),
)
"""DPT shown to be DPT: trained on the labels it was designed for, scored as its paper does."""

# ---- the structured families: where a learned prior must matter -------------------------------

PRIOR_BETAS = FIXED_BETAS["prior_families"]
"""Every fused row of the structured families runs at both (``config.grids.FIXED_BETAS``)."""


def _at_betas(method: str, state_kernel: bool = False
              ) -> Callable[[ExperimentConfig], list[AgentSpec]]:
    """Agents of ``method`` at each of :data:`PRIOR_BETAS` (model-free methods compare raw
    states)."""
    def agents(cfg: ExperimentConfig) -> list[AgentSpec]:
        fusion = _flat_fusion(cfg) if state_kernel else cfg.fusion
        return [AgentSpec(method, fusion=dataclasses.replace(fusion, beta=b))
                for b in PRIOR_BETAS]
    return agents


def _count_at_betas(cfg: ExperimentConfig) -> list[AgentSpec]:
    return [dataclasses.replace(s, fusion=dataclasses.replace(s.fusion, beta=b))
            for s in _count(cfg) for b in PRIOR_BETAS]


def _together(*agents: Callable[[ExperimentConfig], list[AgentSpec]]
              ) -> Callable[[ExperimentConfig], list[AgentSpec]]:
    return lambda cfg: [spec for make in agents for spec in make(cfg)]


def _methods(*names: str) -> Callable[[ExperimentConfig], list[AgentSpec]]:
    return lambda cfg: [AgentSpec(m, fusion=cfg.fusion) for m in names]


def prior_family(name: str, title: str, references: tuple[str, ...], count: bool = False
                 ) -> Experiment:
    """A family where the prior must matter: SPICE, the flat, the oracle and the context-free
    prior (the family's h = 0 marginal, never reading the context; in the bandits also one
    estimated from the training tasks) under SPICE's fusion, Bayes posterior-UCB on the exact
    posterior (each at beta 1 and 2), and classical references; one online table whose analysis
    is the share of the flat-to-oracle gap SPICE closes (and, in the tuned table, the
    in-context share against the context-free row). In the bandits "SPICE (learned mean, exact
    sd)" is a diagnostic: the learned mean with the exact posterior's width."""
    stateless = envs.env_class(name).stateless
    learned = _at_betas("spice")
    if stateless:  # the diagnostic row: the learned mean with the exact posterior's width
        learned = _together(learned, _at_betas("spice-exact-width"))
    evaluations = (
        Evaluation("spice", learned, ("online",), ModelRef("spice")),
        Evaluation("flat", _at_betas("spice-flat", state_kernel=True), ("online",)),
        Evaluation("oracle", _at_betas("spice-oracle", state_kernel=True), ("online",)),
        Evaluation("context_free", _at_betas("spice-context-free", state_kernel=True),
                   ("online",)),
        *((Evaluation("data_prior", _at_betas("spice-data-prior", state_kernel=True),
                      ("online",)),) if stateless else ()),
        Evaluation("bayes", _at_betas("bayes-ucb"), ("online",)),
        Evaluation("references", _methods(*references), ("online",)),
        *((Evaluation("count", _count_at_betas, ("online",)),) if count else ()),
    )
    rows = tuple(Select(e.name) for e in evaluations)
    figures = ("online", "distribution") if stateless else ("online_return", "distribution")
    metrics = (CUMULATIVE_REGRET,) if stateless else (CUMULATIVE_REGRET, CUMULATIVE_RETURN)
    tables = [Table(f"{name}_online", f"{title}: online cumulative regret", metrics, rows,
                    figures, title, analysis=prior_gap)]
    if not stateless:
        tables.append(dataclasses.replace(tables[0], other_readings=True))
    else:  # is the prior learned? Q-bar and sigma_Q against the exact posterior
        evaluations += (Evaluation("prior_fit", _spice, ("calibration",), ModelRef("spice")),)
        tables.append(Table(f"{name}_prior", f"{title}: the learned prior against the exact "
                            "posterior on the eval contexts, vs context length h",
                            (*CALIBRATION_METRICS, *ORACLE_METRICS), (Select("prior_fit"),),
                            ("calibration",), f"{title} prior", analysis=prior_fit))
    return Experiment(name, name, (ModelRef("spice"),), evaluations, tuple(tables),
                      tuned=tuple(e.name for e in evaluations if e.name != "prior_fit"),
                      notes=(f"{title}: SPICE (context-free prior) is SPICE's fusion and "
                             "action rule fed the family's exact prior before any context (its "
                             "h = 0 marginal at the current state), never conditioned on the "
                             "context: SPICE below it reads the context, not only the "
                             "population. SPICE (training-data prior), in the bandits, is the "
                             "same with a per-arm prior estimated from the training tasks' "
                             "rewards: what SPICE could know of the population.",
                             f"{title}: SPICE (oracle prior) is SPICE's own fusion and action "
                             "rule fed the exact Bayes posterior of the task family given the "
                             "context as its prior; Bayes posterior-UCB acts on that posterior "
                             "directly, without fusing the context a second time.",))


BANDIT20_SMALL = ("env.horizon=200", "eval.online_horizon=200", "data.num_train_tasks=1000")

EXPERIMENTS: dict[str, Experiment] = {
    "bandit": bandit_experiment("bandit", "bandit A=5 weak labels", calibration=True),
    "bandit20": bandit_experiment(
        "bandit20", "bandit A=20 weakmix80", ("env.num_arms=20", "data.label=weakmix80"),
        {"small": BANDIT20_SMALL, "medium": BANDIT20_SMALL,
         "paper": ("train.epochs=100",)}),  # the paper's 20-arm ablation: 100 epochs
    "darkroom": DARKROOM,
    "darkroom_continuous": DARKROOM_CONTINUOUS,
    "darkroom_dpt_star": DARKROOM_DPT_STAR,
    "darkroom_scale": DARKROOM_SCALE,
    "bandit_template": prior_family("bandit_template", "template bandit A=5",
                                    ("ucb", "ts", "bayes-ts", "random")),
    "bandit_latent": prior_family("bandit_latent", "latent-phase bandit A=5",
                                  ("ucb", "ts", "bayes-ts", "random")),
    "linear_bandit": prior_family("linear_bandit", "linear bandit A=10 d=2",
                                  ("ucb", "linucb", "lints", "random")),
    "darkroom_region": prior_family("darkroom_region", "region Darkroom",
                                    ("nearest", "random"), count=True),
}
"""Every experiment by name, in the study's order."""
DEFAULT_EXPERIMENTS = ("bandit", "bandit20", "darkroom", "darkroom_continuous",
                       "darkroom_dpt_star", "bandit_template", "bandit_latent", "linear_bandit",
                       "darkroom_region")


# ---- extension from outside the package ------------------------------------------------------

def add_evaluation(experiment: str, evaluation: Evaluation, tables: tuple[str, ...] = (),
                   tuned: bool = True) -> Experiment:
    """Add an evaluation to a registered experiment (e.g. an installed plugin's agent, see
    ``spice_ray.common.plugins``): the tuning stage runs its methods on the validation tasks
    (``tuned``) and they join the ``<experiment>_tuned`` table, and its rows go into each table
    named in ``tables`` (their figures and the report follow). Adding the same evaluation again
    is a no-op.

    Raises:
        ValueError: an unknown experiment or table, or another evaluation of that name.
    """
    if experiment not in EXPERIMENTS:
        raise ValueError(f"experiment {experiment!r} is invalid: one of {list(EXPERIMENTS)}")
    exp = EXPERIMENTS[experiment]
    if evaluation in exp.evaluations:
        return exp
    if any(e.name == evaluation.name for e in exp.evaluations):
        raise ValueError(f"experiment {experiment!r} already has an evaluation named "
                         f"{evaluation.name!r}")
    names = [t.name for t in exp.tables]
    unknown = [t for t in tables if t not in names]
    if unknown:
        raise ValueError(f"table {unknown[0]!r} is invalid for experiment {experiment!r}: one "
                         f"of {names}")
    EXPERIMENTS[experiment] = dataclasses.replace(
        exp, evaluations=(*exp.evaluations, evaluation),
        tables=tuple(dataclasses.replace(t, rows=(*t.rows, Select(evaluation.name)))
                     if t.name in tables else t for t in exp.tables),
        tuned=(*exp.tuned, evaluation.name) if tuned and exp.tuned else exp.tuned)
    return EXPERIMENTS[experiment]


VARIANT = "--"
"""Between an experiment's name and a variant's (``full_run --variant``): ``bandit--lr3``."""


def experiment_named(name: str) -> Experiment:
    """The registered experiment ``name``; ``<experiment>--<variant>`` is that experiment under
    a name of its own, registered on first use: its tables (``bandit--lr3_online``), tuning
    record, config file and checkpoints carry the name, so a study and its variant live side
    by side in one run directory and report.

    Raises:
        ValueError: neither a registered experiment nor one of them with a variant name
            (letters, digits, ``_`` and ``-``, at most 32).
    """
    import re

    if name in EXPERIMENTS:
        return EXPERIMENTS[name]
    base, sep, variant = name.partition(VARIANT)
    if not sep or base not in EXPERIMENTS or not re.fullmatch(
            r"[A-Za-z0-9][A-Za-z0-9_-]{0,31}", variant):
        raise ValueError(f"experiment {name!r} is invalid: one of {list(EXPERIMENTS)}, or "
                         f"one of them{VARIANT}<variant> (letters, digits, _ and -)")
    exp = EXPERIMENTS[base]

    def renamed(table: Table) -> Table:
        rest = table.name[len(base):] if table.name.startswith(base) else f"_{table.name}"
        return dataclasses.replace(table, name=f"{name}{rest}",
                                   title=f"{table.title} [{variant}]")

    EXPERIMENTS[name] = dataclasses.replace(exp, name=name,
                                            tables=tuple(renamed(t) for t in exp.tables))
    return EXPERIMENTS[name]


def add_experiment(experiment: Experiment) -> Experiment:
    """Register a whole experiment (a plugin's), runnable as ``--experiments <name>``.

    Raises:
        ValueError: the name is taken by another experiment.
    """
    if EXPERIMENTS.get(experiment.name, experiment) != experiment:
        raise ValueError(f"experiment {experiment.name!r} is already registered")
    EXPERIMENTS[experiment.name] = experiment
    return experiment


load_plugins()  # last: a plugin may extend the experiments above
