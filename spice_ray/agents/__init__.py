"""Agents: one protocol (:class:`~spice_ray.agents.base.Agent`) for learned and classical
agents, the method registry and :func:`make_agent`.

Every module of this package is imported with it, so a module that calls
:func:`~spice_ray.agents.base.register_method` is an agent of the platform: a new agent is its
file (and a test), nothing else.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

from spice_ray.agents.base import (
    METHODS,
    Agent,
    AgentSpec,
    Build,
    Method,
    OfflineContexts,
    OfflinePicker,
    Tunable,
    register_method,
)
from spice_ray.agents.bayes import BayesAgent
from spice_ray.agents.classical import (
    LCB,
    UCB,
    CountingBandit,
    EmpiricalMean,
    OracleAgent,
    PosteriorBandit,
    RandomAgent,
    ThompsonSampling,
)
from spice_ray.agents.dpt import PolicyAgent
from spice_ray.agents.priors import ExactPrior, FlatPrior, LearnedMeanExactSd, LearnedPrior, Prior
from spice_ray.agents.references import HillClimb, LinUCB, NearestUnvisited
from spice_ray.agents.spice import SpiceAgent, state_features
from spice_ray.config import EvalConfig
from spice_ray.model.trunk import TrunkModel

for _module in pkgutil.iter_modules(__path__):  # each agent module registers its methods
    importlib.import_module(f"{__name__}.{_module.name}")


def make_agent(spec: AgentSpec, env: Any, tasks: Any = None, model: TrunkModel | None = None,
               eval_cfg: EvalConfig | None = None, sigma: float = 0.3) -> Agent:
    """Build the agent a spec describes for environment ``env`` (an Environment), by its
    method's factory (:data:`METHODS`).

    Args:
        tasks: the tasks it will act in (the optimal agent needs them).
        model: required by methods that read a model (spice, dpt, ad-bc).
        eval_cfg: baseline constants (UCB/LCB c, TS prior); default EvalConfig().
        sigma: test-time reward noise std (TS uses sigma^2).

    Raises:
        ValueError: the method does not apply to ``env`` or needs a model it was not given.
    """
    info = spec.info
    if info.stateless_only and not env.stateless:
        raise ValueError(f"method {spec.method!r} needs a stateless environment; "
                         f"{env.name} has states")
    if info.requires and not hasattr(env, info.requires):
        raise ValueError(f"method {spec.method!r} needs an environment with "
                         f"{info.requires}; {env.name} has none")
    if info.model is not None and model is None:
        raise ValueError(f"method {spec.method!r} needs a model")
    return info.build(spec, env, Build(tasks, model, eval_cfg or EvalConfig(), sigma))


__all__ = ["LCB", "METHODS", "UCB", "Agent", "AgentSpec", "BayesAgent", "Build",
           "CountingBandit", "EmpiricalMean", "ExactPrior", "FlatPrior", "HillClimb",
           "LearnedMeanExactSd", "LearnedPrior", "LinUCB", "Method", "NearestUnvisited",
           "OfflineContexts", "OfflinePicker", "OracleAgent", "PolicyAgent",
           "PosteriorBandit", "Prior", "RandomAgent", "SpiceAgent", "ThompsonSampling",
           "Tunable", "make_agent", "register_method", "state_features"]
