"""A Ray Train job at Ray's worker niceness (15) against the niceness a run sets (0).

    python benchmarks/bench_niceness.py [--env bandit_latent] [--epochs 3] [--pairs 2]

Ray starts its worker processes at nice 15 and its daemons (raylet, GCS, dashboard, agents)
at 0; a local Ray that a run starts sets ``RAY_worker_niceness=0`` (``runtime.cli.init_ray``).
This trains the same one-seed SPICE model of the ``small`` preset (``--epochs`` epochs) with
``pipelines/pretrain.py`` in a fresh run directory, one job per run, ``--pairs`` pairs
whose order alternates (15 first, then 0 first) so that a machine's drift falls on
both. Printed per run: the
seconds inside ``fit`` (from the model's ``fit.json``, the job's start-up excluded); then each
pair's ratio 15 / 0 and their mean. Both settings must give the same
weights (checked: the final checkpoints' files are compared byte for byte). Baseline: nice 15.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def one_job(env: str, epochs: int, niceness: int, out: Path) -> tuple[float, Path]:
    """Train the model in ``out`` at ``niceness``; its fit seconds and final checkpoint."""
    cmd = [sys.executable, str(ROOT / "pipelines" / "pretrain.py"), "--preset", "small",
           "--env", env, "--seed", "0", "--set", f"train.epochs={epochs}", "--out", str(out)]
    proc = subprocess.run(cmd, env={**os.environ, "RAY_worker_niceness": str(niceness)},
                          capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        raise SystemExit(f"pretrain.py failed ({proc.returncode}): {proc.stderr[-2000:]}")
    [fit] = list(out.rglob("fit.json"))
    return json.loads(fit.read_text())["fit_seconds"], fit.parent / "final"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", default="bandit_latent")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--pairs", type=int, default=2)
    args = p.parse_args()
    ratios = []
    with tempfile.TemporaryDirectory() as tmp:
        finals = []
        for pair in range(args.pairs):
            seconds = {}
            for niceness in ((15, 0) if pair % 2 == 0 else (0, 15)):  # the order alternates
                fit, final = one_job(args.env, args.epochs, niceness,
                                     Path(tmp) / f"nice{niceness}-{pair}")
                seconds[niceness] = fit
                finals.append(final)
                print(f"  pair {pair + 1}, workers at nice {niceness:2d}: fit {fit:6.1f} s",
                      flush=True)
            ratios.append(seconds[15] / seconds[0])
        names = sorted(f.name for f in finals[0].iterdir() if f.name != "meta.json"
                       and not f.name.endswith(".sha256"))
        same = all(filecmp.cmp(finals[0] / n, f / n, shallow=False)
                   for f in finals[1:] for n in names)
    print(f"{args.env} small, {args.epochs} epochs, one seed, one Train worker: fit at nice 15 / "
          f"at nice 0 = {', '.join(f'{r:.2f}x' for r in ratios)} (mean "
          f"{sum(ratios) / len(ratios):.2f}x); same weights: {same}")
    if not same:
        raise SystemExit("error: the two settings gave different weights")


if __name__ == "__main__":
    main()
