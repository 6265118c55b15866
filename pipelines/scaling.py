"""The scaling ladder (opt-in, not part of the default study): DPT* on the darkroom and SPICE
on the latent and template bandits, trained through a geometric ladder of step budgets.

    python pipelines/scaling.py --out runs/scaling                       # 1x 3x 9x 30x, seed 0
    python pipelines/scaling.py --out runs/scaling --families bandit_latent --rungs 1,3
    python pipelines/scaling.py --out runs/scaling --seeds 0,1,2         # for a claim
    python pipelines/scaling.py --out runs/scaling --table-only          # table of finished rungs

Each rung is a study run of its own (``<out>/<family>/rung-<m>x``, the `small` preset's
experiment at m times its training steps, tuned on validation tasks and evaluated like the
study; every rung in this process, on one Ray) whose models resume from the rung below's
final checkpoints, so the ladder trains each model once. Interrupted, the same command
resumes: finished rungs are current and skipped by their own stages. After every rung,
``<out>/scaling.parquet`` (one row per rung and quantity, with a SHA-256 sidecar),
``scaling.md`` and ``scaling.png`` are rewritten.
"""

from __future__ import annotations

import argparse
import runpy
import sys
from pathlib import Path

import pandas as pd

from spice_ray.common.faults import stop_before_run
from spice_ray.config import ConfigError
from spice_ray.study.ladder import (
    FAMILIES,
    MULTIPLES,
    plan_ladder,
    rung_rows,
    seed_datasets,
    seed_rung,
    write_ladder,
)

FULL_RUN = Path(__file__).resolve().parent / "full_run.py"


def _ints(text: str, what: str) -> list[int]:
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise SystemExit(f"error: --{what} {text!r} is invalid: comma-separated integers") \
            from None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="the ladder's directory")
    p.add_argument("--families", default=",".join(FAMILIES),
                   help="comma-separated, of " + ", ".join(FAMILIES) + " (default: all)")
    p.add_argument("--rungs", default=",".join(map(str, MULTIPLES)),
                   help="multiples of the preset's training steps (default: %(default)s)")
    p.add_argument("--seeds", default="0", help="training seeds (default: %(default)s)")
    p.add_argument("--preset", default="small", help="the preset each rung scales "
                   "(default: %(default)s; smoke for a quick check)")
    p.add_argument("--set", dest="overrides", action="append", default=[],
                   metavar="SECTION.FIELD=VALUE", help="a config override for every rung")
    p.add_argument("--address", default=None, help="a Ray cluster (e.g. auto)")
    p.add_argument("--table-only", action="store_true",
                   help="rewrite the ladder's table and figure from the rungs already "
                        "finished, running nothing")
    args = p.parse_args(argv)
    try:
        rungs = plan_ladder(args.out, [f for f in args.families.split(",") if f],
                            _ints(args.rungs, "rungs"), args.preset,
                            _ints(args.seeds, "seeds"), args.overrides)
    except ConfigError as exc:
        print(f"error: bad config: {exc}", file=sys.stderr)
        return 2
    stop_before_run("scaling.py")
    rows: list[pd.DataFrame] = []
    if args.table_only:
        done = [r for r in rungs if (r.run_dir / "report.md").exists()]
        if not done:
            print(f"error: no finished rung under {args.out}", file=sys.stderr)
            return 1
        paths = write_ladder(args.out, pd.concat([rung_rows(r) for r in done],
                                                 ignore_index=True))
        print(f"ladder table from {len(done)} finished rung(s): {paths[0]} ({paths[1].name}, "
              f"{paths[2].name})")
        return 0
    # every rung's study runs in this process, on one Ray (started by the first rung, joined by
    # the rest): a rung in a process of its own paid the interpreter, the imports and Ray's
    # start-up again, about 20 s a rung on 2 cores
    full_run = runpy.run_path(str(FULL_RUN), run_name="scaling_rung")["cli"]
    below: dict[str, Path] = {}
    for i, rung in enumerate(rungs, 1):
        print(f"scaling ladder [{i}/{len(rungs)}] {rung.family} {rung.multiple}x: "
              f"{rung.steps:,} steps per model -> {rung.run_dir}", flush=True)
        if rung.family in below:
            seeded = seed_rung(below[rung.family], rung.run_dir)
            if seeded:
                print(f"  resumes {len(seeded)} model(s) from {below[rung.family].name}",
                      flush=True)
            if seed_datasets(below[rung.family], rung):
                print(f"  reads the datasets of {below[rung.family].name} (copied)", flush=True)
        argv = ["--preset", args.preset, "--experiments", rung.family, "--out",
                str(rung.run_dir)]
        argv += [a for o in rung.overrides for a in ("--set", o)]
        if args.address:
            argv += ["--address", args.address]
        try:
            full_run(argv)
            code = 0
        except SystemExit as exc:  # full_run's one-line errors have printed their line
            code = 0 if exc.code is None else exc.code if isinstance(exc.code, int) else 1
        if code != 0:
            print(f"error: rung {rung.family} {rung.multiple}x failed (exit {code}); the same "
                  "command resumes it", file=sys.stderr)
            return code
        below[rung.family] = rung.run_dir
        rows.append(rung_rows(rung))
        paths = write_ladder(args.out, pd.concat(rows, ignore_index=True))
        print(f"  ladder table: {paths[0]} ({paths[1].name}, {paths[2].name})", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
