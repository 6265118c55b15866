"""Statistics beside mean +- SEM: bootstrap intervals, the interquartile mean, and the
probability of improvement (``spice_ray.results.summary``, the results CLI)."""

from __future__ import annotations

import dataclasses
import io

import numpy as np
import pandas as pd
import pytest

from spice_ray.results import ResultsError, summarise, write
from spice_ray.results.__main__ import main as results_main
from spice_ray.results.summary import STATS, bootstrap_ci, improvement, iqm


def _rows(values: dict[str, np.ndarray], seeds: int = 1, x: int = 10) -> pd.DataFrame:
    rows = []
    for method, vals in values.items():
        for seed in range(seeds):
            for task, v in enumerate(vals):
                rows.append({"env": "bandit", "method": method, "rule": "r", "config": "{}",
                             "seed": seed, "task_id": task, "metric": "cumulative_regret",
                             "x": x, "value": float(v) + 0.1 * seed})
    return pd.DataFrame(rows)


def test_bootstrap_interval_covers_the_mean_of_a_known_distribution() -> None:
    rng = np.random.default_rng(0)
    hits = 0
    for _ in range(40):
        low, high = bootstrap_ci(rng.normal(1.0, 1.0, 200))
        hits += low <= 1.0 <= high
        assert 0.2 < high - low < 0.4  # ~2 * 1.96 / sqrt(200) = 0.28
    assert hits >= 35  # a 95% interval: ~38 of 40
    assert bootstrap_ci(np.ones(5)) == (1.0, 1.0) and np.isnan(bootstrap_ci(np.ones(1))[0])


def test_bootstrap_resamples_seeds_as_well_as_tasks() -> None:
    """Three trained models (seeds) that differ by a constant: resampling tasks alone cannot
    see that spread, the crossed task x seed bootstrap does."""
    rng = np.random.default_rng(2)
    tasks = rng.normal(0.0, 1.0, 100)
    grid = tasks[:, None] + np.array([-1.0, 0.0, 1.0])[None, :]  # (T, S): a seed effect of +-1
    low1, high1 = bootstrap_ci(grid.mean(axis=1))
    low2, high2 = bootstrap_ci(grid)
    assert high2 - low2 > 2 * (high1 - low1)
    assert low2 < grid.mean() < high2
    assert bootstrap_ci(grid) == (low2, high2)  # seeded: the same interval every call
    holes = grid.copy()
    holes[0, 2] = np.nan  # a seed without that task still gives a finite interval
    assert np.isfinite(bootstrap_ci(holes)).all()


def test_summaries_by_stat() -> None:
    rng = np.random.default_rng(1)
    vals = rng.normal(2.0, 1.0, 100)
    vals[:5] = 50.0  # a heavy tail: the mean moves, the IQM barely does
    df = _rows({"A": vals}, seeds=2)
    sem = summarise(df, ["method"]).iloc[0]
    boot = summarise(df, ["method"], "bootstrap").iloc[0]
    mid = summarise(df, ["method"], "iqm").iloc[0]
    per_task = vals + 0.05  # seeds 0 and 1 averaged per task
    assert sem["mean"] == pytest.approx(per_task.mean()) and sem["n"] == 100
    assert boot["mean"] == pytest.approx(per_task.mean())
    assert boot["ci_low"] < boot["mean"] < boot["ci_high"]
    assert mid["iqm"] == pytest.approx(iqm(per_task)) and abs(mid["iqm"] - 2.05) < 0.3
    assert mid["ci_low"] <= mid["iqm"] <= mid["ci_high"]
    assert summarise(df, ["method"], "bootstrap").equals(summarise(df, ["method"], "bootstrap"))


def test_probability_of_improvement_is_paired_by_task() -> None:
    a = np.arange(20.0)
    b = a + np.r_[np.full(15, 1.0), np.full(5, -1.0)]  # a is lower (better) on 15 of 20 tasks
    got = improvement(_rows({"A": a, "B": b}), "A", "B", "cumulative_regret")
    assert got["probability"] == pytest.approx(0.75) and got["n"] == 20
    assert got["ci_low"] < 0.75 < got["ci_high"]
    tie = improvement(_rows({"A": a, "B": a}), "A", "B", "cumulative_regret")
    assert tie["probability"] == 0.5


def test_cli_stats_and_compare(tmp_path, capsys) -> None:
    a = np.arange(20.0)
    write(tmp_path, "bandit_online", _rows({"SPICE": a, "DPT": a + 3.0}))
    assert results_main([str(tmp_path), "bandit_online", "--by", "method", "--stat",
                         "bootstrap", "--format", "csv"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "method,mean,ci_low,ci_high,n,seeds"
    assert results_main([str(tmp_path), "compare", "SPICE", "DPT"]) == 0
    out = capsys.readouterr().out
    assert "P(SPICE beats DPT)" in out and "1.0" in out
    assert results_main([str(tmp_path), "compare", "SPICE"]) == 2
    assert "two methods" in capsys.readouterr().err


def test_a_summary_by_method_keeps_a_methods_settings_apart(tmp_path, capsys) -> None:
    """``--by method`` pooled SPICE at a fixed beta and at the sqrt(2 log t) schedule into one
    row over twice the tasks: each setting is its own row (n = tasks), labelled as the report
    labels it, unless pooling is asked for."""
    tasks = np.arange(10.0)
    fixed = _rows({"SPICE": tasks}).assign(config='{"beta":1.0,"beta_schedule":"fixed"}')
    theory = _rows({"SPICE": tasks + 4.0}).assign(
        config='{"beta":1.0,"beta_schedule":"sqrt2logt"}')
    df = pd.concat([fixed, theory, _rows({"DPT": tasks + 9.0})], ignore_index=True)
    for stat in STATS:
        s = summarise(df, ["method"], stat)
        assert list(s["n"]) == [10, 10, 10] and list(s.columns[:2]) == ["method", "config"]
    s = summarise(df, ["method"]).set_index("config")
    assert s.loc['{"beta":1.0,"beta_schedule":"fixed"}', "mean"] == pytest.approx(4.5)
    assert s.loc['{"beta":1.0,"beta_schedule":"sqrt2logt"}', "mean"] == pytest.approx(8.5)
    # pooled on request, each task counted once (its two settings averaged), not twice
    pooled = summarise(df, ["method"], pool=True).set_index("method")
    assert pooled.loc["SPICE", "n"] == 10 and list(pooled.columns) == ["mean", "sem", "n",
                                                                         "seeds"]
    assert pooled.loc["SPICE", "mean"] == pytest.approx(6.5)
    assert pooled.loc["SPICE", "sem"] == pytest.approx(np.std(tasks + 2.0, ddof=1) / np.sqrt(10))
    write(tmp_path, "bandit_online", df)
    assert results_main([str(tmp_path), "bandit_online", "--by", "method", "--format",
                         "csv"]) == 0
    out = pd.read_csv(io.StringIO(capsys.readouterr().out))
    assert list(out.columns) == ["method", "label", "config", "mean", "sem", "n", "seeds"]
    assert dict(zip(out["label"], out["n"], strict=True)) == {
        "DPT": 10, "SPICE (beta=1.0, beta_schedule=fixed)": 10,
        "SPICE (beta=1.0, beta_schedule=sqrt2logt)": 10}
    assert results_main([str(tmp_path), "bandit_online", "--by", "method", "--pool",
                         "--format", "csv"]) == 0
    out = pd.read_csv(io.StringIO(capsys.readouterr().out))
    assert list(out.columns) == ["method", "mean", "sem", "n", "seeds"]
    assert out[["method", "mean", "n"]].values.tolist() == [["DPT", 13.5, 10],
                                                            ["SPICE", 6.5, 10]]


def test_a_labelled_method_takes_its_settings_inside_its_parentheses() -> None:
    from spice_ray.results.report import _label

    row = {"method": "SPICE (flat prior)", "variant": "", "config": '{"beta": 2.0}'}
    assert _label(pd.Series(row)) == "SPICE (flat prior, beta=2.0)"
    assert _label(pd.Series({**row, "method": "SPICE"})) == "SPICE (beta=2.0)"
    assert _label(pd.Series({**row, "config": "{}"})) == "SPICE (flat prior)"


def test_a_summary_never_pools_two_metrics() -> None:
    """``--by method`` on a table with a return and a regret averaged the two into one number
    (46.2 for every Darkroom agent: return + regret is the optimal return): metric stays apart,
    pooling settings or not."""
    tasks = np.arange(10.0)
    df = pd.concat([_rows({"A": tasks}), _rows({"A": 90.0 - tasks}).assign(
        metric="cumulative_return")], ignore_index=True)
    for pool in (False, True):
        s = summarise(df, ["method"], pool=pool).set_index("metric")
        assert list(s["n"]) == [10, 10]
        assert s.loc["cumulative_regret", "mean"] == pytest.approx(4.5)
        assert s.loc["cumulative_return", "mean"] == pytest.approx(85.5)
    one = summarise(df[df["metric"] == "cumulative_regret"], ["method"])
    assert "metric" not in one.columns


def test_paper_tables_bold_the_best_and_mark_rows_tied_with_it(tmp_path, capsys) -> None:
    """A: best; B = A + small noise (tied by the paired test, though its own SEM is as wide as
    A's); C = A + 1 (clearly worse). One metric at one x; --at last picks the final step."""
    rng = np.random.default_rng(0)
    a = rng.normal(5.0, 2.0, 40)
    noise = rng.normal(0.0, 0.05, 40)
    values = {"A": a, "B": a + noise - noise.mean() + 1e-3, "C": a + 1.0}
    df = pd.concat([_rows(values, x=5), _rows({k: v * 2 for k, v in values.items()}, x=10)])
    write(tmp_path, "bandit_online", df)
    assert results_main([str(tmp_path), "bandit_online", "--by", "method", "--at", "last",
                         "--format", "markdown"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "| Method | Cumulative regret (mean ± SEM) | Tasks |"
    assert out[2] == f"| A | **{2 * a.mean():.2f} ± {2 * a.std(ddof=1) / np.sqrt(40):.2f}** | 40 |"
    assert out[3].startswith("| B | ") and out[3].endswith(" † | 40 |")
    assert out[4].startswith("| C | ") and "†" not in out[4]
    assert results_main([str(tmp_path), "bandit_online", "--by", "method", "--at", "5",
                         "--format", "latex"]) == 0
    tex = capsys.readouterr().out
    assert r"\textbf{" + f"{a.mean():.2f}" + r" $\pm$" in tex and r"$^\dagger$ & 40 \\" in tex
    assert tex.index("A &") < tex.index("B &") < tex.index("C &")
    assert results_main([str(tmp_path), "bandit_online", "--by", "method", "--format",
                         "latex"]) == 2  # two x values: refused, naming the way out
    assert "--at last" in capsys.readouterr().err


def test_paper_tables_name_rows_as_short_as_tells_them_apart() -> None:
    """Settings appear only for a method with rows at other settings, as LaTeX math in a
    LaTeX table; a metric by its name; rows the short labels cannot tell apart keep their
    full label."""
    from spice_ray.results import paper

    table = pd.DataFrame({
        "method": ["SPICE", "SPICE", "SPICE (flat prior)", "UCB_x"],
        "variant": ["", "", "", ""],
        "config": ['{"beta": 1.0, "beta_schedule": "fixed"}', '{"beta_schedule": "sqrt2logt"}',
                   '{"beta": 2.0, "beta_schedule": "fixed", "kernel": "rbf", "tau": 0.7}',
                   "{}"],
        "label": ["long 1", "long 2", "long 3", "long 4"],
        "mean": [1.0, 2.0, 3.0, 4.0], "sem": [0.1] * 4, "n": [8] * 4,
        "best": [True, False, False, False], "tied": [False] * 4})
    assert list(paper.short_labels(table)) == ["SPICE (β=1)", "SPICE (β_t=√(2 ln t))",
                                               "SPICE (flat prior)", "UCB_x"]
    tex = paper.render(table, "latex", "cumulative_regret")
    assert r"Method & Cumulative regret & Tasks \\" in tex
    for row in (r"SPICE ($\beta{=}1$) & \textbf{1.00 $\pm$ 0.10} & 8 \\",
                r"SPICE ($\beta_t{=}\sqrt{2\ln t}$) & 2.00", r"UCB\_x & 4.00"):
        assert row in tex, tex
    two = table.assign(config=['{"beta": 1.0}', '{"beta": 1.0, "tau": 3}', "{}", "{}"])
    assert list(paper.short_labels(two))[:2] == ["long 1", "long 2"]
    assert paper.render(table, "markdown", "action_accuracy").startswith(
        "| Method | Action accuracy (mean ± SEM) |")


def test_every_method_has_one_colour_in_every_figure() -> None:
    """The figure style registry covers the method registry, a method's colour does not depend
    on the figure or its settings, and two methods never share a colour."""
    from spice_ray.agents.base import METHODS
    from spice_ray.results.plots import METHOD_ORDER, method_of, style

    # "SPICE (paper)" is SPICE at the paper's width: SPICE's colour, another dash
    labels = [m.label for m in METHODS.values() if m.label != "SPICE (paper)"]
    colours = {label: style(label)["color"] for label in labels}
    assert len(set(colours.values())) == len(colours)
    assert method_of("SPICE (paper)") == "SPICE"
    assert style("SPICE (paper)", 1)["color"] == colours["SPICE"]
    assert style("SPICE (paper)", 1)["linestyle"] != style("SPICE", 0)["linestyle"]
    # a method the order does not name (a newly registered agent) keeps one colour of its own
    new = style("Epsilon-greedy (ε=0.1)", 1)
    assert new["color"] == style("Epsilon-greedy")["color"] == style("Epsilon-greedy [x]")["color"]
    assert new["color"] not in {style(m)["color"] for m in METHOD_ORDER}
    assert method_of("SPICE (flat prior) (β=2)") == "SPICE (flat prior)"
    assert style("SPICE (flat prior) (β=2)", 1)["color"] == colours["SPICE (flat prior)"]
    assert style("SPICE (β=2)", 1)["linestyle"] != style("SPICE (β=1)", 0)["linestyle"]


def test_cluster_bootstrap_counts_clusters_not_tasks() -> None:
    """Ten goals of ten tasks each, every task of a goal scoring the same: the tasks carry ten
    draws' worth of information, not a hundred, and the interval says so (about sqrt(10)
    times wider than resampling tasks alone)."""
    from spice_ray.results.summary import RESAMPLES, bootstrap_ci, cluster_bootstrap_ci

    groups = np.repeat(np.arange(10), 10)
    values = groups.astype(float)
    lo, hi = bootstrap_ci(values)
    clo, chi = cluster_bootstrap_ci(values, groups)
    assert clo < 4.5 < chi and (chi - clo) > 2.5 * (hi - lo)
    assert cluster_bootstrap_ci(values, groups) == (clo, chi)  # seeded
    assert np.isnan(cluster_bootstrap_ci(values, np.zeros(100))[0])  # one cluster: no interval
    # the same draws as resampling each picked cluster with rng.choice (how it was written)
    rng = np.random.default_rng(3)
    values, groups = rng.normal(size=57), rng.integers(0, 19, 57)
    members = [np.flatnonzero(groups == g) for g in np.unique(groups)]
    draw = np.random.default_rng(0)
    means = [values[np.concatenate([draw.choice(members[g], len(members[g])) for g in
                                    draw.integers(0, len(members), len(members))])].mean()
             for _ in range(RESAMPLES)]
    assert cluster_bootstrap_ci(values, groups) == tuple(np.quantile(means, [0.025, 0.975]))


def test_several_x_in_a_group_are_refused_unless_pooled_and_the_iqm_is_inside_its_ci() -> None:
    """``summarise(df, ["method"], stat="iqm")`` over rows at every context length pooled
    20 x 16 values, and its IQM fell outside its own interval: several x in a group are now an
    error naming them; pooled on request, the estimate and the interval are of the same
    per-task values."""
    rng = np.random.default_rng(0)
    rows = []
    for x in (0, 5, 10):
        for task in range(16):
            for seed in (0, 1):
                rows.append({"method": "SPICE", "metric": "suboptimality", "x": x,
                             "task_id": task, "seed": seed,
                             "value": float(rng.exponential(1.0 + x))})
    df = pd.DataFrame(rows)
    with pytest.raises(ResultsError, match=r"at 3 values of x \(0, 5, 10\): add x"):
        summarise(df, ["method"], "iqm")
    by_x = summarise(df, ["method", "x"], "iqm")
    assert list(by_x["n"]) == [16, 16, 16]
    pooled = summarise(df, ["method"], "iqm", pool=True).iloc[0]
    assert pooled["n"] == 16 and pooled["ci_low"] <= pooled["iqm"] <= pooled["ci_high"]


def test_hierarchical_weights_equal_an_explicit_resample() -> None:
    """The weighted statistic of one resample equals the obvious computation on the drawn
    seeds and tasks written out (seed means per drawn task, then the mean of the drawn
    tasks), and clustered draws only take tasks of drawn clusters, as many as the clusters
    hold."""
    from spice_ray.results.summary import (
        _seed_means,
        hierarchical_draws,
        mean_ratio,
        weighted_mean,
    )

    rng = np.random.default_rng(5)
    a, b = rng.normal(3, 1, (12, 3)), rng.normal(5, 1, (12, 3))
    a[4, 1] = np.nan  # a seed without this task
    groups = np.repeat(np.arange(4), 3)
    w, v = hierarchical_draws(12, 3, groups, 50, np.random.default_rng(0))
    assert w.shape == (50, 12) and v.shape == (50, 3) and (v.sum(1) == 3).all()
    per_cluster = w.reshape(50, 4, 3).sum(2)  # each drawn cluster brings its 3 tasks' worth
    assert (w.sum(1) == 12).all() and (per_cluster % 3 == 0).all()
    assert (per_cluster == 0).any()  # some resamples leave a cluster out entirely
    got_mean = weighted_mean(_seed_means(a, v), w)
    got_ratio = mean_ratio([_seed_means(a, v), _seed_means(b, v)], w)
    for r in range(50):
        seeds = np.repeat(np.arange(3), v[r].astype(int))
        tasks = np.repeat(np.arange(12), w[r].astype(int))
        per_task = [np.nanmean(a[t, seeds]) if np.isfinite(a[t, seeds]).any() else np.nan
                    for t in tasks]
        kept = [i for i, x in enumerate(per_task) if np.isfinite(x)]
        assert got_mean[r] == pytest.approx(np.mean([per_task[i] for i in kept]))
        num = np.mean([per_task[i] for i in kept])
        den = np.mean([np.mean(b[tasks[i], seeds]) for i in kept])
        assert got_ratio[r] == pytest.approx(num / den)


def test_hierarchical_interval_holds_the_spread_between_trainings() -> None:
    """Three trainings that disagree (one closes the whole gap, two close none): resampling
    tasks with seeds averaged gives a tight interval around a third; the two-level bootstrap
    also draws the trainings, so its interval spans most of 0..1. With trainings that agree,
    the two-level interval is narrow too (at most twice the tasks-only one: drawing three
    seeds with replacement repeats a seed's task-level noise)."""
    from spice_ray.results.analysis import FLAT, LEARNED, ORACLE, tuned_gap
    from spice_ray.results.summary import TaskSeedValues

    rng = np.random.default_rng(2)
    flat = 10 + rng.normal(0, 1, (300, 1)).repeat(3, 1)
    oracle = flat - 4
    spice = flat - np.array([4.0, 0.0, 0.0]) + rng.normal(0, 0.3, (300, 3))
    values = TaskSeedValues(np.arange(300), (0, 1, 2),
                            {FLAT: flat, ORACLE: oracle, LEARNED: spice})
    (two,) = tuned_gap(values).itertuples()
    (one,) = tuned_gap(values.wide()).itertuples()
    assert two.gap_closed == pytest.approx(one.gap_closed) and 0.3 < one.gap_closed < 0.37
    assert one.hi - one.lo < 0.02 and two.lo < 0.05 and two.hi > 0.95
    agree = flat - 1.3 + rng.normal(0, 0.3, (300, 3))
    values = TaskSeedValues(np.arange(300), (0, 1, 2),
                            {FLAT: flat, ORACLE: oracle, LEARNED: agree})
    (two,) = tuned_gap(values).itertuples()
    (one,) = tuned_gap(values.wide()).itertuples()
    assert one.hi - one.lo <= two.hi - two.lo < 2 * (one.hi - one.lo) < 0.03
    assert tuned_gap(values).equals(tuned_gap(values))  # seeded


def test_task_seed_values_repeat_a_seedless_method_in_every_seed() -> None:
    from spice_ray.results.summary import TaskSeedValues

    rows = pd.concat([_rows({"SPICE": np.arange(4.0)}, seeds=3),
                      _rows({"Random": np.full(4, 9.0)}).assign(seed=-1)])
    values = TaskSeedValues.from_rows(rows[["method", "seed", "task_id", "value"]])
    assert values.seeds == (0, 1, 2) and (values.values["Random"] == 9.0).all()
    assert values.values["SPICE"][:, 2] == pytest.approx(np.arange(4.0) + 0.2)
    assert values.wide()["SPICE"].to_numpy() == pytest.approx(np.arange(4.0) + 0.1)


def test_confirmation_tasks_are_fresh_draws_of_the_eval_distribution() -> None:
    """The confirmation split: ids from CONFIRM_OFFSET on, the eval split's columns, the
    same tasks for the same config, none equal to an eval task; on the darkroom its goals
    are the eval split's held-out ones."""
    from spice_ray.config import make_config
    from spice_ray.data.tasks import generate_tasks
    from spice_ray.study.confirm import CONFIRM_OFFSET, confirmation_tasks

    for env in ("bandit_latent", "darkroom"):
        cfg = make_config("smoke", env)
        fresh = confirmation_tasks(cfg, 20)
        held = generate_tasks(cfg.env, cfg.data, "eval", np.arange(200))
        assert fresh.keys() == held.keys()
        assert (fresh["task_id"] == CONFIRM_OFFSET + np.arange(20)).all()
        again = confirmation_tasks(cfg, 20)
        assert all(np.array_equal(fresh[k], again[k]) for k in fresh)
        def rows(cols):  # each task's whole context (actions, rewards, states, ...)
            keys = sorted(k for k in cols if k != "task_id")
            return [b"".join(np.asarray(cols[k][i]).tobytes() for k in keys)
                    for i in range(len(cols["task_id"]))]

        assert not set(rows(fresh)) & set(rows(held))
        if env == "darkroom":
            goals = {tuple(g) for g in np.asarray(held["goal"])}
            assert {tuple(g) for g in np.asarray(fresh["goal"])} <= goals


def test_two_runs_are_compared_task_by_task_and_other_tasks_are_refused(tmp_path, capsys
                                                                        ) -> None:
    """``compare RUN_A RUN_B --table T``: each method's final regret paired by eval task across
    the runs (seeds averaged per task), A - B with its interval and P(A lower); runs whose
    eval tasks differ (another data seed) are refused by name."""
    from spice_ray.config import make_config
    from spice_ray.data import store
    from spice_ray.data.generate import generate_dataset
    from spice_ray.results.across import compare_runs

    cfg = make_config("smoke", "bandit")
    runs = {}
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        run = tmp_path / name
        c = cfg.replace(data=dataclasses.replace(cfg.data, seed=seed))
        c.write(run / "configs", "bandit.yaml")
        generate_dataset(c, store.dataset_dir(run / "datasets", c))
        runs[name] = run
    rng = np.random.default_rng(0)
    spice, dpt = rng.normal(3, 1, 12), rng.normal(5, 1, 12)
    for name, shift in (("a", 0.0), ("b", 1.0), ("c", 0.0)):
        rows = _rows({"SPICE": spice + shift, "DPT": dpt}, seeds=2).assign(
            experiment="bandit", variant="")
        write(runs[name], "bandit_tuned", rows)
    out = compare_runs(runs["a"], runs["b"], "bandit_tuned").set_index("method")
    assert out.loc["SPICE", "A - B"] == pytest.approx(-1.0)
    assert out.loc["SPICE", "P(A lower)"] == 1.0 and out.loc["SPICE", "tasks"] == 12
    assert out.loc["DPT", "A - B"] == pytest.approx(0.0) and out.loc["DPT", "P(A lower)"] == 0.5
    assert out.loc["SPICE", "ci_low"] <= -1.0 <= out.loc["SPICE", "ci_high"]
    with pytest.raises(ResultsError, match="bandit's eval tasks differ between"):
        compare_runs(runs["a"], runs["c"], "bandit_tuned")
    assert results_main(["compare", str(runs["a"]), str(runs["b"]), "--table", "bandit_tuned",
                         "--methods", "SPICE"]) == 0
    printed = capsys.readouterr().out
    assert "A - B" in printed and "SPICE" in printed and "DPT" not in printed
    assert results_main(["compare", str(runs["a"]), str(runs["c"]), "--table",
                         "bandit_tuned"]) == 2
    assert capsys.readouterr().err.startswith("error: bandit's eval tasks differ")


def test_a_registered_metric_carries_its_label_and_direction_everywhere() -> None:
    """A metric is declared once (``results.schema.register_metric``): its label heads tables,
    and which way is better decides the paper table's best row and P(improvement); the
    study's own metrics are registered the same way, and an unknown name reads plainly."""
    from spice_ray.results import paper
    from spice_ray.results.labels import metric_name
    from spice_ray.results.schema import METRICS, Metric, metric_info, register_metric

    assert metric_name("cumulative_regret") == "Cumulative regret"
    assert metric_info("cumulative_return").higher_is_better
    assert metric_name("goal_visits") == "Goal visits"  # nobody registered it
    success = Metric("success_rate", "Success rate", higher_is_better=True)
    try:
        register_metric(success)
        register_metric(success)  # the same entry again: a no-op
        with pytest.raises(ValueError, match="'success_rate' is already registered"):
            register_metric(Metric("success_rate", "Successes"))
        rows = pd.DataFrame([{"method": m, "config": "{}", "rule": "r", "seed": 0,
                              "task_id": t, "metric": "success_rate", "x": 10, "value": v}
                             for m, vals in (("A", (0.9, 0.8, 0.7)), ("B", (0.2, 0.3, 0.4)))
                             for t, v in enumerate(vals)])
        summary = summarise(rows, ["method"]).assign(label=lambda d: d["method"])
        table = paper.ranked(rows, summary)
        assert table["method"].tolist() == ["A", "B"] and table["best"].tolist() == [True, False]
        assert metric_name("success_rate") == "Success rate"
        assert improvement(rows, "A", "B", "success_rate")["probability"] == 1.0
        assert improvement(rows, "A", "B", "success_rate", lower_is_better=True)[
            "probability"] == 0.0
    finally:
        METRICS.pop("success_rate", None)


def test_the_results_cli_answers_help_and_a_bad_flag_before_pandas_loads() -> None:
    """``python -m spice_ray.results --help``, ``compare --help`` and an unknown flag parse
    before pandas, torch or scipy load (2 CPU-s before: the package imported its tables and
    summaries); asserted on the modules loaded, not on a clock."""
    from conftest import heavy_imports

    for argv, status in ((["--help"], 0), (["compare", "--help"], 0), (["RUN", "--nope"], 2)):
        assert heavy_imports("run_module('spice_ray.results', alter_sys=True)", argv) == \
            f"HEAVY [] CODE {status}", argv


def test_search_statistics_read_arrival_and_staying_off_the_return_curve() -> None:
    """Step rewards are the return's differences: an agent on the goal from step 3 to the end
    reached it at step 3 and stayed; one that left after arriving at step 2 stayed 1 of 4 later
    steps; one that never arrived counts in ``reached`` only; a curve with steps missing is
    refused."""
    from spice_ray.results.search import search_stats

    def episode(method: str, task: int, rewards: list[float]) -> list[dict]:
        ret = np.cumsum(rewards)
        return [{"method": method, "variant": "", "rule": "ucb", "config": "{}", "seed": 0,
                 "task_id": task, "metric": "cumulative_return", "x": t + 1,
                 "value": float(ret[t])} for t in range(len(rewards))]

    rows = pd.DataFrame(episode("A", 0, [0, 0, 1, 1, 1, 1]) + episode("A", 1, [0] * 6)
                        + episode("B", 0, [0, 1, 0, 1, 0, 0]) + episode("B", 1, [0] * 5 + [1]))
    stats = search_stats(rows).set_index("method")
    assert stats.loc["A", "episodes"] == 2 and stats.loc["A", "reached"] == 0.5
    assert stats.loc["A", "first_arrival"] == 3 and stats.loc["A", "on_goal_after"] == 1.0
    # B: arrivals at steps 2 and 6; after them 1 of 4 steps and 0 of 0 steps on the goal
    assert stats.loc["B", "reached"] == 1.0 and stats.loc["B", "first_arrival"] == 4
    assert stats.loc["B", "on_goal_after"] == 0.25
    with pytest.raises(ValueError, match="every step 1..T"):
        search_stats(rows[rows["x"] != 4])
    with pytest.raises(ValueError, match="no 'cumulative_return'"):
        search_stats(rows.assign(metric="cumulative_regret"))
