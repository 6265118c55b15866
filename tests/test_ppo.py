"""The single-task PPO reference (stable-baselines3, an optional extra), on Darkroom."""

from __future__ import annotations

import json
import logging
import sys
import tempfile

import numpy as np
import pandas as pd
import pytest
import torch

pytest.importorskip("stable_baselines3")

from spice_ray.config import make_config  # noqa: E402
from spice_ray.data.tasks import generate_tasks  # noqa: E402
from spice_ray.envs import darkroom  # noqa: E402
from spice_ray.evaluate.ppo import ppo_rows, task_seed, train_ppo  # noqa: E402
from spice_ray.evaluate.rows import duplicate_keys  # noqa: E402
from spice_ray.results.schema import ROW_COLUMNS  # noqa: E402

SMALL = {"n_steps": 32, "batch_size": 16, "n_epochs": 1}


@pytest.fixture(scope="module")
def setup():
    torch.set_num_threads(1)
    cfg = make_config("smoke", "darkroom")
    data = generate_tasks(cfg.env, cfg.data, "eval", np.arange(2))
    return cfg, data


@pytest.fixture(scope="module")
def rows(setup):
    cfg, data = setup
    return ppo_rows(data, cfg.env, cfg.eval, episodes=2, seed=0, ppo_kwargs=SMALL)


def _curve(df, metric, episode):
    sub = df[(df.metric == metric)
             & (df.config.map(lambda c: json.loads(c)["episode"]) == episode)]
    return np.stack([g.sort_values("x")["value"].to_numpy()
                     for _, g in sub.groupby("task_id", sort=True)])  # (B, H)


def test_rows(setup, rows):
    cfg, data = setup
    H = cfg.eval.online_horizon
    assert tuple(rows.columns) == ROW_COLUMNS
    assert duplicate_keys(rows).empty
    assert set(rows.method) == {"PPO"} and set(rows.rule) == {"ppo"}
    assert set(rows.env) == {"darkroom"} and set(rows.seed) == {0}
    assert set(rows.metric) == {"cumulative_regret", "cumulative_return"}
    assert set(rows.task_id) == {0, 1}
    assert set(rows.x) == set(range(1, H + 1))
    configs = [json.loads(c) for c in sorted(set(rows.config))]
    assert [c["episode"] for c in configs] == [1, 2]
    for c in configs:
        assert c["budget_episodes"] == 2 and c["total_timesteps"] == 2 * H
        assert c["ppo"] == SMALL
    assert len(rows) == 2 * 2 * 2 * H  # episodes x metrics x tasks x steps

    best = np.cumsum(darkroom.optimal_rewards(cfg.environment().eval_tasks(data), H), 1)
    for episode in (1, 2):
        regret = _curve(rows, "cumulative_regret", episode)
        ret = _curve(rows, "cumulative_return", episode)
        assert np.all(np.diff(regret, axis=1) >= 0)  # r_t <= r*_t: regret never decreases
        assert np.all(np.diff(ret, axis=1) >= 0) and np.all(ret[:, 0] >= 0)
        np.testing.assert_allclose(regret + ret, best)  # regret = optimal return - return


def test_same_seed_same_rows_and_rewards_match(setup, rows):
    cfg, data = setup
    again = ppo_rows(data, cfg.env, cfg.eval, episodes=2, seed=0, ppo_kwargs=SMALL)
    pd.testing.assert_frame_equal(rows, again)
    # rows come from the rewards of the training run itself, episode by episode
    H = cfg.eval.online_horizon
    tasks = cfg.environment().eval_tasks(data)
    states, actions, r = train_ppo(cfg.environment(), tasks, 1, H, 2, task_seed(0, 1), SMALL)
    assert r.shape == (2 * H,) and actions.shape == (2 * H,) and states.shape == (2 * H, 2)
    np.testing.assert_array_equal(states[0], tasks.starts[1])  # episodes start at the start
    for episode, ep in ((1, r[:H]), (2, r[H:])):
        np.testing.assert_array_equal(_curve(rows, "cumulative_return", episode)[1],
                                      np.cumsum(ep))


def test_one_episode_global_rng_and_bad_kwargs(setup, caplog, tmp_path, monkeypatch):
    cfg, data = setup
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # SB3's default log folder root
    state = np.random.get_state()[1].copy()  # noqa: NPY002
    torch_state = torch.get_rng_state()
    with caplog.at_level(logging.WARNING, logger="spice_ray.evaluate.ppo"):
        one = ppo_rows({k: v[:1] for k, v in data.items()}, cfg.env, cfg.eval,
                                episodes=1, seed=3)  # SB3 defaults: n_steps=2048
    assert "never updated" in caplog.text
    # SB3's reseeding of the global generators is undone
    np.testing.assert_array_equal(np.random.get_state()[1], state)  # noqa: NPY002
    assert torch.equal(torch.get_rng_state(), torch_state)
    assert [json.loads(c)["episode"] for c in set(one.config)] == [1]
    assert json.loads(one.config.iloc[0])["ppo"] == {}
    assert set(one.seed) == {3} and len(one) == 2 * cfg.eval.online_horizon
    with pytest.raises(ValueError, match="seed"):
        ppo_rows(data, cfg.env, cfg.eval, episodes=1, ppo_kwargs={"seed": 1})
    assert list(tmp_path.iterdir()) == []  # no empty SB3-<date> log folders left behind


def test_missing_sb3_message(setup, monkeypatch):
    cfg, data = setup
    monkeypatch.setitem(sys.modules, "stable_baselines3", None)
    with pytest.raises(ImportError, match=r"pip install -e '\.\[ppo\]'"):
        ppo_rows(data, cfg.env, cfg.eval, episodes=1)
