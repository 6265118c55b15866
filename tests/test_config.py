"""Config validation: every bad value is refused with the field's name, before any work."""

from __future__ import annotations

import pytest

from spice_ray.config import (
    ConfigError,
    ExperimentConfig,
    load_config,
    make_config,
    parse_set,
)
from spice_ray.envs.labels import parse_label


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ("env.num_arms=1", "env.num_arms"),
        ("env.horizon=0", "env.horizon"),
        ("env.sigma=-0.1", "env.sigma"),
        ("fusion.tau=0", "fusion.tau"),
        ("fusion.tau=-1", "fusion.tau"),
        ("fusion.v_min=0", "fusion.v_min"),
        ("model.ensemble_size=1", "model.ensemble_size"),
        ("model.head_kernel=fast", "model.head_kernel"),
        ("data.behaviour_omega=1.5", "data.behaviour_omega"),
        ("data.behaviour_omega=-0.01", "data.behaviour_omega"),
        ("data.label=bogus", "data.label"),
        ("data.label=mix:1.5", "data.label"),
        ("data.num_train_tasks=0", "data.num_train_tasks"),
        ("train.gamma=1.2", "train.gamma"),
        ("train.lr=0", "train.lr"),
        ("train.threads=-1", "train.threads"),
        ("fusion.kernel=gauss", "fusion.kernel"),
        ("fusion.noise_var=-1", "fusion.noise_var"),
        ("eval.num_tasks=100000", "eval.num_tasks"),
        ("model.n_embd=30", "model.n_embd"),  # not divisible by n_head=4 below
    ],
)
def test_bad_values_name_the_field(override: str, field: str) -> None:
    extra = ["model.n_head=4"] if field == "model.n_embd" else []
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        make_config("smoke", "bandit", overrides=[override, *extra])


def test_unknown_keys_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"unknown key 'data\.num_taks'"):
        make_config("smoke", "bandit", overrides=["data.num_taks=3"])
    with pytest.raises(ConfigError, match=r"unknown key 'bogus'"):
        make_config("smoke", "bandit", overrides=["bogus.x=3"])


def test_wrong_types_are_refused(tmp_path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("data:\n  num_train_tasks: lots\n")
    with pytest.raises(ConfigError, match=r"data\.num_train_tasks='lots'.*integer"):
        make_config("smoke", "bandit", yaml_path=path)
    with pytest.raises(ConfigError, match=r"train\.use_gpu=3 is invalid: one of true, false, auto"):
        make_config("smoke", "bandit", overrides=["train.use_gpu=3"])
    with pytest.raises(ConfigError, match=r"model\.n_layer=2\.5.*integer"):
        make_config("smoke", "bandit", overrides=["model.n_layer=2.5"])


def test_exponent_floats_without_a_dot() -> None:
    cfg = make_config("smoke", "bandit", overrides=["train.lr=3e-3", "fusion.v_min=1E-2"])
    assert cfg.train.lr == 0.003 and cfg.fusion.v_min == 0.01
    with pytest.raises(ConfigError, match=r"train\.lr='3e-3x'"):
        make_config("smoke", "bandit", overrides=["train.lr=3e-3x"])


def test_weak_label_is_bandit_only() -> None:
    with pytest.raises(ConfigError, match=r"data\.label"):
        make_config("smoke", "darkroom", overrides=["data.label=weak"])


def test_presets_and_env_defaults() -> None:
    paper_b = make_config("paper", "bandit")
    assert paper_b.data.num_train_tasks == 100_000
    assert paper_b.train.epochs == 300 and paper_b.seeds == (0, 1, 2)
    assert (paper_b.env.num_arms, paper_b.env.horizon, paper_b.env.sigma) == (5, 500, 0.3)
    paper_d = make_config("paper", "darkroom")
    assert paper_d.train.epochs == 50 and paper_d.data.num_eval_tasks == 100
    assert (paper_d.train.td_n, paper_d.train.gamma) == (5, 0.95)
    # the default kernel compares raw states (chosen from measurements, see envs/darkroom.py);
    # the paper's reading, the trunk's query latents at tau = 0.5, is one override away
    assert (paper_d.fusion.kernel, paper_d.fusion.kernel_space, paper_d.fusion.tau) == (
        "rbf", "state", 0.7)
    paper_reading = make_config("paper", "darkroom", overrides=["fusion.kernel_space=latent",
                                                                "fusion.tau=0.5"])
    assert (paper_reading.fusion.kernel_space, paper_reading.fusion.tau) == ("latent", 0.5)
    assert paper_d.train.shrink_prior == "data"
    assert paper_d.data.label == "weak-last"
    smoke = make_config("smoke", "bandit")
    assert smoke.data.num_train_tasks < 1000 and smoke.preset == "smoke"


def test_overrides_yaml_and_roundtrip(tmp_path) -> None:
    yml = tmp_path / "c.yaml"
    yml.write_text("data:\n  num_train_tasks: 500\nseeds: [4, 5]\n")
    cfg = make_config("small", "bandit", yaml_path=yml,
                      overrides=["data.num_train_tasks=2000", "data.label=mix:0.3"])
    assert cfg.data.num_train_tasks == 2000  # --set wins over YAML
    assert cfg.seeds == (4, 5) and cfg.data.label == "mix:0.3"
    path = cfg.write(tmp_path / "run")
    assert load_config(path) == cfg


def test_parse_helpers() -> None:
    assert parse_label("weakmix80") == ("mix", 0.8)
    assert parse_label("mix:0.25") == ("mix", 0.25)
    assert parse_label("weak-last") == ("weak-last", 0.0)
    assert parse_set(["a.b=1", "a.c=x", "d=[1, 2]"]) == {"a": {"b": 1, "c": "x"}, "d": [1, 2]}
    with pytest.raises(ConfigError, match="expected section.field=value"):
        parse_set(["novalue"])


def test_configs_are_frozen() -> None:
    cfg = ExperimentConfig()
    with pytest.raises(AttributeError):
        cfg.env.horizon = 3  # type: ignore[misc]


def test_the_old_name_runconfig_still_imports_with_one_warning(monkeypatch) -> None:
    """Renamed ExperimentConfig so it is never taken for Ray's RunConfig (tune's, train's)."""
    import warnings

    import spice_ray.config as config

    monkeypatch.setattr(config, "_RENAMED_WARNED", [])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        from spice_ray.config import RunConfig

        assert RunConfig is ExperimentConfig and config.RunConfig is ExperimentConfig
    assert [str(w.message) for w in caught] == [
        "spice_ray.config.RunConfig is renamed ExperimentConfig; the old name still works for now"]
    with pytest.raises(AttributeError, match="has no attribute 'RunConfg'"):
        config.RunConfg  # noqa: B018
