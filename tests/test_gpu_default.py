"""Where models train when nobody says: ``train.use_gpu`` / ``train.population`` "auto" (the
defaults) train on a GPU as populations where there is one and leave a CPU machine's study as
it was; an explicit true or false is obeyed."""

from __future__ import annotations

import pytest

from spice_ray.config import make_config
from spice_ray.config.sections import AUTO, TrainConfig
from spice_ray.runtime.resources import gpus_available
from spice_ray.study import stages
from spice_ray.train import together
from spice_ray.train.loop import TrainJob


def _trains(plan) -> dict[str, tuple]:
    return {name: (c.train.use_gpu, c.train.population, c.train.num_workers)
            for name, c in plan.configs.items()}


def test_the_defaults_are_auto_and_resolve_by_whether_there_is_a_gpu() -> None:
    tc = TrainConfig()
    assert (tc.use_gpu, tc.population) == (AUTO, AUTO)
    assert (tc.on_gpu(False), tc.on_gpu(True)) == (False, True)
    assert (tc.populations(False), tc.populations(True)) == (False, True)
    off = TrainConfig(use_gpu=False, population=False)
    assert (off.on_gpu(True), off.populations(True)) == (False, False)
    on = TrainConfig(use_gpu=True, population=True)  # asked for: the job warns if none
    assert (on.on_gpu(False), on.populations(False)) == (True, True)


def test_a_cluster_without_gpus_trains_auto_on_cpus_and_one_with_gpus_on_them() -> None:
    cpus, gpus = {"CPU": 2.0}, {"CPU": 16.0, "GPU": 1.0}
    assert gpus_available(AUTO, cpus, environ={}) is False
    assert gpus_available(AUTO, gpus, environ={}) is True
    assert gpus_available(False, gpus, environ={}) is False
    assert gpus_available(True, cpus, environ={}) is False  # the CPU fallback (with a warning)


def test_plan_study_on_a_cpu_machine_changes_nothing(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(stages, "_local_gpu", lambda: False)
    plan = stages.plan_study("small", tmp_path / "run", experiments=("bandit", "darkroom"))
    assert _trains(plan) == {"bandit": (AUTO, AUTO, 1), "darkroom": (AUTO, AUTO, 2)}
    assert not (tmp_path / "run").exists()  # planning writes nothing


def test_plan_study_with_a_gpu_trains_populations_on_it_in_the_driver(monkeypatch, tmp_path
                                                                      ) -> None:
    monkeypatch.setattr(stages, "_local_gpu", lambda: True)
    plan = stages.plan_study("small", tmp_path / "run", experiments=("bandit", "darkroom"))
    assert _trains(plan) == {"bandit": (True, True, 0), "darkroom": (True, True, 0)}
    # the user's explicit choices stand
    plan = stages.plan_study("small", tmp_path / "run", experiments=("darkroom",),
                             overrides=["train.population=false"])
    assert _trains(plan) == {"darkroom": (True, False, 2)}
    plan = stages.plan_study("small", tmp_path / "run", experiments=("darkroom",),
                             overrides=["train.use_gpu=false"])
    assert _trains(plan) == {"darkroom": (False, AUTO, 2)}


def test_auto_leaves_a_models_identity_where_false_put_it() -> None:
    """``use_gpu`` and ``population`` say how a model is computed, not what it learns: the
    defaults' change to "auto" keeps every trained model current."""
    ids = set()
    for sets in ([], ["train.use_gpu=false", "train.population=false"],
                 ["train.use_gpu=true", "train.population=true"]):
        cfg = make_config("smoke", "darkroom", overrides=sets)
        ids.add(TrainJob(config=cfg.to_dict(), kind="spice", seed=0, dataset_dir="d",
                         dataset_hash="h").identity())
    assert len(ids) == 1


def test_the_driver_trains_auto_on_cpu_where_torch_has_no_gpu(monkeypatch) -> None:
    monkeypatch.setattr(together.torch.cuda, "is_available", lambda: False)
    assert together.training_on_gpu(TrainConfig(num_workers=0)) is False
    assert together.training_on_gpu(TrainConfig(num_workers=0, use_gpu=True)) is False
    monkeypatch.setattr(together.torch.cuda, "is_available", lambda: True)
    assert together.training_on_gpu(TrainConfig(num_workers=0)) is True
    assert together.training_on_gpu(TrainConfig(num_workers=0, use_gpu=False)) is False


@pytest.mark.parametrize("value", ["3", "yes please", "1"])
def test_anything_else_is_refused_by_name(value) -> None:
    from spice_ray.config import ConfigError

    with pytest.raises(ConfigError, match=r"train\.population=.* is invalid: one of true, "
                                          r"false, auto"):
        make_config("smoke", "darkroom", overrides=[f"train.population={value}"])
