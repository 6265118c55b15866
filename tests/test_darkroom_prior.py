"""The darkroom prior read-out: exact values and posteriors against closed forms and the region
family's own posterior, the metrics on hand-made priors (one that knows the goal scores 1, a
state-blind one its chance level), and the model read where the online agent reads it. No Ray."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from spice_ray.agents.runner import ContextRunner
from spice_ray.common.rng import TaskStreams
from spice_ray.config import make_config
from spice_ray.envs.darkroom import all_cells, optimal_actions
from spice_ray.evaluate.darkroom_prior import (
    GROUPS,
    arrival_readout,
    darkroom_prior_rows,
    exact_readout,
    goal_values,
    learned_readout,
    optimal_set,
    readout_rows,
)
from spice_ray.model.registry import build_model

pytestmark = pytest.mark.usefixtures("one_thread")
GAMMA = 0.95


def _walks(env, split: str, num: int, seed: int = 0) -> dict[str, np.ndarray]:
    """``num`` tasks of ``split`` as the dataset stores them (the env's own generator)."""
    cfg = make_config("smoke", env)
    streams = TaskStreams.from_generator(np.random.default_rng(seed), num)
    return cfg.env.environment().generate(cfg.data, split, streams)


def test_goal_values_are_the_closed_form_on_the_darkroom() -> None:
    env = make_config("smoke", "darkroom").env.environment()
    values = goal_values(env.goal_family()["arrival_rewards"], 10, GAMMA)  # (G, S, A)
    cells = all_cells(10)
    nxt = np.clip(cells[:, None] + np.array([[1, 0], [-1, 0], [0, 1], [0, -1], [0, 0]]), 0, 9)
    dist = np.abs(nxt[None] - cells[:, None, None]).sum(-1)  # (G, S, A)
    np.testing.assert_allclose(values, GAMMA**dist / (1 - GAMMA), rtol=1e-9)
    # the optimal set is every shortest-path move, and on the goal stay and the moves into a
    # wall (they stay too)
    goals = np.repeat(cells, 100, 0)
    states = np.tile(cells, (100, 1))
    on_goal = (goals == states).all(1)[:, None]
    into_wall = (np.tile(nxt, (100, 1, 1)) == states[:, None]).all(-1)  # (G*S, A)
    np.testing.assert_array_equal(optimal_set(values.reshape(-1, 5)),
                                  optimal_actions(goals, states) | (on_goal & into_wall))


def test_continuous_values_make_the_envs_optimal_action_optimal() -> None:
    cfg = make_config("smoke", "darkroom_continuous")
    env = cfg.env.environment()
    family = env.goal_family()
    values = goal_values(family["arrival_rewards"], 10, GAMMA)  # (G, S, A)
    assert family["arrival_rewards"].diagonal() == pytest.approx(1.0)
    cells = all_cells(10)
    goals, states = np.repeat(cells, 100, 0), np.tile(cells, (100, 1))
    from spice_ray.envs.darkroom import DarkroomTasks
    from spice_ray.envs.darkroom_continuous import optimal_action

    chosen = optimal_action(DarkroomTasks(goals, states, 10), states)  # (G*S,)
    best = optimal_set(values.reshape(-1, 5))
    assert best[np.arange(len(chosen)), chosen].all()


def test_exact_posterior_is_the_region_familys_own() -> None:
    """The read-out's posterior (goals ruled out by the rewards seen) and its mean values equal
    the region family's GoalPosterior after the same transitions, and the context-free prior
    is that posterior before any."""
    cfg = make_config("smoke", "darkroom_region")
    env = cfg.env.environment()
    data = _walks("darkroom_region", "eval", 12)
    cells = env.positions(data["states"])  # (B, T+1, 2)
    hs = np.array([0, 3, 10, 20])
    exact = exact_readout(env.goal_family(), data["goal"], cells, data["rewards"], hs, GAMMA)
    post = env.task_posterior(GAMMA)
    post.reset(12)
    for t in range(hs.max() + 1):
        if t in hs:
            p = int(np.flatnonzero(hs == t)[0])
            mean, _ = post.moments(cells[:, t])
            np.testing.assert_allclose(exact.bayes[:, p], mean, rtol=1e-10, atol=1e-12)
            if t == 0:
                np.testing.assert_allclose(exact.blind[:, p], mean, rtol=1e-10)
        if t < hs.max():
            post.observe(data["actions"][:, t], data["rewards"][:, t], cells[:, t],
                         cells[:, t + 1])
    # where the context has shown the goal the posterior knows it: its values are Q*
    shown = exact.shown
    assert shown[:, 0].sum() == 0 and shown.any()
    np.testing.assert_allclose(exact.bayes[shown], exact.q_star[shown], rtol=1e-10)


def test_a_prior_that_knows_the_goal_scores_one_and_a_state_blind_one_its_chance() -> None:
    cfg = make_config("smoke", "darkroom")
    env = cfg.env.environment()
    data = _walks("darkroom", "validation", 64)
    cells = env.positions(data["states"])
    hs = np.array([0, 5, 20])
    exact = exact_readout(env.goal_family(), data["goal"], cells, data["rewards"], hs, GAMMA)
    sd = {"ensemble": np.full(exact.q_star.shape, 0.5)}
    knows = readout_rows(exact.q_star, sd, exact, noise_var=1.0, v_min=0.0)
    assert list(knows["context"][:3]) == list(GROUPS)
    assert (knows.loc[knows["n"] > 0, "optimal_share"] == 1.0).all()
    assert (knows.loc[knows["n"] > 0, "rmse"] == 0.0).all()
    assert (knows.loc[knows["n"] > 0, "coverage_90_ensemble"] == 1.0).all()
    assert knows["n_pri_ensemble"].dropna().eq(4.0).all()  # sigma^2 / sd^2 = 1 / 0.25
    spread = knows[(knows["n"] >= 3) & (knows["v_sd_q_star"] > 0)]
    assert len(spread) and np.allclose(spread["v_corr"], 1.0)
    np.testing.assert_allclose(spread["v_sd_learned"], spread["v_sd_q_star"])
    # the values of a state-blind prior do not follow the states: no spread, no correlation
    flat = readout_rows(np.ones_like(exact.q_star), sd, exact, noise_var=1.0, v_min=0.0)
    assert (flat["v_sd_learned"].dropna() == 0).all() and flat["v_corr"].isna().all()
    # "always +x", whatever the state: right exactly where +x is a shortest-path move
    blind = np.zeros_like(exact.q_star)
    blind[..., 0] = 1.0
    rows = readout_rows(blind, sd, exact, noise_var=1.0, v_min=0.0)
    here = cells[:, hs]  # (B, P, 2)
    chance = optimal_actions(np.repeat(data["goal"], len(hs), 0),
                             here.reshape(-1, 2))[:, 0].reshape(len(data["goal"]), len(hs))
    got = rows[rows["context"] == "all"]["optimal_share"].to_numpy()
    np.testing.assert_allclose(got, chance.mean(0))
    assert 0.2 < got.mean() < 0.7
    # on arriving at the goal: a prior that knows the goal stays; "always +x" stays only where
    # +x runs into the wall (goal x = 9); defined only where the goal was shown
    knows = readout_rows(exact.q_star, sd, exact, noise_var=1.0, v_min=0.0,
                         on_arrival=exact.goal_q_star)
    shown_rows = knows[(knows["context"] == "goal shown") & (knows["n"] > 0)]
    assert len(shown_rows) and (shown_rows["goal_cell_share"] == 1.0).all()
    assert knows.loc[knows["context"] == "goal not shown", "goal_cell_share"].isna().all()
    rows = readout_rows(blind, sd, exact, noise_var=1.0, v_min=0.0, on_arrival=blind[:, 0])
    for p in range(len(hs)):
        shown_here = exact.shown[:, p]
        row = rows[(rows["h"] == hs[p]) & (rows["context"] == "goal shown")].iloc[0]
        if shown_here.any():
            assert row["goal_cell_share"] == (data["goal"][shown_here, 0] == 9).mean()
    # the exact posterior is never worse than the context-free prior, and perfect once shown
    shown = rows[(rows["context"] == "goal shown") & (rows["n"] > 0)]
    assert (shown["optimal_share_bayes"] == 1.0).all() and (shown["rmse_bayes"] < 1e-9).all()
    assert (rows["n"].to_numpy().reshape(-1, 3)[:, 0]
            == rows["n"].to_numpy().reshape(-1, 3)[:, 1:].sum(1)).all()


def test_the_model_is_read_where_the_online_agent_reads_it() -> None:
    """The read-out's prior after h transitions of a walk equals what an online agent that
    walked those transitions sees at its current state (the runner, query = current state)."""
    cfg = make_config("smoke", "darkroom")
    model = build_model("spice", cfg, generator=torch.Generator().manual_seed(3))
    model.eval()
    data = _walks("darkroom", "eval", 6)
    hs = np.array([0, 4, 9])
    got = learned_readout(model, cfg.env, data, hs)["prior_mean"]  # (B, P, A)
    # at a walk's first arrival, the read-out is the online agent's that has just arrived
    env = cfg.env.environment()
    cells = env.positions(data["states"])
    exact = exact_readout(env.goal_family(), data["goal"], cells, data["rewards"], hs, GAMMA)
    first = np.array([3, -1, 0, 19, 20, 7])  # 20 = T: only the last transition arrives
    on_arrival = arrival_readout(model, cfg.env, data, first)
    assert np.isnan(on_arrival[[1, 4]]).all() and not np.isnan(on_arrival[[0, 2, 3, 5]]).any()
    for b in (0, 2, 3, 5):
        at = learned_readout(model, cfg.env, data, np.array([first[b]]))["prior_mean"]
        np.testing.assert_allclose(on_arrival[b], at[b, 0], rtol=1e-6, atol=1e-7)
    on = (cells == data["goal"][:, None]).all(-1)[:, 1:]  # (B, T): transition t arrives
    np.testing.assert_array_equal(exact.arrival, np.where(on.any(1), on.argmax(1) + 1, -1))
    runner = ContextRunner(model, stateless=False)
    runner.reset(6)
    states = torch.as_tensor(data["states"], dtype=torch.float32)  # (B, T+1, 2)
    for t in range(hs.max() + 1):
        if t in hs:
            view = runner.view(states[:, t])
            p = int(np.flatnonzero(hs == t)[0])
            np.testing.assert_allclose(got[:, p], view.head.prior_mean.double().numpy(),
                                       rtol=1e-5, atol=1e-6)
        runner.append(states[:, t], torch.as_tensor(data["actions"][:, t]),
                      torch.as_tensor(data["rewards"][:, t], dtype=torch.float64),
                      states[:, t + 1])


def test_rows_of_an_untrained_model_and_a_refusal_for_other_contexts() -> None:
    cfg = make_config("smoke", "darkroom_region")
    model = build_model("spice", cfg, generator=torch.Generator().manual_seed(0))
    data = _walks("darkroom_region", "validation", 16)
    rows = darkroom_prior_rows(model, cfg.env, data, cfg.fusion, GAMMA)
    # the smoke horizon is 20: 25, 50 and 100 are read at 19, the last position acted from
    assert list(rows["h"].unique()) == [0, 10, 19]
    assert np.isfinite(rows.loc[rows["n"] > 0, ["optimal_share", "rmse",
                                                "coverage_90_ensemble"]]).all().all()
    shown = rows[(rows["context"] == "goal shown") & (rows["n"] > 0)]["goal_cell_share"]
    assert len(shown) and shown.between(0, 1).all()
    bandit = make_config("smoke", "bandit")
    with pytest.raises(ValueError, match="env.name=bandit has no goal family"):
        darkroom_prior_rows(model, bandit.env, data, cfg.fusion, GAMMA)
    uniform = make_config("smoke", "darkroom", overrides=["env.rollin=uniform"])
    flat = _walks("darkroom", "eval", 4)
    flat["states"] = flat["states"][:, :-1]
    with pytest.raises(ValueError, match="walk contexts .*env.rollin=walk"):
        learned_readout(model, uniform.env, flat, np.array([0]))


def test_the_read_out_figure_pools_shares_by_state_count_and_refuses_mixed_splits(tmp_path
                                                                                  ) -> None:
    """tools/plot_readout.py: a share pooled over h >= 10 and seeds is weighted by each row's
    states (h = 0 and empty rows left out); a (steps, seed) read twice keeps its first reading;
    files of two splits are refused by name; the figure is written."""
    from tools.plot_readout import main, pooled_shares, read_family

    def row(h, context, n, share, seed, steps=100, split="validation"):
        return {"h": h, "context": context, "n": n, "optimal_share": share,
                "optimal_share_bayes": 1.0, "optimal_share_blind": 0.5, "steps": steps,
                "seed": seed, "split": split}

    rows = pd.DataFrame([row(0, "goal shown", 0, np.nan, 0), row(0, "all", 10, 0.1, 0),
                         row(10, "goal shown", 1, 1.0, 0), row(50, "goal shown", 3, 0.0, 0),
                         row(10, "goal shown", 4, 0.5, 1), row(10, "goal not shown", 2, 0.25, 1),
                         row(10, "goal shown", 4, 0.0, 1)])  # seed 1 read twice: first kept
    shares = pooled_shares(rows).set_index(["context", "seed"])
    assert shares.loc[("goal shown", 0), "optimal_share"] == 0.25  # (1 + 0) / 4 states
    assert shares.loc[("goal shown", 1), "optimal_share"] == 0.5
    assert shares.loc[("goal shown", -1), "optimal_share"] == 3 / 8  # (1 + 2) / 8 states
    assert shares.loc[("goal not shown", -1), "optimal_share"] == 0.25
    assert shares.loc[("goal shown", -1), "optimal_share_blind"] == 0.5
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    rows.to_csv(a, index=False)
    rows.assign(split="eval").to_csv(b, index=False)
    with pytest.raises(SystemExit, match=r"mix the splits \['eval', 'validation'\]"):
        read_family([a, b])
    out = tmp_path / "readout.png"
    assert main([str(out), f"darkroom={a}"]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the values' summary: weighted by states like the shares; read-outs without the spread
    # columns give NaN there
    from spice_ray.evaluate.darkroom_prior import value_summary

    valued = rows.assign(mean_learned=[0.0, 0.0, 1.0, 5.0, 2.0, 3.0, 9.0], mean_q_star=10.0,
                         v_sd_learned=0.5, v_sd_q_star=2.0,
                         v_corr=[np.nan, np.nan, 1.0, 0.0, np.nan, 0.5, 0.5])
    summary = value_summary(valued).set_index("context")
    assert summary.loc["goal shown", "mean_learned"] == (1 + 15 + 8) / 8  # seed 1's first read
    assert summary.loc["goal shown", "v_corr"] == 0.25  # (1 * 1 + 3 * 0) / 4 states with one
    assert summary.loc["goal not shown", "v_corr"] == 0.5 and summary.loc["goal shown", "n"] == 8
    assert value_summary(rows)["v_corr"].isna().all()
