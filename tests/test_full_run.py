"""The study end to end on the smoke preset; stage skipping; bad input; the results CLI."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import full_run_cli, heavy_imports

from spice_ray.common.console import CLOSE_LINE, PROGRESS_LINE
from spice_ray.results import load, summarise, write
from spice_ray.results.__main__ import main as results_main
from spice_ray.results.choices import paper_choice, record_problem, resolution
from spice_ray.results.schema import COLUMNS
from spice_ray.results.tables import write_frame
from spice_ray.study import plan_study, run_study, study_tables
from spice_ray.study.experiments import EXPERIMENTS

ROOT = Path(__file__).resolve().parents[1]


def _mtimes(run_dir: Path) -> dict[str, float]:
    files = [*run_dir.glob("results/*.parquet"), *run_dir.glob("checkpoints/**/final/*"),
             *run_dir.glob("datasets/*/manifest.json"), *run_dir.glob("figures/*.png")]
    return {str(p): p.stat().st_mtime_ns for p in files}


CONSOLE_LINE = re.compile(r"^(\[\d/6\] |  \S|spice-ray study|report: |figures: |tables: |time: )")
"""Every line the study prints: stage headers, indented unit lines, its first and last lines."""


def _work_done(plan) -> list[dict]:
    """The units of work a study invocation did: models fitted and evaluations run (what its
    timing record counts; a stage that found its outputs current adds none)."""
    return [u for u in plan.units if u.get("part") == "fit" or u["stage"] == "evaluate"]


@pytest.mark.ray
def test_full_run_smoke_end_to_end_and_rerun_skips(ray_local, tmp_path, capsys) -> None:
    """The command a user types, off a terminal: at most 70 lines beside the heartbeats (nine
    experiments: a line per dataset, model, evaluation and tuned table), every one ours, Ray's logs
    in <run>/logs; then every table, figure and the report; then a re-run does no work."""
    proc = subprocess.run([sys.executable, str(ROOT / "pipelines" / "full_run.py"), "--preset",
                           "smoke", "--out", str(tmp_path / "run")], capture_output=True,
                          text=True, timeout=900, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    # at most 70 lines besides the heartbeats a slow machine prints every 30 s off a terminal
    # (a loaded machine printed 71 with them: their number is the machine's, not the run's)
    steady = [line for line in lines if not PROGRESS_LINE.fullmatch(line)]
    assert 10 <= len(steady) <= 70, proc.stdout
    assert [line for line in lines if not CONSOLE_LINE.match(line)] == [], proc.stdout
    assert proc.stderr.strip() == "", proc.stderr[-3000:]
    assert re.match(r"time: +\d+ (s|min)", lines[-1]) and "pretrain" in lines[-1], lines[-1]
    # the console excerpt the docs show is this run's: the same stage headers and counts
    usage = (ROOT / "docs" / "usage.md").read_text().split("## Stage by stage")[1]
    excerpt = usage.split("```")[1].splitlines()
    headers = [re.sub(r" /\S+", " RUN", line) for line in excerpt if line.startswith("[")]
    assert headers == [re.sub(r" /\S+", " RUN", line) for line in lines
                       if line.startswith("[")], headers
    assert any(re.search(r"\d+/\d+ bandit spice seed 0: \d+ epochs, loss [\d.]+ "
                         r"\(policy [\d.]+, td [\d.]+, shrink [\d.]+, anchor [\d.]+\)", line)
               for line in lines), proc.stdout
    # the figures stage says what it draws before it starts, and what it drew
    figures_at = lines.index(next(line for line in lines if line.startswith("[5/6] figures: ")))
    assert re.fullmatch(r"\[5/6\] figures: \d+ tables \(matplotlib\)", lines[figures_at])
    drew = next(i for i in range(figures_at + 1, len(lines)) if "PNG files" in lines[i])
    # its close line in the console's grammar, whatever the machine's load took
    closed = CLOSE_LINE.fullmatch(lines[drew])
    assert closed and closed["desc"] == "figures", lines[drew]
    assert re.fullmatch(r"\d+ PNG files", closed["summary"]), lines[drew]
    # between them, only the heartbeats a slow machine prints every 30 s off a terminal (the
    # first, before any rate exists, without an ETA)
    beats = [PROGRESS_LINE.fullmatch(line) for line in lines[figures_at + 1:drew]]
    assert all(b and b["desc"] == "figures" and b["unit"] in ("table", "tables")
               for b in beats), lines[figures_at:drew + 1]
    logs = tmp_path / "run" / "logs"
    assert "[stage 4/6 evaluate]" in (logs / "driver.log").read_text()
    timing = json.loads((logs / "timing.json").read_text())
    assert set(timing["stages"]) == {"datasets", "pretrain", "tune", "evaluate", "figures",
                                     "total"}
    assert {u["stage"] for u in timing["units"]} == {"pretrain", "evaluate"}
    assert all(u["seconds"] >= 0 for u in timing["units"])
    assert (logs / "ray" / "raylet.out").exists() and any((logs / "ray").glob("worker-*.out"))
    plan = plan_study("smoke", tmp_path / "run")
    report = plan.run_dir / "report.md"
    # every model is found by what it is, not by its hash-named directory
    import spice_ray

    epi = spice_ray.SpicePolicy.from_run(plan.run_dir, "darkroom", variant="epi")
    assert repr(epi).startswith("SpicePolicy(darkroom, A=5, rule=ucb")
    assert spice_ray.DptPolicy.from_run(plan.run_dir, "bandit").env.name == "bandit"
    with pytest.raises(FileNotFoundError, match="no spice model of experiment 'bandit' seed 7"):
        spice_ray.SpicePolicy.from_run(plan.run_dir, "bandit", seed=7)
    run_dir = plan.run_dir
    tables = sorted(t.name for t in study_tables(plan))
    assert "darkroom_online_state" in tables  # the other regret reading's table
    # every method's settings chosen on validation tasks over one grid, then run once on eval
    tuning = json.loads((run_dir / "results" / "tuning.json").read_text())
    # the files that decide results carry their checksums like every table
    from spice_ray.common.artifacts import verify

    assert verify(run_dir / "results" / "tuning.json")[0] is not None
    assert verify(run_dir / "checkpoints" / "index.json")[0] is not None
    # DPT* acts greedily from its policy head: it has nothing to tune and no record
    assert set(tuning) == {n for n in plan.configs if EXPERIMENTS[n].tuned}
    assert "darkroom" in tuning and "darkroom_dpt_star" not in tuning
    assert {r["split"] for r in tuning.values()} == {"validation"}
    for name, record in tuning.items():
        for label, method in record["methods"].items():
            # the lowest mean, flagged unresolved where the validation set cannot resolve it
            made = resolution(method["grid"])
            assert method["chosen"] == made["chosen"] and method["resolution"] == made
            best = min(method["grid"], key=lambda g: g["mean"])["mean"]
            chosen = next(g for g in method["grid"] if g["setting"] == method["chosen"])
            assert chosen["mean"] == best, (name, label)
    grids = {label: len(m["grid"]) for label, m in tuning["darkroom"]["methods"].items()}
    widths = 3 if tuning["darkroom"]["methods"]["SPICE"]["width"]["decay"] else 2
    assert grids == {"SPICE": 20 * widths, "SPICE (flat prior)": 20 * 6, "Count-UCB": 5 * 6,
                     "DPT": 1, "Random": 1}  # beta (4 and the schedule) x tau (4) where a
    # kernel has one x SPICE's width: the paper's and the one fitted on validation contexts
    # without labels (and the fit's constant width where its decay with h is not 0);
    # x the other fused methods' noise variance (the darkroom's targets are n-step returns):
    # the config's, the one fitted with SPICE's width, and 1, 10, 100, 1000
    assert tuning["darkroom"]["noise_var"]["config"] == 0.09
    assert tuning["darkroom"]["noise_var"]["fitted"] > 0 and "noise_var" not in tuning["bandit"]
    for name, record in tuning.items():
        for label, method in record["methods"].items():
            assert ("width" in method) == (label == "SPICE"), (name, label)
            if label == "SPICE":
                width = method["width"]
                assert width["scale"] >= 0 and width["log_lik"] >= width["log_lik_paper"]
                assert set(width["per_seed"]) == {str(s) for s in plan.configs[name].seeds}
    assert len(tuning["bandit"]["methods"]["UCB"]["grid"]) == 4  # its c
    # the prior tables hold coverage and N_pri for both width sources: s = 1 and the fitted s
    for name, table in (("bandit", "calibration"), ("bandit_template", "bandit_template_prior")):
        scale = tuning[name]["methods"]["SPICE"]["width"]["scale"]
        widths = set(load(run_dir, table)["config"].map(
            lambda c: json.loads(c).get("width_scale", 1.0)))
        assert widths == {1.0, scale} if scale != 1.0 else {1.0}, (table, widths, scale)
    tuned = load(run_dir, "bandit_tuned")
    assert set(tuned["method"]) == {"SPICE", "SPICE (paper)", "DPT", "Emp", "UCB", "TS",
                                    "SPICE (flat prior)", "Random"}
    # SPICE (paper): the paper's width at the beta chosen among the paper-width points
    spice = tuning["bandit"]["methods"]["SPICE"]
    paper = [g for g in spice["grid"] if g["setting"]["width"] == "paper"]
    assert spice["paper"] == min(paper, key=lambda g: g["mean"])["setting"]
    paper_config = json.loads(tuned[tuned.method == "SPICE (paper)"].config.iloc[0])
    assert "width_scale" not in paper_config and (
        paper_config.get("beta") == spice["paper"].get("beta")
        or paper_config["beta_schedule"] == spice["paper"].get("beta_schedule"))
    assert (tuned.groupby("method")["config"].nunique() == 1).all()  # one setting each
    assert sorted(p.stem for p in (run_dir / "results").glob("*.parquet")) == tables
    declared = sorted([*(f"{t.name}.png" if i == 0 else f"{t.name}_{kind}.png"
                         for t in study_tables(plan) for i, kind in enumerate(t.figures)),
                       "aggregate.png"])
    figures = sorted(p.name for p in (run_dir / "figures").glob("*.png"))
    assert figures == declared and all((run_dir / "figures" / f).stat().st_size > 5_000
                                       for f in figures)
    assert {"bandit_online_distribution.png", "darkroom_visits.png"} <= set(figures)
    table = load(run_dir, "darkroom_visits")
    visits = table[table["metric"] == "visits"]
    horizon = plan.configs["darkroom"].eval.online_horizon
    per_task = visits.groupby(["method", "config", "seed", "task_id"])["value"].sum()
    assert (per_task == horizon).all()  # one cell per step: where each action was taken
    marks = table[table["metric"] != "visits"]  # the map's start and goal, one per rollout
    assert set(marks["metric"]) == {"start_cell", "goal_cell"}
    assert len(marks) == 2 * len(per_task)
    # the DPT* diagnosis replays the study's episode protocol: the same return per task as
    # its table; with "stay" forced on the goal the agent never leaves it and loses nothing
    from spice_ray.study.policy import DptPolicy
    from tools.dpt_star_episode import EXPERIMENT, STAY, episode_inputs, play

    model, env, data, horizon = episode_inputs(run_dir, seed=0, split="eval")
    star = load(run_dir, EXPERIMENT)
    star = star[(star.method == "DPT") & (star.seed == 0) & (star.x == star.x.max())
                & (star.metric == "cumulative_return")].sort_values("task_id")
    as_acts, stays = play(model, env, data, horizon, False), play(model, env, data, horizon, True)
    np.testing.assert_array_equal(as_acts["return"], star["value"].to_numpy())
    assert (stays["return"] >= as_acts["return"]).all()
    assert stays["on_goal"].sum() == stays["on_goal"][STAY]
    final = DptPolicy.checkpoint_of(run_dir, EXPERIMENT, "dpt", 0)  # named by --checkpoint
    named = play(episode_inputs(run_dir, checkpoint=final, split="eval")[0], env, data,
                 horizon, False)
    np.testing.assert_array_equal(named["return"], as_acts["return"])
    # its step budget: every epoch checkpoint played on validation, the best mean return
    # chosen; then that epoch's checkpoints on eval: the last one's is the table's return
    from tools.dpt_star_episode import main as dpt_star

    star_cfg = plan.configs[EXPERIMENT]
    capsys.readouterr()
    assert dpt_star([str(run_dir), "--every-checkpoint", "--csv", str(tmp_path / "b.csv"),
                     "--plot", str(tmp_path / "b.png")]) == 0
    assert (tmp_path / "b.png").stat().st_size > 10_000
    budget = pd.read_csv(tmp_path / "b.csv")
    assert sorted(set(budget["epoch"])) == list(range(1, star_cfg.train.epochs + 1))
    assert len(budget) == star_cfg.train.epochs * star_cfg.data.num_val_tasks
    best = budget.groupby("steps")["return"].mean()
    assert f"budget: {best.idxmax():,} steps" in capsys.readouterr().out
    assert dpt_star([str(run_dir), "--epoch", str(star_cfg.train.epochs), "--split", "eval"]) == 0
    assert f"return {star['value'].mean():.2f} [" in capsys.readouterr().out
    # the fusion probe scores a method's chosen point as the tuning stage did
    from tools.fusion_probe import main as probe

    tuned = json.loads((run_dir / "results" / "tuning.json").read_text())["bandit"]["methods"]
    chosen = tuned["SPICE"]["chosen"]  # at the paper's or the fitted width, as validation chose
    paper = tuned["SPICE"]["paper"]  # the best at the fusion config's own width: a --point
    assert paper.get("width") == "paper"  # sets beta alone
    point = ",".join(f"{k}={v}" for k, v in paper.items() if k != "width")
    capsys.readouterr()
    assert probe([str(run_dir), "bandit", "--chosen", "--point", point, "--on-chosen",
                  "rule=greedy,beta=0"]) == 0
    scored = {what: float(mean) for what, mean, _, _ in
              (line.rsplit(None, 3) for line in capsys.readouterr().out.splitlines())}
    assert np.isfinite(scored["SPICE chosen, rule=greedy,beta=0"])  # the same posterior, greedy
    recorded = {json.dumps(r["setting"], sort_keys=True): r["mean"]
                for r in tuned["SPICE"]["grid"]}
    assert scored[f"SPICE chosen {chosen}"] == pytest.approx(
        recorded[json.dumps(chosen, sort_keys=True)], abs=5e-3)
    assert scored[f"SPICE {point}"] == pytest.approx(
        recorded[json.dumps(paper, sort_keys=True)], abs=5e-3)
    if paper == chosen:
        assert scored[f"SPICE {point}"] == scored[f"SPICE chosen {chosen}"]
    # --set finds models by what they are: with the study's own setting, the study's models
    assert probe([str(run_dir), "bandit", "--point", point, "--set",
                  "train.lambda_shrink=1.0"]) == 0
    again = capsys.readouterr().out.splitlines()[-1].rsplit(None, 3)
    assert float(again[1]) == scored[f"SPICE {point}"]
    # --search: how the episodes of a darkroom point found the goal and stayed
    assert probe([str(run_dir), "darkroom_region", "--on-chosen", "rule=greedy,beta=0",
                  "--search"]) == 0
    found = re.search(r"reached (\S+), first arrival (\S+), on goal after (\S+)$",
                      capsys.readouterr().out.splitlines()[-1])
    assert found and 0 <= float(found[1]) <= 1
    # the prior-follow diagnosis reads the prior the calibration table scores: its pooled RMSE
    # against the exact posterior mean is the table's per-task one, pooled over tasks
    from tools.prior_follow import follow_table

    cal = load(run_dir, "bandit_template_prior")
    cal = cal[(cal.metric == "oracle_rmse") & (cal.seed == 0)]
    cal = cal[cal.config == cal.config.iloc[0]]
    n = plan.configs["bandit_template"].eval.num_tasks
    rows = [line.split() for line in
            follow_table(run_dir, "bandit_template", 0, n, split="eval").splitlines()[2:]]
    matched = [(float(rmse), np.sqrt((cal[cal.x == int(h)]["value"] ** 2).mean()))
               for h, _, rmse, _ in rows if int(h) in set(cal.x)]
    assert len(matched) >= 3 and all(got == pytest.approx(want, abs=1e-4)
                                     for got, want in matched), matched
    # on the validation split it reads other contexts: where a setting may be chosen from it
    held = follow_table(run_dir, "bandit_template", 0, n).splitlines()  # validation by default
    assert "validation tasks)" in held[0] and [line.split() for line in held[2:]] != rows
    # the darkroom read-out reads each epoch checkpoint of a training on validation contexts;
    # the last is the final model's
    from tools.darkroom_prior import main as darkroom_prior
    from tools.darkroom_prior import readout

    csv = tmp_path / "readout.csv"
    capsys.readouterr()
    seeds = plan.configs["darkroom_region"].seeds
    assert darkroom_prior([str(run_dir), "darkroom_region", "--seeds",
                           ",".join(map(str, seeds)), "--every-checkpoint", "--csv",
                           str(csv)]) == 0
    assert "by checkpoint:" in capsys.readouterr().out
    every = pd.read_csv(csv)
    epochs = plan.configs["darkroom_region"].train.epochs
    assert sorted(set(every["epoch"])) == list(range(1, epochs + 1))
    assert set(every["h"]) == {0, 10, 19} and set(every["split"]) == {"validation"}
    last = every[(every["epoch"] == epochs) & (every["seed"] == 0)].reset_index(drop=True)
    final = readout(run_dir, "darkroom_region", 0, 200, "validation")
    pd.testing.assert_frame_equal(last.drop(columns=["checkpoint"]),
                                  final.drop(columns=["checkpoint"]), check_dtype=False)
    # the end of the context, where the TD windows are cut: h = 50 (inside the context),
    # T - 5, T - 1 and T (the position no loss regresses): shown / not-shown shares, mean Q-bar
    from tools.last_positions import main as last_positions

    horizon = plan.configs["darkroom_region"].env.horizon
    assert last_positions([str(run_dir), "darkroom_region", "--epoch", str(epochs)]) == 0
    printed = capsys.readouterr().out.splitlines()
    hs = sorted({min(h, horizon) for h in (50, horizon - 5, horizon - 1, horizon)})
    assert printed[1].split()[3::3] == [str(h) for h in hs]
    cells = re.findall(r"(\S+) / (\S+) \((\S+)\)", printed[2])
    assert len(cells) == len(hs) and all(0 <= float(a) <= 1 or a == "nan" for a, _, _ in cells)
    text = report.read_text()
    study_order = [t.name for t in study_tables(plan)]
    places = [text.index(f"## {name}\n") for name in study_order]
    assert places == sorted(places)  # the report follows the study, not the alphabet
    assert (run_dir / "config.yaml").exists() and "```yaml" not in text  # configs: appendix
    assert "## Settings chosen on validation tasks" in text and "Ranked by final" in text
    # it opens with one screen: the first section is the summary, a row per tuned table that
    # links to it, and links to every other section
    headings = [line for line in text.splitlines() if line.startswith("## ")]
    assert headings[0] == "## Summary"
    summary = text.split("## Summary")[1].split("\n## ")[0]
    tuned = [t for t in study_order if t.endswith("_tuned")]
    rows = [line for line in summary.splitlines() if line.startswith("| [")]
    assert [re.match(r"\| \[(\w+)\]\(#(\w+)\)", r).group(2) for r in rows] == tuned
    for heading in headings[1:-1]:  # every section but the configs appendix is linked
        title = heading[3:]
        anchor = "#" + "".join(c for c in title.lower().replace(" ", "-")
                               if c.isalnum() or c in "-_")
        assert f"]({anchor})" in summary, title
    assert "[every config](configs.md)" in summary
    assert "[configs.md](configs.md)" in text and "```yaml" in (run_dir / "configs.md").read_text()
    # across experiments: normalised scores against Random, in every tuned table
    assert (run_dir / "figures" / "aggregate.png").stat().st_size > 10_000
    assert "## Across experiments (normalised scores)" in text and "IQM [95% CI]" in text
    assert "## Probability of improvement" in text
    cfg = plan.configs["bandit"]
    online = load(run_dir, "bandit_online")
    assert set(online["method"]) == {"SPICE", "DPT", "Emp", "UCB", "TS", "SPICE (flat prior)"}
    spice_configs = online[online.method == "SPICE"].config
    schedules = {json.loads(c).get("beta_schedule") for c in spice_configs}
    assert schedules == {"fixed", "sqrt2logt"}
    per = online.groupby("method")["task_id"].nunique()
    assert (per == cfg.eval.num_tasks).all()
    # the continuous Darkroom, from its environment file and its experiment entry alone
    cont = load(run_dir, "darkroom_continuous_online")
    methods = {"SPICE", "DPT", "SPICE (flat prior)", "Hill-climbing", "Random"}
    assert set(cont["method"]) == methods and set(cont["env"]) == {"darkroom_continuous"}
    assert set(load(run_dir, "darkroom_continuous_tuned")["method"]) == methods | {
        "SPICE (paper)"}
    assert set(cont["metric"]) == {"cumulative_regret", "cumulative_return"}
    assert cont["task_id"].nunique() == plan.configs["darkroom_continuous"].eval.num_tasks
    assert np.isfinite(cont["value"]).all()
    assert "## darkroom_continuous_online" in text and "about 24" in text
    assert online["x"].min() == 1 and online["x"].max() == cfg.eval.online_horizon
    regret = online[online["x"] == online["x"].max()]
    assert (regret["value"] >= 0).all()  # pseudo-regret never negative
    offline = load(run_dir, "bandit_offline")
    assert set(offline["method"]) == {"SPICE", "DPT", "Emp", "LCB", "TS", "SPICE (flat prior)"}
    dark = load(run_dir, "darkroom_online")
    assert {"SPICE (flat prior)", "Count-UCB", "Random", "DPT", "SPICE"} == set(dark["method"])
    assert "What the learned prior adds" in text
    assert "## Pretraining: steps and the train / validation gap" in text
    assert offline["x"].nunique() >= 20
    robust = load(run_dir, "bandit_robustness")
    assert {'"sigma":0.0', '"sigma":0.3', '"sigma":0.5'} <= {
        part for c in robust["config"] for part in c.strip("{}").split(",")
        if part.startswith('"sigma"')}
    weights = load(run_dir, "darkroom_weights")
    assert set(weights["variant"]) == {"none", "iw", "adv", "epi", "all", ""}
    # the structured families: their reference rows, and the oracle prior beats the flat one
    # (neither reads a trained model, so this holds on any machine)
    references = {"bandit_template": {"UCB", "TS", "TS (true prior)", "Random"},
                  "bandit_latent": {"UCB", "TS", "TS (true prior)", "Random"},
                  "linear_bandit": {"UCB", "LinUCB", "LinTS (true prior)", "Random"},
                  "darkroom_region": {"Count-UCB", "Nearest-unvisited", "Random"}}
    for family, extra in references.items():
        rows = load(run_dir, f"{family}_online")
        if family != "darkroom_region":  # the bandits' diagnostic and training-data rows
            extra = extra | {"SPICE (learned mean, exact sd)", "SPICE (training-data prior)"}
        assert set(rows["method"]) == {"SPICE", "SPICE (flat prior)", "SPICE (oracle prior)",
                                       "SPICE (context-free prior)",
                                       "Bayes posterior-UCB"} | extra, family
        assert f"Prior gap at beta=2, t={rows['x'].max()}" in text
    template = load(run_dir, "bandit_template_online")
    final = template[template["x"] == template["x"].max()].groupby("method")["value"].mean()
    assert final["SPICE (oracle prior)"] < final["SPICE (flat prior)"]
    assert final["Bayes posterior-UCB"] < final["UCB"]
    # the confirmation split: the tuned methods at their choices on fresh eval-distribution
    # tasks (ids no dataset holds), written once, then read back; beside the eval numbers
    import runpy

    from spice_ray.study.confirm import CONFIRM_OFFSET

    confirm = runpy.run_path(str(ROOT / "pipelines" / "confirm.py"))["main"]

    capsys.readouterr()
    assert confirm(["--out", str(run_dir), "--experiments", "bandit_template"]) == 0
    checked = load(run_dir, "bandit_template_confirm")
    tuned = load(run_dir, "bandit_template_tuned")
    n = plan.configs["bandit_template"].eval.num_tasks
    assert sorted(checked["task_id"].unique()) == list(range(CONFIRM_OFFSET, CONFIRM_OFFSET + n))
    assert set(checked["method"]) == set(tuned["method"]) and np.isfinite(checked["value"]).all()
    assert set(checked["metric"]) == {"cumulative_regret"}
    shown = (run_dir / "confirm.md").read_text()
    assert "| SPICE (oracle prior) |" in shown and "| in-context share |" in shown
    assert "scoring" in capsys.readouterr().out
    stamp = (run_dir / "results" / "bandit_template_confirm.parquet").stat().st_mtime_ns
    assert confirm(["--out", str(run_dir), "--experiments", "bandit_template"]) == 0
    assert "read back" in capsys.readouterr().out
    assert (run_dir / "results" / "bandit_template_confirm.parquet").stat().st_mtime_ns == stamp
    # confirming another experiment keeps the first in confirm.md (read back, not re-scored)
    assert confirm(["--out", str(run_dir), "--experiments", "bandit_latent"]) == 0
    both = (run_dir / "confirm.md").read_text()
    assert "### bandit_template" in both and "### bandit_latent" in both
    assert (run_dir / "results" / "bandit_template_confirm.parquet").stat().st_mtime_ns == stamp
    with pytest.raises(SystemExit):
        confirm(["--out", str(run_dir), "--experiments", "bandit_nope"])
    assert "no tuned table with a usable tuning record for bandit_nope" in capsys.readouterr().err
    # the training-data prior beside the exact context-free one (tools/data_prior.py), its
    # rows paired with the tuned table's by task: SPICE's mean there is the table's
    from spice_ray.results.analysis import final_task_seeds
    from tools.data_prior import main as data_prior

    capsys.readouterr()
    assert data_prior([str(run_dir), "bandit_template", "--confirm"]) == 0
    printed = capsys.readouterr().out
    assert "chosen on validation: {'beta'" in printed and "confirmation tasks" in printed
    spice = final_task_seeds(load(run_dir, "bandit_template_tuned")).wide()["SPICE"].mean()
    assert float(re.search(r"^  SPICE +([-\d.]+) \+-", printed, re.M)[1]) == \
        pytest.approx(spice, abs=5e-4)
    assert printed.count("SPICE (training-data prior)") == 4  # a row and a share a split
    # every query the README and docs/usage.md show runs as written on this run (their run
    # names mapped to it): a command or code block that drifts from the code fails here
    from docs_blocks import DOCS, on_run, policy_code, results_commands, table_code

    shown = [(doc.name, args) for doc in DOCS for args in results_commands(doc)]
    assert len(shown) >= 12, shown
    for doc, args in shown:
        capsys.readouterr()
        argv = [on_run(a, run_dir) for a in args]
        assert results_main(argv) == 0, (doc, args, capsys.readouterr().err)
    for doc in DOCS:
        for code in table_code(doc):
            exec(compile(on_run(code, run_dir), str(doc), "exec"), {})  # noqa: S102
    played = [code for doc in DOCS for code in policy_code(doc)]
    assert len(played) == 2, played  # the README's and the usage page's
    for code in played:
        scope: dict = {}
        exec(compile(on_run(code, run_dir), "policy block", "exec"), scope)  # noqa: S102
        assert scope["mean"].shape == scope["var"].shape == (5,)  # the darkroom's 5 actions
        assert np.isfinite(scope["mean"]).all() and (scope["var"] > 0).all()
    # a second run with the same config does no work
    before = _mtimes(run_dir)
    drawn = (run_dir / "figures" / "aggregate.png").stat().st_mtime_ns
    plan2 = plan_study("smoke", tmp_path / "run")
    run_study(plan2)
    assert _mtimes(run_dir) == before
    assert (run_dir / "figures" / "aggregate.png").stat().st_mtime_ns == drawn
    written = report.stat().st_mtime_ns  # (this re-run wrote it: the confirmation added tables)
    assert _work_done(plan2) == []  # no model fitted, nothing evaluated
    # a run of one experiment into the study keeps the report whole: every experiment's
    # sections and the across-experiment ones (a partial re-run once rewrote it from one)
    run_study(plan_study("smoke", tmp_path / "run", experiments=("bandit",)))
    assert report.stat().st_mtime_ns == written  # nothing changed: the report is kept too
    again = report.read_text()
    for section in ("## Across experiments (normalised scores)", "## Probability of improvement",
                    "## darkroom_online\n", "## bandit_latent_prior\n", "## bandit_online\n"):
        assert section in again, section
    # a copied run directory is still current: input hashes hold contents, not paths; its
    # report names the new directory, so it is written again, by a run of one experiment:
    # whole, every experiment's sections and the across-experiment ones
    shutil.copytree(run_dir, tmp_path / "moved")
    moved = plan_study("smoke", tmp_path / "moved", experiments=("bandit",))
    moved_before = _mtimes(moved.run_dir)
    run_study(moved)
    assert _mtimes(moved.run_dir) == moved_before
    rewritten = (moved.run_dir / "report.md").read_text()
    assert str(moved.run_dir) in rewritten and rewritten.replace(str(moved.run_dir), "") == \
        again.replace(str(run_dir), "")
    assert _work_done(moved) == []
    # one re-run finds three things: a bit flipped in a table (that experiment's tables are
    # recomputed, equal); a tuning record forged to be self-consistent (SPICE's worst point
    # chosen, its recorded mean lowered below every other, its resolution and the sidecar
    # recomputed), scored again before it makes a table, found and tuned again; and an honest
    # record about to make a table (bandit20's tuned table deleted), which passes its
    # re-score and is kept as it was
    from spice_ray.common.artifacts import write_checked_text

    table = run_dir / "results" / "bandit_online.parquet"
    good = load(run_dir, "bandit_online")
    data = bytearray(table.read_bytes())
    data[len(data) // 2] ^= 1
    table.write_bytes(bytes(data))
    tuning_file = run_dir / "results" / "tuning.json"
    honest_bytes = tuning_file.read_bytes()
    honest = {name: load(run_dir, f"{name}_tuned") for name in ("bandit", "bandit20")}
    (run_dir / "results" / "bandit20_tuned.parquet").unlink()
    forged = json.loads(honest_bytes)
    spice = forged["bandit"]["methods"]["SPICE"]
    worst = max(spice["grid"], key=lambda g: g["mean"])
    assert worst["setting"] != spice["chosen"]
    worst["mean"], worst["paired_se"] = min(g["mean"] for g in spice["grid"]) - 1.0, 0.0
    spice["chosen"], spice["resolution"] = dict(worst["setting"]), resolution(spice["grid"])
    if "paper" in spice:
        spice["paper"] = paper_choice(spice)
    write_checked_text(tuning_file, json.dumps(forged, indent=1))
    assert record_problem(forged["bandit"]) is None  # consistent: only a re-score finds it
    run_study(plan_study("smoke", tmp_path / "run"))
    pd.testing.assert_frame_equal(load(run_dir, "bandit_online"), good)
    for name, frame in honest.items():
        pd.testing.assert_frame_equal(load(run_dir, f"{name}_tuned"), frame)
    assert json.loads(tuning_file.read_text()) == json.loads(honest_bytes)
    assert report.stat().st_mtime_ns != written  # work was done: the report is written again
    after = _mtimes(run_dir)
    changed = sorted(Path(k).name for k in after if k not in before or after[k] != before[k])
    # (bandit's tuned table is current again once its record is tuned back to the honest one)
    assert changed == ["bandit20_tuned.parquet", "bandit_offline.parquet",
                       "bandit_online.parquet", "bandit_robustness.parquet",
                       "calibration.parquet"]


def test_bad_set_fails_before_any_work(tmp_path, capsys) -> None:
    out = tmp_path / "never"
    code, _, err = full_run_cli(["--preset", "smoke", "--out", str(out), "--set",
                                 "fusion.tau=-1"], capsys)
    assert code == 2
    assert "fusion.tau=-1" in err and "a float > 0" in err
    assert not out.exists()
    code, _, err = full_run_cli(["--preset", "smoke", "--out", str(out), "--set",
                                 "data.num_taks=3"], capsys)
    assert code == 2 and "unknown key 'data.num_taks'" in err
    assert not out.exists()


def test_help_names_every_stage_in_order(capsys) -> None:
    """``full_run.py --help`` left out the tuning stage."""
    code, out, _ = full_run_cli(["--help"], capsys)
    assert code == 0
    text = " ".join(out.split())
    places = [text.find(word) for word in ("datasets", "pretraining", "tuning", "evaluation",
                                           "result tables", "figures", "report.md")]
    assert -1 not in places and places == sorted(places), places


def test_help_and_a_bad_flag_load_nothing_heavy(tmp_path) -> None:
    """``full_run.py --help``, ``--preset nope`` and an unknown flag answer before torch,
    pandas, matplotlib or Ray are imported (they cost seconds: 6 CPU-s before the imports were
    deferred); asserted on the modules loaded, not on a clock. ``--list-experiments`` names
    the registry's experiments with the default set marked."""
    script = str(ROOT / "pipelines" / "full_run.py")
    for argv, status in ((["--help"], 0), (["--preset", "nope"], 2), (["--nope"], 2)):
        assert heavy_imports(f"run_path({script!r})", argv, tmp_path) == \
            f"HEAVY [] CODE {status}", argv
    listed = subprocess.run([sys.executable, str(ROOT / "pipelines" / "full_run.py"),
                             "--list-experiments"], capture_output=True, text=True,
                            timeout=300, cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr[-2000:]
    names = [line.split()[0] for line in listed.stdout.splitlines()]
    assert names == list(EXPERIMENTS)
    assert "bandit  (default)" in listed.stdout.splitlines()
    assert "darkroom_scale" in listed.stdout.splitlines()  # not in the default set


def test_dry_run_prints_the_plan(tmp_path, capsys) -> None:
    # eager value heads: the step timing would first compile the fused heads for the paper's
    # shapes (17 s on a fresh machine's empty compiler cache, as CI's always is)
    code, stdout, stderr = full_run_cli(["--preset", "paper", "--experiments", "darkroom",
                                         "--out", str(tmp_path / "p"), "--dry-run", "--set",
                                         "model.head_kernel=eager"], capsys)
    assert code == 0, stderr
    assert "101100 tasks" in stdout and "stage 2 pretraining" in stdout
    assert "3 seeds" in stdout and not (tmp_path / "p").exists()
    # its GPUs planned without one, from the steps' FLOP count: no CPU step is timed (a
    # paper-size one takes seconds and says nothing of a GPU's)
    assert "ms/step" not in stdout, stdout
    assert re.search(r"spice: [\d,]+ parameters, .*; no GPU here to time it: [\d.]+ PFLOP, "
                     r"~[\d.]+-[\d.]+ GPU-hours at 1-10 TFLOP/s", stdout), stdout
    assert re.search(r"all models: ~\d+ (h|min) .*timed from the steps' FLOPs at 3.2 TFLOP/s "
                     r"a GPU", stdout), stdout
    # the paper's 4 workers each train whole models (train.together), side by side
    assert "side by side on 4 workers: ~" in stdout, stdout
    # every stage timed, and the whole study
    assert re.search(r"darkroom +5 methods, 212 grid points .*: ~\d", stdout)
    assert re.search(r"darkroom +100 tasks, H=100, 2 actors x 0.5 CPU: ~\d", stdout)
    assert re.search(r"stage 5 figures: 9 PNG files of \d+ tables, ~\d+ s", stdout), \
        stdout
    # GPU and CPU parts apart, and said plainly that the plan does not fit a GPU-less machine
    assert re.search(r"GPU part \(pretraining, from the steps' FLOPs at 3.2 TFLOP/s a GPU\): "
                     r"~\d+ (h|min)", stdout), stdout
    assert re.search(r"CPU part, on this machine's \d+ cores? \(datasets ~.*tuning ~(\d+ h )?"
                     r"\d+ min.*\): ~\d", stdout), stdout
    assert "does not fit this machine: its pretraining asks for GPUs" in stdout
    assert "whole study" not in stdout  # no sum of GPU hours and this CPU's minutes


def _fixture_table(run_dir: Path) -> pd.DataFrame:
    rows = []
    for method, base in (("A", 1.0), ("B", 3.0)):
        for seed in (0, 1):
            for task in range(4):
                rows.append({"env": "bandit", "method": method, "rule": "c",
                             "config": "{}", "seed": seed, "task_id": task,
                             "metric": "cumulative_regret", "x": 9,
                             "value": base + task + 0.5 * seed})
    df = pd.DataFrame(rows)
    write(run_dir, "bandit_online", df)
    return df


def test_summaries_average_seeds_per_task_first(tmp_path) -> None:
    _fixture_table(tmp_path)
    s = summarise(load(tmp_path, "bandit_online"), ["method"]).set_index("method")
    # per-task means for A: 1.25, 2.25, 3.25, 4.25 -> mean 2.75, SEM = std/sqrt(4)
    per_task = np.array([1.25, 2.25, 3.25, 4.25])
    assert s.loc["A", "mean"] == pytest.approx(per_task.mean())
    assert s.loc["A", "sem"] == pytest.approx(per_task.std(ddof=1) / 2)
    assert s.loc["A", "n"] == 4 and s.loc["A", "seeds"] == 2
    assert s.loc["B", "mean"] == pytest.approx(4.75)


def test_curves_across_runs_are_the_summaries_and_refuse_what_they_cannot_draw(tmp_path,
                                                                               capsys) -> None:
    """tools/plot_curves.py: each curve is the method's summary (seeds averaged per task
    first), drawn into the one file it names; a malformed curve or a method with several
    settings is refused by name."""
    from tools.plot_curves import main as plot_curves
    from tools.plot_curves import parse_curve

    _fixture_table(tmp_path)
    out = tmp_path / "curves.png"
    assert plot_curves([str(out), f"A={tmp_path}:bandit_online:A",
                        f"B={tmp_path}:bandit_online:B"]) == 0
    printed = capsys.readouterr().out.splitlines()
    # A's per-task means 1.25, 2.25, 3.25, 4.25: mean 2.75, SEM std / sqrt(4) = 0.645
    assert printed[0].split()[:4] == ["A", "2.75", "+-", "0.65"]
    assert printed[1].split()[:2] == ["B", "4.75"]
    assert out.stat().st_size > 5_000
    with pytest.raises(SystemExit, match="is not LABEL=RUN:TABLE:METHOD"):
        parse_curve("A=run:table")
    mixed = _fixture_table(tmp_path).assign(config='{"beta":1.0}')
    write(tmp_path, "bandit_online", pd.concat([_fixture_table(tmp_path), mixed.assign(
        seed=mixed["seed"] + 2)]))
    with pytest.raises(SystemExit, match="method 'A' has 2 settings; name a tuned table"):
        plot_curves([str(out), f"A={tmp_path}:bandit_online:A"])


def test_resultsfull_run_cli(tmp_path, capsys) -> None:
    _fixture_table(tmp_path)
    assert results_main([str(tmp_path)]) == 0
    assert "bandit_online" in capsys.readouterr().out
    assert results_main([str(tmp_path), "bandit_online", "--by", "method", "--format",
                         "csv"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[0] == "method,mean,sem,n,seeds"
    assert out[1].startswith("A,2.75,") and out[2].startswith("B,4.75,")
    assert results_main([str(tmp_path), "bandit_online", "--where", "method == 'B'",
                         "--by", "method", "--format", "json"]) == 0
    assert '"mean":4.75' in capsys.readouterr().out.replace(" ", "")
    assert results_main([str(tmp_path), "nope"]) == 2
    assert "its tables: bandit_online" in capsys.readouterr().err
    assert results_main([str(tmp_path), "bandit_online", "--where", "bogus ==="]) == 2


def test_settings_read_as_typed_columns_for_where_and_by(tmp_path, capsys) -> None:
    """beta, width_scale, kernel ... are typed columns of their own in the stored table
    (missing where a method has none), beside config, so pandas and a query can filter and
    group on them; a table written before they were stored has them derived on reading."""
    rows = []
    for method, config in (("SPICE", '{"beta":1.0,"kernel":"rbf","width_scale":0.2}'),
                           ("SPICE", '{"beta":2.0,"kernel":"rbf"}'),
                           ("UCB", '{"c":0.5,"sigma":0.3}'), ("Random", "{}")):
        for task in range(3):
            rows.append({"experiment": "bandit", "env": "bandit", "method": method,
                         "rule": "ucb", "config": config, "seed": 0, "task_id": task,
                         "metric": "cumulative_regret", "x": 9,
                         "value": float(task) + len(config)})
    write(tmp_path, "bandit_online", pd.DataFrame(rows))
    df = load(tmp_path, "bandit_online", settings=True)
    assert df["beta"].dtype == "float64" and df["kernel"].dtype == "string"
    assert df["beta"].tolist()[:6] == [1.0] * 3 + [2.0] * 3
    assert df["beta"].isna().sum() == 6 and df["kernel"].isna().sum() == 6
    assert df["width_scale"].notna().sum() == 3 and df["c"].dropna().unique().tolist() == [0.5]
    assert "beta" not in load(tmp_path, "bandit_online").columns
    stored = pd.read_parquet(tmp_path / "results" / "bandit_online.parquet")
    assert list(stored.columns) == [*COLUMNS, "beta", "c", "kernel", "sigma", "width_scale"]
    assert stored["beta"].dtype == "float64" and stored["kernel"].dtype == "string"
    pd.testing.assert_frame_equal(stored, df)
    # a table from before: the schema's columns only, settings derived when read
    write_frame(tmp_path / "results" / "old.parquet", stored[list(COLUMNS)])
    pd.testing.assert_frame_equal(load(tmp_path, "old", settings=True), df)
    assert results_main([str(tmp_path), "bandit_online", "--where", "beta == 1",
                         "--by", "method", "--format", "csv"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[0] == "method,mean,sem,n,seeds" and len(out) == 2 and out[1].startswith("SPICE,")
    assert results_main([str(tmp_path), "bandit_online", "--where", "c < 1 or beta > 1",
                         "--by", "method,beta", "--format", "csv"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[0].startswith("method,beta,") and out[1].startswith("SPICE,2.0,")
    assert out[2].startswith("UCB,,")
    # on screen, the label stands for the config's JSON
    assert results_main([str(tmp_path), "bandit_online", "--by", "method"]) == 0
    screen = capsys.readouterr().out
    assert "SPICE (beta=1.0" in screen and '{"beta"' not in screen
    # and without --by too: no JSON column, no repeated experiment name; a hint at --at
    # where a group holds many steps
    many = pd.DataFrame([{**r, "x": x} for r in rows for x in range(1, 31)])
    write(tmp_path, "bandit_online", many)
    assert results_main([str(tmp_path), "bandit_online"]) == 0
    captured = capsys.readouterr()
    head = captured.out.splitlines()[0].split()
    assert head[:2] == ["label", "rule"] and "config" not in head and "experiment" not in head
    assert "SPICE (beta=2.0" in captured.out and '{"' not in captured.out
    assert "(30 values of x per row group: --at last, or --at N, keeps one)" in captured.err
    assert results_main([str(tmp_path), "bandit_online", "--at", "last"]) == 0
    assert "values of x" not in capsys.readouterr().err


def test_results_cli_hints_at_values_and_prints_summary_tables(tmp_path, capsys) -> None:
    """A filter that matches nothing says what the columns it names hold; a table of
    summaries (a sweep's *_summary) prints as stored instead of a traceback."""
    _fixture_table(tmp_path)
    assert results_main([str(tmp_path), "bandit_online", "--where",
                         "x == 500 and method == 'C'"]) == 1
    err = capsys.readouterr().err
    assert "no rows match; in bandit_online: x in {9}; method in {'A', 'B'}" in err
    write_frame(tmp_path / "sweeps" / "kb_summary.parquet", pd.DataFrame(
        {"config": ['{"beta":1}', '{"beta":2}'], "mean": [1.5, 2.5], "sem": [0.1, 0.2],
         "n": [4, 4]}))
    assert results_main([str(tmp_path), "sweeps/kb_summary", "--where", "mean > 2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and "2.5" in out[1]
    assert results_main([str(tmp_path), "sweeps/kb_summary", "--by", "config"]) == 2
    assert "holds summaries, not per-task values" in capsys.readouterr().err
    assert results_main([str(tmp_path), "sweeps/kb_summary", "--at", "last"]) == 2
    assert "--at needs the columns x and metric" in capsys.readouterr().err


def test_queries_print_settings_as_short_labels_within_120_columns(tmp_path, capsys) -> None:
    """Every query printed the row's whole JSON config (342-character lines with --stat
    bootstrap); the settings are a short label and typed columns now."""
    config = json.dumps({"beta": 1.0, "beta_schedule": "fixed", "kernel": "rbf", "tau": 0.7,
                         "kernel_space": "latent", "noise_var": 0.09, "v_min": 0.01,
                         "width_scale": 0.551, "width_decay": 0.0, "width_source": "ensemble",
                         "online_horizon": 500, "episodes": 1})
    df = _fixture_table(tmp_path)
    df["config"] = np.where(df["method"] == "A", config, "{}")
    df["method"] = df["method"].map({"A": "SPICE", "B": "UCB"})
    write(tmp_path, "bandit_online", df)
    for extra in ([], ["--by", "method", "--stat", "bootstrap"],
                  ["--by", "method,beta", "--stat", "iqm"]):
        assert results_main([str(tmp_path), "bandit_online", *extra]) == 0, extra
        out = capsys.readouterr().out.splitlines()
        assert out and max(map(len, out)) <= 120, (extra, out)
        assert '"noise_var"' not in "\n".join(out)
        if not extra:  # row by row: the method and its settings as one short label
            assert "SPICE (beta=1.0" in "\n".join(out)


def test_unwritable_out_dir_fails_clearly(tmp_path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "pipelines" / "generate_data.py"), "--preset", "smoke",
         "--out", str(blocker / "run")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert f"output directory {blocker / 'run'} is not writable" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.ray
def test_disk_full_fails_clearly_on_the_console_and_resumes(ray_local, tmp_path) -> None:
    """A full disk while writing the datasets: the console's stage line says 'failed', the last
    line names the error and the path and says a re-run resumes, no traceback, and Ray Data's
    logs are in the run's; the re-run of the dataset stage (in this process, on the session's
    Ray: a second driver would only add Ray's start-up) then completes the same run
    directory's dataset."""
    import os

    from spice_ray.common.faults import FAULT_ENV, fault_switch
    from spice_ray.data import store
    from spice_ray.data.generate import generate_stage

    env = dict(os.environ, **{FAULT_ENV: fault_switch(disk_full=True)})
    proc = subprocess.run([sys.executable, str(ROOT / "pipelines" / "full_run.py"), "--preset",
                           "smoke", "--experiments", "bandit", "--out", str(tmp_path / "run"),
                           "--set", "data.ray_data_min_tasks=0"],  # by Ray Data, as at scale
                          capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr[-2000:]
    # Ray Data's own log files reach the run's logs, a failed run's too
    assert any((tmp_path / "run" / "logs" / "ray" / "ray-data").glob("*.log"))
    assert "[1/6] datasets" in proc.stdout and ": failed" in proc.stdout
    error = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert error and "No space left on device" in error[0] and str(tmp_path) in error[0], \
        proc.stderr[-2000:]
    assert "a re-run resumes" in proc.stderr and "Traceback" not in proc.stderr
    assert FAULT_ENV not in os.environ
    cfg = plan_study("smoke", tmp_path / "run", experiments=("bandit",)).configs["bandit"]
    report = generate_stage(cfg)
    assert report.dataset_dir.parent == tmp_path / "run" / "datasets"
    assert report.generated and report.num_tasks == 128  # what the failed run did not write
    assert (report.dataset_dir / "manifest.json").is_file()
    assert len(store.load_split(report.dataset_dir, "train")["task_id"]) == \
        cfg.data.num_train_tasks


def test_relative_out_dirs_become_absolute(tmp_path, monkeypatch) -> None:
    """Ray workers and actors run in other working directories, so every path the stages ship
    to them must be absolute even when --out (or the default runs/<preset>) is relative."""
    import argparse

    from spice_ray.runtime.cli import add_config_args, config_from_args

    monkeypatch.chdir(tmp_path)
    plan = plan_study("smoke", "rel/run")
    assert plan.run_dir == tmp_path / "rel" / "run"
    assert all(Path(c.out_dir).is_absolute() for c in plan.configs.values())
    parser = argparse.ArgumentParser()
    add_config_args(parser)
    for argv in ([], ["--out", "x"]):
        cfg = config_from_args(parser.parse_args(["--preset", "smoke", *argv]))
        assert Path(cfg.out_dir).is_absolute() and cfg.out_dir.startswith(str(tmp_path))


def test_dry_run_says_when_the_machine_is_busy_and_keeps_its_columns(tmp_path,
                                                                     monkeypatch) -> None:
    """A loaded machine times slow steps: the plan says so; an experiment without a tuning
    grid says so instead of "0 methods"; long experiment names keep the columns aligned."""
    from spice_ray.study import dryrun, plan_study

    plan = plan_study("smoke", tmp_path / "p",
                      experiments=("darkroom_dpt_star", "bandit_latent"))
    monkeypatch.setattr(dryrun.os, "getloadavg", lambda: (9.0, 9.0, 9.0))
    monkeypatch.setattr(dryrun.os, "cpu_count", lambda: 2)
    text = dryrun.describe_plan(plan)
    assert "the machine is busy: load average 9.0 on 2 cores" in text
    # said first, with how much it inflates what is timed now
    assert text.splitlines()[1] == ("note: this machine is busy (load average 9.0 on 2 cores): "
                                    "the times timed now (steps, rollouts) are about 4.5x a "
                                    "quiet machine's")
    assert "whole study: ~" in text and "does not fit" not in text  # a CPU preset
    assert re.search(r"spice: [\d,]+ parameters, .*; \d+ ms/step on CPU: ~\d+ s of steps",
                     text), text  # a CPU preset's steps are timed here
    assert "  darkroom_dpt_star nothing to tune (a fixed protocol)" in text
    rows = [line for line in text.splitlines()
            if line.startswith(("  darkroom_dpt_star ", "  bandit_latent "))]
    assert len(rows) == 8  # datasets, pretraining, tuning, evaluation: one row each
    assert {line[2:19].rstrip() for line in rows} == {"darkroom_dpt_star", "bandit_latent"}
    assert all(line[19] == " " and line[20:].strip() for line in rows)  # one column of names
    monkeypatch.setattr(dryrun.os, "getloadavg", lambda: (0.1, 0.1, 0.1))
    assert "busy" not in dryrun.describe_plan(plan)


def test_a_variant_is_its_experiment_under_its_own_name(tmp_path) -> None:
    """``--variant NAME`` plans ``<experiment>--NAME``: its own tables, config file and
    tuning record, so another config of a study lives beside it (the refusal's way out);
    the report orders each experiment before its variants and the aggregate pools one per
    task set."""
    from spice_ray.config import ConfigError
    from spice_ray.study.experiments import EXPERIMENTS, experiment_named
    from spice_ray.study.reporting import aggregated, run_configs

    run = tmp_path / "run"
    base = plan_study("smoke", run, experiments=("bandit",))
    base.configs["bandit"].write(run / "configs", "bandit.yaml")
    with pytest.raises(ConfigError, match="--variant NAME to keep both"):
        plan_study("smoke", run, overrides=["fusion.noise_var=0.04"], experiments=("bandit",))
    plan = plan_study("smoke", run, overrides=["fusion.noise_var=0.04"],
                      experiments=("bandit",), variant="nv4")
    assert list(plan.configs) == ["bandit--nv4"] and plan.configs["bandit--nv4"].fusion.noise_var \
        == 0.04
    exp = EXPERIMENTS["bandit--nv4"]
    assert exp is experiment_named("bandit--nv4") and exp.env == "bandit"
    assert [t.name for t in exp.tables] == ["bandit--nv4_offline", "bandit--nv4_online",
                                            "bandit--nv4_robustness", "bandit--nv4_calibration"]
    assert exp.tuned_table().name == "bandit--nv4_tuned"
    for bad in ("bandit--", "bandit--a b", "nope--x", "bandit--" + "x" * 40):
        with pytest.raises(ValueError, match="is invalid"):
            experiment_named(bad)
    with pytest.raises(ConfigError, match="--variant 'a b' is invalid"):
        plan_study("smoke", run, experiments=("bandit",), variant="a b")
    # the report's experiments: both (each with a table written), the experiment first
    plan.configs["bandit--nv4"].write(run / "configs", "bandit--nv4.yaml")
    assert run_configs(run, plan.configs) == {"bandit--nv4": plan.configs["bandit--nv4"]}
    _fixture_table(run)  # a bandit_online table: the experiment is in the run
    both = run_configs(run, plan.configs)
    assert list(both) == ["bandit", "bandit--nv4"] and both["bandit"].fusion.noise_var == 0.09
    assert aggregated(both) == ["bandit"] and aggregated(plan.configs) == ["bandit--nv4"]
