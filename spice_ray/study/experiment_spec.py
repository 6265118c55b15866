"""The types the study's experiments are declared with (``spice_ray.study.experiments`` holds the
experiments themselves).

An :class:`Experiment` says which environment it runs (with which overrides per preset), which
models it trains (:class:`ModelRef`: a kind and a variant's train settings), which
evaluations it runs (:class:`Evaluation`: a model, agents and protocols), and how their rows
become tables (:class:`Table`: a selection of rows and metrics, a figure, a description).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from spice_ray import envs
from spice_ray.agents import AgentSpec
from spice_ray.common.metrics import CUMULATIVE_REGRET, CUMULATIVE_RETURN
from spice_ray.config import ExperimentConfig
from spice_ray.results.analysis import tuned_comparison


@dataclass(frozen=True)
class ModelRef:
    """A model an experiment trains (once per training seed)."""

    kind: str
    """Model kind (``spice_ray.model.registry.MODELS``)."""
    variant: str = ""
    """Variant name ("" for the main model), the rows' ``variant``."""
    train: Mapping[str, Any] = field(default_factory=dict)
    """Train-section overrides of the variant."""
    same_as: str = ""
    """The variant whose training this one repeats bit for bit (by construction, e.g. an
    importance weight that is identically 1): nothing is trained for it, and it is evaluated
    with that variant's checkpoints."""

    def label(self, seed: int) -> str:
        """How the console and the logs name its training of ``seed``: ``spice [adv] seed 1``."""
        return f"{self.kind}{f' [{self.variant}]' if self.variant else ''} seed {seed}"

    def config(self, cfg: ExperimentConfig) -> ExperimentConfig:
        """``cfg`` with this variant's train settings."""
        return cfg.replace(train=dataclasses.replace(cfg.train, **self.train)) if self.train \
            else cfg


@dataclass(frozen=True)
class Evaluation:
    """Agents evaluated under some protocols, with one model (per seed) or none."""

    name: str
    agents: Callable[[ExperimentConfig], list[AgentSpec]]
    protocols: tuple[str, ...]
    model: ModelRef | None = None
    """None: model-free agents, evaluated once (their rows' seed is -1)."""


@dataclass(frozen=True)
class Select:
    """Rows of one evaluation that go into a table."""

    evaluation: str
    where: Callable[[pd.DataFrame, ExperimentConfig], pd.Series] | None = None
    """Optional row filter (rows, the experiment's config) -> bool mask."""
    variant: str | None = None
    """Relabel the rows' ``variant`` (e.g. the main model as the ablation's "all")."""


@dataclass(frozen=True)
class Table:
    """One result table: selected rows, the metrics it keeps, its figure."""

    name: str
    description: str
    metrics: tuple[str, ...]
    rows: tuple[Select, ...]
    figures: tuple[str, ...] = ()
    """Plot kinds of ``spice_ray.results.plots.PLOTS``: the first is drawn to
    ``figures/<name>.png``, each other one to ``figures/<name>_<kind>.png``."""
    title: str = ""
    rename: Mapping[str, str] = field(default_factory=dict)
    """Metric renames (e.g. another regret reading's rows as this table's regret)."""
    analysis: Callable[[pd.DataFrame], list[str]] | None = None
    """Sentences for the report from the table's rows (``spice_ray.results.analysis``)."""
    other_readings: bool = False
    """Instead of this table, one per regret reading of the environment other than the
    configured one, named ``<name>_<reading>``, with that reading as cumulative_regret."""


@dataclass(frozen=True)
class Experiment:
    """An environment, its models, evaluations and tables."""

    name: str
    env: str
    models: tuple[ModelRef, ...]
    evaluations: tuple[Evaluation, ...]
    tables: tuple[Table, ...]
    overrides: tuple[str, ...] = ()
    """``--set`` overrides applied before the user's."""
    preset_overrides: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Per preset, more overrides (before the user's)."""
    notes: tuple[str, ...] = ()
    """Sentences for the report."""
    tuned: tuple[str, ...] = ()
    """Evaluations whose methods the tuning stage runs on validation tasks over one grid
    (``spice_ray.study.tuning``) and reports once each, at the chosen setting, in the
    ``<name>_tuned`` table."""

    def tuned_table(self, groups: Mapping[int, int] | None = None) -> Table | None:
        """The table of the tuned methods on the eval tasks (None without ``tuned``); with
        ``groups`` (task id -> goal) its analysis's intervals resample goals, then tasks."""
        if not self.tuned:
            return None
        stateless = envs.env_class(self.env).stateless
        return Table(f"{self.name}_tuned", f"{self.name}: every method at the setting chosen "
                     "on validation tasks (results/tuning.json), on the eval tasks",
                     (CUMULATIVE_REGRET,) if stateless else (CUMULATIVE_REGRET,
                                                               CUMULATIVE_RETURN),
                     (), ("online", "distribution") if stateless
                     else ("online_return", "distribution"),
                     f"{self.name}, tuned on validation",
                     analysis=functools.partial(tuned_comparison, groups=groups))

    def evaluation(self, name: str) -> Evaluation:
        return next(e for e in self.evaluations if e.name == name)

    def tables_for(self, cfg: ExperimentConfig) -> list[Table]:
        """The tables this experiment writes under ``cfg`` (other-reading tables expanded)."""
        env = cfg.environment()
        out = []
        for table in self.tables:
            if not table.other_readings:
                out.append(table)
                continue
            for reading in env.regret_readings:
                if reading != env.reading():
                    metric = f"{CUMULATIVE_REGRET}_{reading}"
                    out.append(dataclasses.replace(
                        table, name=f"{table.name}_{reading}", other_readings=False,
                        metrics=(metric, *(m for m in table.metrics
                                           if m != CUMULATIVE_REGRET)),
                        rename={metric: CUMULATIVE_REGRET},
                        description=f"{table.description} ({reading} regret)",
                        title=f"{table.title} ({reading} regret)"))
        return out
