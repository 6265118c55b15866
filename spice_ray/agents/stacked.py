"""Several SPICE agents on one model stepped as one batch (a tuning grid's points, a table's
rows that read the same checkpoint).

P agents, each acting in the same B tasks, become one agent of P * B rows: the trunk runs once
per environment step over every row (what fills a GPU: a darkroom step re-runs the trunk over
the whole context of every rollout), and each agent's fusion, prior and rule read only its own
rows (``_Rows``). Agent p's rollout is the one it would act alone: its rows of the trunk's
outputs equal those of a B-row forward (row-wise arithmetic; tested bit for bit), its draws are
its own (``draws[p]``), and the environment steps each row as it would step it alone.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from spice_ray.agents.runner import ContextRunner, ContextView
from spice_ray.agents.spice import SpiceAgent
from spice_ray.fusion import RandomSource


def stackable(agent: Any) -> bool:
    """Whether ``agent`` can join a stack: a SPICE agent whose prior reads a model (its
    context runs through the trunk; a model-free agent has nothing to share)."""
    return isinstance(agent, SpiceAgent) and agent.runner is not None


def _rows(value: Any, lo: int, hi: int) -> Any:
    """Rows [lo, hi) of a tensor, of every tensor field of a (possibly nested) dataclass, or
    None."""
    if value is None:
        return None
    if isinstance(value, Tensor):
        return value[lo:hi]
    return type(value)(**{f.name: _rows(getattr(value, f.name), lo, hi)
                          for f in dataclasses.fields(value)})


class _Rows:
    """What a stacked agent has in place of its own :class:`ContextRunner`: the stack's
    runner, read at this agent's rows. The stack appends every row's transition and runs the
    trunk; reset and append here do nothing."""

    def __init__(self, stack: StackedAgents, lo: int, hi: int) -> None:
        self.stack, self.lo, self.hi = stack, lo, hi

    def reset(self, num_tasks: int) -> None:
        if num_tasks != self.hi - self.lo:
            raise ValueError(f"a stacked agent has {self.hi - self.lo} rows, not {num_tasks}")

    def append(self, *transition: Any) -> None:
        pass

    def view(self, query_states: Tensor | None = None) -> ContextView:
        return _rows(self.stack.view(), self.lo, self.hi)


class StackedAgents:
    """P SPICE agents of one model acting in the same B tasks as one agent of P * B rows
    (rows p * B .. (p + 1) * B - 1 are agent p's).

    Args:
        agents: :func:`stackable` agents, all of the same model object.
        draws: each agent's own draws (what it would be reset with alone), or None.

    Raises:
        ValueError: an agent cannot be stacked, or the agents read different models.
    """

    def __init__(self, agents: Sequence[SpiceAgent],
                 draws: Sequence[RandomSource | None] | None = None) -> None:
        if not agents:
            raise ValueError("StackedAgents needs at least one agent")
        bad = [a.name for a in agents if not stackable(a)]
        if bad:
            raise ValueError(f"agents {bad} have no model context to stack")
        if len({id(a.model) for a in agents}) > 1:
            raise ValueError("stacked agents must read one model")
        if draws is not None and len(draws) != len(agents):
            raise ValueError(f"{len(draws)} draws for {len(agents)} agents")
        self.agents = list(agents)
        self.draws = list(draws) if draws is not None else [None] * len(agents)
        first = self.agents[0].runner
        self.runner = ContextRunner(
            first.model, stateless=first.use_cache, use_cache=first.use_cache,
            keep_latents=any(a.runner.keep_latents for a in self.agents),
            keep_prior_means=any(a.runner.keep_prior_means for a in self.agents))
        self.name = "+".join(a.name for a in self.agents)
        self._view: ContextView | None = None
        self._states: Tensor | None = None

    def reset(self, num_tasks: int, num_actions: int, draws: RandomSource | None = None
              ) -> None:
        """``num_tasks`` = P * B rows; each agent is reset with its own draws (``draws`` here
        is not used: one source cannot serve P agents as each would draw alone)."""
        P = len(self.agents)
        if num_tasks % P:
            raise ValueError(f"{num_tasks} rows do not split over {P} stacked agents")
        B = num_tasks // P
        self.B = B
        self.runner.reset(num_tasks)
        for p, agent in enumerate(self.agents):
            agent.runner = _Rows(self, p * B, (p + 1) * B)
            agent.reset(B, num_actions, self.draws[p])
        self._view = None

    def view(self) -> ContextView:
        """The trunk's outputs over every row at the current step, run once per step."""
        if self._view is None:
            self._view = self.runner.view(self._states)
        return self._view

    def act(self, t: int, states: Tensor) -> Tensor:
        self._states, self._view = states, None
        B = self.B
        return torch.cat([a.act(t, states[p * B:(p + 1) * B])
                          for p, a in enumerate(self.agents)])

    def observe(self, actions: Tensor, rewards: Tensor, states: Tensor, next_states: Tensor
                ) -> None:
        self.runner.append(states, actions, rewards, next_states)
        self._view = None
        B = self.B
        for p, agent in enumerate(self.agents):
            rows = slice(p * B, (p + 1) * B)
            agent.observe(actions[rows], rewards[rows], states[rows], next_states[rows])
