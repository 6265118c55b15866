"""Unit tests of spice_ray.fusion: kernels, weighted evidence, n-step targets, posterior, rules."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from spice_ray.common.rng import StepDraws, TaskStreams
from spice_ray.fusion import (
    NOISE_VAR_FLOOR,
    TAILS,
    RunningStats,
    argmax_lowest,
    beta_at,
    cosine_weights,
    gaussian_posterior,
    kernel_weights,
    nstep_targets,
    rbf_weights,
    sample_categorical,
    select_action,
    thompson_action,
    ucb_action,
    uniform_weights,
    weighted_action_stats,
)
from spice_ray.fusion.posterior import Posterior

finite = st.floats(-10.0, 10.0, allow_nan=False)
positive = st.floats(1e-3, 1e3, allow_nan=False)


# ---- kernels -----------------------------------------------------------------------------


def _features(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    query = torch.randn(3, 4, generator=g, dtype=torch.float64)  # (B, D)
    context = torch.randn(3, 7, 4, generator=g, dtype=torch.float64)  # (B, T, D)
    return query, context


@pytest.mark.parametrize("kind", ["uniform", "rbf", "cosine"])
def test_kernel_weights_in_unit_interval_and_masked(kind: str) -> None:
    query, context = _features()
    mask = torch.arange(7).expand(3, 7) < torch.tensor([[7], [3], [0]])  # prefixes 7, 3, 0
    w = kernel_weights(query, context, kind, tau=0.5)
    assert w.shape == (3, 7)
    assert bool(((w >= 0) & (w <= 1)).all())
    wm = kernel_weights(query, context, kind, tau=0.5, mask=mask)
    assert bool((wm[~mask] == 0).all())
    torch.testing.assert_close(wm[mask], w[mask])


def test_uniform_kernel_is_ones_and_broadcasts() -> None:
    query, context = _features()
    ones = torch.ones(3, 7, dtype=torch.float64)
    torch.testing.assert_close(uniform_weights(query, context), ones)
    # one query shared by a batch of contexts: [D] vs [B, T, D]
    assert uniform_weights(query[0], context).shape == (3, 7)


def test_rbf_kernel_values() -> None:
    query = torch.zeros(1, 2)
    context = torch.tensor([[[0.0, 0.0], [1.0, 0.0], [0.6, 0.8], [3.0, 4.0]]])  # distances 0,1,1,5
    w = rbf_weights(query, context, tau=0.5)
    expected = torch.tensor([[1.0, math.exp(-2.0), math.exp(-2.0), math.exp(-50.0)]])
    torch.testing.assert_close(w, expected)
    assert w[0, 0].item() == 1.0  # exactly one at distance 0
    with pytest.raises(ValueError):
        rbf_weights(query, context, tau=0.0)


def test_rbf_self_similarity_is_one_on_random_features() -> None:
    _, context = _features()
    w = rbf_weights(context[:, 2], context, tau=0.3)
    torch.testing.assert_close(w[:, 2], torch.ones(3, dtype=torch.float64))
    assert bool((w <= 1).all())


def test_cosine_kernel_values() -> None:
    query = torch.tensor([[1.0, 0.0]])
    context = torch.tensor([[[2.0, 0.0], [1.0, 1.0], [0.0, 3.0], [-1.0, 0.0], [0.0, 0.0]]])
    w = cosine_weights(query, context)
    # same direction 1, 45 degrees cos = 1/sqrt 2, orthogonal 0, opposite clamped to 0, zero 0
    expected = torch.tensor([[1.0, 1.0 / math.sqrt(2.0), 0.0, 0.0, 0.0]])
    torch.testing.assert_close(w, expected)


def test_unknown_kernel_raises() -> None:
    query, context = _features()
    with pytest.raises(ValueError, match="kernel"):
        kernel_weights(query, context, "laplace")  # type: ignore[arg-type]


# ---- weighted evidence -------------------------------------------------------------------


def _slow_stats(weights, actions, targets, num_actions):
    """Obvious loop over tasks and steps (float64 numpy)."""
    b, t = actions.shape
    counts = np.zeros((b, num_actions))
    sums = np.zeros((b, num_actions))
    for i in range(b):
        for j in range(t):
            counts[i, actions[i, j]] += weights[i, j]
            sums[i, actions[i, j]] += weights[i, j] * targets[i, j]
    return counts, sums / np.maximum(1.0, counts)


def test_weighted_action_stats_matches_slow_loop() -> None:
    rng = np.random.default_rng(0)
    weights = rng.uniform(size=(4, 9))
    actions = rng.integers(0, 3, size=(4, 9))
    targets = rng.normal(size=(4, 9))
    counts, mean = weighted_action_stats(torch.from_numpy(weights), torch.from_numpy(actions),
                                         torch.from_numpy(targets), 3)
    slow_counts, slow_mean = _slow_stats(weights, actions, targets, 3)
    np.testing.assert_allclose(counts.numpy(), slow_counts)
    np.testing.assert_allclose(mean.numpy(), slow_mean)


def test_weighted_action_stats_max_one_denominator_and_mask() -> None:
    actions = torch.tensor([[0, 0, 1, -1]])  # last position is padding
    targets = torch.tensor([[2.0, 4.0, 3.0, 100.0]], dtype=torch.float64)
    weights = torch.tensor([[0.25, 0.25, 1.0, 1.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True, True, False]])
    counts, mean = weighted_action_stats(weights, actions, targets, 3, mask=mask)
    torch.testing.assert_close(counts, torch.tensor([[0.5, 1.0, 0.0]], dtype=torch.float64))
    # arm 0: c = 0.5 < 1 so y~ = (0.25*2 + 0.25*4) / max(1, 0.5) = 1.5 (the paper's formula)
    torch.testing.assert_close(mean, torch.tensor([[1.5, 3.0, 0.0]], dtype=torch.float64))
    # uniform weights (None) = plain counts and sample means
    counts, mean = weighted_action_stats(None, actions[:, :3], targets[:, :3], 3)
    torch.testing.assert_close(counts, torch.tensor([[2.0, 1.0, 0.0]], dtype=torch.float64))
    torch.testing.assert_close(mean, torch.tensor([[3.0, 3.0, 0.0]], dtype=torch.float64))


def test_running_stats_equal_batch_computation_every_step() -> None:
    g = torch.Generator().manual_seed(1)
    actions = torch.randint(0, 4, (6, 30), generator=g)
    rewards = torch.randn(6, 30, generator=g, dtype=torch.float64)
    stats = RunningStats.zeros(6, 4)
    for t in range(30):
        stats.update(actions[:, t], rewards[:, t])
        counts, mean = weighted_action_stats(None, actions[:, : t + 1], rewards[:, : t + 1], 4)
        torch.testing.assert_close(stats.counts, counts)
        torch.testing.assert_close(stats.mean, mean)
    assert stats.num_updates == 30


def test_running_stats_with_fixed_weights_equal_batch() -> None:
    g = torch.Generator().manual_seed(2)
    actions = torch.randint(0, 3, (2, 5, 12), generator=g)  # leading dims (2, 5)
    rewards = torch.randn(2, 5, 12, generator=g, dtype=torch.float64)
    weights = torch.rand(2, 5, 12, generator=g, dtype=torch.float64)
    stats = RunningStats.zeros((2, 5), 3)
    for t in range(12):
        stats.update(actions[..., t], rewards[..., t], weights[..., t])
    counts, mean = weighted_action_stats(weights, actions, rewards, 3)
    torch.testing.assert_close(stats.counts, counts)
    torch.testing.assert_close(stats.mean, mean)


# ---- n-step targets ----------------------------------------------------------------------


def _slow_nstep(rewards, next_values, n, gamma, length, tail="truncate"):
    out = np.zeros_like(rewards)
    for t in range(length):
        y = sum(gamma**i * rewards[t + i] for i in range(n) if t + i < length)
        if t + n < length:  # 1-indexed t' = t + 1: bootstrap iff s_{t'+n} starts a transition
            y += gamma**n * next_values[t + n - 1]
        elif tail == "bootstrap" and gamma != 0:  # cut by the end: the last next state's value
            y += gamma ** (length - t) * next_values[length - 1]
        elif tail == "inside" and gamma != 0 and t < length - 1:  # stop before the last
            k = length - 1 - t  # transition; bootstrap from the state that starts it
            y = sum(gamma**i * rewards[t + i] for i in range(k)) \
                + gamma**k * next_values[length - 2]
        out[t] = y
    return out


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    n=st.integers(1, 6),
    gamma=st.floats(0.0, 1.0),
    num_steps=st.integers(1, 12),
    seed=st.integers(0, 2**31 - 1),
    tail=st.sampled_from(TAILS),
)
def test_nstep_targets_match_slow_loop(n: int, gamma: float, num_steps: int, seed: int,
                                       tail: str) -> None:
    rng = np.random.default_rng(seed)
    rewards = rng.normal(size=(3, num_steps))
    next_values = rng.normal(size=(3, num_steps))
    lengths = rng.integers(0, num_steps + 1, size=3)
    mask = np.arange(num_steps)[None, :] < lengths[:, None]
    got = nstep_targets(torch.from_numpy(rewards), torch.from_numpy(next_values), n, gamma,
                        mask=torch.from_numpy(mask), tail=tail).numpy()
    for b in range(3):
        expected = _slow_nstep(rewards[b], next_values[b], n, gamma, int(lengths[b]), tail)
        np.testing.assert_allclose(got[b], expected, rtol=1e-12, atol=1e-12)


def test_nstep_one_step_zero_gamma_is_reward() -> None:
    rewards = torch.randn(2, 5, dtype=torch.float64)
    next_values = torch.full((2, 5), float("nan"), dtype=torch.float64)  # never used
    torch.testing.assert_close(nstep_targets(rewards, torch.zeros_like(rewards), 1, 0.0), rewards)
    out = nstep_targets(rewards, next_values, 1, 0.0)
    assert not bool(torch.isnan(out).any())
    torch.testing.assert_close(out, rewards)
    with pytest.raises(ValueError):
        nstep_targets(rewards, rewards, 0, 0.9)


def test_nstep_known_values() -> None:
    rewards = torch.tensor([[1.0, 2.0, 3.0]], dtype=torch.float64)
    next_values = torch.tensor([[10.0, 20.0, 30.0]], dtype=torch.float64)
    out = nstep_targets(rewards, next_values, 2, 0.5)
    # t=1: 1 + .5*2 + .25*V(s_3)=20; t=2: s_4 is past the context (t+n > T), no bootstrap:
    # 2 + .5*3; t=3: truncated to 3 (the paper's indicator 1[t + n <= T]).
    torch.testing.assert_close(out, torch.tensor([[7.0, 3.5, 3.0]], dtype=torch.float64))
    # the cut windows bootstrapped from the last next state, V = 30: t=2 2 + .5*3 + .25*30,
    # t=3 3 + .5*30 (the complete window at t=1 unchanged)
    out = nstep_targets(rewards, next_values, 2, 0.5, tail="bootstrap")
    torch.testing.assert_close(out, torch.tensor([[7.0, 11.0, 18.0]], dtype=torch.float64))
    with pytest.raises(ValueError, match="tail='none' is invalid"):
        nstep_targets(rewards, next_values, 2, 0.5, tail="none")


# ---- posterior ---------------------------------------------------------------------------


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    prior_mean=finite,
    prior_var=positive,
    counts=st.floats(0.0, 1e3),
    weighted_mean=finite,
    noise_var=st.floats(0.0, 10.0),
    v_min=st.floats(0.0, 1.0),
)
def test_posterior_closed_form(prior_mean, prior_var, counts, weighted_mean, noise_var, v_min):
    post = gaussian_posterior(torch.tensor([prior_mean], dtype=torch.float64), prior_var,
                              torch.tensor([counts], dtype=torch.float64),
                              torch.tensor([weighted_mean], dtype=torch.float64), noise_var, v_min)
    # precision-weighted average form of the same posterior
    v_pri = max(prior_var, v_min)
    s2 = max(noise_var, NOISE_VAR_FLOOR)
    prior_prec, data_prec = 1.0 / v_pri, counts / s2
    expected_var = 1.0 / (prior_prec + data_prec)
    expected_mean = (prior_prec * prior_mean + data_prec * weighted_mean) / (prior_prec + data_prec)
    assert post.var.item() == pytest.approx(expected_var, rel=1e-9)
    assert post.mean.item() == pytest.approx(expected_mean, rel=1e-9, abs=1e-9)
    assert not bool(torch.isnan(post.mean).any() or torch.isnan(post.var).any())


@settings(max_examples=100, deadline=None, derandomize=True)
@given(
    prior_mean=finite,
    prior_var=positive,
    noise_var=st.floats(1e-2, 10.0),
    ys=st.lists(finite, min_size=1, max_size=20),
)
def test_sequential_updates_equal_batch_update(prior_mean, prior_var, noise_var, ys):
    # N one-observation updates, each posterior the next prior (v_min = 0: no re-flooring) ...
    mean = torch.tensor(prior_mean, dtype=torch.float64)
    var = torch.tensor(prior_var, dtype=torch.float64)
    one = torch.tensor(1.0, dtype=torch.float64)
    for y in ys:
        mean, var = gaussian_posterior(mean, var, one, torch.tensor(y, dtype=torch.float64),
                                       noise_var)
    # ... equal one update with c = N and the sample mean.
    batch = gaussian_posterior(prior_mean, prior_var, torch.tensor(float(len(ys)),
                               dtype=torch.float64), torch.tensor(np.mean(ys)), noise_var)
    assert var.item() == pytest.approx(batch.var.item(), rel=1e-9)
    assert mean.item() == pytest.approx(batch.mean.item(), rel=1e-7, abs=1e-9)


def test_zero_counts_return_prior_and_prior_var_floored() -> None:
    prior_mean = torch.tensor([[0.1, -2.0, 3.0]], dtype=torch.float64)
    prior_var = torch.tensor([[1e-4, 0.5, 2.0]], dtype=torch.float64)
    zeros = torch.zeros(1, 3, dtype=torch.float64)
    post = gaussian_posterior(prior_mean, prior_var, zeros, zeros, 0.09, v_min=1e-2)
    torch.testing.assert_close(post.mean, prior_mean)
    torch.testing.assert_close(post.var, torch.tensor([[1e-2, 0.5, 2.0]], dtype=torch.float64))


def test_zero_noise_var_gives_no_nan() -> None:
    counts = torch.tensor([[0.0, 1.0, 50.0]], dtype=torch.float64)
    ymean = torch.tensor([[0.0, 0.7, 0.2]], dtype=torch.float64)
    post = gaussian_posterior(0.5, 1.0 / 12.0, counts, ymean, 0.0)
    assert bool(torch.isfinite(post.mean).all() and torch.isfinite(post.var).all())
    assert post.var[0, 0].item() == pytest.approx(1.0 / 12.0)  # unseen arm keeps the prior
    assert post.mean[0, 1].item() == pytest.approx(0.7, abs=1e-4)  # sigma^2 ~ 0: trust the data
    gen = torch.Generator().manual_seed(0)
    actions = thompson_action(post.mean, post.var, gen)
    assert actions.shape == (1,) and 0 <= actions.item() < 3
    # float32 inputs too
    post32 = gaussian_posterior(0.5, 1.0 / 12.0, counts.float(), ymean.float(), 0.0)
    assert bool(torch.isfinite(post32.mean).all() and torch.isfinite(post32.var).all())


# ---- action rules ------------------------------------------------------------------------


def test_argmax_ties_go_to_lowest_index() -> None:
    scores = torch.tensor([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, 2.0], [-torch.inf] * 4])
    assert argmax_lowest(scores).tolist() == [1, 0, 0]


def test_beta_schedule() -> None:
    assert beta_at(0, 0.7, "fixed") == 0.7
    assert beta_at(0, schedule="sqrt2logt") == pytest.approx(math.sqrt(2 * math.log(2)))
    assert beta_at(1, schedule="sqrt2logt") == pytest.approx(math.sqrt(2 * math.log(2)))
    assert beta_at(9, schedule="sqrt2logt") == pytest.approx(math.sqrt(2 * math.log(10)))
    steps = torch.tensor([0, 9, 99])
    got = beta_at(steps, schedule="sqrt2logt")
    assert isinstance(got, torch.Tensor)
    expected = [math.sqrt(2 * math.log(t)) for t in (2, 10, 100)]
    np.testing.assert_allclose(got.double().numpy(), expected, rtol=1e-6)
    with pytest.raises(ValueError):
        beta_at(0, schedule="linear")  # type: ignore[arg-type]


def test_mdp_beta_schedule_is_c_sqrt_log_sat_with_the_environments_s_and_a() -> None:
    """The paper's MDP schedule beta_t = C sqrt(ln(S A t)), C = fusion.beta; S from the
    environment (darkroom: its 100 cells, also under the continuous darkroom's features)."""
    from spice_ray.agents import AgentSpec, make_agent
    from spice_ray.config import ConfigError, make_config

    with pytest.raises(ConfigError, match="fusion.beta_schedule='sqrt_log' is invalid: one of "
                       "fixed, sqrt2logt, sqrt_log_sat"):
        make_config("smoke", "darkroom", overrides=["fusion.beta_schedule=sqrt_log"])
    assert beta_at(0, 2.0, "sqrt_log_sat", 500) == pytest.approx(2 * math.sqrt(math.log(500)))
    assert beta_at(9, 0.5, "sqrt_log_sat", 5) == pytest.approx(0.5 * math.sqrt(math.log(50)))
    got = beta_at(torch.tensor([0, 99]), 1.0, "sqrt_log_sat", 500)
    np.testing.assert_allclose(got.double().numpy(), [math.sqrt(math.log(500)),
                                                      math.sqrt(math.log(50_000))], rtol=1e-6)
    with pytest.raises(ValueError, match="needs S x A >= 2; got pairs=1"):
        beta_at(0, 1.0, "sqrt_log_sat", 1)
    for env_name, states in (("darkroom", 100), ("darkroom_continuous", 100), ("bandit", 1)):
        cfg = make_config("smoke", env_name, overrides=["fusion.beta_schedule=sqrt_log_sat"])
        env = cfg.environment()
        agent = make_agent(AgentSpec("spice-flat", fusion=cfg.fusion), env)
        assert env.num_states == states and agent.num_states == states


def test_action_rules() -> None:
    mean = torch.tensor([[0.5, 0.4, 0.1], [0.2, 0.2, 0.0]], dtype=torch.float64)
    var = torch.tensor([[0.01, 0.04, 1.0], [0.01, 0.01, 0.01]], dtype=torch.float64)
    post = Posterior(mean, var)
    assert select_action(post, "greedy").tolist() == [0, 0]
    # beta = 1: scores [0.6, 0.6, 1.1] and [0.3, 0.3, 0.1]
    assert select_action(post, "ucb", 1.0).tolist() == [2, 0]
    # per-task beta [batch shape]: task 0 beta=0 -> greedy
    assert ucb_action(mean, var, torch.tensor([0.0, 1.0])).tolist() == [0, 0]
    a1 = select_action(post, "thompson", generator=torch.Generator().manual_seed(3))
    a2 = select_action(post, "thompson", generator=torch.Generator().manual_seed(3))
    assert torch.equal(a1, a2)
    with pytest.raises(ValueError):
        select_action(post, "thompson")


def test_thompson_frequencies_follow_posterior() -> None:
    # two arms N(0, 1) and N(1, 1): P(arm 1 wins) = Phi(1/sqrt(2)) ~ 0.760
    n = 20_000
    mean = torch.tensor([0.0, 1.0], dtype=torch.float64).expand(n, 2)
    var = torch.ones(n, 2, dtype=torch.float64)
    actions = thompson_action(mean, var, torch.Generator().manual_seed(0))
    assert actions.double().mean().item() == pytest.approx(0.760, abs=0.02)
    draws = StepDraws(TaskStreams.from_seed(0, "eval", np.arange(n)), "ts")
    actions = thompson_action(mean, var, draws)  # per-task draws: the same law
    assert actions.double().mean().item() == pytest.approx(0.760, abs=0.02)


def _draws(ids, seed: int = 4) -> StepDraws:
    return StepDraws(TaskStreams.from_seed(seed, "eval", np.asarray(ids)), "ctrl")


def test_step_draws_depend_on_task_and_request_only() -> None:
    whole, shard = _draws(np.arange(10)), _draws([7, 2])
    for _ in range(3):  # request by request, a shard's rows are the whole batch's rows
        full = whole.normal((4,))
        assert full.shape == (10, 4)
        np.testing.assert_array_equal(shard.normal((4,)), full[[7, 2]])
    probs = np.full((10, 3), 1 / 3)
    np.testing.assert_array_equal(shard.categorical(probs[:2]), whole.categorical(probs)[[7, 2]])
    fresh = _draws(np.arange(10))
    first, second = fresh.normal((4,)), fresh.normal((4,))
    assert not np.allclose(first, second)  # each request is new
    assert not np.allclose(_draws(np.arange(10), seed=5).normal((4,)), first)  # and seeded
    big = _draws(np.arange(50_000)).normal()
    assert abs(big.mean()) < 0.02 and big.std() == pytest.approx(1.0, abs=0.02)


def test_sample_categorical_frequencies_and_shard_independence() -> None:
    n = 40_000
    probs = torch.tensor([0.2, 0.0, 0.5, 0.3], dtype=torch.float64).expand(n, 4)
    picks = sample_categorical(probs, _draws(np.arange(n)))
    freq = torch.bincount(picks, minlength=4).double() / n
    torch.testing.assert_close(freq, probs[0], atol=0.01, rtol=0)
    assert freq[1] == 0  # a zero-probability action is never drawn
    both = sample_categorical(probs[:6], _draws(np.arange(6)))
    assert torch.equal(sample_categorical(probs[:2], _draws([4, 5])), both[4:])
    one_hot = torch.tensor([[0.0, 0.0, 0.0, 1.0]], dtype=torch.float64)
    assert sample_categorical(one_hot, _draws([0])).tolist() == [3]
    torch_picks = sample_categorical(probs[:1000], torch.Generator().manual_seed(0))
    assert torch_picks.shape == (1000,) and (torch_picks != 1).all()
    with pytest.raises(ValueError, match="StepDraws for 3 tasks"):
        sample_categorical(probs[:2], _draws([0, 1, 2]))
    with pytest.raises(ValueError, match="StepDraws for 3 tasks"):
        thompson_action(probs[:2], probs[:2], _draws([0, 1, 2]))


# ---- random tie-breaking -----------------------------------------------------------------


def test_argmax_ties_picks_each_tied_action_by_its_share_of_the_uniform() -> None:
    from spice_ray.fusion import argmax_ties

    scores = torch.tensor([[1.0, 3.0, 3.0, 0.0, 3.0]]).expand(6, 5)
    u = torch.tensor([0.0, 0.32, 0.34, 0.6, 0.67, 0.999])
    assert argmax_ties(scores, u).tolist() == [1, 1, 2, 2, 4, 4]  # thirds of [0, 1)
    assert argmax_ties(scores, None).tolist() == [1] * 6  # no draws: the lowest index
    unique = torch.tensor([[0.1, 0.5, 0.2]])
    assert argmax_ties(unique, torch.tensor([0.9])).tolist() == [1]  # no tie: the argmax
    batched = torch.zeros(2, 3, 4)  # any leading shape
    assert argmax_ties(batched, torch.full((2, 3), 0.99)).eq(3).all()


def test_random_ties_are_uniform_and_keyed_by_task_and_step() -> None:
    """A flat prior before any pull: every arm equally often over tasks; the same (task, step)
    draws whatever batch the task is in; a second run of the same tasks repeats them."""
    from spice_ray.evaluate import agent_draws
    from spice_ray.fusion import Posterior, select_action

    n, A = 4000, 5
    flat = Posterior(torch.full((n, A), 0.5, dtype=torch.float64),
                     torch.full((n, A), 1 / 12, dtype=torch.float64))
    ids = np.arange(n)
    first = select_action(flat, "ucb", 1.0, agent_draws(7, ids))
    counts = np.bincount(first.numpy(), minlength=A)
    assert abs(counts - n / A).max() < 4 * np.sqrt(n / A)  # ~uniform (binomial sd ~ 25)
    again = select_action(flat, "ucb", 1.0, agent_draws(7, ids))
    assert torch.equal(first, again)
    part = Posterior(flat.mean[100:200], flat.var[100:200])
    assert torch.equal(select_action(part, "ucb", 1.0, agent_draws(7, ids[100:200])),
                       first[100:200])
    draws = agent_draws(7, ids)
    select_action(flat, "ucb", 1.0, draws)
    second = select_action(flat, "greedy", 1.0, draws)  # the next step: fresh draws
    assert (second != first).float().mean() > 0.7


def test_a_new_action_rule_is_one_registration(monkeypatch) -> None:
    """A rule registered in ``spice_ray.fusion.rules`` is a valid ``fusion.rule`` at once and
    every fused agent acts by it (here a pessimistic rule: argmax m - beta sqrt(v))."""
    from spice_ray.agents import AgentSpec, make_agent
    from spice_ray.config import make_config
    from spice_ray.fusion import rules

    monkeypatch.setitem(rules.ACTION_RULES, "lcb", None)  # so "lcb" is removed after the test
    del rules.ACTION_RULES["lcb"]  # (the config holds this very dict)
    rules.register_rule("lcb", lambda post, beta, draws: rules.argmax_ties(
        post.mean - beta * post.var.sqrt(), rules.tie_draws(draws, post.mean)))
    with pytest.raises(ValueError, match="'lcb' is already registered"):
        rules.register_rule("lcb", lambda post, beta, draws: post.mean.argmax(-1))
    post = Posterior(torch.tensor([[1.0, 0.9]]), torch.tensor([[1.0, 0.01]]))
    assert select_action(post, "lcb", 1.0).tolist() == [1]  # ucb would take arm 0
    assert select_action(post, "ucb", 1.0).tolist() == [0]
    cfg = make_config("smoke", "bandit", overrides=["fusion.rule=lcb"])
    agent = make_agent(AgentSpec("spice-flat", fusion=cfg.fusion), cfg.environment())
    agent.reset(1, 5)
    assert agent.act(0, torch.zeros(1, 1)).shape == (1,)
    assert AgentSpec("spice-flat", fusion=cfg.fusion).rule() == "lcb"
