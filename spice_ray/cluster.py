"""Cluster helpers: place work by resource label, check launcher configs, local multi-node Ray.

The AWS launcher file (``cluster.yaml``) tags each node type with one custom resource, a
*label*: ``head`` on the head node, ``datagen`` on the CPU nodes that generate datasets,
``trainer`` on the GPU nodes that train and evaluate. Code asks for a label through
:func:`placement_resources`, which returns a tiny request (``{"datagen": 0.001}``) only when
the cluster can provide that label, so the same code runs on a laptop (no labels, no
requirement) and on the cluster (work lands on the right node type)::

    ds.map_batches(fn, resources=placement_resources(DATAGEN), ...)
    ScalingConfig(use_gpu=True, resources_per_worker={"GPU": 1, **placement_resources(TRAINER)})

A label is a *selector*, not a concurrency limit: a node advertises 1 unit and each request
takes 0.001, so up to 1000 tasks/actors can hold it at once; CPU/GPU still bound concurrency.

Also here: :func:`validate_cluster_config` (Ray's own schema, offline),
:func:`check_cluster_policy` (this project's rules for its launcher file),
:func:`simulate_aws_bootstrap` (Ray's AWS bootstrap against moto's in-memory AWS),
:func:`node_usage` (which nodes ran labelled work), :func:`local_multinode_cluster`
(``ray start`` head + worker processes on one machine, torn down without ``ray stop``) and
:func:`local_autoscaling_cluster` (a head whose autoscaler adds nodes from
``cluster.local.yaml``). Guide: ``docs/cluster.md``.

Command line: ``python -m spice_ray.cluster {validate,aws-dry-run,node-usage,local} ...``.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from spice_ray.config import load_yaml

log = logging.getLogger(__name__)

HEAD = "head"
"""Label of the head node: drivers and zero-CPU coordinator actors only."""
DATAGEN = "datagen"
"""Label of the CPU worker nodes that run Ray Data dataset generation."""
TRAINER = "trainer"
"""Label of the GPU worker nodes that run Ray Train workers and GPU evaluation actors."""

LABEL_REQUEST = 0.001
"""Amount of a label one task/actor requests: a selector, not a limit (a node offers 1)."""

LABELS_ENV = "SPICE_RAY_CLUSTER_LABELS"
"""Comma-separated labels the cluster can provide even before such a node is up.

``cluster.yaml`` sets it in every container (docker ``run_options``), so that a driver on an
autoscaling cluster that has only its head running still asks for ``datagen``/``trainer`` and
the autoscaler launches that node type (``ray.cluster_resources()`` alone would show no label
yet, and unlabelled CPU work could scale up GPU nodes instead).
"""

_READY_LINE = "Ray runtime started"
# Runs `ray start` with PR_SET_PDEATHSIG=SIGTERM (Linux): if the process (strictly: the
# thread) that started the cluster dies without tearing it down (a killed pytest), each
# `ray start` gets SIGTERM and stops its node instead of running on forever.
_PDEATHSIG_SHIM = (
    "import ctypes, os, signal, sys\n"
    "ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    sys.exit('parent already gone')\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)
_AWS_KEY_RE = re.compile(r"\b(AKIA|ASIA)[0-9A-Z]{16}\b")


def resource_labels() -> tuple[str, ...]:
    """The label names used in ``cluster.yaml``: ``("head", "datagen", "trainer")``."""
    return (HEAD, DATAGEN, TRAINER)


def declared_labels(environ: Mapping[str, str] | None = None) -> frozenset[str]:
    """Labels declared through :data:`LABELS_ENV` (empty when unset)."""
    raw = (os.environ if environ is None else environ).get(LABELS_ENV, "")
    return frozenset(part.strip() for part in raw.split(",") if part.strip())


def placement_resources(
    kind: str,
    cluster_resources: Mapping[str, float] | None = None,
    environ: Mapping[str, str] | None = None,
) -> dict[str, float]:
    """Custom-resource request that places work of ``kind`` on its node type, when there is one.

    Args:
        kind: one of :func:`resource_labels` (``"head"``, ``"datagen"``, ``"trainer"``).
        cluster_resources: the cluster's resources; default ``ray.cluster_resources()``
            (Ray must then be initialised).
        environ: environment to read :data:`LABELS_ENV` from; default ``os.environ``.

    Returns:
        ``{kind: 0.001}`` if the cluster has that resource or declares it through
        :data:`LABELS_ENV`, else ``{}`` (a laptop or a plain local cluster: no requirement).

    Raises:
        ValueError: ``kind`` is not a known label.
        RuntimeError: ``cluster_resources`` is omitted and Ray is not initialised.
    """
    if kind not in resource_labels():
        raise ValueError(f"unknown placement kind {kind!r}: one of {', '.join(resource_labels())}")
    if kind in declared_labels(environ):
        return {kind: LABEL_REQUEST}
    if cluster_resources is None:
        import ray

        if not ray.is_initialized():
            raise RuntimeError("placement_resources() needs ray.init() first "
                               "(or pass cluster_resources=...)")
        cluster_resources = ray.cluster_resources()
    return {kind: LABEL_REQUEST} if cluster_resources.get(kind, 0) > 0 else {}


# ---- launcher config: Ray's schema and this project's policy ---------------------------------


class ClusterConfigError(ValueError):
    """A cluster launcher file is not valid YAML, fails Ray's schema, or breaks project policy."""


def _load_yaml(path: str | Path) -> dict[str, Any]:
    return load_yaml(path, error=ClusterConfigError, allow_empty=False)


def ray_schema() -> dict[str, Any]:
    """Ray's cluster-launcher JSON schema, as shipped in the installed wheel."""
    import ray.autoscaler

    return json.loads((Path(ray.autoscaler.__file__).parent / "ray-schema.json").read_text())


def _schema_check(config: Mapping[str, Any], where: str) -> None:
    import jsonschema

    try:
        jsonschema.validate(config, ray_schema())
    except jsonschema.ValidationError as exc:
        at = "/".join(str(p) for p in exc.absolute_path) or "(top level)"
        raise ClusterConfigError(f"{where}: {at}: {exc.message}") from None


def validate_cluster_config(path: str | Path) -> dict[str, Any]:
    """Load a Ray cluster-launcher YAML and validate it with Ray's own code, offline.

    Steps: (1) the raw file against ``ray/autoscaler/ray-schema.json`` (jsonschema, a Ray
    dependency), so typos and wrong types are reported as written; (2) Ray's private
    ``ray.autoscaler._private.util.prepare_config`` (merges the provider's ``defaults.yaml``,
    merges setup commands, fills per-type min/max workers) then ``validate_config`` (the schema
    again plus Ray's own checks) on the result. Step 2 reads only files in the Ray wheel for
    the ``aws`` provider: it needs no AWS credentials, network or boto3 (checked with boto3
    blocked). If it cannot run here (``ImportError``: a provider whose defaults need its SDK, or
    a Ray release that moved these private helpers; ``OSError``: a defaults file the wheel
    does not ship, as for ``fake_multinode`` in Ray 2.60), the raw file has still passed step 1
    against Ray's schema; that fallback is logged and the raw config is returned.

    Args:
        path: the YAML file.

    Returns:
        The prepared config (defaults filled), or the raw config on the fallback path.

    Raises:
        ClusterConfigError: unreadable/invalid YAML, or a schema/validation failure, with the
            file, the key path (``available_node_types/ray.worker.x/resources/GPU``) and Ray's
            message.
    """
    raw = _load_yaml(path)
    _schema_check(raw, str(path))
    import jsonschema

    try:
        from ray.autoscaler._private.util import prepare_config, validate_config

        prepared = prepare_config(copy.deepcopy(raw))
    except (ImportError, OSError) as exc:
        log.warning("%s: Ray's prepare_config could not run here (%s: %s); validated against "
                    "ray-schema.json only", path, type(exc).__name__, exc)
        return raw
    except (KeyError, TypeError, AttributeError, AssertionError, NotImplementedError,
            ValueError) as exc:
        raise ClusterConfigError(f"{path}: Ray's prepare_config rejected it: "
                                 f"{type(exc).__name__}: {exc}") from exc
    try:
        validate_config(prepared)
    except ImportError as exc:  # jsonschema missing: step 1 could not have run either
        raise ClusterConfigError(f"{path}: cannot validate: {exc}") from exc
    except (jsonschema.ValidationError, RuntimeError, ValueError) as exc:
        msg = getattr(exc, "message", None) or str(exc)
        at = "/".join(str(p) for p in getattr(exc, "absolute_path", ())) or "(top level)"
        raise ClusterConfigError(f"{path} (after Ray's defaults): {at}: {msg}") from None
    return prepared


def _strings(obj: Any) -> Iterator[str]:
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, Mapping):
        for k, v in obj.items():
            yield str(k)
            yield from _strings(v)
    elif isinstance(obj, list | tuple):
        for v in obj:
            yield from _strings(v)


def _declared_in_docker(config: Mapping[str, Any]) -> frozenset[str] | None:
    opts = (config.get("docker") or {}).get("run_options") or []
    pattern = re.compile(rf"(?:-e|--env)[ =]{LABELS_ENV}=([\w,\-]*)")
    for opt in opts:
        m = pattern.search(str(opt))
        if m:
            return frozenset(p for p in m.group(1).split(",") if p)
    return None


def check_cluster_policy(config: Mapping[str, Any]) -> list[str]:
    """This project's rules for its launcher file, beyond Ray's schema. Empty list: all good.

    Rules: every node type carries one of :func:`resource_labels`; the head type carries
    ``head`` and ``CPU: 0``, no other type carries ``head``; ``datagen`` and ``trainer`` each
    exist; the labels declared to containers (:data:`LABELS_ENV` in docker ``run_options``) are
    exactly the labels of the node types; the security group adds no inbound rule other than
    TCP 22 (Ray's managed group then has SSH plus intra-cluster traffic only) and no node type
    bypasses it with its own ``SecurityGroupIds``/``NetworkInterfaces``; no credentials
    (``aws_credentials``, ``ssh_private_key``, access-key-shaped strings).

    Args:
        config: a raw or prepared launcher config.

    Returns:
        One human-readable line per violation.
    """
    problems: list[str] = []
    labels = set(resource_labels())
    node_types = config.get("available_node_types") or {}
    head_type = config.get("head_node_type")
    if head_type not in node_types:
        problems.append(f"head_node_type {head_type!r} is not in available_node_types")
    offered: set[str] = set()
    for name, spec in node_types.items():
        res = spec.get("resources") or {}
        mine = labels & set(res)
        offered |= mine
        if not mine:
            problems.append(f"node type {name}: resources {res} carry none of the labels "
                            f"{sorted(labels)}")
        if name == head_type:
            if HEAD not in res:
                problems.append(f"head node type {name}: resources lack the {HEAD!r} label")
            if res.get("CPU") != 0:
                problems.append(f"head node type {name}: CPU must be 0 so no task lands on "
                                f"the head, got {res.get('CPU')!r}")
        elif HEAD in res:
            problems.append(f"worker node type {name}: carries the {HEAD!r} label")
        node_config = spec.get("node_config") or {}
        for key in ("SecurityGroupIds", "NetworkInterfaces"):
            if key in node_config:
                problems.append(f"node type {name}: node_config.{key} bypasses the managed "
                                "security group; its rules cannot be checked from this file")
    for needed in (DATAGEN, TRAINER):
        if needed not in offered:
            problems.append(f"no node type offers the {needed!r} label")
    declared = _declared_in_docker(config)
    if declared is None:
        problems.append(f"docker run_options do not set {LABELS_ENV}: an autoscaling cluster "
                        "with only its head up would request no label")
    elif declared != offered:
        problems.append(f"{LABELS_ENV} declares {sorted(declared)} but the node types offer "
                        f"{sorted(offered)}")
    sg = (config.get("provider") or {}).get("security_group") or {}
    for rule in sg.get("IpPermissions") or []:
        ports = (rule.get("IpProtocol"), rule.get("FromPort"), rule.get("ToPort"))
        if ports != ("tcp", 22, 22):
            problems.append(f"provider.security_group.IpPermissions opens {ports} "
                            "(protocol, from, to): only SSH (tcp 22) may be open")
    if "aws_credentials" in (config.get("provider") or {}):
        problems.append("provider.aws_credentials holds credentials: use the local AWS profile")
    if "ssh_private_key" in (config.get("auth") or {}):
        problems.append("auth.ssh_private_key names a private key: let Ray create its key pair")
    for s in _strings(config):
        if _AWS_KEY_RE.search(s):
            problems.append("a value looks like an AWS access key id")
            break
    return problems


def simulate_aws_bootstrap(path: str | Path) -> dict[str, Any]:
    """Run Ray's AWS bootstrap for a launcher file against moto's in-memory AWS (offline).

    Exercises Ray's real code path for ``ray up`` short of launching instances:
    ``bootstrap_aws`` (IAM role, key pair, subnets, security group with its inbound rules) and
    ``fillout_available_node_types_resources`` (CPU/GPU/memory detected from the instance
    type catalogue, merged with the labels). Nothing reaches AWS: moto intercepts botocore,
    the credentials are moto's dummy ``testing`` values, ``HOME`` points to a temporary
    directory (Ray writes its generated key pair under ``~/.ssh``) and Ray's IAM-propagation
    sleep is skipped. What moto cannot show: the AMI (``resolve:ssm:``), quotas, capacity,
    docker pulls and the setup commands. Needs the ``moto`` package; run it in a throwaway
    process (the CLI ``aws-dry-run`` does), since it patches the environment while it runs.

    Args:
        path: the launcher YAML (validated first with :func:`validate_cluster_config`).

    Returns:
        ``{"security_group": [{name, id, ingress}], "node_types": {name: {resources,
        instance_type, security_group_ids}}}``: every group the node types use, with its
        inbound rules as AWS reports them, and each node type's resources after detection.
    """
    from unittest import mock

    prepared = validate_cluster_config(path)
    with tempfile.TemporaryDirectory(prefix="srdry-") as home, mock.patch.dict(os.environ, {
        "HOME": home, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing", "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull, "MOTO_IAM_LOAD_MANAGED_POLICIES": "true",
        "AWS_DEFAULT_REGION": prepared["provider"]["region"],
    }):
        for var in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_ENDPOINT_URL"):
            os.environ.pop(var, None)  # restored with the rest when the patch ends
        from moto import mock_aws

        with mock_aws(), mock.patch("time.sleep"):
            import boto3
            from ray.autoscaler._private.aws.config import bootstrap_aws
            from ray.autoscaler._private.aws.node_provider import AWSNodeProvider

            booted = bootstrap_aws(prepared)
            filled = AWSNodeProvider.fillout_available_node_types_resources(booted)
            ec2 = boto3.client("ec2", region_name=prepared["provider"]["region"])
            group_ids = sorted({g for spec in booted["available_node_types"].values()
                                for g in spec["node_config"].get("SecurityGroupIds", [])})
            groups = ec2.describe_security_groups(GroupIds=group_ids)["SecurityGroups"]
    return {
        "security_group": [{"name": g["GroupName"], "id": g["GroupId"],
                            "ingress": g["IpPermissions"]} for g in groups],
        "node_types": {
            name: {"resources": spec["resources"],
                   "instance_type": spec["node_config"]["InstanceType"],
                   "security_group_ids": booted["available_node_types"][name]["node_config"]
                   .get("SecurityGroupIds", [])}
            for name, spec in filled["available_node_types"].items()
        },
    }


def world_open_ports(ingress: Sequence[Mapping[str, Any]]) -> list[tuple[str, int, int]]:
    """(protocol, from, to) of every inbound rule open to 0.0.0.0/0 or ::/0."""
    out = []
    for rule in ingress:
        cidrs = [r.get("CidrIp") for r in rule.get("IpRanges", [])]
        cidrs += [r.get("CidrIpv6") for r in rule.get("Ipv6Ranges", [])]
        if "0.0.0.0/0" in cidrs or "::/0" in cidrs:
            out.append((rule.get("IpProtocol"), rule.get("FromPort", -1), rule.get("ToPort", -1)))
    return out


# ---- which nodes ran the work ----------------------------------------------------------------


def _node_id() -> str:
    """Runs remotely: the ID of the node executing it."""
    import ray

    return ray.get_runtime_context().get_node_id()


def labelled_nodes() -> dict[str, list[str]]:
    """For each label, the IDs of the alive nodes that advertise it (Ray must be initialised)."""
    import ray

    out: dict[str, list[str]] = {label: [] for label in resource_labels()}
    for node in ray.nodes():
        if node.get("Alive"):
            for label in resource_labels():
                if node.get("Resources", {}).get(label, 0) > 0:
                    out[label].append(node["NodeID"])
    return {k: sorted(v) for k, v in out.items()}


def node_usage(
    address: str | None = None,
    labels: Sequence[str] = (DATAGEN, TRAINER),
    tasks_per_label: int = 4,
    timeout_s: float = 60.0,
) -> dict[str, list[str]]:
    """Run small zero-CPU tasks that each require one label; report the nodes that ran them.

    Args:
        address: Ray address to join if Ray is not initialised yet (e.g. ``"auto"`` or
            ``"127.0.0.1:6379"``); joined without ``num_cpus`` and shut down afterwards.
            Ignored when Ray is already initialised.
        labels: labels to exercise; each task requests ``{label: LABEL_REQUEST}`` directly
            (not through :func:`placement_resources`), so a missing label is an error.
        tasks_per_label: tasks submitted per label.
        timeout_s: how long to wait for all tasks.

    Returns:
        ``{label: sorted unique node IDs that ran a task requiring it}``.

    Raises:
        TimeoutError: some tasks did not finish in time (typically: no alive node has the
            label and no autoscaler adds one), naming the labels still pending.
    """
    import ray

    joined = False
    if not ray.is_initialized():
        ray.init(address=address or "auto", log_to_driver=False, logging_level="ERROR")
        joined = True
    try:
        task = ray.remote(num_cpus=0)(_node_id)
        refs = {label: [task.options(resources={label: LABEL_REQUEST}).remote()
                        for _ in range(tasks_per_label)] for label in labels}
        every = [r for rs in refs.values() for r in rs]
        _, pending = ray.wait(every, num_returns=len(every), timeout=timeout_s)
        if pending:
            for ref in pending:  # do not leave demand behind for an autoscaler to chase
                ray.cancel(ref)
            late = sorted({label for label, rs in refs.items() if set(rs) & set(pending)})
            raise TimeoutError(f"tasks requiring {late} did not finish in {timeout_s} s: "
                               "does an alive node advertise those labels?")
        return {label: sorted(set(ray.get(rs))) for label, rs in refs.items()}
    finally:
        if joined:
            ray.shutdown()


# ---- a multi-node cluster on one machine -----------------------------------------------------


def ray_cli() -> str | None:
    """Path of the ``ray`` executable of this Python environment, or None."""
    beside = Path(sys.executable).parent / "ray"
    return str(beside) if beside.exists() else shutil.which("ray")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _proc_table() -> dict[int, tuple[int, int, str]]:
    """pid -> (ppid, pgid, cmdline) from /proc (Linux)."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()  # after "pid (comm) "
        if fields and fields[0] != "Z":
            table[int(entry)] = (int(fields[1]), int(fields[2]), cmd)
    return table


def _cluster_pids(roots: Sequence[int], pgids: Sequence[int], marker: str | None) -> set[int]:
    """Our processes: descendants of ``roots``, members of ``pgids``, cmdlines naming ``marker``.

    Ray's core workers start their own process groups (so a process-group kill misses them)
    and rename themselves (``ray::IDLE``); they are still children of our raylets.
    """
    table = _proc_table()
    mine = {pid for pid, (_, pgid, cmd) in table.items()
            if pgid in pgids or (marker is not None and marker in cmd)}
    mine |= {pid for pid in roots if pid in table}
    grew = True
    while grew:
        kids = {pid for pid, (ppid, _, _) in table.items() if ppid in mine} - mine
        mine |= kids
        grew = bool(kids)
    mine.discard(os.getpid())
    return mine


def _signal_all(pids: set[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _alive(pids: set[int]) -> set[int]:
    table = _proc_table()
    return {pid for pid in pids if pid in table}


@dataclass
class LocalCluster:
    """A running local cluster (see :func:`local_multinode_cluster`)."""

    address: str
    """GCS address ``127.0.0.1:<port>`` for ``ray.init(address=...)`` / ``--address``."""
    temp_dir: str
    """Ray's temp dir for every node of this cluster: sessions, logs and sockets."""
    dashboard_url: str | None = None
    """``http://127.0.0.1:<port>`` when started with the dashboard, for ``ray job submit``."""
    processes: list[subprocess.Popen] = field(default_factory=list)
    """The ``ray start --block`` processes, head first."""
    declared: tuple[str, ...] = ()
    """Labels the cluster's autoscaler can provide; :meth:`env` exports them."""

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """Environment for a child process that joins with ``address="auto"``/``--address auto``.

        ``RAY_ADDRESS`` wins over Ray's lookup of the last started cluster, so a driver joins
        this cluster and not another session's. On an autoscaling cluster :data:`LABELS_ENV`
        is set too, as ``cluster.yaml`` does for its containers.
        """
        env = dict(os.environ if base is None else base)
        env.update(RAY_ADDRESS=self.address, RAY_AUTH_MODE="disabled")
        if self.declared:
            env[LABELS_ENV] = ",".join(self.declared)
        return env

    def logs(self, tail: int = 4000) -> str:
        """The tails of the ``ray start`` logs and the autoscaler log (for failure messages)."""
        out = []
        files = sorted(Path(self.temp_dir).glob("ray-start-*.log"))
        files += sorted(Path(self.temp_dir).glob("session_latest/logs/monitor.log"))
        for p in files:
            out.append(f"--- {p.name}\n{p.read_text(errors='replace')[-tail:]}")
        return "\n".join(out)


def _wait_ready(proc: subprocess.Popen, logfile: Path, deadline: float) -> None:
    while time.monotonic() < deadline:
        text = logfile.read_text(errors="replace") if logfile.exists() else ""
        if _READY_LINE in text:
            return
        if proc.poll() is not None:
            raise RuntimeError(f"`ray start` exited with {proc.returncode}:\n{text[-4000:]}")
        time.sleep(0.25)
    raise TimeoutError(f"`ray start` not ready in time; log {logfile}:\n"
                       f"{logfile.read_text(errors='replace')[-4000:]}")


def _node_args(resources: Mapping[str, float]) -> list[str]:
    """``ray start`` flags for a node's resources (CPU and GPU have their own flags)."""
    res = {k: int(v) if float(v).is_integer() else v for k, v in resources.items()}
    args = [f"--num-cpus={res.pop('CPU', 0)}"]  # ray start takes whole CPUs and GPUs
    if "GPU" in res:
        args.append(f"--num-gpus={res.pop('GPU')}")
    if res:
        args.append(f"--resources={json.dumps(res)}")
    return args


class _Launcher:
    """Starts ``ray start --block`` nodes for one :class:`LocalCluster`."""

    def __init__(self, include_dashboard: bool, object_store_bytes: int, timeout_s: float,
                 extra_env: Mapping[str, str] | None = None) -> None:
        self.ray_exe = ray_cli()
        if self.ray_exe is None:
            raise FileNotFoundError("no `ray` executable beside this Python or on PATH")
        # Short path: Ray's Unix sockets live under it and AF_UNIX paths are limited to 107 B.
        temp_dir = tempfile.mkdtemp(prefix="srmn-", dir="/tmp")
        self.env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        self.env.update(RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0",
                        **(extra_env or {}))
        self.port = _free_port()
        self.dash_port = _free_port()
        self.include_dashboard = include_dashboard
        self.timeout_s = timeout_s
        self.common = ["--block", "--node-ip-address=127.0.0.1", f"--temp-dir={temp_dir}",
                       "--disable-usage-stats", f"--object-store-memory={object_store_bytes}"]
        self.cluster = LocalCluster(
            address=f"127.0.0.1:{self.port}", temp_dir=temp_dir,
            dashboard_url=f"http://127.0.0.1:{self.dash_port}" if include_dashboard else None)

    def start(self, name: str, args: list[str]) -> None:
        logfile = Path(self.cluster.temp_dir) / f"ray-start-{name}.log"
        with open(logfile, "wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-c", _PDEATHSIG_SHIM, str(os.getpid()), self.ray_exe,
                 "start", *args, *self.common, f"--dashboard-agent-listen-port={_free_port()}"],
                env=self.env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, cwd=self.cluster.temp_dir)
        self.cluster.processes.append(proc)
        _wait_ready(proc, logfile, time.monotonic() + self.timeout_s)

    def start_head(self, resources: Mapping[str, float], extra: Sequence[str] = ()) -> None:
        self.start("0-head", ["--head", f"--port={self.port}", *_node_args(resources),
                              f"--include-dashboard={str(self.include_dashboard).lower()}",
                              f"--dashboard-port={self.dash_port}",
                              f"--ray-client-server-port={_free_port()}", *extra])


@contextlib.contextmanager
def local_multinode_cluster(
    num_workers: int = 1,
    *,
    head_cpus: float = 1,
    worker_cpus: float = 1,
    head_resources: Mapping[str, float] | None = None,
    worker_resources: Mapping[str, float] | Sequence[Mapping[str, float]] | None = None,
    include_dashboard: bool = False,
    object_store_bytes: int = 200 * 1024**2,
    start_timeout_s: float = 90.0,
    stop_grace_s: float = 5.0,
    keep_temp: bool = False,
) -> Iterator[LocalCluster]:
    """A Ray cluster of one head and ``num_workers`` worker nodes as ``ray start`` processes.

    Linux only (it reads ``/proc``). Each node is a ``ray start --block`` subprocess in its own
    session (process group), bound to this process by ``PR_SET_PDEATHSIG``, all on
    127.0.0.1 with a private ``--temp-dir`` and free ports (GCS, client server, dashboard,
    dashboard agent), with ``RAY_AUTH_MODE=disabled``. The ``with`` body gets a
    :class:`LocalCluster`; join it from a *child process* (``cluster.env()`` sets
    ``RAY_ADDRESS``) rather than the calling process, which may already hold another Ray.

    Teardown never runs ``ray stop``: that command kills every Ray process on the machine whose
    name or command line matches (raylet, gcs_server, default_worker.py, ...), including other
    users' clusters. Instead it sends SIGTERM to this cluster's ``ray start`` processes (each
    stops its own node), then to what is left of this cluster, and finally SIGKILL: "this
    cluster" being the ``ray start`` process groups, all their descendants (Ray's workers start
    their own process groups but stay children of our raylets) and anything naming its temp dir.

    Args:
        num_workers: worker nodes besides the head.
        head_cpus / worker_cpus: ``--num-cpus`` (whole, logical) of the head / of each
            worker. Use 2 for ``pipelines/full_run.py``: with 1 per node, its 0.5-CPU
            generation actors leave half a CPU free on each node and Ray Data's 1-CPU
            read/write tasks can never be placed (seen: the smoke run stalls).
        head_resources: custom resources of the head; default ``{"datagen": 1}``.
        worker_resources: one mapping for every worker, or one per worker; default
            ``{"trainer": 1}``. A ``"GPU"`` entry becomes ``--num-gpus`` (advertised only).
        include_dashboard: start the dashboard (needed for ``ray job submit`` and the State
            API used by Ray Train's placement-group cleaner); costs CPU on small machines.
        object_store_bytes: ``--object-store-memory`` per node (small: nodes share one host).
        start_timeout_s: limit for every node to report "Ray runtime started".
        stop_grace_s: SIGTERM-to-SIGKILL grace at teardown.
        keep_temp: keep the temp dir (logs) after teardown.

    Yields:
        The running :class:`LocalCluster`.

    Raises:
        FileNotFoundError: no ``ray`` executable in this environment.
        RuntimeError / TimeoutError: a node failed to start (with its log).
    """
    head_res = dict({DATAGEN: 1} if head_resources is None else head_resources)
    if worker_resources is None:
        per_worker = [{TRAINER: 1}] * num_workers
    elif isinstance(worker_resources, Mapping):
        per_worker = [dict(worker_resources)] * num_workers
    else:
        per_worker = [dict(r) for r in worker_resources]
        if len(per_worker) != num_workers:
            raise ValueError(f"worker_resources has {len(per_worker)} entries for "
                             f"{num_workers} workers")
    launcher = _Launcher(include_dashboard, object_store_bytes, start_timeout_s)
    cluster = launcher.cluster
    t0 = time.perf_counter()
    try:
        launcher.start_head({"CPU": head_cpus, **head_res})
        for i, res in enumerate(per_worker, start=1):
            launcher.start(f"{i}-worker", [f"--address={cluster.address}",
                                           *_node_args({"CPU": worker_cpus, **res})])
        log.info("local cluster %s up (%d nodes) in %.1f s", cluster.address,
                 1 + num_workers, time.perf_counter() - t0)
        yield cluster
    finally:
        _teardown(cluster, stop_grace_s)
        if not keep_temp:
            shutil.rmtree(cluster.temp_dir, ignore_errors=True)


@contextlib.contextmanager
def local_autoscaling_cluster(
    config_path: str | Path,
    *,
    include_dashboard: bool = False,
    object_store_bytes: int = 200 * 1024**2,
    start_timeout_s: float = 90.0,
    stop_grace_s: float = 5.0,
    keep_temp: bool = False,
) -> Iterator[LocalCluster]:
    """A head node whose autoscaler adds nodes from a ``fake_multinode`` launcher file.

    Starts ``RAY_FAKE_CLUSTER=1 ray start --head --autoscaling-config=<copy of config_path>``
    (``provider.gcs_address`` pointed at this head), with the head's resources taken from the
    file's head node type. Worker nodes appear only when work asks for resources that only a
    worker type has: Ray's autoscaler (the same code that scales EC2 instances) picks the node
    type and the fake provider starts it as local processes. :meth:`LocalCluster.env` exports
    :data:`LABELS_ENV` with the labels of the file's node types, as ``cluster.yaml`` does.
    Teardown as in :func:`local_multinode_cluster` (the fake nodes are descendants of the
    head's autoscaler process).

    Args:
        config_path: a complete ``fake_multinode`` launcher file (``cluster.local.yaml``).
        include_dashboard / object_store_bytes / start_timeout_s / stop_grace_s / keep_temp:
            as in :func:`local_multinode_cluster`.

    Yields:
        The running :class:`LocalCluster` (head only at first).
    """
    config = _load_yaml(config_path)
    if (config.get("provider") or {}).get("type") != "fake_multinode":
        raise ClusterConfigError(f"{config_path}: provider.type must be fake_multinode")
    launcher = _Launcher(include_dashboard, object_store_bytes, start_timeout_s,
                         extra_env={"RAY_FAKE_CLUSTER": "1"})
    cluster = launcher.cluster
    config["provider"]["gcs_address"] = cluster.address
    autoscaling = Path(cluster.temp_dir) / "autoscaling.yaml"
    autoscaling.write_text(yaml.safe_dump(config))
    node_types = config["available_node_types"]
    cluster.declared = tuple(label for label in resource_labels()
                             if any(label in t.get("resources", {}) for t in node_types.values()))
    try:
        launcher.start_head(node_types[config["head_node_type"]]["resources"],
                            [f"--autoscaling-config={autoscaling}"])
        yield cluster
    finally:
        _teardown(cluster, stop_grace_s)
        if not keep_temp:
            shutil.rmtree(cluster.temp_dir, ignore_errors=True)


def _teardown(cluster: LocalCluster, grace_s: float) -> None:
    """Stop exactly this cluster's processes: SIGTERM in two rounds, then SIGKILL.

    Round 1 signals the ``ray start --block`` processes only (workers first, the head with its
    GCS last): each stops its own node's processes in order (~2 s here; signalling every
    process at once instead left the GCS and raylets hanging past a 5 s grace). Round 2
    signals whatever of this cluster is left, e.g. nodes an autoscaler started. Then SIGKILL.
    """
    procs = cluster.processes
    roots = [p.pid for p in procs]  # start_new_session: each ray start leads its own group
    mine = _cluster_pids(roots, roots, cluster.temp_dir)

    def wait(pids: set[int], seconds: float) -> set[int]:
        deadline = time.monotonic() + seconds
        while (left := _alive(pids)) and time.monotonic() < deadline:
            time.sleep(0.2)
        return left

    for p in reversed(procs):
        _signal_all({p.pid}, signal.SIGTERM)
    left = wait(mine, grace_s / 2)
    # A fresh scan also catches anything started meanwhile (a worker spawned during shutdown).
    left |= _cluster_pids(roots, roots, cluster.temp_dir)
    _signal_all(left, signal.SIGTERM)
    left = wait(left, grace_s / 2)
    if left:
        log.warning("local cluster %s: SIGKILL to %d processes still alive %.1f s after "
                    "SIGTERM", cluster.address, len(left), grace_s)
        _signal_all(left, signal.SIGKILL)
        wait(left, 5.0)
    for p in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=5)


# ---- command line ----------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m spice_ray.cluster {validate,aws-dry-run,node-usage,local}``."""
    parser = argparse.ArgumentParser(prog="python -m spice_ray.cluster", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("validate", help="Ray's schema + this project's policy for a YAML")
    p.add_argument("path", type=Path)
    p = sub.add_parser("aws-dry-run", help="Ray's AWS bootstrap against moto (offline)")
    p.add_argument("path", type=Path)
    p = sub.add_parser("node-usage", help="which nodes run tasks requiring each label (JSON)")
    p.add_argument("--address", default=None, help="Ray address (default: auto)")
    p.add_argument("--labels", default=f"{DATAGEN},{TRAINER}")
    p.add_argument("--tasks", type=int, default=4)
    p.add_argument("--timeout", type=float, default=60.0)
    p = sub.add_parser("local", help="start a local multi-node cluster until Ctrl-C")
    p.add_argument("--workers", type=int, default=1, help="fixed worker nodes (default 1)")
    p.add_argument("--autoscaling", type=Path, default=None, metavar="YAML",
                   help="instead: a head that autoscales from a fake_multinode file")
    p.add_argument("--cpus", type=int, default=1,
                   help="logical CPUs per fixed node (default 1; full_run needs 2)")
    p.add_argument("--dashboard", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    if args.cmd == "validate":
        try:
            config = validate_cluster_config(args.path)
        except ClusterConfigError as exc:
            print(f"invalid: {exc}", file=sys.stderr)
            return 2
        problems = check_cluster_policy(config)
        for line in problems:
            print(f"policy: {line}", file=sys.stderr)
        if problems:
            return 2
        types = ", ".join(f"{k} {v.get('resources')}"
                          for k, v in config["available_node_types"].items())
        print(f"ok: {args.path} passes Ray's schema and the project policy ({types})")
        return 0
    if args.cmd == "aws-dry-run":
        # One line, last: Ray's autoscaler logs to stdout as well.
        print(json.dumps(simulate_aws_bootstrap(args.path), default=str))
        return 0
    if args.cmd == "node-usage":
        import ray

        ray.init(address=args.address or "auto", log_to_driver=False, logging_level="ERROR")
        try:
            # What a driver starting now would request (before the tasks bring up any node).
            placement = {label: placement_resources(label) for label in resource_labels()}
            usage = node_usage(labels=[s for s in args.labels.split(",") if s],
                               tasks_per_label=args.tasks, timeout_s=args.timeout)
            print(json.dumps({"usage": usage, "labelled_nodes": labelled_nodes(),
                              "placement": placement}))
        finally:
            ray.shutdown()
        return 0
    if args.autoscaling:
        context = local_autoscaling_cluster(args.autoscaling, include_dashboard=args.dashboard)
    else:
        context = local_multinode_cluster(args.workers, head_cpus=args.cpus,
                                          worker_cpus=args.cpus,
                                          include_dashboard=args.dashboard)
    with context as cluster:
        exports = " ".join(f"{k}={v}" for k, v in cluster.env({}).items())
        print(f"address: {cluster.address}   (export {exports})")
        if cluster.dashboard_url:
            print(f"dashboard: {cluster.dashboard_url}")
        print("Ctrl-C stops it.", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            while True:
                time.sleep(3600)
    return 0


if __name__ == "__main__":
    sys.exit(main())
