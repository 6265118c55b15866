"""Pretraining: losses fall on the smoke dataset; checkpoints reload exactly; runs resume."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch

from spice_ray.common.artifacts import file_sha256, sidecar_path, write_sidecar
from spice_ray.common.faults import FAULT_ENV, fault_switch
from spice_ray.config import make_config
from spice_ray.data.generate import generate_dataset
from spice_ray.data.store import iter_batches
from spice_ray.model import DptModel, SpiceModel
from spice_ray.model import checkpoint as ckpt
from spice_ray.model.registry import build_model, load_model, model_payload, torch_threads
from spice_ray.train.loop import make_optimizer
from spice_ray.train.ray_train import (
    plan_job,
    pretrain,
    probe_outputs,
    train_local,
    train_with_ray,
)
from spice_ray.train.stream import shuffled_batches


@pytest.fixture(scope="module")
def smoke_bandit(ray_local, tmp_path_factory):
    cfg = make_config("smoke", "bandit", overrides=["train.num_workers=0"])
    root = tmp_path_factory.mktemp("train")
    rep = generate_dataset(cfg, root / "ds")
    return cfg.replace(out_dir=str(root)), rep.dataset_dir


def test_local_training_reduces_td_and_policy_loss(smoke_bandit, tmp_path) -> None:
    cfg, ds = smoke_bandit
    cfg = make_config("smoke", "bandit", overrides=[
        "train.num_workers=0", "train.epochs=10", "train.lr=3e-3", f"out_dir={tmp_path}"])
    job, run_dir = plan_job(cfg, "spice", 0, ds)
    res = train_local(job, run_dir)
    hist = res.worker_return["history"]
    assert len(hist) == 10
    # The TD loss falls, and below the best constant predictor (the variance of all rewards,
    # 0.172 here): Q uses the context. Its floor is sigma^2 = 0.09 plus what a short prefix
    # cannot tell about the arm means.
    rewards = np.concatenate([b["rewards"] for b in iter_batches(ds, "train", 32)])
    assert hist[-1]["train_td"] < 0.9 * hist[0]["train_td"]
    assert hist[-1]["train_td"] < rewards.var()
    assert hist[-1]["train_policy"] < hist[0]["train_policy"]
    # the reloaded checkpoint reproduces the in-memory model exactly
    model = load_model(res.final, kind="spice")
    np.testing.assert_allclose(probe_outputs(model, job), res.worker_return["probe"],
                               rtol=0, atol=1e-6)
    meta = ckpt.read_meta(res.final)
    assert meta["epoch"] == 9 and meta["dataset_hash"] == job.dataset_hash
    # same seed, same weights: a second identical run gives identical outputs
    again = train_local(job, tmp_path / "again")
    np.testing.assert_array_equal(again.worker_return["probe"], res.worker_return["probe"])


def test_local_run_killed_after_first_checkpoint_resumes(smoke_bandit, tmp_path, monkeypatch
                                                        ) -> None:
    _, ds = smoke_bandit
    cfg = make_config("smoke", "bandit", overrides=[
        "train.num_workers=0", "train.epochs=3", "train.checkpoint_every=1",
        f"out_dir={tmp_path}"])
    monkeypatch.setenv(FAULT_ENV, fault_switch(train_epoch=1))
    with pytest.raises(RuntimeError, match="injected training fault"):
        pretrain(cfg, "dpt", 0, ds)
    job, run_dir = plan_job(cfg, "dpt", 0, ds)
    assert [p.name for p in (run_dir / "local").glob("epoch-*")] == ["epoch-0000"]
    final = pretrain(cfg, "dpt", 0, ds)  # the re-run resumes from epoch 0's checkpoint
    assert ckpt.read_meta(final)["epoch"] == 2
    assert isinstance(load_model(final, kind="dpt"), DptModel)
    assert pretrain(cfg, "dpt", 0, ds) == final  # a finished run is skipped


@pytest.mark.parametrize("preset,env,kind,identity", [
    ("smoke", "bandit", "spice", "6d3fb188641f8f2a"),
    ("small", "bandit_template", "spice", "9480425adf615577"),
    ("small", "darkroom", "spice", "e4cf5eb5afbae24d"),
    ("smoke", "bandit", "dpt", "eafa1aee469fb4a4"),
    ("small", "bandit_template", "dpt", "503926fc4fd44bb7"),
    ("small", "darkroom", "dpt", "67737a09faaf972f")])
def test_training_identities_stay_what_they_were(preset, env, kind, identity) -> None:
    """A model's training identity names its checkpoint directory: a field added to a config
    section at a default that trains as before must leave it alone (list the field in
    ``LATER_DEFAULTS``), or every trained model is retrained and a ladder's rung no longer
    resumes from the one below (``train.value_target`` did that once). A deliberate change of a
    preset's training updates these pins."""
    from spice_ray.train.loop import TrainJob

    cfg = make_config(preset, env)
    assert TrainJob(cfg.to_dict(), kind, "d", "h", 0).identity() == identity


@pytest.mark.parametrize("env,override", [("darkroom", "train.shrink_form=average"),
                                          ("darkroom", "train.lambda_shrink=0"),
                                          ("darkroom", "train.h0_prior=state"),
                                          ("darkroom", "train.tail=bootstrap"),
                                          ("bandit_template", "train.value_target=mean")])
def test_a_value_loss_variant_shares_dpt_and_retrains_spice(env, override) -> None:
    """DPT's loss reads no value-loss field: a variant that changes only one keeps DPT's
    identity (its experiment's DPT models are reused) and changes SPICE's."""
    from spice_ray.train.loop import TrainJob

    base, variant = (make_config("small", env, overrides=o).to_dict() for o in ([], [override]))
    ids = {kind: {TrainJob(c, kind, "d", "h", 0).identity() for c in (base, variant)}
           for kind in ("spice", "dpt")}
    assert len(ids["dpt"]) == 1 and len(ids["spice"]) == 2
    changed = make_config("small", env, overrides=["train.lr=0.002"]).to_dict()
    assert TrainJob(changed, "dpt", "d", "h", 0).identity() not in ids["dpt"]


def test_the_query_position_choice_is_a_new_model_of_every_kind() -> None:
    """``train.query_position=false`` (the DPT code's loss) trains other weights for DPT and
    SPICE alike, while its default leaves every identity as it was (the pins above)."""
    from spice_ray.train.loop import TrainJob

    base, dpt_code = (make_config("small", "darkroom", overrides=o).to_dict()
                      for o in ([], ["train.query_position=false"]))
    for kind in ("spice", "dpt"):
        assert TrainJob(base, kind, "d", "h", 0).identity() \
            != TrainJob(dpt_code, kind, "d", "h", 0).identity()


def test_a_longer_training_resumes_from_a_shorter_one_and_equals_a_straight_run(
        smoke_bandit, tmp_path) -> None:
    """Under a constant rate the epochs are not in a model's identity: 3 epochs resumed from a
    1-epoch final are bit for bit a straight 3-epoch training (the scaling ladder's rungs), and
    a 1-epoch training never resumes from the longer one's later checkpoints."""
    _, ds = smoke_bandit

    def cfg(epochs: int, out: Path, *extra: str):
        return make_config("smoke", "bandit", overrides=[
            "train.num_workers=0", f"train.epochs={epochs}", "train.checkpoint_every=1",
            f"out_dir={out}", *extra])

    short, short_dir = plan_job(cfg(1, tmp_path / "ladder"), "spice", 0, ds)
    long, long_dir = plan_job(cfg(3, tmp_path / "ladder"), "spice", 0, ds)
    assert short.identity() == long.identity() and short_dir == long_dir
    cosine = [plan_job(cfg(e, tmp_path, "train.cosine_schedule=true"), "spice", 0, ds)[0]
              for e in (1, 3)]
    assert cosine[0].identity() != cosine[1].identity()  # the rate depends on the last epoch

    assert ckpt.read_meta(pretrain(cfg(1, tmp_path / "ladder"), "spice", 0, ds))["epoch"] == 0
    resumed = pretrain(cfg(3, tmp_path / "ladder"), "spice", 0, ds)
    straight = pretrain(cfg(3, tmp_path / "straight"), "spice", 0, ds)
    assert ckpt.read_meta(resumed)["epoch"] == 2
    a, b = load_model(resumed, kind="spice").state_dict(), load_model(straight,
                                                                      kind="spice").state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    # back to 1 epoch in the same directory: the epoch-0 checkpoint, not the later ones
    again = pretrain(cfg(1, tmp_path / "ladder"), "spice", 0, ds)
    assert ckpt.read_meta(again)["epoch"] == 0
    first = load_model(again, kind="spice").state_dict()
    assert not all(torch.equal(first[k], a[k]) for k in a)


def test_optimizer_is_fused_adamw_with_the_loop_update() -> None:
    """Training's AdamW is the fused kernel; its updates equal the per-parameter loop's to
    float32 rounding over several steps."""
    tc = make_config("smoke", "bandit").train
    g = torch.Generator().manual_seed(4)
    start = [torch.randn(5, 3, generator=g), torch.randn(7, generator=g)]
    grads = [[torch.randn(p.shape, generator=g) for p in start] for _ in range(3)]
    finals = []
    for fused in (True, False):
        params = [torch.nn.Parameter(p.clone()) for p in start]
        opt = (make_optimizer(params, tc) if fused else
               torch.optim.AdamW(params, lr=tc.lr, weight_decay=tc.weight_decay))
        assert opt.param_groups[0]["fused"] is (True if fused else None)
        for step in grads:
            for p, grad in zip(params, step, strict=True):
                p.grad = grad.clone()
            opt.step()
        finals.append([p.detach() for p in params])
    for a, b in zip(*finals, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_shuffled_batches_split_an_epoch_reproducibly() -> None:
    chunks = [{"task_id": torch.arange(lo, hi)} for lo, hi in ((0, 10), (10, 20), (20, 27))]

    def batches(epoch: int, rank: int = 0, world: int = 1) -> list[list[int]]:
        rng = np.random.default_rng([3, epoch])
        return [b["task_id"].tolist()
                for b in shuffled_batches(chunks, 4, rng, 27, rank, world)]

    single = batches(0)
    assert len(single) == 6 and all(len(b) == 4 for b in single)  # 27 // 4, last rows dropped
    assert len({i for b in single for i in b}) == 24  # no row twice
    assert batches(0) == single and batches(1) != single  # seeded per epoch
    ranks = [batches(0, r, 2) for r in range(2)]
    assert ranks == [single[0::2], single[1::2]]  # the workers split the same stream
    thirds = [batches(0, r, 4) for r in range(4)]
    assert [len(b) for b in thirds] == [1, 1, 1, 1]  # equal step counts: 6 // 4 rounds
    assert [b[0] for b in thirds] == single[:4]


@pytest.mark.ray
def test_ray_train_two_workers_checkpoint_matches_memory(smoke_bandit, tmp_path) -> None:
    """Also runs the compiled value-head kernels inside Ray Train workers (smoke batches are
    below the size where ``auto`` would compile), and TensorBoard tracking from rank 0: every
    step's loss parts and every epoch's validation loss read back from the event file."""
    import importlib.util

    _, ds = smoke_bandit
    board = importlib.util.find_spec("tensorboard") is not None  # a [test] extra
    cfg = make_config("smoke", "bandit", overrides=[
        "train.num_workers=2", "train.worker_cpus=0.5", "model.head_kernel=compiled",
        f"out_dir={tmp_path}", f"track={'tensorboard' if board else 'none'}"])
    leftovers = set(Path(tempfile.gettempdir()).glob("spice_ckpt_*"))
    job, run_dir = plan_job(cfg, "spice", 0, ds)
    res = train_with_ray(job, run_dir)
    model = load_model(res.final, expect_env=cfg.env, kind="spice")
    np.testing.assert_allclose(probe_outputs(model, job), res.worker_return["probe"],
                               rtol=0, atol=1e-6)
    assert res.worker_return["metrics"]["epoch"] == cfg.train.epochs - 1
    # the workers' scratch (staged checkpoints) is gone, and nothing was left in /tmp. (Same
    # seed, same weights on Ray Train: two jobs equal bit for bit in the train.together test,
    # and the stream the workers cut batches from is test_workers_stream_the_split_in_file...)
    assert not (run_dir / "scratch").exists()
    assert set(Path(tempfile.gettempdir()).glob("spice_ckpt_*")) <= leftovers
    if board:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        runs = [p.parent for p in (tmp_path / "tensorboard").rglob("events.out.tfevents.*")]
        assert len(runs) == 1  # rank 0 alone
        acc = EventAccumulator(str(runs[0]))
        acc.Reload()
        tags = set(acc.Tags()["scalars"])
        assert {f"train/{k}" for k in ("loss", "policy", "td", "shrink", "anchor")} <= tags
        steps = cfg.train.epochs * (cfg.data.num_train_tasks // cfg.train.batch_size)
        assert [e.step for e in acc.Scalars("train/loss")] == list(range(1, steps + 1))
        assert len(acc.Scalars("epoch/val_loss")) == cfg.train.epochs


def test_workers_stream_the_split_in_file_order_and_the_driver_verifies_it(tmp_path) -> None:
    """What a Train worker reads (``shard_batches``' chunks): the train split in file order, cut
    into consecutive chunks across shard boundaries, every time (the batches, and so the
    weights, are cut from this stream); a shard that fails its checksum is refused in the
    driver before any job starts, naming the file."""
    from spice_ray.data.store import DatasetError, iter_batches
    from spice_ray.train.ray_train import verify_dataset

    cfg = make_config("smoke", "bandit", overrides=["data.shard_size=16"])
    ds_dir = generate_dataset(cfg, tmp_path / "ds").dataset_dir  # 6 train shards of 16
    for chunk, firsts, sizes in ((16, [0, 16, 32, 48, 64, 80], [16] * 6),
                                 (40, [0, 40, 80], [40, 40, 16])):
        for _ in range(2):
            chunks = list(iter_batches(ds_dir, "train", chunk, verify=False))
            assert [int(c["task_id"][0]) for c in chunks] == firsts
            assert [len(c["task_id"]) for c in chunks] == sizes
    verify_dataset(ds_dir)
    shard = sorted((Path(ds_dir) / "validation").rglob("*.parquet"))[0]
    shard.write_bytes(shard.read_bytes()[:-8])
    with pytest.raises(DatasetError, match=f"{shard.name}.*checksum"):
        verify_dataset(ds_dir)


def test_out_of_order_training_stream_is_refused() -> None:
    from spice_ray.train.stream import in_task_order

    chunks = [{"task_id": torch.arange(0, 4)}, {"task_id": torch.arange(4, 8)}]
    assert len(list(in_task_order(chunks))) == 2
    with pytest.raises(RuntimeError, match="out of task order \\(task 0 after 7\\)"):
        list(in_task_order(chunks + chunks))


def test_checkpoint_refuses_wrong_env_and_corruption(smoke_bandit, tmp_path) -> None:
    cfg, ds = smoke_bandit
    model = build_model("spice", cfg, generator=torch.Generator().manual_seed(0))
    path = ckpt.save_checkpoint(tmp_path / "c", model, cfg, "hash", epoch=0)
    wide = make_config("smoke", "bandit", overrides=["env.num_arms=20"]).env
    with pytest.raises(ckpt.CheckpointError, match="A=5 actions.*has A=20"):
        load_model(path, expect_env=wide, kind="spice")
    with pytest.raises(ckpt.CheckpointError, match="holds a 'spice' model"):
        load_model(path, kind="dpt")
    weights = path / ckpt.WEIGHTS
    weights.write_bytes(weights.read_bytes()[:-10])
    with pytest.raises(ckpt.CheckpointError, match="model.safetensors fails its SHA-256"):
        load_model(path, kind="spice")
    with pytest.raises(ckpt.CheckpointError, match="is not a checkpoint"):
        load_model(tmp_path / "nothing", kind="spice")
    # the same one loading path for an in-memory payload (what evaluation actors receive)
    payload = model_payload(model)
    assert isinstance(load_model(payload, expect_env=cfg.env, kind="spice"), SpiceModel)
    with pytest.raises(ckpt.CheckpointError, match="payload is of kind 'spice', not 'dpt'"):
        load_model(payload, kind="dpt")
    with pytest.raises(ckpt.CheckpointError, match="model has 5 actions"):
        load_model(payload, expect_env=wide)


def _as_legacy(path: Path) -> None:
    """Rewrite a checkpoint as one written before 2026-11-26: its weights in weights.pt."""
    import json

    from safetensors.torch import load_file

    state = load_file(str(path / ckpt.WEIGHTS))
    (path / ckpt.WEIGHTS).unlink()
    sidecar_path(path / ckpt.WEIGHTS).unlink()
    torch.save(state, path / ckpt.LEGACY_WEIGHTS)
    write_sidecar(path / ckpt.LEGACY_WEIGHTS)
    meta = json.loads((path / ckpt.META).read_text())
    meta["files"] = [ckpt.LEGACY_WEIGHTS]
    ckpt.write_meta(path, meta)


def test_checkpoint_loading_runs_no_code(smoke_bandit, tmp_path) -> None:
    """Weights are safetensors, which hold tensors and nothing else: a pickle put in their
    place (and re-signed by a forger) is not read; a checkpoint from before the format, whose
    weights.pt still loads (the same weights, its content id from that file), is read with
    weights_only, which refuses a pickled object there too."""
    cfg, _ = smoke_bandit
    model = build_model("dpt", cfg)
    path = ckpt.save_checkpoint(tmp_path / "c", model, cfg, "hash", epoch=0)
    assert json.loads((path / ckpt.META).read_text())["files"] == [ckpt.WEIGHTS]
    evil = tmp_path / "evil.pt"
    torch.save({"evil": ckpt.CheckpointError("x")}, evil)
    (path / ckpt.WEIGHTS).write_bytes(evil.read_bytes())
    write_sidecar(path / ckpt.WEIGHTS)  # a forger re-signs the weights as well
    with pytest.raises(ckpt.CheckpointError, match="model.safetensors is not safetensors"):
        load_model(path, kind="dpt")
    legacy = ckpt.save_checkpoint(tmp_path / "legacy", model, cfg, "hash", epoch=0)
    _as_legacy(legacy)
    loaded = load_model(legacy, kind="dpt")
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(),
                                                 model.state_dict().values(), strict=True))
    assert ckpt.content_id(legacy).endswith(file_sha256(legacy / ckpt.LEGACY_WEIGHTS))
    (legacy / ckpt.LEGACY_WEIGHTS).write_bytes(evil.read_bytes())
    write_sidecar(legacy / ckpt.LEGACY_WEIGHTS)
    # one line naming the file, not torch's advice to retry with weights_only=False
    with pytest.raises(ckpt.CheckpointError, match=r"weights.pt holds pickled objects other "
                                                   r"than tensors .*: refused") as refused:
        load_model(legacy, kind="dpt")
    assert "\n" not in str(refused.value) and "weights_only" not in str(refused.value)


def test_gpu_request_falls_back_to_cpu_without_gpus() -> None:
    from spice_ray.common.placement import LABELS_ENV
    from spice_ray.runtime.resources import gpus_available

    assert not gpus_available(False, {"GPU": 4.0})
    assert gpus_available(True, {"CPU": 8.0, "GPU": 1.0}, environ={})
    assert not gpus_available(True, {"CPU": 2.0}, environ={})  # laptop: train on CPU
    assert gpus_available(True, {"CPU": 8.0}, environ={LABELS_ENV: "datagen,trainer"})


def _weights(final: Path) -> bytes:
    return b"".join(t.numpy().tobytes() for t in ckpt.load_training_state(final)[1].values())


@pytest.mark.ray
def test_models_trained_together_equal_each_trained_alone(smoke_bandit, tmp_path, monkeypatch
                                                         ) -> None:
    """Two models of one dataset in one Ray Train job (``train.together``) on two one-thread
    workers side by side, every worker's first attempt killed in epoch 1: both resume from
    their own checkpoints, and each model's weights equal, bit for bit, the same model trained
    alone by the loop every Train worker runs (``train_local``, in this process, one thread),
    killed in epoch 1 as well: it resumes from its checkpoint, not from scratch. (A one-worker
    Ray Train job of its own would add a second job start and retry to show the same loop;
    the data-parallel job and its scratch are test_ray_train_two_workers_....)"""
    from spice_ray.study.records import busy_seconds
    from spice_ray.train.together import FIT_TIMING, ModelSpec, pretrain_many

    _, ds = smoke_bandit
    sets = ["train.epochs=3", "train.checkpoint_every=1", "train.max_failures=2",
            f"out_dir={tmp_path}"]
    cfg = make_config("smoke", "bandit", overrides=[*sets, "train.num_workers=2"])
    monkeypatch.setenv(FAULT_ENV, fault_switch(train_epoch=1))
    specs = [ModelSpec(cfg, "spice", 0, "spice seed 0"), ModelSpec(cfg, "dpt", 1, "dpt seed 1")]
    finals, timing = pretrain_many(specs, ds, label="together")
    monkeypatch.delenv(FAULT_ENV)
    assert timing["jobs"] == 1 and set(timing["models"]) == {"spice seed 0", "dpt seed 1"}
    assert timing["worker"] == {"spice seed 0": 0, "dpt seed 1": 1}  # side by side
    busy = busy_seconds((timing["worker"][name], sec) for name, sec in timing["models"].items())
    assert busy == max(timing["models"].values()) and timing["seconds"] > busy > 0
    for final in finals:
        assert ckpt.read_meta(final)["epoch"] == 2
        assert json.loads((final.parent / FIT_TIMING).read_text())["threads"] == 1
    assert isinstance(load_model(finals[1], kind="dpt"), DptModel)
    alone = make_config("smoke", "bandit", overrides=[
        *sets, "train.together=false", "train.num_workers=0", "train.threads=1",
        f"out_dir={tmp_path / 'alone'}"])
    job, run_dir = plan_job(alone, "spice", 0, ds)
    assert run_dir.name == finals[0].parent.name  # one identity: the switch is not in it
    # the first attempt dies in epoch 1, after checkpoint 0
    monkeypatch.setenv(FAULT_ENV, fault_switch(train_epoch=1))
    with torch_threads(1):
        with pytest.raises(RuntimeError, match="injected training fault"):
            train_local(job, run_dir)
        monkeypatch.delenv(FAULT_ENV)
        res = train_local(job, run_dir)
    assert res.worker_return["metrics"]["start_epoch"] == 1.0  # resumed, not restarted
    assert ckpt.read_meta(res.final)["epoch"] == 2
    assert _weights(res.final) == _weights(finals[0])
    # a second call finds every model current and starts no job
    assert pretrain_many(specs, ds)[1]["jobs"] == 0


def test_side_by_side_workers_wall_is_the_busiest_workers() -> None:
    """A together job's workers train models i mod n side by side: its wall (the dry run's
    estimate, and the timing record's start-up = wall - busiest worker) is the busiest
    worker's sum; data-parallel workers take the models one after another."""
    from spice_ray.study.dryrun import side_by_side_seconds
    from spice_ray.study.records import busy_seconds, timing_notes

    two = make_config("small", "darkroom").train
    assert two.num_workers == 2 and two.together
    assert side_by_side_seconds([1.0, 2.0, 3.0], two) == 4.0  # worker 0: 1 + 3, worker 1: 2
    one = make_config("small", "bandit").train
    assert one.num_workers == 1 and side_by_side_seconds([1.0, 2.0, 3.0], one) == 6.0
    ddp = make_config("small", "darkroom", overrides=["train.together=false"]).train
    assert side_by_side_seconds([1.0, 2.0, 3.0], ddp) == 6.0
    assert busy_seconds([(0, 1.0), (1, 2.0), (0, 3.0)]) == 4.0
    units = [{"stage": "pretrain", "experiment": "d", "what": w, "part": "fit",
              "worker": k, "seconds": sec} for w, k, sec in (("a", 0, 10.0), ("b", 1, 20.0),
                                                              ("c", 0, 30.0))]
    units.append({"stage": "pretrain", "experiment": "d", "what": "start-up and data",
                  "part": "start-up", "seconds": 5.0})
    assert timing_notes(["d"], {"datasets": 1.2, "pretrain": 45.0, "total": 50.0}, units) == [
        "Stage wall times (of the last invocation that trained or evaluated): datasets 1 s, "
        "pretrain 45 s",
        "Time per experiment (`logs/timing.json` has every unit): d: "
        "pretraining 45 s (5 s start-up and data, 3 models 10-30 s each, 2 workers side by "
        "side), evaluation 0 s"]


def test_a_rerun_that_does_no_work_keeps_the_timings_of_the_run_that_did(tmp_path) -> None:
    """logs/timing.json and the report's timing notes keep the invocation that trained or
    evaluated; a re-run that found everything current neither overwrites nor reports zeros."""
    import json

    from spice_ray.study.records import did_work, timing_of_work, write_timing

    worked = [{"stage": "pretrain", "experiment": "d", "what": "a", "part": "fit",
               "seconds": 12.0}, {"stage": "evaluate", "experiment": "d", "what": "online",
                                  "seconds": 3.0}]
    idle = [{"stage": "pretrain", "experiment": "d", "what": "1 model", "part": "jobs",
             "seconds": 0.04}]
    assert did_work(worked) and not did_work(idle)
    assert timing_of_work(tmp_path, {"pretrain": 0.1}, idle) == ({"pretrain": 0.1}, idle)
    path = write_timing(tmp_path, {"pretrain": 12.5, "evaluate": 3.1}, worked)
    before = path.read_text()
    assert write_timing(tmp_path, {"pretrain": 0.1, "evaluate": 0.0}, idle) == path
    assert path.read_text() == before
    stages, units = timing_of_work(tmp_path, {"pretrain": 0.1}, idle)
    assert stages == {"pretrain": 12.5, "evaluate": 3.1} and units == json.loads(before)["units"]
    assert timing_of_work(tmp_path, {"pretrain": 9.0}, worked[:1])[0] == {"pretrain": 9.0}


def test_darkroom_iw_variant_trains_exactly_as_none(ray_local, tmp_path) -> None:
    """Why the study trains darkroom's "iw" ablation model once, as "none": under the uniform
    behaviour policy the importance weight is exactly 1, so the weights are equal bit for bit."""
    from spice_ray.study.experiments import DARKROOM

    cfg = make_config("smoke", "darkroom", overrides=[f"out_dir={tmp_path}", "train.epochs=1"])
    ds = generate_dataset(cfg, tmp_path / "ds").dataset_dir
    refs = {m.variant: m for m in DARKROOM.models}
    assert refs["iw"].same_as == "none" and not refs["adv"].same_as
    finals = []
    for variant in ("none", "iw"):
        job, run_dir = plan_job(refs[variant].config(cfg), "spice", 0, ds)
        assert job.cfg.train.use_iw == (variant == "iw")
        finals.append(train_local(job, run_dir).final)
    assert finals[0] != finals[1] and _weights(finals[0]) == _weights(finals[1])


_CTRL_C_IN_TRAINING = """
import os, signal, sys
import ray
from spice_ray.runtime.cli import run_main
from spice_ray.config import make_config
from spice_ray.train.ray_train import plan_job, train_with_ray

class CtrlC:  # the progress bar: Ctrl-C as soon as the first training step is shown
    sent = False
    def update(self, **kwargs):
        if not self.sent:
            self.sent = True
            os.kill(os.getpid(), signal.SIGINT)

cfg = make_config("smoke", "bandit", overrides=[f"out_dir={sys.argv[2]}", "train.epochs=50",
                                                   "train.num_workers=1"])
ray.init(address=sys.argv[3], logging_level="ERROR", log_to_driver=False)
job, run_dir = plan_job(cfg, "spice", 0, sys.argv[1])
run_main(train_with_ray, job, run_dir, CtrlC())
"""


@pytest.mark.ray
def test_ctrl_c_during_ray_train_stops_the_run_with_status_130(ray_local, smoke_bandit,
                                                                tmp_path) -> None:
    """Ray Train V2 installs its own SIGINT handler inside fit (abort, sys.exit(0)): a Ctrl-C
    while pretraining ended a study as "failed" with status 1 and no message. The trainer's
    hook is skipped, so the run stops as any other stage does. The driver joins the session's
    Ray (a Ray of its own would add only Ray's start-up; its job's actors end with it)."""
    _, ds = smoke_bandit
    address = ray_local.get_runtime_context().gcs_address
    proc = subprocess.run([sys.executable, "-c", _CTRL_C_IN_TRAINING, str(ds), str(tmp_path),
                           address],
                          capture_output=True, text=True, timeout=300, env=dict(
                              os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1])))
    assert proc.returncode == 130, proc.stderr[-3000:]
    assert any(line.startswith("stopped by SIGINT (Ctrl-C): every finished")
               for line in proc.stderr.splitlines()), proc.stderr[-3000:]


def test_a_checkpoint_of_the_format_before_sidecars_still_loads(smoke_bandit, tmp_path) -> None:
    """Checkpoints of earlier runs listed their checksums in meta.json; they load, checked."""
    import json

    from spice_ray.common.artifacts import file_sha256, sidecar_path

    cfg, _ = smoke_bandit
    model = build_model("dpt", cfg)
    path = ckpt.save_checkpoint(tmp_path / "c", model, cfg, "hash", epoch=0)
    now = ckpt.content_id(path)
    assert now.endswith(file_sha256(path / ckpt.WEIGHTS))
    meta = json.loads((path / ckpt.META).read_text())
    meta["files"] = {ckpt.WEIGHTS: file_sha256(path / ckpt.WEIGHTS)}
    ckpt.write_meta(path, meta)
    sidecar_path(path / ckpt.WEIGHTS).unlink()
    assert ckpt.content_id(path) == now  # the same identity, so cached tables stay current
    loaded = load_model(path, kind="dpt")
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(),
                                                 model.state_dict().values(), strict=True))
    weights = path / ckpt.WEIGHTS
    weights.write_bytes(weights.read_bytes()[:-10])
    with pytest.raises(ckpt.CheckpointError, match="model.safetensors fails its SHA-256"):
        load_model(path, kind="dpt")


def test_training_table_gives_steps_and_the_validation_gap_per_model(tmp_path) -> None:
    """The report's pretraining section: steps per model from the checkpoint's own epoch and
    config, and validation minus training loss as mean +- sd over seeds."""
    from spice_ray.study.records import training_table

    cfg = make_config("smoke", "bandit")  # 96 tasks / batch 16: 6 steps an epoch
    finals = {}
    for seed, (train, val) in enumerate(((1.0, 1.5), (2.0, 2.1))):
        model = build_model("spice", cfg, torch.Generator().manual_seed(seed))
        finals[("bandit", "spice", "", seed)] = ckpt.save_checkpoint(
            tmp_path / f"s{seed}", model, cfg, "data", epoch=1,
            metrics={"train_loss": train, "val_loss": val})
    table = training_table(finals)
    assert table.to_dict("records") == [{
        "experiment": "bandit", "model": "spice", "seeds": 2, "steps per model": 12,
        "training tasks": 96, "train loss": "1.5 +- 0.71", "validation loss": "1.8 +- 0.42",
        "validation - train": "+0.3 +- 0.28"}]
