"""Experiment tracking, optional (``track: none | tensorboard | mlflow | wandb``).

What is tracked:

* **training** (rank 0 of each model's run, :class:`TrainTracker`): every optimiser step's
  loss components (``train/loss``, ``train/policy``, ``train/td``, ``train/shrink``,
  ``train/anchor``), the policy-weight factors' statistics (``train/weight_mean``,
  ``train/weight_max``, ``train/q_std_mean``), the gradient norm and learning rate, and each
  epoch's train/validation means (``epoch/*``); the run's parameters are its flattened config
  (TensorBoard: the HParams view);
* **sweeps** (the driver, Tune's own logger callbacks, :func:`tune_callbacks`): every trial's
  reported metrics (running regret after each chunk) and parameters;
* **the study** (:func:`log_study`): its headline numbers as metrics and the settings chosen on
  validation tasks as parameters (MLflow's compare view, TensorBoard's HParams view), the
  result tables, figures and report as artifacts, and every final checkpoint as a model
  artifact.

Backends, each through the integration its project or Ray ships: TensorBoard with torch's
``SummaryWriter`` (and Tune's ``TBXLoggerCallback``) under ``<out_dir>/tensorboard``; MLflow with
``ray.air.integrations.mlflow.setup_mlflow`` (and ``MLflowLoggerCallback``) at ``track_uri``
(default: a local SQLite store ``<out_dir>/mlflow.db``, artifacts in ``<out_dir>/mlartifacts``;
no server); Weights & Biases with
``ray.air.integrations.wandb.setup_wandb`` (and ``WandbLoggerCallback``), offline under
``<out_dir>/wandb`` unless ``WANDB_MODE`` says otherwise. TensorBoard has no artifact store:
the report is logged as text there.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from torch import Tensor

from spice_ray.common.errors import SpiceRayError
from spice_ray.config import ExperimentConfig

LIBRARY_LOGGERS = ("mlflow", "alembic")
"""Loggers of the trackers' libraries that print INFO lines to stderr: the run's log file."""
PACKAGES = {"tensorboard": "tensorboard", "mlflow": "mlflow", "wandb": "wandb"}
"""The Python package each tracker needs (all in the ``track`` extra)."""


class TrackingError(SpiceRayError, RuntimeError):
    """A tracker's package is missing or it cannot start."""


def check_available(track: str) -> None:
    """Refuse a tracker whose package is not installed, before any work starts.

    Raises:
        TrackingError: naming the setting and the package.
    """
    package = PACKAGES.get(track)
    if package and importlib.util.find_spec(package) is None:
        raise TrackingError(f"track={track} needs the {package} package: pip install "
                            f"'spice-ray[track]' (or pip install {package})")


def flat_params(values: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"train": {"lr": 1e-3}}`` -> ``{"train.lr": 1e-3}`` (lists as text)."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, Mapping):
            out |= flat_params(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value if isinstance(value, bool | int | float | str) \
                else str(value)
    return out


def mlflow_uri(cfg: ExperimentConfig) -> str:
    """``track_uri``, or a SQLite store ``<out_dir>/mlflow.db`` (MLflow's local backend; its
    plain-file store needs ``MLFLOW_ALLOW_FILE_STORE=true`` since MLflow 3)."""
    return cfg.track_uri or f"sqlite:///{Path(cfg.out_dir).resolve() / 'mlflow.db'}"


def mlflow_artifacts(cfg: ExperimentConfig) -> str:
    """Where new MLflow experiments keep artifacts: ``<out_dir>/mlartifacts``."""
    return (Path(cfg.out_dir).resolve() / "mlartifacts").as_uri()


def wandb_mode() -> str:
    """``WANDB_MODE`` if set, else offline (nothing leaves the machine). Sets it in this
    process's environment, where Ray's W&B integration reads it (offline needs no API key)."""
    return os.environ.setdefault("WANDB_MODE", "offline")


class Run(Protocol):
    """One tracked run (a model's training, or the study)."""

    def log(self, metrics: Mapping[str, float], step: int) -> None: ...

    def artifact(self, path: Path) -> None: ...

    def image(self, path: Path) -> None:
        """A figure (PNG) as an image the tracker shows, ``figures/<name>``."""

    def model(self, path: Path, name: str) -> None:
        """A checkpoint directory as a model artifact named ``name``."""

    def finish(self) -> None: ...


class _TensorBoard:
    def __init__(self, log_dir: Path, params: Mapping[str, Any]) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(log_dir))
        self.params = dict(params)
        self.metric_names: dict[str, None] = {}

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)
            self.metric_names.setdefault(key)

    def artifact(self, path: Path) -> None:
        text = path.read_text() if path.suffix in (".md", ".txt", ".yaml") else str(path)
        self.writer.add_text(path.name, text)

    def image(self, path: Path) -> None:
        import matplotlib.image

        pixels = matplotlib.image.imread(str(path))[..., :3]  # RGB(A) floats in [0, 1]
        self.writer.add_image(f"figures/{path.stem}", pixels, dataformats="HWC")

    def model(self, path: Path, name: str) -> None:
        self.writer.add_text(f"checkpoints/{name}", str(path))  # no artifact store

    def finish(self) -> None:
        if self.params:  # the HParams view: this run's parameters beside its metrics' tags
            from torch.utils.tensorboard.summary import hparams

            for summary in hparams(self.params, dict.fromkeys(self.metric_names, 0.0)):
                self.writer.file_writer.add_summary(summary)
        self.writer.close()


def _quiet_mlflow() -> None:
    """MLflow's and Alembic's INFO lines ("Creating initial MLflow database tables...") to the
    run's log, not stderr: importing MLflow installs stderr handlers on their loggers; inside a
    run (the root logger writes the run's log file, ``runtime.cli.setup_logging``) they are
    removed and the records passed up to it. Outside a run they are left as they are."""
    import logging

    import mlflow  # noqa: F401

    if not any(getattr(h, "spice_ray", False) for h in logging.getLogger().handlers):
        return
    for name in LIBRARY_LOGGERS:
        logger = logging.getLogger(name)
        logger.handlers = []
        logger.propagate = True


class _MLflow:
    def __init__(self, cfg: ExperimentConfig, group: str, name: str, params: Mapping[str, Any]
                 ) -> None:
        from ray.air.integrations.mlflow import setup_mlflow

        _quiet_mlflow()
        self.mlflow = setup_mlflow(config=dict(params), tracking_uri=mlflow_uri(cfg),
                                   experiment_name=f"{cfg.track_project}-{group}",
                                   run_name=name, create_experiment_if_not_exists=True,
                                   artifact_location=mlflow_artifacts(cfg),
                                   rank_zero_only=False)  # callers run on rank 0 only

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self.mlflow.log_metrics(dict(metrics), step=step)

    def artifact(self, path: Path) -> None:
        self.mlflow.log_artifact(str(path))

    def image(self, path: Path) -> None:
        import matplotlib.image

        self.mlflow.log_image(matplotlib.image.imread(str(path))[..., :3],
                              artifact_file=f"figures/{path.name}")

    def model(self, path: Path, name: str) -> None:
        self.mlflow.log_artifacts(str(path), artifact_path=f"checkpoints/{name}")

    def finish(self) -> None:
        self.mlflow.end_run()


class _Wandb:
    def __init__(self, cfg: ExperimentConfig, group: str, name: str, params: Mapping[str, Any]
                 ) -> None:
        from ray.air.integrations.wandb import setup_wandb

        root = Path(cfg.out_dir).resolve()
        root.mkdir(parents=True, exist_ok=True)
        self.run = setup_wandb(config=dict(params), project=f"{cfg.track_project}-{group}",
                               name=name, dir=str(root), mode=wandb_mode(),
                               rank_zero_only=False)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self.run.log(dict(metrics), step=step)

    def artifact(self, path: Path) -> None:
        import wandb

        art = wandb.Artifact(path.stem.replace(".", "_"), type="result")
        art.add_file(str(path))
        self.run.log_artifact(art)

    def image(self, path: Path) -> None:
        import wandb

        self.run.log({f"figures/{path.stem}": wandb.Image(str(path))})

    def model(self, path: Path, name: str) -> None:
        import wandb

        art = wandb.Artifact(name.replace("/", "-"), type="model")
        art.add_dir(str(path))
        self.run.log_artifact(art)

    def finish(self) -> None:
        self.run.finish()


def start(cfg: ExperimentConfig, group: str, name: str, params: Mapping[str, Any] | None = None
          ) -> Run | None:
    """A run of ``cfg.track`` named ``name`` in ``group`` (an experiment), or None for
    ``track=none``.

    Raises:
        TrackingError: the tracker's package is missing.
    """
    if cfg.track == "none":
        return None
    check_available(cfg.track)
    params = flat_params(params if params is not None else cfg.to_dict())
    if cfg.track == "tensorboard":
        return _TensorBoard(Path(cfg.out_dir).resolve() / "tensorboard" / group / name, params)
    if cfg.track == "mlflow":
        return _MLflow(cfg, group, name, params)
    return _Wandb(cfg, group, name, params)


class TrainTracker:
    """StepObserver that logs a model's training to a :class:`Run` (rank 0 only)."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self._step = 0

    def step(self, step: int, total: int, epoch: int, components: Mapping[str, Tensor]
             ) -> None:
        self._step = step
        self.run.log({f"train/{k}": float(v) for k, v in components.items()}, step)

    def epoch(self, epoch: int, metrics: Mapping[str, float]) -> None:
        self.run.log({f"epoch/{k}": float(v) for k, v in metrics.items()}, self._step)


def log_study(cfg: ExperimentConfig, run_dir: Path, name: str = "study",
              metrics: Mapping[str, float] | None = None,
              params: Mapping[str, Any] | None = None,
              checkpoints: Mapping[tuple[str, str, str, int], Path] | None = None) -> None:
    """The study's result tables and report as artifacts and its figures as images of one
    run ``name``, with
    its headline ``metrics`` (logged at step 0: a compare view lines runs up by them),
    ``params`` (e.g. the settings chosen on validation tasks) beside the config's (TensorBoard:
    its HParams view), and its final ``checkpoints``
    ({(experiment, model kind, variant, seed): directory}, each directory once) as model
    artifacts ``<experiment>/<kind>[/<variant>]/seed<k>`` (TensorBoard, which stores none:
    their paths)."""
    run = start(cfg, name, name, params={**flat_params(cfg.to_dict()), **(params or {})})
    if run is None:
        return
    try:
        if metrics:
            run.log(metrics, 0)
        files = [*sorted((run_dir / "results").glob("*.parquet")), run_dir / "report.md"]
        for path in files:
            if path.exists():
                run.artifact(path)
        for path in sorted((run_dir / "figures").glob("*.png")):
            run.image(path)  # shown as images, not paths or files to download
        logged: set[Path] = set()
        for (exp, kind, variant, seed), path in sorted((checkpoints or {}).items()):
            if Path(path).resolve() not in logged:  # a variant trained as another is one
                logged.add(Path(path).resolve())
                parts = (exp, kind, variant) if variant else (exp, kind)  # "": the kind's own
                run.model(Path(path), "/".join(parts) + f"/seed{seed}")
    finally:
        run.finish()


def tune_callbacks(cfg: ExperimentConfig, name: str) -> list[Any]:
    """Tune's logger callbacks for ``cfg.track`` (sweep ``name``): every trial's reported
    metrics and parameters."""
    if cfg.track == "none":
        return []
    check_available(cfg.track)
    if cfg.track == "tensorboard":
        from ray.tune.logger import TBXLoggerCallback

        return [TBXLoggerCallback()]
    if cfg.track == "mlflow":
        from ray.air.integrations.mlflow import MLflowLoggerCallback

        _quiet_mlflow()
        return [MLflowLoggerCallback(tracking_uri=mlflow_uri(cfg),
                                     experiment_name=f"{cfg.track_project}-{name}")]
    from ray.air.integrations.wandb import WandbLoggerCallback

    return [WandbLoggerCallback(project=f"{cfg.track_project}-{name}", mode=wandb_mode(),
                                dir=str(Path(cfg.out_dir).resolve()))]
