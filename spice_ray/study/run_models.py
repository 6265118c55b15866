"""Finding and checking a study's models before a policy runs them: the checkpoint index
entry against the checkpoint's own ``meta.json``, a saved policy's folder (local or from the
Hugging Face Hub) and its options, the fusion setting the tuning stage chose on validation, and
a saved policy's model card. Used by ``spice_ray.study.policy``; no model runs here (loading
one is ``spice_ray.model.registry.load_model``'s, for a saved policy as for any checkpoint)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from spice_ray.common.errors import excerpt
from spice_ray.config import ExperimentConfig, FusionConfig
from spice_ray.model import checkpoint as ckpt


def checked_entry(run_dir: Path, entry: dict[str, Any]) -> Path:
    """The checkpoint directory of a checkpoint-index entry, once its own ``meta.json``
    (checksummed) agrees with the entry: kind, seed and training identity (the index's, or
    the 8 hex digits that name the directory, ``<kind>-<identity>-seed<k>``, in an index
    written before identities were recorded), and the last epoch trained where the index
    records one."""
    from spice_ray.study.records import checked_index_entry

    path = run_dir / checked_index_entry(run_dir, entry)["path"]
    meta = ckpt.read_meta(path)
    parts = path.parent.name.split("-")  # <kind>-<identity[:8]>-seed<k>
    listed = entry.get("identity") or (parts[1] if len(parts) >= 3 else "")
    got = str(meta.get("identity", ""))
    what = (f"{entry['experiment']} {entry['kind']}"
            + (f" [{entry['variant']}]" if entry["variant"] else "") + f" seed {entry['seed']}")
    if (meta.get("kind"), meta.get("seed")) != (entry["kind"], entry["seed"]) \
            or not listed or not got.startswith(str(listed)):
        raise ValueError(f"{path} holds {meta.get('kind')} seed {meta.get('seed')} of training "
                         f"identity {got or '?'}, but checkpoints/index.json lists it as "
                         f"{what} of identity {listed or '?'}: the directory was moved or "
                         "swapped; re-run the study's full_run command, which retrains it")
    listed_epoch = entry.get("epoch")
    if isinstance(listed_epoch, int) and meta.get("epoch") != listed_epoch:
        raise ValueError(f"{path} holds {meta.get('kind')} seed {meta.get('seed')} after "
                         f"epoch {meta.get('epoch')}, but checkpoints/index.json lists {what} "
                         f"after epoch {listed_epoch}: a training of the same model to "
                         "another number of epochs (a variant or another experiment in this "
                         "run) republished it; re-run this experiment's full_run command, or "
                         "give such trainings their own --out")
    return path


def checkpoint_of(run_dir: str | Path, experiment: str, kind: str, seed: int = 0,
                  variant: str = "") -> Path:
    """The final checkpoint of a study's model, from the run's checkpoint index.

    Raises:
        FileNotFoundError: no index (a run from before it existed: re-run the same
            ``full_run`` command, which skips the work and writes it) or no such model,
            naming the models there are.
        ValueError: the index fails its checksum, is not the shape the study writes or
            names a path outside the run (``CheckpointIndexError``), or the checkpoint found
            is not the model listed (its ``meta.json`` names another kind, seed or training
            identity: a moved or swapped directory).
    """
    import json

    from spice_ray.common.artifacts import MISSING, NO_SIDECAR, verify
    from spice_ray.study.records import (
        CHECKPOINT_INDEX,
        CheckpointIndexError,
        checked_index_entry,
    )

    run_dir = Path(run_dir)
    index = run_dir / CHECKPOINT_INDEX
    _, why = verify(index)
    if why not in ("", MISSING):
        what = "has no SHA-256 sidecar" if why == NO_SIDECAR else f"fails its SHA-256 " \
            f"sidecar ({why})"
        raise ValueError(f"{index} {what}: re-running the study's full_run command rewrites "
                         "it from the checkpoints")
    try:
        listed = json.loads(index.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{index} does not exist: is {run_dir} a study's run "
                                "directory? Re-running its full_run command writes "
                                "it") from None
    except ValueError as exc:
        raise CheckpointIndexError(f"{index} is not JSON ({exc})") from None
    entries = listed.get("checkpoints") if isinstance(listed, dict) else None
    if not isinstance(entries, list):
        raise CheckpointIndexError(f"{index} holds no list under 'checkpoints' (it is a "
                                   f"{type(listed).__name__}): not an index the study writes")
    entries = [checked_index_entry(run_dir, e) for e in entries]
    for e in entries:
        if (e["experiment"], e["kind"], e["variant"], e["seed"]) == (experiment, kind,
                                                                    variant, seed):
            return checked_entry(run_dir, e)
    have = sorted({f"{e['experiment']} {e['kind']}"
                   f"{' [' + e['variant'] + ']' if e['variant'] else ''} seed {e['seed']}"
                   for e in entries})
    raise FileNotFoundError(f"no {kind} model of experiment {experiment!r}"
                            f"{f' [{variant}]' if variant else ''} seed {seed} in "
                            f"{run_dir}; it has: {', '.join(have[:12])}")


HUB_ID = r"[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95}"
"""A Hugging Face Hub model id, ``owner/name``."""


def pretrained_dir(source: str | Path, revision: str | None = None,
                   cache_dir: str | Path | None = None, local_files_only: bool = False) -> Path:
    """The folder of a saved policy: ``source`` itself when it is a directory, else a Hub
    model id (``owner/name``) resolved through ``huggingface_hub``'s download cache (the
    usual ``HF_HUB_CACHE``, or ``cache_dir``): downloaded when missing unless
    ``local_files_only`` (or ``HF_HUB_OFFLINE=1``). Only the policy's files are fetched, and
    they pass the same checks as a local folder's before any weight is used.

    Raises:
        FileNotFoundError: neither a directory nor a Hub id.
        ValueError: a Hub id that is not in the cache and cannot be downloaded, or
            ``huggingface_hub`` is not installed (the ``hub`` extra).
    """
    import re

    path = Path(source)
    if path.is_dir():
        return path
    if not re.fullmatch(HUB_ID, str(source)):
        raise FileNotFoundError(f"{source}: no such directory, and not a Hugging Face Hub "
                                "model id (owner/name)")
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise ValueError(f"{source} looks like a Hub model id: resolving it needs "
                         "huggingface_hub (pip install 'spice-ray[hub]')") from None
    try:
        return Path(snapshot_download(
            str(source), revision=revision, cache_dir=cache_dir,
            local_files_only=local_files_only,
            allow_patterns=[f"{ckpt.META}*", f"{ckpt.WEIGHTS}*", f"{MODEL_CARD}*"]))
    except Exception as exc:  # the library's own errors: offline, unknown repo, no revision
        raise ValueError(f"{source}: not in the Hub cache"
                         f"{f' {cache_dir}' if cache_dir else ''} and not downloadable "
                         f"({type(exc).__name__}: {excerpt(str(exc).splitlines()[0])})") from None


def saved_options(meta: dict[str, Any], where: Path) -> dict[str, Any]:
    """A saved policy's options (``save_pretrained`` records them in its ``meta.json``; a
    training checkpoint has none), the fusion settings validated as a FusionConfig.

    Raises:
        ValueError: naming the field.
    """
    from spice_ray.config import ConfigError

    saved = meta.get("options", {})
    if not isinstance(saved, dict):
        raise ValueError(f"{where}: field options is not an object")
    saved = dict(saved)
    if "fusion" in saved:
        try:
            saved["fusion"] = FusionConfig(**saved["fusion"])
        except (TypeError, ValueError, ConfigError) as exc:
            raise ValueError(f"{where}: field options.fusion is invalid "
                             f"({excerpt(str(exc))})") from None
    return saved


def tuned_fusion(run_dir: Path, experiment: str, cfg: Any
                  ) -> tuple[dict[str, Any], FusionConfig] | None:
    """(SPICE's chosen setting, its fusion) from the run's checksummed ``tuning.json``, built
    by the tuning stage's own grid (``spice_ray.study.tuning.candidates``) so it is the fusion of
    the tuned table; None without a usable record, with a warning (on stderr) that says the
    policy is untuned and why."""
    import warnings

    from spice_ray.agents import AgentSpec
    from spice_ray.results.choices import record_problem
    from spice_ray.study.tuning import TUNING_FILE, grid_point, read_tuning

    record = read_tuning(run_dir).get(experiment)
    method = (record or {}).get("methods", {}).get("SPICE")
    problem = "has no choice of SPICE" if method is None else record_problem(record)
    if problem is not None:
        warnings.warn(f"{Path(run_dir) / TUNING_FILE} {problem} for {experiment}: this policy "
                      "is untuned (the checkpoint's own fusion settings, not the study's "
                      "validation choice); pass tuned=False to ask for that", stacklevel=4)
        return None
    point = grid_point(AgentSpec("spice", fusion=cfg.fusion), cfg.eval, record,
                       method["chosen"])
    return None if point is None else (dict(point.setting), point.spec.fusion)


MODEL_CARD = "README.md"
"""The model card of a ``save_pretrained`` folder (the Hugging Face Hub's name for one)."""


def model_card(kind: str, policy: str, cfg: Any, seed: int | None,
               source: tuple[Path, str, int] | None, method: str) -> str:
    """A ``save_pretrained`` folder's model card: what the model is, what it was trained on,
    how to load it, the row of its run's ``<experiment>_tuned`` table it produced (only when
    the policy is the run's tuned one, ``source`` = (run, experiment, seed)) and its config.
    A function of its inputs only (no date, no path of this machine), so one policy gives one
    card."""
    import yaml

    env, data, train = cfg.env, cfg.data, cfg.train
    lines = ["---", "library_name: spice-ray", "tags:", "- reinforcement-learning",
             "- in-context-reinforcement-learning", f"- {env.name}", "---", "",
             f"# {policy}: {env.name}", "",
             f"A {'SPICE' if kind == 'spice' else 'DPT'} model of spice-ray: a causal "
             f"GPT-2-style trunk ({cfg.model.n_layer} layers, width {cfg.model.n_embd})"
             + (f", a policy head and a {cfg.model.ensemble_size}-head value ensemble whose "
                "prior is fused with the context's evidence at test time (no gradient step)"
                if kind == "spice" else ", a policy head read in context") + ".", "",
             "```python", "from spice_ray import " + policy,
             f'policy = {policy}.from_pretrained("<this folder>")', "```", "",
             "## Trained on", "",
             f"- environment `{env.name}`, horizon {env.horizon}, preset `{cfg.preset}`",
             f"- {data.num_train_tasks:,} training tasks (data seed {data.seed}), "
             f"{data.label} labels",
             f"- {train.epochs} epochs at batch {train.batch_size}, learning rate {train.lr:g}"
             + ("" if seed is None else f", training seed {seed}"), ""]
    lines += ["## Evaluation", ""] + _card_rows(source, method) + [""]
    lines += ["## Config", "", "```yaml", yaml.safe_dump(cfg.to_dict(), sort_keys=False)
              .rstrip(), "```", ""]
    return "\n".join(lines)


def _card_rows(source: tuple[Path, str, int] | None, method: str) -> list[str]:
    """The card's evaluation lines: the tuned table's final value for ``method`` at the
    source's seed, mean +- SEM over its eval tasks, or why there is none."""
    if source is None:
        return ["Not the tuned policy of a study's run (built from a checkpoint, or with "
                "settings of its own): no table row describes it."]
    from spice_ray.results.summary import final_values, summarise
    from spice_ray.results.tables import ResultsError, load

    run, experiment, seed = source
    try:
        df = load(run, f"{experiment}_tuned")
    except (ResultsError, FileNotFoundError, OSError):
        return [f"Run `{experiment}` has no readable `{experiment}_tuned` table."]
    mine = df[(df["method"] == method) & (df["seed"] == seed)]
    rows = []
    for metric in sorted(mine["metric"].unique()):
        final = final_values(mine, metric)
        s = summarise(final, ["metric"], pool=True).iloc[0]
        rows.append(f"| {method} | {metric} at step {int(final['x'].max())} | "
                    f"{s['mean']:.4g} ± {s['sem']:.2g} | {int(s['n'])} |")
    if not rows:
        return [f"`{experiment}_tuned` holds no row of {method} at seed {seed}."]
    return [f"From the run's `{experiment}_tuned` table (eval tasks, seed {seed}):", "",
            "| method | metric | mean ± SEM over tasks | tasks |", "|---|---|---:|---:|", *rows]


def model_and_dataset(run_dir: str | Path, experiment: str, kind: str, seed: int = 0,
                      checkpoint: str | Path | None = None) -> tuple[Path, Path]:
    """(checkpoint, dataset directory) of a study's model: its final checkpoint
    (:func:`checkpoint_of`), or ``checkpoint``, another checkpoint under the run's
    ``checkpoints/<dataset>/`` (an ``epoch-*`` one of a training under way).

    Raises:
        ValueError: ``checkpoint`` is not under the run's ``checkpoints/``.
    """
    run_dir = Path(run_dir)
    if checkpoint is None:
        final = checkpoint_of(run_dir, experiment, kind, seed)
        return final, run_dir / "datasets" / final.parent.parent.name
    final = Path(checkpoint).resolve()
    return final, run_dir / "datasets" / final.relative_to(
        (run_dir / "checkpoints").resolve()).parts[0]


def experiment_config(run_dir: str | Path, experiment: str, overrides: Sequence[str] = ()
                      ) -> ExperimentConfig:
    """The run's config of ``experiment`` (``RUN/configs/<experiment>.yaml``, which the study
    writes first) with ``overrides`` (``SECTION.FIELD=VALUE``) applied."""
    from spice_ray.config import load_config, with_overrides

    return with_overrides(load_config(Path(run_dir) / "configs" / f"{experiment}.yaml"),
                          tuple(overrides))


def epoch_checkpoints(run_dir: str | Path, experiment: str, seed: int,
                      overrides: Sequence[str] = (), kind: str = "spice") -> list[Path]:
    """Every ``epoch-*`` checkpoint of the experiment's own ``kind`` model of training seed
    ``seed`` (not a weight-ablation variant's on the same dataset), in epoch order, from the
    directory the study's pretraining stage gives that model: a training under way or
    finished.

    Raises:
        ValueError: there is none, naming the directory looked in.
    """
    from spice_ray.data.store import dataset_dir
    from spice_ray.train.ray_train import plan_job

    run_dir = Path(run_dir)
    cfg = experiment_config(run_dir, experiment, overrides)
    dataset = dataset_dir(run_dir / "datasets", cfg)
    _, model_dir = plan_job(cfg, kind, seed, dataset, run_dir / "checkpoints")
    found = sorted(model_dir.glob("local/epoch-*"), key=lambda p: int(p.name.split("-")[1]))
    if not found:
        raise ValueError(f"no epoch checkpoint of {experiment} {kind} seed {seed} in "
                         f"{model_dir}")
    return found


def trained_epochs(checkpoint: str | Path) -> int:
    """How many epochs a checkpoint has trained, from its own ``meta.json``."""
    return int(ckpt.read_meta(checkpoint)["epoch"]) + 1


def checkpoint_after(run_dir: str | Path, experiment: str, seed: int, epochs: int,
                     overrides: Sequence[str] = (), kind: str = "spice") -> Path:
    """The ``epoch-*`` checkpoint of :func:`epoch_checkpoints` that has trained ``epochs``
    epochs (read from its ``meta.json``, not its place in the list: a training that
    checkpoints every few epochs skips the others).

    Raises:
        ValueError: there is none, naming the epochs there are.
    """
    found = {trained_epochs(c): c for c in epoch_checkpoints(run_dir, experiment, seed,
                                                             overrides, kind)}
    if epochs not in found:
        raise ValueError(f"{experiment} {kind} seed {seed} has no checkpoint after {epochs} "
                         f"epochs; it has them after {', '.join(map(str, sorted(found)))}")
    return found[epochs]
