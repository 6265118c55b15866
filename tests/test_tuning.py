"""The tuning stage's grid and choice: one grid for SPICE and every reference, the lowest mean
validation regret chosen, seeds averaged per task before tasks are averaged."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest

from spice_ray.agents import AgentSpec
from spice_ray.config import make_config
from spice_ray.results import write
from spice_ray.results.choices import resolution
from spice_ray.study import tune_grid, tuning
from spice_ray.study.tuning import TAUS, WIDTHS, candidates, choose, final_scores

BANDIT = make_config("smoke", "bandit")
DARKROOM = make_config("smoke", "darkroom")


def test_every_method_with_a_beta_gets_the_same_grid() -> None:
    spice = candidates(AgentSpec("spice", fusion=BANDIT.fusion), BANDIT.eval, 0.25)
    flat = candidates(AgentSpec("spice-flat", fusion=BANDIT.fusion), BANDIT.eval)
    bayes = candidates(AgentSpec("bayes-ucb", fusion=BANDIT.fusion), BANDIT.eval)
    assert [c.setting for c in flat] == [c.setting for c in bayes]
    assert [dict(c.setting) for c in flat] == [
        {"beta": 0.5}, {"beta": 1.0}, {"beta": 2.0}, {"beta": 4.0},
        {"beta_schedule": "sqrt2logt"}]
    # SPICE's learned width: each beta point at the paper's width and at the fitted scale
    assert [c.setting for c in spice] == [p + (("width", w),) for p in
                                          (c.setting for c in flat) for w in WIDTHS]
    assert [c.spec.fusion.width_scale for c in spice] == [1.0, 0.25] * 5
    assert len({c.key for c in spice}) == 10  # the rows tell the two widths apart
    assert [(c.spec.fusion.beta_schedule, c.spec.fusion.beta) for c in spice[:8:2]] == [
        ("fixed", 0.5), ("fixed", 1.0), ("fixed", 2.0), ("fixed", 4.0)]
    assert spice[8].spec.fusion.beta_schedule == "sqrt2logt"
    # a kernel that reads a bandwidth, over states, adds it: every (beta, tau, width) point
    dark = candidates(AgentSpec("spice", fusion=DARKROOM.fusion), DARKROOM.eval, 0.5)
    assert DARKROOM.fusion.kernel == "rbf" and len(dark) == 5 * len(TAUS) * len(WIDTHS)
    assert {c.spec.fusion.tau for c in dark} == set(TAUS)
    # kernels that ignore tau get no tau axis (its points would be identical runs); the
    # darkroom's n-step targets give the fused methods without a learned width a noise axis
    for kernel in ("exact", "cosine", "uniform"):
        other = dataclasses.replace(DARKROOM.fusion, kernel=kernel)
        noise_axis = 5 * len(tuning.NOISES)
        assert len(candidates(AgentSpec("spice-flat", fusion=other), DARKROOM.eval)) == noise_axis
        assert len(candidates(AgentSpec("spice", fusion=other), DARKROOM.eval, 0.5)) == 10
    exact = dataclasses.replace(DARKROOM.fusion, kernel="exact")
    assert len(candidates(AgentSpec("count", fusion=exact), DARKROOM.eval)) == noise_axis
    ucb = candidates(AgentSpec("ucb"), BANDIT.eval)
    assert [c.eval_cfg.ucb_c for c in ucb] == [0.5, 1.0, 2.0, 4.0]
    assert len({c.key for c in ucb}) == 4  # c is in the config, so the rows tell them apart
    assert [c.setting for c in ucb] == [(("c", c),) for c in (0.5, 1.0, 2.0, 4.0)]
    assert [c.key[1] for c in ucb] == [f'{{"c":{c}}}' for c in (0.5, 1.0, 2.0, 4.0)]
    assert [c.setting for c in candidates(AgentSpec.dpt(BANDIT.eval), BANDIT.eval)] == [()]


def test_nstep_targets_add_the_fitted_noise_to_every_fused_grid() -> None:
    """Where the evidence targets are n-step returns (the darkroom), SPICE's fitted point takes
    sigma^2 with s, and every other fused method runs each point at the config's sigma^2, at
    the fitted one and at decades up to 1000; reward targets (the bandit) keep their grid
    exactly."""
    assert tuning.fits_noise(AgentSpec("spice-flat", fusion=DARKROOM.fusion))
    assert not tuning.fits_noise(AgentSpec("spice-flat", fusion=BANDIT.fusion))
    assert not tuning.fits_noise(AgentSpec.dpt(DARKROOM.eval))
    spice = candidates(AgentSpec("spice", fusion=DARKROOM.fusion), DARKROOM.eval, 0.5, 7.0)
    assert {(dict(c.setting)["width"], c.spec.fusion.width_scale, c.spec.fusion.noise_var)
            for c in spice} == {("paper", 1.0, DARKROOM.fusion.noise_var), ("fitted", 0.5, 7.0)}
    for method in ("spice-flat", "count"):
        plain = candidates(AgentSpec(method, fusion=DARKROOM.fusion), DARKROOM.eval)
        grid = candidates(AgentSpec(method, fusion=DARKROOM.fusion), DARKROOM.eval, None, 7.0)
        assert [c.setting for c in grid] == [p + (("noise", n),) for p in
                                             (c.setting[:-1] for c in plain[::len(tuning.NOISES)])
                                             for n in tuning.NOISES]
        assert [c.spec.fusion.noise_var for c in grid[:6]] == [DARKROOM.fusion.noise_var, 7.0,
                                                               1.0, 10.0, 100.0, 1000.0]
        assert len({c.key for c in grid}) == len(grid)  # the rows tell the noises apart
    flat = candidates(AgentSpec("spice-flat", fusion=BANDIT.fusion), BANDIT.eval, None, 7.0)
    assert [dict(c.setting) for c in flat][:1] == [{"beta": 0.5}] and len(flat) == 5
    assert {c.spec.fusion.noise_var for c in flat} == {BANDIT.fusion.noise_var}


def test_the_fusion_tunables_are_declared_once_with_their_field_default_and_methods() -> None:
    """Each fusion tunable names a FusionConfig field and takes its default from there (no
    second copy), and applies to a method by what the method is, not by its name: SPICE on the
    darkroom gets beta, tau and its width; the flat prior beta, tau and the noise; the Bayes
    posterior-UCB (not fused, but its results read beta) beta alone; UCB and DPT none of them
    (UCB's c is its own Tunable)."""
    from spice_ray.agents.tunables import FUSION_TUNABLES
    from spice_ray.config import FusionConfig

    default = FusionConfig()
    for t in FUSION_TUNABLES:
        section, _, name = t.grid.field.partition(".")
        assert section == "fusion" and t.default == getattr(default, name), t.name
    assert [t.name for t in FUSION_TUNABLES] == ["beta", "tau", "width", "noise"]

    def applied(method: str, cfg) -> list[str]:
        spec = AgentSpec.dpt(cfg.eval) if method == "dpt" else AgentSpec(method,
                                                                         fusion=cfg.fusion)
        return [t.name for t in FUSION_TUNABLES if t.applies(spec)]

    assert applied("spice", DARKROOM) == ["beta", "tau", "width"]
    assert applied("spice-flat", DARKROOM) == ["beta", "tau", "noise"]
    assert applied("spice", BANDIT) == ["beta", "width"]
    assert applied("spice-flat", BANDIT) == ["beta"]
    assert applied("bayes-ucb", BANDIT) == ["beta"]
    assert applied("ucb", BANDIT) == applied("dpt", BANDIT) == []


def _rows(method: str, config: str, values: dict[tuple[int, int], float]) -> pd.DataFrame:
    """Final-step rows {(seed, task): value} plus an earlier step that must be ignored."""
    rows = []
    for (seed, task), v in values.items():
        for x, value in ((5, -100.0), (10, v)):
            rows.append({"method": method, "config": config, "seed": seed, "task_id": task,
                         "metric": "cumulative_regret", "x": x, "value": value})
    return pd.DataFrame(rows)


def test_choice_is_the_lowest_mean_where_resolved_else_the_first_tied_point() -> None:
    """On two tasks the validation set cannot tell the three points apart (beta 0.5 is 0.5
    worse with a paired SEM of 1.5): the lowest mean is chosen (the first in grid order on its
    exact tie) and the record says it is unresolved. On 40 tasks where beta 1 is better than
    every other point by many paired SEMs, it is chosen, resolved, with its margin."""
    grid = candidates(AgentSpec("spice-flat", fusion=BANDIT.fusion), BANDIT.eval)[:3]
    # the protocol's noise level in a row's config is not the agent's: it is stripped
    with_sigma = [c.key[1][:-1] + ',"sigma":0.3}' for c in grid]
    rows = pd.concat([
        _rows(grid[0].key[0], with_sigma[0], {(0, 0): 4.0, (1, 0): 6.0, (0, 1): 2.0,
                                              (1, 1): 2.0}),
        _rows(grid[0].key[0], with_sigma[1], {(0, 0): 1.0, (1, 0): 5.0, (0, 1): 3.0,
                                              (1, 1): 3.0}),
        _rows(grid[0].key[0], with_sigma[2], {(0, 0): 3.0, (1, 0): 3.0, (0, 1): 3.0,
                                              (1, 1): 3.0})])
    scores = final_scores(rows)
    assert scores["mean"].tolist() == [3.5, 3.0, 3.0]
    assert scores["n"].tolist() == [2, 2, 2]  # tasks, after averaging the seeds per task
    assert scores["sem"].tolist() == pytest.approx([1.5, 0.0, 0.0])  # tasks 5 and 2
    best, records = choose(grid, scores)
    assert best is grid[1]  # tied with grid[2] at 3.0: the first in grid order
    assert [r["setting"] for r in records] == [{"beta": 0.5}, {"beta": 1.0}, {"beta": 2.0}]
    # per task (5, 2), (3, 3), (3, 3): differences from the best (grid[1]) and their SEMs
    assert [r["paired_se"] for r in records] == pytest.approx([1.5, 0.0, 0.0])
    made = resolution(records)
    assert made == {"chosen": {"beta": 1.0}, "best": {"beta": 1.0}, "runner_up": {"beta": 2.0},
                    "margin": 0.0, "se": 0.0, "tied": 3, "resolved": False}
    rng = np.random.default_rng(0)
    base = rng.normal(5.0, 1.0, 40)
    per_point = [base + 1.0 + rng.normal(0, 0.1, 40), base, base + 0.5 + rng.normal(0, 0.1, 40)]
    rows = pd.concat([_rows(grid[0].key[0], with_sigma[i],
                            {(0, task): float(v) for task, v in enumerate(values)})
                      for i, values in enumerate(per_point)])
    best, records = choose(grid, final_scores(rows))
    made = resolution(records)
    assert best is grid[1] and made["resolved"] and made["tied"] == 1
    assert made["runner_up"] == {"beta": 2.0} and made["margin"] == pytest.approx(
        (per_point[2] - base).mean()) and made["se"] == pytest.approx(
        (per_point[2] - base).std(ddof=1) / np.sqrt(40))
    with pytest.raises(ValueError, match="no validation rows for SPICE \\(flat prior\\) at "
                                         "\\{'beta': 4.0\\}"):
        choose(candidates(AgentSpec("spice-flat", fusion=BANDIT.fusion), BANDIT.eval), scores)


def test_tuned_table_sentences_rank_and_pair_by_task() -> None:
    from spice_ray.results.analysis import tuned_comparison

    finals = {"SPICE": [2.0, 4.0, 3.0, 5.0], "SPICE (paper)": [6.0, 5.0, 7.0, 7.0],
              "SPICE (flat prior)": [6.0, 6.0, 7.0, 9.0],
              "SPICE (oracle prior)": [1.0, 2.0, 2.0, 3.0], "UCB": [3.0, 5.0, 3.0, 7.0]}
    rows = []
    for method, values in finals.items():
        for task, v in enumerate(values):
            for seed in (0, 1):  # two seeds with the same value: averaged per task first
                rows.append({"method": method, "config": f'{{"m":"{method}"}}', "rule": "ucb",
                             "variant": "", "seed": seed, "task_id": task, "env": "e",
                             "metric": "cumulative_regret", "x": 10, "value": v})
    ranked, paired, gap = tuned_comparison(pd.DataFrame(rows))
    assert ranked.startswith("Ranked by final cumulative regret") and ranked.index(
        "SPICE (oracle prior) 2") < ranked.index("SPICE 3.5") < ranked.index("UCB 4.5")
    # UCB - SPICE per task: 1, 1, 0, 2 -> mean 1, SEM 0.408; flat - SPICE: 4, 2, 4, 4
    assert "UCB +1 +- 0.41" in paired and "SPICE (flat prior) +3.5 +- 0.5" in paired
    # (flat - SPICE) / (flat - oracle) = 3.5 / 5; SPICE (paper): (0 + 1 + 0 + 2) / 4 / 5
    assert gap.startswith("Gap closed at the tuned settings") and "then tasks): 0.70" in gap
    assert "; SPICE (paper): 0.15 (" in gap


def test_the_tuning_stage_reads_only_the_validation_split(monkeypatch) -> None:
    """Every choice of ``tune_experiment`` comes from validation tasks: the eval split is
    never loaded nor hashed, each point runs under its method's checkpoints (none for a
    model-free method), and each method's choice is its lowest validation score."""
    import json

    import numpy as np

    from spice_ray.study import tuning

    read = []

    def load_split(ds_dir, split, verify=True, limit=None):
        read.append(split)
        return {"task_id": np.arange(4)}

    def split_id(ds_dir, split):
        read.append(split)
        return "hash"

    scored = []

    def score_grid(pending, eval_cfg, on_done, console=None, scratch=None):
        """What the Tune trials compute, in this process: each point's score on every task
        under every seed, as ``tuning.final_scores`` reads the rows."""
        for i, p in enumerate(pending):
            rows = []
            for cand, sources, seeds in p.points():
                cfg = json.loads(cand.spec.config_json(cand.eval_cfg))
                score = (abs(cfg.get("beta", 0) - 2.0) + abs(cfg.get("c", 0) - 1.0)
                         + abs(cfg.get("width_scale", 1.0) - 0.5))
                scored.append((cand.spec.label, sorted(sources.items()), seeds))
                rows += [{"method": cand.spec.label, "config": cand.key[1], "seed": seed,
                          "task_id": task, "metric": "cumulative_regret", "x": 24,
                          "value": score + task}
                         for seed in seeds for task in p.data["task_id"]]
            on_done(i, tuning.final_scores(pd.DataFrame(rows)))

    monkeypatch.setattr(tuning.store, "load_split", load_split)
    monkeypatch.setattr(tuning.store, "split_id", split_id)
    monkeypatch.setattr(tune_grid, "score_grid", score_grid)
    monkeypatch.setattr(tuning, "_flat_prior", lambda cfg, dataset: (0.5, 0.1))
    fitted = []

    def fit_width(spec, cfg, data, sources):
        fitted.append((spec.label, sources))
        return {"scale": 0.5, "per_seed": {"0": 0.5}, "log_lik": 0.0, "log_lik_paper": -1.0,
                "targets": 4}

    monkeypatch.setattr(tuning, "fit_width", fit_width)
    monkeypatch.setattr(tuning.ckpt, "content_id", lambda path: str(path))
    cfg = make_config("smoke", "bandit")
    finals = {("bandit", kind, "", 0): f"/ckpt/{kind}" for kind in ("spice", "dpt")}
    record = tune_grid.tune_experiment("bandit", cfg, "/data", finals)
    assert set(read) == {"validation"}
    # SPICE's points under its seed's model, DPT's under DPT's, model-free ones under none
    assert ("SPICE", [(0, "/ckpt/spice")], (0,)) in scored
    assert ("DPT", [(0, "/ckpt/dpt")], (0,)) in scored
    assert ("UCB", [], (-1,)) in scored
    assert record["split"] == "validation" and record["tasks"] == 4
    chosen = {label: m["chosen"] for label, m in record["methods"].items()}
    assert chosen == {"SPICE": {"beta": 2.0, "width": "fitted"},
                      "SPICE (flat prior)": {"beta": 2.0}, "UCB": {"c": 1.0}, "DPT": {},
                      "Emp": {}, "TS": {}, "Random": {}}
    # the width is fitted once, on the validation contexts of every seed's SPICE model
    assert fitted == [("SPICE", {0: "/ckpt/spice"})]
    assert record["methods"]["SPICE"]["width"]["scale"] == 0.5
    assert len(record["methods"]["SPICE"]["grid"]) == 10
    spice = [c for group in tuning.chosen_specs(record, tuning.EXPERIMENTS["bandit"], cfg,
                                                "/data").values()
             for c in group if c.spec.label == "SPICE"]
    assert [(c.spec.fusion.beta, c.spec.fusion.width_scale) for c in spice] == [(2.0, 0.5)]
    # beside it, SPICE (paper): the paper's width at the best of the paper-width points
    assert record["methods"]["SPICE"]["paper"] == {"beta": 2.0, "width": "paper"}
    paper = [c for group in tuning.chosen_specs(record, tuning.EXPERIMENTS["bandit"], cfg,
                                                "/data").values()
             for c in group if c.spec.label == "SPICE (paper)"]
    assert [(c.spec.method, c.spec.fusion.beta, c.spec.fusion.width_scale) for c in paper] == [
        ("spice-paper", 2.0, 1.0)]
    assert "width_scale" not in paper[0].spec.config_json(cfg.eval)
    # the same inputs again: the record is reused, nothing runs
    assert tune_grid.tune_experiment("bandit", cfg, "/data", finals, record) is record
    # an edited choice (the worst grid point instead of the best) is named and tuned again
    edited = json.loads(json.dumps(record))
    worst = max(edited["methods"]["SPICE"]["grid"], key=lambda g: g["mean"])["setting"]
    edited["methods"]["SPICE"]["chosen"] = worst
    assert tuning.record_problem(edited).startswith(f"says SPICE chose {worst}, not the choice")
    again = tune_grid.tune_experiment("bandit", cfg, "/data", finals, edited)
    assert again is not edited and again == record
    # every point differs from the best by a constant on each task: paired SEM 0, resolved
    made = record["methods"]["SPICE"]["resolution"]
    assert made["resolved"] and made["se"] == 0.0 and made["chosen"] == made["best"]
    # a record written before choices were resolved (no paired SEMs) is tuned again
    old = json.loads(json.dumps(record))
    for point in old["methods"]["UCB"]["grid"]:
        del point["paired_se"]
    assert "without their paired standard errors" in tuning.record_problem(old)
    edited["methods"]["SPICE"] = {"chosen": {}}
    assert tuning.record_problem(edited).startswith("is not a tuning record (KeyError")


def test_headline_metrics_and_chosen_settings_for_the_trackers(tmp_path) -> None:
    """What a tracker's compare view shows of a study: each tuned method's mean final regret
    (seeds averaged per task) and its chosen setting, under names every tracker accepts."""
    rows = []
    for method, seed, values in (("SPICE", 0, [2.0, 4.0]), ("SPICE", 1, [4.0, 6.0]),
                                 ("SPICE (flat prior)", -1, [5.0, 7.0])):
        for task, v in enumerate(values):
            for x, value in ((1, 0.0), (10, v)):
                rows.append({"experiment": "bandit_tuned", "env": "bandit", "method": method,
                             "rule": "ucb", "config": "{}", "variant": "", "seed": seed,
                             "task_id": task, "metric": "cumulative_regret", "x": x,
                             "value": value})
    write(tmp_path, "bandit_tuned", pd.DataFrame(rows), inputs="x")
    from spice_ray.common.artifacts import write_checked_text

    write_checked_text(tmp_path / "results" / "tuning.json", json.dumps({"bandit": {"methods": {
        "SPICE": {"chosen": {"beta": 2.0}}, "SPICE (flat prior)": {"chosen": {
            "beta_schedule": "sqrt2logt"}}}}}))  # with its sidecar, as the stage writes it
    metrics, params = tuning.headline(tmp_path, ["bandit", "darkroom"])
    assert metrics == {"bandit/SPICE/final_regret": 4.0,
                       "bandit/SPICE_flat_prior/final_regret": 6.0}
    assert params == {"bandit/SPICE/beta": 2.0,
                      "bandit/SPICE_flat_prior/beta_schedule": "sqrt2logt"}


def test_fit_width_pools_every_seeds_model_without_labels() -> None:
    """The tuning stage's width scale: one s maximising the validation targets' likelihood
    under every seed's model at once (the kernel on the pooled predictions), each seed's own s
    beside it, from actions and rewards alone (no label, means or optimal-action column)."""
    import numpy as np
    import torch

    from spice_ray.data.tasks import generate_tasks
    from spice_ray.evaluate.width import transition_predictions
    from spice_ray.fusion import fit_width_scale
    from spice_ray.model.registry import build_model, model_payload

    data = generate_tasks(BANDIT.env, BANDIT.data, "validation", np.arange(8))
    data = {k: v for k, v in data.items() if k not in ("label", "means", "optimal_action")}
    models = {seed: build_model("spice", BANDIT, torch.Generator().manual_seed(seed))
              for seed in (0, 1)}
    spec = AgentSpec("spice", fusion=BANDIT.fusion)
    fit = tuning.fit_width(spec, BANDIT, data, {s: model_payload(m) for s, m in models.items()})
    parts = []
    for seed, model in models.items():
        mean, std, y, complete = transition_predictions(model, data, BANDIT.env, spec.fusion)
        parts.append([x[complete] for x in (mean, std, y)])
        assert fit["per_seed"][str(seed)] == fit_width_scale(*parts[-1], BANDIT.fusion.noise_var)
    pooled = [torch.cat(x) for x in zip(*parts, strict=True)]
    assert fit["scale"] == fit_width_scale(*pooled, BANDIT.fusion.noise_var)
    assert fit["targets"] == 2 * 8 * BANDIT.env.horizon
    assert fit["log_lik"] >= fit["log_lik_paper"]  # s maximises it; s = 1 is one candidate
    assert 0.0 <= fit["scale"] and fit["per_seed"]["0"] != fit["per_seed"]["1"]


def test_tuning_json_is_read_only_while_it_matches_its_checksum(tmp_path, caplog) -> None:
    """``results/tuning.json`` decides every tuned table: written with a SHA-256 sidecar, read
    back while it matches; an edit since (a score lowered by hand) makes the stage tune every
    experiment again, naming the file, and so does one whose sidecar is gone (deleting it let
    an edit through)."""

    from spice_ray.common.artifacts import sidecar_path, write_checked_text

    path = tmp_path / tuning.TUNING_FILE
    path.parent.mkdir(parents=True)
    record = {"bandit": {"methods": {"SPICE": {"grid": [{"setting": {"beta": 1.0},
                                                          "mean": 2.0}]}}}}
    write_checked_text(path, json.dumps(record))
    assert tuning.read_tuning(tmp_path) == record
    path.write_text(json.dumps(record).replace("2.0", "0.5"))
    with caplog.at_level("WARNING"):
        assert tuning.read_tuning(tmp_path) == {}
    assert "tuning.json: SHA-256 mismatch (corrupted): every choice is tuned again" in caplog.text
    sidecar_path(path).unlink()
    caplog.clear()
    with caplog.at_level("WARNING"):
        assert tuning.read_tuning(tmp_path) == {}
    assert "tuning.json: no checksum sidecar (interrupted write): every choice is tuned again" \
        in caplog.text
    write_checked_text(path, json.dumps(record))
    assert tuning.read_tuning(tmp_path) == record


def test_the_final_protocol_is_the_curves_last_step_exactly() -> None:
    """The tuning stage scores candidates on the "final" protocol: the same rollouts as the
    online curves, only the main reading's cumulative regret at the last step, so every
    validation score (and tuning.json) is what the curves gave, bit for bit."""
    from spice_ray.data.tasks import generate_tasks
    from spice_ray.evaluate.actors import evaluate_tasks

    cfg = make_config("smoke", "darkroom_region")
    data = generate_tasks(cfg.env, cfg.data, "validation", np.arange(6))
    base = AgentSpec("spice-flat", fusion=cfg.fusion, prior=(0.5, 1 / 12))
    specs = [c.spec for c in tuning.candidates(base, cfg.eval, None, 1.0)[:6]]
    curves = evaluate_tasks(cfg.env, cfg.eval, data, specs, protocols=("online",))
    final = evaluate_tasks(cfg.env, cfg.eval, data, specs, protocols=("final",))
    assert set(final["metric"]) == {"cumulative_regret"} and final["x"].nunique() == 1
    regret = curves[curves["metric"] == "cumulative_regret"]
    last = regret[regret["x"] == regret["x"].max()]
    key = ["method", "config", "task_id"]
    pd.testing.assert_frame_equal(final.sort_values(key).reset_index(drop=True),
                                  last.sort_values(key).reset_index(drop=True))
    pd.testing.assert_frame_equal(tuning.final_scores(final), tuning.final_scores(curves))
    with pytest.raises(ValueError, match=r"protocols \['finals'\] are invalid: .*, final$"):
        evaluate_tasks(cfg.env, cfg.eval, data, specs, protocols=("finals",))


def test_the_stage_writes_each_experiments_choices_as_they_come_in_in_its_order(
        monkeypatch, tmp_path) -> None:
    """``tune_all``: an experiment's record is written as soon as its last point is scored,
    and ``tuning.json`` lists the experiments in the run's order however the trials finished
    (here the last experiment first); an experiment whose inputs are unchanged is not run."""
    from spice_ray.study.tuning import Pending

    names = ("bandit", "bandit_template", "darkroom")
    configs = {name: make_config("smoke", name) for name in names}
    kept = {"methods": {"UCB": {"grid": [{}]}}, "tasks": 16, "inputs": "kept"}

    def prepare(name, cfg, dataset, finals, previous):
        if name == "bandit_template":
            assert previous == kept  # read back from tuning.json
            return previous
        return Pending(name, name, cfg.env, {"task_id": [0]}, [], {}, None, [0], 0.09)

    written = []

    def score_grid(pending, eval_cfg, on_done, console=None, scratch=None):
        assert [p.name for p in pending] == ["bandit", "darkroom"]
        for i in (1, 0):  # darkroom's trials finish first
            on_done(i, pd.DataFrame())
            written.append(list(json.loads((tmp_path / tuning.TUNING_FILE).read_text())))

    monkeypatch.setattr(tune_grid, "prepare", prepare)
    monkeypatch.setattr(tune_grid, "score_grid", score_grid)
    monkeypatch.setattr(tune_grid, "finish", lambda p, scores: {
        "methods": {"UCB": {"grid": [{}]}}, "tasks": 1, "inputs": p.name})
    # the kept record's tuned table is current: nothing is built from it, nothing re-scored
    monkeypatch.setattr(tune_grid, "tuned_table_current", lambda *args: True)
    rescored = []
    monkeypatch.setattr(tune_grid, "_rescored", lambda name, *args: rescored.append(name))
    from spice_ray.common.artifacts import write_checked_text

    write_checked_text(tmp_path / tuning.TUNING_FILE, json.dumps({"bandit_template": kept}))
    out = tune_grid.tune_all(configs, tmp_path, dict.fromkeys(configs, tmp_path), {})
    assert list(out) == ["bandit", "bandit_template", "darkroom"]
    assert written == [["bandit_template", "darkroom"], ["bandit_template", "bandit", "darkroom"]]
    assert list(json.loads((tmp_path / tuning.TUNING_FILE).read_text())) == [
        "bandit_template", "bandit", "darkroom"]
    assert rescored == []
    # its table to be built again: the kept record alone is scored again first (it passes)
    written.clear()
    monkeypatch.setattr(tune_grid, "tuned_table_current", lambda *args: False)
    tune_grid.tune_all(configs, tmp_path, dict.fromkeys(configs, tmp_path), {})
    assert rescored == ["bandit_template"]
