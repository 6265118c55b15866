"""Grid points stepped as one batch (``spice_ray.agents.stacked``): a table's or a tuning
trial's learned SPICE agents act as P * B rows on one trunk call per step, and every agent's
rows are the ones it acts alone, bit for bit (no Ray)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from spice_ray.agents import AgentSpec, make_agent
from spice_ray.agents.stacked import StackedAgents, stackable
from spice_ray.config import EvalConfig, FusionConfig, make_config
from spice_ray.data.tasks import generate_tasks
from spice_ray.evaluate import online as online_module
from spice_ray.evaluate import online_noise, online_rows, run_online
from spice_ray.evaluate.online import agent_draws, stack_key
from spice_ray.model import SpiceModel

pytestmark = pytest.mark.usefixtures("one_thread")

DARK = make_config("smoke", "darkroom")
BANDIT = make_config("smoke", "bandit")


def _model(cfg, seed: int = 0) -> SpiceModel:
    env = cfg.env
    return SpiceModel(cfg.model, env.num_actions, env.state_dim, env.horizon + 1,
                      generator=torch.Generator().manual_seed(seed)).eval()


def _data(cfg, n: int) -> dict[str, np.ndarray]:
    return generate_tasks(cfg.env, cfg.data, "eval", np.arange(n))


def _alone(cfg, eval_cfg, data, specs, model) -> pd.DataFrame:
    """Today's path: one online run per spec."""
    return pd.concat([online_rows(cfg.env, eval_cfg, data, [s], model, seed=3) for s in specs],
                     ignore_index=True)


def _fusions(base: FusionConfig, **grid) -> list[FusionConfig]:
    (name, values), = grid.items()
    return [FusionConfig(**{**base.__dict__, name: v}) for v in values]


@pytest.fixture
def stack_all(monkeypatch):
    """Stack the darkroom's agents on the CPU too (by default only where it pays: a GPU)."""
    monkeypatch.setattr(online_module, "STACK_ON_CPU", "all")


def test_darkroom_points_stacked_equal_their_rollouts_alone(stack_all) -> None:
    """The darkroom re-runs the trunk over the whole context every step (and past the model's
    window, with two episodes): beta points, a kernel on raw states, the paper's width and a
    Thompson rule stacked give the rows each gives alone; the flat prior runs alone."""
    data = _data(DARK, 6)
    eval_cfg = EvalConfig(num_tasks=6, online_horizon=20, episodes=2)
    specs = [AgentSpec("spice", f) for f in _fusions(DARK.fusion, beta=(0.0, 0.5, 2.0))]
    specs += [AgentSpec("spice", FusionConfig(kernel="cosine", kernel_space="state")),
              AgentSpec("spice-paper", DARK.fusion), AgentSpec("spice-flat", DARK.fusion),
              AgentSpec("spice", FusionConfig(rule="thompson"))]
    model = _model(DARK)
    stacked = online_rows(DARK.env, eval_cfg, data, specs, model, seed=3)
    pd.testing.assert_frame_equal(stacked, _alone(DARK, eval_cfg, data, specs, model))
    # and the points did differ: stacking equal rows would prove nothing
    final = stacked[(stacked.metric == "cumulative_regret") & (stacked.x == 40)]
    assert final.groupby("config")["value"].sum().nunique() > 3


def test_bandit_points_stacked_through_the_kv_cache_equal_their_rollouts_alone() -> None:
    data = _data(BANDIT, 8)
    specs = [AgentSpec("spice", f) for f in _fusions(BANDIT.fusion, beta=(0.5, 1.0, 3.0))]
    specs.append(AgentSpec("spice", FusionConfig(rule="thompson")))
    model = _model(BANDIT, seed=1)
    stacked = online_rows(BANDIT.env, BANDIT.eval, data, specs, model, seed=3)
    pd.testing.assert_frame_equal(stacked, _alone(BANDIT, BANDIT.eval, data, specs, model))


def test_only_agents_whose_runners_compute_alike_share_a_stack(stack_all) -> None:
    """n-step targets read the heads at every position, whose last row rounds differently from
    the heads at the last position alone: such agents stack apart."""
    model = _model(DARK)
    env, data = DARK.environment(), _data(DARK, 4)
    tasks = env.eval_tasks(data)
    plain = make_agent(AgentSpec("spice", FusionConfig()), env, tasks, model, DARK.eval)
    nstep = make_agent(AgentSpec("spice", FusionConfig(target="nstep", td_n=5, gamma=0.95)),
                       env, tasks, model, DARK.eval)
    flat = make_agent(AgentSpec("spice-flat", FusionConfig()), env, tasks, None, DARK.eval)
    assert stack_key(plain) != stack_key(nstep) and stack_key(flat) is None
    assert not stackable(flat)
    online_module.STACK_ON_CPU = "cached"  # the default: on a CPU the darkroom runs alone
    assert stack_key(plain) is None
    with pytest.raises(ValueError, match="no model context"):
        StackedAgents([plain, flat])
    other = make_agent(AgentSpec("spice", FusionConfig()), env, tasks, _model(DARK, seed=5),
                       DARK.eval)
    with pytest.raises(ValueError, match="one model"):
        StackedAgents([plain, other])


def test_a_stack_acts_each_agents_rollout_with_its_own_draws() -> None:
    """Two Thompson agents stacked, each reset with the draws it would have alone: rows p * B
    onwards are agent p's rollout alone, whatever its place in the stack."""
    env, data = DARK.environment(), _data(DARK, 5)
    tasks = env.eval_tasks(data)
    model = _model(DARK, seed=2)
    ids, H = data["task_id"], 15
    noise = online_noise(1234, ids, H)
    fusions = [FusionConfig(rule="thompson", beta=b) for b in (0.5, 2.0)]

    def agent(f):
        return make_agent(AgentSpec("spice", f), env, tasks, model, DARK.eval)

    alone = [run_online(agent(f), env, tasks, H, noise, 1, agent_draws(1234, ids))
             for f in fusions]
    for order in ([0, 1], [1, 0]):
        stack = StackedAgents([agent(fusions[i]) for i in order],
                              [agent_draws(1234, ids) for _ in order])
        tiled = env.eval_tasks({k: np.concatenate([v, v]) for k, v in data.items()})
        run = run_online(stack, env, tiled, H, np.concatenate([noise, noise]), 1)
        for p, i in enumerate(order):
            np.testing.assert_array_equal(run.actions[p * 5:(p + 1) * 5], alone[i].actions)
            np.testing.assert_array_equal(run.rewards[p * 5:(p + 1) * 5], alone[i].rewards)
