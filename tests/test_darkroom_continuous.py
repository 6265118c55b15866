"""The continuous Darkroom: feature-vector states, smooth reward, and the whole study on it."""

from __future__ import annotations

import numpy as np
import pytest

from spice_ray import envs
from spice_ray.config import make_config
from spice_ray.data.tasks import generate_tasks
from spice_ray.envs import darkroom
from spice_ray.envs.darkroom_continuous import embedding
from spice_ray.model.tokens import make_tokens

CFG = make_config("smoke", "darkroom_continuous")
ENV = CFG.environment()


def test_registered_with_its_own_fields() -> None:
    assert "darkroom_continuous" in envs.names()
    assert (ENV.state_dim, ENV.num_actions, CFG.env.reward_width) == (10, 5, 1.5)
    with pytest.raises(ValueError, match="env.reward_width"):
        make_config("smoke", "darkroom_continuous", overrides=["env.reward_width=0"])


def test_embedding_is_isometric_and_invertible() -> None:
    w, c = embedding(10, 0)
    np.testing.assert_allclose(w.T @ w, np.eye(2), atol=1e-12)
    tasks = ENV.eval_tasks(generate_tasks(CFG.env, CFG.data, "eval", np.arange(3)))
    cells = darkroom.all_cells(10)
    states = tasks.embed(cells)
    np.testing.assert_array_equal(tasks.cells(states), cells)
    np.testing.assert_allclose(np.linalg.norm(states[1] - states[0]), 1.0)  # grid neighbours
    assert not np.isin(states, np.arange(10)).any()  # no coordinate is a grid coordinate


def test_smooth_reward_and_steps_follow_the_grid() -> None:
    data = generate_tasks(CFG.env, CFG.data, "eval", np.arange(50))
    tasks = ENV.eval_tasks(data)
    goal = tasks.grid.goals
    states = tasks.embed(goal - np.array([1, 0]).clip(0))  # next to the goal (or on it)
    for a in range(5):
        nxt, r = ENV.step(tasks, states, np.full(50, a), np.zeros(50))
        cells = darkroom.move(tasks.cells(states), np.full(50, a), 10)
        np.testing.assert_array_equal(tasks.cells(nxt), cells)
        np.testing.assert_allclose(r, np.exp(-((cells - goal) ** 2).sum(1) / (2 * 1.5**2)))
    on_goal = ENV.step(tasks, tasks.embed(goal), np.full(50, 4), np.zeros(50))[1]
    np.testing.assert_array_equal(on_goal, 1.0)  # staying on the goal pays 1


def test_data_are_consistent_and_goals_held_out() -> None:
    train = generate_tasks(CFG.env, CFG.data, "train", np.arange(200))
    tasks = ENV.eval_tasks(train)
    np.testing.assert_allclose(train["states"], tasks.embed(train["cells"]), atol=1e-5)
    np.testing.assert_allclose(
        train["rewards"], tasks.reward(tasks.grid, train["cells"][:, 1:]), atol=1e-6)
    moved = darkroom.move(train["cells"][:, :-1], train["actions"], 10)
    np.testing.assert_array_equal(moved, train["cells"][:, 1:])
    assert (train["label"] == train["actions"][:, -1]).all()  # weak-last
    held = {tuple(g) for g in darkroom.goal_split(10, 0.8, 0)[1]}
    ev = generate_tasks(CFG.env, CFG.data, "eval", np.arange(100))
    assert {tuple(g) for g in ev["goal"]} <= held
    assert not {tuple(g) for g in train["goal"]} & held
    tokens = make_tokens(train, ENV)
    assert tokens.states.shape == (200, CFG.env.horizon, 10)


def test_oracle_has_zero_regret_under_both_readings() -> None:
    from spice_ray.agents import OracleAgent
    from spice_ray.evaluate import run_online

    tasks = ENV.eval_tasks(generate_tasks(CFG.env, CFG.data, "eval", np.arange(20)))
    run = run_online(OracleAgent(ENV, tasks), ENV, tasks, 30, np.zeros((20, 30)))
    for reading in ENV.regret_readings:
        np.testing.assert_allclose(
            ENV.regret(tasks, run.states, run.actions, run.rewards, 30, reading), 0.0,
            atol=1e-12)
    assert (run.rewards[:, -1] == 1.0).all()  # it arrived and stays
    # shrinking the larger offset first beats Darkroom's x-first path under a smooth reward
    x_first = darkroom.walker_rewards(tasks.grid, 30, tasks.reward, darkroom.optimal_action)
    assert (run.rewards.sum(1) >= x_first.sum(1) - 1e-12).all()
    assert (run.rewards.sum(1) > x_first.sum(1) + 1e-6).any()


def test_hill_climbing_finds_the_smooth_peak_without_knowing_the_goal() -> None:
    """The continuous Darkroom's goal-blind reference: it climbs to the goal and stays on most
    tasks, far below Random's regret and above the oracle's zero, and its draws are keyed."""
    from spice_ray.agents import AgentSpec, make_agent
    from spice_ray.evaluate import agent_draws, run_online

    ids = np.arange(100)
    tasks = ENV.eval_tasks(generate_tasks(CFG.env, CFG.data, "eval", ids))
    H = 100

    def run(method: str):
        agent = make_agent(AgentSpec(method), ENV)
        return run_online(agent, ENV, tasks, H, np.zeros((100, H)), draws=agent_draws(0, ids))

    climb, rand = run("hill-climb"), run("random")
    regret = {name: ENV.regret(tasks, r.states, r.actions, r.rewards, H, "walker").sum(1)
              for name, r in (("climb", climb), ("random", rand))}
    on_goal = (climb.rewards[:, -1] == 1.0).mean()
    assert on_goal >= 0.95, on_goal
    assert regret["climb"].mean() < 0.25 * regret["random"].mean()
    assert regret["climb"].mean() > 0  # it must search: it does not know where the goal is
    np.testing.assert_array_equal(run("hill-climb").actions, climb.actions)
