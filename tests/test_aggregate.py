"""Aggregates across experiments (``spice_ray.results.aggregate``): normalised scores against
Random, the IQM, probability of improvement and performance profiles, with seeded intervals."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from spice_ray.results import aggregate as agg
from spice_ray.results.aggregate import plot_aggregate
from spice_ray.results.summary import iqm


def _table(regrets: dict[str, list[list[float]]], x: int = 50) -> pd.DataFrame:
    """A tuned table's final rows: method -> [seed][task] final regret (one seed = NO_SEED)."""
    rows = []
    for method, per_seed in regrets.items():
        for s, values in enumerate(per_seed):
            seed = -1 if len(per_seed) == 1 else s
            for task, v in enumerate(values):
                for step, value in ((x // 2, v / 2), (x, v)):  # only the last step counts
                    rows.append({"method": method, "seed": seed, "task_id": task,
                                 "metric": "cumulative_regret", "x": step, "value": value})
    return pd.DataFrame(rows)


A = _table({"SPICE": [[10.0, 20.0], [30.0, 20.0]], "SPICE (flat prior)": [[20.0, 10.0]],
            "Random": [[100.0, 60.0]]})
B = _table({"SPICE": [[0.0, 8.0, 4.0], [0.0, 8.0, 4.0]], "SPICE (flat prior)": [[4.0, 8.0, 0.0]],
            "UCB": [[16.0, 16.0, 16.0]], "Random": [[16.0, 16.0, 16.0]]})


def test_scores_are_one_minus_regret_over_randoms_mean_per_seed_and_task() -> None:
    scores = agg.normalised_scores({"a": A, "b": B})
    np.testing.assert_allclose(scores.by_experiment["a"]["SPICE"],
                               [[1 - 10 / 80, 1 - 20 / 80], [1 - 30 / 80, 1 - 20 / 80]])
    # a reference without a training seed has the same score under every seed
    np.testing.assert_allclose(scores.by_experiment["a"]["SPICE (flat prior)"],
                               [[0.75, 0.875], [0.75, 0.875]])
    np.testing.assert_allclose(scores.by_experiment["b"]["Random"], np.zeros((2, 3)))
    assert scores.methods_everywhere() == ["SPICE", "SPICE (flat prior)", "Random"]
    assert scores.experiments_with("SPICE", "UCB") == ["b"]


def test_iqm_mean_and_improvement_over_tasks_after_averaging_seeds() -> None:
    scores = agg.normalised_scores({"a": A, "b": B})
    table = agg.aggregate_table(scores, reps=200).set_index("method")
    # SPICE's task scores (seed means): a: 1-20/80, 1-20/80; b: 1, 0.5, 0.75
    spice = np.array([0.75, 0.75, 1.0, 0.5, 0.75])
    assert table.loc["SPICE", "mean"] == pytest.approx(spice.mean())
    assert table.loc["SPICE", "IQM"] == pytest.approx(float(iqm(spice)))
    assert table.loc["SPICE", "tasks"] == 5 and table.loc["SPICE", "experiments"] == 2
    assert table.loc["Random", "mean"] == pytest.approx(0.0)  # zero by construction
    assert table.loc["Random", "mean low"] < 0 < table.loc["Random", "mean high"]
    for stat in ("IQM", "mean"):
        assert (table[f"{stat} low"] <= table[stat] + 1e-12).all()
        assert (table[stat] <= table[f"{stat} high"] + 1e-12).all()
    imp = agg.improvement_table(scores, reps=200).set_index("other")
    # vs flat: a: 0.75 < 0.75? tie, 0.75 < 0.875 loses; b: 1 > 0.75 wins, tie, 0.75 < 1 loses
    assert imp.loc["SPICE (flat prior)", "P(better)"] == pytest.approx((0.5 + 0 + 1 + 0.5 + 0) / 5)
    # each experiment once: a's 0.25 and b's 0.5 averaged, not its 2 + 3 tasks pooled
    each = imp.loc["SPICE (flat prior)"]
    assert each["P(better), per experiment"] == pytest.approx((0.25 + 0.5) / 2)
    assert each["per experiment low"] <= 0.375 <= each["per experiment high"]
    assert imp.loc["UCB", "P(better)"] == 1.0 and imp.loc["UCB", "experiments"] == 1
    assert agg.probability_of_improvement(np.array([1.0, 2.0]), np.array([0.0, 2.0])) == 0.75


def test_intervals_are_seeded_and_paired() -> None:
    rng = np.random.default_rng(0)
    big = _table({"SPICE": rng.uniform(0, 50, (3, 40)).tolist(),
                  "UCB": rng.uniform(0, 50, (1, 40)).tolist(), "Random": [[60.0] * 40]})
    scores = agg.normalised_scores({"a": A, "big": big})
    first = agg.aggregate_table(scores, reps=300, seed=4)
    pd.testing.assert_frame_equal(first, agg.aggregate_table(scores, reps=300, seed=4))
    assert not first.equals(agg.aggregate_table(scores, reps=300, seed=5))
    # paired: Random against itself is a tie on every resample
    same = agg.Scores({e: {"SPICE": s["Random"], "Random": s["Random"]}
                       for e, s in scores.by_experiment.items()})
    row = agg.improvement_table(same, reps=100).iloc[0]
    assert row["P(better)"] == row["low"] == row["high"] == 0.5
    scores = agg.normalised_scores({"a": A, "b": B})
    profile = agg.performance_profile(scores, reps=200)
    share, low, high = profile["SPICE"]
    # share of SPICE's 5 task scores above tau: all above 0.4, three above 0.7, one above 0.9
    at = {round(t, 2): i for i, t in enumerate(agg.TAUS)}
    assert share[at[0.4]] == 1.0 and share[at[0.7]] == 0.8
    assert share[at[0.9]] == pytest.approx(0.2)
    assert (low <= share + 1e-12).all() and (share <= high + 1e-12).all()
    assert np.all(np.diff(share) <= 0)  # a profile never rises


def test_missing_reference_or_task_is_named() -> None:
    with pytest.raises(ValueError, match="b: no 'Random' rows"):
        agg.normalised_scores({"a": A, "b": B[B["method"] != "Random"]})
    holes = A[~((A["method"] == "SPICE (flat prior)") & (A["task_id"] == 1))]
    with pytest.raises(ValueError, match="a: SPICE \\(flat prior\\) lacks a final regret"):
        agg.normalised_scores({"a": holes})
    zero = A.assign(value=np.where(A["method"] == "Random", 0.0, A["value"]))
    with pytest.raises(ValueError, match="a: Random's mean final regret is 0.0"):
        agg.normalised_scores({"a": zero})


def test_aggregate_figure_is_drawn(tmp_path) -> None:
    path = plot_aggregate(agg.aggregate(agg.normalised_scores({"a": A, "b": B}), reps=50),
                          tmp_path / "agg.png")
    assert path.stat().st_size > 10_000 and path.read_bytes()[:4] == b"\x89PNG"


def _curve_rows(curves: dict[str, list[float]], metric: str) -> pd.DataFrame:
    """Two tasks, one seed; each method's curve over x = 1, 2, ... (the task's offset 0, 1)."""
    return pd.DataFrame([{"method": m, "variant": "", "rule": "r", "config": "{}", "seed": 0,
                          "task_id": task, "metric": metric, "x": i + 1, "value": v + task}
                         for m, values in curves.items() for i, v in enumerate(values)
                         for task in (0, 1)])


def test_a_curve_hidden_under_another_is_named_and_the_zoom_names_what_it_shows(
        tmp_path, monkeypatch) -> None:
    """Offline, a flat prior's greedy arm is Thompson sampling's posterior mean: its curve lay
    exactly under TS's with no word of it. And the zoomed panel named TS on a table without
    it."""
    import matplotlib.pyplot as plt

    from spice_ray.results import plots

    df = _curve_rows({"SPICE (flat prior)": [0.3, 0.2, 0.1], "TS": [0.3, 0.2, 0.1],
                      "UCB": [0.3, 0.25, 0.2]}, "suboptimality")
    fig, ax = plt.subplots()
    assert plots._curves(ax, df, "suboptimality") == [
        "SPICE (flat prior) equals TS at every point (hidden under it)"]
    plt.close(fig)
    saved = {}
    monkeypatch.setattr(plots, "_save", lambda fig, path, note=None: saved.update(
        titles=[a.get_title() for a in fig.axes], note=note) or plt.close(fig))
    online = _curve_rows({"SPICE": [1.0, 2.0, 3.0], "UCB": [1.0, 2.5, 4.0],
                          "DPT": [10.0, 50.0, 100.0]}, "cumulative_regret")
    plots.plot_online(online, tmp_path / "o.png", "t")
    assert "zoomed to UCB, SPICE" in saved["titles"] and "hidden" not in saved["note"]


def test_figures_get_vector_copies_on_request(tmp_path) -> None:
    """--figure-format pdf,svg: every figure's PNG (the report's) and a copy in each format
    beside it; outside the block, PNG only; an unknown format is refused by name."""
    import pytest

    from spice_ray.results import plots
    from spice_ray.results.figure_files import extra_formats

    online = _curve_rows({"SPICE": [1.0, 2.0, 3.0], "UCB": [1.0, 2.5, 4.0]},
                         "cumulative_regret")
    with extra_formats(("png", "pdf", "svg")):
        plots.plot_online(online, tmp_path / "a.png", "t")
    assert (tmp_path / "a.pdf").read_bytes().startswith(b"%PDF")
    assert b"<svg" in (tmp_path / "a.svg").read_bytes()[:2000]
    assert (tmp_path / "a.png").read_bytes().startswith(b"\x89PNG")
    plots.plot_online(online, tmp_path / "b.png", "t")
    assert sorted(p.name for p in tmp_path.glob("b.*")) == ["b.png"]
    with pytest.raises(ValueError, match="figure format 'tiff' is invalid"):
        with extra_formats(("tiff",)):
            pass


def _drawn(monkeypatch):
    """Keep the figure a plot function saves (closed afterwards by the test) and its note."""
    from spice_ray.results import plots

    drawn = {}
    monkeypatch.setattr(plots, "_save", lambda fig, path, note=None: drawn.update(
        fig=fig, note=note) or path)
    return drawn


def test_visit_maps_share_one_integer_colour_scale_with_cell_ticks(tmp_path, monkeypatch
                                                                   ) -> None:
    """Each map had its own colour scale (0-2 beside 0-20), so agents could not be compared,
    with fractional ticks for counts and no cell ticks."""
    import matplotlib.pyplot as plt

    from spice_ray.results import plots

    rows = [{"method": m, "variant": "", "rule": "r", "config": "{}", "seed": 0,
             "task_id": task, "metric": "visits", "x": cell, "value": float(v)}
            for m, peak in (("SPICE", 20), ("Random", 2)) for task in (0, 1)
            for cell, v in ((0, peak - task), (11, 1), (99, 1))]  # a 10 x 10 grid
    drawn = _drawn(monkeypatch)
    plots.plot_visits(pd.DataFrame(rows), tmp_path / "v.png", "darkroom")
    fig = drawn["fig"]
    maps = [ax for ax in fig.axes if ax.images]
    assert len(maps) == 4 and {ax.images[0].get_clim() for ax in maps} == {(0.0, 20.0)}
    colourbar = next(ax for ax in fig.axes if not ax.images and ax.get_ylabel() == "visits")
    ticks = [t for t in colourbar.get_yticks() if 0 <= t <= 20]
    assert len(ticks) >= 3 and all(float(t).is_integer() for t in ticks)
    assert list(maps[0].get_xticks()) == [0, 2, 4, 6, 8]  # cells, every second one labelled
    assert "one scale for every map" in drawn["note"]
    plt.close(fig)


def test_robustness_is_points_with_sem_bars_on_a_log_axis_labelled_with_beta(
        tmp_path, monkeypatch) -> None:
    """Bars on a log axis have lengths that mean nothing, and SPICE's beta was left out."""
    import json

    import matplotlib.pyplot as plt

    from spice_ray.results import plots

    rows = [{"method": m, "variant": "", "rule": "r", "seed": 0, "task_id": task,
             "config": json.dumps({"sigma": sigma, **({"beta": 1.0} if m == "SPICE" else {})}),
             "metric": "final_regret", "x": 500, "value": base * (1 + sigma) + task}
            for m, base in (("SPICE", 5.0), ("DPT", 50.0)) for sigma in (0.1, 0.3)
            for task in range(4)]
    drawn = _drawn(monkeypatch)
    plots.plot_robustness(pd.DataFrame(rows), tmp_path / "r.png", "bandit")
    ax = drawn["fig"].axes[0]
    assert ax.get_yscale() == "log" and not ax.patches  # no bars
    assert len(ax.containers) == 2  # one errorbar (point and +- SEM) per method
    spice = next(c for c in ax.containers if c.get_label() == "SPICE (β=1)")
    _, (bar,) = spice.lines[0], spice.lines[2]
    segments = bar.get_segments()
    assert len(segments) == 2 and all(seg[0][1] < seg[1][1] for seg in segments)  # real SEMs
    assert "points: mean; bars: ± 1 SEM over 4 tasks" in drawn["note"]
    plt.close(drawn["fig"])


def test_weight_variants_are_drawn_in_distinct_saturated_colours() -> None:
    """darkroom_weights drew SPICE's four weight variants in pale tints of SPICE's and DPT's
    colours, whose overlapping bands merged into one grey mass."""
    import itertools

    from matplotlib.colors import to_rgb

    from spice_ray.results.plots import style

    labels = ["SPICE [all]", "SPICE [none]", "SPICE [iw]", "SPICE [adv]", "SPICE [epi]", "DPT"]
    rgb = {label: np.array(to_rgb(style(label)["color"])) for label in labels}
    luminance = {k: float(v @ [0.2126, 0.7152, 0.0722]) for k, v in rgb.items()}
    assert max(luminance.values()) < 0.66, luminance  # none pale on the white background
    closest = min(float(np.linalg.norm(rgb[a] - rgb[b]))
                  for a, b in itertools.combinations(labels, 2))
    assert closest > 0.3  # the nearest two differ by a third of the RGB cube's edge
    # every method's own colour too: none pale, none shared (LinUCB's and LinTS's were light
    # tints, hard to see on white), and no variant takes a method's
    from spice_ray.results.plots import _VARIANT_COLOURS, METHOD_ORDER

    own = {m: style(m)["color"] for m in METHOD_ORDER}
    pale = {m: c for m, c in own.items()
            if float(np.array(to_rgb(c)) @ [0.2126, 0.7152, 0.0722]) > 0.72}
    assert not pale, pale
    assert len(set(own.values())) == len(own)
    assert not set(_VARIANT_COLOURS.values()) & set(own.values())


def test_axis_labels_are_mathematical_text(tmp_path, monkeypatch) -> None:
    """The suboptimality axis read "mu* - mu(a_hat)" in ASCII."""
    import matplotlib.pyplot as plt

    from spice_ray.results import plots

    drawn = _drawn(monkeypatch)
    plots.plot_offline(_curve_rows({"SPICE": [0.3, 0.2], "UCB": [0.4, 0.3]}, "suboptimality"),
                       tmp_path / "o.png", "bandit")
    label = drawn["fig"].axes[0].get_ylabel()
    assert r"$\mu^* - \mu(\hat{a})$" in label and "mu*" not in label.replace(r"\mu^*", "")
    plt.close(drawn["fig"])


def test_per_task_boxes_go_logarithmic_only_when_one_method_would_flatten_the_rest(
        tmp_path, monkeypatch) -> None:
    """Random's final regret (about 200 on the linear bandit, against 3-15 for the others)
    drew every other box as a flat line at 0."""
    import matplotlib.pyplot as plt

    from spice_ray.results import plots

    rng = np.random.default_rng(0)

    def rows(scales: dict[str, float]) -> pd.DataFrame:
        return pd.DataFrame([{"method": m, "variant": "", "rule": "r", "config": "{}",
                              "seed": 0, "task_id": t, "metric": "cumulative_regret", "x": 200,
                              "value": float(scale * rng.gamma(4.0) / 4)}
                             for m, scale in scales.items() for t in range(50)])

    drawn = _drawn(monkeypatch)
    plots.plot_final_distribution(rows({"SPICE": 6.0, "UCB": 13.0, "LinUCB": 4.0,
                                        "Random": 200.0}), tmp_path / "a.png", "linear")
    ax = drawn["fig"].axes[0]
    assert ax.get_yscale() == "symlog" and ax.get_ylim()[0] == 0
    assert "logarithmic above 1, linear below" in drawn["note"]
    plt.close(drawn["fig"])
    plots.plot_final_distribution(rows({"SPICE": 70.0, "DPT": 90.0, "Random": 94.0}),
                                  tmp_path / "b.png", "darkroom")
    assert drawn["fig"].axes[0].get_yscale() == "linear" and "logarithmic" not in drawn["note"]
    plt.close(drawn["fig"])


def test_aggregate_panels_leave_out_random_and_group_improvement_by_shared_experiments(
        tmp_path, monkeypatch) -> None:
    """The aggregate figure labelled only its IQM rows, floated its legend and put a
    1-experiment and an 8-experiment P(improvement) on one undivided axis."""
    import re

    import matplotlib.pyplot as plt

    from spice_ray.results import figure_files

    drawn = {}
    monkeypatch.setattr(figure_files, "save", lambda fig, path, note=None: drawn.update(
        fig=fig, note=note) or path)
    plot_aggregate(agg.aggregate(agg.normalised_scores({"a": A, "b": B}), reps=50),
                   tmp_path / "agg.png")
    scores, profile, improve = drawn["fig"].axes[:3]
    assert [t.get_text() for t in scores.get_yticklabels()] == ["SPICE", "SPICE (flat prior)"]
    assert "filled: IQM, open: mean" in scores.get_xlabel()  # one row per method, both marks
    assert profile.get_legend() is not None
    labels = [t.get_text() for t in improve.get_yticklabels()]
    shared = [int(re.fullmatch(r".+ \((\d) exp\.\)", label).group(1)) for label in labels]
    assert sorted(shared) == shared and set(shared) == {1, 2}  # most shared at the top
    assert {label.rsplit(" (", 1)[0] for label in labels} == {"Random", "SPICE (flat prior)",
                                                                "UCB"}
    dividers = [line.get_ydata()[0] for line in improve.get_lines()
                if line.get_color() == "#999999"]
    assert dividers == [shared.index(2) - 0.5]  # one line, between the 1- and 2- groups
    plt.close(drawn["fig"])


def test_the_results_cli_exits_quietly_when_its_reader_goes_away() -> None:
    """``python -m spice_ray.results RUN | head``: once the pipe's reader has gone, the rest of
    the output is dropped with exit 0 and no traceback (the listing's writes stand in here)."""
    import subprocess
    import sys

    script = ("import spice_ray.results.__main__ as cli\n"
              "def main():\n"
              "    for i in range(200000):\n"
              "        print(f'table_{i:06d}   a line of the listing')\n"
              "    return 0\n"
              "cli.main = main\n"
              "raise SystemExit(cli._piped_main())\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdout.readline().startswith(b"table_000000")
    proc.stdout.close()  # the reader goes away mid-listing (as `head -1` does)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err.decode()[-2000:]
    assert b"Traceback" not in err and b"BrokenPipe" not in err, err.decode()[-2000:]
