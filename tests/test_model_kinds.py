"""A new model kind is its class, one entry in the model registry and its loss: the training
loop, the checkpoint reader, the memory estimate and the agents ask the registries by kind, so
nothing else has to name it. Measured here by adding one (a DPT-shaped model trained with
label smoothing) without touching the package."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from spice_ray.agents import AgentSpec, Method, make_agent
from spice_ray.agents.base import METHODS, register_method
from spice_ray.agents.dpt import PolicyAgent
from spice_ray.config import make_config
from spice_ray.data.generate import generate_dataset
from spice_ray.model import DptModel
from spice_ray.model.registry import MODELS, load_model
from spice_ray.model.tokens import Tokens
from spice_ray.runtime.resources import model_estimate
from spice_ray.train.losses import LOSSES, loss_for, register_loss
from spice_ray.train.ray_train import plan_job, train_local


class SmoothedPolicyModel(DptModel):
    """A policy-only model whose loss smooths its labels: a kind of its own."""

    KIND = "smoothed"


def smoothed_loss(out, tokens: Tokens, model, task_ids: Tensor, cfg
                  ) -> tuple[Tensor, dict[str, Tensor]]:
    logits = out.logits.flatten(0, 1)  # (B * (T+1), A)
    label = tokens.label.repeat_interleave(out.logits.shape[1])
    loss = torch.nn.functional.cross_entropy(logits.float(), label, label_smoothing=0.1)
    return loss, {"loss": loss.detach(), "policy": loss.detach()}


@pytest.fixture
def smoothed_kind():
    MODELS["smoothed"] = SmoothedPolicyModel
    register_loss("smoothed")(smoothed_loss)
    register_method("smoothed", Method(
        "Smoothed", lambda spec, env, build: PolicyAgent(build.model, env.stateless, False,
                                                         True, "smoothed"),
        model="smoothed", offline=True))
    yield
    del MODELS["smoothed"], LOSSES["smoothed"], METHODS["smoothed"]


@pytest.mark.ray
def test_a_new_model_kind_trains_loads_and_acts_from_its_registrations(
        ray_local, tmp_path, smoothed_kind) -> None:
    cfg = make_config("smoke", "bandit", overrides=["train.num_workers=0", "train.epochs=2",
                                                    f"out_dir={tmp_path}"])
    ds = generate_dataset(cfg, tmp_path / "ds").dataset_dir
    job, run_dir = plan_job(cfg, "smoothed", 0, ds)
    res = train_local(job, run_dir)
    assert run_dir.name.startswith("smoothed-")
    model = load_model(res.final, expect_env=cfg.env, kind="smoothed")
    assert type(model) is SmoothedPolicyModel
    with pytest.raises(Exception, match="smoothed"):
        load_model(res.final, kind="dpt")  # the checkpoint says what it is
    # the memory estimate asks the class for its heads' activations: a policy head's
    size = model_estimate(cfg, "smoothed")
    assert size.params == sum(p.numel() for p in model.parameters())
    assert size.activation_bytes == model_estimate(cfg, "dpt").activation_bytes
    # an agent that reads it is one registration; it acts
    env = cfg.environment()
    agent = make_agent(AgentSpec("smoothed"), env, model=model)
    agent.reset(4, env.num_actions)
    actions = agent.act(0, torch.zeros(4, env.state_dim))
    assert actions.shape == (4,) and int(actions.max()) < env.num_actions
    assert AgentSpec("smoothed").rule() == "smoothed"


def test_a_kind_without_a_loss_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="model kind 'nope' has no training loss: one of "
                                         "spice, dpt"):
        loss_for("nope")
