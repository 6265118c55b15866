"""Test-time sections (fusion, evaluation, sweeps) and the run config that holds every section.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from spice_ray import envs
from spice_ray.config.presets import PRESET_NAMES
from spice_ray.config.sections import (
    KERNEL_SPACES,
    TRACKERS,
    DataConfig,
    EnvConfig,
    ModelConfig,
    TrainConfig,
    _check,
    _check_finite,
    _fail,
    to_plain,
)
from spice_ray.envs.labels import parse_label
from spice_ray.fusion.kernels import KERNELS, TAU_DEFAULT
from spice_ray.fusion.posterior import TAIL_DEFAULT, TAILS
from spice_ray.fusion.rules import ACTION_RULES, BETA_DEFAULT, BETA_SCHEDULES
from spice_ray.fusion.width import (
    WIDTH_DECAY_DEFAULT,
    WIDTH_SCALE_DEFAULT,
    WIDTH_SOURCE_DEFAULT,
)

WIDTH_SOURCES = ("ensemble", "predictive")
"""``FusionConfig.width_source``: the ensemble's spread, or the predictive-variance head."""


@dataclass(frozen=True)
class FusionConfig:
    """Test-time Bayesian fusion of the ensemble prior with kernel-weighted context evidence."""

    kernel: str = "uniform"
    """State-similarity kernel w_t in [0, 1], one of ``spice_ray.fusion.kernels.KERNELS``."""
    kernel_space: Literal["latent", "context", "state"] = "latent"
    """What the kernel compares: "latent" (the trunk's output for a state alone, the query
    token [s, 0, 0, 0]), "context" (the latents the value heads read: position T for the
    current state, position t-1 for context state s_t) or "state" (raw states)."""
    tau: float = TAU_DEFAULT
    """RBF bandwidth (> 0)."""
    noise_var: float = 0.09
    """Likelihood variance sigma^2 of the targets (>= 0; floored internally to avoid 1/0)."""
    v_min: float = 1e-2
    """Floor of the prior variance v_pri = max(sigma_Q^2, v_min) (> 0)."""
    width_scale: float = WIDTH_SCALE_DEFAULT
    """Scale s of the learned prior's width (>= 0): v_pri = max((s sigma_Q)^2, v_min); 1 is the
    paper. Only SPICE's learned prior reads it (not the flat or oracle priors, nor the
    exact-width diagnostic); ``spice_ray.evaluate.width`` fits it on validation tasks without
    labels."""
    width_decay: float = WIDTH_DECAY_DEFAULT
    """How the learned prior's width narrows with the context length h (>= 0): s sigma_Q
    (1 + width_decay h)^(-1/2); 0 (constant) is the paper. Fitted with ``width_scale``."""
    width_source: Literal["ensemble", "predictive"] = WIDTH_SOURCE_DEFAULT
    """Where the learned prior's sd comes from: the ensemble's spread sigma_Q (the paper,
    scaled and narrowed as above), or "predictive": the model's predictive variance of the
    next target (``model.var_head``) less the likelihood variance, sqrt(max(v - sigma^2, 0))
    times ``width_scale``, floored at v_min like any prior variance."""
    beta: float = BETA_DEFAULT
    """Posterior-UCB optimism (>= 0) when beta_schedule is fixed."""
    beta_schedule: Literal["fixed", "sqrt2logt", "sqrt_log_sat"] = "fixed"
    """Fixed beta; the bandit theory schedule beta_t = sqrt(2 log t) (ignores beta); or the
    paper's MDP schedule beta_t = beta sqrt(log(S A t)) (S states, A actions)."""
    rule: str = "ucb"
    """Online action rule on the posterior: greedy, posterior-UCB, Thompson sampling, or any
    rule of ``spice_ray.fusion.rules.ACTION_RULES``."""
    target: Literal["reward", "nstep"] = "reward"
    """Evidence targets y_t: immediate reward or the n-step bootstrapped return."""
    td_n: int = 1
    """n of the n-step targets (>= 1)."""
    gamma: float = 0.0
    """Discount of the n-step targets in [0, 1]."""
    tail: Literal["truncate", "bootstrap", "inside"] = TAIL_DEFAULT
    """An n-step window cut by the context's end: not bootstrapped (the paper's indicator),
    bootstrapped from the last state it reaches ("bootstrap", a departure: the newest
    transitions' targets then sit on the others' scale), or from the state that starts the
    last transition ("inside"; ``fusion.nstep_targets``)."""
    bootstrap: Literal["max", "mean"] = "max"
    """V(s_{t+n}) in the n-step targets: max_a' Q-bar (the paper) or the mean over actions."""

    def __post_init__(self) -> None:
        _check_finite(self, "fusion")
        _check(self.kernel in KERNELS, "fusion.kernel", self.kernel,
               f"one of {', '.join(KERNELS)}")
        _check(self.kernel_space in KERNEL_SPACES, "fusion.kernel_space", self.kernel_space,
               f"one of {', '.join(KERNEL_SPACES)}")
        _check(self.tau > 0, "fusion.tau", self.tau, "a float > 0")
        _check(self.noise_var >= 0, "fusion.noise_var", self.noise_var, "a float >= 0")
        _check(self.v_min > 0, "fusion.v_min", self.v_min, "a float > 0")
        _check(self.width_scale >= 0, "fusion.width_scale", self.width_scale, "a float >= 0")
        _check(self.width_decay >= 0, "fusion.width_decay", self.width_decay, "a float >= 0")
        _check(self.width_source in WIDTH_SOURCES, "fusion.width_source", self.width_source,
               f"one of {', '.join(WIDTH_SOURCES)}")
        _check(self.beta >= 0, "fusion.beta", self.beta, "a float >= 0")
        _check(self.beta_schedule in BETA_SCHEDULES, "fusion.beta_schedule",
               self.beta_schedule, f"one of {', '.join(BETA_SCHEDULES)}")
        _check(self.rule in ACTION_RULES, "fusion.rule", self.rule,
               f"one of {', '.join(ACTION_RULES)}")
        _check(self.target in ("reward", "nstep"), "fusion.target", self.target,
               "one of reward, nstep")
        _check(self.td_n >= 1, "fusion.td_n", self.td_n, "an integer >= 1")
        _check(0.0 <= self.gamma <= 1.0, "fusion.gamma", self.gamma, "a float in [0, 1]")
        _check(self.tail in TAILS, "fusion.tail", self.tail, f"one of {', '.join(TAILS)}")
        _check(self.bootstrap in ("max", "mean"), "fusion.bootstrap", self.bootstrap,
               "one of max, mean")


@dataclass(frozen=True)
class EvalConfig:
    """Offline and online evaluation protocol."""

    num_tasks: int = 200
    """Evaluation tasks taken from the eval split (>= 1, <= data.num_eval_tasks)."""
    online_horizon: int = 500
    """Online interaction steps H from an empty context (>= 1)."""
    offline_points: int = 25
    """Context lengths h on the offline curve (>= 2, <= env.horizon)."""
    robustness_sigmas: tuple[float, ...] = (0.0, 0.3, 0.5)
    """Test-time reward noise levels of the robustness sweep (each >= 0)."""
    episodes: int = 1
    """Darkroom episodes per online run, context kept across them (>= 1)."""
    seed: int = 1234
    """Seed of the evaluation noise streams (common random numbers across agents)."""
    num_actors: int = 2
    """Parallel evaluation actors (>= 1)."""
    actor_cpus: float = 0.5
    """CPUs per evaluation actor (> 0)."""
    actor_gpus: float = 0.0
    """GPUs per evaluation actor (>= 0; fractional GPUs allowed)."""
    dpt_sample: bool = True
    """DPT online: sample from the policy (True) or act greedily (False)."""
    ucb_c: float = 1.0
    """UCB bonus scale c in mu_hat + c * sqrt(1/n) (>= 0)."""
    lcb_c: float = 1.0
    """LCB penalty scale c in mu_hat - c * sqrt(1/n) (>= 0)."""
    ts_prior_mean: float = 0.5
    """Thompson sampling Gaussian prior mean."""
    ts_prior_var: float = 1.0 / 12.0
    """Thompson sampling Gaussian prior variance (> 0)."""
    ppo_episodes: int = 0
    """Darkroom single-task PPO reference: training budget in episodes per task (0: off;
    needs the `ppo` extra, stable-baselines3 with its defaults)."""

    def __post_init__(self) -> None:
        _check_finite(self, "eval")
        _check(self.ppo_episodes >= 0, "eval.ppo_episodes", self.ppo_episodes, "an integer >= 0")
        for name in ("num_tasks", "online_horizon", "episodes", "num_actors"):
            value = getattr(self, name)
            _check(value >= 1, f"eval.{name}", value, "an integer >= 1")
        _check(self.offline_points >= 2, "eval.offline_points", self.offline_points,
               "an integer >= 2")
        for s in self.robustness_sigmas:
            _check(s >= 0, "eval.robustness_sigmas", self.robustness_sigmas, "each >= 0")
        _check(self.seed >= 0, "eval.seed", self.seed, "an integer >= 0")
        _check(self.actor_cpus > 0, "eval.actor_cpus", self.actor_cpus, "a float > 0")
        _check(self.actor_gpus >= 0, "eval.actor_gpus", self.actor_gpus, "a float >= 0")
        _check(self.ucb_c >= 0, "eval.ucb_c", self.ucb_c, "a float >= 0")
        _check(self.lcb_c >= 0, "eval.lcb_c", self.lcb_c, "a float >= 0")
        _check(self.ts_prior_var > 0, "eval.ts_prior_var", self.ts_prior_var, "a float > 0")


@dataclass(frozen=True)
class SweepConfig:
    """Ray Tune sweep settings (the search spaces themselves live in sweeps/*.py)."""

    max_concurrent_trials: int = 0
    """Trials running at once; 0 derives it from the cluster's CPUs (keeping one CPU for Ray's
    own tasks), >= 1 fixes it. Keep trials x actors x actor_cpus <= CPUs."""
    actors_per_trial: int = 2
    """Evaluation actors each trial dispatches (>= 1)."""
    actor_cpus: float = 0.5
    """CPUs per evaluation actor inside a trial's placement group (> 0)."""
    num_samples: int = 1
    """Repeats of the grid (grid search), or trials to sample (random, optuna: at most, a
    configuration drawn again is not run); >= 1."""
    search: Literal["grid", "random", "optuna"] = "grid"
    """How trials are chosen: every point of a ``tune.grid_search`` space (grid); or samples
    of ``tune.uniform``/``loguniform``/``choice`` (and conditional) keys drawn through Tune's
    Optuna searcher, uniformly (random) or by TPE (optuna), seeded by ``sweep.seed``; both need
    the ``optuna`` package, and neither runs one configuration twice."""
    scheduler: Literal["fifo", "asha"] = "fifo"
    """fifo runs every trial to the end; asha (Tune's ASHA) stops a trial whose running
    regret after a chunk is in the worse 1 - 1/reduction_factor of its rung."""
    chunks: int = 0
    """Parts of the scored tasks a trial reports after (its running regret): 0 means 1 with
    fifo and 4 with asha."""
    reduction_factor: float = 2.0
    """ASHA's reduction factor (> 1)."""
    seed: int = 0
    """Seed of the searcher (random and optuna)."""
    split: Literal["validation", "eval"] = "validation"
    """The tasks a trial is scored on: the validation split (default: a hyperparameter is
    never chosen on the test tasks), or "eval", which every row and summary of the sweep then
    names in its ``split`` column."""

    def __post_init__(self) -> None:
        _check_finite(self, "sweep")
        _check(self.split in ("validation", "eval"), "sweep.split", self.split,
               "validation (the default) or eval")
        for name in ("actors_per_trial", "num_samples"):
            value = getattr(self, name)
            _check(value >= 1, f"sweep.{name}", value, "an integer >= 1")
        _check(self.search in ("grid", "random", "optuna"), "sweep.search", self.search,
               "one of grid, random, optuna")
        _check(self.scheduler in ("fifo", "asha"), "sweep.scheduler", self.scheduler,
               "one of fifo, asha")
        _check(self.chunks >= 0, "sweep.chunks", self.chunks, "an integer >= 0 (0: auto)")
        _check(self.reduction_factor > 1, "sweep.reduction_factor", self.reduction_factor,
               "a float > 1")
        _check(self.seed >= 0, "sweep.seed", self.seed, "an integer >= 0")
        _check(self.max_concurrent_trials >= 0, "sweep.max_concurrent_trials",
               self.max_concurrent_trials, "an integer >= 0 (0: derive from the cluster)")
        _check(self.actor_cpus > 0, "sweep.actor_cpus", self.actor_cpus, "a float > 0")

    def report_chunks(self) -> int:
        """Chunks a trial reports after (``chunks``, or its default for the scheduler)."""
        return self.chunks or (4 if self.scheduler == "asha" else 1)


@dataclass(frozen=True)
class ExperimentConfig:
    """One experiment: an environment, its dataset, models, fusion and evaluation."""

    preset: Literal["smoke", "small", "medium", "paper"] = "small"
    """Preset the run was built from."""
    seeds: tuple[int, ...] = (0,)
    """Training seeds (paper: 0, 1, 2)."""
    out_dir: str = "runs/default"
    """Run directory for datasets, checkpoints, results and figures."""
    env: EnvConfig = field(default_factory=EnvConfig)
    """Environment."""
    data: DataConfig = field(default_factory=DataConfig)
    """Dataset generation."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """Model architecture."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """Pretraining."""
    fusion: FusionConfig = field(default_factory=FusionConfig)
    """Test-time fusion."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """Evaluation protocol."""
    sweep: SweepConfig = field(default_factory=SweepConfig)
    """Ray Tune sweeps."""
    track: Literal["none", "tensorboard", "mlflow", "wandb"] = "none"
    """Experiment tracking (``spice_ray.runtime.tracking``): per-step training losses, sweep trials
    and the result tables go to TensorBoard (``<out_dir>/tensorboard``), MLflow (``track_uri``)
    or Weights & Biases (offline unless ``WANDB_MODE=online``). Needs the ``track`` extra."""
    track_uri: str = ""
    """MLflow tracking URI ("" means a local SQLite store ``<out_dir>/mlflow.db``)."""
    track_project: str = "spice-ray"
    """MLflow experiment / W&B project name prefix (the experiment's name is appended)."""

    def __post_init__(self) -> None:
        _check_finite(self, "")
        _check(self.track in TRACKERS, "track", self.track, f"one of {', '.join(TRACKERS)}")
        _check(bool(self.track_project.strip()), "track_project", self.track_project,
               "a non-empty name")
        _check(self.preset in PRESET_NAMES, "preset", self.preset, f"one of {PRESET_NAMES}")
        _check(len(self.seeds) >= 1, "seeds", self.seeds, "at least one seed")
        for s in self.seeds:
            _check(s >= 0, "seeds", self.seeds, "each seed >= 0")
        _check(len(set(self.seeds)) == len(self.seeds), "seeds", self.seeds,
               "each seed once (a repeated seed would train and count the same model twice)")
        kind, _ = parse_label(self.data.label)
        supported = envs.env_class(self.env.name).labels
        if kind not in supported:
            _fail("data.label", self.data.label,
                  f"env.name={self.env.name} supports the label rules {', '.join(supported)}")
        _check(self.train.value_target == "reward" or (
            envs.env_class(self.env.name).stateless and self.train.td_n == 1
            and self.train.gamma == 0), "train.value_target", self.train.value_target,
            f"reward for env.name={self.env.name} (mean: stateless bandits, td_n 1, gamma 0)")
        _check(self.eval.num_tasks <= self.data.num_eval_tasks, "eval.num_tasks",
               self.eval.num_tasks, f"<= data.num_eval_tasks={self.data.num_eval_tasks}")
        _check(self.eval.offline_points <= self.env.horizon, "eval.offline_points",
               self.eval.offline_points, f"<= env.horizon={self.env.horizon}")

    # ---- helpers -------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Plain nested dict (tuples as lists) suitable for YAML and JSON."""
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            out[f.name] = (value.to_dict() if isinstance(value, EnvConfig)
                           else dataclasses.asdict(value) if dataclasses.is_dataclass(value)
                           else value)
        return to_plain(out)

    def environment(self) -> envs.Environment:
        """The environment object of this run."""
        return self.env.environment()

    def to_yaml(self) -> str:
        """The resolved config as YAML text."""
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def write(self, directory: str | Path, name: str = "config.yaml") -> Path:
        """Write the resolved config beside a stage's outputs (atomically: a symbolic link
        there is replaced, never written through) and return its path."""
        from spice_ray.common.artifacts import atomic_write_text

        return atomic_write_text(Path(directory) / name, self.to_yaml())

    def replace(self, **sections: Any) -> ExperimentConfig:
        """A copy with whole sections or top-level fields replaced (validated again)."""
        return dataclasses.replace(self, **sections)




