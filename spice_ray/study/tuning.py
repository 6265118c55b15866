"""The study's tuning stage: every agent's hyperparameters chosen on validation tasks only.

For each experiment, every method of its tuned evaluations (``Experiment.tuned``) runs online
on the validation split over one grid -- the same grid for SPICE and for every reference that
has the hyperparameter -- and the setting with the lowest mean final cumulative regret (over
validation tasks and training seeds) is chosen; where other points are within two paired
standard errors of it (their difference over the same tasks) the choice is marked unresolved
(``spice_ray.results.choices.resolution``), so a reader sees which choices one validation draw's
noise could have made otherwise. The choices, their margins, the grid and every validation
score go to ``results/tuning.json``; then each method runs once, at its choice, on the eval
tasks: the ``<experiment>_tuned`` table, the study's headline (``spice_ray.study.tuned``).

The grid (:func:`candidates`) is built from declarations, never from a method's name: the
fusion's tunables (``spice_ray.agents.tunables.FUSION_TUNABLES``), each applying to the methods
that read it, crossed with the method's own (``Method.tunables``):

- posterior-UCB methods (SPICE, the flat and oracle priors, Count-UCB, Bayes posterior-UCB):
  beta in :data:`BETAS` and the theory schedule beta_t = sqrt(2 log t);
- and, for fused methods whose kernel reads a bandwidth (``fusion.BANDWIDTH_KERNELS``: the RBF)
  over states (darkroom), the bandwidth tau in :data:`TAUS` (every pair);
- and, for methods whose prior's width is the learned sigma_Q (``Method.scales_width``: SPICE),
  every point twice (:data:`WIDTHS`): at the paper's width (s = 1) and at the width fitted on
  the validation contexts without labels (:func:`fit_width`: the scale s and how it narrows
  with the context length, ``fusion.width_decay``), so the width and beta are chosen together;
- where the evidence targets are n-step returns (the darkrooms: ``fusion.needs_nstep``), SPICE's
  fitted point also takes the likelihood variance sigma^2 fitted with s (label-free, from the
  validation contexts' n-step targets), and every other fused method runs every point at the
  config's sigma^2, at that fitted one and at decades spanning the targets' scale (:data:`NOISES`);
- methods that declare tunables (``agents.Tunable``: UCB's and LinUCB's exploration constant c,
  a plugin's own option): every value of each, crossed.

Methods without a hyperparameter (DPT, TS, Random, ...) run once on validation too, so every
row of the tuned table has a validation score. Every grid's values are declared once, in
``spice_ray/config/grids.py`` (the sweeps read the same declarations).

The grid is exhaustive (SPICE: at most 80 points on a darkroom; a model-free method 120, each a
few milliseconds per task) and runs on Ray Tune, the sweeps' search engine: each trial a run of
consecutive points of one experiment, each point on every validation task under every seed's
model (:func:`score_point`; ``spice_ray.study.tune_grid``).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from spice_ray.agents import METHODS, AgentSpec
from spice_ray.agents.tunables import (  # noqa: F401 (the grids, re-exported)
    BETAS,
    FUSION_TUNABLES,
    NOISES,
    TAUS,
    WIDTHS,
    Fitted,
    fits_noise,
)
from spice_ray.common.artifacts import MISSING, is_current, verify
from spice_ray.common.metrics import CUMULATIVE_REGRET
from spice_ray.config import EnvConfig, EvalConfig, ExperimentConfig, config_hash
from spice_ray.data import store
from spice_ray.evaluate.actors import EvalPool, ModelCache, evaluate_parallel, evaluate_tasks
from spice_ray.model import checkpoint as ckpt
from spice_ray.results.choices import (
    best_index,
    fitted_noise,
    paper_choice,
    record_problem,
    resolution,
)
from spice_ray.results.choices import headline as choices_headline
from spice_ray.results.schema import NO_SEED, settings_of
from spice_ray.study.experiments import EXPERIMENTS, Experiment
from spice_ray.study.records import Finals

log = logging.getLogger(__name__)

WIDTH_FIT = "scale, decay; constant"  # what fit_width fits: a record fitted otherwise is redone
SCORE = "mean final cumulative regret over validation tasks and training seeds"
SCORE_FIELDS = ("mean", "sem", "n", "per_task")
"""What a tuning trial returns of a grid point (:func:`score_point`)."""

TUNING_FILE = "results/tuning.json"


@dataclass(frozen=True)
class Candidate:
    """One grid point of one agent."""

    spec: AgentSpec
    eval_cfg: EvalConfig
    setting: tuple[tuple[str, Any], ...]
    """The grid point, e.g. (("beta", 2.0), ("tau", 0.5)); () for an agent without one."""

    @property
    def key(self) -> tuple[str, str]:
        """(method label, config JSON): how its result rows are found."""
        return self.spec.label, self.spec.config_json(self.eval_cfg)


def candidates(spec: AgentSpec, eval_cfg: EvalConfig,
               fitted_width: float | dict[str, float] | None = None,
               fitted_noise: float | None = None) -> list[Candidate]:
    """Every grid point of ``spec`` in grid order: the declared fusion tunables that apply to
    it (``agents.tunables.FUSION_TUNABLES``: beta slowest, then tau, then the width or the
    noise), crossed with the method's own (``Method.tunables``, in declaration order).

    Args:
        fitted_width: the validation-fitted width of the "fitted" points (methods that read
            ``fusion.width_scale``): s, or a :func:`fit_width` record with its decay; None
            builds them at s = 1, which only counts the grid (the dry run).
        fitted_noise: the likelihood variance fitted with s, for the "fitted" width or noise
            points where :func:`fits_noise`; None keeps ``fusion.noise_var`` (counting only).
    """
    fitted = Fitted.of(fitted_width, fitted_noise)
    axes = [t.points(spec, fitted) for t in FUSION_TUNABLES if t.applies(spec)]
    out = []
    for combo in itertools.product(*axes):
        fields = {k: v for point in combo for k, v in point.fields.items()}
        fused = dataclasses.replace(spec, fusion=dataclasses.replace(spec.fusion, **fields)) \
            if combo else spec
        out.append(Candidate(fused, eval_cfg, tuple((p.key, p.value) for p in combo)))
    for tunable in spec.info.tunables:  # what the method declares (UCB's c, a plugin's epsilon)
        out = [Candidate(*tunable.apply(c.spec, c.eval_cfg, value),
                         c.setting + ((tunable.name, value),))
               for c in out for value in tunable.values]
    return out


def _agent_config(config: str) -> str:
    """A row's config without what the protocol adds (noise level, episodes): the agent's
    own, as :meth:`AgentSpec.config_json` writes it."""
    cfg = {k: v for k, v in settings_of(config).items() if k not in ("sigma", "episodes")}
    return json.dumps(cfg, sort_keys=True, separators=(",", ":"))


def final_scores(rows: pd.DataFrame) -> pd.DataFrame:
    """Per (method, config): mean, SEM (over tasks, seeds averaged per task) and n of the
    final cumulative regret, and ``per_task``: the task values themselves in task-id order
    (what pairs two points task by task)."""
    sub = rows[rows["metric"] == CUMULATIVE_REGRET]
    sub = sub[sub["x"] == sub["x"].max()]
    sub = sub.assign(config=sub["config"].map(_agent_config))
    per_task = sub.groupby(["method", "config", "task_id"], sort=False)["value"].mean()
    g = per_task.groupby(level=["method", "config"], sort=False)
    out = pd.DataFrame({"mean": g.mean(), "sem": g.std(ddof=1) / np.sqrt(g.count()),
                        "n": g.count(),
                        "per_task": g.apply(lambda v: v.sort_index(level="task_id").tolist())})
    return out.reset_index()


def choose(grid: list[Candidate], scores: pd.DataFrame) -> tuple[Candidate, list[dict]]:
    """The candidate :func:`~spice_ray.results.choices.resolution` chooses (the lowest mean
    score, the first in grid order on a tie; flagged unresolved where other points are within
    two paired SEs of it), and every candidate's score as plain records, each with
    ``paired_se``: the SEM over tasks of its difference from the lowest-mean point.

    Raises:
        ValueError: if a candidate has no score (its rows are missing).
    """
    table = {(r.method, r.config): r for r in scores.itertuples(index=False)}
    records, tasks = [], []
    for c in grid:
        if c.key not in table:
            raise ValueError(f"tuning: no validation rows for {c.key[0]} at {dict(c.setting)}")
        r = table[c.key]
        records.append({"setting": dict(c.setting), "mean": float(r.mean),
                        "sem": float(r.sem), "n": int(r.n)})
        tasks.append(np.asarray(r.per_task, dtype=np.float64))
    best = best_index(records)
    for rec, values in zip(records, tasks, strict=True):
        d = values - tasks[best]
        rec["paired_se"] = float(d.std(ddof=1) / np.sqrt(len(d))) if len(d) > 1 else 0.0
    chosen = resolution(records)["chosen"]
    return next(c for c in grid if dict(c.setting) == chosen), records


def fit_width(spec: AgentSpec, cfg: ExperimentConfig, data: dict[str, Any],
              sources: dict[int, str]) -> dict[str, Any]:
    """The scale s and decay of ``spec``'s learned prior width (and, where :func:`fits_noise`,
    the likelihood variance with them), fitted without labels on the validation contexts of
    every seed's model at once (``spice_ray.evaluate.width.fit_pooled_width``); with
    ``"predictive": True`` where the models have a predictive-variance head (its width is one
    more grid point)."""
    from spice_ray.evaluate.width import fit_pooled_width

    fit = fit_pooled_width(sources, data, cfg.env, spec.fusion, fit_noise=fits_noise(spec),
                           fit_decay=True)
    return fit | ({"predictive": True} if cfg.model.var_head else {})


def _flat_prior(cfg: ExperimentConfig, dataset: Path) -> tuple[float, float]:
    """The constant prior of the reference agents: the shrinkage prior the model trains with
    (the data's own when ``train.shrink_prior=data``)."""
    from spice_ray.train.prior import resolve_config

    train = resolve_config(cfg, dataset).train
    return float(train.shrink_prior_mean), float(train.shrink_prior_var)


def agent_specs(exp: Experiment, cfg: ExperimentConfig, dataset: Path
                ) -> dict[str, list[AgentSpec]]:
    """Every evaluation's agents, the flat and the per-arm (training-data) prior from the data."""
    from spice_ray.train.prior import data_arm_prior

    fill = {"flat": lambda: _flat_prior(cfg, dataset),
            "data": lambda: data_arm_prior(cfg, dataset)}
    out = {}
    for ev in exp.evaluations:
        specs = ev.agents(cfg)
        for kind, prior in fill.items():
            if any(s.info.prior == kind for s in specs):
                value = prior()
                specs = [dataclasses.replace(s, prior=value) if s.info.prior == kind else s
                         for s in specs]
        out[ev.name] = specs
    return out


def score_point(point: Candidate, sources: Mapping[int, str], seeds: Sequence[int],
                env: EnvConfig, data: Mapping[str, Any], models: ModelCache) -> dict[str, Any]:
    """One grid point's validation score (what a tuning trial computes): its online run on
    every task of ``data`` under each seed's model (``sources``; none for a model-free
    method), the final cumulative regret's mean, SEM, n and per-task values as
    :func:`final_scores` gives them."""
    return score_points([(point, sources, seeds)], env, data, models)[0]


def score_points(points: Sequence[tuple[Candidate, Mapping[int, str], Sequence[int]]],
                 env: EnvConfig, data: Mapping[str, Any], models: ModelCache
                 ) -> list[dict[str, Any]]:
    """:func:`score_point` of each point, in order, the points that run under the same
    checkpoints, seeds and evaluation settings rolled out as one batch per seed: their learned
    SPICE agents step together (``evaluate.online.run_all_online``), each point's rollout the
    one it acts alone, so a point's score does not depend on the points beside it. A batch
    whose rows are not exactly its points' (method, config) keys raises ValueError."""
    groups: dict[tuple[Any, ...], list[int]] = {}
    for i, (cand, sources, seeds) in enumerate(points):
        key = (tuple(sorted(sources.items())), tuple(seeds), cand.eval_cfg)
        groups.setdefault(key, []).append(i)
    scores: dict[int, dict[str, Any]] = {}
    for (sources, seeds, eval_cfg), members in groups.items():
        by_seed = dict(sources)
        specs = [points[i][0].spec for i in members]
        frames = [evaluate_tasks(env, eval_cfg, data, specs,
                                 models.get(by_seed.get(seed), env), ("final",), seed)
                  for seed in seeds]
        table = {(r["method"], r["config"]): r for r in
                 final_scores(pd.concat(frames, ignore_index=True)).to_dict("records")}
        if set(table) != (keys := {points[i][0].key for i in members}):
            raise ValueError(f"tuning: rows for {sorted(table)}, points {sorted(keys)}")
        for i in members:
            score = table[points[i][0].key]
            scores[i] = {k: score[k] for k in SCORE_FIELDS}
    return [scores[i] for i in range(len(points))]


def run_candidates(cands: list[Candidate], source: str | None, cfg: ExperimentConfig,
                   data: dict, seed: int, pool: EvalPool) -> pd.DataFrame:
    """Online rows of every candidate (the tuned table's), one actor pass per distinct eval
    config."""
    by_eval: dict[EvalConfig, list[AgentSpec]] = {}
    for c in cands:
        by_eval.setdefault(c.eval_cfg, []).append(c.spec)
    frames = [evaluate_parallel(source, cfg.env, ev_cfg, data, specs, ("online",), seed=seed,
                                pool=pool, split="specs")
              for ev_cfg, specs in by_eval.items()]
    return pd.concat(frames, ignore_index=True)


@dataclass
class Pending:
    """One experiment's grid, ready to be scored (:func:`prepare`), and what :func:`finish`
    needs to make its record of it."""

    name: str
    inputs: str
    env: EnvConfig
    data: dict[str, Any]
    """The validation tasks' columns."""
    groups: list[tuple[str, list[list[Candidate]], dict[int, str], tuple[int, ...]]]
    """Per tuned evaluation: its name, each method's grid, its checkpoints by seed, and the
    seeds its points run under."""
    widths: dict[str, dict[str, Any]]
    noise: float | None
    seeds: list[int]
    config_noise: float

    def points(self) -> list[tuple[Candidate, dict[int, str], tuple[int, ...]]]:
        """Every point with its checkpoints and seeds, in grid order."""
        return [(c, sources, seeds) for _, grids, sources, seeds in self.groups
                for grid in grids for c in grid]


def evaluation_runs(name: str, ev_name: str, cfg: ExperimentConfig, finals: Finals
                    ) -> tuple[dict[int, str], tuple[int, ...]]:
    """What a grid point of experiment ``name``'s evaluation ``ev_name`` runs under: each
    training seed's final checkpoint and the seeds (a model-free method: none, and the one
    seed :data:`~spice_ray.results.schema.NO_SEED`)."""
    ev = EXPERIMENTS[name].evaluation(ev_name)
    if not ev.model:
        return {}, (NO_SEED,)
    return ({seed: str(finals[(name, ev.model.kind, ev.model.variant, seed)])
             for seed in cfg.seeds}, tuple(cfg.seeds))


def prepare(name: str, cfg: ExperimentConfig, dataset: Path, finals: Finals,
            previous: dict[str, Any] | None = None) -> Pending | dict[str, Any]:
    """Experiment ``name``'s grid on its validation tasks (the learned widths fitted first:
    the grid holds them), or ``previous`` when its inputs hash is the same and it is sound
    (nothing to run)."""
    exp = EXPERIMENTS[name]
    specs = agent_specs(exp, cfg, dataset)
    plan = {ev: bases(specs[ev], cfg) for ev in exp.tuned}
    inputs = config_hash({  # the fitted width is a function of the checkpoints and the data
        "grid": {ev: [[(c.key, c.setting) for c in candidates(s, cfg.eval)] for s in group]
                 for ev, group in plan.items()},
        "ckpts": {f"{k[1]}/{k[2]}/{k[3]}": ckpt.content_id(p)
                  for k, p in sorted(finals.items()) if k[0] == name},
        "data": store.split_id(dataset, "validation"), "tasks": cfg.eval.num_tasks,
        "width_fit": WIDTH_FIT})
    if is_current(previous, inputs)[0]:
        problem = record_problem(previous)
        if problem is None:
            log.info("[tune] %s: choices are current, skipped", name)
            return previous
        log.warning("[tune] %s: %s %s: tuned again", name, TUNING_FILE, problem)
    data = store.load_split(dataset, "validation", limit=cfg.eval.num_tasks)
    runs = {ev_name: evaluation_runs(name, ev_name, cfg, finals) for ev_name in plan}
    # every learned width first: its fitted sigma^2 is the other fused methods' too
    widths = {s.label: fit_width(s, cfg, data, runs[ev_name][0])
              for ev_name, group in plan.items() for s in group if s.info.scales_width}
    noise = next((w["noise_var"] for w in widths.values() if "noise_var" in w), None)
    groups = [(ev_name, [candidates(s, cfg.eval, widths.get(s.label), noise) for s in group],
               *runs[ev_name]) for ev_name, group in plan.items()]
    return Pending(name, inputs, cfg.env, data, groups, widths, noise, list(cfg.seeds),
                   cfg.fusion.noise_var)


def finish(pending: Pending, scores: pd.DataFrame) -> dict[str, Any]:
    """The experiment's record of ``tuning.json`` from its points' ``scores`` (method, config,
    mean, sem, n, per_task): {"inputs", "split", "tasks", "seeds", "score", "methods": {label:
    {"evaluation", "grid": [{"setting", "mean", "sem", "n", "paired_se"}], "chosen",
    "resolution"}}} (``resolution``: the runner-up's margin, its paired SEM, and whether the
    choice is resolved; ``spice_ray.results.choices.resolution``)."""
    methods: dict[str, Any] = {}
    for ev_name, grids, _, _ in pending.groups:
        for grid in grids:
            best, records = choose(grid, scores)
            label = best.spec.label
            methods[label] = {"evaluation": ev_name, "grid": records,
                              "chosen": dict(best.setting), "resolution": resolution(records)}
            if label in pending.widths:
                methods[label]["width"] = pending.widths[label]
                methods[label]["paper"] = paper_choice(methods[label])
            log.info("[tune] %s: %s -> %s", pending.name, label, dict(best.setting) or "-")
    noise = pending.noise
    return {"inputs": pending.inputs, "split": "validation",
            "tasks": len(pending.data["task_id"]), "seeds": pending.seeds, "score": SCORE,
            "methods": methods,
            **({"noise_var": {"fitted": noise, "config": pending.config_noise}}
               if noise is not None else {})}


def bases(specs: list[AgentSpec], cfg: ExperimentConfig) -> list[AgentSpec]:
    """One spec per method that acts online in ``cfg``'s environment (the first): the one its
    grid starts from."""
    env = cfg.environment()
    seen: dict[str, AgentSpec] = {}
    for s in specs:
        if s.applies_to(env):
            seen.setdefault(s.method, s)
    return list(seen.values())


def chosen_specs(record: dict[str, Any], exp: Experiment, cfg: ExperimentConfig, dataset: Path
                 ) -> dict[str, list[Candidate]]:
    """Per tuned evaluation, each method at its chosen setting (a ``tune_experiment`` record);
    beside a method that declares one (``Method.paper_width``: SPICE's "SPICE (paper)"), that
    method at the best of its paper-width points."""
    specs = agent_specs(exp, cfg, dataset)
    out: dict[str, list[Candidate]] = {}
    for ev_name in exp.tuned:
        for base in bases(specs[ev_name], cfg):
            method = record["methods"][base.label]
            match = grid_point(base, cfg.eval, record, method["chosen"])
            if match is None:
                raise ValueError(f"tuning.json: {base.label} chose {method['chosen']}, which "
                                 "is not on its grid")
            out.setdefault(ev_name, []).append(match)
            paper, beside = paper_choice(method), METHODS[base.method].paper_width
            if paper is not None and beside:
                point = grid_point(base, cfg.eval, record, paper)
                spec = dataclasses.replace(point.spec, method=beside)
                out[ev_name].append(Candidate(spec, cfg.eval, point.setting))
    return out


def grid_point(base: AgentSpec, eval_cfg: EvalConfig, record: dict[str, Any],
               setting: dict[str, Any]) -> Candidate | None:
    """The candidate of ``base``'s grid at ``setting``, with the width and noise variance its
    experiment's tuning ``record`` fitted (None: not on the grid)."""
    method = record["methods"][base.label]
    fitted = method.get("width")
    return next((c for c in candidates(base, eval_cfg, fitted, fitted_noise(record))
                 if dict(c.setting) == setting), None)


def task_groups(dataset: Path, cfg: ExperimentConfig) -> dict[int, int] | None:
    """Eval task id -> its goal (as one integer) where tasks share goals (the darkrooms: about
    five tasks per held-out goal), None elsewhere."""
    data = store.load_split(dataset, "eval", limit=cfg.eval.num_tasks)
    if "goal" not in data:
        return None
    goals = np.asarray(data["goal"]).reshape(len(data["task_id"]), -1)
    codes = np.unique(goals, axis=0, return_inverse=True)[1].reshape(-1)
    return dict(zip(np.asarray(data["task_id"]).tolist(), codes.tolist(), strict=True))


def read_tuning(run_dir: Path) -> dict[str, Any]:
    """``results/tuning.json`` ({} when missing, unreadable, or not vouched for by its
    SHA-256 sidecar, a missing sidecar included: everything is tuned again, so an edit cannot
    pass by deleting the sidecar; each record is also re-checked by ``record_problem`` before
    use)."""
    path = Path(run_dir) / TUNING_FILE
    record, why = verify(path)
    if record is None and why != MISSING:
        log.warning("%s: %s: every choice is tuned again", path, why)
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def headline(run_dir: Path, experiments: list[str]) -> tuple[dict[str, float], dict[str, Any]]:
    """The study's headline as tracker metrics and parameters (``results.choices.headline``
    over this run's ``results/tuning.json``)."""
    return choices_headline(run_dir, experiments, read_tuning(run_dir))
