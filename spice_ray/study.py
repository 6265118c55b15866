"""The whole study: datasets -> pretraining -> evaluation -> result tables -> figures -> report.

Experiments (each a dataset, its models and its result tables):

* ``bandit``: A=5, weak labels -> tables bandit_offline, bandit_online, bandit_robustness,
  calibration;
* ``bandit20``: A=20, weakmix80 labels -> bandit20_offline, bandit20_online,
  bandit20_robustness;
* ``darkroom``: weak-last labels -> darkroom_online (SPICE at three betas, DPT = AD-BC) and
  darkroom_weights (SPICE trained with no / only iw / only adv / only epi / all weights).

Every stage is skipped when its output already holds a complete result for the same inputs:
datasets and checkpoints by their manifests, result tables by their SHA-256 sidecar
``results/<table>.parquet.sha256``, which also records a hash of everything the table was
computed from (by content, so a copied run directory stays current).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from spice_ray.artifacts import is_current
from spice_ray.config import ConfigError, RunConfig, config_hash, make_config, resolve_run_dir
from spice_ray.data import schema, store
from spice_ray.evaluate.actors import evaluate_parallel
from spice_ray.evaluate.controllers import ControllerSpec
from spice_ray.evaluate.rollout import load_eval_tasks
from spice_ray.results import plots
from spice_ray.results.report import write_report
from spice_ray.results.tables import load, table_path, write
from spice_ray.stages import generate_stage
from spice_ray.train import checkpoint as ckpt
from spice_ray.train.ray_train import pretrain

log = logging.getLogger(__name__)

EXPERIMENT_ENVS = {
    "bandit": ("bandit", []),
    "bandit20": ("bandit", ["env.num_arms=20", "data.label=weakmix80"]),
    "darkroom": ("darkroom", []),
}
PRESET_EXPERIMENT_OVERRIDES = {  # per preset and experiment, applied before the user's --set
    "small": {"bandit20": ["env.horizon=200", "eval.online_horizon=200",
                           "data.num_train_tasks=1000"]},
    "paper": {"bandit20": ["train.epochs=100"]},  # PROTOCOL.md: the 20-arm ablation, 100 epochs
}
DARKROOM_BETAS = (0.5, 1.0, 2.0)
WEIGHT_VARIANTS = {  # name -> (use_iw, use_adv, use_epi); "all" is the main SPICE model
    "none": (False, False, False),
    "iw": (True, False, False),
    "adv": (False, True, False),
    "epi": (False, False, True),
}
BASELINE_SEED = -1
"""``seed`` of classical-baseline rows (they have no training seed)."""


@dataclass
class StudyPlan:
    """Validated configs of every experiment, built before any work starts."""

    configs: dict[str, RunConfig]
    run_dir: Path
    experiments: tuple[str, ...] = ("bandit", "bandit20", "darkroom")
    timings: dict[str, float] = field(default_factory=dict)


def plan_study(preset: str, out: str | Path | None, yaml_path: str | Path | None = None,
               overrides: list[str] | tuple[str, ...] = (),
               experiments: tuple[str, ...] = ("bandit", "bandit20", "darkroom")) -> StudyPlan:
    """Resolve and validate the config of every experiment.

    Raises:
        ConfigError: naming the experiment and the field, before any work.
    """
    run_dir = resolve_run_dir(out, preset, yaml_path, overrides)
    if not experiments:
        raise ConfigError(f"no experiment chosen: name one or more of {list(EXPERIMENT_ENVS)}")
    cfgs = {}
    for name in experiments:
        if name not in EXPERIMENT_ENVS:
            raise ConfigError(f"experiment {name!r} is invalid: one of {list(EXPERIMENT_ENVS)}")
        env, sets = EXPERIMENT_ENVS[name]
        sets = [*sets, *PRESET_EXPERIMENT_OVERRIDES.get(preset, {}).get(name, [])]
        try:
            cfgs[name] = make_config(preset, env, yaml_path=yaml_path,
                                     overrides=[*sets, *overrides],
                                     extra={"out_dir": str(run_dir)})
        except ConfigError as exc:
            raise ConfigError(f"experiment {name}: {exc}") from exc
    return StudyPlan(cfgs, run_dir, experiments)


def weight_variant(cfg: RunConfig, name: str) -> RunConfig:
    """``cfg`` with the SPICE policy weights of ablation variant ``name`` switched on/off."""
    iw, adv, epi = WEIGHT_VARIANTS[name]
    return cfg.replace(train=dataclasses.replace(cfg.train, use_iw=iw, use_adv=adv, use_epi=epi))


# ---- stage 2: pretraining ----------------------------------------------------------------


def models_of(name: str, cfg: RunConfig) -> list[tuple[str, str, RunConfig]]:
    """(kind, variant, config) of every model experiment ``name`` trains (per seed)."""
    out = [("spice", "", cfg), ("dpt", "", cfg)]
    if name == "darkroom":
        out += [("spice", v, weight_variant(cfg, v)) for v in WEIGHT_VARIANTS]
    return out


def pretrain_all(plan: StudyPlan, datasets: dict[str, Path]) -> dict[tuple[str, str, str, int],
                                                                     Path]:
    """Train every model of every experiment; {(experiment, kind, variant, seed): final}."""
    finals = {}
    jobs = [(name, kind, variant, c, seed)
            for name, cfg in plan.configs.items()
            for kind, variant, c in models_of(name, cfg) for seed in cfg.seeds]
    for i, (name, kind, variant, c, seed) in enumerate(jobs, 1):
        log.info("[pretrain %d/%d] %s %s%s seed %d", i, len(jobs), name, kind,
                 f" [{variant}]" if variant else "", seed)
        finals[(name, kind, variant, seed)] = pretrain(c, kind, seed, datasets[name])
    return finals


# ---- stage 3: evaluation -----------------------------------------------------------------


def _table_done(run_dir: Path, table: str, inputs_hash: str) -> bool:
    """Whether the table is intact (its SHA-256 sidecar matches) and made from these inputs;
    a corrupt or truncated table is named in the log and recomputed."""
    path = table_path(run_dir, table)
    current, reason = is_current(path, inputs_hash)
    if not current and reason != "missing":
        log.warning("[evaluate] %s: %s; recomputing it", path, reason)
    return current


def _write_table(run_dir: Path, table: str, df: pd.DataFrame, inputs_hash: str) -> None:
    write(run_dir, table, df, inputs=inputs_hash)


def _ckpt_ids(finals: dict, name: str) -> dict[str, str]:
    """Each checkpoint by content: its job identity and the SHA-256 of its weights (no paths,
    so a moved or copied run directory stays current)."""
    return {f"{k[1]}/{k[2]}/{k[3]}": ckpt.content_id(p)
            for k, p in sorted(finals.items()) if k[0] == name}


def _eval(source: Any, cfg: RunConfig, data: dict, specs: list[ControllerSpec],
          protocols: tuple[str, ...], seed: int) -> pd.DataFrame:
    return evaluate_parallel(source, cfg.env, cfg.eval, data, specs, protocols, seed=seed)


def evaluate_bandit(plan: StudyPlan, name: str, datasets: dict[str, Path], finals: dict
                    ) -> list[str]:
    """Offline, online and robustness tables (and calibration for A=5) of a bandit experiment."""
    cfg = plan.configs[name]
    tables = [f"{name}_offline", f"{name}_online", f"{name}_robustness"]
    if name == "bandit":
        tables.append("calibration")
    inputs = config_hash({"eval": dataclasses.asdict(cfg.eval),
                          "fusion": dataclasses.asdict(cfg.fusion),
                          "ckpts": _ckpt_ids(finals, name),
                          "data": store.split_id(datasets[name], "eval")})
    if all(_table_done(plan.run_dir, t, inputs) for t in tables):
        log.info("[evaluate] %s: tables are current, skipped", name)
        return tables
    data = load_eval_tasks(datasets[name], cfg.eval)
    protocols = ("offline", "online", "robustness")
    frames = []
    log.info("[evaluate] %s: baselines on %d tasks", name, len(data["task_id"]))
    baselines = [ControllerSpec(m) for m in ("emp", "ucb", "lcb", "ts")]
    frames.append(_eval(None, cfg, data, baselines, protocols, BASELINE_SEED))
    for seed in cfg.seeds:
        log.info("[evaluate] %s: SPICE and DPT seed %d", name, seed)
        spice_protocols = protocols + (("calibration",) if name == "bandit" else ())
        frames.append(_eval(str(finals[(name, "spice", "", seed)]), cfg, data,
                            [ControllerSpec("spice", fusion=cfg.fusion)], spice_protocols, seed))
        frames.append(_eval(str(finals[(name, "dpt", "", seed)]), cfg, data,
                            [ControllerSpec.dpt(cfg.eval)], protocols, seed))
    df = pd.concat(frames, ignore_index=True)
    split = {f"{name}_offline": df["metric"] == "suboptimality",
             f"{name}_online": df["metric"] == "cumulative_regret",
             f"{name}_robustness": df["metric"] == "final_regret"}
    if name == "bandit":
        split["calibration"] = ~df["metric"].isin(["suboptimality", "cumulative_regret",
                                                   "final_regret"])
    for table, mask in split.items():
        _write_table(plan.run_dir, table, df[mask], inputs)
    return tables


def evaluate_darkroom(plan: StudyPlan, datasets: dict[str, Path], finals: dict) -> list[str]:
    """darkroom_online (SPICE at each beta, DPT) and darkroom_weights (SPICE variants, DPT)."""
    cfg = plan.configs["darkroom"]
    tables = ["darkroom_online", "darkroom_weights"]
    inputs = config_hash({"eval": dataclasses.asdict(cfg.eval),
                          "fusion": dataclasses.asdict(cfg.fusion), "betas": DARKROOM_BETAS,
                          "ckpts": _ckpt_ids(finals, "darkroom"),
                          "data": store.split_id(datasets["darkroom"], "eval")})
    if all(_table_done(plan.run_dir, t, inputs) for t in tables):
        log.info("[evaluate] darkroom: tables are current, skipped")
        return tables
    data = load_eval_tasks(datasets["darkroom"], cfg.eval)
    online, weights = [], []
    for seed in cfg.seeds:
        log.info("[evaluate] darkroom: SPICE (beta %s) and DPT seed %d", DARKROOM_BETAS, seed)
        specs = [ControllerSpec("spice", fusion=dataclasses.replace(cfg.fusion, beta=b))
                 for b in DARKROOM_BETAS]
        spice_rows = _eval(str(finals[("darkroom", "spice", "", seed)]), cfg, data, specs,
                           ("online",), seed)
        dpt_rows = _eval(str(finals[("darkroom", "dpt", "", seed)]), cfg, data,
                         [ControllerSpec.dpt(cfg.eval)], ("online",), seed)
        online += [spice_rows, dpt_rows]
        main_beta = spice_rows["config"].map(lambda c: json.loads(c)["beta"] == cfg.fusion.beta)
        weights += [spice_rows[main_beta].assign(variant="all"), dpt_rows]
        for variant in WEIGHT_VARIANTS:
            log.info("[evaluate] darkroom: SPICE [%s] seed %d", variant, seed)
            rows = _eval(str(finals[("darkroom", "spice", variant, seed)]), cfg, data,
                         [ControllerSpec("spice", fusion=cfg.fusion)], ("online",), seed)
            weights.append(rows.assign(variant=variant))
    if cfg.eval.ppo_episodes > 0:
        from spice_ray.baselines.ppo import ppo_darkroom_rows

        log.info("[evaluate] darkroom: single-task PPO, %d episodes per task",
                 cfg.eval.ppo_episodes)
        ppo = ppo_darkroom_rows(data, cfg.env, cfg.eval, cfg.eval.ppo_episodes, seed=0)
        episode = ppo["config"].map(lambda c: f"episode {json.loads(c)['episode']}")
        online.append(ppo.assign(seed=BASELINE_SEED, variant=episode))
    _write_table(plan.run_dir, "darkroom_online", pd.concat(online, ignore_index=True), inputs)
    weights_df = pd.concat(weights, ignore_index=True)
    _write_table(plan.run_dir, "darkroom_weights",
                 weights_df[weights_df["metric"] == "cumulative_regret"], inputs)
    return tables


# ---- stages 4-5: figures and report ------------------------------------------------------

FIGURES: dict[str, list[tuple[str, Callable[..., Path], str]]] = {
    "bandit_offline": [("bandit_offline.png", plots.plot_offline, "Bandit A=5 offline")],
    "bandit_online": [("bandit_online.png", plots.plot_online, "Bandit A=5 online")],
    "bandit_robustness": [("bandit_robustness.png", plots.plot_robustness,
                           "Bandit A=5: final regret vs sigma")],
    "bandit20_offline": [("bandit20_offline.png", plots.plot_offline,
                          "Bandit A=20 weakmix80 offline")],
    "bandit20_online": [("bandit20_online.png", plots.plot_online,
                         "Bandit A=20 weakmix80 online")],
    "bandit20_robustness": [("bandit20_robustness.png", plots.plot_robustness,
                             "Bandit A=20: final regret vs sigma")],
    "darkroom_online": [("darkroom_online.png", plots.plot_darkroom, "Darkroom")],
    "darkroom_weights": [("darkroom_weights.png", plots.plot_weights,
                          "Darkroom weight ablation")],
    "calibration": [("calibration.png", plots.plot_calibration, "Bandit A=5 prior")],
}


def draw_figures(run_dir: Path, tables: list[str]) -> dict[str, list[Path]]:
    """One or more PNGs per table under ``<run_dir>/figures``."""
    out: dict[str, list[Path]] = {}
    for table in tables:
        df = load(run_dir, table)
        out[table] = [fn(df, run_dir / "figures" / fname, title)
                      for fname, fn, title in FIGURES.get(table, [])]
    return out


def run_study(plan: StudyPlan) -> Path:
    """Run every stage (each skipped when current); returns the report's path."""
    run_dir = plan.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    for name, cfg in plan.configs.items():
        cfg.write(run_dir / "configs", f"{name}.yaml")
    first = next(iter(plan.configs.values()))
    first.write(run_dir)  # config.yaml: the bandit experiment's resolved config
    t0 = time.perf_counter()
    datasets = {}
    for name, cfg in plan.configs.items():
        log.info("[stage 1/5 datasets] %s", name)
        datasets[name] = generate_stage(cfg).dataset_dir
    plan.timings["datasets"] = time.perf_counter() - t0

    t1 = time.perf_counter()
    log.info("[stage 2/5 pretrain]")
    finals = pretrain_all(plan, datasets)
    plan.timings["pretrain"] = time.perf_counter() - t1

    t2 = time.perf_counter()
    log.info("[stage 3/5 evaluate]")
    tables: list[str] = []
    for name in plan.configs:
        if name == "darkroom":
            tables += evaluate_darkroom(plan, datasets, finals)
        else:
            tables += evaluate_bandit(plan, name, datasets, finals)
    plan.timings["evaluate"] = time.perf_counter() - t2

    log.info("[stage 4/5 figures]")
    figures = draw_figures(run_dir, tables)
    log.info("[stage 5/5 report]")
    notes = [f"preset `{first.preset}`, training seeds {list(first.seeds)}",
             "Darkroom: with weak-last labels DPT and AD-BC are the same model (same trunk, "
             "loss and labels), reported once as DPT.",
             "Stage wall times (this invocation; 0 when skipped): "
             + ", ".join(f"{k} {v:.0f} s" for k, v in plan.timings.items())]
    configs = {name: cfg.to_yaml() for name, cfg in plan.configs.items()}
    return write_report(run_dir, figures, configs, notes,
                        horizon_points=(10, 50, first.env.horizon))


def describe_plan(plan: StudyPlan) -> str:
    """What ``run_study`` would do: stages, resources, expected sizes and rough times."""
    lines = [f"run directory: {plan.run_dir}", ""]
    total_bytes = 0
    lines.append("stage 1 datasets (Ray Data, CPU actors):")
    for name, cfg in plan.configs.items():
        cols = schema.columns(cfg.env.name, cfg.env.num_arms, cfg.env.horizon)
        n = sum(store.split_sizes(cfg.data).values())
        size = n * schema.raw_nbytes(cols)
        total_bytes += size
        lines.append(f"  {name:9s} {n:>8d} tasks, ~{size / 2**20:8.1f} MiB, "
                     f"{cfg.data.num_actors} actors x {cfg.data.actor_cpus} CPU, "
                     f"~{n / 4000:.0f} s at the 2-core rate of 4000 tasks/s")
    lines.append("stage 2 pretraining (Ray Train):")
    for name, cfg in plan.configs.items():
        models = models_of(name, cfg)
        steps = cfg.train.epochs * max(1, cfg.data.num_train_tasks // cfg.train.batch_size)
        tc = cfg.train
        lines.append(f"  {name:9s} {len(models)} models x {len(cfg.seeds)} seeds, "
                     f"{tc.epochs} epochs, {steps} steps of batch {tc.batch_size} x "
                     f"T={cfg.env.horizon} each; {tc.num_workers} workers "
                     f"({'1 GPU' if tc.use_gpu else f'{tc.worker_cpus} CPU'} each)")
    lines.append("stage 3 evaluation (Ray actors):")
    for name, cfg in plan.configs.items():
        lines.append(f"  {name:9s} {cfg.eval.num_tasks} tasks, H={cfg.eval.online_horizon}, "
                     f"{cfg.eval.num_actors} actors x {cfg.eval.actor_cpus} CPU"
                     + (f" + {cfg.eval.actor_gpus} GPU" if cfg.eval.actor_gpus else ""))
    lines += ["stage 4 figures, stage 5 report.md", "",
              f"datasets on disk: ~{total_bytes / 2**20:.0f} MiB"]
    return "\n".join(lines)
