"""Evaluation: agents, cached == uncached rollouts, protocols, calibration (no Ray)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

from spice_ray.agents import (
    UCB,
    AgentSpec,
    EmpiricalMean,
    OfflineContexts,
    OracleAgent,
    PolicyAgent,
    SpiceAgent,
    state_features,
)
from spice_ray.agents.runner import ContextRunner
from spice_ray.config import EvalConfig, FusionConfig, make_config
from spice_ray.data.tasks import generate_tasks
from spice_ray.envs import bandit, darkroom
from spice_ray.evaluate import (
    agent_draws,
    calibration_rows,
    calibration_stats,
    check_rows,
    evaluate_tasks,
    offline_context_lengths,
    offline_rows,
    online_noise,
    online_rows,
    run_online,
    sequence_outputs,
)
from spice_ray.model import DptModel, SpiceModel, make_tokens
from spice_ray.results.schema import ROW_COLUMNS, ROW_KEY
from spice_ray.results.tables import read_frame, write_frame

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny ops: one thread is fastest


BANDIT = make_config("smoke", "bandit")
DARK = make_config("smoke", "darkroom")
BENV, DENV = BANDIT.environment(), DARK.environment()
ZERO_NOISE = make_config("smoke", "bandit", overrides=["env.sigma=0.0"])


def _data(cfg, n: int = 8) -> dict[str, np.ndarray]:
    return generate_tasks(cfg.env, cfg.data, "eval", np.arange(n))


def _model(cfg, cls=SpiceModel, seed: int = 0, max_len: int | None = None,
           dtype: torch.dtype = torch.float32):
    env = cfg.env
    m = cls(cfg.model, env.num_actions, env.state_dim, max_len or env.horizon + 1,
            generator=torch.Generator().manual_seed(seed))
    return m.to(dtype).eval()


def _bandit_run(agent, data, sigma: float = 0.3, horizon: int = 24, seed: int | None = 0):
    """An online run with the evaluation's noise; draws from a torch.Generator(seed), or with
    ``seed=None`` the evaluation's own per-task draws (ties broken exactly as it does)."""
    noise = online_noise(1234, data["task_id"], horizon)
    tasks = bandit.BanditTasks(np.asarray(data["means"], np.float64), sigma)
    draws = (agent_draws(1234, data["task_id"]) if seed is None
             else torch.Generator().manual_seed(seed))
    run = run_online(agent, BENV, tasks, horizon, noise, 1, draws)
    return torch.from_numpy(run.actions), torch.from_numpy(run.rewards)


# ---- inputs and rows ---------------------------------------------------------------------


def test_offline_context_lengths() -> None:
    hs = offline_context_lengths(500, 25)
    assert len(hs) >= 20 and np.all(np.diff(hs) > 0)
    assert {1, 10, 50, 500} <= set(hs.tolist())
    small = offline_context_lengths(24, 20)
    assert len(small) >= 20 and small[0] == 1 and small[-1] == 24 and {10} <= set(small)
    assert offline_context_lengths(5, 20).tolist() == [1, 2, 3, 4, 5]


def test_online_noise_is_per_task_and_step() -> None:
    ids = np.arange(10, 20)
    full = online_noise(7, ids, 30)
    np.testing.assert_array_equal(online_noise(7, ids[3:6], 30), full[3:6])  # any sharding
    np.testing.assert_array_equal(online_noise(7, ids, 12), full[:, :12])  # any horizon
    assert not np.allclose(online_noise(8, ids, 30), full)


def test_randomised_agents_do_not_depend_on_sharding() -> None:
    """A task's TS, DPT-sampling and SPICE-Thompson rows are the same whether it is evaluated
    with all tasks or in another shard: agent draws are per task, like the reward noise."""
    data = _data(BANDIT, 8)
    model = _model(BANDIT, seed=2)
    specs = [AgentSpec("ts"), AgentSpec("dpt"),
             AgentSpec("spice", FusionConfig(rule="thompson"))]
    key = list(ROW_KEY)

    def rows(index: np.ndarray) -> pd.DataFrame:
        shard = {k: np.asarray(v)[index] for k, v in data.items()}
        return online_rows(BANDIT.env, BANDIT.eval, shard, specs, model)

    whole = rows(np.arange(8)).sort_values(key, ignore_index=True)
    shards = pd.concat([rows(np.array([5, 1])), rows(np.array([0, 2, 3, 4, 6, 7]))])
    pd.testing.assert_frame_equal(shards.sort_values(key, ignore_index=True), whole)
    # the agents did draw: DPT's sampled actions are not its greedy ones
    greedy = online_rows(BANDIT.env, BANDIT.eval, data,
                                [AgentSpec("dpt", sample=False)], model)
    assert not np.array_equal(greedy.sort_values(key)["value"].to_numpy(),
                              whole[whole.rule == "sample"].sort_values(key)["value"]
                              .to_numpy())


def test_rows_schema_and_parquet_round_trip(tmp_path) -> None:
    data = _data(BANDIT)
    df = online_rows(BANDIT.env, BANDIT.eval, data, [AgentSpec("ucb")])
    assert tuple(df.columns) == ROW_COLUMNS
    assert len(df) == 8 * BANDIT.eval.online_horizon
    assert df[["seed", "task_id", "x"]].dtypes.eq(np.int64).all()
    assert json.loads(df["config"].iloc[0]) == {"c": 1.0, "sigma": 0.3}
    back = read_frame(write_frame(tmp_path / "r" / "rows.parquet", df))
    pd.testing.assert_frame_equal(back, df)
    check_rows(df, data["task_id"])
    with pytest.raises(RuntimeError, match="duplicated"):
        check_rows(pd.concat([df, df.iloc[:1]]), data["task_id"])
    with pytest.raises(RuntimeError, match="missing"):
        check_rows(df[df.task_id != 3], data["task_id"])


# ---- cached == uncached ------------------------------------------------------------------


@pytest.mark.parametrize("sample", [False, True])
def test_dpt_cached_rollout_equals_uncached(sample: bool) -> None:
    data = _data(BANDIT)
    model = _model(BANDIT, DptModel, dtype=torch.float64)  # float64: no rounding near ties
    runs = [_bandit_run(PolicyAgent(model, True, sample, use_cache=c), data)
            for c in (True, False)]
    np.testing.assert_array_equal(runs[0][0].numpy(), runs[1][0].numpy())
    np.testing.assert_array_equal(runs[0][1].numpy(), runs[1][1].numpy())
    assert len(np.unique(runs[0][0].numpy())) > 1


@pytest.mark.parametrize("fusion", [
    FusionConfig(),
    FusionConfig(kernel="rbf", tau=0.5, target="nstep", td_n=3, gamma=0.9),
    FusionConfig(rule="thompson", beta_schedule="sqrt2logt"),
])
def test_spice_cached_rollout_equals_uncached(fusion: FusionConfig) -> None:
    data = _data(BANDIT)
    model = _model(BANDIT, dtype=torch.float64)
    runs = [_bandit_run(SpiceAgent(fusion, model=model, stateless=True, use_cache=c), data)[0]
            for c in (True, False)]
    np.testing.assert_array_equal(runs[0].numpy(), runs[1].numpy())


def test_darkroom_runner_matches_full_forward() -> None:
    """Each step's outputs == the model's forward on [current state; context so far]."""
    data = _data(DARK, 4)
    model = _model(DARK, dtype=torch.float64)
    tasks = DENV.eval_tasks(data)
    runner = ContextRunner(model, False, keep_latents=True, keep_prior_means=True)
    runner.reset(4)
    rng = np.random.default_rng(0)
    states = darkroom.reset(tasks)
    hist_s, hist_a, hist_r = [], [], []
    for _ in range(6):
        view = runner.view(torch.from_numpy(states))
        T = len(hist_a)
        batch = {"states": np.stack(hist_s + [states], 1), "query_state": states,
                 "actions": np.array(hist_a, np.int64).reshape(T, 4).T,
                 "rewards": np.array(hist_r).reshape(T, 4).T, "label": np.zeros(4, np.int64)}
        ref = model(make_tokens(batch, DARK.env, dtype=torch.float64))
        torch.testing.assert_close(view.head.prior_mean, ref.prior_mean[:, -1])
        torch.testing.assert_close(view.latents, ref.latent)
        torch.testing.assert_close(view.prior_means, ref.prior_mean[:, 1:])
        a = rng.integers(0, 5, 4)
        nxt, r = darkroom.step(tasks, states, a)
        runner.append(torch.from_numpy(states), torch.from_numpy(a), torch.from_numpy(r),
                      torch.from_numpy(nxt))
        hist_s.append(states)
        hist_a.append(a)
        hist_r.append(r)
        states = nxt


# ---- agents and protocols ---------------------------------------------------------------


def test_common_random_numbers() -> None:
    data = _data(BANDIT)
    model = _model(BANDIT, DptModel)
    a1, r1 = _bandit_run(PolicyAgent(model, True, False, use_cache=True), data)
    a2, r2 = _bandit_run(PolicyAgent(model, True, False, use_cache=False), data)
    np.testing.assert_array_equal(a1, a2)
    np.testing.assert_array_equal(r1, r2)  # same actions, same rewards
    a3, r3 = _bandit_run(UCB(1.0), data)
    a4, r4 = _bandit_run(EmpiricalMean(), data)
    same = (a3 == a4).numpy()
    assert same.any() and not same.all()
    np.testing.assert_array_equal(r3.numpy()[same], r4.numpy()[same])  # per (task, step)


def test_spice_with_flat_prior_is_ucb() -> None:
    """A constant prior with huge variance (N_pri -> 0) and beta = c / sigma gives UCB(c)."""
    data = _data(BANDIT, 16)
    model = _model(BANDIT)
    with torch.no_grad():  # every head outputs 0: prior mean 0, std 0, floored at v_min
        model.ensemble.prior_scale = 0.0
        w, b = model.ensemble.f.layer(model.ensemble.f.num_layers - 1)
        w.zero_()
        b.zero_()
    fusion = FusionConfig(v_min=1e12, noise_var=0.09, beta=1.0 / 0.3)
    spice, _ = _bandit_run(SpiceAgent(fusion, model=model, stateless=True), data)
    ucb, _ = _bandit_run(UCB(1.0), data)
    np.testing.assert_array_equal(spice.numpy(), ucb.numpy())


def test_no_nan_at_sigma_zero() -> None:
    data = _data(BANDIT)
    model = _model(BANDIT)
    specs = [AgentSpec("spice", FusionConfig()),
             AgentSpec("spice", FusionConfig(noise_var=0.0, rule="thompson")),
             AgentSpec("dpt"), AgentSpec("ts"), AgentSpec("ucb"),
             AgentSpec("emp")]
    df = online_rows(ZERO_NOISE.env, BANDIT.eval, data, specs, model)
    assert len(df) == len(specs) * 8 * 24
    assert np.isfinite(df["value"]).all() and (df["value"] >= -1e-12).all()


def test_darkroom_oracle_has_zero_regret() -> None:
    data = _data(DARK, 16)
    tasks = DENV.eval_tasks(data)
    for episodes in (1, 2):
        cfg = EvalConfig(num_tasks=16, online_horizon=20, episodes=episodes)
        df = online_rows(DARK.env, cfg, data, [AgentSpec("optimal")])
        regret = df[df.metric == "cumulative_regret"]
        assert len(regret) == 16 * 20 * episodes and (regret["value"] == 0).all()
        ret = df[(df.metric == "cumulative_return") & (df.x == 20 * episodes)]
        ret = ret.sort_values("task_id")
        best = darkroom.optimal_rewards(tasks, 20).sum(1) * episodes
        np.testing.assert_array_equal(ret["value"].to_numpy(), best)
    run = run_online(OracleAgent(DENV, tasks), DENV, tasks, 20, np.zeros((16, 20)))
    np.testing.assert_array_equal(run.rewards, darkroom.optimal_rewards(tasks, 20))


def test_darkroom_learned_agents_run_and_add_up() -> None:
    """cumulative regret + return == the optimal cumulative return, also past the model's window."""
    data = _data(DARK, 6)
    model = _model(DARK)
    cfg = EvalConfig(num_tasks=6, online_horizon=20, episodes=2)  # 40 steps > max_len - 1
    specs = [AgentSpec("spice", DARK.fusion),
             AgentSpec("spice", FusionConfig(kernel="cosine", kernel_space="state")),
             AgentSpec("dpt", sample=False), AgentSpec("ad-bc", sample=True)]
    df = online_rows(DARK.env, cfg, data, specs, model, seed=3)
    check_rows(df, data["task_id"])
    assert np.isfinite(df["value"]).all() and (df.seed == 3).all()
    curves = df[df["metric"].isin(["cumulative_regret", "cumulative_return"])]
    wide = curves.pivot_table(index=["method", "rule", "config", "task_id", "x"],
                              columns="metric", values="value")
    best = np.cumsum(np.tile(darkroom.optimal_rewards(DENV.eval_tasks(data), 20), 2), 1)
    total = (wide["cumulative_regret"] + wide["cumulative_return"]).to_numpy().reshape(4, 6, 40)
    np.testing.assert_allclose(total, np.broadcast_to(best, (4, 6, 40)))
    visits = df[df["metric"] == "visits"]  # one count per step, over the grid's cells
    assert visits["x"].between(0, DENV.params.grid_size ** 2 - 1).all()
    assert (visits.groupby(["method", "rule", "config", "task_id"])["value"].sum() == 40).all()
    # the visit map's marks: each task's start and goal cell (x * size + y), once per agent
    tasks, size = DENV.eval_tasks(data), DENV.params.grid_size
    for metric, cells in (("start_cell", tasks.starts), ("goal_cell", tasks.goals)):
        rows = df[df["metric"] == metric]
        assert len(rows) == visits.groupby(["method", "rule", "config", "task_id"]).ngroups
        got = rows.groupby("task_id")["value"].agg(["min", "max"])
        want = (cells[:, 0] * size + cells[:, 1]).astype(float)
        np.testing.assert_array_equal(got["min"].to_numpy(), want)
        np.testing.assert_array_equal(got["max"].to_numpy(), want)
        assert (rows["x"] == 0).all()
    start = visits.merge(df[df["metric"] == "start_cell"][["method", "task_id", "value"]],
                         on=["method", "task_id"], suffixes=("", "_start"))
    assert (start.loc[start["x"] == start["value_start"], "value"] >= 1).all()


def test_offline_curve_has_at_least_20_points() -> None:
    data = _data(BANDIT)
    model = _model(BANDIT)
    specs = [AgentSpec("spice"), AgentSpec("spice", FusionConfig(beta=2.0)),
             AgentSpec("dpt"), AgentSpec("emp"), AgentSpec("lcb"),
             AgentSpec("ts"), AgentSpec("ucb")]
    df = offline_rows(BANDIT.env, BANDIT.eval, data, specs, model)
    assert set(df.method) == {"SPICE", "DPT", "Emp", "LCB", "TS"}  # ucb has no offline pick
    assert (df.groupby(["method", "task_id"])["x"].nunique() >= 20).all()
    assert df["value"].between(0, 1).all()
    assert df[["method", "rule"]].drop_duplicates().shape[0] == 5  # beta: one curve


@pytest.mark.parametrize("fusion", [
    FusionConfig(),
    FusionConfig(target="nstep", td_n=3, gamma=0.9),
    FusionConfig(kernel="rbf", tau=1.0),
])
def test_offline_picks_equal_online_posterior_on_the_same_context(fusion) -> None:
    """The vectorised offline posterior at h == the online agent's after h transitions."""
    data = _data(BANDIT, 6)
    model = _model(BANDIT, dtype=torch.float64)
    actions = torch.as_tensor(data["actions"].astype(np.int64))
    rewards = torch.as_tensor(data["rewards"].astype(np.float64))
    hs = np.array([0, 1, 5, 17, 24])
    out = sequence_outputs(model, make_tokens(data, BANDIT.env, dtype=torch.float64), hs,
                           keep_latents=True, keep_prior_means=True, batch_size=4)
    ctrl = SpiceAgent(fusion, model=model, stateless=True)
    offline = ctrl.offline_picks(OfflineContexts(actions, rewards, hs, 5, outputs=out))
    ctrl.reset(6, 5)
    zeros = torch.zeros(6, 1)
    for t in range(25):
        if t in hs:
            online = ctrl.posterior(zeros).mean.argmax(-1)
            np.testing.assert_array_equal(online.numpy(), offline[:, list(hs).index(t)].numpy())
        if t < 24:
            ctrl.observe(actions[:, t], rewards[:, t], zeros, zeros)


def test_general_fusion_path_matches_incremental() -> None:
    """An RBF kernel with a huge bandwidth (all weights ~1) acts like the running counts."""
    data = _data(BANDIT)
    model = _model(BANDIT, dtype=torch.float64)
    fast = SpiceAgent(FusionConfig(), model=model, stateless=True)
    slow = SpiceAgent(FusionConfig(kernel="rbf", tau=1e8), model=model, stateless=True)
    assert fast.incremental and not slow.incremental
    np.testing.assert_array_equal(_bandit_run(fast, data)[0], _bandit_run(slow, data)[0])


def test_evaluate_tasks_protocols_and_keys() -> None:
    data = _data(BANDIT)
    model = _model(BANDIT)
    specs = [AgentSpec("spice"), AgentSpec("spice", use_cache=False),
             AgentSpec("ucb")]
    df = evaluate_tasks(BANDIT.env, BANDIT.eval, data, specs, model,
                        ("offline", "online", "robustness", "calibration"))
    assert not df.duplicated(list(ROW_KEY)).any()  # sigma 0.3 once; cached == uncached key
    check_rows(df, data["task_id"])
    def sigmas(metric: str) -> set[float]:
        return {json.loads(c).get("sigma") for c in df[df.metric == metric].config}

    assert sigmas("cumulative_regret") == {0.3} and sigmas("final_regret") == {0.0, 0.3, 0.5}
    final = df[df.metric == "final_regret"]
    assert (final.x == BANDIT.eval.online_horizon).all() and len(final) == 3 * 2 * 8
    curve_end = df[(df.metric == "cumulative_regret") & (df.x == 24)]
    np.testing.assert_array_equal(  # the sigma = 0.3 run is shared by curve and final rows
        curve_end.sort_values(["method", "task_id"])["value"].to_numpy(),
        final[final.config.str.contains('"sigma":0.3')].sort_values(["method", "task_id"])[
            "value"].to_numpy())
    with pytest.raises(ValueError, match="darkroom has no .'offline'. protocol"):
        evaluate_tasks(DARK.env, DARK.eval, _data(DARK), specs, None, ("offline",))


def test_final_regret_of_baselines_matches_cumulative_regret() -> None:
    data = _data(BANDIT)
    df = online_rows(BANDIT.env, BANDIT.eval, data, [AgentSpec("ucb")])
    actions, _ = _bandit_run(UCB(1.0), data, seed=None)
    final = df[df.x == 24].sort_values("task_id")["value"].to_numpy()
    tasks = bandit.BanditTasks(np.asarray(data["means"], np.float64), 0.3)
    np.testing.assert_allclose(final, bandit.regret(tasks, actions.numpy()).sum(1))


# ---- calibration -------------------------------------------------------------------------


def test_calibration_rows() -> None:
    data = _data(BANDIT)
    model = _model(BANDIT)
    fusion = FusionConfig(v_min=1e-2, noise_var=0.09)
    hs = offline_context_lengths(24, 20)
    df = calibration_rows(model, BANDIT.env, data, fusion, hs, seed=1)
    check_rows(df, data["task_id"])
    cov = df[df.metric.str.startswith("coverage")]
    assert cov["value"].between(0, 1).all()
    wide = cov.pivot_table(index=["task_id", "x"], columns="metric", values="value")
    assert (wide["coverage_50"] <= wide["coverage_90"]).all()
    assert (wide["coverage_90"] <= wide["coverage_95"]).all()
    # N_pri = sigma^2 / v_pri exactly, from an independent forward.
    std = model(make_tokens(data, BANDIT.env)).prior_std.detach().double()[:, hs]  # (B, P, A)
    expected = (0.09 / torch.clamp(std**2, min=1e-2)).numpy()
    stats = calibration_stats(model, BANDIT.env, data, fusion, hs)
    np.testing.assert_array_equal(stats.n_pri, expected)
    got = df[df.metric == "n_pri_mean"].sort_values(["task_id", "x"])["value"].to_numpy()
    np.testing.assert_array_equal(got, expected.mean(-1).reshape(-1))
    assert (stats.warm_start >= 0).all() and (stats.warm_start_bound >= 0).all()


def test_latent_kernel_features_describe_states_only() -> None:
    """h(s) is the trunk's output for the query token [s, 0, 0, 0]: equal states give equal
    features (RBF weight 1), other states smaller weights, whatever the context."""
    from spice_ray.fusion import kernel_weights

    model = _model(DARK, dtype=torch.float64)
    states = torch.tensor([[[1.0, 2.0], [1.0, 2.0], [7.0, 0.0], [1.0, 3.0]]])  # (1, 4, 2)
    feats = state_features(model, states)  # (1, 4, D)
    assert feats.shape == (1, 4, model.trunk.n_embd)
    torch.testing.assert_close(feats[:, 0], feats[:, 1])
    w = kernel_weights(feats[:, 0], feats, "rbf", tau=0.5)  # (1, 4)
    assert w[0, 0] == pytest.approx(1.0) and w[0, 1] == pytest.approx(1.0)
    assert w[0, 2] < 1.0 and w[0, 3] < 1.0
    # the query position's output does not depend on anything but the state
    tokens = make_tokens({"states": np.array([[[1, 2], [3, 3]]]), "query_state": np.array([[1, 2]]),
                          "actions": np.array([[0]]), "rewards": np.array([[1.0]]),
                          "label": np.array([0])}, DARK.env, dtype=torch.float64)
    torch.testing.assert_close(model(tokens).latent[:, 0], feats[:, 0])


def test_task_shards_merge_into_one_process_order() -> None:
    """Rows of two task shards (each: agent A then agent B, tasks in order) come back block by
    block, as one shard of all the tasks gives them, not shard after shard."""
    from spice_ray.evaluate.rows import merge_task_shards, tidy_rows

    def shard(tasks: np.ndarray) -> pd.DataFrame:
        frames = [tidy_rows("bandit", m, "ucb", "{}", 0, tasks, "cumulative_regret",
                            np.arange(1, 4), np.outer(tasks, [1.0, 2.0, 3.0]) + k)
                  for k, m in enumerate(("A", "B"))]
        return pd.concat(frames, ignore_index=True)

    whole = shard(np.arange(5))
    merged = merge_task_shards([shard(np.arange(3)), shard(np.arange(3, 5))])
    pd.testing.assert_frame_equal(merged, whole)
    assert merge_task_shards([whole]).equals(whole)


def test_context_follow_measures_how_far_the_prior_moves_with_the_posterior() -> None:
    """A prior that makes half the exact posterior's move away from the family's mean has
    slope 0.5 at every length; RMSEs by hand; a prior that ignores the context has slope 0 and
    the blind RMSE."""
    from spice_ray.evaluate.calibration import context_follow

    rng = np.random.default_rng(0)
    family = rng.random((7, 1, 3))
    oracle = family + np.concatenate([np.zeros((7, 1, 3)), rng.normal(0, 0.1, (7, 4, 3))], 1)
    half = context_follow(family + 0.5 * (oracle - family), oracle)
    assert np.isnan(half["slope"][0]) and np.allclose(half["slope"][1:], 0.5)
    blind = np.sqrt(((oracle - family) ** 2).mean((0, 2)))
    np.testing.assert_allclose(half["rmse"], 0.5 * blind)
    np.testing.assert_allclose(half["rmse_blind"], blind)
    ignores = context_follow(np.broadcast_to(family, oracle.shape), oracle)
    assert np.allclose(ignores["slope"][1:], 0.0) and np.allclose(ignores["rmse"], blind)
