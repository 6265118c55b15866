"""Experiment tracking: each backend writes what it should, read back with its own reader.

TensorBoard event files are read back with TensorBoard's EventAccumulator, MLflow through its
client over a local store (SQLite, artifacts in plain files), Weights & Biases in offline mode
only (no network).
"""

from __future__ import annotations

import importlib.util

import pytest

from spice_ray.config import make_config
from spice_ray.runtime.tracking import TrackingError, check_available

COMPONENTS = ("train/loss", "train/policy", "train/td", "train/shrink", "train/anchor",
              "train/weight_mean", "train/weight_max", "train/grad_norm")


def _needs(package: str):
    return pytest.mark.skipif(importlib.util.find_spec(package) is None,
                              reason=f"needs {package} (the track extra)")


def _train(tmp_path, track: str, workers: int = 0):
    """Train the smoke SPICE model with tracking on, in-process or on Ray Train (rank 0 of
    ``workers`` tracks); returns (cfg, steps)."""
    from spice_ray.data.generate import generate_dataset
    from spice_ray.train.ray_train import pretrain

    cfg = make_config("smoke", "bandit", overrides=[f"out_dir={tmp_path}", f"track={track}",
                                                    f"train.num_workers={workers}"])
    ds = generate_dataset(cfg, tmp_path / "ds").dataset_dir
    pretrain(cfg, "spice", 0, ds)
    steps = cfg.train.epochs * (cfg.data.num_train_tasks // cfg.train.batch_size)
    return cfg, steps


def test_missing_tracker_package_is_named(monkeypatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(TrackingError, match=r"track=mlflow needs the mlflow package"):
        check_available("mlflow")
    check_available("none")


def test_bad_track_value_is_refused() -> None:
    from spice_ray.config import ConfigError

    with pytest.raises(ConfigError, match="track='tensorbord' is invalid"):
        make_config("smoke", "bandit", overrides=["track=tensorbord"])


def _figure(run_dir):
    """A 40 x 30 pixel PNG as the study's figures/bandit_online.png."""
    import matplotlib.image
    import numpy as np

    (run_dir / "figures").mkdir()
    pixels = np.linspace(0, 1, 30 * 40 * 3).reshape(30, 40, 3)
    matplotlib.image.imsave(run_dir / "figures" / "bandit_online.png", pixels)


@pytest.mark.ray
@_needs("mlflow")
def test_mlflow_local_store_reads_back(ray_local, tmp_path) -> None:
    from mlflow.tracking import MlflowClient

    cfg, steps = _train(tmp_path, "mlflow")
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.get_experiment_by_name("spice-ray-pretrain")
    runs = client.search_runs([exp.experiment_id])
    assert len(runs) == 1
    run = runs[0]
    assert run.data.params["train.lr"] == str(cfg.train.lr)
    assert run.data.params["kind"] == "spice"
    for key in COMPONENTS:
        history = client.get_metric_history(run.info.run_id, key)
        assert [m.step for m in history] == list(range(1, steps + 1)), key
    assert len(client.get_metric_history(run.info.run_id, "epoch/val_loss")) == \
        cfg.train.epochs


@_needs("mlflow")
def test_mlflow_study_artifacts(tmp_path) -> None:
    from mlflow.tracking import MlflowClient

    from spice_ray.runtime.tracking import log_study

    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "bandit_online.parquet").write_bytes(b"PAR1")
    (tmp_path / "report.md").write_text("# report\n")
    _figure(tmp_path)
    cfg = make_config("smoke", "bandit", overrides=[f"out_dir={tmp_path}", "track=mlflow"])
    final, dpt = tmp_path / "checkpoints" / "final", tmp_path / "checkpoints" / "dpt"
    for path in (final, dpt):
        path.mkdir(parents=True)
        (path / "model.safetensors").write_bytes(b"weights")
        (path / "meta.json").write_text("{}")
    log_study(cfg, tmp_path, metrics={"bandit/SPICE/final_regret": 6.5},
              params={"bandit/SPICE/beta": 2.0},
              checkpoints={("bandit", "spice", "all", 0): final,
                           ("bandit", "spice", "none", 0): final,  # a variant trained as another
                           ("bandit", "dpt", "", 0): dpt})  # a kind without variants
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    run = client.search_runs([client.get_experiment_by_name("spice-ray-study").experiment_id])[0]
    assert sorted(a.path for a in client.list_artifacts(run.info.run_id)) == [
        "bandit_online.parquet", "checkpoints", "figures", "report.md"]
    assert [a.path for a in client.list_artifacts(run.info.run_id, "figures")] == [
        "figures/bandit_online.png"]  # logged as an image (mlflow.log_image)
    model = "checkpoints/bandit/spice/all/seed0"
    assert [a.path for a in client.list_artifacts(run.info.run_id, "checkpoints/bandit/spice")
            ] == ["checkpoints/bandit/spice/all"]  # logged once
    assert [a.path for a in client.list_artifacts(run.info.run_id, "checkpoints/bandit/dpt")
            ] == ["checkpoints/bandit/dpt/seed0"]
    assert sorted(a.path for a in client.list_artifacts(run.info.run_id, model)) == [
        f"{model}/meta.json", f"{model}/model.safetensors"]
    # the headline numbers line runs up in MLflow's compare view
    assert run.data.metrics == {"bandit/SPICE/final_regret": 6.5}
    assert run.data.params["bandit/SPICE/beta"] == "2.0"
    assert run.data.params["fusion.beta"] == str(cfg.fusion.beta)


@_needs("mlflow")
def test_mlflow_info_lines_go_to_the_runs_log_not_the_console(tmp_path, capfd) -> None:
    """MLflow and Alembic print INFO lines to stderr ("Creating initial MLflow database
    tables...") through handlers of their own: in a run they belong in logs/driver.log."""
    import io
    import logging

    from spice_ray.common.console import Console
    from spice_ray.runtime import cli
    from spice_ray.runtime.tracking import LIBRARY_LOGGERS, start

    loggers = [logging.getLogger(n) for n in ("", "spice_ray", *LIBRARY_LOGGERS)]
    saved = [(lg, list(lg.handlers), lg.propagate, lg.level) for lg in loggers]
    saved_dir = list(cli._LOG_DIR)
    try:
        cli.setup_logging(tmp_path, Console(io.StringIO(), live=False))
        cfg = make_config("smoke", "bandit", overrides=[f"out_dir={tmp_path}", "track=mlflow"])
        run = start(cfg, "study", "study", params={"a": 1})
        run.log({"x": 1.0}, 0)
        run.finish()
        for handler in logging.getLogger().handlers:
            handler.flush()
    finally:
        for lg, handlers, propagate, level in saved:
            for h in lg.handlers:
                if h not in handlers:
                    h.close()
            lg.handlers, lg.propagate, lg.level = handlers, propagate, level
        cli._LOG_DIR[:] = saved_dir
    printed = capfd.readouterr()
    assert "mlflow" not in printed.err.lower() and "alembic" not in printed.err.lower()
    assert "mlflow" not in printed.out.lower()
    log = (tmp_path / "logs" / "driver.log").read_text()
    assert "INFO mlflow.store.db.utils: Creating initial MLflow database tables" in log


@pytest.mark.ray
@_needs("wandb")
def test_wandb_offline_run_is_written(ray_local, tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("WANDB_MODE", raising=False)  # offline by default: no network
    monkeypatch.setenv("WANDB_SILENT", "true")
    _train(tmp_path, "wandb")
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    assert any(runs[0].glob("run-*.wandb"))  # the run's records, for `wandb sync`


@_needs("tensorboard")
def test_tensorboard_study_has_hparams(tmp_path) -> None:
    """The study's chosen settings and headline metrics reach TensorBoard's HParams view."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    from spice_ray.runtime.tracking import log_study

    (tmp_path / "report.md").write_text("# report\n")
    _figure(tmp_path)
    cfg = make_config("smoke", "bandit", overrides=[f"out_dir={tmp_path}", "track=tensorboard"])
    log_study(cfg, tmp_path, metrics={"bandit/SPICE/final_regret": 6.5},
              params={"bandit/SPICE/beta": 2.0},
              checkpoints={("bandit", "spice", "all", 0): tmp_path})
    acc = EventAccumulator(str(tmp_path / "tensorboard" / "study" / "study")).Reload()
    assert [e.value for e in acc.Scalars("bandit/SPICE/final_regret")] == [6.5]
    (image,) = acc.Images("figures/bandit_online")  # the figure itself, not its path
    assert (image.width, image.height) == (40, 30)
    content = acc.PluginTagToContent("hparams")
    experiment = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/experiment"])
    assert [m.name.tag for m in experiment.experiment.metric_infos] == [
        "bandit/SPICE/final_regret"]
    start = plugin_data_pb2.HParamsPluginData.FromString(
        content["_hparams_/session_start_info"]).session_start_info
    assert start.hparams["bandit/SPICE/beta"].number_value == 2.0
    assert start.hparams["fusion.beta"].number_value == cfg.fusion.beta
    texts = acc.Tensors("checkpoints/bandit/spice/all/seed0/text_summary")
    assert texts[0].tensor_proto.string_val[0].decode() == str(tmp_path)


@_needs("wandb")
def test_wandb_study_figures_are_images(tmp_path, monkeypatch) -> None:
    """W&B (offline) gets each figure as a wandb.Image in the run's media, beside the files."""
    from spice_ray.runtime.tracking import log_study

    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    (tmp_path / "report.md").write_text("# report\n")
    _figure(tmp_path)
    cfg = make_config("smoke", "bandit", overrides=[f"out_dir={tmp_path}", "track=wandb"])
    log_study(cfg, tmp_path)
    (run,) = (tmp_path / "wandb").glob("offline-run-*")
    media = sorted(p.name for p in run.glob("files/media/images/figures/*.png"))
    assert len(media) == 1 and media[0].startswith("bandit_online_")
