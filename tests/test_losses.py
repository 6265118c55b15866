"""SPICE / DPT losses against hand-computed values, and a short training run that learns."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from spice_ray.config import ModelConfig, TrainConfig, make_config
from spice_ray.model import SpiceModel, SpiceOutput, make_tokens
from spice_ray.model.tokens import Tokens
from spice_ray.train.losses import (
    advantage_weights,
    dpt_loss,
    epistemic_weights,
    importance_weights,
    policy_cross_entropy,
    policy_weights,
    spice_loss,
    weighted_policy_loss,
)
from spice_ray.train.value_losses import (
    average_shrink_loss,
    prefix_action_stats,
    shrink_loss,
    shrinkage_posterior_mean,
    td_loss,
    td_targets,
)

t = torch.tensor


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny ops: one thread is fastest


def test_importance_weights() -> None:
    probs = t([[0.1, 0.5, 0.4], [0.1, 0.5, 0.4], [0.0, 0.5, 0.5]])
    w = importance_weights(probs, t([0, 1, 0]), clip=10.0)
    torch.testing.assert_close(w, t([(1 / 3) / 0.1, (1 / 3) / 0.5, 10.0]))
    torch.testing.assert_close(importance_weights(probs, t([0, 1, 0]), clip=2.0),
                               t([2.0, (1 / 3) / 0.5, 2.0]))


def test_advantage_and_epistemic_weights() -> None:
    q_mean = t([[[1.0, 0.0, 2.0], [0.0, 0.0, 0.0]]])  # (B=1, P=2, A=3); mean 1 then 0
    # label 2: A = 1 then 0; tau = 0.5 -> exp(2) = 7.39 clipped to 5, then exp(0) = 1
    torch.testing.assert_close(advantage_weights(q_mean, t([2]), 0.5, 0.2, 5.0), t([[5.0, 1.0]]))
    # label 1: A = -1 -> exp(-2) = 0.135 floored to 0.2
    torch.testing.assert_close(advantage_weights(q_mean, t([1]), 0.5, 0.2, 5.0), t([[0.2, 1.0]]))
    torch.testing.assert_close(advantage_weights(q_mean, t([2]), 1.0, 0.0, 100.0),
                               t([[math.e, 1.0]]))
    q_std = t([[[0.5, 3.0, 0.0]]])  # (1, 1, 3)
    torch.testing.assert_close(epistemic_weights(q_std, t([0]), 2.0, 1e-3, 5.0), t([[2.0]]))
    torch.testing.assert_close(epistemic_weights(q_std, t([1]), 2.0, 1e-3, 5.0), t([[5.0]]))
    torch.testing.assert_close(epistemic_weights(q_std, t([2]), 2.0, 1e-3, 5.0), t([[1.0]]))


def test_policy_weights_switches_and_detach() -> None:
    q_mean = t([[[1.0, 0.0, 2.0]]], requires_grad=True)  # (1, 1, 3)
    q_std = t([[[0.5, 3.0, 0.0]]], requires_grad=True)
    probs, label = t([[0.1, 0.5, 0.4]]), t([0])
    cfg = TrainConfig(clip_iw=10.0, adv_temperature=1.0, adv_clip=10.0, epi_scale=2.0,
                      epi_clip=10.0, weight_floor=1e-3)
    iw, adv, epi = (1 / 3) / 0.1, math.exp(0.0), 1.0 + 2.0 * 0.5  # A(a*=0) = 1 - 1 = 0
    w = policy_weights(q_mean, q_std, probs, label, cfg)
    torch.testing.assert_close(w, t([[iw * adv * epi]]))
    assert not w.requires_grad
    off = dataclasses.replace(cfg, use_iw=False, use_adv=False, use_epi=False)
    torch.testing.assert_close(policy_weights(q_mean, q_std, probs, label, off), t([[1.0]]))
    only_epi = dataclasses.replace(cfg, use_iw=False, use_adv=False)
    torch.testing.assert_close(policy_weights(q_mean, q_std, probs, label, only_epi), t([[epi]]))
    live = dataclasses.replace(cfg, detach_weights=False)
    assert policy_weights(q_mean, q_std, probs, label, live).requires_grad


def test_weighted_policy_loss_by_hand() -> None:
    logits = t([[[0.0, 0.0], [math.log(3.0), 0.0]]])  # (B=1, P=2, A=2)
    ce = [math.log(2.0), math.log(4.0 / 3.0)]  # -log softmax at label 0
    torch.testing.assert_close(policy_cross_entropy(logits, t([0])), t([ce]))
    torch.testing.assert_close(weighted_policy_loss(logits, t([0])), t(sum(ce) / 2))
    torch.testing.assert_close(weighted_policy_loss(logits, t([0]), t([[2.0, 0.5]])),
                               t((2.0 * ce[0] + 0.5 * ce[1]) / 2))
    loss, parts = dpt_loss(logits, t([0]))
    torch.testing.assert_close(loss, t(sum(ce) / 2))
    torch.testing.assert_close(dpt_loss(logits, t([0]), train_query_position=False)[0], t(ce[1]))
    assert set(parts) == {"loss", "policy"}
    # the loss DPT models train with reads train.query_position
    from types import SimpleNamespace

    from spice_ray.train.losses import loss_for
    for on in (True, False):
        got = loss_for("dpt")(SimpleNamespace(logits=logits), SimpleNamespace(label=t([0])),
                              None, None, TrainConfig(query_position=on))[0]
        torch.testing.assert_close(got, t(sum(ce) / 2 if on else ce[1]))


R = t([[1.0, 2.0, 3.0, 4.0]])  # (B=1, T=4): r_1..r_4
V = t([[10.0, 20.0, 30.0, 40.0]])  # V(s_{t+1}) for t = 1..4


@pytest.mark.parametrize(
    ("n", "gamma", "expected"),
    [
        (1, 0.0, [1.0, 2.0, 3.0, 4.0]),  # bandits: y_t = r_t
        (1, 0.5, [1 + 0.5 * 10, 2 + 0.5 * 20, 3 + 0.5 * 30, 4.0]),  # no s_5 to bootstrap from
        # y_t = r_t + g r_{t+1} + g^2 V(s_{t+2}) if t + 2 <= 4
        (2, 0.5, [1 + 1 + 0.25 * 20, 2 + 1.5 + 0.25 * 30, 3 + 2.0, 4.0]),
        # y_1 = 1 + .5*2 + .25*3 + .125 V(s_4); later ones truncated at the context end
        (3, 0.5, [1 + 1 + 0.75 + 0.125 * 30, 2 + 1.5 + 1.0, 3 + 2.0, 4.0]),
        (5, 0.5, [1 + 1 + 0.75 + 0.5, 2 + 1.5 + 1.0, 3 + 2.0, 4.0]),  # n > T: rewards only
    ],
)
def test_td_targets_by_hand(n: int, gamma: float, expected: list[float]) -> None:
    torch.testing.assert_close(td_targets(R, V, n, gamma), t([expected]))


@pytest.mark.parametrize(
    ("n", "expected"),
    [
        # a window cut by the end bootstraps from V(s_5) = 40 after the rewards it has left
        (1, [1 + 0.5 * 10, 2 + 0.5 * 20, 3 + 0.5 * 30, 4 + 0.5 * 40]),
        (2, [1 + 1 + 0.25 * 20, 2 + 1.5 + 0.25 * 30, 3 + 2.0 + 0.25 * 40, 4 + 0.5 * 40]),
        (5, [1 + 1 + 0.75 + 0.5 + 0.0625 * 40, 2 + 1.5 + 1.0 + 0.125 * 40,
             3 + 2.0 + 0.25 * 40, 4 + 0.5 * 40]),
    ],
)
def test_td_targets_with_a_bootstrapped_tail_by_hand(n: int, expected: list[float]) -> None:
    torch.testing.assert_close(td_targets(R, V, n, 0.5, "bootstrap"), t([expected]))


@pytest.mark.parametrize(
    ("n", "expected"),
    [
        (1, [1 + 0.5 * 10, 2 + 0.5 * 20, 3 + 0.5 * 30, 4.0]),  # n = 1: the paper's
        # a cut window stops before the last transition and bootstraps from V(s_4) = 30 (the
        # state that starts it, read at a position a loss trains); the last keeps r_4 alone
        (2, [1 + 1 + 0.25 * 20, 2 + 1.5 + 0.25 * 30, 3 + 0.5 * 30, 4.0]),
        (5, [1 + 1 + 0.75 + 0.125 * 30, 2 + 1.5 + 0.25 * 30, 3 + 0.5 * 30, 4.0]),
    ],
)
def test_td_targets_with_the_tail_bootstrapped_inside_by_hand(n: int, expected: list[float]
                                                              ) -> None:
    torch.testing.assert_close(td_targets(R, V, n, 0.5, "inside"), t([expected]))
    # never reads V(s_5), the value no loss trains
    assert torch.equal(td_targets(R, V, n, 0.5, "inside"),
                       td_targets(R, t([[10.0, 20.0, 30.0, float("nan")]]), n, 0.5, "inside"))


def test_train_tail_moves_the_value_loss_and_not_a_default_configs_identity() -> None:
    from spice_ray.config.sections import without_later_defaults

    g = torch.Generator().manual_seed(1)
    B, T, K, A = 2, 4, 3, 2
    q, logits = torch.randn(B, T + 1, K, A, generator=g), torch.randn(B, T + 1, A, generator=g)
    tokens = Tokens(query_state=torch.zeros(B, 1), states=torch.zeros(B, T, 1),
                    actions=t([[0, 1, 1, 0], [1, 1, 0, 0]]),
                    rewards=t([[1.0, 0.0, 0.5, 1.0], [0.2, 0.3, 0.9, 0.0]]),
                    next_states=torch.zeros(B, T, 1), label=t([1, 0]),
                    behaviour_probs=t([[0.5, 0.5], [0.8, 0.2]]))
    paper = TrainConfig(gamma=0.5, td_n=2)
    departed = dataclasses.replace(paper, tail="bootstrap")
    qbar = q.mean(-2)  # (B, T+1, A): transition t's values at position t-1, V(s_{t+1}) at t
    y = td_targets(tokens.rewards, qbar[:, 1:].amax(-1), 2, 0.5, "bootstrap")
    _, parts = spice_loss(fake_output(q, logits), tokens, departed, anchor=t(0.0))
    torch.testing.assert_close(parts["td"], td_loss(qbar[:, :-1], tokens.actions, y))
    _, paper_parts = spice_loss(fake_output(q, logits), tokens, paper, anchor=t(0.0))
    assert paper_parts["td"] != parts["td"] and paper_parts["policy"] == parts["policy"]
    # a field added later: checkpoints trained before it stay current at its default
    assert "tail" not in without_later_defaults("train", dataclasses.asdict(paper))
    assert without_later_defaults("train", dataclasses.asdict(departed))["tail"] == "bootstrap"
    with pytest.raises(ValueError, match="train.tail"):
        TrainConfig(tail="cut")


def naive_td_targets(r: list[float], v: list[float], n: int, gamma: float) -> list[float]:
    """The paper's formula, one t at a time (1-indexed t, v[t-1] = V(s_{t+1}))."""
    T = len(r)
    out = []
    for t_ in range(1, T + 1):
        y = sum(gamma**i * r[t_ + i - 1] for i in range(n) if t_ + i <= T)
        if t_ + n <= T:
            y += gamma**n * v[t_ + n - 2]
        out.append(y)
    return out


@settings(max_examples=30, deadline=None)
@given(T=st.integers(1, 7), n=st.integers(1, 9), gamma=st.floats(0.0, 1.0), seed=st.integers(0, 99))
def test_td_targets_match_naive_formula(T: int, n: int, gamma: float, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    r, v = torch.randn(1, T, generator=g, dtype=torch.float64), torch.randn(1, T, generator=g,
                                                                           dtype=torch.float64)
    expected = naive_td_targets(r[0].tolist(), v[0].tolist(), n, gamma)
    torch.testing.assert_close(td_targets(r, v, n, gamma)[0], t(expected, dtype=torch.float64))


@settings(max_examples=30, deadline=None)
@given(T=st.integers(1, 7), n=st.integers(1, 4), seed=st.integers(0, 99))
def test_prefix_stats_match_naive_counts(T: int, n: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    actions = torch.randint(0, 3, (1, T), generator=g)
    y = torch.randn(1, T, generator=g, dtype=torch.float64)
    counts, ybar = prefix_action_stats(actions, y, 3, n)
    for p in range(T + 1):  # position p counts transition t iff t + n - 1 <= p
        for a in range(3):
            seen = [y[0, i].item() for i in range(T) if (i + 1) + n - 1 <= p and actions[0, i] == a]
            assert counts[0, p, a].item() == len(seen)
            assert ybar[0, p, a].item() == pytest.approx(sum(seen) / max(1, len(seen)))


def test_td_targets_are_detached_and_td_loss_by_hand() -> None:
    v = V.clone().requires_grad_(True)
    assert not td_targets(R, v, 1, 0.9).requires_grad
    q_pred = t([[[0.0, 1.0], [2.0, 5.0], [1.0, 1.0]]])  # (B=1, T=3, A=2)
    actions, y = t([[1, 0, 1]]), t([[0.0, 1.0, 3.0]])
    # taken: 1, 2, 1 -> errors 1, 1, -2 -> mean of squares 2
    torch.testing.assert_close(td_loss(q_pred, actions, y), t(2.0))


def test_prefix_action_stats_only_use_the_seen_prefix() -> None:
    actions, y = t([[0, 1, 0]]), t([[1.0, 0.5, 0.0]])
    counts, ybar = prefix_action_stats(actions, y, 2, n=1)  # position p saw transitions 1..p
    torch.testing.assert_close(counts, t([[[0.0, 0], [1, 0], [1, 1], [2, 1]]]))
    torch.testing.assert_close(ybar, t([[[0.0, 0], [1, 0], [1, 0.5], [0.5, 0.5]]]))
    counts2, ybar2 = prefix_action_stats(actions, y, 2, n=2)  # target t needs r_{t+1} too
    torch.testing.assert_close(counts2, t([[[0.0, 0], [0, 0], [1, 0], [1, 1]]]))
    torch.testing.assert_close(ybar2, t([[[0.0, 0], [0, 0], [1, 0], [1, 0.5]]]))


def test_shrink_loss_by_hand() -> None:
    # mu0 = 0.5, v0 = sigma^2 = 0.25 -> w(c) = 1 / (1 + c)
    torch.testing.assert_close(
        shrinkage_posterior_mean(t([0.0, 1.0, 2.0]), t([0.0, 1.0, 0.5]), 0.5, 0.25, 0.25),
        t([0.5, 0.5 * 0.5 + 0.5 * 1.0, 0.5 / 3 + 2 * 0.5 / 3]))
    actions, y = t([[0, 1, 0]]), t([[1.0, 0.5, 0.0]])
    q_mean = t([[[0.0, 0.0], [1.0, 1.0], [0.25, 1.5], [0.5, 0.0]]], requires_grad=True)
    # targets m^(p): p1: a0 0.75; p2: a0 0.75, a1 0.5; p3: a0 0.5, a1 0.5 (p0: no evidence)
    p1 = (1.0 - 0.75) ** 2
    p2 = ((0.25 - 0.75) ** 2 + (1.5 - 0.5) ** 2) / 2
    p3 = ((0.5 - 0.5) ** 2 + (0.0 - 0.5) ** 2) / 2
    loss = shrink_loss(q_mean, actions, y, 1, 0.5, 0.25, 0.25)
    torch.testing.assert_close(loss, t((p1 + p2 + p3) / 3))
    loss.backward()
    assert q_mean.grad[0, 0].abs().sum() == 0 and q_mean.grad[0, 1, 1] == 0  # unseen: no pull


def test_average_shrink_loss_pulls_only_the_average_over_states() -> None:
    """The paper's form: per action, the mean of Qbar over the context's states against m_a
    of the whole context; states whose values differ but average to m_a feel no pull."""
    actions, y = t([[0, 1, 0]]), t([[1.0, 0.5, 0.0]])
    # whole context, mu0 = 0.5, v0 = sigma^2 = 0.25: a0 c 2, ybar 0.5 -> m 0.5; a1 c 1,
    # ybar 0.5 -> m 0.5
    q_pred = t([[[0.0, 0.0], [1.0, 1.0], [0.5, 2.0]]], requires_grad=True)  # a0 mean 0.5, a1 1
    loss = average_shrink_loss(q_pred, actions, y, 1, 0.5, 0.25, 0.25)
    torch.testing.assert_close(loss, t(((0.5 - 0.5) ** 2 + (1.0 - 0.5) ** 2) / 2))
    loss.backward()
    assert q_pred.grad[..., 0].abs().sum() == 0  # a0's states differ, its average is m_0
    torch.testing.assert_close(q_pred.grad[0, :, 1], t([1 / 6] * 3))  # 2 (1 - 0.5) / 3 / 2
    # an action the context never took is not pulled; a context of one action alone
    only0 = average_shrink_loss(q_pred.detach(), t([[0, 0, 0]]), y, 1, 0.5, 0.25, 0.25)
    m0 = 0.5 * (1 / 4) + 0.5 * (3 / 4)  # c 3, ybar 0.5: w = 0.25 / (0.25 + 0.75)
    torch.testing.assert_close(only0, t((0.5 - m0) ** 2))


def fake_output(q: torch.Tensor, logits: torch.Tensor) -> SpiceOutput:
    return SpiceOutput(logits=logits, q=q, prior_mean=q.mean(-2), prior_std=q.std(-2),
                       latent=torch.zeros(*q.shape[:2], 1))


def test_spice_loss_combines_components_by_hand() -> None:
    g = torch.Generator().manual_seed(0)
    B, T, K, A = 2, 3, 3, 2
    q = torch.randn(B, T + 1, K, A, generator=g)
    logits = torch.randn(B, T + 1, A, generator=g)
    tokens = Tokens(query_state=torch.zeros(B, 1), states=torch.zeros(B, T, 1),
                    actions=t([[0, 1, 1], [1, 1, 0]]),
                    rewards=t([[1.0, 0.0, 0.5], [0.2, 0.3, 0.9]]),
                    next_states=torch.zeros(B, T, 1), label=t([1, 0]),
                    behaviour_probs=t([[0.5, 0.5], [0.8, 0.2]]))
    cfg = TrainConfig(lambda_q=0.7, lambda_anchor=0.1, gamma=0.0, td_n=1)
    out = fake_output(q, logits)
    loss, parts = spice_loss(out, tokens, cfg, anchor=t(2.0))
    # bandit TD: y = r, prediction for transition t at position t-1
    qbar = q.mean(-2)  # (B, T+1, A)
    td = np.mean([(qbar[b, i, tokens.actions[b, i]] - tokens.rewards[b, i]).item() ** 2
                  for b in range(B) for i in range(T)])
    torch.testing.assert_close(parts["td"], t(td, dtype=torch.float32))
    shrink = shrink_loss(qbar, tokens.actions, tokens.rewards, 1, cfg.shrink_prior_mean,
                         cfg.shrink_prior_var, cfg.shrink_noise_var)
    torch.testing.assert_close(parts["shrink"], shrink)
    w = policy_weights(qbar, q.std(-2), tokens.behaviour_probs, tokens.label, cfg)
    torch.testing.assert_close(parts["policy"], weighted_policy_loss(logits, tokens.label, w))
    torch.testing.assert_close(loss, parts["policy"] + 0.7 * (parts["td"] + parts["shrink"])
                               + 0.1 * 2.0)
    assert parts["anchor"] == 2.0 and not any(v.requires_grad for v in parts.values())
    # the paper's form of the shrinkage, on the transitions' leakage-free Qbar
    _, avg = spice_loss(out, tokens, dataclasses.replace(cfg, shrink_form="average"), t(2.0))
    torch.testing.assert_close(avg["shrink"], average_shrink_loss(
        qbar[:, :-1], tokens.actions, tokens.rewards, 1, cfg.shrink_prior_mean,
        cfg.shrink_prior_var, cfg.shrink_noise_var))
    assert avg["shrink"] != parts["shrink"] and avg["td"] == parts["td"]
    # the policy loss over positions 1..T only, as the DPT reference code trains: the query
    # alone (position 0) then moves nothing, and the value terms are as before
    off = dataclasses.replace(cfg, query_position=False)
    moved = fake_output(q, torch.cat([logits[:, :1] + 5.0, logits[:, 1:]], 1))
    for o in (out, moved):
        _, drop = spice_loss(o, tokens, off, anchor=t(2.0))
        torch.testing.assert_close(drop["policy"], weighted_policy_loss(
            logits[:, 1:], tokens.label, w[:, 1:]))
        assert drop["td"] == parts["td"] and drop["shrink"] == parts["shrink"]


def test_detach_weights_stops_policy_gradient_into_values() -> None:
    g = torch.Generator().manual_seed(1)
    q = torch.randn(1, 3, 3, 2, generator=g, requires_grad=True)
    logits = torch.randn(1, 3, 2, generator=g)
    tokens = Tokens(query_state=torch.zeros(1, 1), states=torch.zeros(1, 2, 1),
                    actions=t([[0, 1]]), rewards=t([[1.0, 0.0]]), next_states=torch.zeros(1, 2, 1),
                    label=t([1]), behaviour_probs=t([[0.5, 0.5]]))
    for detach, expect_grad in ((True, False), (False, True)):
        cfg = TrainConfig(lambda_q=0.0, detach_weights=detach)
        q.grad = None
        spice_loss(fake_output(q, logits), tokens, cfg, anchor=t(0.0))[0].backward()
        assert (q.grad is not None and bool(q.grad.any())) == expect_grad


def test_short_training_reduces_td_and_policy_losses() -> None:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    B, T, A = 32, 10, 3
    rng = np.random.default_rng(0)
    means = rng.random((B, A)).astype(np.float32)
    actions = rng.integers(0, A, (B, T))
    batch = {
        "actions": actions.astype(np.uint8),
        "rewards": (np.take_along_axis(means, actions, 1)
                    + 0.1 * rng.standard_normal((B, T))).astype(np.float32),
        "behaviour_probs": np.full((B, A), 1.0 / A, np.float32),
        "label": means.argmax(1).astype(np.uint8),
    }
    tokens = make_tokens(batch, make_config("smoke", "bandit", overrides=[f"env.num_arms={A}"]).env)
    cfg = TrainConfig(lr=5e-3)
    model = SpiceModel(ModelConfig(n_layer=1, n_embd=16, n_head=1, ensemble_size=3,
                                   head_hidden=16), A, 1, T + 1, generator=g)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)

    def losses() -> tuple[float, float]:
        with torch.no_grad():
            _, parts = spice_loss(model(tokens), tokens, cfg, model.anchor_loss())
            ce = policy_cross_entropy(model(tokens).logits, tokens.label).mean()
        return parts["td"].item(), ce.item()

    td0, ce0 = losses()
    for _ in range(100):
        loss, _ = spice_loss(model(tokens), tokens, cfg, model.anchor_loss())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    td1, ce1 = losses()
    assert td1 < 0.5 * td0, (td0, td1)
    assert ce1 < 0.8 * ce0, (ce0, ce1)


def test_state_h0_prior_trains_position_0_on_the_first_state_not_the_drawn_query() -> None:
    """train.h0_prior="state": transition 1's value is regressed from a query token holding
    s_1 (the h = 0 prior an agent in s_1 reads), not from the darkroom's independently drawn
    query; positions 1..T and the policy logits are unchanged, and on a stateless bandit (query
    and s_1 both the zero state) the loss is the paper's."""
    from spice_ray.data.tasks import generate_tasks
    from spice_ray.train.losses import loss_for

    cfg = make_config("smoke", "darkroom_region")
    batch = generate_tasks(cfg.env, cfg.data, "train", np.arange(6))
    tokens = make_tokens(batch, cfg.env)
    assert not torch.equal(tokens.query_state, tokens.states[:, 0])  # drawn independently
    g = torch.Generator().manual_seed(0)
    model = SpiceModel(ModelConfig(n_layer=2, n_embd=16, ensemble_size=3, head_hidden=16,
                                   var_head=True), cfg.env.num_actions, cfg.env.state_dim,
                       tokens.context_len + 1, generator=g)
    out = model(tokens)
    swapped = model.with_state_values(out, tokens.states[:, 0])
    own = model(dataclasses.replace(tokens, query_state=tokens.states[:, 0]))  # query = s_1
    for name in ("q", "prior_mean", "prior_std", "pred_var"):
        new, old, want = (getattr(o, name) for o in (swapped, out, own))
        torch.testing.assert_close(new[:, 0], want[:, 0], rtol=1e-5, atol=1e-6)
        assert torch.equal(new[:, 1:], old[:, 1:]) and not torch.allclose(new[:, 0], old[:, 0])
    assert torch.equal(swapped.logits, out.logits)
    ids = torch.arange(6)
    paper = TrainConfig(td_n=5, gamma=0.95)
    state = dataclasses.replace(paper, h0_prior="state")
    l_paper, _ = loss_for("spice")(out, tokens, model, ids, paper)
    l_state, _ = loss_for("spice")(out, tokens, model, ids, state)
    l_own, _ = loss_for("spice")(swapped, tokens, model, ids, paper)
    assert l_state.item() == l_own.item() != l_paper.item()
    with pytest.raises(ValueError, match="train.h0_prior"):
        TrainConfig(h0_prior="query")
    bandit = make_config("smoke", "bandit")
    b_tokens = make_tokens(generate_tasks(bandit.env, bandit.data, "train", np.arange(4)),
                           bandit.env)
    b_model = SpiceModel(ModelConfig(n_layer=1, n_embd=16, ensemble_size=3, head_hidden=16),
                         bandit.env.num_actions, 1, b_tokens.context_len + 1, generator=g)
    b_out = b_model(b_tokens)
    ids = torch.arange(4)
    torch.testing.assert_close(loss_for("spice")(b_out, b_tokens, b_model, ids, state)[0],
                               loss_for("spice")(b_out, b_tokens, b_model, ids, paper)[0])


def test_mean_value_targets_regress_each_pulled_arm_on_its_expected_reward() -> None:
    """train.value_target="mean" (a diagnosis): the TD loss is the mean over (b, t) of
    (Q-bar_{t-1}(a_t) - mu_{a_t})^2, by hand from the model's outputs, which the forward
    computed from the sampled rewards (the same outputs either way); a darkroom refuses it,
    naming the field."""
    from spice_ray.config import ConfigError
    from spice_ray.data.tasks import generate_tasks
    from spice_ray.model.spice import align_to_transitions
    from spice_ray.train.loop import compute_loss

    cfg = make_config("smoke", "bandit_latent", overrides=["train.value_target=mean"])
    batch = generate_tasks(cfg.env, cfg.data, "train", np.arange(5))
    model = SpiceModel(ModelConfig(n_layer=1, n_embd=16, ensemble_size=3, head_hidden=8),
                       cfg.env.num_actions, 1, cfg.env.horizon + 1,
                       generator=torch.Generator().manual_seed(0))
    cpu = torch.device("cpu")
    _, parts = compute_loss(model, batch, "spice", cfg, cpu)
    q_pred, _ = align_to_transitions(model(make_tokens(batch, cfg.env)).prior_mean.double())
    actions = torch.as_tensor(batch["actions"], dtype=torch.long)
    mu = torch.as_tensor(np.take_along_axis(batch["means"], batch["actions"], 1))
    by_hand = ((q_pred.gather(2, actions[..., None])[..., 0] - mu) ** 2).mean()
    torch.testing.assert_close(parts["td"].double(), by_hand, rtol=1e-5, atol=1e-7)
    paper = make_config("smoke", "bandit_latent")
    _, paper_parts = compute_loss(model, batch, "spice", paper, cpu)
    assert paper_parts["td"].item() != parts["td"].item()
    assert paper_parts["policy"].item() == parts["policy"].item()
    with pytest.raises(ConfigError, match="train.value_target"):
        make_config("smoke", "darkroom", overrides=["train.value_target=mean"])
    with pytest.raises(ValueError, match="train.value_target"):
        TrainConfig(value_target="means")
