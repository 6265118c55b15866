"""The darkroom read-out against training steps: one figure from the rows that
``tools/darkroom_prior.py --csv`` wrote, per family.

    python tools/plot_readout.py OUT.png darkroom=A.csv,B.csv darkroom_region=C.csv ...

Each panel is one family: the share of states where argmax Q-bar is an optimal action, pooled
over the read-out's positions h >= 10 and its states, where the walk has shown the goal
(solid) and where it has not (dashed), per seed (points) and pooled over seeds (line); the
context-free prior's share (the family's goal distribution, no context) as a flat line in the
same style, and the exact posterior's where the goal was shown. The rows must come from one
split (validation, the one a step budget is chosen by); a (steps, seed) read twice keeps its
first reading. Printed per family: the pooled shares, and the values' scale against Q*'s and
whether they follow the states (``value_summary``). Reads only the CSV files it is given;
writes only OUT.png.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from spice_ray.evaluate.darkroom_prior import (
    CONTEXTS,
    SHARES,
    SHOWN_FROM,
    pooled_shares,
    value_summary,
)


def read_family(paths: list[Path]) -> pd.DataFrame:
    """One family's read-out rows from its CSV files, refused unless they share one split."""
    frames = []
    for path in paths:
        if not path.is_file():
            raise SystemExit(f"error: {path}: no such file")
        frame = pd.read_csv(path)
        missing = {"h", "context", "n", "steps", "seed", "split", *SHARES} - set(frame)
        if missing:
            raise SystemExit(f"error: {path}: not a read-out CSV (no column "
                             f"{', '.join(sorted(missing))})")
        frames.append(frame)
    rows = pd.concat(frames, ignore_index=True)  # one read twice counts once (pooled_shares)
    splits = sorted(set(rows["split"]))
    if len(splits) != 1:
        raise SystemExit(f"error: {', '.join(map(str, paths))} mix the splits {splits}: a "
                         "read-out against steps is read on one")
    return rows


def plot(families: dict[str, pd.DataFrame], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(families), figsize=(max(4.2 * len(families), 8.0), 3.9),
                             sharey=True, squeeze=False)
    for ax, (name, rows) in zip(axes[0], families.items(), strict=True):
        shares = pooled_shares(rows)
        for context, style in zip(CONTEXTS, ("-", "--"), strict=True):
            one = shares[shares["context"] == context]
            seeds, pooled = one[one["seed"] >= 0], one[one["seed"] < 0]
            ax.plot(pooled["steps"], pooled["optimal_share"], style, color="C0", marker="o",
                    ms=3, label=f"learned, {context}")
            ax.scatter(seeds["steps"], seeds["optimal_share"], s=8, color="C0", alpha=0.4)
            ax.axhline(pooled["optimal_share_blind"].mean(), ls=style, color="C7", lw=1,
                       label=f"context-free, {context}")
            if context == "goal shown":
                ax.axhline(pooled["optimal_share_bayes"].mean(), ls=style, color="C2", lw=1,
                           label="exact posterior, goal shown")
        ax.set_title(f"{name} ({rows['split'].iloc[0]} contexts)", fontsize=9)
        ax.set_xlabel("training steps")
        ax.xaxis.set_major_locator(plt.MaxNLocator(5))
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel(f"argmax Q-bar optimal (h >= {SHOWN_FROM})")
    axes[0][0].set_ylim(0, 1.05)
    handles, labels = axes[0][0].get_legend_handles_labels()
    rows = 1 if len(families) >= 3 else 2  # a narrower figure stacks its legend in two rows
    fig.legend(handles, labels, fontsize=7, loc="lower center",
               ncol=-(-len(labels) // rows))
    fig.tight_layout(rect=(0, 0.05 + 0.04 * rows, 1, 1))
    fig.savefig(out, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=Path, help="the PNG to write")
    p.add_argument("families", nargs="+", metavar="FAMILY=CSV[,CSV...]",
                   help="a panel's title and its read-out CSV files")
    args = p.parse_args(argv)
    if args.out.suffix != ".png":
        raise SystemExit(f"error: {args.out}: the figure is written as .png")
    families = {}
    for item in args.families:
        name, sep, files = item.partition("=")
        if not sep or not name or not files:
            raise SystemExit(f"error: {item[:80]!r} is invalid: FAMILY=A.csv[,B.csv]")
        families[name] = read_family([Path(f) for f in files.split(",")])
    plot(families, args.out)
    for name, rows in families.items():
        shares = pooled_shares(rows)
        pooled = shares[shares["seed"] < 0].pivot(index="steps", columns="context",
                                                  values="optimal_share")
        print(f"{name}:\n{pooled.to_string(float_format=lambda v: f'{v:.3f}')}")
        values = value_summary(rows).set_index(["context", "steps"])
        print(f"{name}, values (Q-bar and Q* means; spread of max Q-bar and V* over states; "
              f"their correlation):\n{values.to_string(float_format=lambda v: f'{v:.3f}')}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
