"""Typed, frozen run configuration: one dataclass per stage, validated when built.

Every value a user can set lives here with a one-line docstring. ``__post_init__`` validates,
so nothing runs before a config is valid, and every error names the field (``data.seed``),
the value and the allowed range. NaN and infinities are refused in every float field.

Allowed names come from the registries that own them: environments (``spice_ray.envs``:
``env.name`` and the environment's own fields), kernels (``spice_ray.fusion.kernels``), label
rules (``spice_ray.envs.labels``).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Literal

from spice_ray import envs
from spice_ray.common.errors import SpiceRayError
from spice_ray.config.grids import GRIDS
from spice_ray.envs.labels import parse_label
from spice_ray.fusion.posterior import TAIL_DEFAULT, TAILS
from spice_ray.fusion.width import WIDTH_SOURCE_DEFAULT

AUTO = "auto"
"""``train.use_gpu`` / ``train.population`` as the machine decides (GPUs where there are)."""

HEAD_KERNELS = ("auto", "compiled", "eager")
TRACKERS = ("none", "tensorboard", "mlflow", "wandb")
"""Experiment trackers (``track``; ``spice_ray.runtime.tracking``)."""
KERNEL_SPACES = ("latent", "context", "state")


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


@dataclass(frozen=True)
class EnvConfig:
    """The task family: a registered environment, its context length and its own fields.

    The environment's fields (``num_arms``, ``grid_size``, ...) live in ``params`` (its
    ``Params`` dataclass) and read as attributes (``cfg.env.num_arms``); in YAML and ``--set``
    they are written flat beside ``name`` and ``horizon`` (``env.num_arms=20``).
    """

    name: str = "bandit"
    """A registered environment (``spice_ray.envs``), e.g. bandit, darkroom."""
    horizon: int = 500
    """Context length H of the pretraining roll-ins (>= 1)."""
    params: Any = None
    """The environment's own fields (its ``Params``); None means its defaults."""

    def __post_init__(self) -> None:
        try:
            cls = envs.env_class(self.name)
        except KeyError as exc:
            raise ConfigError(exc.args[0]) from None
        if self.params is None:
            object.__setattr__(self, "params", cls.Params())
        elif not isinstance(self.params, cls.Params):
            _fail("env.params", self.params, f"{cls.__name__}.Params for env.name={self.name}")
        _check(self.horizon >= 1, "env.horizon", self.horizon, "an integer >= 1")
        _check_finite(self.params, "env")
        try:
            getattr(self.params, "validate", lambda: None)()
        except ValueError as exc:
            raise ConfigError(str(exc)) from None

    def __getattr__(self, item: str) -> Any:
        params = self.__dict__.get("params")
        if item.startswith("_") or params is None or not hasattr(params, item):
            raise AttributeError(f"env.{item}: environment {self.__dict__.get('name')!r} has "
                                 "no such field")
        return getattr(params, item)

    def environment(self) -> envs.Environment:
        """The environment object (``spice_ray.envs.make``)."""
        return envs.make(self)

    @property
    def num_actions(self) -> int:
        """A."""
        return self.environment().num_actions

    @property
    def state_dim(self) -> int:
        """S."""
        return self.environment().state_dim

    def to_dict(self) -> dict[str, Any]:
        """Flat dict: name, horizon and the environment's fields."""
        return {"name": self.name, "horizon": self.horizon,
                **dataclasses.asdict(self.params)}


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
    """Label rule: optimal, weak (e.g. the bandit's favoured arm), weakmix80, mix:q,
    weak-last; the environment says which it supports."""
    behaviour_omega: float = 0.5
    """Bandit behaviour mixture weight omega on the favoured arm, in [0, 1]."""
    shard_size: int = 10_000
    """Tasks per Parquet shard (>= 1)."""
    batch_size: int = 1_000
    """Tasks generated per vectorised map_batches call (>= 1)."""
    concurrent_tasks: int = 2
    """Ray Data generation tasks that run at once (>= 1; ``data.num_actors`` before)."""
    task_cpus: float = 0.5
    """CPUs reserved per generation task (> 0; fractional so Ray Data's own tasks can run;
    ``data.actor_cpus`` before)."""
    compression: Literal["zstd", "snappy", "none"] = "zstd"
    """Parquet compression codec."""
    ray_data_min_tasks: int = 1_024
    """A dataset of fewer tasks (its three splits together) is generated in the driver
    process instead of by Ray Data tasks (>= 0; 0: always Ray Data): a Ray Data pipeline's
    start-up (worker processes and their imports, seconds) costs more than generating a few
    hundred tasks. The shards are the same bytes either way."""

    def __post_init__(self) -> None:
        _check_finite(self, "data")
        _check(self.seed >= 0, "data.seed", self.seed, "an integer >= 0")
        for name in ("num_train_tasks", "num_val_tasks", "num_eval_tasks", "shard_size",
                     "batch_size", "concurrent_tasks"):
            value = getattr(self, name)
            _check(value >= 1, f"data.{name}", value, "an integer >= 1")
        try:
            _, q = parse_label(self.label)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        _check(0.0 <= q <= 1.0, "data.label", self.label, "mix:q needs q in [0, 1]")
        _check(0.0 <= self.behaviour_omega <= 1.0, "data.behaviour_omega", self.behaviour_omega,
               "a float in [0, 1]")
        _check(self.task_cpus > 0, "data.task_cpus", self.task_cpus, "a float > 0")
        _check(self.ray_data_min_tasks >= 0, "data.ray_data_min_tasks",
               self.ray_data_min_tasks, "an integer >= 0")
        _check(self.compression in ("zstd", "snappy", "none"), "data.compression",
               self.compression, "one of zstd, snappy, none")


LATER_DEFAULTS: dict[str, dict[str, Any]] = {"model": {"var_head": False},
                                             "fusion": {"width_source": WIDTH_SOURCE_DEFAULT,
                                                        "tail": TAIL_DEFAULT},
                                             "train": {"h0_prior": "paper", "choose": (),
                                                       "population": AUTO,
                                                       "lambda_shrink": 1.0,
                                                       "shrink_form": "prefix",
                                                       "value_target": "reward",
                                                       "tail": TAIL_DEFAULT,
                                                       "query_position": True}}
"""Fields added to a section after results were made with it, left out of what identifies
those results at these values (:func:`without_later_defaults`: a model's training identity
and architecture spec, an evaluation's inputs): what was made before them is what the default
makes, so it stays current."""


def without_later_defaults(section: str, values: dict[str, Any]) -> dict[str, Any]:
    """``values`` of config section ``section`` without the :data:`LATER_DEFAULTS` fields
    that hold their default."""
    later = LATER_DEFAULTS.get(section, {})
    return {k: v for k, v in values.items()
            if not (k in later and to_plain(v) == to_plain(later[k]))}


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
    var_head: bool = False
    """A predictive-variance output per action beside the ensemble (one linear head on the
    trunk, softplus), trained by Gaussian negative log-likelihood on the next target (weight
    ``train.lambda_var``): the fusion's ``width_source="predictive"`` reads it. Off: the
    architecture and its weights are the paper's, unchanged."""
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
    """Weight of L_TD + lambda_shrink L_shrink in the total loss (>= 0)."""
    lambda_shrink: float = 1.0
    """Weight of the shrinkage loss beside L_TD (>= 0; 0: no shrinkage toward the pooled
    prior, whose best reachable target is off the exact posterior)."""
    lambda_anchor: float = 1e-4
    """Weight of the anchor penalty (>= 0)."""
    lambda_var: float = 1.0
    """Weight of the predictive-variance head's Gaussian NLL (>= 0; read only with
    ``model.var_head``)."""
    choose: tuple[str, ...] = ()
    """Loss weights the study chooses on validation tasks instead of taking them from this
    section: names of ``spice_ray/config/grids.py`` grids over train fields (e.g.
    ``[lambda_q]``). The SPICE model then trains once per grid point and the tuning stage keeps,
    per experiment, the point whose prior gives the validation rewards the highest
    log-likelihood (no label read; ``spice_ray.study.loss_weights``). Empty: the fields as set."""
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
    query_position: bool = True
    """Train the policy loss at position 0 too, the query alone before any transition (ours,
    SPICE's and DPT's); False trains positions 1..T only, as the DPT reference code does (its
    model returns the predictions after the first context token). Read by every policy loss;
    the value losses are unaffected."""
    td_n: int = 1
    """n of the TD(n) targets (>= 1; bandits 1, darkroom 5)."""
    gamma: float = 0.0
    """Discount of the TD(n) targets in [0, 1] (bandits 0, darkroom 0.95)."""
    bootstrap: Literal["max", "mean"] = "max"
    """V(s_{t+n}) in the TD(n) targets: max_a' Q-bar (the paper) or the mean over actions (the
    uniform behaviour policy's value, free of maximisation bias)."""
    tail: Literal["truncate", "bootstrap", "inside"] = TAIL_DEFAULT
    """A TD(n) window cut by the training context's end: not bootstrapped (the paper's
    indicator t + n <= T, so the last n - 1 transitions' targets are sums of the few rewards
    left and the heads' values there fall towards 0); bootstrapped from the value at the last
    state it reaches ("bootstrap", a departure: that value is position T's, which no loss
    regresses); or stopped before the last transition and bootstrapped from the state that
    starts it ("inside", a departure that reads only trained positions; the last transition
    keeps its one reward). ``fusion.tail`` is the same choice for the context's evidence."""
    head_targets: Literal["mean", "bootstrap"] = "mean"
    """What TD(n) fits: the ensemble mean (the paper) or each head to its own targets on its
    own half of the tasks, bootstrapping from itself (sigma_Q then responds to data)."""
    h0_prior: Literal["paper", "state"] = "paper"
    """What the value heads learn at position 0, before any context: "paper", transition 1's
    value from the query token, whose state a darkroom draws independently of s_1 (so the
    h = 0 prior cannot depend on the state it is asked about); "state", transition 1's value
    from a query token holding s_1 itself, the state-conditioned prior an agent acting from
    that output at h = 0 reads (the policy still learns from the drawn query). Stateless
    bandits: the same targets either way."""
    value_target: Literal["reward", "mean"] = "reward"
    """What the value heads' TD targets are made of: the context's sampled rewards (the paper),
    or "mean", each pulled arm's expected reward mu_{a_t} (stateless bandits; the task's
    means, which no logged dataset holds, so a diagnosis, not a method): the same minimiser,
    the posterior mean, with the reward noise taken out of the targets. Only the losses read
    them; the model still sees the sampled rewards."""
    shrink_form: Literal["prefix", "average"] = "prefix"
    """Which Qbar the shrinkage loss pulls towards the per-action posterior means: "prefix",
    Qbar at every position towards the means of the transitions that position has seen (so
    in an MDP every state's value towards the state-pooled mean); or "average", the paper's
    equation, each action's average of Qbar over the context's states towards the whole
    context's mean (the states keep their own values)."""
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
    """Ray Train workers (>= 0; 0 runs the loop in the driver process). With ``together`` each
    worker trains whole models (model i on worker i mod n), side by side; otherwise the
    workers share one model's batches (data-parallel)."""
    threads: int = 0
    """Torch threads of each Train worker (>= 0; 0: the cluster's CPUs shared out over the
    workers, at most 8). A model's weights depend on it bit for bit: CPU matrix products split
    their work by thread."""
    together: bool = True
    """Train every model and seed of an experiment in one Ray Train job, so the job's start-up
    (worker group, dataset read, warm-up) is paid once per experiment instead of once per
    model. Each model's weights equal, bit for bit, those of the model trained alone on one
    worker with the same threads (``train.together=false train.num_workers=1
    train.threads=<the together worker's>``; with ``num_workers=1``: the same job)."""
    population: Literal[True, False, "auto"] = AUTO
    """Train the models of one kind and config (an experiment's seeds, a variant's seeds) as
    one population (``spice_ray.train.population``): their weights stacked and stepped as one,
    one step about one model's cost while a GPU is launch-bound; each model's weights equal
    its alone training's within rounding, in the same checkpoints. In the driver with
    ``num_workers=0``, else one Ray Train job whose workers each train whole populations. On
    a CPU the SPICE step is slower so (its value heads lose their compiled kernel under
    vmap): "auto" (the default) trains populations on GPUs only."""
    use_gpu: Literal[True, False, "auto"] = AUTO
    """Train on GPUs (``worker_gpus`` of one per Train worker), bf16 autocast. "auto" (the
    default): where there are some (this machine's: as populations in the driver,
    ``train.together.on_local_gpu``; or a cluster's), else on CPUs without a warning."""
    worker_gpus: float = 1.0
    """GPUs per Train worker with ``use_gpu`` (0 < x <= 1). A fraction lets several
    ``together`` workers share one GPU, each training its own models: a small model's step
    is bound by kernel launches and host work and leaves a GPU mostly idle. Data-parallel
    workers (``together=false``, several workers) need a whole GPU each."""
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
        for name in ("weight_decay", "grad_clip", "lambda_q", "lambda_shrink", "lambda_anchor",
                     "lambda_var",
                     "epi_scale",
                     "weight_floor"):
            value = getattr(self, name)
            _check(value >= 0, f"train.{name}", value, "a float >= 0")
        _check(0.0 <= self.gamma <= 1.0, "train.gamma", self.gamma, "a float in [0, 1]")
        _check(self.bootstrap in ("max", "mean"), "train.bootstrap", self.bootstrap,
               "one of max, mean")
        _check(self.tail in TAILS, "train.tail", self.tail, f"one of {', '.join(TAILS)}")
        for key, value in (("use_gpu", self.use_gpu), ("population", self.population)):
            _check(value in (True, False, AUTO), f"train.{key}", value, "true, false or auto")
        _check(self.shrink_form in ("prefix", "average"), "train.shrink_form",
               self.shrink_form, "one of prefix, average")
        _check(self.shrink_prior in ("fixed", "data"), "train.shrink_prior", self.shrink_prior,
               "one of fixed, data")
        _check(self.head_targets in ("mean", "bootstrap"), "train.head_targets",
               self.head_targets, "one of mean, bootstrap")
        _check(self.h0_prior in ("paper", "state"), "train.h0_prior", self.h0_prior,
               "one of paper, state")
        _check(self.value_target in ("reward", "mean"), "train.value_target",
               self.value_target, "one of reward, mean")
        weights = [k for k, g in GRIDS.items() if g.field.startswith("train.") and g.tuning]
        for name in self.choose:
            _check(name in weights and self.choose.count(name) == 1, "train.choose",
                   list(self.choose), f"names of loss-weight grids, each once: {weights}")
        _check(self.num_workers >= 0, "train.num_workers", self.num_workers, "an integer >= 0")
        _check(self.threads >= 0, "train.threads", self.threads, "an integer >= 0")
        _check(self.max_failures >= 0, "train.max_failures", self.max_failures, ">= 0")
        _check(0 < self.worker_gpus <= 1, "train.worker_gpus", self.worker_gpus,
               "a float in (0, 1]")
        _check(self.worker_gpus == 1 or self.together or self.num_workers <= 1,
               "train.worker_gpus", self.worker_gpus, "1 when train.together=false and "
               "train.num_workers > 1 (data-parallel workers cannot share a GPU)")

    def on_gpu(self, gpus: bool) -> bool:
        """Train on GPUs, given whether there are any? ``use_gpu``; "auto": if there are."""
        return gpus if self.use_gpu == AUTO else bool(self.use_gpu)

    def populations(self, on_gpu: bool) -> bool:
        """Train populations, given whether on GPUs? ``population``; "auto": if on GPUs."""
        return on_gpu if self.population == AUTO else bool(self.population)

    @property
    def on_ray_train(self) -> bool:
        """Whether models train in Ray Train jobs (``num_workers > 0``), not in the driver: what
        decides the dashboard, the resource requests, the dry run's job starts and the
        pretrain stage's runner."""
        return self.num_workers > 0


def to_plain(obj: Any) -> Any:
    """Nested dicts/lists/tuples as plain dicts and lists (for YAML and JSON)."""
    if isinstance(obj, dict):
        return {k: to_plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_plain(v) for v in obj]
    return obj
