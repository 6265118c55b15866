"""Tune and evaluate a finished study again with today's tuning and fusion code, on its own
trained checkpoints, into a new directory: no training.

    python tools/retune.py RUN --experiments bandit_latent,bandit_template --out NEW

For a change to the tuning stage or the fusion (a new width fit, a new grid), measured on the
same models: the checkpoints that RUN's ``checkpoints/index.json`` lists (each checked against
its own ``meta.json``), its datasets and its resolved configs are read, never written. NEW gets
``results/tuning.json`` and every table of the chosen experiments (the ``_tuned`` ones
included), then one line per experiment: the fitted width, and SPICE's and SPICE (paper)'s share
of the flat-to-oracle gap beside RUN's own.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from spice_ray.common.artifacts import write_checked_text
from spice_ray.config import load_config
from spice_ray.data import store
from spice_ray.evaluate.actors import EvalPool
from spice_ray.results.analysis import final_by_task, tuned_gap
from spice_ray.results.choices import fitted_decay, fitted_noise, fitted_scale
from spice_ray.results.tables import load
from spice_ray.runtime.cli import init_ray
from spice_ray.study import StudyPlan, evaluate_experiment
from spice_ray.study.run_models import checked_entry
from spice_ray.study.tune_grid import tune_experiment
from spice_ray.study.tuned import write_tuned_table


def _gaps(run: Path, experiment: str) -> str:
    try:
        gaps = tuned_gap(final_by_task(load(run, f"{experiment}_tuned")))
    except Exception as exc:  # a run without the table: say so, do not stop
        return f"({type(exc).__name__})"
    return ", ".join(f"{r.method} {r.gap_closed:.2f} [{r.lo:.2f}, {r.hi:.2f}]"
                     for r in gaps.itertuples()) or "-"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", type=Path, help="a finished study's run directory (read only)")
    p.add_argument("--experiments", required=True, help="comma-separated")
    p.add_argument("--out", type=Path, required=True, help="where the new tables go")
    args = p.parse_args()
    run, out = args.run.resolve(), args.out.resolve()
    if out == run:
        raise SystemExit("error: --out must differ from RUN (RUN is only read)")
    names = [e for e in args.experiments.split(",") if e]
    entries = json.loads((run / "checkpoints" / "index.json").read_text())["checkpoints"]
    configs, datasets, finals = {}, {}, {}
    for name in names:
        configs[name] = load_config(run / "configs" / f"{name}.yaml").replace(out_dir=str(out))
        mine = [e for e in entries if e["experiment"] == name]
        if not mine:
            raise SystemExit(f"error: {run} has no checkpoint of experiment {name!r}")
        for e in mine:
            finals[(name, e["kind"], e["variant"], e["seed"])] = checked_entry(run, e)
        datasets[name] = store.dataset_dir(run / "datasets", configs[name])  # by its config
    plan = StudyPlan(configs, out, tuple(names))
    init_ray(dashboard=False)  # as a run starts it (its workers at nice 0)
    tuning = {}
    with EvalPool() as pool:
        for name, cfg in configs.items():
            pool.close()  # the tuning trials need the CPUs the evaluation actors hold
            record = tune_experiment(name, cfg, datasets[name], finals)
            tuning[name] = record
            (out / "results").mkdir(parents=True, exist_ok=True)
            write_checked_text(out / "results" / "tuning.json", json.dumps(tuning, indent=1))
            evaluate_experiment(plan, name, datasets[name], finals, pool=pool,
                                width_scale=fitted_scale(record),
                                noise_var=fitted_noise(record),
                                width_decay=fitted_decay(record))
            write_tuned_table(name, cfg, out, datasets[name], finals, pool, record)
            print(f"{name}: width s = {fitted_scale(record)}, decay {fitted_decay(record)}; "
                  f"gap closed now {_gaps(out, name)}; in {run.name}: {_gaps(run, name)}",
                  flush=True)


if __name__ == "__main__":
    main()
