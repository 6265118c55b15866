"""Pipeline stages shared by pipelines/*.py and sweeps/*.py: ``stage(cfg, ...) -> result``.

Each stage reads its input from a directory with a manifest and writes the same, and is a no-op
when its output is already complete and matches the config.
"""

from __future__ import annotations

import logging
from pathlib import Path

from spice_ray.config import RunConfig
from spice_ray.data import store
from spice_ray.data.generate import GenerationReport, generate_dataset

log = logging.getLogger(__name__)


def datasets_root(cfg: RunConfig) -> Path:
    return Path(cfg.out_dir) / "datasets"


def generate_stage(cfg: RunConfig, dataset_root: Path | None = None) -> GenerationReport:
    """Generate (or resume, or verify) the dataset of ``cfg`` under ``<out_dir>/datasets``."""
    ds_dir = store.dataset_dir(dataset_root or datasets_root(cfg), cfg)
    report = generate_dataset(cfg, ds_dir)
    cfg.write(ds_dir)
    made = sum(len(v) for v in report.generated.values())
    kept = sum(len(v) for v in report.skipped.values())
    log.info("%s: %d shards generated, %d already valid, %.1f s", ds_dir, made, kept,
             report.seconds)
    return report
