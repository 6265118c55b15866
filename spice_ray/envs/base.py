"""One protocol for every environment, and the registry everything above ``envs/`` asks.

An environment is a task family. A subclass of :class:`Environment` says, in one place,
everything the platform needs to know about it, and :func:`register` makes it available by
name (``env.name`` in configs):

* its own config fields (``Params``, a frozen dataclass: ``env.num_arms``, ``env.grid_size``,
  ...), the config defaults it changes (``defaults``: label rule, TD(n), fusion kernel, eval
  sizes), the label rules its datasets support and the evaluation protocols it has;
* data: the dataset columns (:meth:`columns`) and whole pretraining tasks from seeded streams
  (:meth:`generate`: task, behaviour roll-in, labels);
* tokens: how a dataset batch becomes the model's query state, context states and behaviour
  propensities (:meth:`encode`);
* evaluation: eval tasks from the eval split, batched ``reset``/``step`` (``step`` takes the
  step's standard-normal noise per task, so every agent sees the same randomness), the
  optimal action, and per-step regret under each reading it supports.

Environments are pure and batched (numpy over B tasks, no per-task loop), with no Ray and no
I/O, like xland-minigrid's: ``reset(tasks)``, ``step(tasks, states, actions, noise)``.
A stateless environment (bandits) has one constant state: agents may then cache the query and
the classical bandit baselines apply.

Adding one: write ``spice_ray/envs/<name>.py`` with a decorated subclass; the package imports
every module in this folder, so nothing else needs to know it exists.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from spice_ray.common.gym_ids import register_ids
from spice_ray.common.plugins import load_plugins

if TYPE_CHECKING:
    from spice_ray.common.rng import TaskStreams

PROTOCOLS = ("online", "offline", "robustness", "calibration", "episode")
"""Evaluation protocols: online regret from an empty context (every environment); offline
suboptimality of one pick from a fixed context, robustness to test-time reward noise and
prior calibration (stateless environments with known action values); one episode from the
corner cell acting on a fixed context, the DPT paper's offline protocol (grids)."""


@dataclass(frozen=True)
class Column:
    """One dataset column: numpy dtype and per-row shape (() for scalars)."""

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]


@dataclass(frozen=True)
class Encoded:
    """A batch of contexts as the model reads them (numpy or torch, any float dtype).

    Attributes:
        query_state: [B, S] the query state.
        states: [B, T, S] s_t of each context transition.
        next_states: [B, T, S] s'_t (== s_{t+1} in a logged trajectory).
        behaviour_probs: [B, A] behaviour propensities pi_b(a).
    """

    query_state: Any
    states: Any
    next_states: Any
    behaviour_probs: Any


class Environment(ABC):
    """A task family (see the module docstring). Subclasses set the class attributes and
    implement the abstract methods; instances hold the validated ``params`` and ``horizon``.

    Args:
        params: an instance of the subclass's ``Params``.
        horizon: H, the length of pretraining roll-ins (context length).
    """

    name: ClassVar[str]
    """Registry name, ``env.name`` in configs."""
    Params: ClassVar[type]
    """Frozen dataclass of the environment's own config fields, each with a docstring; its
    ``validate()`` (if defined) raises ValueError naming a bad field."""
    stateless: ClassVar[bool] = False
    """One constant state (bandits): agents may cache the query; bandit baselines apply."""
    labels: ClassVar[tuple[str, ...]] = ()
    """Label rules its datasets support (``data.label``): kinds of ``envs.labels``."""
    protocols: ClassVar[tuple[str, ...]] = ("online",)
    """Evaluation protocols it has (a subset of :data:`PROTOCOLS`)."""
    regret_readings: ClassVar[tuple[str, ...]] = ("default",)
    """Names of the per-step regret definitions :meth:`regret` computes; the first is the
    default, ``reading`` in Params (when present) chooses the reported one."""
    defaults: ClassVar[Mapping[str, Mapping[str, Any]]] = {}
    """Config values this environment changes from the dataclass defaults, by section."""
    presets: ClassVar[Mapping[str, Mapping[str, Mapping[str, Any]]]] = {}
    """What each preset (smoke, small, ...) changes for this environment, by section, where
    ``spice_ray.config.presets.PRESETS`` has no entry for it: a plugin's environment brings its
    own scales in its one file (``{"smoke": {"env": {"horizon": 12}, ...}}``)."""

    def __init__(self, params: Any, horizon: int) -> None:
        self.params = params
        self.horizon = int(horizon)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.params}, horizon={self.horizon})"

    # ---- sizes and data ------------------------------------------------------------------

    @property
    @abstractmethod
    def num_actions(self) -> int:
        """A."""

    @property
    def num_states(self) -> int:
        """Distinct states an agent can be in: 1 in a stateless environment (the S of
        count-based bonuses such as beta_t = C sqrt(log(S A t)))."""
        return 1

    @property
    @abstractmethod
    def state_dim(self) -> int:
        """S, the width of a state vector."""

    @property
    def state_bounds(self) -> tuple[Any, Any]:
        """The range of the state coordinates (Gymnasium's observation space), as numbers
        or per-coordinate arrays; unbounded unless the environment says otherwise."""
        return (-np.inf, np.inf)

    @abstractmethod
    def columns(self) -> tuple[Column, ...]:
        """The dataset's columns in storage order (``task_id`` first)."""

    @abstractmethod
    def generate(self, data: Any, split: str, streams: TaskStreams) -> dict[str, np.ndarray]:
        """Whole pretraining tasks for ``streams``' task ids: every column but ``task_id``.

        Args:
            data: the DataConfig (label rule, behaviour settings).
            split: "train", "validation" or "eval" (eval tasks may use held-out goals).
            streams: per-task random streams; a task's content depends on its key only.
        """

    @abstractmethod
    def encode(self, batch: Mapping[str, Any]) -> Encoded:
        """A dataset batch (numpy or torch columns) as the model reads it."""

    # ---- evaluation ----------------------------------------------------------------------

    @abstractmethod
    def eval_tasks(self, data: Mapping[str, np.ndarray]) -> Any:
        """B evaluation tasks from eval-split columns: opaque to callers but for its
        ``num_tasks`` attribute (B)."""

    @abstractmethod
    def reset(self, tasks: Any) -> np.ndarray:
        """Start states [B, S]."""

    @abstractmethod
    def step(self, tasks: Any, states: np.ndarray, actions: np.ndarray, noise: np.ndarray
             ) -> tuple[np.ndarray, np.ndarray]:
        """One step per task.

        Args:
            states: [B, S]. actions: int [B]. noise: float [B] standard normals for this step
                (common random numbers; deterministic environments ignore them).

        Returns:
            (next_states [B, S], rewards float64 [B]).
        """

    @abstractmethod
    def optimal_action(self, tasks: Any, states: np.ndarray) -> np.ndarray:
        """An optimal action per task at ``states`` [B, S], int64 [B]."""

    @abstractmethod
    def regret(self, tasks: Any, states: np.ndarray, actions: np.ndarray,
               rewards: np.ndarray, horizon: int, reading: str | None = None) -> np.ndarray:
        """Per-step regret [B, N] of a rollout of N = episodes * horizon steps.

        Args:
            states: [B, N, S] the state each action was taken in.
            actions: int [B, N]. rewards: [B, N] the rewards received.
            horizon: steps per episode (each episode restarts at the task's start).
            reading: one of :attr:`regret_readings` (None: the configured one).
        """

    def reading(self) -> str:
        """The configured regret reading (``params.reading`` if the env has one)."""
        return str(getattr(self.params, "reading", self.regret_readings[0]))

    def positions(self, states: np.ndarray) -> np.ndarray | None:
        """Grid cells [..., 2] of states, for visit maps; None when states have no layout."""
        return None

    def landmarks(self, tasks: Any) -> dict[str, np.ndarray] | None:
        """Cells [B, 2] a visit map marks for each task (e.g. {"start": ..., "goal": ...});
        None when the environment has none."""
        return None

    def value_samples(self, batch: Mapping[str, np.ndarray]) -> np.ndarray | None:
        """True action values of a dataset batch's tasks (any shape), when the dataset stores
        them: the flat prior of ``train.shrink_prior=data`` is then their pooled moments
        instead of the noisy reward targets'. None (the default): use the targets."""
        return None

    # stateless environments (offline, robustness and calibration protocols)

    def action_values(self, tasks: Any) -> np.ndarray:
        """Expected reward of each action [B, A] (stateless environments)."""
        raise NotImplementedError(f"{self.name} has no state-free action values")

    def with_noise(self, tasks: Any, sigma: float) -> Any:
        """The same tasks at test-time reward noise ``sigma`` (robustness protocol)."""
        raise NotImplementedError(f"{self.name} has no reward-noise level to change")


# ---- registry ------------------------------------------------------------------------------

_REGISTRY: dict[str, type[Environment]] = {}


def register(cls: type[Environment]) -> type[Environment]:
    """Class decorator: make ``cls`` available as ``env.name = cls.name``."""
    if not dataclasses.is_dataclass(cls.Params):
        raise TypeError(f"{cls.__name__}.Params must be a dataclass")
    bad = set(cls.protocols) - set(PROTOCOLS)
    if bad:
        raise TypeError(f"{cls.__name__}.protocols has unknown {sorted(bad)}")
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
        raise TypeError(f"environment name {cls.name!r} is registered twice")
    _REGISTRY[cls.name] = cls
    register_ids((cls.name,))  # its Gymnasium id too (a plugin's was returned, not registered)
    return cls


def names() -> tuple[str, ...]:
    """Registered environment names, sorted."""
    return tuple(sorted(_REGISTRY))


def env_class(name: str) -> type[Environment]:
    """The class registered as ``name``.

    Raises:
        KeyError: naming the registered environments.
    """
    if name not in _REGISTRY:  # perhaps an installed plugin's
        load_plugins()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"env.name={name!r} is invalid: one of {', '.join(names())}") from None


def make(env_cfg: Any) -> Environment:
    """The environment of an EnvConfig (``name``, ``horizon``, ``params``)."""
    return env_class(env_cfg.name)(env_cfg.params, env_cfg.horizon)
