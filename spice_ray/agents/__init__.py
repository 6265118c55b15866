"""Agents: one protocol (:class:`~spice_ray.agents.base.Agent`) for learned and classical
agents, the method registry and :func:`make_agent`."""

from __future__ import annotations

from typing import Any

from spice_ray.agents.base import METHODS, Agent, AgentSpec, Method, OfflinePicker
from spice_ray.agents.bayes import BayesAgent, LinUCB, NearestUnvisited, make_reference
from spice_ray.agents.classical import (
    LCB,
    UCB,
    CountingBandit,
    EmpiricalMean,
    OracleAgent,
    PosteriorBandit,
    RandomAgent,
    ThompsonSampling,
    make_baseline,
)
from spice_ray.agents.policy import PolicyAgent
from spice_ray.agents.spice import FlatPrior, SpiceAgent, state_features
from spice_ray.config import EvalConfig
from spice_ray.model.trunk import TrunkModel

REFERENCES = ("bayes-ucb", "bayes-ts", "lints", "linucb", "nearest", "hill-climb")
"""Methods built by ``spice_ray.agents.bayes.make_reference``."""


def make_agent(spec: AgentSpec, env: Any, tasks: Any = None, model: TrunkModel | None = None,
               eval_cfg: EvalConfig | None = None, sigma: float = 0.3) -> Agent:
    """Build the agent a spec describes for environment ``env`` (an Environment).

    Args:
        tasks: the tasks it will act in (the oracle needs them).
        model: required by methods that read a model (spice, dpt, ad-bc).
        eval_cfg: baseline constants (UCB/LCB c, TS prior); default EvalConfig().
        sigma: test-time reward noise std (TS uses sigma^2).
    """
    info = spec.info
    if info.stateless_only and not env.stateless:
        raise ValueError(f"method {spec.method!r} needs a stateless environment; "
                         f"{env.name} has states")
    if info.requires and not hasattr(env, info.requires):
        raise ValueError(f"method {spec.method!r} needs an environment with "
                         f"{info.requires}; {env.name} has none")
    if info.model is not None:
        if model is None:
            raise ValueError(f"method {spec.method!r} needs a model")
        if info.fused:
            width = (env.task_posterior(spec.fusion.gamma) if spec.method == "spice-exact-width"
                     else None)
            return SpiceAgent(spec.fusion, model=model, stateless=env.stateless,
                              use_cache=spec.use_cache, name=spec.method, exact_width=width,
                              num_states=env.num_states)
        return PolicyAgent(model, env.stateless, spec.sample, spec.use_cache, spec.method)
    if info.fused:
        prior = (env.task_posterior(spec.fusion.gamma) if info.prior == "oracle"
                 else FlatPrior(*spec.prior))
        return SpiceAgent(spec.fusion, prior=prior, stateless=env.stateless, name=spec.method,
                          num_states=env.num_states)
    if spec.method in REFERENCES:
        return make_reference(spec.method, env, spec, eval_cfg or EvalConfig())
    if spec.method == "random":
        return RandomAgent()
    if spec.method == "optimal":
        return OracleAgent(env, tasks)
    return make_baseline(spec.method, eval_cfg or EvalConfig(), sigma)


__all__ = ["LCB", "METHODS", "UCB", "Agent", "AgentSpec", "BayesAgent", "LinUCB",
           "NearestUnvisited", "CountingBandit", "EmpiricalMean",
           "FlatPrior", "Method", "OfflinePicker", "OracleAgent", "PolicyAgent",
           "PosteriorBandit", "RandomAgent", "SpiceAgent", "ThompsonSampling", "make_agent",
           "make_baseline", "state_features"]
