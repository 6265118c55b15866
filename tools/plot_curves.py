"""Regret curves of methods from one or more finished runs, in one figure: for comparing a
setting that lives in two runs (``fusion.tail`` here, a preset, a trained budget), which a
run's own figures cannot.

    python tools/plot_curves.py OUT.png \
        "SPICE, paper's targets=runs/a:darkroom_region_tuned:SPICE" \
        "SPICE, bootstrapped tails=runs/b:darkroom_region_tuned:SPICE" ...

Each curve is ``LABEL=RUN:TABLE:METHOD``: the method's cumulative regret in that table against
the step, mean over tasks after averaging training seeds per task, with a band of one SEM
(``spice_ray.results.summarise``); a method keeps one colour across runs and a run one dash
(the first named solid), so one method's curves in two runs sit side by side. A method with
several settings in the table is refused (name a tuned table, one setting per method). Reads
only the tables named (checksums checked); writes only OUT.png.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from spice_ray.common.metrics import CUMULATIVE_REGRET


def parse_curve(text: str) -> tuple[str, Path, str, str]:
    """``"LABEL=RUN:TABLE:METHOD"`` -> (label, run, table, method); refused by name."""
    label, sep, rest = text.partition("=")
    parts = rest.split(":")
    if not sep or not label.strip() or len(parts) != 3 or not all(parts):
        raise SystemExit(f"error: curve {text[:120]!r} is not LABEL=RUN:TABLE:METHOD")
    return label.strip(), Path(parts[0]), parts[1], parts[2]


def curve(run: Path, table: str, method: str):
    """The method's mean cumulative regret and SEM against the step (seeds averaged per task)."""
    from spice_ray.results import load, summarise

    rows = load(run, table)
    rows = rows[(rows["method"] == method) & (rows["metric"] == CUMULATIVE_REGRET)]
    if rows.empty:
        raise SystemExit(f"error: {run} {table}: no {CUMULATIVE_REGRET} rows of method "
                         f"{method!r}")
    if rows["config"].nunique() > 1:
        raise SystemExit(f"error: {run} {table}: method {method!r} has "
                         f"{rows['config'].nunique()} settings; name a tuned table")
    return summarise(rows, ["x"]).sort_values("x")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("curves", nargs="+", help="LABEL=RUN:TABLE:METHOD")
    args = parser.parse_args(argv)
    specs = [parse_curve(text) for text in args.curves]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = list(dict.fromkeys(method for *_, method in specs))
    runs = list(dict.fromkeys(run for _, run, *_ in specs))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for label, run, table, method in specs:
        c = curve(run, table, method)
        colour = colours[methods.index(method) % len(colours)]
        ax.plot(c["x"], c["mean"], label=label, color=colour,
                linestyle=("-", "--", ":", "-.")[runs.index(run) % 4])
        ax.fill_between(c["x"], c["mean"] - c["sem"], c["mean"] + c["sem"],
                        color=colour, alpha=0.2, linewidth=0)
        last = c.iloc[-1]
        print(f"{label:45s} {last['mean']:7.2f} +- {last['sem']:.2f} at step {int(last['x'])} "
              f"({int(last['n'])} tasks)")
    ax.set(xlabel="step", ylabel="cumulative regret")
    ax.legend(fontsize=7)
    ax.text(0.01, -0.16, "mean ± 1 SEM over tasks (training seeds averaged per task)",
            transform=ax.transAxes, fontsize=7)
    fig.savefig(args.out, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
