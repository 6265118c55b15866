"""Epsilon-greedy, added as its own module: the registry finds it, it explores at the rate it
says, and it runs through the same online protocol as every agent."""

from __future__ import annotations

import numpy as np
import torch

from spice_ray.agents import METHODS, AgentSpec, make_agent
from spice_ray.agents.epsilon_greedy import EpsilonGreedy
from spice_ray.common.rng import StepDraws, TaskStreams
from spice_ray.config import EvalConfig, make_config
from spice_ray.data.tasks import generate_tasks
from spice_ray.evaluate.online import online_rows


def test_registered_by_its_own_module_and_built_by_make_agent() -> None:
    env = make_config("smoke", "bandit").environment()
    spec = AgentSpec("epsilon-greedy")
    assert METHODS["epsilon-greedy"].label == spec.label == "Epsilon-greedy"
    assert isinstance(make_agent(spec, env), EpsilonGreedy)
    assert spec.config_dict(EvalConfig()) == {"epsilon": 0.1}
    assert spec.applies_to(env) and not spec.applies_to(make_config("smoke", "darkroom")
                                                          .environment())


def test_explores_uniformly_at_rate_epsilon() -> None:
    """Arm 2 is the best mean of every task once each arm is seen: the agent takes it with
    probability 1 - eps + eps / A and each other arm with eps / A."""
    tasks, arms, eps = 20_000, 4, 0.2
    agent = EpsilonGreedy(eps)
    agent.reset(tasks, arms, StepDraws(TaskStreams.from_seed(0, "eval", np.arange(tasks)), "a"))
    for arm in range(arms):  # each arm once, arm 2 the best
        agent.observe(torch.full((tasks,), arm), torch.full((tasks,), 1.0 if arm == 2 else 0.0))
    picks = agent.act(arms).numpy()
    share = np.bincount(picks, minlength=arms) / tasks
    expected = np.full(arms, eps / arms)
    expected[2] += 1 - eps
    np.testing.assert_allclose(share, expected, atol=4 * np.sqrt(0.25 / tasks))
    # keyed draws: the same seed gives the same actions
    again = EpsilonGreedy(eps)
    again.reset(tasks, arms, StepDraws(TaskStreams.from_seed(0, "eval", np.arange(tasks)), "a"))
    for arm in range(arms):
        again.observe(torch.full((tasks,), arm), torch.full((tasks,), 1.0 if arm == 2 else 0.0))
    np.testing.assert_array_equal(again.act(arms).numpy(), picks)


def test_runs_through_the_online_protocol_far_below_random() -> None:
    cfg = make_config("smoke", "bandit", overrides=["env.horizon=200",
                                                    "eval.online_horizon=200"])
    data = generate_tasks(cfg.env, cfg.data, "eval", np.arange(64))
    rows = online_rows(cfg.env, cfg.eval, data, [AgentSpec("epsilon-greedy"),
                                                 AgentSpec("random")])
    final = rows[(rows["x"] == 200) & (rows["metric"] == "cumulative_regret")]
    by = final.groupby("method")["value"].mean()
    assert 0 < by["Epsilon-greedy"] < 0.5 * by["Random"]
    configs = set(final[final["method"] == "Epsilon-greedy"]["config"])
    assert configs == {'{"epsilon":0.1,"sigma":0.3}'}
