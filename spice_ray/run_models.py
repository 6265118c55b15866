"""Finding and checking a study's models before a policy runs them: the checkpoint index
entry against the checkpoint's own ``meta.json``, a ``save_pretrained`` folder's config before
any weight is read, and the fusion setting the tuning stage chose on validation. Used by
``spice_ray.policy``; no model runs here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from spice_ray.common.errors import excerpt
from spice_ray.config import FusionConfig, from_dict
from spice_ray.model import checkpoint as ckpt

PRETRAINED_CONFIG = "config.json"
"""The config file of a ``save_pretrained`` folder (``spice_ray.policy`` writes it)."""


def checked_entry(run_dir: Path, entry: dict[str, Any]) -> Path:
    """The checkpoint directory of a checkpoint-index entry, once its own ``meta.json``
    (checksummed) agrees with the entry: kind, seed and training identity (the index's, or
    the 8 hex digits that name the directory, ``<kind>-<identity>-seed<k>``, in an index
    written before identities were recorded)."""
    path = run_dir / entry["path"]
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
    return path


def pretrained_model(directory: Path, kind: str, name: str
                      ) -> tuple[Any, Any, dict[str, Any]]:
    """The freshly built model, run config and saved options of a :meth:`save_pretrained`
    folder's ``config.json``, checked before any weight is read: the kind, a run config that
    validates, an architecture equal to the one that config builds (so a hand-edited
    ``max_len`` or width is refused, not allocated), and weights that fit in memory."""
    from spice_ray.common.artifacts import UnreadableFile, read_json
    from spice_ray.config import ConfigError
    from spice_ray.model.registry import build_model
    from spice_ray.runtime.resources import available_memory, human_bytes

    path = directory / PRETRAINED_CONFIG
    try:
        meta = read_json(path)
    except UnreadableFile as exc:
        raise ValueError(str(exc)) from None
    if meta.get("kind") != kind:
        raise ValueError(f"{directory} holds a {excerpt(meta.get('kind'))} model; "
                         f"{name} needs {kind!r}")
    try:
        cfg = from_dict(meta["config"])
    except (KeyError, TypeError, ValueError, AttributeError, ConfigError) as exc:
        raise ValueError(f"{path}: field config is not a run config "
                         f"({excerpt(str(exc))})") from None
    with torch.device("meta"):  # no memory: the architecture only
        shape = build_model(kind, cfg)
    expected = shape.spec()
    if meta.get("spec") != expected:
        got = meta.get("spec") if isinstance(meta.get("spec"), dict) else {}
        fields = sorted(k for k in set(expected) | set(got) if got.get(k) != expected.get(k))
        raise ValueError(f"{path}: field spec ({', '.join(fields) or 'its type'}) is not the "
                         "architecture its run config builds: edited by hand?")
    weights = 4 * sum(t.numel() for t in (*shape.parameters(), *shape.buffers()))  # fp32
    if weights > available_memory():
        raise ValueError(f"{path}: the model's weights need ~{human_bytes(weights)}, more "
                         "than this machine's available memory")
    saved = meta.get("options", {})
    if not isinstance(saved, dict):
        raise ValueError(f"{path}: field options is not an object")
    saved = dict(saved)
    if "fusion" in saved:
        try:
            saved["fusion"] = FusionConfig(**saved["fusion"])
        except (TypeError, ValueError, ConfigError) as exc:
            raise ValueError(f"{path}: field options.fusion is invalid "
                             f"({excerpt(str(exc))})") from None
    return build_model(kind, cfg), cfg, saved


def tuned_fusion(run_dir: Path, experiment: str, cfg: Any
                  ) -> tuple[dict[str, Any], FusionConfig] | None:
    """(SPICE's chosen setting, its fusion) from the run's checksummed ``tuning.json``, built
    by the tuning stage's own grid (``spice_ray.tuning.candidates``) so it is the fusion of
    the tuned table; None without a usable record (logged)."""
    import logging

    from spice_ray.agents import AgentSpec
    from spice_ray.results.choices import record_problem
    from spice_ray.tuning import grid_point, read_tuning

    record = read_tuning(run_dir).get(experiment)
    method = (record or {}).get("methods", {}).get("SPICE")
    if method is None or record_problem(record) is not None:
        logging.getLogger(__name__).info("%s: no usable tuning record of SPICE for %s: the "
                                         "checkpoint's settings", run_dir, experiment)
        return None
    point = grid_point(AgentSpec("spice", fusion=cfg.fusion), cfg.eval, record,
                       method["chosen"])
    return None if point is None else (dict(point.setting), point.spec.fusion)
