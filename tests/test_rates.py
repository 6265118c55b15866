"""The dry run's measured rates: rollout-time extrapolation and FLOP counts."""

from __future__ import annotations

import math

import pytest
import torch

from spice_ray.agents import AgentSpec
from spice_ray.config import make_config
from spice_ray.evaluate import rates as eval_rates
from spice_ray.train import rates as train_rates


def test_two_probes_give_the_linear_and_quadratic_step_costs_exactly() -> None:
    a, b = 2e-3, 5e-5  # seconds per step, and per step and token of context
    lengths = [8, 24]
    seconds = [a * h + b * h * h for h in lengths]
    assert eval_rates.fit_steps(lengths, seconds) == pytest.approx((a, b), rel=1e-9)
    # a probe that got cheaper per step with more context (noise) is not extrapolated down
    assert eval_rates.fit_steps(lengths, [0.08, 0.12]) == pytest.approx((0.005, 0.0))
    assert eval_rates.fit_steps([5], [0.02]) == (pytest.approx(0.004), 0.0)


def test_rollout_seconds_extrapolate_the_probes_to_the_horizon(monkeypatch) -> None:
    cfg = make_config("smoke", "darkroom", overrides=["eval.online_horizon=30",
                                                      "eval.episodes=2"])
    calls = []

    def probe(cfg_, spec, kind, num_tasks):
        calls.append((spec.method, kind, num_tasks))
        return 0.01, 0.001

    monkeypatch.setattr(eval_rates, "_MEASURED", {})
    monkeypatch.setattr(eval_rates, "_probe", probe)
    spec = AgentSpec("random")
    seconds = eval_rates.rollout_seconds(cfg, spec, None, 8)
    assert seconds == pytest.approx(0.01 * 60 + 0.001 * 60 * 60)  # 2 episodes of 30 steps
    assert eval_rates.rollout_seconds(cfg, spec, None, 8) == seconds and len(calls) == 1
    eval_rates.rollout_seconds(cfg, spec, None, 16)  # another task count is probed again
    assert calls == [("random", None, 8), ("random", None, 16)]
    assert eval_rates.actor_tasks(cfg, 17) == -(-17 // cfg.eval.num_actors)


def test_a_real_probe_times_a_learned_agent_on_an_untrained_model() -> None:
    cfg = make_config("smoke", "darkroom")
    threads = torch.get_num_threads()
    seconds = eval_rates.rollout_seconds(cfg, AgentSpec("spice"), "spice", 4)
    assert 0 < seconds < math.inf  # a measured time: positive and finite, whatever the load
    assert torch.get_num_threads() == threads  # the probe's one thread is given back
    # UCB has no darkroom protocol: nothing to time
    assert eval_rates.rollout_seconds(cfg, AgentSpec("ucb"), None, 4) == 0.0


@pytest.mark.parametrize("kind", ["spice", "dpt"])
def test_step_flops_are_one_task_counted_times_the_batch(kind) -> None:
    """The dry run counts one task's forward + backward and multiplies: the same count as the
    whole batch counted at once (every FLOP of a step is per task), plus causal attention's
    12 D L (L + 1) / 2 per layer and task."""
    cfg = make_config("smoke", "bandit")
    L = cfg.env.horizon + 1
    attention = cfg.model.n_layer * 3 * 12 * cfg.model.n_embd * L * (L + 1) / 2
    assert train_rates.attention_flops(cfg, 3) == attention
    whole = train_rates.counted_flops(cfg, kind, 3) + attention  # the batch counted at once
    assert train_rates.step_flops(cfg, kind, 3) == pytest.approx(whole, rel=1e-12)
