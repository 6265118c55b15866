"""Nothing silently wrong: checksummed tables, NaN guards, a safe query language, fail-fast
resources, one writer per run directory, named errors for corrupt metadata, validation gaps,
guarded sweep restores. Unit tests (no Ray) unless marked."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import full_run_cli

from spice_ray.common import artifacts, runlock
from spice_ray.config import ConfigError, make_config, resolve_run_dir
from spice_ray.results import ResultsError, load, write
from spice_ray.results.__main__ import main as results_main
from spice_ray.results.query import QueryError, filter_rows
from spice_ray.runtime.resources import (
    capacity_from_launcher,
    capacity_from_nodes,
    check_requests,
    check_sizes,
    stage_requests,
    sweep_request,
)

ROOT = Path(__file__).resolve().parents[1]
FULL_RUN = str(ROOT / "pipelines" / "full_run.py")


def full_run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """``pipelines/full_run.py argv`` in this process (``conftest.full_run_cli``): its exit
    status and stderr."""
    code, _, err = full_run_cli(argv, capsys)
    return code, err


def _table(run_dir: Path) -> pd.DataFrame:
    df = pd.DataFrame({"env": "bandit", "method": ["A", "A", "B", "B"], "controller": "c",
                       "config": "{}", "seed": 0, "task_id": [0, 1, 0, 1],
                       "metric": "cumulative_regret", "x": 5, "value": [1.0, 2.0, 3.0, 4.0]})
    write(run_dir, "bandit_online", df, inputs="abc")
    return df


def _flip_bit(path: Path, at: int | None = None) -> None:
    data = bytearray(path.read_bytes())
    i = len(data) // 2 if at is None else at
    data[i] ^= 0x01
    path.write_bytes(bytes(data))


def test_one_freshness_rule_for_files_and_the_records_inside_them() -> None:
    """``artifacts.is_current`` judges a file by its sidecar and a record already read from a
    verified file (a tuning choice, a checkpoint's meta, a sweep's inputs) by the same field
    comparison; the tuning, loss-weight, checkpoint and sweep checks all call it."""
    assert artifacts.is_current({"inputs": "abc"}, "abc") == (True, "")
    assert artifacts.is_current({"inputs": "abc"}, "xyz") == (False, "computed from other "
                                                                       "inputs")
    assert artifacts.is_current({}, "abc")[0] is False
    assert artifacts.is_current(None, "abc") == (False, artifacts.MISSING)
    assert artifacts.is_current({"identity": "id1", "inputs": "x"}, "id1",
                                field="identity") == (True, "")
    root = Path(__file__).resolve().parents[1] / "spice_ray"
    for module in ("study/tuning.py", "study/loss_weights.py", "train/ray_train.py",
                   "sweep/driver.py"):
        text = (root / module).read_text()
        assert "is_current(" in text, module
        assert '.get("inputs") ==' not in text and '.get("inputs") !=' not in text, module
        assert '.get("identity") !=' not in text, module


# ---- 2. result tables carry checksums ---------------------------------------------------


def test_corrupt_or_truncated_table_is_refused_by_name(tmp_path, capsys) -> None:
    _table(tmp_path)
    path = tmp_path / "results" / "bandit_online.parquet"
    assert artifacts.is_current(path, "abc") == (True, "")
    assert artifacts.is_current(path, "other")[0] is False
    assert len(load(tmp_path, "bandit_online")) == 4
    _flip_bit(path)
    with pytest.raises(ResultsError, match=r"bandit_online.parquet fails its checksum "
                                           r"\(SHA-256 mismatch"):
        load(tmp_path, "bandit_online")
    assert artifacts.is_current(path, "abc") == (False, "SHA-256 mismatch (corrupted)")
    assert results_main([str(tmp_path), "bandit_online"]) == 2
    assert "fails its checksum" in capsys.readouterr().err
    _table(tmp_path)
    path.write_bytes(path.read_bytes()[:-20])  # truncated
    with pytest.raises(ResultsError, match="truncated"):
        load(tmp_path, "bandit_online")
    _table(tmp_path)
    artifacts.sidecar_path(path).write_text("{not json")  # garbage sidecar
    with pytest.raises(ResultsError, match="unreadable checksum sidecar"):
        load(tmp_path, "bandit_online")


def test_tables_refuse_non_finite_values(tmp_path) -> None:
    df = _table(tmp_path)
    for bad in (np.nan, np.inf):
        with pytest.raises(ResultsError, match="1 of 4 values are NaN or infinite"):
            write(tmp_path, "bandit_online", df.assign(value=[1.0, bad, 3.0, 4.0]))
    assert len(load(tmp_path, "bandit_online")) == 4  # the good table is untouched


def test_study_recomputes_a_corrupt_table_and_names_every_stale_one(tmp_path, caplog) -> None:
    from spice_ray.study.stages import _tables_done

    df = _table(tmp_path)
    write(tmp_path, "bandit_offline", df, inputs="abc")
    tables = ["bandit_online", "bandit_offline"]
    assert _tables_done(tmp_path, "bandit", tables, "abc")
    _flip_bit(tmp_path / "results" / "bandit_online.parquet")
    with caplog.at_level(logging.WARNING):
        assert not _tables_done(tmp_path, "bandit", tables, "abc")
    assert ("bandit: recomputing 1 table: bandit_online (SHA-256 mismatch (corrupted))"
            in caplog.text)
    caplog.clear()
    write(tmp_path, "bandit_online", df, inputs="abc")
    with caplog.at_level(logging.WARNING):  # a config change: every table is named, once
        assert not _tables_done(tmp_path, "bandit", tables, "new")
    assert ("bandit: recomputing 2 tables: bandit_online (computed from other inputs); "
            "bandit_offline (computed from other inputs)") in caplog.text
    assert caplog.text.count("recomputing") == 1


# ---- 3. non-finite values never pass ----------------------------------------------------


@pytest.mark.parametrize("item, shown", [
    ("train.lr=.inf", "train.lr=inf"), ("train.lr=.nan", "train.lr=nan"),
    ("train.lr=1e400", "train.lr=inf"), ("fusion.tau=.nan", "fusion.tau=nan"),
    ("eval.robustness_sigmas=[0.0, .inf]", "eval.robustness_sigmas[1]=inf"),
    ("env.sigma=-.inf", "env.sigma=-inf")])
def test_config_refuses_non_finite_floats(item, shown) -> None:
    with pytest.raises(ConfigError, match=re.escape(f"{shown} is invalid: a finite number")):
        make_config("smoke", "bandit", overrides=[item])


def test_config_dataclasses_refuse_non_finite_floats_built_in_code() -> None:
    import dataclasses

    cfg = make_config("smoke", "bandit")
    with pytest.raises(ConfigError, match="train.adv_clip=inf is invalid: a finite number"):
        dataclasses.replace(cfg.train, adv_clip=float("inf"))


@pytest.mark.ray
def test_diverging_training_stops_naming_epoch_and_step(ray_local, tmp_path) -> None:
    from spice_ray.data.generate import generate_dataset
    from spice_ray.train.loop import TrainingDiverged
    from spice_ray.train.ray_train import plan_job, pretrain

    cfg = make_config("smoke", "bandit", overrides=["train.lr=1e4", f"out_dir={tmp_path}"])
    ds = generate_dataset(cfg, tmp_path / "ds").dataset_dir
    with pytest.raises(TrainingDiverged, match=r"spice seed 0 epoch \d+/2 (step \d+|, after "
                                               r"its last step).*(not finite|gradient norm)"):
        pretrain(cfg, "spice", 0, ds)
    _, run_dir = plan_job(cfg, "spice", 0, ds)
    assert not (run_dir / "final").exists()  # nothing marked finished


def test_non_finite_step_check() -> None:
    from spice_ray.train.loop import TrainingDiverged, check_step_finite

    check_step_finite(torch.tensor(1.0), torch.tensor(2.0), "x")
    with pytest.raises(TrainingDiverged, match="at e1 step 3: loss nan .td 0.5.*norm 2"):
        check_step_finite(torch.tensor(float("nan")), torch.tensor(2.0), "e1 step 3",
                          {"td": torch.tensor(0.5)})
    with pytest.raises(TrainingDiverged, match="gradient norm inf"):
        check_step_finite(torch.tensor(1.0), torch.tensor(float("inf")), "x")


def test_checkpoint_with_non_finite_weights_is_refused(tmp_path) -> None:
    from spice_ray.model import checkpoint as ckpt
    from spice_ray.model.registry import build_model, load_model

    cfg = make_config("smoke", "bandit")
    model = build_model("dpt", cfg, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        next(model.parameters())[0] = float("nan")
    path = ckpt.save_checkpoint(tmp_path / "c", model, cfg, "h", epoch=0)
    with pytest.raises(ckpt.CheckpointError, match="model.safetensors holds non-finite values"):
        load_model(path)


def test_a_checkpoint_made_weights_only_loads_the_same_and_its_weights_stay_checked(
        tmp_path) -> None:
    from spice_ray.model import checkpoint as ckpt
    from spice_ray.model.registry import build_model

    cfg = make_config("smoke", "bandit")
    model = build_model("dpt", cfg, generator=torch.Generator().manual_seed(0))
    path = ckpt.save_checkpoint(tmp_path / "c", model, cfg, "h", epoch=3,
                                optimizer_state={"optimizer": {"state": {}}},
                                extra={"identity": "job"})
    (path / ckpt.OPTIMIZER).unlink()  # left behind, as a device run's pack leaves it
    with pytest.raises(ckpt.CheckpointError, match=r"optimizer\.pt is missing"):
        ckpt.load_training_state(path)
    ckpt.drop_optimizer(path)
    meta, weights, opt = ckpt.load_training_state(path)
    assert opt is None and meta["files"] == [ckpt.WEIGHTS]
    assert (meta["epoch"], meta["identity"]) == (3, "job")
    assert all(torch.equal(weights[k], v) for k, v in model.state_dict().items())
    assert sorted(p.name for p in path.iterdir()) == [
        "meta.json", "meta.json.sha256", "model.safetensors", "model.safetensors.sha256"]
    (path / ckpt.WEIGHTS).write_bytes(b"edited")
    with pytest.raises(ckpt.CheckpointError, match="model.safetensors fails its SHA-256"):
        ckpt.drop_optimizer(path)


def test_known_failures_exit_1_with_one_line(capsys) -> None:
    from spice_ray.runtime.cli import run_main
    from spice_ray.train.loop import TrainingDiverged

    def boom() -> None:
        raise TrainingDiverged("training diverged at spice seed 0 epoch 1/2 step 3: loss nan")

    with pytest.raises(SystemExit) as exc:
        run_main(boom)
    assert exc.value.code == 1
    assert capsys.readouterr().err == ("error: training diverged at spice seed 0 epoch 1/2 "
                                       "step 3: loss nan\n")


# ---- 4. the query language runs no code -------------------------------------------------


def _rows() -> pd.DataFrame:
    return pd.DataFrame({"method": ["SPICE", "UCB", "SPICE"], "metric": "cumulative_regret",
                         "x": [1, 500, 500], "value": [0.5, 10.7, 8.1],
                         "fusion.tau": [0.5, 1.0, 0.5]}).astype({"method": "string"})


@pytest.mark.parametrize("expr, n", [
    ("metric == 'cumulative_regret' and x == 500", 2),  # the README's example
    ("method == 'B'", 0), ("x in [1, 500] and not method == 'UCB'", 2),
    ("`fusion.tau` == 0.5 & (value * 2 > 3)", 1), ("10 <= x < 600", 2),
    ("method != 'SPICE' or value < 1", 2), ("-value < -9", 1), ("x ** 2 >= 250000", 2)])
def test_filter_grammar(expr, n) -> None:
    assert len(filter_rows(_rows(), expr)) == n


@pytest.mark.parametrize("expr, why", [
    ("@sys.modules['os'].system('touch PWNED') == 0", "cannot parse"),
    ("__import__('os').system('touch PWNED') == 0", "Call"),
    ("x.__class__.__bases__ == 1", "Attribute"), ("method == 'a' and os", "unknown column 'os'"),
    ("x[0] == 1", "Subscript"), ("(lambda: 1)() == 1", "Call"), ("value", "condition"),
    ("'a' * 10**9 == method", "numbers"), ("10**10**10 == x", "exponents"),
    ("[c for c in x] == 1", "ListComp")])
def test_filter_refuses_everything_else(expr, why, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(QueryError, match=why):
        filter_rows(_rows(), expr)
    assert not (tmp_path / "PWNED").exists()


def test_results_cli_where_cannot_run_code(tmp_path, capsys) -> None:
    _table(tmp_path)
    marker = tmp_path / "PWNED"
    expr = f"@sys.modules['os'].system('touch {marker}') == 0"
    assert results_main([str(tmp_path), "bandit_online", "--where", expr]) == 2
    assert not marker.exists()
    assert "--where" in capsys.readouterr().err


def test_results_cli_messages_are_short_and_say_what_is_there(tmp_path, capsys) -> None:
    _table(tmp_path)
    assert results_main([str(tmp_path), "bandit_online", "--where", "x == " + "1" * 100_000]
                        ) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and len(err) < 400 and "(100005 characters)" in err
    assert results_main([str(tmp_path), "nosuch"]) == 2
    err = capsys.readouterr().err
    assert f"no table 'nosuch' in {tmp_path}" in err and "its tables: bandit_online" in err


# ---- 5. impossible resource requests fail at once ---------------------------------------


LAPTOP = capacity_from_nodes([{"CPU": 2.0, "memory": 1e10}], "the cluster")


def test_train_workers_beyond_the_cluster_are_refused() -> None:
    cfg = make_config("smoke", "bandit", overrides=["train.num_workers=64"])
    msgs = check_requests(stage_requests(cfg, ("pretrain",)), LAPTOP)
    assert msgs == ["train.num_workers=64 x train.worker_cpus=0.5: 64 Train workers ask for "
                    "32 CPU at once, but the cluster has 2 CPU; at most 4 fit"]
    ok = make_config("smoke", "bandit", overrides=["train.num_workers=2"])
    assert check_requests(stage_requests(ok, ("pretrain",)), LAPTOP) == []


def test_gpu_actors_on_a_cpu_machine_are_refused() -> None:
    cfg = make_config("smoke", "bandit", overrides=["eval.actor_gpus=4"])
    msgs = check_requests(stage_requests(cfg), LAPTOP)
    assert msgs == ["eval.actor_cpus=0.5, eval.actor_gpus=4: one evaluation actor asks for "
                    "0.5 CPU, 4 GPU, but no node of the cluster offers that (the most any "
                    "node has: 2 CPU)"]
    # a generation task larger than any node would wait forever: refused as well (more tasks
    # than fit at once only run fewer at a time)
    cfg = make_config("smoke", "bandit", overrides=["data.task_cpus=4"])
    assert "one generation task asks for 4 CPU" in check_requests(
        stage_requests(cfg, ("datasets",)), LAPTOP)[0]
    many = make_config("smoke", "bandit", overrides=["data.concurrent_tasks=8"])
    assert check_requests(stage_requests(many, ("datasets",)), LAPTOP) == []


def test_train_workers_can_share_one_gpu(monkeypatch) -> None:
    """train.worker_gpus < 1: eight together workers on a one-GPU, 16-CPU machine fit, and
    each is given that share of the GPU's memory; whole-GPU workers do not fit there, and
    data-parallel workers may not share a GPU."""
    from spice_ray.config.sections import TrainConfig
    from spice_ray.runtime.resources import check_models, model_estimate
    from spice_ray.train.ray_train import worker_resources

    one_gpu = capacity_from_nodes([{"CPU": 16.0, "GPU": 1.0, "memory": 1e11}], "the machine")
    shared = make_config("small", "darkroom", overrides=[
        "train.use_gpu=true", "train.num_workers=8", "train.worker_cpus=1",
        "train.worker_gpus=0.125"])
    assert check_requests(stage_requests(shared, ("pretrain",)), one_gpu) == []
    monkeypatch.setenv("SPICE_RAY_CLUSTER_LABELS", "trainer")  # as cluster.yaml declares
    assert worker_resources(shared.train, use_gpu=True) == {"CPU": 1.0, "GPU": 0.125,
                                                            "trainer": 0.001}
    assert worker_resources(shared.train, use_gpu=False) == {"CPU": 1.0, "trainer": 0.001}
    whole = make_config("small", "darkroom", overrides=[
        "train.use_gpu=true", "train.num_workers=8", "train.worker_cpus=1"])
    [msg] = check_requests(stage_requests(whole, ("pretrain",)), one_gpu)
    assert msg == ("train.num_workers=8 x train.worker_cpus=1, train.worker_gpus=1 "
                   "(train.use_gpu): 8 Train workers ask for 8 GPU at once, but the machine has "
                   "1 GPU; at most 1 fit")
    need = model_estimate(shared, "spice").worker_bytes
    assert check_models([whole], gpu_memory=4 * need) == []
    [line] = check_models([shared], gpu_memory=4 * need)
    assert "train.worker_gpus=0.125 gives a worker" in line
    with pytest.raises(ConfigError, match=r"train.worker_gpus.*a float in \(0, 1\]"):
        TrainConfig(worker_gpus=0.0)
    with pytest.raises(ConfigError, match="data-parallel workers cannot share a GPU"):
        TrainConfig(worker_gpus=0.5, together=False, num_workers=2)
    TrainConfig(worker_gpus=0.5, together=False, num_workers=1)  # one worker: nothing shared


def test_renamed_config_keys_still_load_with_one_warning(tmp_path) -> None:
    """data.num_actors / data.actor_cpus were named for actors that are Ray Data tasks: the old
    names still load (configs and checkpoints written before), warn once, and may not be given
    beside the new ones."""
    import warnings

    from spice_ray.config import build

    build._WARNED.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        old = make_config("smoke", "bandit", overrides=["data.num_actors=3", "data.actor_cpus=1"])
        make_config("smoke", "bandit", overrides=["data.num_actors=3"])
    assert (old.data.concurrent_tasks, old.data.task_cpus) == (3, 1.0)
    assert [str(w.message) for w in caught] == [
        "config key data.num_actors is renamed data.concurrent_tasks; the old name still works "
        "for now", "config key data.actor_cpus is renamed data.task_cpus; the old name still "
        "works for now"]
    saved = old.to_dict()
    saved["data"]["num_actors"] = saved["data"].pop("concurrent_tasks")  # an old config.yaml
    assert build.from_dict(saved) == old
    with pytest.raises(ConfigError, match="data.num_actors and data.concurrent_tasks are both "
                                          "given"):
        make_config("smoke", "bandit", overrides=["data.num_actors=3",
                                                  "data.concurrent_tasks=2"])


def test_autoscaling_cluster_counts_its_node_types() -> None:
    launcher = {"head_node_type": "head", "available_node_types": {
        "head": {"resources": {"CPU": 0, "head": 1}},
        "gpu": {"max_workers": 8, "resources": {"CPU": 8, "GPU": 1, "trainer": 1}},
        "cpu": {"max_workers": 4, "resources": {"CPU": 16}}}}
    cap = capacity_from_launcher(launcher)
    assert cap.total["GPU"] == 8 and cap.total["CPU"] == 128
    paper = make_config("paper", "bandit")
    assert check_requests(stage_requests(paper, use_gpu=True), cap) == []
    big = make_config("paper", "bandit", overrides=["train.num_workers=9"])
    assert "9 Train workers ask for 9 GPU at once" in check_requests(
        stage_requests(big, ("pretrain",), use_gpu=True), cap)[0]
    # types whose CPU/GPU counts are left to auto-detection are not refused on those
    vague = capacity_from_launcher({"available_node_types": {"t": {"max_workers": 2,
                                                                   "resources": {"trainer": 1}}}})
    assert {"CPU", "GPU"} <= vague.unknown
    assert check_requests(stage_requests(big, use_gpu=True), vague) == []


def test_sweep_trial_placement_group_must_fit() -> None:
    from spice_ray.sweep import trial_bundles

    cfg = make_config("smoke", "bandit", overrides=["sweep.actors_per_trial=4"])
    msgs = check_requests([sweep_request(cfg, trial_bundles(cfg))], LAPTOP)
    assert msgs and "5 trial bundles ask for 2 CPU at once" in msgs[0]
    assert check_requests([sweep_request(make_config("smoke", "bandit"),
                                         trial_bundles(make_config("smoke", "bandit")))],
                          LAPTOP) == []


@pytest.mark.ray
def test_cli_refuses_impossible_requests_before_any_work(ray_local, tmp_path, capsys) -> None:
    out = tmp_path / "run"
    code, err = full_run(["--preset", "smoke", "--out", str(out), "--experiments", "bandit",
                          "--set", "eval.actor_gpus=4", "--set", "train.num_workers=64"], capsys)
    assert code == 2
    assert "error: eval.actor_cpus=0.5, eval.actor_gpus=4: one evaluation actor" in err
    assert "error: train.num_workers=64 x train.worker_cpus=0.5: 64 Train workers" in err
    assert not (out / "datasets").exists()
    assert ray_local.is_initialized()  # a Ray it did not start is left running
    runlock.acquire(out).release()  # and the run directory's lock was released


# ---- 6. one writer per run directory ----------------------------------------------------


def test_second_writer_is_refused_and_a_stale_lock_taken_over(tmp_path, caplog) -> None:
    lock = runlock.acquire(tmp_path, command="full_run.py --out x")
    with pytest.raises(runlock.RunDirectoryLocked,
                       match=rf"in use by pid {os.getpid()} on host .* \(full_run.py --out x\)"):
        runlock.acquire(tmp_path)
    lock.release()
    runlock.acquire(tmp_path).release()  # free again after release
    # a lock file left by a dead process (no flock held) is taken over with a warning
    (tmp_path / runlock.LOCK_NAME).write_text(json.dumps(
        {"pid": 999999, "host": "gone", "started": 0, "command": "old run"}))
    with caplog.at_level(logging.WARNING):
        runlock.acquire(tmp_path).release()
    assert "left by pid 999999 on host gone" in caplog.text and "no longer running" in caplog.text


def test_full_run_exits_2_naming_the_lock_holder(tmp_path, capsys) -> None:
    out = tmp_path / "run"
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import sys, time
            from spice_ray.common import runlock
            lock = runlock.acquire({str(out)!r}, command="the first run")
            print("locked", flush=True)
            time.sleep(120)
        """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        code, err = full_run(["--preset", "smoke", "--out", str(out)], capsys)
        assert code == 2
        assert f"is in use by pid {holder.pid}" in err and "(the first run)" in err
    finally:
        holder.kill()
        holder.wait()
    assert not (out / "datasets").exists()


# ---- 7. corrupt metadata: named errors or regeneration ----------------------------------


@pytest.mark.ray
def test_garbage_manifest_or_spec_is_rebuilt(ray_local, tmp_path, caplog) -> None:
    from spice_ray.data import store
    from spice_ray.data.generate import generate_dataset

    cfg = make_config("smoke", "darkroom")
    ds = store.dataset_dir(tmp_path, cfg)
    generate_dataset(cfg, ds)
    want = store.load_manifest(ds).raw
    (ds / store.MANIFEST).write_text("garbage {")
    with pytest.raises(store.DatasetError, match=r"manifest.json is corrupted .*re-run "
                                                 "generation"):
        store.load_manifest(ds)
    (ds / store.MANIFEST).write_text('{"spec": {}}')  # valid JSON, wrong shape
    with pytest.raises(store.DatasetError, match="malformed fields"):
        store.load_manifest(ds)
    (ds / store.SPEC).write_bytes(b"\xff\xfe")
    with caplog.at_level(logging.WARNING):
        rep = generate_dataset(cfg, ds)  # shards verified, manifest and spec rewritten
    assert sum(len(v) for v in rep.generated.values()) == 0
    assert store.load_manifest(ds).raw == want
    assert "spec.json is corrupted" in caplog.text
    # a deleted shard is named, then rebuilt byte for byte
    gone = store.shard_path(ds, "train", 0)
    data = gone.read_bytes()
    gone.unlink()
    with caplog.at_level(logging.WARNING):
        rep = generate_dataset(cfg, ds)
    assert rep.generated["train"] == [0] and gone.read_bytes() == data
    assert f"1 of its shards missing ({gone.relative_to(ds)}); regenerating them" in caplog.text
    # a directory whose name does not carry the spec's hash is not silently claimed
    other = tmp_path / "mine"
    other.mkdir()
    (other / store.SPEC).write_text("[1, 2]")
    with pytest.raises(store.DatasetError, match=r"mine/spec.json is corrupted.*delete"):
        generate_dataset(cfg, other)


@pytest.mark.parametrize("entry", ["/etc/hostname", "../outside/shard-00000.parquet",
                                   "linked/shard-00000.parquet"])
def test_a_manifest_naming_a_shard_outside_its_dataset_is_refused(tmp_path, entry) -> None:
    """A manifest's shard paths stay inside the dataset directory: an absolute path, one with
    ``..`` or one through a link that leads out is refused by name (with its checksums made to
    match, it was read), as a malformed manifest is: regeneration rebuilds it from the shards."""
    from spice_ray.data import store

    ds, outside = tmp_path / "ds", tmp_path / "outside"
    ds.mkdir()
    outside.mkdir()
    (ds / "linked").symlink_to(outside)
    shard = {"file": entry, "bytes": 1, "sha256": "0" * 64}
    split = {"shards": [shard], "num_rows": 1, "bytes": 1, "content_hash": "c"}
    (ds / store.MANIFEST).write_text(json.dumps({"spec": {}, "splits": {"train": split}}))
    with pytest.raises(store.DatasetError, match=r"a shard's file .* is outside the dataset "
                                                 r"directory .*: refused.*re-run generation"):
        store.load_manifest(ds)
    shard["file"] = "train/shard-00000.parquet"  # inside: read as before
    (ds / store.MANIFEST).write_text(json.dumps({"spec": {}, "splits": {"train": split}}))
    with pytest.raises(store.DatasetError, match="schema version"):
        store.load_manifest(ds)


@pytest.mark.parametrize("content, why", [
    (None, "is a directory"), (b"\xff\xfeA: 1", "is not UTF-8 text")])
def test_bad_config_file_is_named(tmp_path, content, why, capsys) -> None:
    path = tmp_path / "cfg.yaml"
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    with pytest.raises(ConfigError, match=f"config file {path} {why}"):
        make_config("smoke", "bandit", yaml_path=path)
    code, err = full_run(["--preset", "smoke", "--out", str(tmp_path / "o"), "--config",
                          str(path)], capsys)
    assert code == 2 and why in err


@pytest.mark.ray
def test_corrupt_final_weights_are_republished_from_an_intact_checkpoint(ray_local, tmp_path,
                                                                        caplog) -> None:
    from spice_ray.data.generate import generate_dataset
    from spice_ray.model import checkpoint as ckpt
    from spice_ray.train.ray_train import pretrain

    cfg = make_config("smoke", "bandit", overrides=[f"out_dir={tmp_path}"])
    ds = generate_dataset(cfg, tmp_path / "ds").dataset_dir
    final = pretrain(cfg, "dpt", 0, ds)
    good = (final / ckpt.WEIGHTS).read_bytes()
    _flip_bit(final / ckpt.WEIGHTS, at=len(good) - 100)
    with caplog.at_level(logging.WARNING):
        again = pretrain(cfg, "dpt", 0, ds)
    assert again == final and (final / ckpt.WEIGHTS).read_bytes() == good
    assert "model.safetensors fails its SHA-256 checksum" in caplog.text
    assert "republished from the intact checkpoint" in caplog.text
    # with no intact copy left, the model is trained again instead of being used
    for path in (final.parent / "local").glob("epoch-*"):
        _flip_bit(path / ckpt.WEIGHTS, at=len(good) - 100)
    _flip_bit(final / ckpt.WEIGHTS, at=len(good) - 100)
    third = pretrain(cfg, "dpt", 0, ds)
    assert (third / ckpt.WEIGHTS).read_bytes() == good  # same seed, same weights


# ---- 8. validation gaps -----------------------------------------------------------------


def test_duplicate_seeds_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"seeds=\(0, 1, 0\) is invalid: each seed once"):
        make_config("smoke", "bandit", overrides=["seeds=[0, 1, 0]"])


def test_run_directory_is_given_once(tmp_path) -> None:
    assert resolve_run_dir(None, "smoke") == Path("runs/smoke").resolve()
    assert resolve_run_dir(None, "smoke", overrides=[f"out_dir={tmp_path}"]) == tmp_path
    assert resolve_run_dir(tmp_path, "smoke", overrides=[f"out_dir={tmp_path}"]) == tmp_path
    with pytest.raises(ConfigError, match="conflicts with --out"):
        resolve_run_dir(tmp_path / "y", "smoke", overrides=[f"out_dir={tmp_path / 'x'}"])
    with pytest.raises(ConfigError, match="out_dir='' is invalid"):
        resolve_run_dir(None, "smoke", overrides=["out_dir="])


@pytest.mark.parametrize("argv, message", [
    (["--experiments", ","], "no experiment chosen"),
    (["--out", ""], "--out: must not be empty"),
    (["--set", "seeds=[1,1]"], "each seed once"),
    (["--set", "out_dir=/tmp/elsewhere"], "conflicts with --out"),
    (["--set", "data.num_train_tasks=1000000000000"], "need up to"),
])
def test_bad_command_lines_exit_2_before_any_work(tmp_path, argv, message, capsys,
                                                 monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "run"
    args = ["--preset", "smoke", *(["--out", str(out)] if "--out" not in argv else []), *argv]
    code, err = full_run(args, capsys)
    assert code == 2 and message in err
    assert not (out / "datasets").exists() and not (tmp_path / "datasets").exists()


def test_sizes_beyond_disk_or_memory_are_refused(tmp_path) -> None:
    cfg = make_config("smoke", "bandit", overrides=["data.num_train_tasks=1000000000000"])
    msgs = check_sizes([cfg], tmp_path, free_disk=80 * 2**30, free_memory=20 * 2**30)
    assert any("need up to" in m and "TiB on disk" in m and "80.0 GiB free" in m for m in msgs)
    assert any("of memory, but 20.0 GiB is available" in m for m in msgs)
    assert check_sizes([make_config("smoke", "bandit")], tmp_path, free_disk=2**30,
                       free_memory=2**30) == []


def test_results_cli_refuses_missing_run_and_paths_outside_results(tmp_path, capsys) -> None:
    assert results_main([str(tmp_path / "nope")]) == 2
    assert "run directory" in capsys.readouterr().err
    _table(tmp_path)
    assert results_main([str(tmp_path), "../datasets/x"]) == 2
    assert "table name '../datasets/x' is invalid" in capsys.readouterr().err
    assert results_main([str(tmp_path), "bandit_online", "--by", "method"]) == 0


# ---- 9. sweep restore only unpickles what we wrote --------------------------------------


def test_sweep_restore_guard(tmp_path) -> None:
    from spice_ray.sweep import SweepError, check_restorable

    exp = tmp_path / "sweeps" / "s"
    exp.mkdir(parents=True)
    (exp / "tuner.pkl").write_bytes(b"pickle")
    inputs = tmp_path / "sweeps" / "s.inputs.json"
    with pytest.raises(SweepError, match="has no s.inputs.json"):
        check_restorable(exp, inputs, "h")
    inputs.write_text("{oops")
    with pytest.raises(SweepError, match="s.inputs.json is corrupted"):
        check_restorable(exp, inputs, "h")
    inputs.write_text(json.dumps({"inputs": "other"}))
    with pytest.raises(SweepError, match="was run with other inputs"):
        check_restorable(exp, inputs, "h")
    inputs.write_text(json.dumps({"inputs": "h"}))
    os.chmod(exp / "tuner.pkl", 0o664)
    with pytest.raises(SweepError, match=r"tuner.pkl is owned by .* mode 0o664"):
        check_restorable(exp, inputs, "h")
    os.chmod(exp / "tuner.pkl", 0o644)
    assert check_restorable(exp, inputs, "h")["inputs"] == "h"
    # Tune also unpickles fields of its experiment state JSON: the same rule for every file
    state = exp / "experiment_state-2026-11-25_00-00-00.json"
    state.write_text("{}")
    os.chmod(state, 0o666)
    with pytest.raises(SweepError, match=r"experiment_state-.*\.json is owned by .* mode 0o666"):
        check_restorable(exp, inputs, "h")
    state.unlink()
    (exp / "trial_0").mkdir()
    (exp / "trial_0" / "params.pkl").symlink_to(tmp_path / "elsewhere.pkl")
    with pytest.raises(SweepError, match=r"params.pkl is a symbolic link"):
        check_restorable(exp, inputs, "h")


def test_publish_dir_is_all_or_nothing(tmp_path) -> None:
    from spice_ray.common.artifacts import publish_dir, verify

    target = tmp_path / "out"

    def good(staging: Path) -> None:
        (staging / "a.txt").write_text("a")
        (staging / "sub").mkdir()
        (staging / "sub" / "b.txt").write_text("b")

    publish_dir(target, good)
    assert verify(target / "a.txt")[0] and verify(target / "sub" / "b.txt")[0]

    def bad(staging: Path) -> None:
        (staging / "a.txt").write_text("half")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError):
        publish_dir(target, bad)
    assert (target / "a.txt").read_text() == "a"  # the old directory as it was
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no staging left behind
    (target / "a.txt").write_text("edited")
    assert "size 6 bytes" in verify(target / "a.txt")[1]
    # a sidecar copied in with its file is re-made: it names the published path
    import json

    from spice_ray.common.artifacts import UnreadableFile

    copy = tmp_path / "copy"
    with pytest.raises(UnreadableFile, match=r"copy/a\.txt fails its SHA-256 checksum \(size"):
        publish_dir(copy, lambda staging: shutil.copytree(target, staging, dirs_exist_ok=True))
    assert not copy.exists()  # an edited file is never re-signed by a copy
    (target / "a.txt").write_text("a")
    publish_dir(copy, lambda staging: shutil.copytree(target, staging, dirs_exist_ok=True))
    assert json.loads((copy / "sub" / "b.txt.sha256").read_text())["file"] == "copy/sub/b.txt"
    assert not list(copy.rglob("*.sha256.sha256")) and verify(copy / "a.txt")[0]
    # Ray's copied logs, which nothing later trusts, are published without sidecars
    publish_dir(target, good, sidecars=False)
    assert sorted(p.name for p in target.rglob("*")) == ["a.txt", "b.txt", "sub"]


@pytest.mark.parametrize("planted", ["symlink", "fifo", "directory"])
def test_the_lock_is_never_opened_through_a_link_or_a_special_file(tmp_path, planted) -> None:
    """A symbolic link (or a FIFO, or a directory) in place of the run's lock is refused by
    name, and the file a link points to is left as it was (it was truncated before)."""
    run = tmp_path / "run"
    run.mkdir()
    outside = tmp_path / "outside.txt"
    outside.write_text("keep me")
    lock = run / runlock.LOCK_NAME
    if planted == "symlink":
        lock.symlink_to(outside)
    elif planted == "fifo":
        os.mkfifo(lock)
    else:
        lock.mkdir()
    words = "a symbolic link" if planted == "symlink" else "not a regular file"
    with pytest.raises(runlock.RunDirectoryLocked, match=f"lock {re.escape(str(lock))} is "
                                                         f"{words}"):
        runlock.acquire(run)
    assert outside.read_text() == "keep me"


def test_a_run_with_a_folder_linked_out_of_it_is_refused_before_any_write(tmp_path, capsys
                                                                          ) -> None:
    """A symbolic link for results/ (or any folder or file in the run) carried the run's
    writes, renames included, to wherever it points; links that stay inside are fine."""
    from spice_ray.runtime.cli import start_run

    run, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    (run / "figures").mkdir(parents=True)
    elsewhere.mkdir()
    (elsewhere / "bandit_online.parquet").write_bytes(b"theirs")
    (run / "results").symlink_to(elsewhere, target_is_directory=True)
    (run / "figures" / "outside.png").symlink_to(tmp_path / "gone.png")
    (run / "latest").symlink_to(run / "figures")  # inside the run: not a problem
    assert [link.name for link, _ in runlock.links_out(run)] == ["results", "outside.png"]
    cfg = make_config("smoke", "bandit", overrides=[f"out_dir={run}"])
    with pytest.raises(SystemExit) as exit_info:
        start_run(None, [cfg], run, stages=("datasets",))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"error: {run / 'results'} is a symbolic link to {elsewhere}, outside the run " \
        "directory" in err and "(1 more link like it)" in err
    assert sorted(p.name for p in elsewhere.iterdir()) == ["bandit_online.parquet"]
    assert (elsewhere / "bandit_online.parquet").read_bytes() == b"theirs"
    assert not (run / "logs").exists()  # refused before the log was opened
    runlock.acquire(run).release()  # and the lock was given back


def test_config_and_log_writes_never_follow_a_link_out_of_the_run(tmp_path) -> None:
    """config.yaml is written by rename (a link there is replaced, its target untouched), and
    the run's log refuses to append through a link."""
    from spice_ray.common.console import Console
    from spice_ray.runtime.cli import setup_logging

    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)
    outside = tmp_path / "outside.txt"
    outside.write_text("keep me")
    (run / "config.yaml").symlink_to(outside)
    path = make_config("smoke", "bandit").write(run)
    assert not path.is_symlink() and "env:" in path.read_text()
    (run / "logs" / "driver.log").symlink_to(outside)
    with pytest.raises(runlock.UnsafeRunPath, match="driver.log is a symbolic link"):
        setup_logging(run, Console())
    assert outside.read_text() == "keep me"


def test_an_out_with_a_newline_and_a_repeated_by_are_refused_by_name(tmp_path, capsys) -> None:
    """A newline in --out made Ray Data stage files in a sibling directory outside it; a
    column given twice to --by was a ValueError traceback."""
    from spice_ray.runtime.cli import check_writable

    with pytest.raises(SystemExit) as exit_info:
        check_writable(tmp_path / "a\nb")
    assert exit_info.value.code == 2
    assert "control character (a newline?)" in capsys.readouterr().err
    assert not (tmp_path / "a\nb").exists()
    rows = pd.DataFrame([{"experiment": "t", "env": "bandit", "method": "SPICE", "rule": "ucb",
                          "config": "{}", "variant": "", "seed": 0, "task_id": 0,
                          "metric": "cumulative_regret", "x": 1, "value": 1.0}])
    write(tmp_path, "t", rows, inputs="x")
    assert results_main([str(tmp_path), "t", "--by", "method,method"]) == 2
    assert "--by 'method,method' names a column twice" in capsys.readouterr().err


def test_a_re_run_with_another_config_into_a_study_is_refused(tmp_path) -> None:
    """A run directory holds one study: re-running an experiment into it with a config that
    changes its results is refused before any work, naming the fields (its tables would be
    replaced and the report would mix both); how it runs (workers, threads) may change."""
    from spice_ray.study import plan_study

    run = tmp_path / "run"
    plan = plan_study("smoke", run, experiments=("bandit", "darkroom"))
    for name, cfg in plan.configs.items():
        cfg.write(run / "configs", f"{name}.yaml")
    with pytest.raises(ConfigError, match=r"holds experiment bandit run with another config "
                                          r"\(fusion\.noise_var: on disk 0\.09, requested "
                                          r"0\.04\).*Use another --out"):
        plan_study("smoke", run, overrides=["fusion.noise_var=0.04"], experiments=("bandit",))
    plan_study("smoke", run, overrides=["train.num_workers=1", "train.threads=1"],
               experiments=("bandit",))
    shutil.copytree(run, tmp_path / "moved")  # out_dir differs: the same study
    plan_study("smoke", tmp_path / "moved", experiments=("bandit", "darkroom"))


def test_fault_injection_has_one_switch_that_is_parsed_never_run(monkeypatch) -> None:
    """Every injected fault is one point of one JSON switch; a bad switch or point is refused
    by name, and without the switch no point fires."""
    from spice_ray.common.faults import FAULT_ENV, POINTS, fault, fault_switch

    monkeypatch.delenv(FAULT_ENV, raising=False)
    assert [fault(p) for p in POINTS] == [None] * len(POINTS)
    monkeypatch.setenv(FAULT_ENV, fault_switch(train_epoch=1, sweep_trial={"fusion.beta": 2.0}))
    assert fault("train_epoch") == 1 and fault("sweep_trial") == {"fusion.beta": 2.0}
    assert fault("disk_full") is None and fault("generate_after_shards", -1) == -1
    with pytest.raises(ValueError, match="fault point 'boom'"):
        fault("boom")
    with pytest.raises(ValueError, match="fault points"):
        fault_switch(boom=1)
    for bad in ("__import__('os')", '{"boom": 1}', "[1]"):
        monkeypatch.setenv(FAULT_ENV, bad)
        with pytest.raises(ValueError, match=FAULT_ENV):
            fault("train_epoch")


def test_a_corrupt_table_is_flagged_in_the_listing_with_a_non_zero_exit(tmp_path, capsys
                                                                         ) -> None:
    """Listing a run whose table fails its checksum printed it with an empty description and
    exit 0; now it is named, with why, and the listing exits 2."""
    rows = pd.DataFrame({"experiment": "bandit", "env": "bandit", "method": "SPICE",
                         "rule": "ucb", "config": "{}", "variant": "", "seed": 0,
                         "task_id": [0, 1], "metric": "cumulative_regret", "x": 10,
                         "value": [1.0, 2.0]})
    write(tmp_path, "bandit_online", rows, description="the good one")
    write(tmp_path, "bandit_offline", rows, description="the bad one")
    path = tmp_path / "results" / "bandit_offline.parquet"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 1
    path.write_bytes(bytes(data))
    assert results_main([str(tmp_path)]) == 2
    out, err = capsys.readouterr()
    assert "bandit_online          the good one" in out
    assert re.search(r"bandit_offline +UNREADABLE: ", out)
    assert err.startswith("error: 1 table of") and "(bandit_offline)" in err


def test_run_files_and_saved_weights_are_not_world_writable(tmp_path) -> None:
    """Ray's session logs (0777) kept their mode when copied into the run; safetensors wrote
    the weights 0600 beside 0644 siblings (then 0644 whatever the umask)."""
    from spice_ray.model import checkpoint as ckpt
    from spice_ray.model.registry import build_model

    ray_logs = tmp_path / "logs"
    (ray_logs / "old").mkdir(parents=True)
    (ray_logs / "old" / "raylet.out").write_text("x")
    for p in (ray_logs, ray_logs / "old", ray_logs / "old" / "raylet.out"):
        os.chmod(p, 0o777)
    runlock.owner_writable_only(ray_logs)
    assert {oct(p.stat().st_mode & 0o777) for p in (ray_logs, ray_logs / "old")} == {"0o755"}
    assert oct((ray_logs / "old" / "raylet.out").stat().st_mode & 0o777) == "0o644"
    cfg = make_config("smoke", "bandit")
    previous = os.umask(0o022)
    try:
        path = ckpt.save_checkpoint(tmp_path / "c", build_model("dpt", cfg), cfg, "hash",
                                    epoch=0)
        modes = {p.name: oct(p.stat().st_mode & 0o777) for p in path.iterdir()}
        assert set(modes.values()) == {"0o644"}, modes
        # a lab's umask 027 (no access for others) is kept for the weights too, as for their
        # siblings: never widened to 0644
        os.umask(0o027)
        path = ckpt.save_checkpoint(tmp_path / "d", build_model("dpt", cfg), cfg, "hash",
                                    epoch=0)
        modes = {p.name: oct(p.stat().st_mode & 0o777) for p in path.iterdir()}
        assert set(modes.values()) == {"0o640"}, modes
    finally:
        os.umask(previous)


def test_a_hard_linked_lock_or_log_is_replaced_not_written_through(tmp_path, caplog) -> None:
    """A run directory made by ``cp -al`` shares every file with its source by hard links: the
    lock and the log (written in place) are replaced by private copies before the first write,
    and every other file (a table here) is written to a new name and renamed over the link, so
    the other path keeps its bytes."""
    from spice_ray.results.tables import write_frame
    from spice_ray.runtime.cli import _file_handler

    run, other = tmp_path / "run", tmp_path / "other"
    (run / "logs").mkdir(parents=True)
    (run / "results").mkdir()
    other.mkdir()
    names = {"lock": run / runlock.LOCK_NAME, "log": run / "logs" / "driver.log",
             "table": run / "results" / "t.parquet"}
    kept = {}
    for what, path in names.items():
        outside = other / path.name
        outside.write_bytes(f"the other run's {what}\n".encode())
        os.link(outside, path)
        kept[what] = (outside, outside.read_bytes())
        assert path.stat().st_nlink == 2
    with caplog.at_level(logging.WARNING, logger="spice_ray.common.runlock"):
        with runlock.acquire(run, "test"):
            handler = _file_handler(names["log"])
            handler.emit(logging.LogRecord("spice_ray", logging.INFO, __file__, 1,
                                           "a line of this run", None, None))
            handler.close()
            write_frame(names["table"], pd.DataFrame({"x": [1.0]}))
    for what, (outside, before) in kept.items():
        assert outside.read_bytes() == before, what  # nothing written through the link
        assert names[what].stat().st_nlink == 1, what  # this run's own file now
    assert "a line of this run" in names["log"].read_text()
    assert names["log"].read_text().startswith("the other run's log")  # its history kept
    assert pd.read_parquet(names["table"])["x"].tolist() == [1.0]
    assert sum("was a hard link" in r.getMessage() for r in caplog.records) == 2  # lock, log


def test_a_held_lock_shared_by_a_hard_link_still_refuses_a_second_run(tmp_path) -> None:
    """``cp -al run run2`` while a run holds ``run``: the lock file now has two paths. A second
    run into ``run`` must still find the holder (it once replaced the shared file by a private
    copy first and locked that, so two runs held one directory), and the holder's own lock
    moves to a private file only once it holds it."""
    run, copy = tmp_path / "run", tmp_path / "run2"
    held = runlock.acquire(run, command="the first run")
    copy.mkdir()
    os.link(run / runlock.LOCK_NAME, copy / runlock.LOCK_NAME)
    with pytest.raises(runlock.RunDirectoryLocked, match=r"in use by pid .* \(the first run\)"):
        runlock.acquire(run)
    assert (run / runlock.LOCK_NAME).stat().st_nlink == 2  # nothing replaced meanwhile
    held.release()
    with runlock.acquire(run, command="the second run"):  # free: taken, on a private file
        assert (run / runlock.LOCK_NAME).stat().st_nlink == 1
        with pytest.raises(runlock.RunDirectoryLocked, match=r"\(the second run\)"):
            runlock.acquire(run)
    assert "the second run" not in (copy / runlock.LOCK_NAME).read_text()  # ours alone
