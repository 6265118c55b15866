"""One protocol for every agent, learned or classical, and the registry of methods.

An agent acts in B tasks at once::

    reset(num_tasks, num_actions, draws)     start B empty contexts (draws: RandomSource)
    act(t, states) -> long [B]               t = transitions observed so far; states [B, S]
    observe(actions, rewards, states, next_states)   append one transition per task

Stateless environments (bandits) pass their constant state like any other, so one online loop
(:func:`spice_ray.evaluate.online.run_online`) drives every agent in every environment. Agents
that pick one action from a fixed context also implement :class:`OfflinePicker`.

An :class:`AgentSpec` describes what to evaluate (picklable, shipped to evaluation actors); its
``method`` names an entry of :data:`METHODS`, which says what the method needs (a model kind,
a stateless environment) and which protocols it has. ``spice_ray.agents.make_agent`` builds
the agent.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np
from torch import Tensor

from spice_ray.common.plugins import load_plugins
from spice_ray.config import EvalConfig, FusionConfig, without_later_defaults
from spice_ray.config.grids import Grid
from spice_ray.fusion import WIDTH_FIELDS, RandomSource, width_settings


def to_numpy(x: Tensor) -> np.ndarray:
    """A tensor's values as numpy on the CPU (agents that keep numpy state read their inputs
    through it)."""
    return x.detach().cpu().numpy()


@runtime_checkable
class Agent(Protocol):
    """An online agent acting in B tasks at once."""

    name: str

    def reset(self, num_tasks: int, num_actions: int, draws: RandomSource | None = None
              ) -> None:
        """Start B = ``num_tasks`` fresh runs with an empty context."""
        ...

    def act(self, t: int, states: Tensor) -> Tensor:
        """Actions long [B] for step t (t transitions observed) in ``states`` [B, S]."""
        ...

    def observe(self, actions: Tensor, rewards: Tensor, states: Tensor, next_states: Tensor
                ) -> None:
        """Append one transition per task: actions [B], rewards [B], states [B, S] twice."""
        ...


@dataclass(frozen=True)
class OfflineContexts:
    """What an offline pick reads: B fixed contexts, read at P context lengths at once."""

    actions: Tensor
    """long [B, T]: the context actions."""
    rewards: Tensor
    """[B, T]: the context rewards."""
    hs: np.ndarray
    """int [P]: the context lengths h (the pick after the first h transitions)."""
    num_actions: int
    ties: Tensor | None = None
    """[B, P] uniforms that break ties (``fusion.argmax_ties``; None: the lowest index)."""
    outputs: Any = None
    """For agents that read a model: its heads at positions ``hs`` from one forward over the
    contexts (``spice_ray.evaluate.offline.sequence_outputs``), shared by every agent of that
    model; with "prior_mean_all" where n-step targets bootstrap."""
    state_dim: int = 1
    """S of the environment's one state."""


@runtime_checkable
class OfflinePicker(Protocol):
    """Picks one action per task from a fixed context (stateless environments): the offline
    protocol asks the agent, never decides for it."""

    name: str

    def offline_picks(self, contexts: OfflineContexts) -> Tensor:
        """The pick after the first h transitions of each context, for every h: long [B, P]."""
        ...


@dataclass(frozen=True)
class Build:
    """What a method's factory may use besides its spec and the environment."""

    tasks: Any = None
    """The tasks it will act in (the optimal agent reads them)."""
    model: Any = None
    """The checkpoint's model, for methods that read one."""
    eval_cfg: EvalConfig = field(default_factory=EvalConfig)
    """Baseline constants (UCB/LCB c, TS prior)."""
    sigma: float = 0.3
    """Test-time reward noise std (TS uses sigma^2)."""


@dataclass(frozen=True)
class Tunable:
    """A setting of a non-fused method that the study's tuning stage chooses on validation
    tasks, declared with the method (:attr:`Method.tunables`): the stage runs every value,
    crossed with the method's other tunables, and nothing names the method to find its grid.

    Either an evaluation constant the method reads (``field="eval.ucb_c"``: UCB's c, from
    :meth:`of`) or, with no ``field``, the method's own option, read by its factory through
    :meth:`AgentSpec.option` (a plugin's epsilon) and written to the results' ``config``."""

    name: str
    """Its key in the tuning record's settings and, for an option, in the ``config`` column."""
    values: tuple[Any, ...]
    """The points the tuning stage tries."""
    field: str = ""
    """"eval.<EvalConfig field>" for an evaluation constant; "" for the method's own option."""
    default: Any = None
    """An option's value where no point sets it (the untuned method)."""

    def __post_init__(self) -> None:
        if not self.values:
            raise ValueError(f"tunable {self.name!r}: values is empty")
        if self.field:
            section, _, name = self.field.partition(".")
            if section != "eval" or name not in {f.name for f in dataclasses.fields(
                    EvalConfig)}:
                raise ValueError(f"tunable {self.name!r}: field={self.field!r} is invalid: "
                                 "'eval.<an EvalConfig field>', or '' for the method's option")
        elif self.default is None:
            raise ValueError(f"tunable {self.name!r}: an option needs its default")

    @classmethod
    def of(cls, grid: Grid, name: str) -> Tunable:
        """The tunable of a declared grid (``spice_ray.config.grids``): its field, its values."""
        return cls(name, tuple(grid.tuning), grid.field)

    def apply(self, spec: AgentSpec, eval_cfg: EvalConfig, value: Any
              ) -> tuple[AgentSpec, EvalConfig]:
        """``spec`` and ``eval_cfg`` with this setting at ``value``."""
        if self.field:
            return spec, dataclasses.replace(eval_cfg, **{self.field.partition(".")[2]: value})
        options = tuple((k, v) for k, v in spec.options if k != self.name)
        return dataclasses.replace(spec, options=tuple(sorted(
            options + ((self.name, value),)))), eval_cfg


@dataclass(frozen=True)
class Method:
    """What a method is: its label in the results, what it needs, and how it is built.

    A new agent is one module of ``spice_ray/agents`` (every module there is imported with the
    package) that calls :func:`register_method` with its factory; nothing else names it."""

    label: str
    """The ``method`` column of the result rows."""
    build: Callable[[AgentSpec, Any, Build], Agent]
    """The agent for a spec, an environment (``spice_ray.envs.Environment``) and the rest."""
    model: str | None = None
    """The model kind it reads (spice, dpt), or None."""
    online: bool = True
    offline: bool = False
    stateless_only: bool = False
    """Needs a stateless environment (the classical bandit algorithms)."""
    fused: bool = False
    """Acts on the Normal-Normal posterior of ``spice_ray.fusion`` (its settings matter)."""
    prior: str = ""
    """Model-free fused methods: where the prior comes from: "flat" (one constant prior,
    ``AgentSpec.prior``), "data" (a prior per action estimated from the training tasks, which
    the study fills into ``AgentSpec.prior`` from the dataset), "oracle" (the environment's
    exact task posterior) or "context-free" (that posterior before any context)."""
    requires: str = ""
    """An attribute the environment must have (e.g. ``task_posterior``, ``arm_features``,
    ``grid``): the method applies only there."""
    scales_width: bool = False
    """Fused methods: its prior's width is the learned sigma_Q scaled by
    ``fusion.width_scale`` (SPICE); otherwise the scale is not read and not in its config."""
    paper_width: str = ""
    """A method with ``scales_width``: the method (its name) that the tuned tables run beside
    it at its best point among those at the paper's width (SPICE's "spice-paper"); "": none."""
    settings: tuple[str, ...] = ()
    """Non-fused methods: the fusion fields that change their results (e.g. beta)."""
    constants: Callable[[EvalConfig], dict[str, Any]] | None = None
    """The evaluation constants that change its results (e.g. UCB's c), for the ``config``
    column."""
    rule: Callable[[AgentSpec, bool], str] | None = None
    """Non-fused methods: the action rule named in the results' ``rule`` column, from the spec
    and whether it acts online (e.g. DPT's "sample" / "greedy"); None: the method's name."""
    tunables: tuple[Tunable, ...] = ()
    """The method's own settings the tuning stage chooses (e.g. UCB's c, a plugin's epsilon),
    crossed after the fusion's (beta, tau, width, noise: ``agents.tunables.FUSION_TUNABLES``,
    which apply by the flags above)."""


METHODS: dict[str, Method] = {}
"""Every method by name, filled by :func:`register_method` in the agent modules:
``spice_ray.agents.spice`` (SPICE, the flat / oracle priors, Count-UCB),
``spice_ray.agents.dpt`` (DPT, AD-BC), ``spice_ray.agents.classical`` (the bandit
baselines, Random, Optimal), ``spice_ray.agents.bayes`` (agents on the exact task posterior)
and ``spice_ray.agents.references`` (LinUCB, the nearest-unvisited searcher, hill-climbing)."""


def register_method(name: str, method: Method) -> Method:
    """Add a method to :data:`METHODS` (the same entry again is a no-op).

    Raises:
        ValueError: ``name`` is taken by another method.
    """
    if METHODS.get(name, method) != method:
        raise ValueError(f"method {name!r} is already registered as {METHODS[name].label!r}")
    METHODS[name] = method
    return method


@dataclass(frozen=True)
class AgentSpec:
    """What to evaluate: a method and its test-time settings (picklable, shipped to actors)."""

    method: str
    """A key of :data:`METHODS`."""
    fusion: FusionConfig = field(default_factory=FusionConfig)
    """Fused methods: kernel, targets, noise variance, v_min, beta and the action rule."""
    sample: bool = True
    """DPT / AD-BC online: sample from the policy (True) or act greedily (False)."""
    use_cache: bool = True
    """Model agents in stateless environments: KV-cache decoding (True) or a full forward every
    step. An execution detail (the actions are the same), so it is not part of the config."""
    prior: tuple[float, float] | tuple[tuple[float, ...], tuple[float, ...]] = (0.5, 1.0 / 12.0)
    """spice-flat and count: the constant prior (mean, variance) of every action;
    spice-data-prior: a mean and a variance per action (tuples of A)."""
    options: tuple[tuple[str, Any], ...] = ()
    """Values of the method's own options (its option :class:`Tunable` s), sorted by name;
    an option not here is at its declared default."""

    def __post_init__(self) -> None:
        if self.method not in METHODS:  # perhaps an installed plugin's
            load_plugins()
        if self.method not in METHODS:
            raise ValueError(f"method={self.method!r} is invalid: one of {', '.join(METHODS)}")
        own = {t.name for t in self.info.tunables if not t.field}
        for name, _ in self.options:
            if name not in own:
                raise ValueError(f"options: {name!r} is not an option of {self.method!r} "
                                 f"(its options: {', '.join(sorted(own)) or 'none'})")

    def option(self, name: str) -> Any:
        """The value of the method's option ``name``: as set, else its declared default."""
        for key, value in self.options:
            if key == name:
                return value
        for t in self.info.tunables:
            if t.name == name and not t.field:
                return t.default
        raise KeyError(f"{self.method!r} has no option {name!r}")

    @classmethod
    def dpt(cls, eval_cfg: EvalConfig, name: str = "dpt", use_cache: bool = True) -> AgentSpec:
        """A DPT (or ``name="ad-bc"``) spec acting as ``EvalConfig.dpt_sample`` says."""
        return cls(name, sample=eval_cfg.dpt_sample, use_cache=use_cache)

    @property
    def info(self) -> Method:
        if self.method not in METHODS:  # perhaps an installed plugin's
            load_plugins()
        return METHODS[self.method]

    @property
    def label(self) -> str:
        """The method's name in the result rows."""
        return self.info.label

    @property
    def uses_model(self) -> bool:
        """True when the agent reads a model (spice, dpt, ad-bc)."""
        return self.info.model is not None

    def rule(self, online: bool = True) -> str:
        """The action rule named in the results' ``rule`` column.

        Fused methods online: ``fusion.rule`` (greedy / ucb / thompson), greedy offline (the
        paper's offline pick); DPT online: sample or greedy; other methods: their own name.
        """
        if self.info.fused:
            return self.fusion.rule if online else "greedy"
        if self.info.settings:
            return "ucb"
        if self.info.rule is not None:
            return self.info.rule(self, online)
        return self.method

    def config_dict(self, eval_cfg: EvalConfig, online: bool = True) -> dict[str, Any]:
        """The settings that change this agent's results, as plain values.

        Offline, the online-only settings (beta, its schedule) are left out, so specs that
        differ only there share one offline curve. ``fusion.width_scale`` (``width_decay``) is
        in only for methods that read it (:attr:`Method.scales_width`) and only away from its
        default (:func:`fusion.width_settings`); a field added later only away from its default
        (``config.without_later_defaults``), so the tables made before it stay current.
        """
        if self.info.fused:
            out = without_later_defaults("fusion", {
                k: v for k, v in dataclasses.asdict(self.fusion).items()
                if k != "rule" and k not in WIDTH_FIELDS})
            if self.info.scales_width:
                out |= width_settings(self.fusion)
            if not online:
                out.pop("beta")
                out.pop("beta_schedule")
            if self.info.prior in ("flat", "data"):
                out["prior_mean"], out["prior_var"] = self.prior
            return out
        if self.info.settings:
            fusion = dataclasses.asdict(self.fusion)
            return {k: fusion[k] for k in self.info.settings}
        out = self.info.constants(eval_cfg) if self.info.constants else {}
        return out | {t.name: self.option(t.name) for t in self.info.tunables if not t.field}

    def config_json(self, eval_cfg: EvalConfig, online: bool = True, **extra: Any) -> str:
        """:meth:`config_dict` plus ``extra`` (e.g. the test-time sigma) as compact JSON."""
        return json.dumps({**self.config_dict(eval_cfg, online), **extra}, sort_keys=True,
                          separators=(",", ":"))

    def applies_to(self, env: Any, online: bool = True) -> bool:
        """Whether this method has the protocol in environment ``env`` (an Environment)."""
        info = self.info
        has = info.online if online else info.offline
        return has and (env.stateless or not info.stateless_only) and (
            online or "offline" in env.protocols) and (
            not info.requires or hasattr(env, info.requires))
