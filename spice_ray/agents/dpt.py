"""DPT / AD-BC at test time: act from the policy head's logits at the current position."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from spice_ray.agents.base import AgentSpec, Build, Method, OfflineContexts, register_method
from spice_ray.agents.runner import ContextRunner
from spice_ray.fusion import STATS_DTYPE, RandomSource, argmax_ties, sample_categorical, tie_draws
from spice_ray.model.trunk import TrunkModel


class PolicyAgent:
    """Sample from softmax(logits) (DPT's bandit protocol) or take the argmax.

    Args:
        model: a DptModel (or any model whose heads return logits).
        stateless: the environment has one constant state (KV cache allowed).
        sample: sample (True) or act greedily.
        use_cache: stateless environments: KV-cache decoding.
        name: "dpt" or "ad-bc" (the same agent on a model trained on weak labels).
    """

    def __init__(self, model: TrunkModel, stateless: bool, sample: bool = True,
                 use_cache: bool = True, name: str = "dpt") -> None:
        self.model = model.eval()
        self.runner = ContextRunner(self.model, stateless, use_cache)
        self.sample = sample
        self.name = name
        self._draws: RandomSource | None = None

    def reset(self, num_tasks: int, num_actions: int, draws: RandomSource | None = None
              ) -> None:
        if num_actions != self.model.num_actions:
            raise ValueError(f"num_actions={num_actions} but the model has "
                             f"{self.model.num_actions} actions")
        self.runner.reset(num_tasks)
        self._draws = draws

    def observe(self, actions: Tensor, rewards: Tensor, states: Tensor, next_states: Tensor
                ) -> None:
        """Append one transition per task; the model is stepped lazily at the next act()."""
        self.runner.append(states, actions, rewards, next_states)

    def act(self, t: int, states: Tensor) -> Tensor:
        """Sampled or greedy actions, long [B] on the CPU."""
        logits = self.runner.view(states).head.logits.to("cpu", STATS_DTYPE)
        if not self.sample:
            return argmax_ties(logits, tie_draws(self._draws, logits))
        if self._draws is None:
            raise ValueError("a sampling policy agent needs a torch.Generator or StepDraws in "
                             "reset()")
        return sample_categorical(torch.softmax(logits, dim=-1), self._draws)  # (B,)

    def offline_picks(self, contexts: OfflineContexts) -> Tensor:
        """The greedy action of the policy head at each position h (it has seen the first h
        transitions): long [B, P]."""
        if contexts.outputs is None or "logits" not in contexts.outputs:
            raise ValueError(f"{self.name}'s offline picks read the policy head's logits at "
                             "each context length: give the model's outputs")
        return argmax_ties(contexts.outputs["logits"], contexts.ties)


def _policy(spec: AgentSpec, env: Any, build: Build) -> PolicyAgent:
    return PolicyAgent(build.model, env.stateless, spec.sample, spec.use_cache, spec.method)


def _rule(spec: AgentSpec, online: bool) -> str:
    return "sample" if (online and spec.sample) else "greedy"


register_method("dpt", Method("DPT", _policy, model="dpt", offline=True, rule=_rule))
register_method("ad-bc", Method("AD-BC", _policy, model="dpt", offline=True, rule=_rule))
"""AD-BC: the DPT model's architecture and loss trained on the behaviour's own actions."""
