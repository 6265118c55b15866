"""Epsilon-greedy, added from outside the package (``examples/epsilon_greedy``, a plugin by
entry point): the registry finds it, it explores at the rate it says, it runs through the same
online protocol as every agent, and an installed plugin runs through the first-hour
example's smoke study."""

from __future__ import annotations

import dataclasses
import importlib
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from docs_blocks import PLUGIN_DIR, PLUGIN_MODULE, example_plugin_env

from spice_ray.agents import METHODS, AgentSpec, make_agent
from spice_ray.common.rng import StepDraws, TaskStreams
from spice_ray.config import EvalConfig, make_config
from spice_ray.data.tasks import generate_tasks
from spice_ray.evaluate import evaluate
from spice_ray.evaluate.online import online_rows
from spice_ray.results.tables import load
from spice_ray.study import experiments

ROOT = Path(__file__).resolve().parents[1]
MODULE = PLUGIN_MODULE


@pytest.fixture(scope="module", autouse=True)
def plugin_module():
    """The example's module imported here, and every registry it touched restored after, so
    no other test sees its agent, its environment or its rows."""
    import gymnasium

    from spice_ray.envs import base

    methods, exps = dict(METHODS), dict(experiments.EXPERIMENTS)
    sys.path.insert(0, str(PLUGIN_DIR))
    try:
        yield importlib.import_module(MODULE)
    finally:
        sys.path.remove(str(PLUGIN_DIR))
        sys.modules.pop(MODULE, None)
        METHODS.clear()
        METHODS.update(methods)
        experiments.EXPERIMENTS.clear()
        experiments.EXPERIMENTS.update(exps)
        base._REGISTRY.pop("sparse_bandit", None)
        gymnasium.registry.pop("spice_ray/sparse_bandit-v0", None)


@pytest.fixture
def EpsilonGreedy(plugin_module):  # noqa: N802 -- the class, named as the tests use it
    return plugin_module.EpsilonGreedy


def test_registered_by_its_own_module_and_built_by_make_agent(EpsilonGreedy) -> None:
    env = make_config("smoke", "bandit").environment()
    spec = AgentSpec("epsilon-greedy")
    assert METHODS["epsilon-greedy"].label == spec.label == "Epsilon-greedy"
    assert isinstance(make_agent(spec, env), EpsilonGreedy)
    assert spec.config_dict(EvalConfig()) == {"epsilon": 0.1}
    assert spec.applies_to(env) and not spec.applies_to(make_config("smoke", "darkroom")
                                                          .environment())


def test_its_declared_epsilon_is_a_tuning_grid_with_no_method_named(plugin_module) -> None:
    """The plugin declares its option (``Tunable``): the tuning stage's grid is its four
    epsilons, each written to the config column and built into the agent; an option the
    method does not declare, or a malformed declaration, is refused by name."""
    from spice_ray.agents import Tunable
    from spice_ray.study.tuning import candidates

    cfg = make_config("smoke", "bandit")
    env = cfg.environment()
    grid = candidates(AgentSpec("epsilon-greedy"), cfg.eval)
    assert [c.setting for c in grid] == [(("epsilon", e),) for e in plugin_module.EPSILONS]
    assert [c.key[1] for c in grid] == [f'{{"epsilon":{e}}}' for e in plugin_module.EPSILONS]
    assert [make_agent(c.spec, env).epsilon for c in grid] == list(plugin_module.EPSILONS)
    assert AgentSpec("epsilon-greedy").option("epsilon") == plugin_module.EPSILON
    with pytest.raises(ValueError, match="options: 'eps' is not an option of 'epsilon-greedy'"):
        AgentSpec("epsilon-greedy", options=(("eps", 0.3),))
    with pytest.raises(ValueError, match="field='train.lr' is invalid"):
        Tunable("lr", (1e-3,), "train.lr")
    with pytest.raises(ValueError, match="an option needs its default"):
        Tunable("epsilon", (0.1,))


def test_explores_uniformly_at_rate_epsilon(EpsilonGreedy) -> None:
    """Arm 2 is the best mean of every task once each arm is seen: the agent takes it with
    probability 1 - eps + eps / A and each other arm with eps / A."""
    tasks, arms, eps = 20_000, 4, 0.2
    agent = EpsilonGreedy(eps)
    agent.reset(tasks, arms, StepDraws(TaskStreams.from_seed(0, "eval", np.arange(tasks)), "a"))
    for arm in range(arms):  # each arm once, arm 2 the best
        agent.observe(torch.full((tasks,), arm), torch.full((tasks,), 1.0 if arm == 2 else 0.0))
    picks = agent.act(arms).numpy()
    share = np.bincount(picks, minlength=arms) / tasks
    expected = np.full(arms, eps / arms)
    expected[2] += 1 - eps
    np.testing.assert_allclose(share, expected, atol=4 * np.sqrt(0.25 / tasks))
    # keyed draws: the same seed gives the same actions
    again = EpsilonGreedy(eps)
    again.reset(tasks, arms, StepDraws(TaskStreams.from_seed(0, "eval", np.arange(tasks)), "a"))
    for arm in range(arms):
        again.observe(torch.full((tasks,), arm), torch.full((tasks,), 1.0 if arm == 2 else 0.0))
    np.testing.assert_array_equal(again.act(arms).numpy(), picks)


def test_runs_through_the_online_protocol_far_below_random() -> None:
    cfg = make_config("smoke", "bandit", overrides=["env.horizon=200",
                                                    "eval.online_horizon=200"])
    data = generate_tasks(cfg.env, cfg.data, "eval", np.arange(64))
    rows = online_rows(cfg.env, cfg.eval, data, [AgentSpec("epsilon-greedy"),
                                                 AgentSpec("random")])
    final = rows[(rows["x"] == 200) & (rows["metric"] == "cumulative_regret")]
    by = final.groupby("method")["value"].mean()
    assert 0 < by["Epsilon-greedy"] < 0.5 * by["Random"]
    configs = set(final[final["method"] == "Epsilon-greedy"]["config"])
    assert configs == {'{"epsilon":0.1,"sigma":0.3}'}


def test_the_plugin_adds_its_rows_to_the_bandit_experiment_and_evaluates_in_process() -> None:
    bandit = experiments.EXPERIMENTS["bandit"]
    assert "epsilon-greedy" in bandit.tuned
    online = next(t for t in bandit.tables if t.name == "bandit_online")
    assert online.rows[-1].evaluation == "epsilon-greedy"
    with pytest.raises(ValueError, match="table 'nope' is invalid"):
        experiments.add_evaluation("bandit", experiments.Evaluation(
            "other", lambda cfg: [], ("online",)), tables=("nope",))
    rows = evaluate(["epsilon-greedy", "random"], env="bandit", num_tasks=32,
                    overrides=["env.horizon=200", "eval.online_horizon=200"])
    final = rows[(rows["x"] == 200) & (rows["metric"] == "cumulative_regret")]
    by = final.groupby("method")["value"].mean()
    assert 0 < by["Epsilon-greedy"] < 0.5 * by["Random"]


def test_its_task_family_runs_as_the_packages_do(plugin_module) -> None:
    """The plugin's environment, in its one file: registered with its own presets, made by
    gymnasium.make, its tasks drawn from its own prior (one arm 0.5 above U[0, 0.5]), scored
    in-process, and an experiment of its own that the study plans like the bandit's."""
    import gymnasium

    from spice_ray.study import plan_study

    cfg = make_config("smoke", "sparse_bandit")
    assert (cfg.env.name, cfg.env.horizon, cfg.data.num_train_tasks) == ("sparse_bandit", 24, 96)
    # the bandit's scales, declared nowhere in the plugin: every section but the name equal
    bandit = make_config("smoke", "bandit")
    assert dataclasses.replace(cfg, env=dataclasses.replace(cfg.env, name="bandit")) == bandit
    env = gymnasium.make("spice_ray/sparse_bandit-v0")
    assert env.unwrapped.env.name == "sparse_bandit" and env.action_space.n == 5
    data = generate_tasks(cfg.env, cfg.data, "eval", np.arange(64))
    means = np.sort(data["means"], axis=1)
    assert (means[:, -1] >= 0.5).all() and (means[:, :-1] < 0.5).all()
    rows = evaluate(["epsilon-greedy", "ucb", "random"], env="sparse_bandit", num_tasks=32,
                    overrides=["env.horizon=200", "eval.online_horizon=200"])
    final = rows[(rows["x"] == 200) & (rows["metric"] == "cumulative_regret")]
    by = final.groupby("method")["value"].mean()
    assert by["UCB"] < by["Epsilon-greedy"] < 0.5 * by["Random"]
    exp = experiments.EXPERIMENTS["sparse_bandit"]
    assert exp.env == "sparse_bandit" and "epsilon-greedy" in exp.tuned
    plan = plan_study("smoke", None, experiments=("sparse_bandit",))
    assert plan.configs["sparse_bandit"].env.name == "sparse_bandit"


@pytest.mark.ray
def test_the_first_hour_example_runs_with_an_installed_plugin(tmp_path) -> None:
    """examples/first_hour.py end to end (the study, a re-run with another config refused and
    then kept beside it with --variant, the tuned policy's predict on a gymnasium.make env of
    the run, a LaTeX table, a PDF figure, save_pretrained with a model card), with the plugin
    installed, so one smoke study
    also shows tuning, evaluation, a table, a figure and the report taking an agent no file
    under spice_ray/ names: the driver and every Ray actor load it by its entry point."""
    env = example_plugin_env(tmp_path / "site")
    run = tmp_path / "run"
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "first_hour.py"), "--out",
                           str(run)], env=env, capture_output=True, text=True, timeout=600,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert proc.stderr.strip() == "", proc.stderr[-3000:]  # no warning on the way either
    out = proc.stdout
    assert "refused: error: bad config: " in out and "fusion.noise_var: on disk 0.09, " \
        "requested 0.04" in out
    assert "--variant nv4: bandit--nv4_* tables beside bandit_*, one report with both" in out
    assert (run / "results" / "bandit--nv4_tuned.parquet").is_file()
    assert re.search(r"tuned on validation: beta=\S+", out)
    assert re.search(r"eval task 0: cumulative regret \d+\.\d\d over 24 steps", out)
    tex = (run / "bandit_tuned.tex").read_text()
    assert r"Method & Cumulative regret & Tasks \\" in tex and "beta\\_schedule" not in tex
    assert "Epsilon-greedy" in tex
    card = (run / "policy" / "README.md").read_text()
    assert "| SPICE | cumulative_regret at step 24 |" in card
    # the plugin's rows, in every place the study writes
    assert not list((ROOT / "spice_ray").rglob("*epsilon*"))
    for table in ("bandit_online", "bandit_tuned"):
        df = load(run, table)
        assert (df["method"] == "Epsilon-greedy").any(), table
    tuned = json.loads((run / "results" / "tuning.json").read_text())["bandit"]["methods"]
    eps = tuned["Epsilon-greedy"]
    assert [r["setting"] for r in eps["grid"]] == [{"epsilon": e} for e in (0.02, 0.05, 0.1, 0.2)]
    chosen = json.dumps(eps["chosen"], separators=(",", ":"))[1:-1]  # '"epsilon":0.05'
    configs = set(load(run, "bandit_tuned").query("method == 'Epsilon-greedy'")["config"])
    assert len(configs) == 1 and chosen in configs.pop()
    assert "Epsilon-greedy" in (run / "report.md").read_text()
    # --figure-format pdf: a PDF beside every PNG
    pngs = sorted(p.stem for p in (run / "figures").glob("*.png"))
    assert pngs and sorted(p.stem for p in (run / "figures").glob("*.pdf")) == pngs
