"""Ray evaluation actors: sharded results == in-process results; a killed actor loses no rows."""

from __future__ import annotations

import tempfile

import numpy as np
import pandas as pd
import pytest
import torch

from spice_ray.agents import AgentSpec
from spice_ray.config import FusionConfig, make_config
from spice_ray.data.tasks import generate_tasks
from spice_ray.evaluate import check_rows, evaluate_parallel, evaluate_tasks
from spice_ray.model import SpiceModel
from spice_ray.model.checkpoint import CheckpointError
from spice_ray.model.registry import load_model as build_model
from spice_ray.model.registry import model_payload
from spice_ray.results.schema import ROW_KEY as KEY_COLUMNS

pytestmark = pytest.mark.ray

CFG = make_config("smoke", "bandit")
# Deterministic agents only: sampling ones draw from a per-shard generator.
SPECS = [AgentSpec("spice", FusionConfig()), AgentSpec("dpt", sample=False),
         AgentSpec("ucb"), AgentSpec("lcb")]
PROTOCOLS = ("offline", "online")


@pytest.fixture(scope="module")
def setup():
    torch.set_num_threads(1)
    env = CFG.env
    model = SpiceModel(CFG.model, env.num_actions, env.state_dim, env.horizon + 1,
                       generator=torch.Generator().manual_seed(0)).eval()
    data = generate_tasks(env, CFG.data, "eval", np.arange(6))
    reference = evaluate_tasks(env, CFG.eval, data, SPECS, model, PROTOCOLS, seed=2)
    return model, data, reference


def _sorted(df: pd.DataFrame) -> pd.DataFrame:
    return df.sort_values(list(KEY_COLUMNS)).reset_index(drop=True)


def test_payload_round_trip(setup) -> None:
    model, _, _ = setup
    rebuilt = build_model(model_payload(model), CFG.env)
    for (k, v), (k2, v2) in zip(model.state_dict().items(), rebuilt.state_dict().items(),
                                strict=True):
        assert k == k2 and torch.equal(v, v2)
    with pytest.raises(CheckpointError, match="actions"):
        build_model(model_payload(model), make_config("smoke", "darkroom").env)


def test_checkpoint_path_source(setup, tmp_path) -> None:
    from spice_ray.model.checkpoint import save_checkpoint

    model, _, _ = setup
    path = save_checkpoint(tmp_path / "ckpt", model, CFG, dataset_hash="test", epoch=0)
    rebuilt = build_model(str(path), CFG.env)
    for v, v2 in zip(model.state_dict().values(), rebuilt.state_dict().values(), strict=True):
        assert torch.equal(v, v2)


def test_parallel_equals_in_process(ray_local, setup, tmp_path) -> None:
    from spice_ray.model.checkpoint import save_checkpoint

    model, data, reference = setup
    path = save_checkpoint(tmp_path / "ckpt", model, CFG, dataset_hash="test", epoch=0)
    df = evaluate_parallel(str(path), CFG.env, CFG.eval, data, SPECS, PROTOCOLS,
                           seed=2, num_actors=2)
    # the rows of the two task shards come back in one process's order, not shard by shard
    pd.testing.assert_frame_equal(df.drop(columns="value"), reference.drop(columns="value"))
    np.testing.assert_allclose(df["value"], reference["value"], atol=1e-9)


def test_agents_shared_out_over_actors_equal_in_process(ray_local, setup) -> None:
    """split="specs" (the tuning stage's): each actor runs every task for every other agent;
    the rows are one process's, bit for bit and in its order (each agent runs on the same
    tasks as there, so even the model's batch is the same)."""
    model, data, _ = setup
    grid = [AgentSpec("spice", FusionConfig(beta=b)) for b in (0.5, 1.0, 2.0)] + [
        AgentSpec("ucb"), AgentSpec("dpt", sample=False)]
    want = evaluate_tasks(CFG.env, CFG.eval, data, grid, model, ("final",), seed=2)
    got = evaluate_parallel(model_payload(model), CFG.env, CFG.eval, data, grid, ("final",),
                            seed=2, num_actors=2, split="specs")
    pd.testing.assert_frame_equal(got, want)
    with pytest.raises(ValueError, match="online and final protocols"):
        evaluate_parallel(None, CFG.env, CFG.eval, data, grid, ("offline",), split="specs")


def test_killed_actor_shard_is_rerun_without_loss(ray_local, setup, tmp_path) -> None:
    model, data, reference = setup
    marker = tmp_path / "actor-died"
    df = evaluate_parallel(model_payload(model), CFG.env, CFG.eval, data, SPECS, PROTOCOLS,
                           seed=2, num_actors=2, fail_once_marker=str(marker))
    assert marker.exists()  # one actor did exit mid-run
    check_rows(df, data["task_id"])
    online = df[df.metric == "cumulative_regret"]
    per_row = online.groupby(["method", "config", "task_id", "x"]).size()
    assert (per_row == 1).all()  # every (task, step) exactly once per agent
    assert len(per_row) == 3 * 6 * CFG.eval.online_horizon  # spice, dpt, ucb
    got, want = _sorted(df), _sorted(reference)
    pd.testing.assert_frame_equal(got.drop(columns="value"), want.drop(columns="value"))
    np.testing.assert_allclose(got["value"], want["value"], atol=1e-9)


def test_a_pool_reuses_its_actors_across_evaluations(ray_local, setup, tmp_path) -> None:
    """The stage's pool: the same actor processes serve every call (no start per evaluation),
    give the same rows as fresh actors, and a dead one is replaced without losing a shard."""
    import ray

    from spice_ray.evaluate import EvalPool
    from spice_ray.model.checkpoint import save_checkpoint

    model, data, reference = setup
    path = save_checkpoint(tmp_path / "ckpt", model, CFG, dataset_hash="test", epoch=0)
    with EvalPool() as pool:
        first = evaluate_parallel(str(path), CFG.env, CFG.eval, data, SPECS, PROTOCOLS,
                                  seed=2, num_actors=2, pool=pool)
        pids = sorted(ray.get([a.pid.remote() for a in pool.actors(CFG.eval, 2)]))
        second = evaluate_parallel(str(path), CFG.env, CFG.eval, data, SPECS, PROTOCOLS,
                                   seed=2, num_actors=2, pool=pool)
        assert sorted(ray.get([a.pid.remote() for a in pool.actors(CFG.eval, 2)])) == pids
        marker = tmp_path / "actor-died"
        third = evaluate_parallel(str(path), CFG.env, CFG.eval, data, SPECS, PROTOCOLS,
                                  seed=2, num_actors=2, pool=pool, fail_once_marker=str(marker))
        assert marker.exists()
        after = ray.get([a.pid.remote() for a in pool.actors(CFG.eval, 2)])
        assert len(set(after) - set(pids)) == 1  # the dead actor was replaced, once
    for df in (first, second, third):
        got, want = _sorted(df), _sorted(reference)
        pd.testing.assert_frame_equal(got.drop(columns="value"), want.drop(columns="value"))
        np.testing.assert_allclose(got["value"], want["value"], atol=1e-9)


def test_the_tuning_grid_on_ray_tune_equals_in_process(ray_local, setup, tmp_path,
                                                        monkeypatch) -> None:
    """The tuning stage's points as Ray Tune trials (two points a trial here): each
    experiment's scores come back in grid order, equal to one process's ``score_point``, under
    the checkpoint of each seed (none for a model-free method); a point that cannot be scored
    is an error naming it."""
    import dataclasses

    from spice_ray.evaluate.actors import ModelCache
    from spice_ray.model.checkpoint import save_checkpoint
    from spice_ray.study import tune_grid
    from spice_ray.study.tuning import Candidate, Pending, score_point

    model, data, _ = setup
    path = str(save_checkpoint(tmp_path / "ckpt", model, CFG, dataset_hash="test", epoch=0))
    spice = [Candidate(AgentSpec("spice", FusionConfig(beta=b)), CFG.eval, (("beta", b),))
             for b in (0.5, 1.0, 2.0)]
    ucb = [Candidate(AgentSpec("ucb"), dataclasses.replace(CFG.eval, ucb_c=c), (("c", c),))
           for c in (0.5, 1.0)]

    def pending(name: str, source: str) -> Pending:
        return Pending(name, "inputs", CFG.env, data,
                       [("spice", [spice], {2: source}, (2,)), ("ucb", [ucb], {}, (-1,))],
                       {}, None, [2], 0.09)

    monkeypatch.setattr(tune_grid, "MAX_POINTS_PER_TRIAL", 2)
    assert tune_grid.points_per_trial(tune_grid.TRIAL_STEPS // 3) == 2
    assert tune_grid.points_per_trial(tune_grid.TRIAL_STEPS + 1) == 1
    # on a GPU a trial's points are one batch: as many as a trial takes
    assert tune_grid.points_per_trial(tune_grid.TRIAL_STEPS + 1, gpu=True) == 2  # the most
    assert tune_grid.chunks_of([0, 0, 0, 1, 1, 1], [2, 3]) == [[0, 1], [2], [3, 4, 5]]
    done, seen = {}, []
    monkeypatch.setattr(tune_grid, "MAX_FAILURES", 0)  # each re-run starts a process
    run, system = tmp_path / "run", tmp_path / "system-temp"
    run.mkdir()
    system.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(system))  # where the scratch went before

    def on_done(i, scores):  # Tune's experiment is written inside the run, nowhere else
        seen.append(sorted(p.name.split("-")[0] for p in run.iterdir()))
        done.setdefault(i, scores)

    with pytest.raises(RuntimeError, match=r"tuning b: 4 of 10 grid points have no score, "
                       r"the first SPICE at \{'beta': 0.5\} \(.*CheckpointError: .*missing/"
                       r"meta.json does not exist"):
        tune_grid.score_grid([pending("a", path), pending("b", str(tmp_path / "missing"))],
                             CFG.eval, on_done, scratch=run)
    assert seen == [[".tuning"]] and list(run.iterdir()) == []
    # (wandb, a [test] extra, makes its media and artifact folders there when Tune imports it)
    assert [p.name for p in system.iterdir() if "wandb" not in p.name] == []
    models = ModelCache()
    want = pd.DataFrame([{"method": c.key[0], "config": c.key[1],
                          **score_point(c, sources, seeds, CFG.env, data, models)}
                         for c, sources, seeds in pending("a", path).points()])
    assert sorted(done) == [0]  # "a" had all its scores before "b" failed
    pd.testing.assert_frame_equal(done[0], want)
