"""The label-free width scale: the kernel against closed forms and brute force, the model-level
fit against the kernel on hand-built tensors, and s = 1 leaving every fused output unchanged."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
import torch

from spice_ray.agents import AgentSpec
from spice_ray.agents.spice import SpiceAgent
from spice_ray.config import EvalConfig, FusionConfig, make_config
from spice_ray.evaluate.offline import sequence_outputs
from spice_ray.evaluate.width import fit_model_width, transition_predictions
from spice_ray.fusion import (
    NOISE_VAR_FLOOR,
    bootstrap_values,
    fit_width_and_noise,
    fit_width_decay,
    fit_width_scale,
    nstep_targets,
    scaled_prior_std,
    width_log_likelihood,
    width_profile,
)
from spice_ray.fusion.width import DECAYS
from spice_ray.model.registry import build_model, torch_threads
from spice_ray.model.tokens import make_tokens


def _t(x: np.ndarray) -> torch.Tensor:
    return torch.as_tensor(x, dtype=torch.float64)


def _log_lik_numpy(m, sd, y, noise_var, s) -> float:
    """The obvious sum of log N(y; m, s^2 sd^2 + sigma^2)."""
    w = s * s * sd**2 + noise_var
    return float(np.sum(-0.5 * (np.log(2 * np.pi * w) + (y - m) ** 2 / w)))


# ---- the kernel ------------------------------------------------------------------------------


@pytest.mark.parametrize("v,noise_var,spread", [(0.3, 0.09, 1.0), (0.05, 0.01, 0.4),
                                                (2.0, 0.25, 3.0)])
def test_constant_std_matches_the_closed_form(v, noise_var, spread) -> None:
    rng = np.random.default_rng(0)
    m = rng.normal(size=500)
    y = m + spread * rng.normal(size=500)
    got = fit_width_scale(_t(m), torch.full((500,), v, dtype=torch.float64), _t(y), noise_var)
    u = max(0.0, float(np.mean((y - m) ** 2)) - noise_var) / v**2
    assert u > 0
    assert got == pytest.approx(math.sqrt(u), rel=1e-6)


def test_heteroscedastic_fit_agrees_with_a_dense_grid() -> None:
    rng = np.random.default_rng(1)
    n = 2000
    m = rng.normal(size=n)
    sd = rng.uniform(0.05, 1.0, size=n)
    y = m + np.sqrt((0.7 * sd) ** 2 + 0.04) * rng.standard_t(5, size=n)
    grid = np.exp(np.linspace(np.log(1e-2), np.log(1e2), 20001))  # resolution ~ 0.05%
    ll = np.array([_log_lik_numpy(m, sd, y, 0.04, s) for s in grid])
    best = grid[int(np.argmax(ll))]
    got = fit_width_scale(_t(m), _t(sd), _t(y), 0.04)
    step = grid[1] / grid[0]
    assert best / step <= got <= best * step
    assert _log_lik_numpy(m, sd, y, 0.04, got) >= ll.max() - 1e-9


@pytest.mark.parametrize("s", [0.3, 2.0])
def test_simulated_data_recover_the_scale(s) -> None:
    rng = np.random.default_rng(2)
    n = 200_000
    m = rng.uniform(0, 1, size=n)
    sd = rng.uniform(0.1, 0.5, size=n)
    y = m + np.sqrt((s * sd) ** 2 + 0.01) * rng.normal(size=n)
    got = fit_width_scale(_t(m), _t(sd), _t(y), 0.01)
    assert got == pytest.approx(s, rel=0.02)


def test_the_mask_selects_targets_and_float32_inputs_are_read_in_float64() -> None:
    rng = np.random.default_rng(3)
    m, sd = rng.normal(size=(4, 50)), rng.uniform(0.1, 1.0, size=(4, 50))
    y = m + 0.8 * rng.normal(size=(4, 50))
    mask = rng.uniform(size=(4, 50)) < 0.6
    y_padded = np.where(mask, y, np.nan)  # masked-out entries may hold anything
    got = fit_width_scale(_t(m), _t(sd), _t(y_padded), 0.09, mask=torch.as_tensor(mask))
    assert got == fit_width_scale(_t(m[mask]), _t(sd[mask]), _t(y[mask]), 0.09)
    as32 = fit_width_scale(*(torch.as_tensor(x, dtype=torch.float32) for x in (m, sd, y)), 0.09)
    assert as32 == fit_width_scale(*(_t(np.float32(x)) for x in (m, sd, y)), 0.09)


def test_the_likelihood_is_the_obvious_mean() -> None:
    rng = np.random.default_rng(4)
    m, sd = rng.normal(size=30), rng.uniform(0.1, 1.0, size=30)
    y = m + rng.normal(size=30)
    for s in (0.0, 0.5, 1.0, 3.0):
        got = width_log_likelihood(_t(m), _t(sd), _t(y), 0.09, s)
        assert got == pytest.approx(_log_lik_numpy(m, sd, y, 0.09, s) / 30, rel=1e-12)
    # noise_var = 0 is floored like the posterior's
    assert width_log_likelihood(_t(m), _t(sd), _t(y), 0.0, 0.5) == pytest.approx(
        _log_lik_numpy(m, sd, y, NOISE_VAR_FLOOR, 0.5) / 30, rel=1e-12)


def test_residuals_within_the_noise_give_zero() -> None:
    rng = np.random.default_rng(5)
    m = rng.normal(size=1000)
    y = m + 0.2 * rng.normal(size=1000)  # mean (y - m)^2 ~ 0.04 < sigma^2
    sd = torch.full((1000,), 0.5, dtype=torch.float64)
    assert fit_width_scale(_t(m), sd, _t(y), 0.09) == 0.0
    assert fit_width_scale(_t(m), torch.zeros(1000, dtype=torch.float64), _t(y), 0.09) == 0.0
    # the lower bound itself is beaten by 0 there
    assert width_log_likelihood(_t(m), sd, _t(y), 0.09, 0.0) > width_log_likelihood(
        _t(m), sd, _t(y), 0.09, 1e-3)


def test_the_upper_bound_is_returned_when_the_likelihood_still_rises() -> None:
    m = torch.zeros(10, dtype=torch.float64)
    y = torch.full((10,), 5.0, dtype=torch.float64)
    assert fit_width_scale(m, torch.full((10,), 1e-3, dtype=torch.float64), y, 0.01,
                           bounds=(0.1, 10.0)) == 10.0


BAD_INPUTS = [
    ({"mean": [0.0, float("nan")]}, "mean"),
    ({"std": [0.1, float("inf")]}, "std"),
    ({"targets": [float("nan"), 0.0]}, "targets"),
    ({"std": [0.1, -0.1]}, "std"),
    ({"noise_var": -0.1}, "noise_var"),
    ({"noise_var": float("nan")}, "noise_var"),
    ({"mean": [], "std": [], "targets": []}, "empty"),
    ({"mask": [False, False]}, "empty"),
    ({"mean": [0.0, 0.0, 0.0]}, "mean"),
]


def _bad_args(kwargs: dict) -> tuple[list, dict]:
    args = {"mean": [0.0, 1.0], "std": [0.1, 0.2], "targets": [0.5, 0.5], "noise_var": 0.09,
            **kwargs}
    positional = [torch.tensor(args[k], dtype=torch.float64) for k in ("mean", "std", "targets")]
    mask = {"mask": torch.tensor(args["mask"])} if "mask" in args else {}
    return [*positional, args["noise_var"]], mask


@pytest.mark.parametrize("kwargs,name", BAD_INPUTS)
def test_bad_inputs_are_refused_by_name(kwargs, name) -> None:
    positional, mask = _bad_args(kwargs)
    with pytest.raises(ValueError, match=name):
        fit_width_scale(*positional, **mask)
    with pytest.raises(ValueError, match=name):
        width_log_likelihood(*positional, 1.0, **mask)


@pytest.mark.parametrize("bounds", [(0.0, 1.0), (2.0, 1.0), (1e-3, float("inf"))])
def test_bad_bounds_are_refused(bounds) -> None:
    positional, _ = _bad_args({})
    with pytest.raises(ValueError, match="bounds"):
        fit_width_scale(*positional, bounds=bounds)


def test_scale_is_refused_unless_finite_and_nonnegative() -> None:
    x = torch.ones(3, dtype=torch.float64)
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="scale"):
            width_log_likelihood(x, x, x, 0.09, bad)


# ---- the config and s = 1 ---------------------------------------------------------------------


def test_config_field_is_validated_by_name() -> None:
    assert FusionConfig().width_scale == 1.0
    for bad in (-0.5, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="fusion.width_scale"):
            FusionConfig(width_scale=bad)
    assert make_config("smoke", "bandit", overrides=["fusion.width_scale=0.4"]
                       ).fusion.width_scale == 0.4


def test_scaled_std_is_the_tensor_itself_at_one() -> None:
    std = torch.rand(3, 4, dtype=torch.float32)
    assert scaled_prior_std(std, 1.0) is std
    got = scaled_prior_std(std, 0.5)
    assert got.dtype == torch.float64
    assert torch.equal(got, std.double() * 0.5)


def test_config_json_names_the_scale_only_where_it_is_read_and_not_one() -> None:
    eval_cfg = EvalConfig()
    paper, scaled = FusionConfig(), FusionConfig(width_scale=0.4)
    assert AgentSpec("spice", paper).config_json(eval_cfg) == AgentSpec(
        "spice", dataclasses.replace(paper, width_scale=1.0)).config_json(eval_cfg)
    assert "width_scale" not in AgentSpec("spice", paper).config_json(eval_cfg)
    assert json.loads(AgentSpec("spice", scaled).config_json(eval_cfg, online=False)
                      )["width_scale"] == 0.4
    for method in ("spice-flat", "spice-oracle", "spice-exact-width", "count"):
        assert AgentSpec(method, scaled).config_json(eval_cfg) == AgentSpec(
            method, paper).config_json(eval_cfg)


def _model_and_batch(B: int = 3, T: int = 6):
    cfg = make_config("smoke", "bandit")
    model = build_model("spice", cfg, torch.Generator().manual_seed(0)).eval()
    A = cfg.env.num_actions
    rng = np.random.default_rng(6)
    batch = {"actions": rng.integers(0, A, size=(B, T)),
             "rewards": rng.normal(0.5, 0.3, size=(B, T)).astype(np.float32),
             "behaviour_probs": np.full((B, A), 1.0 / A, dtype=np.float32)}
    return cfg, model, batch


def test_online_posterior_scales_only_the_learned_width() -> None:
    cfg, model, batch = _model_and_batch()
    A = cfg.env.num_actions
    states = torch.zeros(3, 1)
    posts = {}
    for s in (1.0, 0.5):
        agent = SpiceAgent(FusionConfig(width_scale=s), model=model, stateless=True)
        agent.reset(3, A)
        for t in range(4):
            agent.observe(torch.as_tensor(batch["actions"][:, t]),
                          torch.as_tensor(batch["rewards"][:, t], dtype=torch.float64),
                          states, states)
        posts[s] = agent.posterior(states)
    # prior precision 1/max((s sigma_Q)^2, v_min): a narrower prior never has a larger var
    assert bool((posts[0.5].var <= posts[1.0].var + 1e-15).all())
    assert not torch.equal(posts[0.5].var, posts[1.0].var)


def spice_offline_picks(spec, out, actions, rewards, hs, num_actions, model):
    """SPICE's offline picks at every h, as the offline protocol asks its agent for them."""
    from spice_ray.agents import OfflineContexts

    return SpiceAgent(spec.fusion, model=model).offline_picks(
        OfflineContexts(actions, rewards, hs, num_actions, outputs=out))


def test_offline_picks_are_unchanged_at_one_and_read_the_scale() -> None:
    cfg, model, batch = _model_and_batch()
    A = cfg.env.num_actions
    hs = np.array([0, 1, 3, 6])
    data = {**batch, "label": np.zeros(3, dtype=np.int64)}
    out = sequence_outputs(model, make_tokens(data, cfg.env), hs)
    actions = torch.as_tensor(batch["actions"])
    rewards = torch.as_tensor(batch["rewards"], dtype=torch.float64)
    base = spice_offline_picks(AgentSpec("spice"), out, actions, rewards, hs, A, model)
    same = spice_offline_picks(AgentSpec("spice", FusionConfig(width_scale=1.0)), out, actions,
                               rewards, hs, A, model)
    assert torch.equal(base, same)
    # s = 0: the prior is N(Q-bar, v_min) alone, so picks equal a model with sigma_Q = 0
    zero = spice_offline_picks(AgentSpec("spice", FusionConfig(width_scale=0.0)), out, actions,
                               rewards, hs, A, model)
    flat = spice_offline_picks(AgentSpec("spice"), {**out, "prior_std": out["prior_std"] * 0},
                               actions, rewards, hs, A, model)
    assert torch.equal(zero, flat)


# ---- the model-level fit ----------------------------------------------------------------------


def test_model_fit_equals_the_kernel_on_hand_built_tensors() -> None:
    cfg, model, batch = _model_and_batch()
    fusion = cfg.fusion
    assert fusion.target == "reward" or fusion.gamma == 0
    fit = fit_model_width(model, [batch], cfg.env, fusion)  # no label, no means column
    B, T = batch["actions"].shape
    tokens = make_tokens({**batch, "label": np.zeros(B, dtype=np.int64)}, cfg.env)
    with torch.no_grad():
        o = model(tokens)
    taken = torch.as_tensor(batch["actions"])[:, :, None]  # (B, T, 1)
    mean = o.prior_mean[:, :-1].double().gather(-1, taken).squeeze(-1)  # position t-1 for t
    std = o.prior_std[:, :-1].double().gather(-1, taken).squeeze(-1)
    y = torch.as_tensor(batch["rewards"], dtype=torch.float64)
    want = fit_width_scale(mean, std, y, fusion.noise_var)
    assert fit.scale == pytest.approx(want, rel=1e-9, abs=1e-12)
    assert fit.num_targets == B * T
    assert fit.log_lik >= fit.log_lik_paper
    assert fit.log_lik_paper == pytest.approx(width_log_likelihood(mean, std, y,
                                                                   fusion.noise_var, 1.0))
    # two batches = one batch of both (up to the float32 forward's batch-dependent rounding)
    halves = [{k: v[:2] for k, v in batch.items()}, {k: v[2:] for k, v in batch.items()}]
    assert fit_model_width(model, halves, cfg.env, fusion).scale == pytest.approx(
        fit.scale, rel=1e-5)


def test_model_fit_with_nstep_targets_uses_only_complete_ones() -> None:
    cfg, model, batch = _model_and_batch(T=8)
    fusion = dataclasses.replace(cfg.fusion, target="nstep", td_n=3, gamma=0.9)
    mean, std, targets, complete = transition_predictions(model, batch, cfg.env, fusion)
    B, T = batch["actions"].shape
    assert complete.tolist() == [[t + 3 <= T for t in range(1, T + 1)]] * B
    tokens = make_tokens({**batch, "label": np.zeros(B, dtype=np.int64)}, cfg.env)
    with torch.no_grad():
        q = model(tokens).prior_mean.double()  # (B, T+1, A)
    y = nstep_targets(torch.as_tensor(batch["rewards"], dtype=torch.float64),
                      bootstrap_values(q[:, 1:], fusion.bootstrap), 3, 0.9)
    assert torch.allclose(targets, y, rtol=0, atol=1e-12)
    fit = fit_model_width(model, [batch], cfg.env, fusion)
    assert fit.num_targets == B * (T - 3)
    assert fit.scale == pytest.approx(fit_width_scale(mean, std, targets, fusion.noise_var,
                                                      mask=complete), rel=1e-9, abs=1e-12)
    with pytest.raises(ValueError, match="complete"):
        fit_model_width(model, [{k: v[:, :3] if v.ndim == 2 and k != "behaviour_probs" else v
                                 for k, v in batch.items()}], cfg.env, fusion)
    with pytest.raises(ValueError, match="batches"):
        fit_model_width(model, [], cfg.env, fusion)


# ---- the likelihood variance fitted with s ---------------------------------------------------


def test_joint_fit_recovers_scale_and_noise_from_simulated_targets() -> None:
    """Targets drawn with s = 0.5, sigma^2 = 2 (an n-step return's scale) and with s = 2,
    sigma^2 = 0.09 (a bandit's): both recovered, the sd varying from target to target."""
    rng = np.random.default_rng(0)
    n = 4000
    sd, m = 0.1 + rng.random(n), rng.normal(size=n)
    for s, noise in ((0.5, 2.0), (2.0, 0.09)):
        y = m + rng.normal(size=n) * np.sqrt(s * s * sd**2 + noise)
        s_hat, noise_hat = fit_width_and_noise(_t(m), _t(sd), _t(y))
        assert s_hat == pytest.approx(s, rel=0.25) and noise_hat == pytest.approx(noise, rel=0.1)
        # it maximises the joint likelihood: no point of a dense 2-d grid does better
        best = _log_lik_numpy(m, sd, y, noise_hat, s_hat)
        grid = max(_log_lik_numpy(m, sd, y, v, u) for u in np.linspace(0.0, 3.0, 61)
                   for v in np.geomspace(0.01, 10.0, 61))
        assert best >= grid - 1e-9
        # and at least as well as s alone at the config's bandit noise
        alone = fit_width_scale(_t(m), _t(sd), _t(y), 0.09)
        assert best >= _log_lik_numpy(m, sd, y, 0.09, alone) - 1e-9


def test_joint_fit_without_spread_is_the_mean_squared_residual() -> None:
    """std all zero: s is not identified (0.0) and sigma^2 is the closed-form mean of r^2."""
    y = _t(np.array([0.5, -1.5, 2.0, 0.1, -0.7]))
    zero = torch.zeros(5, dtype=torch.float64)
    s_hat, noise_hat = fit_width_and_noise(zero, zero, y)
    assert s_hat == 0.0
    assert noise_hat == pytest.approx(float((y**2).mean()), rel=1e-7)


@pytest.mark.parametrize("bounds", [(0.0, 1.0), (1.0, 0.5), (float("nan"), 1.0)])
def test_joint_fit_refuses_bad_noise_bounds(bounds) -> None:
    one = torch.ones(3, dtype=torch.float64)
    with pytest.raises(ValueError, match="noise_bounds"):
        fit_width_and_noise(one, one, one, noise_bounds=bounds)


def test_model_fit_with_noise_reports_the_fitted_variance() -> None:
    """``fit_noise``: the model-level fit is the joint kernel on its complete targets; its
    paper likelihood stays at s = 1 and the config's sigma^2."""
    cfg, model, batch = _model_and_batch(T=8)
    fusion = dataclasses.replace(cfg.fusion, target="nstep", td_n=3, gamma=0.9)
    mean, std, targets, complete = transition_predictions(model, batch, cfg.env, fusion)
    fit = fit_model_width(model, [batch], cfg.env, fusion, fit_noise=True)
    s_hat, noise_hat = fit_width_and_noise(mean, std, targets, mask=complete)
    assert (fit.scale, fit.noise_var) == (s_hat, noise_hat)
    assert fit.log_lik_paper == width_log_likelihood(mean, std, targets, fusion.noise_var, 1.0,
                                                     mask=complete)
    assert fit.log_lik >= fit.log_lik_paper
    assert fit_model_width(model, [batch], cfg.env, fusion).noise_var == fusion.noise_var


def _prior_rows(width: float, coverage: float):
    """Calibration rows of one width source: two tasks, h = 0 and 20, fixed values."""
    import pandas as pd

    config = json.dumps({"noise_var": 0.09, "v_min": 0.01}
                        | ({} if width == 1.0 else {"width_scale": width}))
    values = {"oracle_rmse": 0.1, "oracle_sd_ratio": 3.0 * width, "oracle_coverage_90": coverage,
              "n_pri_mean": 0.5 / width ** 2, "oracle_n_pri_mean": 4.0, "coverage_90": coverage,
              "warm_start": 0.2}
    return pd.DataFrame([{"method": "SPICE", "rule": "prior", "config": config, "variant": "",
                          "seed": 0, "task_id": task, "env": "bandit_template", "metric": m,
                          "x": h, "value": v}
                         for m, v in values.items() for h in (0, 20) for task in (0, 1)])


def test_prior_sentences_and_figure_name_each_width_source(tmp_path) -> None:
    """A prior table with the paper's and the fitted width: one sentence set per source, named
    by its s, paper first; a table with one source reads as before; the figure draws both."""
    import pandas as pd

    from spice_ray.results.analysis import prior_fit
    from spice_ray.results.plots import plot_calibration

    one = prior_fit(_prior_rows(1.0, 1.0))
    assert one[0].startswith("Learned prior at h=0 against the exact posterior: RMSE of Q-bar "
                             "0.100, sigma_Q / posterior sd 3.00")
    both = prior_fit(pd.concat([_prior_rows(0.4, 0.9), _prior_rows(1.0, 1.0)]))
    assert len(both) == 4 and both[:2] == [s.replace("Learned prior at", "Learned prior (paper "
                                                     "width, s = 1) at") for s in one]
    assert both[2].startswith("Learned prior (width fitted on validation, s = 0.4) at h=0")
    assert "sigma_Q / posterior sd 1.20" in both[2] and "for 90% of arms" in both[2]
    assert "N_pri 3.12" in both[2]
    path = plot_calibration(pd.concat([_prior_rows(1.0, 1.0), _prior_rows(0.4, 0.9)]),
                            tmp_path / "prior.png", "template")
    assert path.exists() and path.stat().st_size > 0


# ---- a width that narrows with the context length ---------------------------------------------


def test_width_profile_and_scaled_std_with_a_decay() -> None:
    h = torch.tensor([0.0, 1.0, 3.0, 99.0])
    assert width_profile(h, 0.0).tolist() == [1.0] * 4
    np.testing.assert_allclose(width_profile(h, 1.0).numpy(), [1, 0.5**0.5, 0.5, 0.1])
    std = torch.full((4,), 2.0)
    np.testing.assert_allclose(scaled_prior_std(std, 0.5, 1.0, h).numpy(),
                               [1, 0.5**0.5, 0.5, 0.1])
    with pytest.raises(ValueError, match="needs the context length h"):
        scaled_prior_std(std, 0.5, 1.0)


@pytest.mark.parametrize("decay", [0.0, 0.3])
def test_simulated_data_recover_the_decay(decay) -> None:
    """Targets drawn with a prior sd of s (1 + decay h)^-1/2 sigma: the fit finds the decay
    on its grid (0: a constant width, the first point, wins) and s near the truth."""
    rng = np.random.default_rng(11)
    n, s = 10_000, 0.4
    h = rng.integers(0, 60, n).astype(np.float64)
    std = rng.uniform(0.5, 1.5, n)
    sd = s * std * (1 + decay * h) ** -0.5
    y = rng.normal(0, np.sqrt(sd**2 + 0.01))
    got_s, got_decay, noise = fit_width_decay(_t(np.zeros(n)), _t(std), _t(y), _t(h), 0.01)
    _, joint_decay, joint_noise = fit_width_decay(_t(np.zeros(n)), _t(std), _t(y), _t(h), None)
    assert noise == 0.01 and joint_noise == pytest.approx(0.01, rel=0.5)
    assert got_s == pytest.approx(s, rel=0.1)
    for fitted in (got_decay, joint_decay):  # the grid has 4 points a decade
        if decay == 0.0:  # constant over the data's h: g(59) within 3% of 1
            assert fitted * 59 < 0.06
        else:
            assert fitted == pytest.approx(decay, rel=0.5)


def test_decay_fit_refuses_bad_inputs() -> None:
    x = _t(np.ones(5))
    with pytest.raises(ValueError, match="decays"):
        fit_width_decay(x, x, x, x, 0.1, decays=())
    with pytest.raises(ValueError, match="h must have the shape"):
        fit_width_decay(x, x, x, _t(-np.ones(5)), 0.1)


def test_online_and_offline_narrow_the_learned_width_with_h() -> None:
    """The agent's prior at context length h is s (1 + decay h)^-1/2 sigma_Q: after 4
    observations its posterior equals a decay-free agent's whose scale is s / sqrt(1 + 4
    decay); the config names the decay only where it is not 0."""
    cfg, model, batch = _model_and_batch()
    A = cfg.env.num_actions
    states = torch.zeros(3, 1)
    posts = {}
    for fusion in (FusionConfig(width_scale=0.6, width_decay=0.5),
                   FusionConfig(width_scale=0.6 / math.sqrt(1 + 4 * 0.5))):
        agent = SpiceAgent(fusion, model=model, stateless=True)
        agent.reset(3, A)
        for t in range(4):
            agent.observe(torch.as_tensor(batch["actions"][:, t]),
                          torch.as_tensor(batch["rewards"][:, t], dtype=torch.float64),
                          states, states)
        posts[fusion.width_decay] = agent.posterior(states)
    torch.testing.assert_close(posts[0.5].var, posts[0.0].var, rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(posts[0.5].mean, posts[0.0].mean, rtol=1e-12, atol=1e-15)
    spec = AgentSpec("spice", FusionConfig(width_scale=0.6, width_decay=0.5))
    assert json.loads(spec.config_json(EvalConfig()))["width_decay"] == 0.5
    assert "width_decay" not in AgentSpec("spice").config_json(EvalConfig())
    assert "width_decay" not in AgentSpec("spice-flat", FusionConfig(
        width_decay=0.5)).config_json(EvalConfig())
    # offline: at h = 0 the decay changes nothing; at h > 0 the picks read it
    hs = np.array([0, 6])
    data = {**batch, "label": np.zeros(3, dtype=np.int64)}
    out = sequence_outputs(model, make_tokens(data, cfg.env), hs)
    actions = torch.as_tensor(batch["actions"])
    rewards = torch.as_tensor(batch["rewards"], dtype=torch.float64)
    narrowing = spice_offline_picks(spec, out, actions, rewards, hs, A, model)
    at_h0 = spice_offline_picks(AgentSpec("spice", FusionConfig(width_scale=0.6)), out,
                                actions, rewards, hs, A, model)
    assert torch.equal(narrowing[:, 0], at_h0[:, 0])


def test_model_fit_with_decay_reports_it_and_nests_the_constant() -> None:
    cfg, model, batch = _model_and_batch()
    fusion = FusionConfig()
    flat = fit_model_width(model, [batch], cfg.env, fusion)
    fit = fit_model_width(model, [batch], cfg.env, fusion, fit_decay=True)
    assert fit.decay in DECAYS and fit.log_lik >= flat.log_lik - 1e-12
    if fit.decay == 0.0:
        assert fit.scale == flat.scale


# ---- a second width source: the predictive-variance head ---------------------------------------


def test_the_variance_head_leaves_every_other_weight_and_the_identity_as_they_were() -> None:
    """Built last, the head draws nothing the other weights draw: a model with it has the
    same weights elsewhere as the paper's model of the same seed; without it, the model's
    spec and its training identity are what they were before the field existed."""
    from spice_ray.train.loop import TrainJob

    cfg = make_config("smoke", "bandit")
    on = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, var_head=True))
    plain = build_model("spice", cfg, generator=torch.Generator().manual_seed(4))
    head = build_model("spice", on, generator=torch.Generator().manual_seed(4))
    extra = set(head.state_dict()) - set(plain.state_dict())
    assert extra == {"var_head.weight", "var_head.bias"}
    for name, value in plain.state_dict().items():
        assert torch.equal(value, head.state_dict()[name]), name
    assert "var_head" not in plain.spec()["config"] and head.spec()["config"]["var_head"]
    out = head.heads(torch.randn(3, 7, cfg.model.n_embd))
    assert out.pred_var.shape == (3, 7, 5) and bool((out.pred_var > 0).all())
    assert plain.heads(torch.randn(3, cfg.model.n_embd)).pred_var is None
    job = TrainJob(cfg.to_dict(), "spice", "dir", "data", 0)
    before = dict(cfg.to_dict())
    before["model"] = {k: v for k, v in before["model"].items() if k != "var_head"}
    before["train"] = {k: v for k, v in before["train"].items()
                       if k not in ("lambda_var", "h0_prior")}
    assert job.identity() == TrainJob(before, "spice", "dir", "data", 0).identity()
    assert TrainJob(on.to_dict(), "spice", "dir", "data", 0).identity() != job.identity()
    state = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, h0_prior="state"))
    assert TrainJob(state.to_dict(), "spice", "dir", "data", 0).identity() != job.identity()


def test_the_variance_loss_is_the_gaussian_nll_of_the_targets_and_spares_the_mean() -> None:
    """-log N(y; Q-bar, v) up to its constant, averaged over transitions, v from position
    t-1 at the action taken; its gradient reaches v only, never the mean."""
    from spice_ray.train.losses import predictive_variance_loss

    pred_var = torch.tensor([[[0.5, 2.0], [1.0, 4.0], [9.0, 9.0]]], requires_grad=True)
    q_pred = torch.tensor([[[0.0, 1.0], [3.0, 0.5]]], requires_grad=True)  # (1, T=2, A=2)
    actions = torch.tensor([[1, 0]])
    y = torch.tensor([[2.0, 1.0]])
    got = predictive_variance_loss(pred_var, q_pred, actions, y)
    # t=1: a=1, v=2.0 (position 0), r=2-1=1; t=2: a=0, v=1.0 (position 1), r=1-3=-2
    want = 0.5 * ((math.log(2.0) + 1.0 / 2.0) + (math.log(1.0) + 4.0 / 1.0)) / 2
    assert float(got.detach()) == pytest.approx(want, rel=1e-6)
    got.backward()
    assert q_pred.grad is None or not bool(q_pred.grad.any())
    assert pred_var.grad[0, 0, 1] != 0 and pred_var.grad[0, 1, 0] != 0
    assert not bool(pred_var.grad[0, 2].any())  # position T predicts no transition


def test_the_predictive_width_is_what_remains_of_the_variance_after_the_noise() -> None:
    """sqrt(max(v - sigma^2, 0)) times s; the ensemble source ignores v; a model without the
    head is refused by name for the predictive source."""
    from spice_ray.fusion import learned_prior_std

    fusion = FusionConfig(noise_var=0.09, width_source="predictive", width_scale=2.0)
    v = torch.tensor([0.09, 0.25, 0.01, 1.09], dtype=torch.float64)
    got = learned_prior_std(fusion, torch.ones(4), 3, v)
    torch.testing.assert_close(got, 2.0 * torch.tensor([0.0, 0.4, 0.0, 1.0],
                                                       dtype=torch.float64))
    ensemble = dataclasses.replace(fusion, width_source="ensemble", width_scale=1.0)
    sd = torch.full((4,), 0.3)
    assert learned_prior_std(ensemble, sd, 3, v) is sd  # the paper's: the tensor itself
    with pytest.raises(ValueError, match="model.var_head=true"):
        learned_prior_std(fusion, sd, 3, None)
    with pytest.raises(Exception, match="fusion.width_source"):
        FusionConfig(width_source="wide")
    spec = AgentSpec("spice", fusion=fusion)
    assert json.loads(spec.config_json(EvalConfig()))["width_source"] == "predictive"
    assert "width_source" not in json.loads(AgentSpec("spice").config_json(EvalConfig()))
    flat = AgentSpec("spice-flat", fusion=fusion, prior=(0.5, 0.1))
    assert "width_source" not in json.loads(flat.config_json(EvalConfig()))


def test_a_variance_head_model_trains_and_its_width_reaches_agent_offline_and_calibration(
        tmp_path) -> None:
    """The loss gains its "var" part; the online agent, the offline picks and the prior
    table all read the same predictive width (v - sigma^2), and the grid gets its point."""
    from spice_ray.evaluate.calibration import calibration_stats
    from spice_ray.results.analysis import width_source_of
    from spice_ray.study.tuning import candidates
    from spice_ray.train.losses import loss_for

    cfg = make_config("smoke", "bandit_latent", overrides=["model.var_head=true"])
    model = build_model("spice", cfg, generator=torch.Generator().manual_seed(0)).eval()
    env = cfg.environment()
    from spice_ray.data.tasks import generate_tasks

    data = generate_tasks(cfg.env, cfg.data, "eval", np.arange(4))
    tokens = make_tokens(data, env)
    out = model(tokens)
    loss, parts = loss_for("spice")(out, tokens, model, torch.arange(4), cfg.train)
    assert "var" in parts and torch.isfinite(loss)
    fusion = dataclasses.replace(cfg.fusion, width_source="predictive")
    hs = np.array([0, 3, 10])
    outs = sequence_outputs(model, tokens, hs)
    want = (outs["pred_var"].double() - fusion.noise_var).clamp(min=0).sqrt()
    stats = calibration_stats(model, cfg.env, data, fusion, hs)
    np.testing.assert_allclose(stats.prior_std, want.numpy(), rtol=1e-6)
    agent = SpiceAgent(fusion, model=model, stateless=True)
    agent.reset(4, env.num_actions)
    mean0, var0 = agent.posterior(torch.zeros(4, 1))
    v_pri = torch.maximum(want[:, 0].square(), torch.tensor(fusion.v_min, dtype=torch.float64))
    torch.testing.assert_close(var0, v_pri)  # no evidence yet: the posterior is the prior
    grid = candidates(AgentSpec("spice", fusion=cfg.fusion), cfg.eval,
                      {"scale": 0.5, "predictive": True})
    assert sum(dict(c.setting)["width"] == "predictive" for c in grid) == 5
    assert {c.spec.fusion.width_source for c in grid
            if dict(c.setting)["width"] == "predictive"} == {"predictive"}
    assert width_source_of('{"width_source":"predictive"}') == "predictive"
    assert width_source_of('{"width_scale":0.5}') == "fitted" and width_source_of("{}") == "paper"


def test_the_pooled_fit_runs_its_forwards_on_one_thread_and_restores_the_count(monkeypatch
                                                                               ) -> None:
    """The driver's width fit runs the models' forwards on one thread, as an evaluation actor
    does: at two threads the compiled heads' forward varied with the scheduling under a
    contended CPU (the small bandit's fitted s in its 7th digit, seen between two runs of the
    same weights); the caller's thread count comes back, also after an error."""
    from spice_ray.evaluate import width

    seen: list[int] = []

    def predictions(model, data, env_cfg, fusion):
        seen.append(torch.get_num_threads())
        y = torch.tensor([[0.1, 0.5, 0.9, 0.4]], dtype=torch.float64)
        return (torch.full_like(y, 0.5), torch.full_like(y, 0.2), y,
                torch.ones_like(y, dtype=torch.bool))

    monkeypatch.setattr(width, "load_model", lambda source, env_cfg, kind: source)
    monkeypatch.setattr(width, "transition_predictions", predictions)
    cfg = make_config("smoke", "bandit")
    with torch_threads(2):
        fit = width.fit_pooled_width({0: "a", 1: "b"}, {}, cfg.env, cfg.fusion)
        assert seen == [1, 1] and torch.get_num_threads() == 2 and fit["scale"] >= 0
        monkeypatch.setattr(width, "transition_predictions", lambda *a: 1 / 0)
        with pytest.raises(ZeroDivisionError):
            width.fit_pooled_width({0: "a"}, {}, cfg.env, cfg.fusion)
        assert torch.get_num_threads() == 2
