"""Score a finished study's tuned tables once more, on the confirmation split: fresh tasks of
the eval distribution that no document, tool or choice has read.

    python pipelines/confirm.py --out runs/small                       # every tuned experiment
    python pipelines/confirm.py --out runs/small --experiments bandit_latent --tasks 500

Each tuned method runs at the choice ``results/tuning.json`` records, under every training
seed's final checkpoint that ``checkpoints/index.json`` lists (each checked against its own
``meta.json``), in this process (no Ray). Per experiment the ``<experiment>_confirm`` table
(final cumulative regret per task and seed) is written once; a re-run with the same choices
reads it back. Then ``confirm.md`` in the run directory, printed too: each method's regret on
the eval and on the confirmation tasks, and SPICE's gap closed and in-context share on both.
Nothing is trained or tuned.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from spice_ray.common.errors import SpiceRayError


class ConfirmError(SpiceRayError):
    """A run that cannot be confirmed as it is (no tuning record, no checkpoint, no table)."""


def confirm(run: Path, names: list[str] | None, tasks: int | None) -> str:
    """The confirmation tables of ``names`` (default: every experiment with a tuned table and
    a tuning record) in ``run``, and the markdown comparing them with the eval tables (the
    run's lock held: no study writes into it meanwhile)."""
    from spice_ray.common.runlock import acquire

    with acquire(run, "pipelines/confirm.py"):
        return _confirm(run, names, tasks)


def _confirm(run: Path, names: list[str] | None, tasks: int | None) -> str:
    from spice_ray.common.artifacts import atomic_write_text, is_current
    from spice_ray.config import load_config
    from spice_ray.data import store
    from spice_ray.results.choices import record_problem
    from spice_ray.results.tables import list_experiments, load, table_path, write
    from spice_ray.study import confirm as c
    from spice_ray.study.records import index_entries
    from spice_ray.study.run_models import checked_entry
    from spice_ray.study.tuning import read_tuning, task_groups

    tuning = read_tuning(run)
    have = set(list_experiments(run))
    tuned = [n for n in tuning if f"{n}_tuned" in have]
    names = names or tuned
    unknown = [n for n in names if n not in tuned]
    if unknown:
        raise ConfirmError(f"{run}: no tuned table with a usable tuning record for "
                           f"{', '.join(unknown)}; experiments that have both: "
                           f"{', '.join(tuned) or 'none'}")
    entries = index_entries(run)
    lines = ["# The confirmation split", "",
             f"Final cumulative regret (mean +- SEM over tasks, training seeds averaged per "
             f"task) of each tuned method at its validation choice, on the eval tasks and on "
             f"fresh tasks of the eval distribution (ids from {c.CONFIRM_OFFSET:,}) that no "
             "choice or document has read. Intervals: the two-level bootstrap (training "
             "seeds, then tasks; eval tasks by goal where they share one).", ""]
    # confirm.md covers every experiment confirmed so far: those named now, and the others
    # whose confirmation table is current (read back, never scored again)
    for name in [n for n in tuned if n in names or table_path(run, c.table_name(n)).exists()]:
        record = tuning[name]
        problem = record_problem(record)
        if problem is not None and name not in names:
            continue
        if problem is not None:
            raise ConfirmError(f"{run}/results/tuning.json {problem}: run the study again to "
                               "re-tune before confirming")
        mine = [e for e in entries if e["experiment"] == name]
        if not mine and name not in names:
            continue
        if not mine:
            raise ConfirmError(f"{run}/checkpoints/index.json lists no checkpoint of {name}")
        cfg = load_config(run / "configs" / f"{name}.yaml")
        finals = {(name, e["kind"], e["variant"], e["seed"]): checked_entry(run, e)
                  for e in mine}
        dataset = store.dataset_dir(run / "datasets", cfg)  # by its config, as the study does
        n = tasks or cfg.eval.num_tasks
        inputs = c.confirmation_inputs(record, n)
        table = c.table_name(name)
        if is_current(table_path(run, table), inputs)[0]:
            print(f"{name}: {table} current (scored once), read back", flush=True)
        elif name not in names:
            continue  # not asked for, and its table is not of this record: left alone
        else:
            print(f"{name}: scoring {n} confirmation tasks ...", flush=True)
            rows = c.evaluate_confirmation(name, cfg, dataset, finals, record, n)
            write(run, table, rows, inputs=inputs,
                  description=f"{name}'s tuned methods at their choices on {n} confirmation "
                              "tasks (final cumulative regret)")
        lines += c.confirm_lines(name, load(run, f"{name}_tuned"), load(run, table),
                                 task_groups(dataset, cfg))
    text = "\n".join(lines)
    atomic_write_text(run / "confirm.md", text)
    return text


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="a finished study's run directory")
    p.add_argument("--experiments", help="comma-separated (default: every tuned one)")
    p.add_argument("--tasks", type=int, help="confirmation tasks per experiment (default: the "
                   "config's eval.num_tasks)")
    args = p.parse_args(argv)
    if args.tasks is not None and args.tasks < 2:
        p.error(f"--tasks {args.tasks}: at least 2")
    names = [n for n in (args.experiments or "").split(",") if n] or None
    from spice_ray.common.faults import stop_before_run
    from spice_ray.runtime.cli import run_main

    stop_before_run("confirm.py")

    print(run_main(confirm, args.out.resolve(), names, args.tasks))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
