"""Whether and when each method of a darkroom table reached the goal, and whether it stayed.

    python tools/search_stats.py RUN darkroom_region_tuned

Reads the online table (any table with ``cumulative_return`` at every step, e.g.
``<experiment>_tuned`` or ``<experiment>_online``) and prints per method at each of its
settings (``spice_ray.results.search``): the episodes (seed x task), the share that reached
the goal within the horizon, the median step of the first arrival, and the share of the later
steps spent on the goal. Grid darkrooms only (reward positive exactly on the goal). Nothing is
written.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from spice_ray.common.errors import SpiceRayError
from spice_ray.results.labels import setting_label
from spice_ray.results.search import search_stats
from spice_ray.results.tables import load


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", type=Path, help="a study's run directory")
    p.add_argument("table", help="an online darkroom table of the run")
    args = p.parse_args(argv)
    try:
        stats = search_stats(load(args.run, args.table))
    except (OSError, ValueError, SpiceRayError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    stats.insert(1, "setting", stats.pop("config").map(setting_label))
    with pd.option_context("display.width", 200, "display.max_colwidth", 60):
        print(stats.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
