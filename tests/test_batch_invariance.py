"""A task's result does not depend on the batch it runs in: every agent in every environment
acts the same in one batch, in uneven batches and alone. (The latent bandit's exact posterior
once took its arm means from a BLAS product, whose last bit depends on the batch's shape: at
h = 0, where every arm's mean is equal, the arm that won was the batch's, not the task's draw.)
No Ray; untrained smoke models for the agents that read one."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from spice_ray.agents import METHODS, AgentSpec, make_agent
from spice_ray.common.rng import TaskStreams
from spice_ray.config import make_config
from spice_ray.evaluate.online import agent_draws, online_noise, run_online
from spice_ray.model.registry import build_model

pytestmark = pytest.mark.usefixtures("one_thread")
ENVS = ("bandit", "bandit_template", "bandit_latent", "linear_bandit", "darkroom",
        "darkroom_region", "darkroom_continuous")
TASKS = 16
SPLITS = {"one batch": [np.arange(TASKS)],
          "uneven batches": np.array_split(np.arange(TASKS), [5, 10, 15]),  # 5, 5, 5, 1
          "alone": [np.array([i]) for i in (0, 1, 2, 7)]}  # four tasks, each on its own


def _actions(name: str, method: str, batches: list[np.ndarray]) -> np.ndarray:
    """Actions [len(ids), H] of ``method``'s online rollouts of the tasks in ``batches``, each
    batch run on its own (same task ids, noise and draws whichever batch a task is in)."""
    cfg = make_config("smoke", name)
    env = cfg.env.environment()
    data = env.generate(cfg.data, "eval", TaskStreams.from_seed(0, "eval", np.arange(TASKS)))
    spec = AgentSpec(method, fusion=cfg.fusion, prior=(0.3, 0.05))
    kind = spec.info.model
    model = (build_model(kind, cfg, generator=torch.Generator().manual_seed(0)).eval()
             if kind else None)
    horizon = cfg.eval.online_horizon
    parts = []
    for ids in batches:
        tasks = env.eval_tasks({column: values[ids] for column, values in data.items()})
        agent = make_agent(spec, env, tasks, model, cfg.eval, sigma=0.3)
        parts.append(run_online(agent, env, tasks, horizon, online_noise(0, ids, horizon), 1,
                                agent_draws(0, ids)).actions)
    return np.concatenate(parts)


@pytest.mark.parametrize("name", ENVS)
def test_every_agents_actions_are_the_same_in_any_batch(name: str) -> None:
    env = make_config("smoke", name).env.environment()
    methods = [m for m in METHODS if AgentSpec(m).applies_to(env)]
    assert "random" in methods and len(methods) >= 8, methods
    if hasattr(env, "task_posterior"):
        assert "bayes-ucb" in methods and "spice-oracle" in methods
    for method in methods:
        acts = {how: _actions(name, method, batches) for how, batches in SPLITS.items()}
        whole = acts["one batch"]
        for how in ("uneven batches", "alone"):
            ids = np.concatenate(SPLITS[how])
            differ = ids[(acts[how] != whole[ids]).any(1)]
            assert differ.size == 0, (f"{method} on {name}: tasks {differ.tolist()} act "
                                      f"otherwise in {how} than in one batch")


@pytest.mark.parametrize("name", ["bandit_template", "bandit_latent", "linear_bandit"])
def test_exact_posterior_moments_of_a_task_do_not_depend_on_its_batch(name: str) -> None:
    env = make_config("smoke", name).env.environment()
    rng = np.random.default_rng(0)
    counts = rng.integers(0, 6, (300, env.num_actions)).astype(np.float64)
    sums = counts * rng.uniform(0.0, 1.0, counts.shape)
    together = env.posterior_moments(counts, sums)
    for batch in (1, 7, 128):
        parts = [env.posterior_moments(counts[lo:lo + batch], sums[lo:lo + batch])
                 for lo in range(0, len(counts), batch)]
        for i, whole in enumerate(together):  # bit for bit: the mean, then the variance
            np.testing.assert_array_equal(np.concatenate([p[i] for p in parts]), whole)


def test_the_latent_posterior_ties_its_arms_exactly_before_any_pull() -> None:
    """At h = 0 every arm of the latent family has the same mean: an exact tie, so the agents'
    tie-break (the task's own draw) picks the arm, not the arithmetic's last bit."""
    env = make_config("smoke", "bandit_latent").env.environment()
    zeros = np.zeros((7, env.num_actions))
    mean, var = env.posterior_moments(zeros, zeros)
    assert (mean == mean[0, 0]).all() and (var == var[0, 0]).all()
    first = _actions("bandit_latent", "bayes-ucb", SPLITS["one batch"])[:, 0]
    assert len(set(first.tolist())) > 1  # the first arm differs between tasks
