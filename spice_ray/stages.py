"""Pipeline stages shared by pipelines/*.py and sweeps/*.py: ``stage(cfg, ...) -> result``.

Each stage reads its input from a directory with a manifest and writes the same, and is a no-op
when its output is already complete and matches the config.
"""

from __future__ import annotations

import logging
from pathlib import Path

from spice_ray.config import RunConfig
from spice_ray.console import SILENT, Console, count
from spice_ray.data import store
from spice_ray.data.generate import GenerationReport, generate_dataset

log = logging.getLogger(__name__)


def datasets_root(cfg: RunConfig) -> Path:
    return Path(cfg.out_dir) / "datasets"


def generate_stage(cfg: RunConfig, dataset_root: Path | None = None,
                   console: Console = SILENT, label: str = "") -> GenerationReport:
    """Generate (or resume, or verify) the dataset of ``cfg`` under ``<out_dir>/datasets``,
    with a progress bar named ``label`` on ``console`` (shards written)."""
    ds_dir = store.dataset_dir(dataset_root or datasets_root(cfg), cfg)
    total = sum(store.num_shards(n, cfg.data.shard_size)
                for n in store.split_sizes(cfg.data).values())
    bar = console.bar(label or ds_dir.name, total, "shard")
    try:
        report = generate_dataset(cfg, ds_dir, on_shard=lambda: bar.update(1))
    except BaseException as exc:
        bar.abort(exc)
        raise
    cfg.write(ds_dir)
    made = sum(len(v) for v in report.generated.values())
    kept = sum(len(v) for v in report.skipped.values())
    log.info("%s: %d shards generated, %d already valid, %.1f s", ds_dir, made, kept,
             report.seconds)
    bar.close(f"{report.num_tasks} tasks, {count(made, 'shard')} written, {kept} already "
              "valid" if made else f"{report.num_tasks} tasks, all {count(kept, 'shard')} "
              "current")
    return report
