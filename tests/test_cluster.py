"""The AWS launcher file (cluster.yaml) and placement of work by resource label.

Unit tests (no Ray cluster, a few seconds): cluster.yaml passes Ray's own schema and this
project's policy (labels on every node type, SSH the only port open to the world, no
credentials); broken copies fail with a message naming the key; placement_resources asks for a
label only when the cluster can provide it. One test runs Ray's AWS bootstrap against moto.

Integration (@pytest.mark.ray): a head + worker cluster of `ray start` processes on this
machine; tasks requiring each label land on the node that advertises it, and teardown stops
only that cluster's processes (a bystander process that `ray stop` would kill survives).
"""

from __future__ import annotations

import copy
import json
import logging
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from spice_ray.common.placement import (
    DATAGEN,
    HEAD,
    LABEL_REQUEST,
    LABELS_ENV,
    TRAINER,
    declared_labels,
    placement_resources,
    resource_labels,
)
from tools.cluster import check_cluster_policy, validate_cluster_config, world_open_ports
from tools.local_cluster import (
    START_TRIES,
    ClusterConfigError,
    _alive,
    _cluster_pids,
    _Launcher,
    _proc_table,
    local_autoscaling_cluster,
    local_multinode_cluster,
    ray_cli,
    started,
)

ROOT = Path(__file__).resolve().parents[1]
CLUSTER_YAML = ROOT / "cluster.yaml"
LOCAL_YAML = ROOT / "cluster.local.yaml"


@pytest.fixture(scope="module")
def raw_config() -> dict:
    return yaml.safe_load(CLUSTER_YAML.read_text())


def _write(tmp_path: Path, config: dict) -> Path:
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


# ---- Ray's schema ------------------------------------------------------------------------------


def test_cluster_yaml_passes_rays_schema_and_prepare_config():
    cfg = validate_cluster_config(CLUSTER_YAML)
    # prepare_config ran: Ray's defaults are merged and per-type worker limits filled.
    assert cfg["head_node_type"] == "ray.head.default"
    assert cfg["available_node_types"]["ray.head.default"]["max_workers"] == 0
    assert cfg["available_node_types"]["ray.worker.trainer"]["max_workers"] == 8
    assert cfg["head_setup_commands"][-1] == \
        'pip install --no-cache-dir -e "$HOME/spice-ray[dashboard]"'
    assert cfg["docker"]["image"].startswith("rayproject/ray:")


def test_validation_needs_no_boto3_or_credentials():
    """prepare_config + validate_config for the aws provider read only files in the Ray wheel."""
    code = ("import sys; sys.modules['boto3'] = None; sys.modules['botocore'] = None\n"
            "from tools.cluster import validate_cluster_config\n"
            f"validate_cluster_config({str(CLUSTER_YAML)!r}); print('validated')")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env=env, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "validated" in out.stdout


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda c: c.update(max_worker=3), ["(top level)", "'max_worker' was unexpected"]),
        (lambda c: c.update(max_workers="twelve"), ["max_workers", "is not of type 'integer'"]),
        (lambda c: c["available_node_types"]["ray.worker.trainer"]["resources"]
         .update(GPU=0.5), ["available_node_types/ray.worker.trainer/resources/GPU",
                            "is not of type 'integer'"]),
        (lambda c: c["provider"]["security_group"].update(Ingress=[]),
         ["provider/security_group", "'Ingress' was unexpected"]),
    ],
    ids=["unknown-top-level-key", "wrong-type", "fractional-node-resource", "unknown-sg-key"],
)
def test_broken_copy_fails_with_a_clear_message(tmp_path, raw_config, mutate, expected):
    broken = copy.deepcopy(raw_config)
    mutate(broken)
    path = _write(tmp_path, broken)
    with pytest.raises(ClusterConfigError) as info:
        validate_cluster_config(path)
    msg = str(info.value)
    assert str(path) in msg
    for part in expected:
        assert part in msg, msg


def test_not_yaml_or_not_a_mapping_is_reported(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("cluster_name: [unclosed\n")
    with pytest.raises(ClusterConfigError, match="not valid YAML"):
        validate_cluster_config(bad)
    bad.write_text("- a list\n")
    with pytest.raises(ClusterConfigError, match="must hold a mapping"):
        validate_cluster_config(bad)


def test_falls_back_to_the_schema_alone_without_prepare_config(tmp_path, raw_config,
                                                               monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "ray.autoscaler._private.util", None)  # import fails
    with caplog.at_level(logging.WARNING, logger="tools.cluster"):
        cfg = validate_cluster_config(CLUSTER_YAML)
    assert cfg == raw_config  # the raw file, no defaults merged
    assert "ray-schema.json only" in caplog.text
    broken = copy.deepcopy(raw_config)
    broken["idle_timeout_minutes"] = "ten"
    with pytest.raises(ClusterConfigError, match="idle_timeout_minutes"):
        validate_cluster_config(_write(tmp_path, broken))


# ---- project policy ----------------------------------------------------------------------------


def test_cluster_yaml_meets_the_project_policy(raw_config):
    assert check_cluster_policy(raw_config) == []
    assert check_cluster_policy(validate_cluster_config(CLUSTER_YAML)) == []


def test_every_node_type_carries_a_label_from_spice_ray_placement(raw_config):
    labels = set(resource_labels())
    node_types = raw_config["available_node_types"]
    per_type = {name: labels & set(spec["resources"]) for name, spec in node_types.items()}
    assert all(per_type.values()), per_type
    assert per_type[raw_config["head_node_type"]] == {HEAD}
    assert set().union(*per_type.values()) == labels
    assert node_types[raw_config["head_node_type"]]["resources"]["CPU"] == 0
    # Containers are told which labels the autoscaler can provide: exactly these.
    run_options = " ".join(raw_config["docker"]["run_options"])
    assert f"{LABELS_ENV}={','.join(resource_labels())}" in run_options


def test_security_group_opens_only_ssh(raw_config):
    sg = raw_config["provider"]["security_group"]
    assert sg["GroupName"]
    assert all((r["IpProtocol"], r["FromPort"], r["ToPort"]) == ("tcp", 22, 22)
               for r in sg.get("IpPermissions", []))
    for spec in raw_config["available_node_types"].values():
        assert "SecurityGroupIds" not in spec["node_config"]
        assert "NetworkInterfaces" not in spec["node_config"]


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda c: c["provider"]["security_group"]["IpPermissions"].append(
            {"IpProtocol": "tcp", "FromPort": 8265, "ToPort": 8265,
             "IpRanges": [{"CidrIp": "0.0.0.0/0"}]}), "only SSH"),
        (lambda c: c["available_node_types"]["ray.worker.datagen"]["node_config"].update(
            SecurityGroupIds=["sg-0123"]), "bypasses the managed security group"),
        (lambda c: c["available_node_types"]["ray.worker.datagen"]["resources"].pop(DATAGEN),
         "carry none of the labels"),
        (lambda c: c["available_node_types"]["ray.head.default"]["resources"].update(CPU=8),
         "CPU must be 0"),
        (lambda c: c["docker"]["run_options"].pop(), f"do not set {LABELS_ENV}"),
        (lambda c: c["provider"].update(aws_credentials={"aws_access_key_id": "x"}),
         "aws_credentials"),
        (lambda c: c["auth"].update(ssh_private_key="~/.ssh/id_rsa"), "ssh_private_key"),
        (lambda c: c["setup_commands"].append("export K=AKIAABCDEFGHIJKLMNOP"),
         "AWS access key"),
    ],
    ids=["dashboard-open", "own-sg", "missing-label", "head-cpu", "no-label-env",
         "credentials", "ssh-key", "key-shaped-string"],
)
def test_policy_catches_violations(raw_config, mutate, expected):
    broken = copy.deepcopy(raw_config)
    mutate(broken)
    problems = check_cluster_policy(broken)
    assert any(expected in p for p in problems), problems


def test_ray_aws_bootstrap_in_moto_opens_only_ssh_and_detects_the_gpu():
    """Ray's real `ray up` bootstrap code against moto's in-memory AWS (nothing leaves here)."""
    pytest.importorskip("moto")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    out = subprocess.run([sys.executable, "-m", "tools.cluster", "aws-dry-run",
                          str(CLUSTER_YAML)], capture_output=True, text=True, timeout=180,
                         env=env, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    (group,) = result["security_group"]
    assert group["name"] == "spice-ray-sg"
    assert world_open_ports(group["ingress"]) == [("tcp", 22, 22)]
    # Every other rule admits only members of the cluster's own group.
    others = [r for r in group["ingress"] if not r.get("IpRanges") and not r.get("Ipv6Ranges")]
    assert all(p["GroupId"] == group["id"] for r in others for p in r["UserIdGroupPairs"])
    types = result["node_types"]
    assert all(t["security_group_ids"] == [group["id"]] for t in types.values())
    assert types["ray.head.default"]["resources"] == {"CPU": 0, HEAD: 1}
    assert types["ray.worker.datagen"]["resources"]["CPU"] == 16
    assert "GPU" not in types["ray.worker.datagen"]["resources"]
    trainer = types["ray.worker.trainer"]["resources"]
    assert (trainer["GPU"], trainer[TRAINER]) == (1, 1)


def test_local_stand_in_mirrors_the_aws_node_types(raw_config, caplog):
    """cluster.local.yaml: same node types and labels, fake_multinode provider, Ray's schema."""
    with caplog.at_level(logging.WARNING, logger="tools.cluster"):
        local = validate_cluster_config(LOCAL_YAML)  # schema only: fake defaults not shipped
    assert "prepare_config could not run here (FileNotFoundError" in caplog.text
    assert local["provider"]["type"] == "fake_multinode"
    assert local["head_node_type"] == raw_config["head_node_type"]
    labels = set(resource_labels())

    def label_map(cfg):
        return {name: labels & set(spec["resources"])
                for name, spec in cfg["available_node_types"].items()}

    assert label_map(local) == label_map(raw_config)
    head = local["available_node_types"][local["head_node_type"]]["resources"]
    assert head == {"CPU": 0, HEAD: 1}


# ---- placement by label ------------------------------------------------------------------------


def test_placement_requests_a_label_only_when_the_cluster_has_it():
    laptop = {"CPU": 8.0, "memory": 1e9}
    cluster = {"CPU": 40.0, "GPU": 2.0, DATAGEN: 1.0, TRAINER: 2.0}
    for kind in resource_labels():
        assert placement_resources(kind, laptop, environ={}) == {}
    assert placement_resources(DATAGEN, cluster, environ={}) == {DATAGEN: LABEL_REQUEST}
    assert placement_resources(TRAINER, cluster, environ={}) == {TRAINER: LABEL_REQUEST}
    assert placement_resources(HEAD, cluster, environ={}) == {}


def test_declared_labels_count_before_any_such_node_is_up():
    only_head = {"CPU": 0.0, HEAD: 1.0}
    env = {LABELS_ENV: "head, datagen,trainer"}
    assert declared_labels(env) == {HEAD, DATAGEN, TRAINER}
    assert placement_resources(TRAINER, only_head, environ=env) == {TRAINER: LABEL_REQUEST}
    assert placement_resources(TRAINER, only_head, environ={}) == {}


def test_placement_rejects_unknown_kinds_and_needs_ray_or_resources(monkeypatch):
    with pytest.raises(ValueError, match="unknown placement kind 'gpu'"):
        placement_resources("gpu", {})
    import ray

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    with pytest.raises(RuntimeError, match=r"needs ray\.init\(\) first"):
        placement_resources(DATAGEN, environ={})


# ---- a real multi-node cluster on this machine -------------------------------------------------


def test_a_cluster_whose_node_misses_its_start_is_started_again_from_scratch(caplog) -> None:
    """On a loaded machine a node's ``ray start`` can miss Ray's fixed 30 s raylet wait: the
    whole try is torn down (its temp dir removed) and the cluster started again; after the
    last try the node's own error is raised. (No node process is started here: the launchers'
    start is a stand-in that fails as a timed-out ``ray start`` does.)"""
    if ray_cli() is None:
        pytest.skip("no `ray` executable in this environment")
    made: list[_Launcher] = []

    def make() -> _Launcher:
        made.append(_Launcher(False, 100 * 1024**2, 1.0))
        return made[-1]

    def fails_once(launcher: _Launcher) -> None:
        if len(made) == 1:
            raise TimeoutError("`ray start` not ready in time; log ...")

    with caplog.at_level(logging.WARNING, logger="tools.local_cluster"):
        got = started(make, fails_once, grace_s=0.1, keep_temp=False)
    assert got is made[1] and len(made) == 2
    assert not Path(made[0].cluster.temp_dir).exists() and Path(got.cluster.temp_dir).exists()
    assert (f"local cluster start 1 of {START_TRIES} failed (`ray start` not ready in time"
            in caplog.text)
    made.clear()
    with pytest.raises(RuntimeError, match="exited with 1"):
        started(make, lambda launcher: (_ for _ in ()).throw(RuntimeError("exited with 1")),
                grace_s=0.1, keep_temp=False)
    assert len(made) == START_TRIES  # every try, each torn down
    assert not any(Path(m.cluster.temp_dir).exists() for m in made)
    import shutil

    shutil.rmtree(got.cluster.temp_dir, ignore_errors=True)


def _ray_start_runnable() -> str | None:
    """None when `ray start` can run here, else the reason it cannot."""
    exe = ray_cli()
    if exe is None:
        return "no `ray` executable in this environment"
    try:
        out = subprocess.run([exe, "start", "--help"], capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"`ray start --help` failed: {exc}"
    return None if out.returncode == 0 else f"`ray start --help` exited {out.returncode}"


# Run in a child process that joins the cluster: which node ran which actor class and task.
_ACTOR_NODES = """
import json, ray
from ray.util.state import list_actors, list_nodes, list_tasks
ray.init(address="auto", logging_level="ERROR")
nodes = {n.node_id: n.resources_total for n in list_nodes(detail=True)}
out, tasks = {}, {}
for a in list_actors(detail=True, limit=10_000):
    if a.node_id:  # actors that never got a node have none
        out.setdefault(a.class_name, set()).add(a.node_id)
for t in list_tasks(detail=True, limit=10_000):
    if t.node_id:
        tasks.setdefault(t.name, set()).add(t.node_id)
print(json.dumps({"actors": {k: sorted(v) for k, v in out.items()},
                  "tasks": {k: sorted(v) for k, v in tasks.items()},
                  "labels": {nid: [k for k in r if k in ("datagen", "trainer")]
                             for nid, r in nodes.items()}}))
"""


@pytest.mark.ray
def test_local_multinode_cluster_places_work_by_label_and_runs_the_study(tmp_path):
    """One local 2-node cluster (``ray start`` head + worker) serves both checks: labelled
    tasks run where their label is advertised, and pipelines/full_run.py joins it with
    --address auto and spreads its work over the nodes by the labels of cluster.yaml; then
    teardown stops every process of the cluster and nothing else."""
    reason = _ray_start_runnable()
    if reason:
        pytest.skip(reason)
    # A process `ray stop` would kill (it matches "default_worker.py" in command lines):
    # stands in for other engineers' Ray sessions on this machine.
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)",
                                  "default_worker.py"])
    t0 = time.perf_counter()
    try:
        with local_multinode_cluster(num_workers=1, head_cpus=2, worker_cpus=2,
                                     include_dashboard=True) as cluster:
            t_up = time.perf_counter() - t0
            # both probes at once (two drivers on the cluster): No node advertises "head"
            # here, so the second must end in a clear timeout, not a hang
            probes = [subprocess.Popen(
                [sys.executable, "-m", "tools.cluster", "node-usage", "--address", "auto",
                 *args], env=cluster.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                text=True, cwd=ROOT) for args in (["--tasks", "3", "--timeout", "60"],
                                                  ["--labels", HEAD, "--tasks", "1",
                                                   "--timeout", "3"])]
            (out, err), (_, missing_err) = (p.communicate(timeout=120) for p in probes)
            assert probes[0].returncode == 0, f"{err[-3000:]}\n{cluster.logs()}"
            report = json.loads(out.strip().splitlines()[-1])
            assert probes[1].returncode != 0
            assert "tasks requiring ['head'] did not finish in 3.0 s" in missing_err
            study = subprocess.run(
                [sys.executable, str(ROOT / "pipelines" / "full_run.py"), "--preset", "smoke",
                 "--address", "auto", "--out", str(tmp_path / "run"), "--experiments",
                 "darkroom_dpt_star", "--set", "train.num_workers=1", "--set",
                 "data.ray_data_min_tasks=0"],  # Ray Data even at smoke size
                env=cluster.env(), capture_output=True, text=True, timeout=600, cwd=ROOT)
            assert study.returncode == 0, study.stderr[-4000:]
            assert "report:" in study.stdout
            probe = subprocess.run([sys.executable, "-c", _ACTOR_NODES], env=cluster.env(),
                                   capture_output=True, text=True, timeout=120, cwd=ROOT)
            assert probe.returncode == 0, probe.stderr[-3000:]
            temp_dir = cluster.temp_dir
            roots = [p.pid for p in cluster.processes]
            ours = _cluster_pids(roots, roots, temp_dir)  # raylets, GCS, agents, workers
            t_work = time.perf_counter() - t0 - t_up
        t_total = time.perf_counter() - t0
        usage, nodes = report["usage"], report["labelled_nodes"]
        # One datagen node (the head) and one trainer node (the worker), distinct,
        # and each label's tasks ran exactly where that label is advertised.
        assert len(nodes[DATAGEN]) == 1 and len(nodes[TRAINER]) == 1, nodes
        assert usage[DATAGEN] == nodes[DATAGEN]
        assert usage[TRAINER] == nodes[TRAINER]
        assert usage[DATAGEN] != usage[TRAINER]
        # The study's work: Ray Data's generation on the datagen node, Train's workers on
        # the trainer node, both nodes used.
        info = json.loads(probe.stdout.strip().splitlines()[-1])
        by_label = {label: [nid for nid, ls in info["labels"].items() if label in ls]
                    for label in (DATAGEN, TRAINER)}
        assert len(by_label[DATAGEN]) == 1 and len(by_label[TRAINER]) == 1
        actors, tasks = info["actors"], info["tasks"]
        gen = [k for k in tasks if "generate_batch" in k]  # Ray Data's generation tasks
        assert gen and all(set(tasks[k]) == set(by_label[DATAGEN]) for k in gen), tasks
        assert set(actors["RayTrainWorker"]) == set(by_label[TRAINER]), actors
        assert len({nid for nids in actors.values() for nid in nids}) == 2
        assert (tmp_path / "run" / "report.md").exists()
        # placement_resources() against the live cluster: labels present -> requested.
        assert report["placement"] == {HEAD: {}, DATAGEN: {DATAGEN: LABEL_REQUEST},
                                       TRAINER: {TRAINER: LABEL_REQUEST}}
        # Teardown stopped every process of this cluster and nothing else.
        assert len(ours) >= 8, ours  # two `ray start`s, GCS, two raylets, agents, ...
        assert not _alive(ours), _alive(ours)
        assert not [pid for pid, (_, _, cmd) in _proc_table().items() if temp_dir in cmd]
        assert not Path(temp_dir).exists()
        assert bystander.poll() is None, "teardown killed an unrelated process"
        print(f"\nlocal 2-node cluster: up {t_up:.1f} s, tasks {t_work:.1f} s, "
              f"total with teardown {t_total:.1f} s")
    finally:
        bystander.kill()
        bystander.wait()


@pytest.mark.ray
def test_autoscaler_launches_the_node_type_a_label_asks_for():
    """Ray's autoscaler on cluster.local.yaml: a head alone; label requests add the right type."""
    reason = _ray_start_runnable()
    if reason:
        pytest.skip(reason)
    t0 = time.perf_counter()
    with local_autoscaling_cluster(LOCAL_YAML) as cluster:
        t_up = time.perf_counter() - t0
        out = subprocess.run(
            [sys.executable, "-m", "tools.cluster", "node-usage", "--address", "auto",
             "--tasks", "2", "--timeout", "120"],
            env=cluster.env(), capture_output=True, text=True, timeout=180, cwd=ROOT)
        assert out.returncode == 0, f"{out.stderr[-3000:]}\n{cluster.logs()}"
        report = json.loads(out.stdout.strip().splitlines()[-1])
        monitor_log = cluster.logs(tail=20000)
        roots = [p.pid for p in cluster.processes]
        ours = _cluster_pids(roots, roots, cluster.temp_dir)
        t_work = time.perf_counter() - t0 - t_up
    usage, nodes = report["usage"], report["labelled_nodes"]
    # The head (label "head") started alone; one node of each worker type was added for the
    # label its tasks requested, and those tasks ran there.
    assert len(nodes[HEAD]) == len(nodes[DATAGEN]) == len(nodes[TRAINER]) == 1, nodes
    assert usage[DATAGEN] == nodes[DATAGEN] and usage[TRAINER] == nodes[TRAINER]
    assert len({nodes[HEAD][0], nodes[DATAGEN][0], nodes[TRAINER][0]}) == 3
    for node_type in ("ray.worker.datagen", "ray.worker.trainer"):  # either log wording
        assert re.search(rf"(Adding 1 node\(s\) of type|Launching 1 nodes, type) "
                         rf"{re.escape(node_type)}", monitor_log), node_type
    # With only the head up, placement_resources() already asked for the worker labels,
    # because the cluster declares them (LABELS_ENV): what lets the autoscaler pick the type.
    assert report["placement"] == {HEAD: {HEAD: LABEL_REQUEST},
                                   DATAGEN: {DATAGEN: LABEL_REQUEST},
                                   TRAINER: {TRAINER: LABEL_REQUEST}}
    assert not _alive(ours), _alive(ours)
    print(f"\nautoscaling local cluster: head up {t_up:.1f} s, scale-up + tasks {t_work:.1f} s,"
          f" total with teardown {time.perf_counter() - t0:.1f} s")
