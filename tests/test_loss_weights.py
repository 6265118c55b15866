"""The loss weights chosen on validation (``train.choose``): the candidates trained, the
label-free choice, its record in tuning.json, and a tampered record scored again."""

from __future__ import annotations

import logging
import re

import pytest

from spice_ray.config import ConfigError, make_config
from spice_ray.config.grids import GRIDS
from spice_ray.results.choices import choices_table
from spice_ray.study import loss_weights
from spice_ray.study.experiments import EXPERIMENTS
from spice_ray.train.loop import TrainJob


@pytest.mark.parametrize("value, shown", [("[lr]", "['lr']"),
                                          ("[lambda_q, lambda_q]", "['lambda_q', 'lambda_q']")])
def test_choose_names_loss_weight_grids_once(value, shown) -> None:
    with pytest.raises(ConfigError, match=re.escape(f"train.choose={shown} is invalid")):
        make_config("smoke", "bandit_latent", overrides=[f"train.choose={value}"])
    assert make_config("smoke", "bandit_latent",
                       overrides=["train.choose=[lambda_q]"]).train.choose == ("lambda_q",)


def test_candidates_replace_the_main_spice_model_and_train_as_a_model_of_that_weight() -> None:
    """One SPICE candidate per grid point (DPT and variants untouched), each the very model a
    study at that lambda_q trains: the same training identity, so checkpoints are shared."""
    exp = EXPERIMENTS["bandit"]
    cfg = make_config("smoke", "bandit", overrides=["train.choose=[lambda_q]"])
    plain = make_config("smoke", "bandit")
    assert loss_weights.trained_models(exp, plain) == exp.models
    models = loss_weights.trained_models(exp, cfg)
    assert [(m.kind, m.variant) for m in models] == [
        ("spice", "lambda_q=1"), ("spice", "lambda_q=10"), ("spice", "lambda_q=30"),
        ("dpt", "")]
    assert GRIDS["lambda_q"].tuning == (1.0, 10.0, 30.0)

    def identity(c, kind="spice"):
        return TrainJob(c.to_dict(), kind, "d", "h", 0).identity()

    for m, weight in zip(models[:3], (1.0, 10.0, 30.0), strict=True):
        built = m.config(cfg)
        assert built.train.lambda_q == weight and built.train.choose == ()
        at_weight = make_config("smoke", "bandit", overrides=[f"train.lambda_q={weight}"])
        assert identity(built) == identity(at_weight)
    assert identity(cfg, "dpt") == identity(plain, "dpt")  # choose changes nothing DPT learns
    assert len({identity(m.config(cfg)) for m in models[:3]}) == 3


def test_choose_is_refused_where_nothing_would_choose() -> None:
    cfg = make_config("smoke", "darkroom", overrides=["train.choose=[lambda_q]"])
    with pytest.raises(ConfigError, match="darkroom_dpt_star: train.choose"):
        loss_weights.check_choose("darkroom_dpt_star", EXPERIMENTS["darkroom_dpt_star"], cfg)
    loss_weights.check_choose("darkroom", EXPERIMENTS["darkroom"], cfg)


@pytest.fixture
def scored(monkeypatch):
    """choose_model over fake checkpoints: each candidate's log-likelihood by its path."""
    log_lik = {"lq1": -0.40, "lq10": -0.26, "lq30": -0.30}
    calls = []

    def fake_fit(spec, cfg, data, sources):
        calls.append(sorted(sources.values()))
        (name,) = {s.split("/")[0] for s in sources.values()}
        return {"log_lik": log_lik[name], "scale": 0.5, "targets": 100}

    monkeypatch.setattr("spice_ray.study.tuning.fit_width", fake_fit)
    monkeypatch.setattr(loss_weights.ckpt, "content_id", lambda p: f"id:{p}")
    monkeypatch.setattr(loss_weights.store, "split_id", lambda d, s: "validation-id")
    monkeypatch.setattr(loss_weights.store, "load_split", lambda *a, **k: {})
    return calls


def _finals(seeds=(0, 1)):
    return {("bandit_latent", "spice", f"lambda_q={w}", s): f"lq{w}/seed{s}"
            for w in (1, 10, 30) for s in seeds}


def test_the_highest_validation_log_likelihood_becomes_the_spice_model(scored, tmp_path,
                                                                       caplog) -> None:
    cfg = make_config("smoke", "bandit_latent",
                      overrides=["train.choose=[lambda_q]", "seeds=[0, 1]"])
    finals = _finals()
    record = loss_weights.choose_model("bandit_latent", cfg, tmp_path, finals)
    assert record["chosen"] == {"lambda_q": 10.0}
    assert [g["log_lik"] for g in record["grid"]] == [-0.40, -0.26, -0.30]
    assert [g["setting"] for g in record["grid"]] == loss_weights.grid_points(cfg)
    assert finals[("bandit_latent", "spice", "", 0)] == "lq10/seed0"
    assert finals[("bandit_latent", "spice", "", 1)] == "lq10/seed1"
    assert scored == [[f"lq{w}/seed0", f"lq{w}/seed1"] for w in (1, 10, 30)]  # seeds pooled

    # the same checkpoints and data: the record is used as it is, nothing scored again
    scored.clear()
    again = _finals()
    assert loss_weights.choose_model("bandit_latent", cfg, tmp_path, again, record) is record
    assert scored == [] and again[("bandit_latent", "spice", "", 0)] == "lq10/seed0"

    # an edited choice (the worst point) is named and scored again, never used
    tampered = {**record, "chosen": {"lambda_q": 1.0}}
    with caplog.at_level(logging.WARNING):
        fixed = loss_weights.choose_model("bandit_latent", cfg, tmp_path, _finals(), tampered)
    assert "says {'lambda_q': 1.0} was chosen, not its grid's best {'lambda_q': 10.0}" \
        in caplog.text
    assert fixed["chosen"] == {"lambda_q": 10.0} and len(scored) == 3

    # other checkpoints: scored again (quietly: that is new work, not a bad record)
    scored.clear()
    other = {k: v + "-retrained" for k, v in _finals().items()}
    loss_weights.choose_model("bandit_latent", cfg, tmp_path, other, record)
    assert len(scored) == 3


def test_no_grid_no_choice_and_the_report_row(scored, tmp_path) -> None:
    cfg = make_config("smoke", "bandit_latent")
    finals = _finals()
    assert loss_weights.choose_model("bandit_latent", cfg, tmp_path, finals) is None
    assert ("bandit_latent", "spice", "", 0) not in finals and scored == []
    problem = loss_weights.record_problem({"grid": [], "chosen": {}},
                                          [{"lambda_q": 1.0}])
    assert problem == "was scored on another grid"
    record = loss_weights.choose_model(
        "bandit_latent", make_config("smoke", "bandit_latent",
                                     overrides=["train.choose=[lambda_q]", "seeds=[0, 1]"]),
        tmp_path, finals)
    row = choices_table({"bandit_latent": {"methods": {}, "models": {"spice": record}}})
    assert row.to_dict("records") == [{
        "experiment": "bandit_latent", "method": "SPICE's loss weights",
        "chosen": "lambda_q=10 (log-lik -0.2600 per reward, no label read)",
        "grid points": 3, "validation regret": "-", "runner-up margin": "-"}]


def test_two_grids_multiply_and_the_shrinkage_weight_scales_its_loss() -> None:
    """``train.choose=[lambda_q, lambda_shrink]``: 3 x 2 candidates, the first grid slowest;
    lambda_shrink = 0 takes exactly lambda_q L_shrink out of the loss, 1 is the paper's."""
    import dataclasses

    import numpy as np
    import torch

    from spice_ray.data.tasks import generate_tasks
    from spice_ray.model.registry import build_model
    from spice_ray.model.tokens import make_tokens
    from spice_ray.train.losses import spice_loss

    cfg = make_config("smoke", "bandit_latent",
                      overrides=["train.choose=[lambda_q, lambda_shrink]",
                                 "train.lambda_q=10"])
    assert [loss_weights.variant_name(p) for p in loss_weights.grid_points(cfg)] == [
        "lambda_q=1,lambda_shrink=1", "lambda_q=1,lambda_shrink=0",
        "lambda_q=10,lambda_shrink=1", "lambda_q=10,lambda_shrink=0",
        "lambda_q=30,lambda_shrink=1", "lambda_q=30,lambda_shrink=0"]
    model = build_model("spice", cfg, generator=torch.Generator().manual_seed(0))
    tokens = make_tokens(generate_tasks(cfg.env, cfg.data, "eval", np.arange(4)),
                         cfg.environment())
    out = model(tokens)
    anchor = model.anchor_loss()
    paper, p_parts = spice_loss(out, tokens, cfg.train, anchor)
    none, n_parts = spice_loss(out, tokens, dataclasses.replace(cfg.train, lambda_shrink=0.0),
                               anchor)
    assert p_parts["shrink"] > 0 and torch.equal(p_parts["shrink"], n_parts["shrink"])
    torch.testing.assert_close(paper - none, 10 * p_parts["shrink"])


def test_a_non_finite_score_is_refused_by_name(scored, tmp_path, monkeypatch) -> None:
    """A candidate whose log-likelihood is not finite stops the study naming it, never a
    choice made by comparing NaN."""
    monkeypatch.setattr("spice_ray.study.tuning.fit_width", lambda spec, cfg, data, sources: {
        "log_lik": float("nan") if "lq10" in next(iter(sources.values())) else -0.3,
        "scale": 0.5, "targets": 100})
    cfg = make_config("smoke", "bandit_latent",
                      overrides=["train.choose=[lambda_q]", "seeds=[0, 1]"])
    with pytest.raises(ValueError, match=r"SPICE \[lambda_q=10\] is not finite"):
        loss_weights.choose_model("bandit_latent", cfg, tmp_path, _finals())
