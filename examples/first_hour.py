"""A researcher's first hour, end to end at smoke size (4 min 52 s on a 2-core Intel machine at
load 4-7, 2026-11-28):

    python examples/first_hour.py --out runs/first_hour

1. runs the study (the bandit experiment: datasets, pretraining, tuning on validation tasks,
   evaluation, tables, figures as PNG and PDF, the report);
2. re-runs it into the same directory with another config, which is refused with the way out
   (the run holds one study; its tables are never mixed with another config's), and takes
   that way out: ``--variant nv4`` keeps both side by side, in its own tables and one report;
3. loads the policy the tuning stage chose (``SpicePolicy.from_run``) and plays one task of
   the run's own environment through ``gymnasium.make`` with ``predict`` and ``observe``;
4. writes the tuned table as LaTeX for a paper (short labels, the metric by its name);
5. saves the policy with a model card (``save_pretrained``).

Each step prints what it did; the script exits 1 if one of them does not behave as said.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import gymnasium

import spice_ray

ROOT = Path(__file__).resolve().parents[1]


def study(out: Path, *extra: str) -> subprocess.CompletedProcess:
    """``full_run.py --preset smoke --experiments bandit`` into ``out``, as a user types it."""
    return subprocess.run([sys.executable, str(ROOT / "pipelines" / "full_run.py"), "--preset",
                           "smoke", "--experiments", "bandit", "--out", str(out),
                           "--figure-format", "pdf", *extra], capture_output=True, text=True)


def check(ok: bool, what: str) -> None:
    if not ok:
        print(f"FAILED: {what}", file=sys.stderr)
        raise SystemExit(1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("runs/first_hour"))
    out = parser.parse_args(argv).out.resolve()

    print(f"1. the study (smoke, bandit) into {out}")
    proc = study(out)
    check(proc.returncode == 0, f"the study exited {proc.returncode}: {proc.stderr[-2000:]}")
    print("   " + proc.stdout.strip().splitlines()[-1])

    print("2. the same directory, another config")
    proc = study(out, "--set", "fusion.noise_var=0.04")
    check(proc.returncode == 2 and "another config" in proc.stderr,
          f"a re-run with another config was not refused (exit {proc.returncode})")
    print("   refused: " + proc.stderr.strip().splitlines()[-1])
    proc = study(out, "--set", "fusion.noise_var=0.04", "--variant", "nv4")
    check(proc.returncode == 0, f"the variant run exited {proc.returncode}: "
          f"{proc.stderr[-2000:]}")
    report = (out / "report.md").read_text()
    check("## bandit_tuned" in report and "## bandit--nv4_tuned" in report,
          "the report does not hold the study and its variant side by side")
    print("   --variant nv4: bandit--nv4_* tables beside bandit_*, one report with both")

    print("3. the tuned policy on the run's own environment, through Gymnasium")
    policy = spice_ray.SpicePolicy.from_run(out, "bandit")
    check(policy.tuned is not None, "from_run did not give the validation-tuned policy")
    print(f"   {policy!r}")
    env = gymnasium.make("spice_ray/bandit-v0", task=0, run_dir=str(out), experiment="bandit")
    obs, _ = env.reset(seed=0)
    regret, steps, done = 0.0, 0, False
    while not done:
        action, _ = policy.predict(obs)
        nxt, reward, terminated, truncated, info = env.step(action)
        policy.observe(obs, action, reward, nxt)
        regret, obs, done = regret + info["regret"], nxt, terminated or truncated
        steps += 1
    print(f"   eval task 0: cumulative regret {regret:.2f} over {steps} steps")

    print("4. the tuned table for a paper (LaTeX)")
    proc = subprocess.run([sys.executable, "-m", "spice_ray.results", str(out), "bandit_tuned",
                           "--by", "method", "--at", "last", "--where",
                           "metric == 'cumulative_regret'", "--format", "latex"],
                          capture_output=True, text=True)
    check(proc.returncode == 0 and "Cumulative regret" in proc.stdout,
          f"the LaTeX table failed: {proc.stderr[-1000:]}")
    tex = out / "bandit_tuned.tex"
    tex.write_text(proc.stdout)
    pdf = out / "figures" / "bandit_online.pdf"
    check(pdf.is_file(), f"{pdf} is missing")
    print(f"   {tex} ({len(proc.stdout.splitlines())} lines); the figure for it: {pdf}")

    print("5. the policy, saved with a model card")
    folder = policy.save_pretrained(out / "policy")
    card = (folder / "README.md").read_text()
    check("| SPICE | cumulative_regret" in card, "the model card has no row of the tuned table")
    print(f"   {folder}: " + ", ".join(sorted(p.name for p in folder.iterdir()
                                              if not p.name.endswith(".sha256"))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
