"""The dry run's measured rates: rollout-time extrapolation and FLOP counts."""

from __future__ import annotations

import math
import subprocess
import sys

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
    # fewer tasks: the probe scaled by their number; more: probed again, on that many
    assert eval_rates.rollout_seconds(cfg, spec, None, 2) == pytest.approx(seconds / 4)
    assert len(calls) == 1
    assert eval_rates.rollout_seconds(cfg, spec, None, 16) == pytest.approx(seconds)
    assert calls == [("random", None, 8), ("random", None, 16)]
    assert eval_rates.rollout_seconds(cfg, spec, None, 8) == pytest.approx(seconds / 2)
    assert eval_rates.actor_tasks(cfg, 17) == -(-17 // cfg.eval.num_actors)


def test_a_real_probe_times_a_learned_agent_on_an_untrained_model() -> None:
    cfg = make_config("smoke", "darkroom")
    threads = torch.get_num_threads()
    seconds = eval_rates.rollout_seconds(cfg, AgentSpec("spice"), "spice", 4)
    assert 0 < seconds < math.inf  # a measured time: positive and finite, whatever the load
    assert torch.get_num_threads() == threads  # the probe's one thread is given back
    # UCB has no darkroom protocol: nothing to time
    assert eval_rates.rollout_seconds(cfg, AgentSpec("ucb"), None, 4) == 0.0


def test_a_probe_is_one_rollout_timed_at_both_lengths_with_eager_heads(monkeypatch) -> None:
    """One rollout to the longer probe length, the clock read as the shorter length's step
    begins; one untimed run before the first probe of a model shape, none before the next;
    the value heads eager (a dry run compiles nothing)."""
    cfg = make_config("smoke", "darkroom", overrides=["model.head_kernel=compiled"])
    runs, kernels = [], []
    real_run, real_build = eval_rates.run_online, eval_rates.build_model

    def run_online(agent, env, tasks, horizon, *args):
        runs.append((horizon, isinstance(agent, eval_rates._Stopwatch)))
        return real_run(agent, env, tasks, horizon, *args)

    def build_model(kind, cfg_, generator):
        kernels.append(cfg_.model.head_kernel)
        return real_build(kind, cfg_, generator)

    monkeypatch.setattr(eval_rates, "_WARMED", set())
    monkeypatch.setattr(eval_rates, "run_online", run_online)
    monkeypatch.setattr(eval_rates, "build_model", build_model)
    a, b = eval_rates._probe(cfg, AgentSpec("spice"), "spice", 4)
    longer = min(eval_rates.PROBE_STEPS[1], cfg.eval.online_horizon)  # smoke: the horizon, 20
    assert runs == [(8, False), (longer, True)] and kernels == ["eager"]
    assert a >= 0 <= b and a + b > 0  # a measured time (noise may put it all in a or b)
    eval_rates._probe(cfg, AgentSpec("spice", sample=False), "spice", 4)  # the same shape
    assert runs[2:] == [(longer, True)]
    laps = eval_rates._Stopwatch(AgentSpec("random"), [8])
    assert laps.method == "random" and laps.laps == []  # otherwise the agent it wraps


_SIDE_BY_SIDE = """
import os
from spice_ray.agents import AgentSpec
from spice_ray.config import make_config
from spice_ray.evaluate import rates
cfg = make_config("smoke", "darkroom")
asked = [(AgentSpec("random"), None, 4), (AgentSpec("count"), None, 8),
         (AgentSpec("random"), None, 8)]
with rates.collecting() as wanted:
    assert [rates.rollout_seconds(cfg, s, k, n) for s, k, n in asked] == [0.0] * 3
assert len(wanted) == 3 and rates._MEASURED == {}
rates.probe_all(wanted + wanted[:1], 2)
# each agent once, on the most tasks asked for (random on 8, not also on 4)
assert {k: v[0] for k, v in rates._MEASURED.items()} == {wanted[1][0]: 8, wanted[2][0]: 8}
assert all(a >= 0 and b >= 0 and a + b > 0 for _, a, b in rates._MEASURED.values())
times = [rates.rollout_seconds(cfg, s, k, n) for s, k, n in asked]  # probed: no new probe
assert all(t > 0 for t in times) and len(rates._MEASURED) == 2
assert times[0] == times[2] / 2  # random on 4 tasks: its probe on 8, halved
print("OK", os.getpid())
"""


def test_a_plans_probes_are_collected_then_timed_side_by_side_in_forks(tmp_path) -> None:
    """The dry run's two passes: the first collects the probes (each 0 s), ``probe_all`` times
    them in two forks (the probes of a shape in one; an agent once, on its most tasks), the
    second reads them. In a fresh interpreter, as ``--dry-run`` runs (this test process may
    have joined Ray, where the probes run one after another)."""
    proc = subprocess.run([sys.executable, "-c", _SIDE_BY_SIDE], capture_output=True,
                          text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.startswith("OK"), proc.stderr[-3000:]
    assert "one by one" not in proc.stderr  # the forks ran (no fall-back)


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


_COUNT = """
import sys
from spice_ray.config import make_config
from spice_ray.train import rates
cfg = make_config("smoke", "darkroom")
if sys.argv[1] == "guarded":  # torch's own wrapper: it imports the compiler stack
    rates._without_compiler_guard = lambda: None
flops = rates.counted_flops(cfg, "spice", 2)
print(repr(flops), "torch._dynamo" in sys.modules)
"""


def test_a_flop_count_is_torchs_without_importing_its_compiler() -> None:
    """The dry run's FLOP counts equal ``FlopCounterMode``'s as torch wraps it, without the
    import of ``torch._dynamo`` that wrapper makes (seconds of every dry run). In fresh
    interpreters: this process may have imported it already."""
    counts = {}
    for how in ("guarded", "unguarded"):
        proc = subprocess.run([sys.executable, "-c", _COUNT, how], capture_output=True,
                              text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        counts[how] = proc.stdout.split()
    assert counts["guarded"][0] == counts["unguarded"][0] and float(counts["guarded"][0]) > 0
    assert counts == {"guarded": [counts["guarded"][0], "True"],
                      "unguarded": [counts["guarded"][0], "False"]}
