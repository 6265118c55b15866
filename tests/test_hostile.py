"""Hostile input is refused cheaply, in one short line: YAML bombs, duplicate keys, oversized
or deeply nested documents, pathological ``--set`` values, and edited or garbage checkpoint
metadata. Unit tests (no Ray) unless marked."""

from __future__ import annotations

import io
import json
import logging
import re
from pathlib import Path

import pytest
import torch
from conftest import HANG_S, full_run_cli, hang_guard

from spice_ray.common.errors import excerpt
from spice_ray.config import ConfigError, load_yaml, make_config, parse_set
from spice_ray.config.yamlfile import MAX_DEPTH, MAX_YAML_BYTES, parse_yaml

ROOT = Path(__file__).resolve().parents[1]
FULL_RUN = str(ROOT / "pipelines" / "full_run.py")

BOMB = """\
a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]
b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]
c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]
d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]
e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]
f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e]
data: {label: *f}
"""


def full_run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """``pipelines/full_run.py --dry-run argv`` in this process: exit status and stderr. Only
    for command lines that stop before the study starts; a refusal that hung (expanding a
    YAML bomb, formatting 3,000 seeds) fails the test at the hang guard."""
    with hang_guard("full_run.py --dry-run " + excerpt(" ".join(argv))):
        code, _, err = full_run_cli(["--dry-run", *argv], capsys)
    return code, err


def assert_one_short_line(err: str) -> None:
    """One line under 400 characters that shows no more than an excerpt of any value."""
    assert err.endswith("\n") and err.count("\n") == 1, err[:500]
    assert len(err) < 400, err[:500]
    assert not re.search(r"(.)\1{80}", err), err  # no long run of the user's characters


# ---- 1. YAML files ----------------------------------------------------------------------


def test_alias_bomb_is_refused_at_once(tmp_path, capsys) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(BOMB)
    assert len(BOMB) < 400
    # refused by its count of values before any is built (expanded, it would take minutes)
    with hang_guard("loading the alias bomb"), pytest.raises(
            ConfigError, match=r"bomb\.yaml is refused: more than 10000 values with aliases "
                               r"expanded \(line 5\)"):
        load_yaml(path)
    code, err = full_run(["--preset", "smoke", "--out", str(tmp_path / "o"), "--config",
                          str(path)], capsys)
    assert code == 2 and f"config file {path} is refused" in err
    assert_one_short_line(err)


def test_alias_budget_recursion_and_merge_keys() -> None:
    many = "a: &a 1\nb: [" + ", ".join(["*a"] * 101) + "]\n"
    with pytest.raises(ConfigError, match=r"more than 100 aliases \(line 2\)"):
        parse_yaml(many, "x")
    with pytest.raises(ConfigError, match="alias \\*a is used inside the value it names"):
        parse_yaml("a: &a [1, *a]\n", "x")
    # a merge key still gives defaults that the mapping's own keys override
    merged = parse_yaml("base: &base {lr: 1, epochs: 2}\ntrain: {<<: *base, lr: 3}\n", "x")
    assert merged["train"] == {"lr": 3, "epochs": 2}
    # the project's own cluster file (anchors, long shell commands) is unaffected
    assert "available_node_types" in load_yaml(ROOT / "cluster.yaml")


def test_duplicate_keys_are_refused_naming_key_and_line(tmp_path, capsys) -> None:
    path = tmp_path / "dup.yaml"
    path.write_text("seeds: [1]\ndata:\n  seed: 1\n  num_train_tasks: 50\n  seed: 2\n")
    with pytest.raises(ConfigError, match=r"key 'seed' is given twice \(lines 3 and 5\)"):
        make_config("smoke", "bandit", yaml_path=path)
    code, err = full_run(["--preset", "smoke", "--out", str(tmp_path / "o"),
                             "--config", str(path)], capsys)
    assert code == 2 and "dup.yaml is refused: key 'seed' is given twice" in err
    assert_one_short_line(err)
    with pytest.raises(ConfigError, match=r"--set seeds is refused: key 1 is given twice"):
        parse_set(["seeds={1: a, 1: b}"])


def test_oversized_and_deep_documents_are_refused(tmp_path) -> None:
    big = tmp_path / "big.yaml"
    big.write_bytes(b"# " + b"x" * MAX_YAML_BYTES + b"\ndata: {seed: 1}\n")
    with pytest.raises(ConfigError, match=r"big\.yaml is over 1 MiB"):
        load_yaml(big)
    assert parse_yaml("[" * MAX_DEPTH + "]" * MAX_DEPTH, "x") is not None
    deep = tmp_path / "deep.yaml"
    deep.write_text("data: " + "[" * MAX_DEPTH + "]" * MAX_DEPTH + "\n")
    with pytest.raises(ConfigError, match="nested more than 32 levels deep"):
        load_yaml(deep)
    # aliases cannot stack depth past the limit either
    stacked = "a: &a " + "[" * 20 + "]" * 20 + "\nb: " + "[" * 20 + "*a" + "]" * 20 + "\n"
    with pytest.raises(ConfigError, match="nested more than 32 levels deep once aliases"):
        parse_yaml(stacked, "x")


def test_yaml_syntax_errors_are_one_line(tmp_path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("data: {seed: 1\n")
    with pytest.raises(ConfigError) as exc:
        load_yaml(path)
    assert "\n" not in str(exc.value) and "bad.yaml is not valid YAML" in str(exc.value)


# ---- 2. and 3. --set values -------------------------------------------------------------


@pytest.mark.parametrize("item, shown", [
    ("data.seed=" + "[" * 3000 + "]" * 3000, "--set data.seed is refused: nested more than 32"),
    ("data.seed=" + "9" * 100_000, "(100000 characters) at line 1 is a number over 50"),
    ("data.label=" + "x" * 20_000, "(20000 characters) at line 1 is a string over 10000"),
    ("data.label=" + "x" * 5_000, "data.label='xxx"),
    ("seeds=[" + ",".join(["1"] * 3000) + "]", "seeds=(1, 1, 1, 1, 1, 1, 1, 1, ...) (3000 "),
    ("data.seed=" + "{a: 1, b: " * 20, "--set data.seed is not valid YAML: while parsing"),
    ("data.seed=2024-13-45", "--set data.seed is not valid YAML: month must be in 1..12"),
    ("data." + "k" * 5000 + "=1", "a key over 200 characters"),
    ("data.seed=[" + "1, " * 5000, "--set data.seed is not valid YAML"),
    ("data.num_train_tasks=" + "x" * 500, "data.num_train_tasks='xxx"),
    ("env=" + "y" * 500, "env='yyy"),
], ids=["deep-list", "long-number", "huge-string", "long-label", "many-seeds", "unclosed",
        "bad-date", "long-key", "unclosed-list", "string-for-int", "string-for-section"])
def test_pathological_set_values_are_one_line(item, shown, tmp_path, capsys) -> None:
    code, err = full_run(["--preset", "smoke", "--out", str(tmp_path / "o"), "--set", item],
                         capsys)
    assert code == 2 and err.startswith("error: bad config: ") and shown in err, err[:500]
    assert_one_short_line(err)
    assert not (tmp_path / "o").exists()


def test_excerpt_is_short_and_cheap() -> None:
    assert excerpt("short") == "'short'"
    long = excerpt("a" * 5000 + "Z")
    assert long.endswith("aZ' (5001 characters)") and len(long) < 100
    assert excerpt(list(range(3000))) == "[0, 1, 2, 3, 4, 5, 6, 7, ...] (3000 items)"
    nested: list = []
    for _ in range(5000):  # repr() of this would raise RecursionError
        nested = [nested]
    assert len(excerpt(nested)) <= 80


# ---- 4. checkpoint metadata is checksummed ----------------------------------------------


def _job_and_final(tmp_path: Path):
    """A tiny SPICE model's finished job: its ``final`` checkpoint and an intact copy of it
    as the last epoch's checkpoint, as the training loop leaves them."""
    from spice_ray.model import checkpoint as ckpt
    from spice_ray.model.registry import build_model
    from spice_ray.train.loop import TrainJob

    cfg = make_config("smoke", "bandit", overrides=["train.num_workers=0", "train.epochs=2",
                                                    f"out_dir={tmp_path}"])
    job = TrainJob(cfg.to_dict(), "spice", str(tmp_path / "ds"), "hash", 0)
    model = build_model("spice", cfg, generator=torch.Generator().manual_seed(0))
    run_dir = tmp_path / "run"
    extra = {"identity": job.identity(), "seed": 0}
    epoch = ckpt.save_checkpoint(run_dir / "local" / "epoch-0001", model, cfg, "hash", 1,
                                 optimizer_state={}, extra=extra)
    final = ckpt.save_checkpoint(run_dir / "final", model, cfg, "hash", 1, optimizer_state={},
                                 extra=extra)
    return job, run_dir, final, epoch


def test_edited_checkpoint_meta_is_not_loaded(tmp_path, caplog) -> None:
    from spice_ray.model import checkpoint as ckpt
    from spice_ray.model.registry import load_model
    from spice_ray.train.loop import LocalContext, latest_intact
    from spice_ray.train.ray_train import settle_final

    job, run_dir, final, epoch = _job_and_final(tmp_path)
    assert settle_final(final, job)
    meta = json.loads((final / ckpt.META).read_text())
    assert meta["spec"]["config"]["prior_scale"] == 1.0
    meta["spec"]["config"]["prior_scale"] = meta["config"]["model"]["prior_scale"] = 5.0
    (final / ckpt.META).write_text(json.dumps(meta, indent=1))  # valid JSON, same identity
    with pytest.raises(ckpt.CheckpointError, match=r"final/meta\.json fails its SHA-256 "
                                                   r"checksum \(SHA-256 mismatch"):
        load_model(final)
    assert not settle_final(final, job)  # so pretrain() resumes instead of using it
    # the resume (or republish) source skips an edited checkpoint for the intact one
    edited = run_dir / "local" / "epoch-0002"
    final.rename(edited)
    with caplog.at_level(logging.WARNING):
        assert LocalContext(job, run_dir).resume_dir() == epoch
        assert latest_intact([edited]) is None
    assert "skipping unusable checkpoint" in caplog.text and "meta.json fails" in caplog.text


@pytest.mark.parametrize("damage", ["garbage", "no spec", "no sidecar"])
def test_garbage_checkpoint_meta_is_one_line(damage, tmp_path, capsys) -> None:
    from spice_ray.model import checkpoint as ckpt
    from spice_ray.model.registry import load_model
    from spice_ray.runtime.cli import run_main
    from spice_ray.train.ray_train import settle_final

    job, _, final, _ = _job_and_final(tmp_path)
    path = final / ckpt.META
    if damage == "garbage":
        path.write_bytes(b"\xff\xfe\x00garbage" * 50)
    elif damage == "no spec":
        meta = json.loads(path.read_text())
        del meta["spec"]
        path.write_text(json.dumps(meta))
    else:
        (final / "meta.json.sha256").unlink()
    assert not settle_final(final, job)  # no traceback: the job is trained or resumed
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        run_main(load_model, final)
    err = capsys.readouterr().err
    assert exc.value.code == 1 and f"checkpoint file {path} fails its SHA-256" in err
    assert_one_short_line(err)


def test_checkpoint_meta_reads_back_and_names_missing_keys(tmp_path) -> None:
    from spice_ray.model import checkpoint as ckpt

    _, _, final, _ = _job_and_final(tmp_path)
    meta = ckpt.read_meta(final)
    assert meta["epoch"] == 1 and meta["kind"] == "spice"
    del meta["spec"]
    ckpt.write_meta(final, meta)  # re-signed by hand: still refused, by name
    with pytest.raises(ckpt.CheckpointError, match=r"meta\.json is incomplete: spec missing"):
        ckpt.read_meta(final)


@pytest.mark.ray
def test_edited_final_meta_is_republished_from_the_intact_checkpoint(ray_local, tmp_path,
                                                                     caplog) -> None:
    from spice_ray.data.generate import generate_dataset
    from spice_ray.model import checkpoint as ckpt
    from spice_ray.train.ray_train import pretrain

    cfg = make_config("smoke", "bandit", overrides=[f"out_dir={tmp_path}"])
    ds = generate_dataset(cfg, tmp_path / "ds").dataset_dir
    final = pretrain(cfg, "spice", 0, ds)
    good = (final / ckpt.META).read_bytes()
    weights = (final / ckpt.WEIGHTS).read_bytes()
    (final / ckpt.META).write_bytes(good.replace(b'"prior_scale": 1.0', b'"prior_scale": 5.0'))
    assert (final / ckpt.META).read_bytes() != good
    with caplog.at_level(logging.INFO):
        again = pretrain(cfg, "spice", 0, ds)
    assert again == final and (final / ckpt.WEIGHTS).read_bytes() == weights
    assert json.loads((final / ckpt.META).read_bytes()) == json.loads(good)
    assert ckpt.read_meta(final)["spec"]["config"]["prior_scale"] == 1.0


# ---- 4. Ray not starting ----------------------------------------------------------------


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_address_is_refused_in_bounded_time() -> None:
    """Nothing listening, and a listener that is not Ray's GCS (never speaks gRPC): both refused,
    naming the address and the time waited: the timeout given, not Ray's own minutes of
    retries (the hang guard)."""
    import socket

    from spice_ray.runtime.reach import ClusterUnreachable, check_reachable

    port = _free_port()
    with hang_guard("check_reachable on a closed port"), pytest.raises(
            ClusterUnreachable, match=rf"127\.0\.0\.1:{port} \(.*waited \d"):
        check_reachable(f"127.0.0.1:{port}", timeout_s=2.0)
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        with hang_guard("check_reachable on a silent listener"), pytest.raises(
                ClusterUnreachable, match="no gRPC server answers there") as refused:
            check_reachable(address, timeout_s=1.0)
    # it waited for the gRPC handshake until its timeout (and, the guard says, not for ever)
    assert float(re.search(r"waited ([\d.]+) s", str(refused.value))[1]) >= 0.95
    check_reachable("auto")  # left to Ray's own discovery, which fails fast


def test_full_run_with_nothing_at_address_exits_2_in_one_line(tmp_path) -> None:
    import subprocess
    import sys

    address = f"127.0.0.1:{_free_port()}"
    proc = subprocess.run([sys.executable, FULL_RUN, "--preset", "smoke", "--experiments",
                           "bandit", "--out", str(tmp_path / "run"), "--address", address],
                          capture_output=True, text=True, timeout=HANG_S)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert_one_short_line(proc.stderr)
    assert proc.stderr.startswith(f"error: no Ray cluster answers at --address {address}")


def test_a_local_ray_that_misses_its_start_up_is_started_again() -> None:
    """Ray's driver waits a fixed 30 s for its raylet; a busy machine can miss it once. The
    failed start is shut down and Ray started again; only when every try fails does the run
    end, in one line that names Ray's reason, the tries and the machine's load."""
    from spice_ray.runtime.reach import RAY_START_TIMEOUT, RayStartFailed, start_local

    calls: list[object] = []

    def init(**kwargs: object) -> str:
        calls.append(kwargs)
        if len(calls) == 1:
            raise Exception(RAY_START_TIMEOUT)  # Ray raises a bare Exception here
        return "started"

    assert start_local(init, lambda: calls.append("shutdown"), num_cpus=2) == "started"
    assert calls == [{"address": "local", "num_cpus": 2}, "shutdown",
                     {"address": "local", "num_cpus": 2}]

    def never(**kwargs: object) -> None:
        raise Exception(RAY_START_TIMEOUT + "\n" + "a second line of Ray's")

    with pytest.raises(RayStartFailed) as failed:
        start_local(never, lambda: None, tries=3)
    message = str(failed.value)
    assert "\n" not in message and message.startswith(
        "the local Ray did not start in 3 tries (The current node timed out during startup.")
    assert re.search(r"load average [\d.]+ on \d+ CPUs\): run again .* --address auto$",
                     message)


def test_full_run_whose_local_ray_never_starts_exits_1_in_one_line(tmp_path) -> None:
    """A smoke run on a machine too busy for Ray's start-up (every try made to fail as Ray's
    timeout does): one ``error:`` line and status 1, never Ray's traceback; the run's lock is
    released, so the same command can run again."""
    import os
    import subprocess
    import sys

    from spice_ray.common.faults import FAULT_ENV, fault_switch

    run = tmp_path / "run"
    proc = subprocess.run([sys.executable, FULL_RUN, "--preset", "smoke", "--experiments",
                           "bandit", "--out", str(run)], capture_output=True, text=True,
                          timeout=HANG_S, env={**os.environ,
                                               FAULT_ENV: fault_switch(ray_start=3)})
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert proc.stderr.count("\n") == 1, proc.stderr[-3000:]
    assert proc.stderr.startswith("error: the local Ray did not start in 3 tries (The current "
                                  "node timed out during startup."), proc.stderr
    from spice_ray.common import runlock

    runlock.acquire(run).release()  # the lock was released: free to take


def test_a_plugin_that_raises_on_import_is_one_line(tmp_path) -> None:
    """An installed plugin whose import raises gave a traceback from full_run.py's imports
    (its experiments module loads the plugins); now one ``error:`` line naming the plugin,
    its module and the error, status 1."""
    import os
    import subprocess
    import sys

    site = tmp_path / "site"
    dist = site / "broken_plugin-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[spice_ray.plugins]\nbroken = broken_plugin\n")
    (site / "broken_plugin.py").write_text("raise RuntimeError('the plugin is broken')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(site), *filter(None, [os.environ.get("PYTHONPATH")])])}
    proc = subprocess.run([sys.executable, FULL_RUN, "--preset", "smoke", "--dry-run",
                           "--out", str(tmp_path / "run")], capture_output=True, text=True,
                          timeout=HANG_S, env=env)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert_one_short_line(proc.stderr)
    assert proc.stderr.startswith("error: plugin 'broken' (module broken_plugin, entry point "
                                  "group spice_ray.plugins) failed to load: RuntimeError: the "
                                  "plugin is broken"), proc.stderr


# ---- 5. A full disk ---------------------------------------------------------------------


def test_full_disk_names_the_file_and_the_stage_in_one_line(tmp_path, capsys) -> None:
    import errno

    from spice_ray.common.artifacts import atomic_path
    from spice_ray.common.errors import enter_stage
    from spice_ray.runtime.cli import run_main

    target = tmp_path / "checkpoints" / "model.pt"

    def stage() -> None:
        enter_stage("2/5 pretrain")
        with atomic_path(target) as tmp:
            tmp.write_bytes(b"half")
            raise OSError(errno.ENOSPC, "No space left on device")  # as torch.save raises it

    with pytest.raises(SystemExit) as exc:
        run_main(stage)
    assert exc.value.code == 1
    err = capsys.readouterr().err
    assert_one_short_line(err)
    assert err.startswith(f"error: cannot write {target} in stage 2/5 pretrain: No space left")
    assert list(target.parent.iterdir()) == []  # no half file left behind


def test_log_file_that_cannot_be_written_falls_silent(tmp_path, capsys) -> None:
    from spice_ray.runtime.cli import _file_handler

    class Full:
        def write(self, text: str) -> None:
            raise OSError(28, "No space left on device")

        def flush(self) -> None:
            pass

    handler = _file_handler(tmp_path / "driver.log")
    handler.stream = Full()
    logger = logging.getLogger("spice_ray.test_full_disk")
    logger.addHandler(handler)
    try:
        logger.warning("one")
        logger.warning("two")
    finally:
        logger.removeHandler(handler)
    assert "Logging error" not in capsys.readouterr().err
    assert handler.failed
    # the console's handler too: a closed stream (a closed pipe or test capture) falls silent
    from spice_ray.common.console import Console

    stream = io.StringIO()
    shown = Console(stream=stream, live=False).handler()
    stream.close()
    logger.addHandler(shown)
    try:
        logger.warning("three")
        logger.warning("four")
    finally:
        logger.removeHandler(shown)
    assert "Logging error" not in capsys.readouterr().err and shown.failed


# ---- 6. Silent overrides ----------------------------------------------------------------


@pytest.mark.parametrize("argv, shown", [
    (["--preset", "smoke", "--set", "preset=paper"],
     "preset='paper' in --set contradicts preset='smoke' chosen by --preset"),
    (["--preset", "smoke", "--experiments", "darkroom", "--set",
      "env.name=darkroom_continuous"],
     "env.name='darkroom_continuous' in --set contradicts env.name='darkroom'"),
])
def test_a_set_value_contradicting_the_command_line_is_refused(argv, shown, tmp_path,
                                                               capsys) -> None:
    code, err = full_run([*argv, "--out", str(tmp_path / "o")], capsys)
    assert code == 2 and shown in err, err
    assert_one_short_line(err)


def test_a_config_file_naming_another_preset_is_refused_and_the_same_one_passes(tmp_path
                                                                               ) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("preset: paper\n")
    with pytest.raises(ConfigError, match=rf"preset='paper' in config file {path} contradicts"):
        make_config("smoke", "bandit", yaml_path=path)
    path.write_text("preset: smoke\nenv: {name: bandit}\n")
    assert make_config("smoke", "bandit", yaml_path=path).preset == "smoke"


# ---- 7. A model that cannot fit ---------------------------------------------------------


def test_a_model_that_cannot_fit_is_refused_by_the_dry_run(tmp_path, capsys) -> None:
    code, err = full_run(["--preset", "smoke", "--experiments", "bandit", "--out",
                          str(tmp_path / "o"), "--set", "model.n_embd=1000000"], capsys)
    assert code == 2 and err.startswith("error: model.n_layer=2, model.n_embd=1000000"), err
    assert "24,000,115,000,344 parameters" in err and "of memory is available" in err
    assert_one_short_line(err)


def test_model_estimate_counts_the_built_models_parameters() -> None:
    from spice_ray.model.registry import build_model
    from spice_ray.runtime.resources import check_models, model_estimate

    cfg = make_config("smoke", "darkroom")
    for kind in ("spice", "dpt"):
        size = model_estimate(cfg, kind)
        model = build_model(kind, cfg)
        assert size.params == sum(p.numel() for p in model.parameters() if p.requires_grad)
        assert size.state_bytes >= 16 * size.params and size.activation_bytes > 0
    wide = make_config("smoke", "darkroom", overrides=["model.n_embd=256", "model.n_head=4"])
    assert model_estimate(wide, "spice").worker_bytes > model_estimate(cfg, "spice").worker_bytes
    assert check_models([cfg], free_memory=2**30) == []
    [line] = check_models([cfg], free_memory=1000)
    assert "but 1000.0 B of memory is available" in line
    gpu = make_config("smoke", "darkroom", overrides=["train.use_gpu=true"])
    assert check_models([gpu], free_memory=1000) == []  # a GPU's memory is what counts
    assert "but a GPU has" in check_models([gpu], gpu_memory=1000)[0]


# ---- 8. Messages ------------------------------------------------------------------------


def test_out_pointing_at_a_file_says_so(tmp_path, capsys) -> None:
    from spice_ray.runtime.cli import check_writable

    target = tmp_path / "a file"
    target.write_text("x")
    with pytest.raises(SystemExit) as exc:
        check_writable(target)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err == f"error: output directory {target} is a file, not a directory: choose " \
                  "another --out\n"
