"""The structured task families: each matches its definition, and each exact posterior matches
a Monte Carlo estimate of the same posterior (no Ray, under a few seconds)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from spice_ray.agents import AgentSpec, make_agent
from spice_ray.common.rng import StepDraws, TaskStreams
from spice_ray.config import EnvConfig, EvalConfig, FusionConfig
from spice_ray.envs.bandit import BanditTasks
from spice_ray.envs.darkroom import goal_split
from spice_ray.evaluate.online import agent_draws, online_noise, run_online
from spice_ray.results.analysis import FLAT, LEARNED, ORACLE, gap_closed


def _env(name: str, horizon: int = 50):
    return EnvConfig(name=name, horizon=horizon).environment()


def _streams(n: int, seed: int = 0, split: str = "train") -> TaskStreams:
    return TaskStreams.from_seed(seed, split, np.arange(n))


def test_template_bandit_matches_its_definition() -> None:
    env = _env("bandit_template")
    means = env.sample_means(_streams(20_000))
    assert means.shape == (20_000, 5) and means.min() >= 0 and means.max() <= 1
    assert abs((means.argmax(1) == 0).mean() - 0.78) < 0.015  # "arm 0 best in about 78%"
    np.testing.assert_allclose(means.mean(0), [0.7, 0.4, 0.4, 0.4, 0.4], atol=0.005)
    np.testing.assert_allclose(means.std(0), 0.15, atol=0.006)


def test_latent_bandit_matches_its_definition() -> None:
    env = _env("bandit_latent")
    means = env.sample_means(_streams(20_000))
    # every arm has the same marginal: mean 1/2, variance 0.4^2 / 2
    np.testing.assert_allclose(means.mean(0), 0.5, atol=0.006)
    np.testing.assert_allclose(means.var(0), 0.08, atol=0.003)
    # one angle sets all arms: the means lie on the cosine of some theta
    a = np.arange(5)
    for row in means[:20]:
        grid = np.linspace(0, 2 * np.pi, 20_001)
        fit = 0.5 + 0.4 * np.cos(grid[:, None] - 2 * np.pi * a / 5)
        assert np.abs(fit - row).max(axis=1).min() < 1e-3


def test_linear_bandit_matches_its_definition() -> None:
    env = _env("linear_bandit")
    phi = env.arm_features()
    assert phi.shape == (10, 2)
    np.testing.assert_array_equal(phi, _env("linear_bandit").arm_features())  # fixed seed
    means = env.sample_means(_streams(20_000))
    # mu = phi theta with theta ~ N(0, I/2): covariance phi phi^T / 2
    np.testing.assert_allclose(np.cov(means.T), phi @ phi.T / 2, atol=0.03)


def test_region_darkroom_goals_follow_the_region_and_the_split() -> None:
    env = _env("darkroom_region", 100)
    sizes = {s: tuple(len(g) for g in env.goal_pools(s)) for s in ("train", "validation", "eval")}
    assert sizes == {"train": (11, 59), "validation": (2, 8), "eval": (3, 17)}  # per region
    pools = {s: {tuple(c) for c in env.goal_pool(s)} for s in sizes}
    assert not pools["train"] & pools["eval"] and not pools["validation"] & pools["eval"]
    assert not pools["train"] & pools["validation"]
    assert len(pools["train"] | pools["validation"] | pools["eval"]) == 100
    for split in sizes:
        goals = env.sample_tasks(_streams(20_000, split=split), split).goals
        in_block = np.all(goals >= 6, axis=1)
        assert abs(in_block.mean() - 0.9) < 0.01
        assert {tuple(g) for g in goals} == pools[split]
    # the plain Darkroom's split is untouched by the region family
    assert len(goal_split(10, 0.8, 0)[0]) == 80


def test_no_goal_held_out_puts_every_split_on_every_cell_with_other_tasks() -> None:
    """train_goal_fraction=1 (val 0): each split draws its goals from all 16 block and 84
    outside cells, at the family's 0.9, as different tasks; the default split is unchanged;
    a held-out validation fraction with no held-out goals is refused by name."""
    from spice_ray.config import make_config
    from spice_ray.config.sections import ConfigError

    shared = ["env.train_goal_fraction=1", "env.val_goal_fraction=0"]
    for name, cells in (("darkroom_region", (16, 84)), ("darkroom", (100,))):
        env = make_config("small", name, overrides=shared).environment()
        for split in ("train", "validation", "eval"):
            pools = env.goal_pools(split) if name == "darkroom_region" else (env.goal_pool(split),)
            assert tuple(len(p) for p in pools) == cells, (name, split)
    env = make_config("small", "darkroom_region", overrides=shared).environment()
    tasks = {split: env.sample_tasks(_streams(20_000, split=split), split)
             for split in ("validation", "eval")}
    for drawn in tasks.values():
        assert abs(np.all(drawn.goals >= 6, axis=1).mean() - 0.9) < 0.01
        assert len({tuple(g) for g in drawn.goals}) == 100  # every cell is some task's goal
    assert not np.array_equal(tasks["validation"].goals, tasks["eval"].goals)
    with pytest.raises(ConfigError, match="env.val_goal_fraction=0.1 is invalid with "
                                          "env.train_goal_fraction=1"):
        make_config("small", "darkroom_region", overrides=["env.train_goal_fraction=1"])


def _importance_posterior(env, counts: np.ndarray, sums: np.ndarray, n: int = 400_000
                          ) -> tuple[np.ndarray, np.ndarray]:
    """Posterior mean and variance of the arm means by self-normalised importance sampling
    from the family's own prior."""
    mu = env.sample_means(_streams(n, seed=11))  # (N, A)
    logw = ((mu * sums - 0.5 * counts * mu**2) / env.params.sigma**2).sum(1)
    w = np.exp(logw - logw.max())
    w /= w.sum()
    mean = w @ mu
    return mean, w @ mu**2 - mean**2


def test_rowwise_products_are_the_broadcast_sums_and_the_same_in_any_batch() -> None:
    """The exact posteriors' products (``envs.bayes.rowwise_matmul``): each row summed on its
    own, bit for bit the broadcast product summed over K, whatever the batch a row is in and
    whatever the operands' memory layout (the call sites pass transposed grids)."""
    from spice_ray.envs.bayes import rowwise_matmul

    rng = np.random.default_rng(0)
    for B, K, N in ((500, 10, 1024), (500, 1024, 10), (37, 5, 64), (1, 300, 7)):
        x, m = rng.normal(size=(B, K)), rng.normal(size=(N, K)).T  # m: a transposed view
        got = rowwise_matmul(x, m)
        want = (x[:, :, None] * np.ascontiguousarray(m)[None]).sum(1)
        assert np.array_equal(got, want), (B, K, N)
        for rows in (slice(-1, None), slice(0, 3), slice(1, None, 2)):
            assert np.array_equal(rowwise_matmul(np.asfortranarray(x[rows]), m), got[rows])


@pytest.mark.parametrize("name", ["bandit_template", "bandit_latent", "linear_bandit"])
def test_exact_posteriors_match_monte_carlo(name: str) -> None:
    env = _env(name)
    a = env.num_actions
    truth = env.sample_means(_streams(1, seed=5))[0]
    counts = np.zeros(a)
    counts[:3] = (4, 2, 1)  # a few pulls of three arms: the posterior is still wide
    sums = counts * truth + 0.3 * np.sqrt(counts) * np.array([0.5, -1.0, 0.3] + [0] * (a - 3))
    mean, var = env.posterior_moments(counts[None], sums[None])
    mc_mean, mc_var = _importance_posterior(env, counts, sums)
    np.testing.assert_allclose(mean[0], mc_mean, atol=0.01)
    np.testing.assert_allclose(var[0], mc_var, rtol=0.08, atol=2e-4)
    # the prior itself (no pulls) is the family's marginal
    prior_mean, prior_var = env.posterior_moments(np.zeros((1, a)), np.zeros((1, a)))
    marginal = env.sample_means(_streams(200_000, seed=3))
    np.testing.assert_allclose(prior_mean[0], marginal.mean(0), atol=0.01)
    np.testing.assert_allclose(prior_var[0], marginal.var(0), rtol=0.05, atol=1e-3)


@pytest.mark.parametrize("name", ["bandit_template", "bandit_latent", "linear_bandit"])
def test_posterior_samples_follow_the_posterior(name: str) -> None:
    env = _env(name)
    a, n = env.num_actions, 20_000
    counts = np.tile(np.r_[3.0, 1.0, np.zeros(a - 2)], (n, 1))
    sums = np.tile(np.r_[1.5, 0.2, np.zeros(a - 2)], (n, 1))
    draws = StepDraws(_streams(n, seed=9), "test/sample")
    samples = env.posterior_sample(counts, sums, draws)
    mean, var = env.posterior_moments(counts[:1], sums[:1])
    np.testing.assert_allclose(samples.mean(0), mean[0], atol=0.015)
    np.testing.assert_allclose(samples.var(0), var[0], rtol=0.06, atol=5e-4)


def test_linear_posterior_recovers_theta() -> None:
    env = _env("linear_bandit")
    phi = env.arm_features()
    theta = np.array([[0.6, -0.4]])
    counts = np.full((1, 10), 200.0)
    sums = counts * (theta @ phi.T)  # noiseless sums: the posterior mean shrinks only a little
    mean, cov = env.theta_posterior(counts, sums)
    np.testing.assert_allclose(mean, theta, atol=0.01)
    assert np.all(np.linalg.eigvalsh(cov[0]) < 1e-3)


def test_region_goal_posterior_matches_rejection_sampling() -> None:
    env = _env("darkroom_region", 100)
    post = env.task_posterior(0.9)
    post.reset(1)
    visited = np.array([[7, 7], [8, 7], [8, 8], [2, 3]])
    for a, b in zip(visited[:-1], visited[1:], strict=True):
        post.observe(np.array([0]), np.array([0.0]), a[None], b[None])
    # rejection: goals from the prior that are none of the visited next cells
    prior = env.goal_prior()
    rng = np.random.default_rng(0)
    goals = rng.choice(100, size=200_000, p=prior)
    ruled_out = visited[1:, 0] * 10 + visited[1:, 1]
    kept = goals[~np.isin(goals, ruled_out)]
    freq = np.bincount(kept, minlength=100) / len(kept)
    np.testing.assert_allclose(post.weights[0], freq, atol=0.004)
    assert post.weights[0, ruled_out].sum() == 0
    # a rewarded arrival pins the goal: the values are then the goal's own Q*
    post.observe(np.array([0]), np.array([1.0]), np.array([[5, 5]]), np.array([[6, 5]]))
    mean, var = post.moments(np.array([[6, 3]]))
    np.testing.assert_allclose(var, 0.0, atol=1e-12)
    # from (6, 3) the goal (6, 5) is 2 steps away; +y brings it to 1
    np.testing.assert_allclose(mean[0], 0.9 ** np.array([3, 3, 1, 3, 2]) / 0.1)
    # the values table built once equals, bit for bit, the distances computed per state
    from spice_ray.envs.darkroom import all_cells, move

    cells = all_cells(10)
    nxt = move(cells[:, None, :], np.arange(5)[None, :], 10)  # (G, A, 2)
    dist = np.abs(nxt[:, :, None, :] - cells[None, None]).sum(-1)  # (G, A, G)
    np.testing.assert_array_equal(post._values(cells[::-1]), (0.9**dist / (1.0 - 0.9))[::-1])


def _run(env, tasks, spec: AgentSpec, horizon: int, seed: int = 0) -> np.ndarray:
    ids = np.arange(tasks.num_tasks)
    agent = make_agent(spec, env, tasks, None, EvalConfig(), sigma=0.3)
    run = run_online(agent, env, tasks, horizon, online_noise(seed, ids, horizon), 1,
                     agent_draws(seed, ids))
    return env.regret(tasks, run.states, run.actions, run.rewards, horizon).sum(1)


def test_oracle_rows_beat_the_flat_prior_and_ucb_on_the_template_bandit() -> None:
    env, horizon = _env("bandit_template", 100), 100
    tasks = BanditTasks(env.sample_means(_streams(200, split="eval")), 0.3)
    fusion = FusionConfig(kernel="uniform", target="reward", td_n=1, gamma=0.0, beta=2.0)
    regret = {m: _run(env, tasks, AgentSpec(m, fusion=fusion, prior=(0.46, 0.037)), horizon)
              for m in ("spice-flat", "spice-oracle", "bayes-ucb", "bayes-ts", "ucb")}
    for oracle in ("spice-oracle", "bayes-ucb"):
        diff = regret["spice-flat"] - regret[oracle]
        assert diff.mean() > 3 * diff.std(ddof=1) / np.sqrt(len(diff)), oracle
    assert regret["bayes-ts"].mean() < regret["ucb"].mean()
    # same seed, same actions
    again = _run(env, tasks, AgentSpec("bayes-ts", fusion=fusion), horizon)
    np.testing.assert_array_equal(again, regret["bayes-ts"])


@pytest.mark.parametrize("name", ["bandit_latent", "darkroom_region"])
def test_the_context_free_prior_is_the_posterior_before_any_context(name: str) -> None:
    """SPICE (context-free prior) reads the family's h = 0 marginal at the current state and
    nothing the rollout shows; the oracle's posterior moves with the same transitions."""
    from spice_ray.agents.priors import ContextFreePrior, ExactPrior

    env = _env(name, 30)
    B = 16
    free, oracle = ContextFreePrior(env.task_posterior(0.95)), ExactPrior(
        env.task_posterior(0.95))
    fresh = env.task_posterior(0.95)
    for p in (free, oracle, fresh):
        p.reset(B)
    rng = np.random.default_rng(0)
    states = (np.zeros((B, 1)) if env.stateless
              else rng.integers(0, 10, (B, env.state_dim)).astype(np.float64))
    before = fresh.moments(states)
    import torch

    for _ in range(12):
        actions = rng.integers(0, env.num_actions, B)
        rewards = rng.random(B)
        for p in (free, oracle):
            p.observe(*(torch.as_tensor(x) for x in (actions, rewards, states, states)))
    mean, sd = free.moments(None, torch.as_tensor(states), 12, (B, env.num_actions))
    np.testing.assert_array_equal(mean.numpy(), before[0])
    np.testing.assert_array_equal(sd.numpy(), np.sqrt(before[1]))
    moved = oracle.moments(None, torch.as_tensor(states), 12, (B, env.num_actions))[0]
    assert not np.allclose(moved.numpy(), before[0])


def test_the_context_free_prior_knows_the_population_on_the_template_bandit() -> None:
    """The template bandit's h = 0 marginal (arm 0 best in 78% of tasks) is most of what its
    oracle knows: the context-free row beats the flat prior by 3 paired SEMs."""
    env, horizon = _env("bandit_template", 100), 100
    tasks = BanditTasks(env.sample_means(_streams(200, split="eval")), 0.3)
    fusion = FusionConfig(kernel="uniform", target="reward", td_n=1, gamma=0.0, beta=2.0)
    regret = {m: _run(env, tasks, AgentSpec(m, fusion=fusion, prior=(0.46, 0.037)), horizon)
              for m in ("spice-flat", "spice-context-free")}
    diff = regret["spice-flat"] - regret["spice-context-free"]
    assert diff.mean() > 3 * diff.std(ddof=1) / np.sqrt(len(diff))


def test_linear_references_know_the_features() -> None:
    env, horizon = _env("linear_bandit", 60), 60
    tasks = BanditTasks(env.sample_means(_streams(200, split="eval")), 0.3)
    fusion = FusionConfig(kernel="uniform", target="reward", td_n=1, gamma=0.0, beta=2.0)
    ucb = _run(env, tasks, AgentSpec("ucb"), horizon).mean()
    for method in ("linucb", "lints", "bayes-ucb"):
        assert _run(env, tasks, AgentSpec(method, fusion=fusion), horizon).mean() < ucb / 2
    assert not AgentSpec("linucb").applies_to(_env("bandit_template"))


def test_nearest_unvisited_searcher_finds_goals() -> None:
    env, horizon = _env("darkroom_region", 100), 100
    tasks = env.sample_tasks(_streams(100, split="eval"), "eval")
    searcher = _run(env, tasks, AgentSpec("nearest"), horizon)
    random = _run(env, tasks, AgentSpec("random"), horizon)
    assert searcher.mean() < random.mean() - 20
    bayes = _run(env, tasks, AgentSpec("bayes-ucb", fusion=dataclasses.replace(
        FusionConfig(), beta=2.0, gamma=0.95)), horizon)
    assert bayes.mean() < searcher.mean()  # it knows where goals cluster


def _gap_rows(values: dict[str, np.ndarray], x: int = 100) -> pd.DataFrame:
    frames = []
    for method, v in values.items():
        frames.append(pd.DataFrame({
            "method": method, "variant": "", "metric": "cumulative_regret", "x": x,
            "config": '{"beta":2.0,"beta_schedule":"fixed"}', "seed": 0,
            "task_id": np.arange(len(v)), "value": v}))
    return pd.concat(frames, ignore_index=True)


def test_gap_closed_is_the_paired_ratio_with_an_interval() -> None:
    rng = np.random.default_rng(0)
    flat = 10 + rng.normal(0, 1, 400)
    oracle = flat - 4 + rng.normal(0, 0.5, 400)
    spice = flat - 1 + rng.normal(0, 0.5, 400)
    table = gap_closed(_gap_rows({FLAT: flat, ORACLE: oracle, LEARNED: spice}))
    (row,) = table.itertuples()
    expected = (flat - spice).mean() / (flat - oracle).mean()
    assert row.gap_closed == pytest.approx(expected) and 0.2 < expected < 0.3
    assert row.lo < expected < row.hi and row.hi - row.lo < 0.1
    assert row.n == 400 and row.beta == 2.0
    # seeded: the same rows give the same interval
    assert gap_closed(_gap_rows({FLAT: flat, ORACLE: oracle, LEARNED: spice})).equals(table)


def test_the_in_context_share_is_measured_from_the_context_free_row() -> None:
    """(context-free - SPICE) / (context-free - oracle), paired by task, beside gap closed;
    and in the tuned table's sentences."""
    from spice_ray.results.analysis import CONTEXT_FREE, tuned_comparison, tuned_gap

    rng = np.random.default_rng(1)
    flat = 10 + rng.normal(0, 1, 300)
    free = flat - 2 + rng.normal(0, 0.3, 300)
    oracle = flat - 4 + rng.normal(0, 0.3, 300)
    spice = flat - 3 + rng.normal(0, 0.3, 300)
    wide = pd.DataFrame({FLAT: flat, ORACLE: oracle, LEARNED: spice, CONTEXT_FREE: free})
    (row,) = tuned_gap(wide).itertuples()
    share = (free - spice).mean() / (free - oracle).mean()
    assert row.in_context_share == pytest.approx(share) and 0.4 < share < 0.6
    assert row.in_context_lo < share < row.in_context_hi and row.in_context_defined
    assert row.gap_closed == pytest.approx((flat - spice).mean() / (flat - oracle).mean())
    rows = _gap_rows({FLAT: flat, ORACLE: oracle, LEARNED: spice, CONTEXT_FREE: free})
    text = " ".join(tuned_comparison(rows.assign(rule="ucb")))
    assert "In-context share at the tuned settings" in text and f"{share:.2f}" in text
    # without the row: no share, no sentence
    (row,) = tuned_gap(wide.drop(columns=[CONTEXT_FREE])).itertuples()
    assert np.isnan(row.in_context_share) and not row.in_context_defined


def test_the_training_data_prior_is_the_empirical_bayes_estimate_per_arm() -> None:
    """``train.prior.arm_prior_from_sums``: arm a's mean is the average over tasks of its mean
    reward, its variance the spread of those means less sigma^2 E[1 / n] (the pooled
    within-task variance); sums over batches add; an arm pulled in fewer than 2 tasks is
    refused by name."""
    from spice_ray.train.prior import arm_moment_sums, arm_prior_from_sums

    actions = np.array([[0, 0, 1, 1], [0, 1, 1, 1], [0, 0, 0, 1]])
    rewards = np.array([[1.0, 3.0, 0.0, 0.0], [5.0, 1.0, 2.0, 3.0], [0.0, 1.0, 2.0, 4.0]])
    sums = arm_moment_sums(actions[:2], rewards[:2], 2) + arm_moment_sums(actions[2:],
                                                                         rewards[2:], 2)
    np.testing.assert_array_equal(sums, arm_moment_sums(actions, rewards, 2))
    means, var = arm_prior_from_sums(sums)
    # arm 0: task means 2, 5, 1; within-task squares 2 (task 0) + 2 (task 2) over 1 + 2 dof
    task_means = np.array([2.0, 5.0, 1.0])
    spread = task_means.var()  # over tasks, ddof 0
    noise = (2.0 + 2.0) / 3
    assert means[0] == pytest.approx(task_means.mean())
    assert var[0] == pytest.approx(spread - noise * np.mean([1 / 2, 1 / 1, 1 / 3]))
    # arm 1: task means 0, 2, 4; within 0 (task 0) + 2 (task 1) over 1 + 2 dof
    assert means[1] == pytest.approx(2.0)
    assert var[1] == pytest.approx(np.var([0.0, 2.0, 4.0]) - (2.0 / 3) * np.mean([1 / 2, 1 / 3, 1]))
    with pytest.raises(ValueError, match=r"arms \[1\] are pulled in fewer than 2 training"):
        arm_prior_from_sums(arm_moment_sums(np.array([[0, 0], [0, 1]]), rewards[:2, :2], 2))


def test_a_per_arm_flat_prior_gives_each_arm_its_own_moments_in_every_task() -> None:
    """SPICE (training-data prior): FlatPrior with a mean and a variance per arm; a scalar
    FlatPrior is unchanged (the same tensors as before per-arm priors existed)."""
    from spice_ray.agents.priors import FlatPrior

    mean, sd = FlatPrior((0.1, 0.7, 0.4), (0.04, 0.09, 0.01))._full((2, 3))
    np.testing.assert_array_equal(mean.numpy(), [[0.1, 0.7, 0.4]] * 2)
    np.testing.assert_allclose(sd.numpy(), [[0.2, 0.3, 0.1]] * 2)
    mean, sd = FlatPrior(0.5, 1 / 12)._full((2, 3))
    assert (mean == 0.5).all() and (sd == (1 / 12) ** 0.5).all()
    with pytest.raises(ValueError, match="a per-action prior of 3 actions for 5 actions"):
        FlatPrior((0.1, 0.7, 0.4), (0.04, 0.09, 0.01))._full((2, 5))
    spec = AgentSpec("spice-data-prior", prior=((0.1, 0.7, 0.4), (0.04, 0.09, 0.01)))
    assert spec.label == "SPICE (training-data prior)"
    assert spec.config_dict(EvalConfig())["prior_mean"] == (0.1, 0.7, 0.4)
