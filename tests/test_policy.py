"""The deployable policy acts exactly as the evaluation does, from a checkpoint alone."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest
import torch

import spice_ray
from spice_ray.agents import AgentSpec, make_agent
from spice_ray.config import make_config
from spice_ray.data.tasks import generate_tasks
from spice_ray.evaluate import agent_draws, online_noise, run_online
from spice_ray.model import checkpoint as ckpt
from spice_ray.model.checkpoint import save_checkpoint
from spice_ray.model.registry import build_model, load_model


def _checkpoint(tmp_path, cfg, kind: str = "spice"):
    model = build_model(kind, cfg, generator=torch.Generator().manual_seed(3))
    return save_checkpoint(tmp_path / kind, model, cfg, "hash", epoch=0)


@pytest.mark.parametrize("env_name, rule", [("bandit", "thompson"), ("bandit", "ucb"),
                                            ("darkroom", "ucb")])
def test_policy_reproduces_the_evaluation_actions(tmp_path, env_name, rule) -> None:
    cfg = make_config("smoke", env_name)
    path = _checkpoint(tmp_path, cfg)
    env = cfg.environment()
    ids = np.arange(5)
    data = generate_tasks(cfg.env, cfg.data, "eval", ids)
    tasks = env.eval_tasks(data)
    H = cfg.eval.online_horizon
    noise = online_noise(cfg.eval.seed, ids, H)
    # the evaluation
    fusion = dataclasses.replace(cfg.fusion, rule=rule)
    agent = make_agent(AgentSpec("spice", fusion=fusion), env, tasks,
                       load_model(path), cfg.eval)
    want = run_online(agent, env, tasks, H, noise, 1, agent_draws(cfg.eval.seed, ids)).actions
    # the deployable policy, stepping the same tasks with the same noise
    policy = spice_ray.SpicePolicy.from_checkpoint(path, rule=rule)
    policy.reset(num_envs=5, draws=agent_draws(cfg.eval.seed, ids))
    states = env.reset(tasks)
    got = np.empty((5, H), dtype=np.int64)
    for t in range(H):
        got[:, t] = policy.act(states)
        nxt, rewards = env.step(tasks, states, got[:, t], noise[:, t])
        policy.observe(states, got[:, t], rewards, nxt)
        states = nxt
    np.testing.assert_array_equal(got, want)
    mean, var = policy.posterior(states)
    assert mean.shape == var.shape == (5, env.num_actions) and (var > 0).all()


def test_single_environment_api_and_options(tmp_path) -> None:
    cfg = make_config("smoke", "bandit")
    path = _checkpoint(tmp_path, cfg)
    greedy = spice_ray.SpicePolicy.from_checkpoint(path, rule="greedy")
    greedy.reset()
    a = greedy.act([0.0])
    assert isinstance(a, int) and 0 <= a < 5
    greedy.observe([0.0], a, 0.9, [0.0])
    mean, var = greedy.posterior()
    assert mean.shape == (5,) and int(np.argmax(mean)) == greedy.act([0.0])  # greedy on it
    scheduled = spice_ray.SpicePolicy.from_checkpoint(path, beta_schedule="sqrt2logt")
    assert scheduled.fusion.beta_schedule == "sqrt2logt"
    with pytest.raises(ValueError, match="fusion.rule"):
        spice_ray.SpicePolicy.from_checkpoint(path, rule="boldly")
    dpt = spice_ray.DptPolicy.from_checkpoint(_checkpoint(tmp_path, cfg, "dpt"))
    dpt.reset()
    assert 0 <= dpt.act([0.0]) < 5
    with pytest.raises(Exception, match="holds a 'dpt' model"):
        spice_ray.SpicePolicy.from_checkpoint(tmp_path / "dpt")


def test_policy_runs_past_its_context_limit_with_a_sliding_window(tmp_path) -> None:
    """Past the trained horizon the prior conditions on the last ``context_limit`` transitions
    (cached decoding is left, not broken): the same actions as an uncached agent, no error."""
    cfg = make_config("smoke", "bandit")
    path = _checkpoint(tmp_path, cfg)
    cached = spice_ray.SpicePolicy.from_checkpoint(path, rule="greedy")
    limit = cached.context_limit
    assert limit == load_model(path).max_len - 1
    plain = spice_ray.SpicePolicy.from_checkpoint(path, rule="greedy")
    plain.agent.runner.use_cache = False
    rng = np.random.default_rng(0)
    for policy in (cached, plain):
        policy.reset(num_envs=3)
    for _ in range(2 * limit + 3):
        a = cached.act(None)
        np.testing.assert_array_equal(a, plain.act(None))
        mean_c, _ = cached.posterior()
        mean_p, _ = plain.posterior()
        np.testing.assert_allclose(mean_c, mean_p, rtol=1e-5, atol=1e-6)
        r = rng.normal(0.5, 0.3, size=3)
        for policy in (cached, plain):
            policy.observe(None, a, r, None)
    assert not cached.agent.runner.cached and cached.agent.runner.t == 2 * limit + 3
    cached.reset()  # a new context starts cached again
    assert cached.agent.runner.cached


@pytest.mark.parametrize("call, match", [
    (lambda p: p.act([0.0, 1.0]), r"state has shape \(2,\); the bandit policy takes shape \(1,\)"),
    (lambda p: p.act([float("nan")]), "state holds a NaN"),
    (lambda p: p.act("abc"), "state must be numbers"),
    (lambda p: p.observe([0.0], 0, float("nan"), [0.0]), "reward holds a NaN"),
    (lambda p: p.observe([0.0], 0, float("inf"), [0.0]), "reward holds a NaN or infinite"),
    (lambda p: p.observe([0.0], 7, 1.0, [0.0]), r"action must be an int in \[0, 5\), not \[7\]"),
    (lambda p: p.observe([0.0], -1, 1.0, [0.0]), r"action must be an int in \[0, 5\)"),
    (lambda p: p.observe([0.0], 1.5, 1.0, [0.0]), r"action must be an int"),
    (lambda p: p.observe([0.0], 1, 1.0, [[0.0, 2.0]]), "next_state has shape"),
])
def test_policy_refuses_bad_input_and_keeps_its_context(tmp_path, call, match) -> None:
    cfg = make_config("smoke", "bandit")
    policy = spice_ray.SpicePolicy.from_checkpoint(_checkpoint(tmp_path, cfg))
    with pytest.raises(RuntimeError, match=r"act\(\) before reset\(\)"):
        policy.act([0.0])
    policy.reset()
    policy.observe([0.0], 1, 0.8, [0.0])
    before = policy.posterior()
    with pytest.raises(ValueError, match=match):
        call(policy)
    after = policy.posterior()  # nothing was added: the posterior is unchanged and finite
    for x, y in zip(before, after, strict=True):
        np.testing.assert_array_equal(x, y)
        assert np.isfinite(y).all()
    assert policy.agent.runner.t == 1


def test_batched_policy_names_the_batch_shape(tmp_path) -> None:
    cfg = make_config("smoke", "darkroom")
    policy = spice_ray.SpicePolicy.from_checkpoint(_checkpoint(tmp_path, cfg))
    policy.reset(num_envs=4)
    with pytest.raises(ValueError, match=r"shape \(3, 2\); the darkroom policy takes shape "
                                         r"\(4, 2\)"):
        policy.act(np.zeros((3, 2)))
    with pytest.raises(ValueError, match=r"action must be 4 ints"):
        policy.observe(np.zeros((4, 2)), [0, 1], np.zeros(4), np.zeros((4, 2)))
    with pytest.raises(ValueError, match="num_envs must be a positive int"):
        policy.reset(num_envs=0)
    assert policy.num_envs == 4 and not policy._single  # a refused reset changes nothing


@pytest.mark.parametrize("kind", ["spice", "dpt"])
def test_save_pretrained_round_trip_acts_the_same(tmp_path, kind) -> None:
    """A self-contained folder (the one checkpoint format: safetensors weights, meta.json,
    checksums, and a model card) gives a policy that takes the same actions; options override;
    a flipped byte is refused; .to() keeps acting; the training checkpoint it came from loads
    through the same call."""
    cfg = make_config("smoke", "bandit")
    path = _checkpoint(tmp_path, cfg, kind)
    cls = spice_ray.SpicePolicy if kind == "spice" else spice_ray.DptPolicy
    options = {"rule": "greedy", "beta": 2.0} if kind == "spice" else {}
    policy = cls.from_checkpoint(path, **options)
    folder = policy.save_pretrained(tmp_path / "pretrained")
    assert sorted(p.name for p in folder.iterdir()) == [
        "README.md", "README.md.sha256", "meta.json", "meta.json.sha256",
        "model.safetensors", "model.safetensors.sha256"]
    meta = ckpt.read_meta(folder)  # the training checkpoint's origin, kept
    assert (meta["dataset_hash"], meta["epoch"]) == ("hash", 0)  # as the checkpoint's
    assert meta["files"] == ["model.safetensors", "README.md"]
    card = (folder / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: spice-ray\n") and "- 96 training tasks" in card
    assert "no table row describes it" in card  # a checkpoint's policy, not a run's tuned one
    assert f'{cls.__name__}.from_pretrained("<this folder>")' in card
    assert policy.save_pretrained(tmp_path / "again").joinpath("README.md").read_text() == card
    loaded = cls.from_pretrained(folder)
    moved = policy.to("cpu")
    rng = np.random.default_rng(0)
    for p in (policy, loaded, moved):
        p.reset(num_envs=4, draws=3)
    for _ in range(10):
        a = policy.act(None)
        np.testing.assert_array_equal(loaded.act(None), a)
        np.testing.assert_array_equal(moved.act(None), a)
        r = rng.normal(0.5, 0.3, 4)
        for p in (policy, loaded, moved):
            p.observe(None, a, r, None)
    if kind == "spice":
        assert loaded.fusion == policy.fusion and loaded.fusion.beta == 2.0
        assert cls.from_pretrained(folder, rule="ucb").fusion.rule == "ucb"
        with pytest.raises(ValueError, match="holds a 'spice' model, not 'dpt'"):
            spice_ray.DptPolicy.from_pretrained(folder)
    straight = cls.from_pretrained(path, **options)  # a run's checkpoint: the same loader
    straight.reset(num_envs=4, draws=3)
    policy.reset(num_envs=4, draws=3)
    np.testing.assert_array_equal(straight.act(None), policy.act(None))
    weights = folder / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 1
    weights.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="model.safetensors fails its SHA-256 checksum"):
        cls.from_pretrained(folder)


def test_from_pretrained_resolves_a_hub_id_through_the_local_cache(tmp_path) -> None:
    """``from_pretrained("owner/name")`` finds a folder uploaded to the Hugging Face Hub in
    ``huggingface_hub``'s cache (here pre-populated, no network): the same policy, checked as
    a local folder is; an id in no cache, or neither an id nor a folder, is named."""
    import shutil

    pytest.importorskip("huggingface_hub")
    cfg = make_config("smoke", "bandit")
    policy = spice_ray.SpicePolicy.from_checkpoint(_checkpoint(tmp_path, cfg))
    folder = policy.save_pretrained(tmp_path / "pretrained")
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--someone--spice-bandit"
    shutil.copytree(folder, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    loaded = spice_ray.SpicePolicy.from_pretrained("someone/spice-bandit",
                                                   cache_dir=tmp_path / "hub",
                                                   local_files_only=True)
    for p in (policy, loaded):
        p.reset(num_envs=3, draws=1)
    np.testing.assert_array_equal(loaded.act(None), policy.act(None))
    assert loaded.fusion == policy.fusion
    with pytest.raises(ValueError, match="someone/other: not in the Hub cache"):
        spice_ray.SpicePolicy.from_pretrained("someone/other", cache_dir=tmp_path / "hub",
                                              local_files_only=True)
    with pytest.raises(FileNotFoundError, match="no such directory, and not a Hugging Face"):
        spice_ray.SpicePolicy.from_pretrained(tmp_path / "missing" / "deeper" / "folder")


def test_from_run_refuses_a_final_another_epoch_count_republished(tmp_path) -> None:
    """Under a constant rate a training's epochs are not in its identity, so a variant that
    trains the same model to fewer epochs republishes the shared ``final``: a reader of the
    experiment listed after 2 epochs is refused by name, not handed the 1-epoch model."""
    import shutil

    from spice_ray.study.records import write_checkpoint_index

    cfg = make_config("smoke", "darkroom")
    run = tmp_path / "run"
    model = build_model("spice", cfg, torch.Generator().manual_seed(0))
    final = run / "checkpoints" / "ds" / "spice-aaaaaaaa-seed0" / "final"
    save_checkpoint(final, model, cfg, "hash", 1, extra={"identity": "aaaaaaaa1111", "seed": 0})
    write_checkpoint_index(run, {("darkroom", "spice", "", 0): final})
    assert spice_ray.SpicePolicy.from_run(run, "darkroom", tuned=False).env.name == "darkroom"
    shutil.rmtree(final)  # the variant's training of 1 epoch publishes the same directory
    save_checkpoint(final, model, cfg, "hash", 0, extra={"identity": "aaaaaaaa1111", "seed": 0})
    with pytest.raises(ValueError, match=r"holds spice seed 0 after epoch 0, but "
                                         r"checkpoints/index.json lists darkroom spice seed 0 "
                                         r"after epoch 1: a training of the same model"):
        spice_ray.SpicePolicy.from_run(run, "darkroom", tuned=False)


def test_from_run_refuses_a_swapped_checkpoint_directory(tmp_path, caplog) -> None:
    """Two weight variants' checkpoint directories swapped: ``from_run`` names the mismatch
    between the index and the checkpoint's own meta.json instead of loading the other model,
    also with an index written before identities were recorded."""
    import json
    import logging
    import re
    import shutil

    from spice_ray.common.artifacts import write_checked_text
    from spice_ray.study.records import CHECKPOINT_INDEX, write_checkpoint_index

    cfg = make_config("smoke", "darkroom")
    run = tmp_path / "run"
    finals = {}
    for variant, identity in (("adv", "aaaaaaaa11111111"), ("epi", "bbbbbbbb22222222")):
        model = build_model("spice", cfg, torch.Generator().manual_seed(0))
        final = run / "checkpoints" / "ds" / f"spice-{identity[:8]}-seed0" / "final"
        save_checkpoint(final, model, cfg, "hash", 1, extra={"identity": identity, "seed": 0})
        finals[("darkroom", "spice", variant, 0)] = final
    write_checkpoint_index(run, finals)
    index = json.loads((run / CHECKPOINT_INDEX).read_text())["checkpoints"]
    assert [e["identity"] for e in index] == ["aaaaaaaa11111111", "bbbbbbbb22222222"]
    policy = spice_ray.SpicePolicy.from_run(run, "darkroom", variant="adv")
    assert policy.env.name == "darkroom"
    a, b = (finals[("darkroom", "spice", v, 0)] for v in ("adv", "epi"))
    shutil.move(a, tmp_path / "tmp")
    shutil.move(b, a)
    shutil.move(tmp_path / "tmp", b)
    with pytest.raises(ValueError, match=r"holds spice seed 0 of training identity "
                                         r"bbbbbbbb22222222, but .* darkroom spice \[adv\] "
                                         r"seed 0 of identity aaaaaaaa11111111: the directory "
                                         r"was moved or swapped"):
        spice_ray.SpicePolicy.from_run(run, "darkroom", variant="adv")
    # an index edited after it was written fails its checksum, by name
    edited = json.loads((run / CHECKPOINT_INDEX).read_text())
    edited["checkpoints"].reverse()
    (run / CHECKPOINT_INDEX).write_text(json.dumps(edited))
    with pytest.raises(ValueError, match=r"index.json fails its SHA-256 sidecar"):
        spice_ray.SpicePolicy.from_run(run, "darkroom", variant="adv")
    # the next run's index is rebuilt from what it trained, saying so and what it drops
    edited["checkpoints"].append(dict(edited["checkpoints"][0], experiment="bandit"))
    (run / CHECKPOINT_INDEX).write_text(json.dumps(edited))
    with caplog.at_level(logging.WARNING, logger="spice_ray.study.records"):
        write_checkpoint_index(run, {k: v for k, v in finals.items() if k[2] == "epi"})
    assert re.search(r"index.json is not vouched for by its checksum \(.*\): rebuilt from "
                     r"this run's 1 "
                     r"checkpoint; not listed until they run again: bandit$", caplog.text,
                     re.MULTILINE)
    rebuilt = json.loads((run / CHECKPOINT_INDEX).read_text())["checkpoints"]
    assert [(e["variant"], e["identity"]) for e in rebuilt] == [("epi", "aaaaaaaa11111111")]
    write_checkpoint_index(run, finals)  # signed again: merged from here on
    (run / (CHECKPOINT_INDEX + ".sha256")).unlink()  # an edit cannot pass by deleting it
    with pytest.raises(ValueError, match=r"index.json has no SHA-256 sidecar: re-running"):
        spice_ray.SpicePolicy.from_run(run, "darkroom", variant="adv")
    for e in index:  # an index from before identities: the directory's name
        del e["identity"]
    write_checked_text(run / CHECKPOINT_INDEX, json.dumps({"checkpoints": index}))
    with pytest.raises(ValueError, match="identity aaaaaaaa: the directory was moved"):
        spice_ray.SpicePolicy.from_run(run, "darkroom", variant="adv")


@pytest.mark.parametrize("edit,match", [
    (lambda m: m["spec"].update(max_len=10**9),
     r"field spec \(max_len\) is not the architecture its run config builds"),
    (lambda m: (m["spec"]["config"].update(n_embd=65536),
                m["config"]["model"].update(n_embd=65536)),
     r"weights need ~.*more than this machine's available memory"),
    (lambda m: m.update(config=[1, 2]), r"field config is not a run config"),
    (lambda m: m["spec"].update(num_actions=-1), r"field spec \(num_actions\)"),
    (lambda m: m.update(options=["x"]), r"field options is not an object"),
    (lambda m: m["options"].update(colour="blue"), r"an option is not one of SpicePolicy's"),
])
def test_from_pretrained_refuses_an_edited_config_by_field(tmp_path, edit, match) -> None:
    """A hand-edited (and re-signed) meta.json is refused with a ValueError naming the field,
    before anything the size of its numbers is allocated."""
    import json

    from spice_ray.common.artifacts import write_sidecar

    folder = spice_ray.SpicePolicy.from_checkpoint(
        _checkpoint(tmp_path, make_config("smoke", "bandit"), "spice")
    ).save_pretrained(tmp_path / "pretrained")
    path = folder / "meta.json"
    meta = json.loads(path.read_text())
    edit(meta)
    path.write_text(json.dumps(meta))
    write_sidecar(path)
    with pytest.raises(ValueError, match=match):
        spice_ray.SpicePolicy.from_pretrained(folder)


def test_from_pretrained_refuses_non_finite_and_misshapen_weights(tmp_path) -> None:
    from safetensors.torch import load_file, save_file

    from spice_ray.common.artifacts import write_sidecar

    folder = spice_ray.SpicePolicy.from_checkpoint(
        _checkpoint(tmp_path, make_config("smoke", "bandit"), "spice")
    ).save_pretrained(tmp_path / "pretrained")
    path = folder / "model.safetensors"
    state = load_file(str(path))
    name = next(k for k, v in state.items() if v.is_floating_point())
    for bad, match in ((float("nan"), f"non-finite values in {name}"),
                       (None, "does not hold this model's weights")):
        edited = dict(state)
        if bad is None:
            edited[name] = torch.zeros(3, 3)
        else:
            edited[name] = state[name].clone().fill_(bad)
        save_file(edited, str(path))
        write_sidecar(path)
        with pytest.raises(ValueError, match=match):
            spice_ray.SpicePolicy.from_pretrained(folder)


def test_from_run_is_the_validation_tuned_policy_by_default(tmp_path) -> None:
    """``from_run`` gives the policy behind the tuned table: the beta, tau and fitted width
    chosen on validation (``tuning.json``), said in its repr; ``tuned=False`` or explicit
    options give the checkpoint's own settings; an edited record is not used."""
    import json

    from spice_ray.common.artifacts import write_checked_text
    from spice_ray.results.choices import resolution
    from spice_ray.study.records import write_checkpoint_index

    cfg = make_config("smoke", "darkroom")
    run = tmp_path / "run"
    final = run / "checkpoints" / "ds" / "spice-aaaaaaaa-seed0" / "final"
    save_checkpoint(final, build_model("spice", cfg, torch.Generator().manual_seed(0)), cfg,
                    "hash", 1, extra={"identity": "aaaaaaaa11111111", "seed": 0})
    write_checkpoint_index(run, {("darkroom", "spice", "", 0): final})
    chosen = {"beta": 2.0, "tau": 0.3, "width": "fitted"}
    grid = [{"setting": chosen, "mean": 1.0, "paired_se": 0.0}]
    record = {"darkroom": {"noise_var": {"fitted": 4.0, "config": 0.09}, "methods": {"SPICE": {
        "grid": grid, "chosen": chosen, "resolution": resolution(grid),
        "width": {"scale": 0.25}}}}}
    path = run / "results" / "tuning.json"
    write_checked_text(path, json.dumps(record))
    policy = spice_ray.SpicePolicy.from_run(run, "darkroom")
    f = policy.fusion
    assert (f.beta, f.beta_schedule, f.tau, f.width_scale, f.noise_var) == (
        2.0, "fixed", 0.3, 0.25, 4.0)
    assert repr(policy).endswith("tuned on validation: beta=2.0, tau=0.3, width=fitted)")
    # its model card carries its row of the tuned table: mean +- SEM over tasks, its seed only
    from spice_ray.results import write

    H = cfg.eval.online_horizon
    write(run, "darkroom_tuned", pd.DataFrame({
        "experiment": "darkroom", "env": "darkroom", "method": ["SPICE"] * 4 + ["DPT"],
        "rule": "ucb", "config": "{}", "variant": "", "seed": [0, 0, 0, 1, 0],
        "task_id": [0, 1, 0, 0, 0], "metric": "cumulative_regret",
        "x": [H, H, 1, H, H], "value": [2.0, 4.0, 9.0, 7.0, 5.0]}))
    card = (policy.to("cpu").save_pretrained(tmp_path / "card") / "README.md").read_text()
    assert f"| SPICE | cumulative_regret at step {H} | 3 ± 1 | 2 |" in card, card
    assert "training seed 0" in card and "env:\n  name: darkroom" in card
    # reloaded, it keeps its provenance: the validation choice in its repr and its card
    assert "chosen on the run's validation tasks: beta=2.0, tau=0.3, width=fitted" in card
    again = spice_ray.SpicePolicy.from_pretrained(tmp_path / "card")
    assert repr(again).endswith("tuned on validation: beta=2.0, tau=0.3, width=fitted)")
    plain = spice_ray.SpicePolicy.from_run(run, "darkroom", tuned=False)
    assert plain.tuned is None and plain.fusion == cfg.fusion
    assert spice_ray.SpicePolicy.from_run(run, "darkroom", beta=0.5).fusion.beta == 0.5
    record["darkroom"]["methods"]["SPICE"]["chosen"] = {"beta": 4.0}  # not its grid's best
    write_checked_text(path, json.dumps(record))
    with pytest.warns(UserWarning, match=r"tuning.json says SPICE chose \{'beta': 4.0\}.* for "
                                         r"darkroom: this policy is untuned"):
        assert spice_ray.SpicePolicy.from_run(run, "darkroom").tuned is None


def test_ties_are_broken_at_random_by_default_and_a_dpt_policy_says_what_it_is(tmp_path
                                                                              ) -> None:
    """A policy whose logits are all equal (a zeroed head) ties everywhere: by default the
    ties are broken at random, seeded (the same calls give the same actions), as the study's
    evaluation does; draws=None gives the lowest index, the bias the evaluation avoids."""
    cfg = make_config("smoke", "bandit")
    dpt = spice_ray.DptPolicy.from_checkpoint(_checkpoint(tmp_path, cfg, "dpt"))
    with torch.no_grad():
        dpt.agent.model.policy_head.weight.zero_()
        dpt.agent.model.policy_head.bias.zero_()
    dpt.reset(num_envs=64)
    first = dpt.act(None)
    assert len(set(first.tolist())) == 5  # every arm drawn across 64 tied environments
    dpt.reset(num_envs=64)
    np.testing.assert_array_equal(dpt.act(None), first)
    dpt.reset(num_envs=64, draws=None)
    assert set(dpt.act(None).tolist()) == {0}
    assert repr(dpt) == ("DptPolicy(bandit, A=5, acts greedily on its policy, context_limit="
                         f"{dpt.context_limit}, device=cpu)")
    # SPICE too: every head's output layer zeroed (trained and frozen prior networks), so the
    # fused posterior ties on every arm
    spice = spice_ray.SpicePolicy.from_checkpoint(_checkpoint(tmp_path / "s", cfg))
    ensemble = spice.agent.model.ensemble
    with torch.no_grad():
        for name, t in [*ensemble.named_parameters(), *ensemble.named_buffers()]:
            if name.endswith(f"_{cfg.model.head_depth}"):
                t.zero_()
    spice.reset(num_envs=64)
    mean, _ = spice.posterior(None)
    assert torch.as_tensor(mean).abs().max() == 0  # all arms tie
    first = spice.act(None)
    assert len(set(first.tolist())) == 5
    spice.reset(num_envs=64)
    np.testing.assert_array_equal(spice.act(None), first)
    spice.reset(num_envs=64, draws=None)
    assert set(spice.act(None).tolist()) == {0}


def test_predict_is_act_in_stable_baselines3_form(tmp_path) -> None:
    """predict(obs) returns (action, None), starts the context on its first call (one env
    for one observation, a batch for a 2-d array), acts exactly as act() does, and refuses a
    recurrent state or a `deterministic` that contradicts the policy's rule."""
    cfg = make_config("smoke", "darkroom")
    path = _checkpoint(tmp_path, cfg)
    env = cfg.environment()
    tasks = env.eval_tasks(generate_tasks(cfg.env, cfg.data, "eval", np.arange(3)))
    states = np.asarray(env.reset(tasks))
    ucb, twin = (spice_ray.SpicePolicy.from_checkpoint(path) for _ in range(2))
    twin.reset(num_envs=3)
    for t in range(4):
        got, state = ucb.predict(states)
        assert state is None and ucb.num_envs == 3
        want = twin.act(states)
        np.testing.assert_array_equal(got, want)
        for p in (ucb, twin):
            p.observe(states, want, np.full(3, 0.5 * t), states)
    single = spice_ray.SpicePolicy.from_checkpoint(path)
    action, _ = single.predict(states[0], episode_start=np.array([True]))
    assert isinstance(action, int) and single.num_envs == 1
    with pytest.raises(ValueError, match="state must be None"):
        single.predict(states[0], state=np.zeros(1))
    with pytest.raises(ValueError, match="deterministic=False, but this policy does not "
                                         r"sample: SpicePolicy\(darkroom"):
        single.predict(states[0], deterministic=False)
    thompson = spice_ray.SpicePolicy.from_checkpoint(path, rule="thompson")
    with pytest.raises(ValueError, match="deterministic=True, but this policy samples"):
        thompson.predict(states[0])
    assert 0 <= thompson.predict(states[0], deterministic=False)[0] < env.num_actions
    dpt = spice_ray.DptPolicy.from_checkpoint(_checkpoint(tmp_path, cfg, "dpt"), sample=True)
    assert 0 <= dpt.predict(states[0], deterministic=False)[0] < env.num_actions


def test_an_index_entry_outside_the_run_or_of_the_wrong_shape_is_refused(tmp_path) -> None:
    """A re-signed index whose entry path is absolute or climbs out with ``..`` loaded that
    checkpoint (exit 0); one re-signed as a JSON list, or with an entry missing a key, was a
    TypeError or KeyError. Each is now one error naming the index and the field."""
    import json

    from spice_ray.common.artifacts import write_checked_text
    from spice_ray.study.records import (
        CHECKPOINT_INDEX,
        CheckpointIndexError,
        write_checkpoint_index,
    )

    cfg = make_config("smoke", "darkroom")
    run, outside = tmp_path / "run", tmp_path / "outside" / "final"
    model = build_model("spice", cfg, torch.Generator().manual_seed(0))
    identity = {"identity": "aaaaaaaa11111111", "seed": 0}
    save_checkpoint(outside, model, cfg, "hash", 1, extra=identity)
    final = run / "checkpoints" / "ds" / "spice-aaaaaaaa-seed0" / "final"
    save_checkpoint(final, model, cfg, "hash", 1, extra=identity)
    write_checkpoint_index(run, {("darkroom", "spice", "", 0): final})
    good = json.loads((run / CHECKPOINT_INDEX).read_text())
    assert spice_ray.SpicePolicy.from_run(run, "darkroom", tuned=False).env.name == "darkroom"
    for path in (str(outside), "checkpoints/../../outside/final"):
        bad = json.loads(json.dumps(good))
        bad["checkpoints"][0]["path"] = path
        write_checked_text(run / CHECKPOINT_INDEX, json.dumps(bad))  # re-signed
        with pytest.raises(CheckpointIndexError, match=r"index.json: an entry's path .* is "
                                                       r"outside the run's checkpoints/"):
            spice_ray.SpicePolicy.from_run(run, "darkroom")
    write_checked_text(run / CHECKPOINT_INDEX, json.dumps(good["checkpoints"]))
    with pytest.raises(CheckpointIndexError, match="holds no list under 'checkpoints' \\(it "
                                                   "is a list\\)"):
        spice_ray.SpicePolicy.from_run(run, "darkroom")
    bad = json.loads(json.dumps(good))
    del bad["checkpoints"][0]["kind"]
    write_checked_text(run / CHECKPOINT_INDEX, json.dumps(bad))
    with pytest.raises(CheckpointIndexError, match="an entry's 'kind' is None, not a str"):
        spice_ray.SpicePolicy.from_run(run, "darkroom")
