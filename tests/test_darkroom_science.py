"""Issue 11's pieces, checked against hand computations: both regret readings, the flat-prior
and count-based references, the per-head bootstrapped targets, the data's shrinkage prior, and
state features the kernel can tell apart."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from spice_ray.agents import AgentSpec, make_agent
from spice_ray.config import FusionConfig, TrainConfig, make_config
from spice_ray.envs import darkroom
from spice_ray.model.tokens import Tokens
from spice_ray.train.value_losses import bootstrapped_td_loss, head_masks

DARK = make_config("smoke", "darkroom")
ENV = DARK.environment()


# ---- both readings of regret -------------------------------------------------------------


def test_both_regret_readings_on_a_hand_built_trajectory() -> None:
    """Goal (2, 0), start (0, 0); the agent stays twice, then walks in and stays."""
    tasks = darkroom.DarkroomTasks(np.array([[2, 0]]), np.array([[0, 0]]), 10)
    actions = np.array([[4, 4, 0, 0, 4]])
    states = np.array([[[0, 0], [0, 0], [0, 0], [1, 0], [2, 0]]])  # where each action is taken
    rewards = np.array([[0.0, 0.0, 0.0, 1.0, 1.0]])
    # walker: an optimal walker from (0, 0) arrives at step 2 and stays, r* = 0, 1, 1, 1, 1
    np.testing.assert_array_equal(ENV.regret(tasks, states, actions, rewards, 5, "walker"),
                                  [[0, 1, 1, 0, 0]])
    # state: max_a r(s_t, a) - r_t. No action from (0, 0) reaches the goal (0), +x from (1, 0)
    # does and was taken, 'stay' on the goal does and was taken: no regret at all
    np.testing.assert_array_equal(ENV.regret(tasks, states, actions, rewards, 5, "state"),
                                  [[0, 0, 0, 0, 0]])
    # leaving the goal costs 1 under both readings; a second episode restarts the walker
    left = ENV.regret(tasks, np.array([[[2, 0]]]), np.array([[1]]), np.array([[0.0]]), 1,
                      "state")
    assert left.tolist() == [[1.0]]
    two = ENV.regret(tasks, np.concatenate([states, states], 1),
                     np.concatenate([actions, actions], 1),
                     np.concatenate([rewards, rewards], 1), 5, "walker")
    np.testing.assert_array_equal(two, [[0, 1, 1, 0, 0] * 2])
    with pytest.raises(ValueError, match="env.reading"):
        make_config("smoke", "darkroom", overrides=["env.reading=gap"])


def test_state_reading_differs_from_walker_away_from_the_goal() -> None:
    """Wandering far from the goal costs regret under the walker reading, none under the
    paper's literal reading (which is why an agent that never finds the goal scores ~0)."""
    tasks = darkroom.DarkroomTasks(np.array([[9, 9]]), np.array([[0, 0]]), 10)
    actions = np.zeros((1, 40), dtype=np.int64)  # bump into the east wall
    states, rewards = darkroom.rollout_states(tasks, tasks.starts, actions)
    walker = ENV.regret(tasks, states[:, :-1], actions, rewards, 40, "walker")
    state = ENV.regret(tasks, states[:, :-1], actions, rewards, 40, "state")
    assert walker.sum() == 40 - 18 + 1 and state.sum() == 0  # the walker arrives at step 18


# ---- the reference rows -------------------------------------------------------------------


def test_flat_prior_row_is_closed_form_posterior_ucb() -> None:
    """SPICE (flat prior), exact-state kernel, reward targets: at the query state the posterior
    of action a is N(m, v) with v = 1 / (1/v0 + c_a/sigma^2), m = v (mu0/v0 + c_a ybar_a/sigma^2)
    over the transitions taken in that state; the agent picks argmax m + beta sqrt(v)."""
    mu0, v0, noise, beta = 0.05, 0.3, 0.09, 1.0
    fusion = FusionConfig(kernel="exact", kernel_space="state", target="reward", noise_var=noise,
                          v_min=1e-6, beta=beta)
    agent = make_agent(AgentSpec("spice-flat", fusion=fusion, prior=(mu0, v0)), ENV)
    agent.reset(1, 5)
    context = [((1, 1), 0, 0.0), ((1, 1), 0, 1.0), ((1, 1), 2, 0.0), ((3, 4), 1, 1.0),
               ((1, 1), 4, 1.0), ((3, 4), 4, 1.0)]
    for cell, a, r in context:
        s = torch.tensor([cell], dtype=torch.float64)
        agent.observe(torch.tensor([a]), torch.tensor([r], dtype=torch.float64), s, s)
    query = torch.tensor([[1.0, 1.0]], dtype=torch.float64)
    counts = np.zeros(5)
    sums = np.zeros(5)
    for cell, a, r in context:
        if cell == (1, 1):
            counts[a] += 1
            sums[a] += r
    ybar = sums / np.maximum(counts, 1)
    v = 1 / (1 / v0 + counts / noise)
    m = v * (mu0 / v0 + counts * ybar / noise)
    post = agent.posterior(query)
    np.testing.assert_allclose(post.mean[0].numpy(), m, rtol=1e-12)
    np.testing.assert_allclose(post.var[0].numpy(), v, rtol=1e-12)
    assert int(agent.act(1, query)[0]) == int(np.argmax(m + beta * np.sqrt(v)))
    # the count-based explorer is the same posterior with the exact kernel
    count = make_agent(AgentSpec("count", fusion=fusion, prior=(mu0, v0)), ENV)
    assert count.fusion.kernel == "exact" and count.prior == agent.prior


def test_flat_prior_bootstraps_from_its_constant() -> None:
    """n-step targets with gamma > 0 bootstrap V(s') = mu0 under the flat prior."""
    fusion = FusionConfig(kernel="exact", kernel_space="state", target="nstep", td_n=1,
                          gamma=0.5, noise_var=1.0, v_min=1e-6)
    agent = make_agent(AgentSpec("spice-flat", fusion=fusion, prior=(2.0, 1.0)), ENV)
    agent.reset(1, 5)
    s = torch.tensor([[0.0, 0.0]], dtype=torch.float64)
    agent.observe(torch.tensor([3]), torch.tensor([1.0], dtype=torch.float64), s, s)
    agent.observe(torch.tensor([0]), torch.tensor([0.0], dtype=torch.float64), s, s)
    post = agent.posterior(s)
    # action 3: one target y = 1 + 0.5 * 2 = 2; posterior mean (2/1 + 1 * 2/1) / (1 + 1) = 2
    assert post.mean[0, 3].item() == pytest.approx(2.0)
    assert post.var[0, 3].item() == pytest.approx(0.5)


def test_random_agent_is_uniform_and_keyed() -> None:
    from spice_ray.evaluate import agent_draws

    agent = make_agent(AgentSpec("random"), ENV)
    ids = np.arange(4000)
    agent.reset(4000, 5, agent_draws(3, ids))
    acts = agent.act(0, torch.zeros(4000, 2)).numpy()
    assert np.abs(np.bincount(acts, minlength=5) / 4000 - 0.2).max() < 0.03
    again = make_agent(AgentSpec("random"), ENV)
    again.reset(4, 5, agent_draws(3, ids[:4]))
    np.testing.assert_array_equal(again.act(0, torch.zeros(4, 2)).numpy(), acts[:4])


# ---- a prior worth having ----------------------------------------------------------------


def test_head_masks_are_fixed_halves() -> None:
    ids = torch.arange(20_000)
    masks = head_masks(ids, 7)
    assert masks.shape == (20_000, 7) and abs(masks.float().mean().item() - 0.5) < 0.01
    assert torch.equal(head_masks(ids[100:200], 7), masks[100:200])  # a function of the id
    agree = (masks[:, 0] == masks[:, 1]).float().mean().item()
    assert abs(agree - 0.5) < 0.02  # heads see different halves


def test_bootstrapped_td_loss_fits_each_head_on_its_tasks() -> None:
    """With n = 1, gamma = 0 each head's loss is the mean squared error of its Q on the taken
    action against the reward, over the tasks its mask gives it."""
    B, T, K, A = 6, 4, 3, 2
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, T + 1, K, A, generator=g, dtype=torch.float64)
    actions = torch.randint(0, A, (B, T), generator=g)
    rewards = torch.rand(B, T, generator=g, dtype=torch.float64)
    zeros = torch.zeros(B, T, 1, dtype=torch.float64)
    tokens = Tokens(zeros[:, 0], zeros, actions, rewards, zeros, torch.zeros(B, dtype=torch.long),
                    torch.full((B, A), 0.5, dtype=torch.float64))
    ids = torch.arange(B) + 11
    cfg = TrainConfig(td_n=1, gamma=0.0)
    got = bootstrapped_td_loss(q, tokens, cfg, ids)
    mask = head_masks(ids, K)
    total, count = 0.0, 0
    for b in range(B):
        for k in range(K):
            if mask[b, k]:
                for t in range(T):
                    total += (q[b, t, k, actions[b, t]].item() - rewards[b, t].item()) ** 2
                    count += 1
    assert got.item() == pytest.approx(total / count)


@pytest.mark.ray
def test_data_shrinkage_prior_is_the_targets_mean_and_variance(ray_local, tmp_path) -> None:
    from spice_ray.data.generate import generate_dataset
    from spice_ray.data.store import load_split
    from spice_ray.fusion import nstep_targets
    from spice_ray.train.prior import data_shrink_prior
    from spice_ray.train.ray_train import plan_job

    cfg = make_config("smoke", "darkroom", overrides=["train.shrink_prior=data",
                                                      f"out_dir={tmp_path}"])
    ds = generate_dataset(cfg, tmp_path / "ds").dataset_dir
    rewards = torch.as_tensor(load_split(ds, "train")["rewards"].astype(np.float64))
    n, gamma = cfg.train.td_n, cfg.train.gamma
    y = nstep_targets(rewards, torch.zeros_like(rewards), n, gamma)[:, : rewards.shape[1] - n + 1]
    mean, var = data_shrink_prior(cfg, ds)
    assert mean == pytest.approx(y.mean().item()) and var == pytest.approx(y.var(False).item())
    job, _ = plan_job(cfg, "spice", 0, ds)  # the job trains with the data's numbers
    assert job.cfg.train.shrink_prior_mean == pytest.approx(mean, abs=1e-6)
    assert job.cfg.train.shrink_prior_var == pytest.approx(var, abs=1e-6)


# ---- state features the kernel can use ----------------------------------------------------


@pytest.mark.ray
def test_default_kernel_tells_grid_neighbours_apart_after_training(ray_local, tmp_path) -> None:
    """After (smoke) training, the default darkroom kernel gives grid neighbours a weight well
    below 1 and each cell pools the evidence of only a few others. The paper's reading (the
    query token's trunk output) collapses: its features are trained by nothing that depends on
    the query state."""
    from spice_ray.agents import SpiceAgent
    from spice_ray.data.generate import generate_dataset
    from spice_ray.fusion import kernel_weights
    from spice_ray.model.registry import load_model
    from spice_ray.train.ray_train import pretrain

    cfg = make_config("smoke", "darkroom", overrides=[f"out_dir={tmp_path}"])
    ds = generate_dataset(cfg, tmp_path / "ds").dataset_dir
    model = load_model(pretrain(cfg, "spice", 0, ds))
    agent = SpiceAgent(cfg.fusion, model=model)
    cells = torch.as_tensor(darkroom.all_cells(10), dtype=torch.float64)  # (100, 2)
    feats = agent.kernel_features(cells).to(torch.float64)  # (100, D)
    w = kernel_weights(feats, feats[None].expand(100, -1, -1), cfg.fusion.kernel,
                       cfg.fusion.tau)  # (100, 100)
    grid = torch.cdist(cells, cells)
    assert w[grid == 1].max() < 0.5  # neighbours are told apart
    assert (w.sum(1) - 1).mean() < 3.0  # pooled mass per cell: a few cells, not ~35


def test_episode_protocol_starts_in_the_corner_on_a_frozen_context() -> None:
    """The DPT paper's offline protocol: the context is observed once per reset, the episode's
    own steps are not; every episode starts at (0, 0); the optimal agent has zero regret and
    the return the goal's distance allows."""
    from spice_ray.config import make_config
    from spice_ray.data.tasks import generate_tasks
    from spice_ray.evaluate.episode import FrozenContext, episode_rows

    cfg = make_config("smoke", "darkroom", overrides=["env.horizon=30", "eval.online_horizon=30"])
    data = generate_tasks(cfg.env, cfg.data, "eval", np.arange(12))
    rows = episode_rows(cfg.env, cfg.eval, data, [AgentSpec("optimal"), AgentSpec("random")])
    last = rows[rows["x"] == 30].pivot_table(index="task_id", columns=["method", "metric"],
                                             values="value")
    np.testing.assert_array_equal(last[("Optimal", "cumulative_regret")], 0.0)
    distance = np.asarray(data["goal"], dtype=np.int64).sum(1)  # from (0, 0)
    np.testing.assert_array_equal(last[("Optimal", "cumulative_return")],
                                  np.maximum(30 - distance + 1, 0))
    assert (last[("Random", "cumulative_regret")] > 0).all()

    class Counting:
        name = "counting"
        seen = 0

        def reset(self, num_tasks, num_actions, draws=None):
            self.seen = 0

        def observe(self, actions, rewards, states, next_states):
            self.seen += 1

        def act(self, t, states):
            assert t == 30 and self.seen == 30  # the whole context, and nothing more
            return torch.full((len(states),), 4)

    context = tuple(torch.zeros(3, 30, *shape) for shape in ((), (), (2,), (2,)))
    frozen = FrozenContext(Counting(), context)
    frozen.reset(3, 5)
    frozen.observe(*(c[:, 0] for c in context))
    assert frozen.act(31, torch.zeros(3, 2)).tolist() == [4, 4, 4]
