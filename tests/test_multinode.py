"""pipelines/full_run.py joins a local 2-node cluster (``ray start`` head + worker) with
--address auto, and its work is spread over the nodes by the labels of cluster.yaml."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from spice_ray.common.placement import DATAGEN, TRAINER
from tools.local_cluster import local_multinode_cluster, ray_cli

ROOT = Path(__file__).resolve().parents[1]

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
def test_full_run_on_a_local_two_node_cluster(tmp_path) -> None:
    if ray_cli() is None:
        pytest.skip("no `ray` executable in this environment")
    with local_multinode_cluster(num_workers=1, head_cpus=2, worker_cpus=2,
                                 include_dashboard=True) as cluster:
        run = subprocess.run(
            [sys.executable, str(ROOT / "pipelines" / "full_run.py"), "--preset", "smoke",
             "--address", "auto", "--out", str(tmp_path / "run"), "--experiments", "bandit",
             "--set", "train.num_workers=1"],
            env=cluster.env(), capture_output=True, text=True, timeout=600, cwd=ROOT)
        assert run.returncode == 0, run.stderr[-4000:]
        assert "report:" in run.stdout
        probe = subprocess.run([sys.executable, "-c", _ACTOR_NODES], env=cluster.env(),
                               capture_output=True, text=True, timeout=120, cwd=ROOT)
        assert probe.returncode == 0, probe.stderr[-3000:]
    info = json.loads(probe.stdout.strip().splitlines()[-1])
    by_label = {label: [nid for nid, ls in info["labels"].items() if label in ls]
                for label in (DATAGEN, TRAINER)}
    assert len(by_label[DATAGEN]) == 1 and len(by_label[TRAINER]) == 1
    actors, tasks = info["actors"], info["tasks"]
    gen = [k for k in tasks if "generate_batch" in k]  # Ray Data's generation tasks
    assert gen and all(set(tasks[k]) == set(by_label[DATAGEN]) for k in gen), tasks
    assert set(actors["RayTrainWorker"]) == set(by_label[TRAINER]), actors
    used = {nid for nids in actors.values() for nid in nids}
    assert len(used) == 2  # work landed on both nodes
    assert (tmp_path / "run" / "report.md").exists()
