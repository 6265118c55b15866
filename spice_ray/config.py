"""Typed, frozen run configuration: one dataclass per stage, presets, YAML and ``--set`` overrides.

Every value a user can set lives here with a one-line docstring. A config is validated when it is
built (``__post_init__``), so nothing runs before it is valid, and every error names the field
(``data.num_train_tasks``), the value and the allowed range.

Layering, lowest first: dataclass defaults -> the environment's defaults (bandit or darkroom) ->
the preset (smoke / small / paper) -> a YAML file -> ``--set section.field=value`` overrides.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from spice_ray.errors import SpiceRayError

ENV_NAMES = ("bandit", "darkroom")
PRESET_NAMES = ("smoke", "small", "paper")
LABEL_MODES = ("optimal", "weak", "weakmix80", "weak-last", "mix:q")
HEAD_KERNELS = ("auto", "compiled", "eager")
_FLOAT_RE = re.compile(r"^[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?$")
_MIX_RE = re.compile(r"^mix:(?P<q>[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)$")


class ConfigError(SpiceRayError, ValueError):
    """A configuration value is missing, unknown, of the wrong type or out of range."""


def _fail(path: str, value: Any, allowed: str) -> None:
    raise ConfigError(f"{path}={value!r} is invalid: {allowed}")


def _check(cond: bool, path: str, value: Any, allowed: str) -> None:
    if not cond:
        _fail(path, value, allowed)


def _check_finite(obj: Any, section: str) -> None:
    """Refuse NaN and infinities in every float field (and float tuple) of a config section:
    no field here has a meaning for them, and one would reach training or a table silently."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        values = value if isinstance(value, tuple) else (value,)
        for v in values:
            if isinstance(v, float) and not math.isfinite(v):
                _fail(f"{section}.{f.name}" if section else f.name, value, "a finite number")


def parse_label(label: str) -> tuple[str, float]:
    """Split a label mode into (kind, q). ``weakmix80`` is ``mix`` with q=0.8.

    Returns:
        ("optimal" | "weak" | "weak-last" | "mix", q) where q is only meaningful for "mix".
    """
    if label == "weakmix80":
        return "mix", 0.8
    if label in ("optimal", "weak", "weak-last"):
        return label, 0.0
    m = _MIX_RE.match(label)
    if m:
        return "mix", float(m.group("q"))
    raise ConfigError(
        f"data.label={label!r} is invalid: one of optimal, weak, weakmix80, weak-last, mix:q "
        "with q in [0, 1]"
    )


@dataclass(frozen=True)
class EnvConfig:
    """The task family."""

    name: Literal["bandit", "darkroom"] = "bandit"
    """Environment family: Gaussian multi-armed bandit or the 10x10 Darkroom gridworld."""
    num_arms: int = 5
    """Bandit arms A (>= 2). Darkroom always has 5 actions and ignores this."""
    horizon: int = 500
    """Context length H of the pretraining roll-ins (>= 1)."""
    sigma: float = 0.3
    """Bandit reward noise standard deviation used for the datasets (>= 0)."""
    grid_size: int = 10
    """Darkroom side length (>= 2); states are (x, y) in [0, grid_size)^2."""
    train_goal_fraction: float = 0.8
    """Darkroom fraction of goal cells used for training tasks, in (0, 1)."""
    goal_split_seed: int = 0
    """Seed of the fixed train/test goal split (Darkroom)."""

    def __post_init__(self) -> None:
        _check_finite(self, "env")
        _check(self.name in ENV_NAMES, "env.name", self.name, f"one of {ENV_NAMES}")
        _check(2 <= self.num_arms <= 255, "env.num_arms", self.num_arms, "an integer in [2, 255]")
        _check(self.horizon >= 1, "env.horizon", self.horizon, "an integer >= 1")
        _check(self.sigma >= 0, "env.sigma", self.sigma, "a float >= 0")
        _check(2 <= self.grid_size <= 255, "env.grid_size", self.grid_size,
               "an integer in [2, 255]")
        _check(
            0 < self.train_goal_fraction < 1,
            "env.train_goal_fraction",
            self.train_goal_fraction,
            "a float in (0, 1)",
        )
        _check(self.goal_split_seed >= 0, "env.goal_split_seed", self.goal_split_seed, ">= 0")

    @property
    def num_actions(self) -> int:
        """A: arms for bandits, 5 moves for Darkroom."""
        return self.num_arms if self.name == "bandit" else 5

    @property
    def state_dim(self) -> int:
        """S: 1 (a constant zero) for bandits, 2 (x, y) for Darkroom."""
        return 1 if self.name == "bandit" else 2


@dataclass(frozen=True)
class DataConfig:
    """Offline dataset generation (Ray Data -> Parquet shards)."""

    seed: int = 0
    """Dataset seed; task i of split s draws its randomness from (seed, s, i) only."""
    num_train_tasks: int = 100_000
    """Pretraining tasks (>= 1)."""
    num_val_tasks: int = 1_000
    """Validation tasks, same distribution as train (>= 1)."""
    num_eval_tasks: int = 200
    """Held-out evaluation tasks (>= 1; paper: 200 bandit, 100 darkroom)."""
    label: str = "weak"
    """Label rule: optimal, weak (bandit i*), weakmix80, mix:q, weak-last."""
    behaviour_omega: float = 0.5
    """Bandit behaviour mixture weight omega on the favoured arm, in [0, 1]."""
    shard_size: int = 10_000
    """Tasks per Parquet shard (>= 1)."""
    batch_size: int = 1_000
    """Tasks generated per vectorised map_batches call (>= 1)."""
    num_actors: int = 2
    """Generation actors in the Ray Data actor pool (>= 1)."""
    actor_cpus: float = 0.5
    """CPUs reserved per generation actor (> 0); fractional so Ray Data's own tasks can run."""
    compression: Literal["zstd", "snappy", "none"] = "zstd"
    """Parquet compression codec."""

    def __post_init__(self) -> None:
        _check_finite(self, "data")
        _check(self.seed >= 0, "data.seed", self.seed, "an integer >= 0")
        for name in ("num_train_tasks", "num_val_tasks", "num_eval_tasks", "shard_size",
                     "batch_size", "num_actors"):
            value = getattr(self, name)
            _check(value >= 1, f"data.{name}", value, "an integer >= 1")
        kind, q = parse_label(self.label)
        _check(0.0 <= q <= 1.0, "data.label", self.label, "mix:q needs q in [0, 1]")
        _check(0.0 <= self.behaviour_omega <= 1.0, "data.behaviour_omega", self.behaviour_omega,
               "a float in [0, 1]")
        _check(self.actor_cpus > 0, "data.actor_cpus", self.actor_cpus, "a float > 0")
        _check(self.compression in ("zstd", "snappy", "none"), "data.compression",
               self.compression, "one of zstd, snappy, none")


@dataclass(frozen=True)
class ModelConfig:
    """Causal GPT-2-style trunk, policy head and K-head value ensemble."""

    n_layer: int = 6
    """Transformer blocks (>= 1)."""
    n_embd: int = 64
    """Width D (>= 1, divisible by n_head)."""
    n_head: int = 1
    """Attention heads (>= 1)."""
    dropout: float = 0.0
    """Dropout probability in [0, 1)."""
    ensemble_size: int = 7
    """Value heads K (>= 2; an unbiased std needs two)."""
    prior_scale: float = 1.0
    """alpha: scale of the frozen random prior network in Q_k = f_k + alpha * p_k (>= 0)."""
    head_hidden: int = 64
    """Hidden width of each value head's MLP (>= 1)."""
    head_depth: int = 1
    """Hidden layers of each value head's MLP (>= 1)."""
    head_kernel: Literal["auto", "compiled", "eager"] = "auto"
    """How depth-1 value heads run: "compiled" (fused torch.compile kernels), "eager" (the layer
    stack under plain autograd, same math) or "auto" (compiled for >= 1024 rows while
    torch.compile works in this process, else eager)."""

    def __post_init__(self) -> None:
        _check_finite(self, "model")
        for name in ("n_layer", "n_embd", "n_head", "head_hidden", "head_depth"):
            value = getattr(self, name)
            _check(value >= 1, f"model.{name}", value, "an integer >= 1")
        _check(self.n_embd % self.n_head == 0, "model.n_embd", self.n_embd,
               f"divisible by model.n_head={self.n_head}")
        _check(0.0 <= self.dropout < 1.0, "model.dropout", self.dropout, "a float in [0, 1)")
        _check(self.ensemble_size >= 2, "model.ensemble_size", self.ensemble_size,
               "an integer >= 2")
        _check(self.prior_scale >= 0, "model.prior_scale", self.prior_scale, "a float >= 0")
        _check(self.head_kernel in HEAD_KERNELS, "model.head_kernel", self.head_kernel,
               f"one of {', '.join(HEAD_KERNELS)}")


@dataclass(frozen=True)
class TrainConfig:
    """Pretraining objective and Ray Train settings."""

    epochs: int = 300
    """Passes over the train split (>= 1; paper: 300 bandit, 50 darkroom)."""
    batch_size: int = 64
    """Sequences per optimisation step, summed over workers (>= 1)."""
    lr: float = 1e-4
    """AdamW learning rate (> 0)."""
    weight_decay: float = 1e-4
    """AdamW weight decay (>= 0)."""
    grad_clip: float = 1.0
    """Gradient-norm clip; 0 disables it (>= 0)."""
    cosine_schedule: bool = False
    """Cosine-decay the learning rate to 0 over the run."""
    lambda_q: float = 1.0
    """Weight of L_TD + L_shrink in the total loss (>= 0)."""
    lambda_anchor: float = 1e-4
    """Weight of the anchor penalty (>= 0)."""
    use_iw: bool = True
    """Importance weight omega_IS = clip(pi_u(a*) / pi_b(a*), 0, clip_iw)."""
    use_adv: bool = True
    """Advantage weight omega_adv = clip(exp(A / adv_temperature), weight_floor, adv_clip)."""
    use_epi: bool = True
    """Epistemic weight omega_epi = clip(1 + epi_scale * sigma_Q, weight_floor, epi_clip)."""
    clip_iw: float = 10.0
    """Upper clip c_iw of the importance weight (> 0)."""
    adv_temperature: float = 1.0
    """tau_adv of the advantage weight (> 0)."""
    adv_clip: float = 10.0
    """Upper clip c_adv of the advantage weight (> 0)."""
    epi_scale: float = 1.0
    """lambda_sigma of the epistemic weight (>= 0)."""
    epi_clip: float = 10.0
    """Upper clip c_epi of the epistemic weight (> 0)."""
    weight_floor: float = 1e-3
    """Lower clip epsilon of the advantage and epistemic weights (>= 0)."""
    detach_weights: bool = True
    """Stop gradients through omega into the value heads."""
    td_n: int = 1
    """n of the TD(n) targets (>= 1; bandits 1, darkroom 5)."""
    gamma: float = 0.0
    """Discount of the TD(n) targets in [0, 1] (bandits 0, darkroom 0.95)."""
    bootstrap: Literal["max", "mean"] = "max"
    """V(s_{t+n}) in the TD(n) targets: max_a' Q-bar (the paper) or the mean over actions (the
    uniform behaviour policy's value, free of maximisation bias)."""
    shrink_prior: Literal["fixed", "data"] = "fixed"
    """Where mu_0 and v_0 of the shrinkage posterior come from: the two fields below ("fixed",
    the bandit's U[0, 1] prior), or the train split's own TD(n) reward targets (their mean and
    variance, computed before training and written into those fields of the job's config)."""
    shrink_prior_mean: float = 0.5
    """mu_0 of the shrinkage posterior."""
    shrink_prior_var: float = 1.0 / 12.0
    """v_0 of the shrinkage posterior (> 0)."""
    shrink_noise_var: float = 0.09
    """sigma^2 of the shrinkage posterior (> 0)."""
    num_workers: int = 1
    """Ray Train workers (>= 0; 0 runs the loop in the driver process)."""
    use_gpu: bool = False
    """One GPU per Train worker, bf16 autocast."""
    worker_cpus: float = 0.5
    """CPUs per Train worker (> 0); fractional on small machines so Ray Data can stream."""
    checkpoint_every: int = 10
    """Checkpoint every N epochs (>= 1), and always at the end."""
    max_failures: int = 2
    """Worker failures Ray Train retries from the last checkpoint (>= 0)."""

    def __post_init__(self) -> None:
        _check_finite(self, "train")
        for name in ("epochs", "batch_size", "td_n", "checkpoint_every"):
            value = getattr(self, name)
            _check(value >= 1, f"train.{name}", value, "an integer >= 1")
        for name in ("lr", "clip_iw", "adv_temperature", "adv_clip", "epi_clip",
                     "shrink_prior_var", "shrink_noise_var", "worker_cpus"):
            value = getattr(self, name)
            _check(value > 0, f"train.{name}", value, "a float > 0")
        for name in ("weight_decay", "grad_clip", "lambda_q", "lambda_anchor", "epi_scale",
                     "weight_floor"):
            value = getattr(self, name)
            _check(value >= 0, f"train.{name}", value, "a float >= 0")
        _check(0.0 <= self.gamma <= 1.0, "train.gamma", self.gamma, "a float in [0, 1]")
        _check(self.bootstrap in ("max", "mean"), "train.bootstrap", self.bootstrap,
               "one of max, mean")
        _check(self.shrink_prior in ("fixed", "data"), "train.shrink_prior", self.shrink_prior,
               "one of fixed, data")
        _check(self.num_workers >= 0, "train.num_workers", self.num_workers, "an integer >= 0")
        _check(self.max_failures >= 0, "train.max_failures", self.max_failures, ">= 0")


@dataclass(frozen=True)
class FusionConfig:
    """Test-time Bayesian fusion of the ensemble prior with kernel-weighted context evidence."""

    kernel: Literal["uniform", "rbf", "cosine"] = "uniform"
    """State-similarity kernel w_t in [0, 1]."""
    kernel_space: Literal["latent", "context", "state"] = "latent"
    """What the kernel compares: "latent" (the trunk's output for a state alone, the query
    token [s, 0, 0, 0]), "context" (the latents the value heads read: position T for the
    current state, position t-1 for context state s_t) or "state" (raw states)."""
    tau: float = 0.5
    """RBF bandwidth (> 0)."""
    noise_var: float = 0.09
    """Likelihood variance sigma^2 of the targets (>= 0; floored internally to avoid 1/0)."""
    v_min: float = 1e-2
    """Floor of the prior variance v_pri = max(sigma_Q^2, v_min) (> 0)."""
    beta: float = 1.0
    """Posterior-UCB optimism (>= 0) when beta_schedule is fixed."""
    beta_schedule: Literal["fixed", "sqrt2logt"] = "fixed"
    """Fixed beta, or the theory schedule beta_t = sqrt(2 log t)."""
    controller: Literal["greedy", "ucb", "thompson"] = "ucb"
    """Online action rule on the posterior."""
    target: Literal["reward", "nstep"] = "reward"
    """Evidence targets y_t: immediate reward or the n-step bootstrapped return."""
    td_n: int = 1
    """n of the n-step targets (>= 1)."""
    gamma: float = 0.0
    """Discount of the n-step targets in [0, 1]."""
    bootstrap: Literal["max", "mean"] = "max"
    """V(s_{t+n}) in the n-step targets: max_a' Q-bar (the paper) or the mean over actions."""

    def __post_init__(self) -> None:
        _check_finite(self, "fusion")
        _check(self.kernel in ("uniform", "rbf", "cosine"), "fusion.kernel", self.kernel,
               "one of uniform, rbf, cosine")
        _check(self.kernel_space in ("latent", "context", "state"), "fusion.kernel_space",
               self.kernel_space, "one of latent, context, state")
        _check(self.tau > 0, "fusion.tau", self.tau, "a float > 0")
        _check(self.noise_var >= 0, "fusion.noise_var", self.noise_var, "a float >= 0")
        _check(self.v_min > 0, "fusion.v_min", self.v_min, "a float > 0")
        _check(self.beta >= 0, "fusion.beta", self.beta, "a float >= 0")
        _check(self.beta_schedule in ("fixed", "sqrt2logt"), "fusion.beta_schedule",
               self.beta_schedule, "one of fixed, sqrt2logt")
        _check(self.controller in ("greedy", "ucb", "thompson"), "fusion.controller",
               self.controller, "one of greedy, ucb, thompson")
        _check(self.target in ("reward", "nstep"), "fusion.target", self.target,
               "one of reward, nstep")
        _check(self.td_n >= 1, "fusion.td_n", self.td_n, "an integer >= 1")
        _check(0.0 <= self.gamma <= 1.0, "fusion.gamma", self.gamma, "a float in [0, 1]")
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
    """Seed of the evaluation noise streams (common random numbers across controllers)."""
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
    """Repeats of the grid (>= 1)."""

    def __post_init__(self) -> None:
        _check_finite(self, "sweep")
        for name in ("actors_per_trial", "num_samples"):
            value = getattr(self, name)
            _check(value >= 1, f"sweep.{name}", value, "an integer >= 1")
        _check(self.max_concurrent_trials >= 0, "sweep.max_concurrent_trials",
               self.max_concurrent_trials, "an integer >= 0 (0: derive from the cluster)")
        _check(self.actor_cpus > 0, "sweep.actor_cpus", self.actor_cpus, "a float > 0")


@dataclass(frozen=True)
class RunConfig:
    """One experiment: an environment, its dataset, models, fusion and evaluation."""

    preset: Literal["smoke", "small", "paper"] = "small"
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

    def __post_init__(self) -> None:
        _check_finite(self, "")
        _check(self.preset in PRESET_NAMES, "preset", self.preset, f"one of {PRESET_NAMES}")
        _check(len(self.seeds) >= 1, "seeds", self.seeds, "at least one seed")
        for s in self.seeds:
            _check(s >= 0, "seeds", self.seeds, "each seed >= 0")
        _check(len(set(self.seeds)) == len(self.seeds), "seeds", self.seeds,
               "each seed once (a repeated seed would train and count the same model twice)")
        kind, _ = parse_label(self.data.label)
        if self.env.name == "darkroom" and kind == "weak":
            _fail("data.label", self.data.label,
                  "'weak' (the favoured bandit arm) exists only for env.name=bandit; "
                  "darkroom uses weak-last, optimal or mix:q")
        _check(self.eval.num_tasks <= self.data.num_eval_tasks, "eval.num_tasks",
               self.eval.num_tasks, f"<= data.num_eval_tasks={self.data.num_eval_tasks}")
        _check(self.eval.offline_points <= self.env.horizon, "eval.offline_points",
               self.eval.offline_points, f"<= env.horizon={self.env.horizon}")

    # ---- helpers -------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Plain nested dict (tuples as lists) suitable for YAML and JSON."""
        return _to_plain(dataclasses.asdict(self))

    def to_yaml(self) -> str:
        """The resolved config as YAML text."""
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def write(self, directory: str | Path, name: str = "config.yaml") -> Path:
        """Write the resolved config beside a stage's outputs and return its path."""
        path = Path(directory) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.to_yaml())
        return path

    def replace(self, **sections: Any) -> RunConfig:
        """A copy with whole sections or top-level fields replaced (validated again)."""
        return dataclasses.replace(self, **sections)


def _to_plain(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _to_plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_to_plain(v) for v in obj]
    return obj


def config_hash(obj: dict[str, Any]) -> str:
    """Stable short hash of a plain (JSON-able) dict."""
    text = json.dumps(_to_plain(obj), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# ---- building from dicts, with type checks ---------------------------------------------


def _coerce(path: str, value: Any, tp: Any) -> Any:
    """Check ``value`` against the annotation ``tp`` and return it in canonical form."""
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            _fail(path, value, f"a mapping of {tp.__name__} fields")
        return _build(tp, value, path)
    if origin is Literal:
        allowed = typing.get_args(tp)
        _check(value in allowed, path, value, f"one of {', '.join(map(str, allowed))}")
        return value
    if origin is tuple:
        (item_tp, _ellipsis) = typing.get_args(tp)
        if not isinstance(value, (list, tuple)):
            _fail(path, value, f"a list of {item_tp.__name__}")
        return tuple(_coerce(f"{path}[{i}]", v, item_tp) for i, v in enumerate(value))
    if origin in (typing.Union, types.UnionType):
        raise TypeError(f"unsupported annotation {tp} at {path}")
    if tp is bool:
        _check(isinstance(value, bool), path, value, "true or false")
        return value
    if tp is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
        if not ok and isinstance(value, float) and value.is_integer():
            return int(value)
        _check(ok, path, value, "an integer")
        return value
    if tp is float:
        if isinstance(value, str) and _FLOAT_RE.match(value.strip()):
            value = float(value)  # YAML 1.1 reads "3e-3" (no dot) as a string
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        _check(ok, path, value, "a number")
        _check(math.isfinite(float(value)), path, value, "a finite number")
        return float(value)
    if tp is str:
        _check(isinstance(value, str), path, value, "a string")
        return value
    raise TypeError(f"unsupported annotation {tp} at {path}")


def _build(cls: type, values: dict[str, Any], prefix: str = "") -> Any:
    """Build dataclass ``cls`` from a (partial) dict; unknown keys are errors."""
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs: dict[str, Any] = {}
    for key, value in values.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if key not in names:
            raise ConfigError(f"unknown key {path!r}; allowed keys: {', '.join(names)}")
        kwargs[key] = _coerce(path, value, hints[key])
    return cls(**kwargs)


def _deep_merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in update.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def parse_set(items: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """Turn ``["data.num_train_tasks=2000", ...]`` into a nested dict (values parsed as YAML)."""
    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected section.field=value")
        key, raw = item.split("=", 1)
        key = key.strip()
        if not key or any(not part for part in key.split(".")):
            raise ConfigError(f"--set {item!r}: empty key")
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError as exc:
            raise ConfigError(f"--set {key}: cannot parse value {raw!r}: {exc}") from exc
        if isinstance(value, str) and key == "data.label":
            value = raw.strip()  # keep 'mix:0.8' a string
        node = out
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {key}: {part} is not a section")
        node[parts[-1]] = value
    return out


# ---- environment defaults and presets -----------------------------------------------------

_ENV_DEFAULTS: dict[str, dict[str, Any]] = {
    "bandit": {
        "env": {"name": "bandit", "num_arms": 5, "horizon": 500, "sigma": 0.3},
        "data": {"label": "weak", "num_eval_tasks": 200},
        "train": {"td_n": 1, "gamma": 0.0, "epochs": 300},
        "fusion": {"kernel": "uniform", "target": "reward", "td_n": 1, "gamma": 0.0},
        "eval": {"num_tasks": 200, "online_horizon": 500},
    },
    "darkroom": {
        "env": {"name": "darkroom", "horizon": 100},
        "data": {"label": "weak-last", "num_eval_tasks": 100},
        "train": {"td_n": 5, "gamma": 0.95, "epochs": 50},
        "fusion": {"kernel": "rbf", "tau": 0.5, "target": "nstep", "td_n": 5, "gamma": 0.95},
        "eval": {"num_tasks": 100, "online_horizon": 100, "dpt_sample": False},
    },
}

# Presets only set what differs from the paper-scale defaults above.
PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    "smoke": {
        "bandit": {
            "env": {"horizon": 24},
            "data": {"num_train_tasks": 96, "num_val_tasks": 16, "num_eval_tasks": 16,
                     "shard_size": 48, "batch_size": 32},
            "model": {"n_layer": 2, "n_embd": 16, "ensemble_size": 3, "head_hidden": 16},
            "train": {"epochs": 2, "batch_size": 16, "lr": 1e-3, "checkpoint_every": 1,
                      "num_workers": 0},
            "eval": {"num_tasks": 16, "online_horizon": 24, "offline_points": 20,
                     "num_actors": 1},
        },
        "darkroom": {
            "env": {"horizon": 20},
            "data": {"num_train_tasks": 96, "num_val_tasks": 16, "num_eval_tasks": 16,
                     "shard_size": 48, "batch_size": 32},
            "model": {"n_layer": 2, "n_embd": 16, "ensemble_size": 3, "head_hidden": 16},
            "train": {"epochs": 2, "batch_size": 16, "lr": 1e-3, "checkpoint_every": 1,
                      "num_workers": 0},
            "eval": {"num_tasks": 16, "online_horizon": 20, "offline_points": 20,
                     "num_actors": 1},
        },
    },
    "small": {
        "bandit": {
            "data": {"num_train_tasks": 2_000, "num_val_tasks": 200, "shard_size": 1_000,
                     "batch_size": 500},
            "model": {"n_layer": 3, "n_embd": 32, "head_hidden": 32},
            "train": {"epochs": 5, "batch_size": 32, "lr": 1e-3, "checkpoint_every": 5},
        },
        "darkroom": {
            "data": {"num_train_tasks": 2_000, "num_val_tasks": 200, "shard_size": 1_000,
                     "batch_size": 500},
            "model": {"n_layer": 3, "n_embd": 32, "head_hidden": 32},
            "train": {"epochs": 5, "batch_size": 32, "lr": 1e-3, "checkpoint_every": 5},
        },
    },
    "paper": {
        "bandit": {"seeds": [0, 1, 2], "train": {"num_workers": 4, "use_gpu": True}},
        "darkroom": {"seeds": [0, 1, 2], "train": {"num_workers": 4, "use_gpu": True}},
    },
}


def preset_dict(preset: str, env: str) -> dict[str, Any]:
    """The nested override dict a preset applies for an environment."""
    if preset not in PRESET_NAMES:
        raise ConfigError(f"preset={preset!r} is invalid: one of {', '.join(PRESET_NAMES)}")
    if env not in ENV_NAMES:
        raise ConfigError(f"env.name={env!r} is invalid: one of {', '.join(ENV_NAMES)}")
    return _deep_merge(_ENV_DEFAULTS[env], _deep_merge({"preset": preset},
                                                        PRESETS[preset][env]))


def make_config(
    preset: str = "small",
    env: str = "bandit",
    yaml_path: str | Path | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    extra: dict[str, Any] | None = None,
) -> RunConfig:
    """Resolve defaults -> env defaults -> preset -> YAML -> ``extra`` -> ``--set`` overrides.

    Raises:
        ConfigError: naming the first offending field, before anything runs.
    """
    values = preset_dict(preset, env)
    if yaml_path is not None:
        values = _deep_merge(values, load_yaml(yaml_path))
    if extra:
        values = _deep_merge(values, extra)
    values = _deep_merge(values, parse_set(list(overrides)))
    return _build(RunConfig, values)


def load_yaml(path: str | Path, error: type[Exception] = ConfigError,
              allow_empty: bool = True) -> dict[str, Any]:
    """Read a YAML mapping, with a clear error naming the file.

    Args:
        error: exception class raised for a missing, unparsable or non-mapping file.
        allow_empty: an empty file is ``{}`` (config overrides) rather than an error.
    """
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_bytes().decode("utf-8"))
    except FileNotFoundError as exc:
        raise error(f"config file {path} does not exist") from exc
    except IsADirectoryError as exc:
        raise error(f"config file {path} is a directory, not a YAML file") from exc
    except UnicodeDecodeError as exc:
        raise error(f"config file {path} is not UTF-8 text ({exc.reason} at byte "
                    f"{exc.start})") from exc
    except OSError as exc:
        raise error(f"config file {path} cannot be read: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise error(f"config file {path} is not valid YAML: {exc}") from exc
    if data is None and allow_empty:
        return {}
    if not isinstance(data, dict):
        raise error(f"config file {path} must hold a mapping, got {type(data).__name__}")
    return data


def resolve_run_dir(out: str | Path | None, preset: str, yaml_path: str | Path | None = None,
                    overrides: list[str] | tuple[str, ...] = ()) -> Path:
    """The absolute run directory: ``--out``, else ``out_dir`` from ``--set``/YAML, else
    ``runs/<preset>``. Absolute because Ray workers run in other working directories.

    Raises:
        ConfigError: ``--out`` is empty, or ``out_dir`` is set to another directory as well
            (one run would be split over two directories).
    """
    user = parse_set(list(overrides)).get("out_dir")
    if user is None and yaml_path is not None:
        user = load_yaml(yaml_path).get("out_dir")
    if user is not None and (not isinstance(user, str) or not user.strip()):
        _fail("out_dir", user, "a non-empty path")
    if out is not None and not str(out).strip():
        _fail("--out", str(out), "a non-empty path")
    if out is not None and user is not None and Path(user).resolve() != Path(out).resolve():
        raise ConfigError(f"out_dir={user!r} (from --set or --config) conflicts with --out "
                          f"{str(out)!r}; give the run directory once, with --out")
    chosen = out if out is not None else (user if user is not None else Path("runs") / preset)
    return Path(chosen).resolve()


def from_dict(values: dict[str, Any]) -> RunConfig:
    """Build a RunConfig from a complete or partial nested dict (e.g. a saved config.yaml)."""
    return _build(RunConfig, values)


def load_config(path: str | Path) -> RunConfig:
    """Load a resolved config.yaml written by :meth:`RunConfig.write`."""
    try:
        return from_dict(load_yaml(path))
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from exc
