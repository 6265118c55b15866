"""Tune sweeps (spice_ray.sweep): tables, resume after a failed trial, restore of a finished
sweep, trial resources and concurrency. One smoke bandit dataset and checkpoint per module."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from spice_ray.config import ConfigError, make_config
from spice_ray.sweep import (
    SweepError,
    SweepResult,
    apply_params,
    auto_max_concurrent,
    bundles_total,
    curve_steps,
    expand_grid,
    flatten_params,
    run_sweep,
    trial_bundles,
)

BETAS = (0.5, 2.0)
NAME = "betas"


def _space() -> dict[str, Any]:
    from ray import tune

    return {"fusion": {"beta": tune.grid_search(list(BETAS))}}


@pytest.fixture(scope="module")
def models(ray_local, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Smoke bandit config, dataset and one SPICE checkpoint (seed 0)."""
    from spice_ray.sweep import ensure_models

    out = tmp_path_factory.mktemp("sweep_run")
    cfg = make_config("smoke", "bandit", extra={"out_dir": str(out)})
    ds_dir, ckpts = ensure_models(cfg)
    return {"cfg": cfg, "ds": ds_dir, "ckpts": ckpts, "out": out}


@pytest.fixture(scope="module")
def resumed(models: dict[str, Any]) -> dict[str, Any]:
    """Run 1 makes the beta=2.0 trial fail; run 2 resumes the sweep."""
    args = (NAME, models["cfg"], _space(), models["ckpts"], models["ds"], models["out"])
    with pytest.raises(SweepError, match="1 of 2 trials errored"):
        run_sweep(*args, fail_if={"fusion.beta": 2.0}, verbose=0)
    first_failed = not (Path(models["out"]) / "sweeps" / f"{NAME}.parquet").exists()
    t0 = time.time()
    result = run_sweep(*args, verbose=0)
    return {"result": result, "first_failed": first_failed, "t0": t0}


@pytest.mark.ray
def test_failed_trial_is_resumed_alone(resumed: dict[str, Any]) -> None:
    result: SweepResult = resumed["result"]
    assert resumed["first_failed"]  # no table is written while a trial has errored
    assert result.restored
    assert result.new_trials == 1  # the beta=0.5 trial finished in run 1 and was kept
    kept = result.trials[result.trials["fusion.beta"] == 0.5]["finished_at"].item()
    assert kept < resumed["t0"]
    assert sorted(result.trials["fusion.beta"]) == list(BETAS)  # each config once


@pytest.mark.ray
def test_table_and_summary(resumed: dict[str, Any], models: dict[str, Any]) -> None:
    result: SweepResult = resumed["result"]
    cfg = models["cfg"]
    table = pd.read_parquet(result.table_path)
    n_tasks, horizon = cfg.eval.num_tasks, cfg.eval.online_horizon
    assert set(table["fusion.beta"]) == set(BETAS)
    assert set(table["metric"]) == {"cumulative_regret"}
    # each row's settings as typed columns, as in a study's tables: beta read from the config
    # column equals the trial's parameter, a float, on every row
    assert table["beta"].dtype == "float64" and (table["beta"] == table["fusion.beta"]).all()
    steps = curve_steps(horizon, 50)
    for _, group in table.groupby("fusion.beta"):
        assert group["task_id"].nunique() == n_tasks
        assert len(group) == n_tasks * len(steps) * len(cfg.seeds)
    summary = pd.read_parquet(result.summary_path)
    assert len(summary) == 2 and list(summary["rank"]) == [1, 2]
    # scored on the validation tasks, never on the test tasks (the default sweep.split)
    assert (table["split"] == "validation").all() and (summary["split"] == "validation").all()
    from spice_ray.data.store import load_split

    val = load_split(models["ds"], "validation", limit=n_tasks)["task_id"]
    assert set(table["task_id"]) == set(val.tolist())
    assert (summary["n"] == n_tasks).all() and (summary["horizon"] == horizon).all()
    assert summary["mean"].is_monotonic_increasing and (summary["sem"] >= 0).all()
    final = table[table["x"] == horizon].groupby("params")["value"].mean()
    assert dict(zip(summary["params"], summary["mean"], strict=True)) == pytest.approx(
        final.to_dict())
    # actors ran inside each trial's placement group (Tune captures child tasks)
    assert result.trials["captures_actors"].all()
    assert result.trials["placement_group"].str.len().gt(0).all()
    # each report's rows were staged inside the run (not the system's temporary directory),
    # and every staging directory removed once Tune took its checkpoint
    from spice_ray.sweep.trial import STAGING

    staging = Path(models["out"]) / "sweeps" / STAGING
    assert staging.is_dir() and list(staging.iterdir()) == []


@pytest.mark.ray
def test_rerun_of_finished_sweep_runs_nothing(resumed: dict[str, Any],
                                              models: dict[str, Any]) -> None:
    before = pd.read_parquet(resumed["result"].table_path)
    again = run_sweep(NAME, models["cfg"], _space(), models["ckpts"], models["ds"],
                      models["out"], verbose=0)
    assert again.restored and again.new_trials == 0  # no trial ran again
    assert len(again.trials) == 2
    pd.testing.assert_frame_equal(pd.read_parquet(again.table_path), before)


@pytest.mark.ray
def test_changed_search_space_is_refused(resumed: dict[str, Any],
                                         models: dict[str, Any]) -> None:
    from ray import tune

    space = {"fusion": {"beta": tune.grid_search([0.5, 1.0])}}
    with pytest.raises(SweepError, match="other inputs"):
        run_sweep(NAME, models["cfg"], space, models["ckpts"], models["ds"], models["out"],
                  verbose=0)


def test_resources_fit_two_cpus_and_fill_a_cluster() -> None:
    cfg = make_config("smoke", "bandit")
    bundles = trial_bundles(cfg)
    assert bundles[0] == {"CPU": 0.0} and len(bundles) == 1 + cfg.sweep.actors_per_trial
    assert bundles_total(bundles) == {"CPU": 1.0}  # 2 actors x 0.5 CPU
    assert auto_max_concurrent(bundles, {"CPU": 2.0}) == 1
    assert auto_max_concurrent(bundles, {"CPU": 16.0}) == 15
    assert auto_max_concurrent(bundles, {"CPU": 16.0}, num_trials=4) == 4
    assert auto_max_concurrent(bundles, {"CPU": 1.0}) == 1  # never 0
    gpu = make_config("smoke", "bandit", overrides=["eval.actor_gpus=0.5"])
    gpu_cluster = {"CPU": 64.0, "GPU": 2.0, "trainer": 2.0}
    gpu_bundles = trial_bundles(gpu, cluster=gpu_cluster)
    assert gpu_bundles[1] == {"CPU": 0.5, "GPU": 0.5, "trainer": 0.001}  # as evaluate_parallel
    assert auto_max_concurrent(gpu_bundles, gpu_cluster) == 2
    assert trial_bundles(cfg, train_in_trial=True)[0] == {"CPU": cfg.train.worker_cpus}
    assert make_config("smoke", "bandit").sweep.max_concurrent_trials == 0  # 0: derive it
    assert make_config("smoke", "bandit", overrides=[
        "sweep.max_concurrent_trials=3"]).sweep.max_concurrent_trials == 3


def test_params_and_grids() -> None:
    from ray import tune

    cfg = make_config("smoke", "darkroom")
    space = {"fusion": tune.grid_search([{"kernel": "rbf", "tau": 0.25},
                                         {"kernel": "uniform"}]),
             "model": {"ensemble_size": tune.grid_search([2, 4])}}
    grid = expand_grid(space)
    assert len(grid) == 4 and grid[0] == {"fusion": {"kernel": "rbf", "tau": 0.25},
                                          "model": {"ensemble_size": 2}}
    c = apply_params(cfg, grid[0])
    assert (c.fusion.kernel, c.fusion.tau, c.model.ensemble_size) == ("rbf", 0.25, 2)
    assert c.fusion.target == cfg.fusion.target  # untouched fields keep the base values
    assert flatten_params(grid[0]) == {"fusion.kernel": "rbf", "fusion.tau": 0.25,
                                       "model.ensemble_size": 2}
    none = apply_params(cfg, {"variant": "none"})
    assert (none.train.use_iw, none.train.use_adv, none.train.use_epi) == (False, False, False)
    assert apply_params(none, {"variant": "all"}).train.use_epi
    with pytest.raises(SweepError):
        apply_params(cfg, {"kernel": "rbf"})
    assert list(curve_steps(24, 50)) == list(range(1, 25))
    assert curve_steps(500, 50)[[0, -1]].tolist() == [1, 500]


@pytest.mark.ray
def test_retraining_trials_find_pretrained_checkpoints(models: dict[str, Any]) -> None:
    from spice_ray.sweep import resolve_checkpoint

    cfg, ds = models["cfg"], models["ds"]
    same = apply_params(cfg, {"variant": "all"})  # the base model: all weights are on
    assert resolve_checkpoint(same, 0, ds) == Path(models["ckpts"][0])
    other = apply_params(cfg, {"model": {"ensemble_size": 2}})
    with pytest.raises(SweepError, match="pretrain before the sweep"):
        resolve_checkpoint(other, 0, ds)


def test_search_spaces_are_checked_counted_and_hashed_stably() -> None:
    from ray import tune

    from spice_ray.sweep.params import check_space, count_trials, space_json

    grid = {"fusion": {"beta": tune.grid_search([0.5, 1.0]), "tau": 0.5},
            "model": {"ensemble_size": tune.grid_search([2, 4, 7])}}
    sampled = {"fusion": {"beta": tune.loguniform(0.1, 10.0),
                          "kernel": tune.choice(["rbf", "uniform"])}}
    assert count_trials(grid, 2) == 12 and count_trials(sampled, 16) == 16
    check_space(grid, "grid")
    check_space(sampled, "optuna")
    with pytest.raises(SweepError, match="'fusion.beta' is a random sampler; set sweep.search"):
        check_space(sampled, "grid")
    mixed = {"fusion": {"beta": tune.grid_search([0.5, 1.0]), "tau": tune.uniform(0.1, 1.0)}}
    for search in ("optuna", "random"):
        with pytest.raises(SweepError, match="'fusion.beta' is a grid search, which a sampled"):
            check_space(mixed, search)
    from spice_ray.sweep.params import Conditional
    backwards = {"fusion": {"tau": Conditional(tune.uniform(0.1, 1.0),
                                               when={"fusion.kernel": ("rbf",)}, otherwise=0.5),
                            "kernel": tune.choice(["rbf", "uniform"])}}
    with pytest.raises(SweepError, match="'fusion.tau' is sampled when 'fusion.kernel' has"):
        check_space(backwards, "random")
    forwards = {"fusion": dict(reversed(list(backwards["fusion"].items())))}
    check_space(forwards, "random")
    assert '"conditional":' in space_json(forwards) and '"otherwise":0.5' in \
        space_json(forwards)
    with pytest.raises(SweepError, match="needs random samplers"):
        check_space(grid, "random")
    with pytest.raises(SweepError, match="not known before Tune samples them"):
        expand_grid(sampled)
    # the restore guard hashes the space: samplers by their bounds, not their address
    again = {"fusion": {"beta": tune.loguniform(0.1, 10.0),
                        "kernel": tune.choice(["rbf", "uniform"])}}
    assert space_json(sampled) == space_json(again)
    assert '"lower":0.1' in space_json(sampled) and '"categories":["rbf","uniform"]' in \
        space_json(sampled)
    assert space_json(sampled) != space_json({"fusion": {"beta": tune.uniform(0.1, 10.0),
                                                         "kernel": tune.choice(["rbf"])}})


@pytest.mark.ray
def test_optuna_asha_sweep_stops_a_trial_early(models: dict[str, Any], capfd, caplog) -> None:
    """Four Optuna trials over the schedule and beta (drawn for the fixed schedule only), each
    reporting its running regret after each quarter of the tasks; ASHA stops at least one, and
    the tables say which; no configuration runs twice; the trials after the first reuse its
    evaluation actors. Tune's banner and Optuna's INFO lines go to the log, not the
    terminal."""
    import logging

    from ray import tune

    caplog.set_level(logging.INFO)
    capfd.readouterr()

    cfg = models["cfg"].replace(sweep=dataclasses.replace(
        models["cfg"].sweep, search="optuna", scheduler="asha", num_samples=4,
        max_concurrent_trials=1, seed=3))
    from spice_ray.sweep.params import Conditional

    base_beta = cfg.fusion.beta
    space = {"fusion": {"beta_schedule": tune.choice(["fixed", "sqrt2logt"]),
                        "beta": Conditional(tune.loguniform(0.01, 100.0),
                                            when={"fusion.beta_schedule": ("fixed",)},
                                            otherwise=base_beta)}}
    result = run_sweep("optuna_asha", cfg, space, models["ckpts"], models["ds"], models["out"],
                       curve_points=5)
    printed = "".join(capfd.readouterr())
    for line in ("Configuration for experiment", "View detailed results here",
                 "A new study created"):
        assert line not in printed and line in caplog.text, (line, printed[-2000:])
    trials = result.trials
    assert len(trials) == 4 and trials["params"].nunique() == 4
    # one trial after another in the trial process Tune reuses: a later trial finds the
    # evaluation actors the first started (and their models loaded), and starts none
    per_trial = cfg.sweep.actors_per_trial
    assert set(trials["actors_started"]) <= {0, per_trial}, trials["actors_started"].tolist()
    assert (trials["actors_started"] == 0).any() and trials["actors_started"].max() == per_trial
    fixed = trials["fusion.beta_schedule"] == "fixed"
    assert (trials.loc[~fixed, "fusion.beta"] == base_beta).all() and (~fixed).sum() <= 1
    assert (trials["chunks"] == 4).all()
    stopped = trials[trials["stopped_early"]]
    assert len(stopped) >= 1 and (stopped["chunk"] < 4).all()
    assert not trials["stopped_early"].all()
    n_tasks = cfg.eval.num_tasks
    summary = result.summary
    assert summary.loc[summary["complete"], "n"].eq(n_tasks).all()
    assert summary.loc[~summary["complete"], "n"].lt(n_tasks).all()
    assert bool(summary.iloc[0]["complete"])  # the best is ranked among complete configs
    # Tune's own ResultGrid, read back through the restore guard
    from spice_ray.sweep import SweepError, load_result_grid

    grid = load_result_grid(models["out"], "optuna_asha")
    assert len(grid) == 4 and grid.num_errors == 0
    assert sorted(r.config["fusion"]["beta"] for r in grid) == sorted(trials["fusion.beta"])
    best = grid.get_best_result()  # the metric and mode are the sweep's: no arguments needed
    assert best.metrics["regret_mean"] == min(r.metrics["regret_mean"] for r in grid)
    with pytest.raises(SweepError, match="no sweep 'nope' under .*sweeps there: .*optuna_asha"):
        load_result_grid(models["out"], "nope")


def test_optuna_searcher_is_seeded_by_the_config() -> None:
    from ray import tune

    from spice_ray.sweep.search import make_searcher

    space = {"fusion": {"beta": tune.loguniform(0.01, 100.0)}}

    def first_suggestions(search: str, seed: int) -> list[float]:
        searcher = make_searcher(search, space, seed, "regret_mean")
        return [searcher.suggest(f"t{i}")["fusion"]["beta"] for i in range(3)]

    for search in ("optuna", "random"):
        assert first_suggestions(search, 3) == first_suggestions(search, 3)
        assert first_suggestions(search, 3) != first_suggestions(search, 4)
    assert make_searcher("grid", space, 3, "regret_mean") is None


def _kernel_beta_space(env: str) -> tuple[dict[str, Any], Any]:
    cfg = make_config("small", env, overrides=["sweep.search=random"])
    return _script("kernel_beta")["space_of"](cfg), cfg.fusion


def test_a_sampled_kernel_beta_space_draws_only_the_settings_a_config_reads() -> None:
    """tau is drawn for the RBF only and beta for the fixed schedule only; the others carry the
    base value, so a configuration reached twice has one set of parameters."""
    from spice_ray.sweep.params import check_space
    from spice_ray.sweep.search import make_searcher

    space, base = _kernel_beta_space("darkroom")
    check_space(space, "random")
    searcher = make_searcher("random", space, 0, "regret_mean")
    drawn = [searcher.suggest(f"t{i}")["fusion"] for i in range(60)]
    for d in drawn:
        assert set(d) == {"kernel", "tau", "beta_schedule", "beta"}
        assert (d["tau"] == base.tau) == (d["kernel"] != "rbf"), d
        assert (d["beta"] == base.beta) == (d["beta_schedule"] == "sqrt2logt"), d
    assert {d["kernel"] for d in drawn} == {"uniform", "cosine", "rbf"}
    assert {d["beta_schedule"] for d in drawn} == {"fixed", "sqrt2logt"}
    # never the same configuration twice (none finished yet: the repeats wait for them)
    keys = [json.dumps(d, sort_keys=True) for d in drawn]
    assert len(set(keys)) == len(keys)


def test_a_configuration_drawn_again_is_not_run_and_the_searcher_learns_its_result() -> None:
    """The bandit's space under sqrt2logt is one configuration: it runs once; a repeat is told
    the first result, and a space with nothing new left ends the search."""
    import optuna
    from ray import tune
    from ray.tune.search import Searcher

    from spice_ray.sweep.search import make_searcher

    space, base = _kernel_beta_space("bandit")
    searcher = make_searcher("random", space, 1, "regret_mean")
    seen = []
    for i in range(12):
        config = searcher.suggest(f"t{i}")
        seen.append(json.dumps(config, sort_keys=True))
        searcher.on_trial_complete(f"t{i}", {"regret_mean": float(i)})
    assert len(set(seen)) == 12
    sqrt = [k for k in seen if '"sqrt2logt"' in k]
    assert sqrt == [json.dumps({"fusion": {"beta": base.beta, "beta_schedule": "sqrt2logt",
                                           "kernel": base.kernel, "tau": base.tau}},
                               sort_keys=True)]
    assert searcher.repeats > 0  # 12 uniform draws of 2 schedules repeat sqrt2logt
    study = searcher.searcher._ot_study
    trials = study.get_trials(deepcopy=False)
    assert len(trials) == 12 + searcher.repeats
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in trials)
    told = {t.value for t in trials if t.params.get("fusion/beta_schedule") == "sqrt2logt"}
    assert told == {float(seen.index(sqrt[0]))}  # every repeat told the one result

    # two configurations in all: the third suggestion ends the search; repeats of one still
    # running wait for its result
    tiny = make_searcher("random", {"fusion": {"kernel": tune.choice(["rbf", "uniform"])}}, 0,
                         "regret_mean")
    tiny.max_redraws = 20
    first, second = tiny.suggest("a"), tiny.suggest("b")
    assert first != second and tiny.suggest("c") == Searcher.FINISHED
    assert tiny.repeats == 20
    tiny.on_trial_complete("a", {"regret_mean": 1.0})
    tiny.on_trial_complete("b", None, error=True)
    states = {t.state for t in tiny.searcher._ot_study.get_trials(deepcopy=False)}
    assert optuna.trial.TrialState.RUNNING not in states


def test_a_restored_searcher_does_not_repeat_what_it_ran(tmp_path: Path) -> None:
    from spice_ray.sweep.params import params_json
    from spice_ray.sweep.search import make_searcher

    space, _ = _kernel_beta_space("bandit")
    searcher = make_searcher("optuna", space, 2, "regret_mean")
    before = []
    for i in range(6):
        before.append(params_json(searcher.suggest(f"t{i}")))
        searcher.on_trial_complete(f"t{i}", {"regret_mean": 10.0 - i})
    from ray.tune.search import SearchGenerator

    SearchGenerator(searcher).save_to_dir(str(tmp_path), "s1")  # as Tune saves an experiment
    again = make_searcher("optuna", space, 2, "regret_mean")
    SearchGenerator(again).restore_from_dir(str(tmp_path))
    assert sorted(again.results) == sorted(before)
    after = [params_json(again.suggest(f"u{i}")) for i in range(6)]
    assert not set(after) & set(before) and len(set(after)) == 6
    assert len(again.searcher._ot_study.get_trials(deepcopy=False)) >= 12


def test_a_trial_reads_the_split_the_config_names(monkeypatch) -> None:
    """The tuning never reads the eval split unless sweep.split=eval says so."""
    from spice_ray.data import store
    from spice_ray.sweep.trial import evaluate_chunks

    asked = []

    def spy(dataset_dir, split, limit=None):
        asked.append(split)
        raise LookupError("stop here")

    monkeypatch.setattr(store, "load_split", spy)
    for overrides, want in (([], "validation"), (["sweep.split=eval"], "eval")):
        cfg = make_config("smoke", "bandit", overrides=overrides)
        with pytest.raises(LookupError):
            next(evaluate_chunks(cfg, "unused", checkpoints={0: "unused"}))
        assert asked[-1] == want
    with pytest.raises(ConfigError, match="sweep.split='test' is invalid"):
        make_config("smoke", "bandit", overrides=["sweep.split=test"])


def test_kernel_grid_depends_on_the_environment() -> None:
    """A bandit's sweep has no kernel or tau axis (one state: every kernel weighs alike); a
    darkroom's has them; no grid repeats a configuration."""
    import json
    import runpy

    script = runpy.run_path(str(Path(__file__).resolve().parents[1] / "sweeps"
                                / "kernel_beta.py"), run_name="kernel_beta_under_test")
    base = make_config("small", "bandit").fusion
    bandit = script["fusion_grid"](base, (0.25, 1.0), (0.5, 2.0), stateless=True)
    assert {(g["kernel"], g["tau"]) for g in bandit} == {(base.kernel, base.tau)}
    assert len(bandit) == 3  # beta 0.5, 2 and the schedule
    dark = script["fusion_grid"](make_config("small", "darkroom").fusion, (0.25, 1.0),
                                 (0.5, 2.0))
    assert len(dark) == 12 and {g["kernel"] for g in dark} == {"uniform", "cosine", "rbf"}
    for grid in (bandit, dark):
        assert len({json.dumps(g, sort_keys=True) for g in grid}) == len(grid)


def _script(name: str) -> dict[str, Any]:
    import runpy

    return runpy.run_path(str(Path(__file__).resolve().parents[1] / "sweeps" / f"{name}.py"),
                          run_name=f"{name}_under_test")


def test_every_sweep_script_is_its_grids_and_one_shared_command_line(monkeypatch, tmp_path
                                                                     ) -> None:
    """sweep.main does the work of every sweeps/*.py: the sweeps' names, environments, model
    stage (evaluate existing checkpoints, or pretrain each variant) and spaces."""
    import spice_ray.runtime.cli
    import spice_ray.sweep.cli as sweep_cli
    from spice_ray.sweep import main, preset_grid

    calls: list[tuple[str, Any]] = []

    class Lock:
        def release(self) -> None:
            calls.append(("release", None))

    def run_main(fn, *args, **kwargs):
        calls.append((fn.__name__, args))
        if fn.__name__ == "ensure_models":
            return "ds", {0: "ckpt"}
        if fn.__name__ == "generate_stage":
            return type("Gen", (), {"dataset_dir": "ds"})()
        if fn.__name__ == "run_sweep":
            return args  # what format_result would print
        return None

    monkeypatch.setattr(spice_ray.runtime.cli, "run_main", run_main)
    monkeypatch.setattr(sweep_cli, "start_sweep", lambda *a, **k: Lock())
    monkeypatch.setattr(sweep_cli, "format_result", lambda result, top: str(result[0]))
    out = ["--preset", "smoke", "--out", str(tmp_path)]
    kernel = _script("kernel_beta")
    main("kernel_beta", kernel["space_of"], both=("bandit", "darkroom"), argv=out)
    sweeps = [args for fn, args in calls if fn == "run_sweep"]
    assert [s[0] for s in sweeps] == ["kernel_beta_bandit", "kernel_beta_darkroom"]
    assert [fn for fn, _ in calls].count("ensure_models") == 2 and calls[-1][0] == "release"
    bandit_space = sweeps[0][2]["fusion"]["grid_search"]
    assert {g["kernel"] for g in bandit_space} == {make_config("smoke", "bandit").fusion.kernel}
    calls.clear()
    main("weight_ablation", _script("weight_ablation")["search_space"], retrain=True,
         env="darkroom", argv=out)
    assert [fn for fn, _ in calls] == ["generate_stage", "pretrain_grid", "run_sweep", "release"]
    assert calls[2][1][0] == "weight_ablation" and calls[2][1][1].env.name == "darkroom"
    calls.clear()
    noise = _script("fusion_noise")
    main("fusion_noise", noise["search_space"], argv=[*out, "--env", "darkroom"])
    assert calls[1][1][0] == "fusion_noise_darkroom"
    # preset grids inherit: medium takes small's
    assert preset_grid(noise["GRIDS"], "medium") is noise["GRIDS"]["small"]
    assert preset_grid(_script("ensemble_size")["GRIDS"], "medium") == (2, 4, 7, 10)
    with pytest.raises(ValueError, match="no grid for preset 'smoke'"):
        preset_grid({"paper": 1}, "smoke")


def test_the_console_shows_sweep_parameters_rounded_and_flat() -> None:
    from spice_ray.sweep.cli import shown_params
    from spice_ray.sweep.params import params_json

    cell = params_json({"fusion": {"beta": 1.1423254155608376, "kernel": "rbf", "tau": 0.5}})
    assert shown_params(cell) == "fusion.beta=1.142, fusion.kernel=rbf, fusion.tau=0.5"
    assert shown_params(params_json({"fusion": {"v_min": 1.5e-05}})) == "fusion.v_min=1.5e-05"
    assert shown_params("not json") == "not json"


@pytest.mark.ray
def test_a_payload_planted_in_tunes_experiment_state_is_never_run(
        resumed: dict[str, Any], models: dict[str, Any], tmp_path: Path) -> None:
    """Tune's ExperimentAnalysis and restore decode ``experiment_state-*.json`` with
    cloudpickle enabled: a payload planted there by another user (the file left writable by
    all) ran when the sweep was re-run and when its results were read back (exit 0)."""
    import os

    from ray import cloudpickle
    from ray.tune.utils.serialization import _loads_with_cloudpickle

    from spice_ray.sweep import load_result_grid

    marker = tmp_path / "payload-ran"

    class Payload:  # unpickling it opens (creates) the marker file: code run from the file
        def __reduce__(self):
            return (open, (str(marker), "w"))

    exp = Path(models["out"]) / "sweeps" / NAME
    state = sorted(exp.glob("experiment_state-*.json"))[-1]  # the newest: what Tune reads
    original, mode = state.read_bytes(), state.stat().st_mode & 0o777
    doc = json.loads(original)
    doc["planted"] = {"_type": "CLOUDPICKLE_FALLBACK",
                      "value": cloudpickle.dumps(Payload()).hex()}
    planted = json.dumps(doc)
    _loads_with_cloudpickle(planted)  # the payload is live: Tune's own reader runs it
    assert marker.exists()
    marker.unlink()
    try:
        state.write_text(planted)
        os.chmod(state, 0o666)
        with pytest.raises(SweepError, match=r"experiment_state-.*\.json is owned by .* mode "
                                             r"0o666; restoring would unpickle"):
            load_result_grid(models["out"], NAME)
        with pytest.raises(SweepError, match=r"experiment_state-.*\.json is owned by"):
            run_sweep(NAME, models["cfg"], _space(), models["ckpts"], models["ds"],
                      models["out"], verbose=0)
        assert not marker.exists()
    finally:
        state.write_bytes(original)
        os.chmod(state, mode)


@pytest.mark.parametrize("script", ["kernel_beta", "fusion_noise", "ensemble_size",
                                    "weight_ablation"])
def test_a_sweep_scripts_help_and_a_bad_flag_load_nothing_heavy(script, tmp_path) -> None:
    """``sweeps/*.py --help``, an unknown preset and an unknown flag answer before torch,
    pandas, scipy, matplotlib or Ray are imported (4.5-5 CPU-s before their imports were
    deferred); asserted on the modules loaded, not on a clock."""
    from conftest import heavy_imports

    path = str(Path(__file__).resolve().parents[1] / "sweeps" / f"{script}.py")
    for argv, status in ((["--help"], 0), (["--preset", "nope"], 2), (["--nope"], 2)):
        assert heavy_imports(f"run_path({path!r})", argv, tmp_path) == \
            f"HEAVY [] CODE {status}", (script, argv)
