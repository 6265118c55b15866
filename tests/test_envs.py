"""Environment semantics: bandit rewards and regret, darkroom walls, goal reward, optimal path."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from spice_ray.common.rng import TaskStreams
from spice_ray.config import make_config
from spice_ray.envs import bandit, darkroom
from spice_ray.envs.gym import TaskEnv


def test_bandit_step_regret_and_optimum() -> None:
    tasks = bandit.BanditTasks(np.array([[0.1, 0.9, 0.5], [0.7, 0.2, 0.3]]), sigma=0.5)
    assert bandit.optimal_action(tasks).tolist() == [1, 0]
    r = bandit.step(tasks, np.array([2, 1]), noise=np.array([0.0, 2.0]))
    np.testing.assert_allclose(r, [0.5, 0.2 + 0.5 * 2.0])
    np.testing.assert_allclose(bandit.regret(tasks, np.array([[1, 2], [1, 0]])),
                               [[0.0, 0.4], [0.5, 0.0]])
    np.testing.assert_allclose(bandit.optimal_rewards(tasks, 3), [[0.9] * 3, [0.7] * 3])
    assert bandit.reset(tasks).shape == (2, 1) and not bandit.reset(tasks).any()


def test_bandit_sampling_is_uniform_and_keyed() -> None:
    streams = TaskStreams.from_seed(0, "train", np.arange(20_000))
    tasks = bandit.sample_tasks(streams, 5, 0.3)
    assert tasks.means.min() >= 0 and tasks.means.max() < 1
    assert abs(tasks.means.mean() - 0.5) < 0.01 and abs(tasks.means.var() - 1 / 12) < 0.002
    # task 7's means do not depend on which other tasks are drawn with it
    alone = bandit.sample_tasks(TaskStreams.from_seed(0, "train", np.array([7])), 5, 0.3)
    np.testing.assert_array_equal(alone.means[0], tasks.means[7])


def test_darkroom_walls_goal_and_stay() -> None:
    tasks = darkroom.DarkroomTasks(goals=np.array([[0, 0], [5, 5], [9, 9]]),
                                   starts=np.array([[0, 0], [4, 5], [9, 9]]), size=10)
    states = darkroom.reset(tasks)
    # -x at the wall stays put; +x from (4,5) reaches the goal (5,5); +y at y=9 is clipped.
    nxt, rew = darkroom.step(tasks, states, np.array([1, 0, 2]))
    assert nxt.tolist() == [[0, 0], [5, 5], [9, 9]]
    assert rew.tolist() == [1.0, 1.0, 1.0]  # reward when the state after the step is the goal
    nxt2, rew2 = darkroom.step(tasks, nxt, np.array([0, 0, 3]))
    assert nxt2.tolist() == [[1, 0], [6, 5], [9, 8]] and rew2.tolist() == [0.0, 0.0, 0.0]
    # every action's move
    centre = darkroom.DarkroomTasks(np.array([[0, 0]] * 5), np.array([[3, 3]] * 5))
    moved, _ = darkroom.step(centre, centre.starts, np.arange(5))
    assert moved.tolist() == [[4, 3], [2, 3], [3, 4], [3, 2], [3, 3]]


def test_darkroom_optimal_policy_and_reward_sequence() -> None:
    goals = np.array([[2, 3], [0, 0], [9, 0]])
    starts = np.array([[0, 0], [0, 0], [0, 9]])
    tasks = darkroom.DarkroomTasks(goals, starts)
    h = 25
    expected = darkroom.optimal_rewards(tasks, h)
    # distance 5 -> reward from step 5 on; on the goal -> reward at every step; distance 18.
    assert expected[0].tolist() == [0.0] * 4 + [1.0] * 21
    assert expected[1].tolist() == [1.0] * h
    assert expected[2].tolist() == [0.0] * 17 + [1.0] * 8
    # following optimal_action collects exactly that sequence
    states = darkroom.reset(tasks)
    got = np.zeros((3, h))
    for t in range(h):
        states, got[:, t] = darkroom.step(tasks, states, darkroom.optimal_action(tasks, states))
    np.testing.assert_array_equal(got, expected)
    assert darkroom.optimal_action(tasks, goals).tolist() == [4, 4, 4]


def test_goal_split_is_fixed_and_disjoint() -> None:
    train, test = darkroom.goal_split(10, 0.8, seed=0)
    assert train.shape == (80, 2) and test.shape == (20, 2)
    cells = {tuple(c) for c in train} | {tuple(c) for c in test}
    assert len(cells) == 100
    train2, test2 = darkroom.goal_split(10, 0.8, seed=0)
    np.testing.assert_array_equal(test, test2)
    _, test3 = darkroom.goal_split(10, 0.8, seed=1)
    assert not np.array_equal(test, test3)


def test_darkroom_goals_split_70_10_20_and_the_test_goals_do_not_move() -> None:
    """Validation goals are disjoint from training and test goals; holding them out leaves the
    20 test goals of the 80/20 split as they were; val_goal_fraction=0 is the paper's reading
    (validation shares the training goals)."""
    from spice_ray.config import make_config

    splits = darkroom.split_goals(10, 0.8, 0.1, seed=0)
    sets = {k: {tuple(c) for c in v} for k, v in splits.items()}
    assert {k: len(v) for k, v in sets.items()} == {"train": 70, "validation": 10, "eval": 20}
    assert len(sets["train"] | sets["validation"] | sets["eval"]) == 100
    np.testing.assert_array_equal(splits["eval"], darkroom.goal_split(10, 0.8, 0)[1])
    paper = darkroom.split_goals(10, 0.8, 0.0, seed=0)
    np.testing.assert_array_equal(paper["train"], paper["validation"])
    env = make_config("smoke", "darkroom").environment()
    goals = env.sample_tasks(TaskStreams.from_seed(0, "validation", np.arange(2000)),
                             "validation").goals
    assert {tuple(g) for g in goals} == sets["validation"]
    with pytest.raises(Exception, match="val_goal_fraction"):
        make_config("smoke", "darkroom", overrides=["env.val_goal_fraction=0.9"])


def test_rollout_states_are_trajectories() -> None:
    streams = TaskStreams.from_seed(3, "train", np.arange(50))
    train, _ = darkroom.goal_split(10, 0.8, 0)
    tasks = darkroom.sample_tasks(streams, train, 10)
    actions = streams.integers("a", 5, (30,))
    states, rewards = darkroom.rollout_states(tasks, tasks.starts, actions)
    for t in range(30):
        nxt, r = darkroom.step(tasks, states[:, t], actions[:, t])
        np.testing.assert_array_equal(nxt, states[:, t + 1])
        np.testing.assert_array_equal(r, rewards[:, t])


def test_uniform_rollin_draws_independent_cells_with_their_moves_and_rewards() -> None:
    """The DPT paper's roll-in: every transition from its own cell, first cell = the start."""
    cfg = make_config("smoke", "darkroom", overrides=["env.rollin=uniform", "env.horizon=100",
                                                       "data.label=optimal"])
    env = cfg.environment()
    streams = TaskStreams.from_seed(0, "eval", np.arange(400))
    data = env.generate(cfg.data, "eval", streams)
    assert [c.name for c in env.columns()][2:4] == ["states", "next_states"]
    assert all(data[c.name].shape[1:] == c.shape for c in env.columns() if c.name != "task_id")
    tasks = env.sample_tasks(streams, "eval")
    np.testing.assert_array_equal(data["states"][:, 0], tasks.starts)
    np.testing.assert_array_equal(data["next_states"],
                                  darkroom.move(data["states"], data["actions"], 10))
    np.testing.assert_array_equal(data["rewards"],
                                  np.all(data["next_states"] == data["goal"][:, None], -1))
    encoded = env.encode(data)
    np.testing.assert_array_equal(encoded.next_states, data["next_states"])
    # independent cells: the goal shows in 1 - (1 - ~1/100)^100 ~ 63% of contexts, a walk's in
    # about a third; and the same keys give the same bytes
    assert 0.57 < (data["rewards"].sum(1) > 0).mean() < 0.70
    again = env.generate(cfg.data, "eval", TaskStreams.from_seed(0, "eval", np.arange(400)))
    assert all(np.array_equal(data[k], again[k]) for k in data)
    with pytest.raises(Exception, match="env.rollin"):
        make_config("smoke", "darkroom", overrides=["env.rollin=teleport"])


def test_gymnasium_wrappers() -> None:
    band = make_config("smoke", "bandit", overrides=["env.num_arms=2"]).environment()
    env = TaskEnv(band, bandit.BanditTasks(np.array([[0.2, 0.8]]), 0.0), 0, horizon=3)
    obs, _ = env.reset(seed=0)
    assert obs.tolist() == [0.0] and env.action_space.n == 2
    _, r, term, trunc, info = env.step(0)
    assert r == pytest.approx(0.2) and info["regret"] == pytest.approx(0.6)
    env.step(1)
    assert env.step(1)[3] is True  # truncated at the horizon
    room = make_config("smoke", "darkroom").environment()
    tasks = darkroom.DarkroomTasks(np.array([[1, 0]]), np.array([[0, 0]]), 10)
    dr = TaskEnv(room, tasks, 0, horizon=2)
    obs, _ = dr.reset(seed=0)
    obs, r, _, trunc, info = dr.step(0)
    assert obs.tolist() == [1, 0] and r == 1.0 and not trunc and info["regret"] == 0.0
    _, r, _, trunc, info = dr.step(1)  # leaves the goal: the walker stays, regret 1
    assert r == 0.0 and trunc and info["regret"] == 1.0


def test_gymnasium_spaces_are_bounded_checked_and_grids_render() -> None:
    """Gymnasium's own checker passes on every environment; cell states have their grid's
    bounds and a bandit's its one zero state; the darkrooms draw an RGB grid (goal green,
    agent white, visited cells lighter), and a stateless environment refuses to."""
    import gymnasium
    from gymnasium.utils.env_checker import check_env

    from spice_ray.envs.base import names

    for name in names():
        check_env(gymnasium.make(f"spice_ray/{name}-v0", preset="smoke", task=2).unwrapped,
                  skip_render_check=False)
    space = gymnasium.make("spice_ray/darkroom-v0", preset="smoke").observation_space
    assert (space.low.tolist(), space.high.tolist()) == ([0.0, 0.0], [9.0, 9.0])
    # the episode's length is stated (it was None): the task's horizon, whatever sets it
    assert gymnasium.make("spice_ray/darkroom-v0", preset="smoke").spec.max_episode_steps \
        == make_config("smoke", "darkroom").env.horizon == 20
    short = gymnasium.make("spice_ray/bandit-v0", preset="smoke", horizon=7)
    assert short.spec.max_episode_steps == 7
    short.reset(seed=0)
    ends = [short.step(0)[2:4] for _ in range(7)]  # (terminated, truncated) per step
    assert ends == [(False, False)] * 6 + [(False, True)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no checker warning on make (a zero-width box was one)
        space = gymnasium.make("spice_ray/bandit-v0", preset="smoke").observation_space
    assert (space.low.tolist(), space.high.tolist()) == ([0.0], [1.0])
    room = make_config("smoke", "darkroom").environment()
    env = TaskEnv(room, darkroom.DarkroomTasks(np.array([[3, 1]]), np.array([[0, 0]]), 10), 0,
                  horizon=5, render_mode="rgb_array")
    env.reset(seed=0)
    env.step(0)  # (0, 0) -> (1, 0)
    img = env.render()
    assert img.shape == (160, 160, 3) and img.dtype == np.uint8

    def cell(x: int, y: int) -> list[int]:  # the image's rows run from y = 9 down
        return img[(9 - y) * 16 + 8, x * 16 + 8].tolist()

    assert cell(3, 1) == [40, 170, 60] and cell(1, 0) == [235, 235, 235]
    assert cell(0, 0) == [90, 90, 90] and cell(5, 5) == [40, 40, 40]
    assert TaskEnv(room, env.tasks, 0).render() is None
    with pytest.raises(ValueError, match="needs a grid environment; bandit"):
        gymnasium.make("spice_ray/bandit-v0", preset="smoke", render_mode="rgb_array")


def test_every_environment_is_a_registered_gymnasium_env() -> None:
    """gymnasium.make gives the study's own task: the same means / goal and start as row
    ``task`` of the dataset split at that preset."""
    import gymnasium

    from spice_ray.config import make_config
    from spice_ray.data.tasks import generate_tasks
    from spice_ray.envs.base import names
    from spice_ray.envs.gym import register_gym_envs

    assert register_gym_envs() == [f"spice_ray/{n}-v0" for n in names()]
    env = gymnasium.make("spice_ray/darkroom-v0", task=3, preset="smoke")
    obs, _ = env.reset(seed=0)
    cfg = make_config("smoke", "darkroom")
    want = generate_tasks(cfg.env, cfg.data, "eval", np.array([3]))
    np.testing.assert_array_equal(obs, want["states"][0, 0] * 0 + env.unwrapped._state[0])
    assert tuple(env.unwrapped.tasks.goals[0]) == tuple(want["goal"][0])
    for name in names():
        e = gymnasium.make(f"spice_ray/{name}-v0", preset="smoke", task=1)
        e.reset(seed=1)
        _, reward, terminated, truncated, info = e.step(e.action_space.sample())
        assert np.isfinite(reward) and np.isfinite(info["regret"]) and not terminated


def test_a_vector_env_plays_consecutive_tasks_each_as_its_own_env() -> None:
    """gymnasium.make_vec gives tasks task, task + 1, ... (not copies of one), and each
    sub-environment steps exactly as the single environment of its task seeded s + i."""
    import gymnasium

    import spice_ray.envs.gym  # noqa: F401  (registers the ids)

    vec = gymnasium.make_vec("spice_ray/bandit-v0", num_envs=3, task=2, preset="smoke")
    obs, _ = vec.reset(seed=5)
    assert obs.shape == (3, 1) and vec.single_action_space.n == 5
    actions = np.array([0, 3, 4])
    _, rewards, _, _, infos = vec.step(actions)
    for i in range(3):
        one = gymnasium.make("spice_ray/bandit-v0", task=2 + i, preset="smoke")
        one.reset(seed=5 + i)
        _, r, _, _, info = one.step(int(actions[i]))
        assert rewards[i] == r and infos["regret"][i] == info["regret"]
    means = [gymnasium.make("spice_ray/bandit-v0", task=t, preset="smoke").unwrapped.tasks.means
             for t in (2, 3)]
    assert not np.array_equal(means[0], means[1])  # two tasks, not one task twice
    with pytest.raises(ValueError, match="num_envs must be >= 1, not 0"):
        gymnasium.make_vec("spice_ray/bandit-v0", num_envs=0, preset="smoke")


def test_import_spice_ray_registers_every_environment_with_gymnasium() -> None:
    """``gymnasium.make("spice_ray/bandit-v0")`` after a plain ``import spice_ray`` (it was a
    NamespaceNotFound: ``import spice_ray.envs.gym`` was needed), in a fresh interpreter."""
    import subprocess
    import sys

    from spice_ray.common.gym_ids import GYM_ENVS
    from spice_ray.envs.base import names

    assert set(GYM_ENVS) == set(names())
    code = ("import gymnasium, spice_ray; "
            "env = gymnasium.make('spice_ray/bandit-v0', preset='smoke', task=1); "
            "obs, _ = env.reset(seed=0); print(env.action_space.n)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "5"


def test_an_environment_registered_later_gets_its_gymnasium_id() -> None:
    """A plugin's environment class, registered after ``import spice_ray``, is made by
    ``gymnasium.make`` under its own id (``register_gym_envs`` returned the id but never
    registered it), at the scales its own ``presets`` declare."""
    import dataclasses

    import gymnasium

    from spice_ray.envs import base
    from spice_ray.envs.bandit import Bandit
    from spice_ray.envs.gym import register_gym_envs

    toy = type("ToyBandit", (Bandit,), {"name": "toy_bandit", "presets": {
        "smoke": {"env": {"horizon": 12}, "data": {"num_eval_tasks": 8},
                  "eval": {"num_tasks": 8, "online_horizon": 12, "offline_points": 6}}}})
    env_id = "spice_ray/toy_bandit-v0"
    assert env_id not in gymnasium.registry
    try:
        base.register(toy)
        assert env_id in gymnasium.registry and env_id in register_gym_envs()
        env = gymnasium.make(env_id, preset="smoke", task=1)
        obs, _ = env.reset(seed=0)
        assert env.unwrapped.env.name == "toy_bandit" and env.action_space.n == 5
        assert dataclasses.is_dataclass(toy.Params)
        # its own presets, in its one file: the smoke scale it declares, the paper's elsewhere
        from spice_ray.config import make_config

        smoke = make_config("smoke", "toy_bandit")
        assert (smoke.env.horizon, smoke.data.num_eval_tasks) == (12, 8)
        assert env.spec.max_episode_steps == 12  # the task's horizon, from that preset
        # no small entry of its own: the nearest base's, as it inherits the bandit's defaults
        small, bandit = make_config("small", "toy_bandit"), make_config("small", "bandit")
        assert (small.env.horizon, small.data.num_train_tasks, small.model.n_layer) == \
            (bandit.env.horizon, bandit.data.num_train_tasks, bandit.model.n_layer)
        # a package environment keeps its PRESETS entry
        assert make_config("smoke", "bandit").env.horizon == 24
    finally:
        base._REGISTRY.pop("toy_bandit", None)
        gymnasium.registry.pop(env_id, None)


def test_a_gymnasium_task_takes_a_runs_config_and_names_what_is_wrong(tmp_path) -> None:
    """run_dir= builds the task from the run's own experiment config (its overrides
    included), so a user does not repeat the preset and the --set flags by hand."""
    import gymnasium

    import spice_ray.envs.gym  # noqa: F401  (registers the ids)
    from spice_ray.config import make_config

    run = tmp_path / "run"
    cfg = make_config("smoke", "bandit", overrides=["env.num_arms=7"])
    cfg.write(run / "configs", "bandit.yaml")
    make_config("smoke", "darkroom", overrides=["env.grid_size=6"]).write(run / "configs",
                                                                          "darkroom.yaml")
    make_config("smoke", "darkroom").write(run / "configs", "darkroom_dpt_star.yaml")
    env = gymnasium.make("spice_ray/bandit-v0", task=2, run_dir=str(run))
    assert env.action_space.n == 7  # the run's override, not the preset's 5 arms
    want = gymnasium.make("spice_ray/bandit-v0", task=2, preset="smoke")
    assert want.action_space.n == 5
    one = gymnasium.make("spice_ray/darkroom-v0", task=1, run_dir=str(run),
                         experiment="darkroom_dpt_star")
    assert one.unwrapped.env.name == "darkroom"
    for kwargs, match in [
            ({"run_dir": str(run), "preset": "smoke"}, "preset='smoke' and run_dir= both"),
            ({"experiment": "bandit"}, "give run_dir= too"),
            ({"run_dir": str(run), "experiment": "nope"}, "nope.yaml does not exist")]:
        with pytest.raises(ValueError, match=match):
            gymnasium.make("spice_ray/bandit-v0", **kwargs)
    # several experiments on the environment: the one named after it (the README's example
    # on a full study), else the user names one
    own = gymnasium.make("spice_ray/darkroom-v0", task=1, run_dir=str(run))
    assert own.unwrapped.env.params.grid_size == 6 != one.unwrapped.env.params.grid_size
    (run / "configs" / "darkroom.yaml").rename(run / "configs" / "darkroom_b.yaml")
    with pytest.raises(ValueError, match="2 experiment.s. on environment 'darkroom': darkroom_b, "
                                         "darkroom_dpt_star; name one with experiment="):
        gymnasium.make("spice_ray/darkroom-v0", run_dir=str(run))
    with pytest.raises(ValueError, match="runs environment 'bandit', not 'darkroom'"):
        gymnasium.make("spice_ray/darkroom-v0", run_dir=str(run), experiment="bandit")
    with pytest.raises(ValueError, match="no experiment.s. on environment 'linear_bandit'"):
        gymnasium.make("spice_ray/linear_bandit-v0", run_dir=str(run))
