"""The deployable policy acts exactly as the evaluation does, from a checkpoint alone."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import spice_ray
from spice_ray.agents import AgentSpec, make_agent
from spice_ray.config import make_config
from spice_ray.data.tasks import generate_tasks
from spice_ray.evaluate import agent_draws, online_noise, run_online
from spice_ray.model.checkpoint import save_checkpoint
from spice_ray.model.registry import build_model, load_model


def _checkpoint(tmp_path, cfg, kind: str = "spice"):
    model = build_model(kind, cfg, generator=torch.Generator().manual_seed(3))
    return save_checkpoint(tmp_path / kind, model, cfg, "hash", epoch=0)


@pytest.mark.parametrize("env_name, rule", [("bandit", "thompson"), ("bandit", "ucb"),
                                            ("darkroom", "ucb")])
def test_policy_reproduces_the_evaluation_actions(tmp_path, env_name, rule) -> None:
    cfg = make_config("smoke", env_name)
    path = _checkpoint(tmp_path, cfg)
    env = cfg.environment()
    ids = np.arange(5)
    data = generate_tasks(cfg.env, cfg.data, "eval", ids)
    tasks = env.eval_tasks(data)
    H = cfg.eval.online_horizon
    noise = online_noise(cfg.eval.seed, ids, H)
    # the evaluation
    fusion = dataclasses.replace(cfg.fusion, rule=rule)
    agent = make_agent(AgentSpec("spice", fusion=fusion), env, tasks,
                       load_model(path), cfg.eval)
    want = run_online(agent, env, tasks, H, noise, 1, agent_draws(cfg.eval.seed, ids)).actions
    # the deployable policy, stepping the same tasks with the same noise
    policy = spice_ray.SpicePolicy.from_checkpoint(path, rule=rule)
    policy.reset(num_envs=5, draws=agent_draws(cfg.eval.seed, ids))
    states = env.reset(tasks)
    got = np.empty((5, H), dtype=np.int64)
    for t in range(H):
        got[:, t] = policy.act(states)
        nxt, rewards = env.step(tasks, states, got[:, t], noise[:, t])
        policy.observe(states, got[:, t], rewards, nxt)
        states = nxt
    np.testing.assert_array_equal(got, want)
    mean, var = policy.posterior(states)
    assert mean.shape == var.shape == (5, env.num_actions) and (var > 0).all()


def test_single_environment_api_and_options(tmp_path) -> None:
    cfg = make_config("smoke", "bandit")
    path = _checkpoint(tmp_path, cfg)
    greedy = spice_ray.SpicePolicy.from_checkpoint(path, rule="greedy")
    greedy.reset()
    a = greedy.act([0.0])
    assert isinstance(a, int) and 0 <= a < 5
    greedy.observe([0.0], a, 0.9, [0.0])
    mean, var = greedy.posterior()
    assert mean.shape == (5,) and int(np.argmax(mean)) == greedy.act([0.0])  # greedy on it
    scheduled = spice_ray.SpicePolicy.from_checkpoint(path, beta_schedule="sqrt2logt")
    assert scheduled.fusion.beta_schedule == "sqrt2logt"
    with pytest.raises(ValueError, match="fusion.rule"):
        spice_ray.SpicePolicy.from_checkpoint(path, rule="boldly")
    dpt = spice_ray.DptPolicy.from_checkpoint(_checkpoint(tmp_path, cfg, "dpt"))
    dpt.reset()
    assert 0 <= dpt.act([0.0]) < 5
    with pytest.raises(Exception, match="holds a 'dpt' model"):
        spice_ray.SpicePolicy.from_checkpoint(tmp_path / "dpt")
