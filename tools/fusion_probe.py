"""Score fusion settings of a finished study's method on its validation tasks: no training, no
Ray, nothing written. For asking why a method scores what it does, off its tuning grid.

    python tools/fusion_probe.py RUN darkroom_continuous --method SPICE \
        --point beta=0,noise_var=1e6 --point beta=4,tau=1,width_scale=10 --chosen \
        --on-chosen rule=greedy,beta=0 --on-chosen rule=thompson [--epoch 8] [--split eval] \
        [--set train.lambda_shrink=0]

Each ``--point`` is ``field=value`` pairs of the fusion config
(``spice_ray.config.FusionConfig`` fields; numbers, whole for td_n) applied to the method's
tuning base (its config before the grid), with ``beta_schedule=fixed`` unless given
(``beta_schedule``, ``rule``, the action rule, ``kernel``, ``kernel_space`` and ``tail`` take a
word: ``rule=greedy`` acts on the posterior mean); ``--chosen`` adds every tuned method at its
choice in RUN's ``results/tuning.json``, and each ``--on-chosen`` point is applied to
``--method``'s choice (``rule=greedy,beta=0``: the same posterior, acted on greedily). The
method runs online on the experiment's validation tasks with every training seed's checkpoint
that RUN's ``checkpoints/index.json`` lists (each checked against its own ``meta.json``), or
with ``--epoch N`` each one's epoch-N checkpoint, in this process with one thread; printed per
point: the mean final cumulative regret over tasks (seeds averaged per task) and its SEM, the
tuning stage's score (``--search``: and how its episodes found the goal,
``spice_ray.results.search``). ``--set SECTION.FIELD=VALUE`` scores instead the models trained
with that change of the experiment's config beside the study's own
(``tools/population_train.py``), found by what they are (their training identity), with the
study's tasks, fusion settings and choices.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import pandas as pd
import torch

from spice_ray.agents import AgentSpec
from spice_ray.config import FusionConfig, load_config, with_overrides
from spice_ray.config.sections import KERNEL_SPACES
from spice_ray.data import store
from spice_ray.evaluate.online import online_rows
from spice_ray.fusion import TAILS
from spice_ray.fusion.kernels import KERNELS
from spice_ray.fusion.rules import ACTION_RULES, BETA_SCHEDULES
from spice_ray.model.registry import load_model
from spice_ray.results.schema import NO_SEED
from spice_ray.results.search import search_stats
from spice_ray.study.experiments import experiment_named
from spice_ray.study.run_models import checked_entry
from spice_ray.study.tuning import agent_specs, bases, final_scores, grid_point, read_tuning
from spice_ray.train.ray_train import plan_job

WORDS = {"beta_schedule": BETA_SCHEDULES, "rule": tuple(ACTION_RULES), "kernel": tuple(KERNELS),
         "kernel_space": KERNEL_SPACES, "tail": TAILS}
"""The fusion fields a point sets by a word (one of those listed), not a number."""
INTEGERS = {f.name for f in dataclasses.fields(FusionConfig) if f.type in ("int", int)}
"""The fusion fields that take a whole number (``td_n``)."""


def parse_point(text: str, fields: set[str]) -> dict[str, float | str]:
    """``"beta=4,tau=1"`` -> {"beta": 4.0, "tau": 1.0}; the fields of :data:`WORDS` keep their
    word (one of those listed), ``td_n`` is a whole number.

    Raises:
        ValueError: naming the pair: not ``field=value``, an unknown field or not a number.
    """
    out: dict[str, float | str] = {"beta_schedule": "fixed"}
    for pair in filter(None, text.split(",")):
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep or key not in fields:
            raise ValueError(f"--point {text!r}: {pair!r} is not field=value of a fusion field "
                             f"({', '.join(sorted(fields))})")
        if key in WORDS:
            if value.strip() not in WORDS[key]:
                raise ValueError(f"--point {text!r}: {key}={value.strip()[:40]!r} is not one of "
                                 f"{', '.join(WORDS[key])}")
            out[key] = value.strip()
            continue
        try:
            out[key] = float(value)
        except ValueError:
            raise ValueError(f"--point {text!r}: {key}={value!r} is not a number") from None
        if key in INTEGERS:
            if not out[key].is_integer():
                raise ValueError(f"--point {text!r}: {key}={value.strip()!r} is not an integer")
            out[key] = int(out[key])
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", type=Path, help="a finished study's run directory (read only)")
    p.add_argument("experiment")
    p.add_argument("--method", default="SPICE", help="a tuned method's label (default SPICE)")
    p.add_argument("--point", action="append", default=[], help="field=value,... (repeat)")
    p.add_argument("--chosen", action="store_true", help="every tuned method at its choice")
    p.add_argument("--on-chosen", action="append", default=[], metavar="POINT",
                   help="field=value,... applied to --method's choice (repeat): e.g. "
                        "rule=greedy,beta=0 acts greedily on the chosen posterior")
    p.add_argument("--split", default="validation", choices=("validation", "eval"))
    p.add_argument("--epoch", type=int, help="each seed's epoch checkpoint of this epoch "
                   "(1-based) instead of its final one: a shorter step budget of the same run")
    p.add_argument("--search", action="store_true",
                   help="also print, per point, the share of episodes that reached the goal, "
                        "the median step of the first arrival and the share of later steps on "
                        "the goal (grid darkrooms; spice_ray.results.search)")
    p.add_argument("--set", action="append", default=[], dest="overrides",
                   metavar="SECTION.FIELD=VALUE",
                   help="score the models trained with this change of the config instead")
    args = p.parse_args(argv)
    run, name = args.run.resolve(), args.experiment
    try:
        exp = experiment_named(name)  # a --variant's name too: <experiment>--<variant>
    except ValueError as exc:
        p.error(str(exc))
    if not exp.tuned:
        p.error(f"{name!r} is not an experiment with tuned methods")
    torch.set_num_threads(1)  # as an evaluation actor
    cfg = load_config(run / "configs" / f"{name}.yaml")
    entries = [e for e in json.loads((run / "checkpoints" / "index.json").read_text())[
        "checkpoints"] if e["experiment"] == name]
    if not entries:
        p.error(f"{run} has no checkpoint of experiment {name!r}")
    dataset = store.dataset_dir(run / "datasets", cfg)  # by its config, as the study finds it
    try:
        trained = with_overrides(cfg, args.overrides) if args.overrides else None
    except ValueError as exc:  # ConfigError names the field
        p.error(str(exc))
    specs = agent_specs(exp, cfg, dataset)
    record = read_tuning(run).get(name, {})
    points: list[tuple[str, AgentSpec, str]] = []  # (what, spec, evaluation)
    for ev_name in exp.tuned:
        for base in bases(specs[ev_name], cfg):
            if base.label == args.method:
                fields = {f.name for f in dataclasses.fields(base.fusion)}
                for text in args.point:
                    try:
                        change = parse_point(text, fields)
                    except ValueError as exc:
                        p.error(str(exc))
                    spec = dataclasses.replace(base, fusion=dataclasses.replace(base.fusion,
                                                                                **change))
                    points.append((f"{base.label} {text}", spec, ev_name))
            want = args.chosen or (args.on_chosen and base.label == args.method)
            if want and base.label in record.get("methods", {}):
                chosen = record["methods"][base.label]["chosen"]
                point = grid_point(base, cfg.eval, record, chosen)
                if point is not None and args.chosen:
                    points.append((f"{base.label} chosen {chosen}", point.spec, ev_name))
                for text in args.on_chosen if point is not None and base.label == args.method \
                        else ():
                    fields = {f.name for f in dataclasses.fields(point.spec.fusion)}
                    try:
                        change = parse_point(text, fields)
                    except ValueError as exc:
                        p.error(str(exc))
                    spec = dataclasses.replace(point.spec, fusion=dataclasses.replace(
                        point.spec.fusion, **change))
                    points.append((f"{base.label} chosen, {text}", spec, ev_name))
    if not points:
        p.error(f"nothing to score: no --point for a tuned method {args.method!r} of {name} "
                "and no --chosen")
    data = store.load_split(dataset, args.split, limit=cfg.eval.num_tasks)
    for what, spec, ev_name in points:
        model_ref = exp.evaluation(ev_name).model
        frames = []
        seeds = cfg.seeds if model_ref else (NO_SEED,)
        for seed in seeds:
            model = None
            if model_ref:
                entry = next(e for e in entries if (e["kind"], e["variant"], e["seed"])
                             == (model_ref.kind, model_ref.variant, seed))
                ckpt = checked_entry(run, entry)
                if trained is not None and model_ref.variant:
                    p.error(f"--set scores an experiment's own models; {what} evaluates the "
                            f"weight ablation {model_ref.variant!r}")
                if trained is not None:  # the model trained with --set, by its identity
                    _, model_dir = plan_job(trained, model_ref.kind, seed, dataset,
                                            run / "checkpoints")
                    ckpt = model_dir / "final"
                    if not ckpt.is_dir() and args.epoch is None:
                        p.error(f"no final model trained with {' '.join(args.overrides)} for "
                                f"seed {seed} in {model_dir} (tools/population_train.py trains "
                                "it; --epoch N reads a training under way)")
                if args.epoch is not None:
                    ckpt = Path(ckpt).parent / "local" / f"epoch-{args.epoch - 1:04d}"
                    if not ckpt.is_dir():
                        p.error(f"{ckpt} does not exist: no epoch-{args.epoch} checkpoint")
                model = load_model(str(ckpt), cfg.env).eval()
            frames.append(online_rows(cfg.env, cfg.eval, data, [spec], model, seed,
                                      final_only=not args.search))
        rows = pd.concat(frames, ignore_index=True)
        [score] = final_scores(rows).itertuples()
        found = ""
        if args.search:
            [s] = search_stats(rows.assign(variant="")).itertuples()
            found = (f"   reached {s.reached:.2f}, first arrival {s.first_arrival:g}, on goal "
                     f"after {s.on_goal_after:.2f}")
        print(f"{what:60s} {score.mean:8.2f} +- {score.sem:.2f}{found}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
