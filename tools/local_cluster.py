"""A multi-node Ray cluster on one machine, for tests and trying the cluster path locally.

:func:`local_multinode_cluster` starts ``ray start`` head and worker processes (each with its
own logical CPUs and labels) and tears them down without ``ray stop`` (which would stop every
Ray on the machine); :func:`local_autoscaling_cluster` starts a head whose autoscaler adds
nodes from a fake-multinode launcher file (``cluster.local.yaml``). Processes are started with
a parent-death signal, so a killed test run does not leave nodes behind.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from spice_ray.common.placement import DATAGEN, LABELS_ENV, TRAINER, resource_labels
from spice_ray.config import load_yaml
from spice_ray.runtime.reach import LOCAL_START_WAITS

log = logging.getLogger(__name__)


class ClusterConfigError(ValueError):
    """A cluster launcher file is not valid YAML, fails Ray's schema, or breaks project policy."""


START_TIMEOUT_S = 300.0
"""How long a node's ``ray start`` may take to report "Ray runtime started": a limit only a hang
reaches (a quiet 2-core machine takes seconds; beside two busy processes ``ray start`` printed
nothing for 90 s). The wait ends as soon as the line appears."""


def _load_yaml(path: str | Path) -> dict[str, Any]:
    return load_yaml(path, error=ClusterConfigError, allow_empty=False)


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
        # Ray's start-up waits raised for a loaded machine, as a run's own local Ray has them
        self.env = {**LOCAL_START_WAITS,
                    **{k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}}
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
    start_timeout_s: float = START_TIMEOUT_S,
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
    def start(launcher: _Launcher) -> None:
        launcher.start_head({"CPU": head_cpus, **head_res})
        for i, res in enumerate(per_worker, start=1):
            launcher.start(f"{i}-worker", [f"--address={launcher.cluster.address}",
                                           *_node_args({"CPU": worker_cpus, **res})])

    t0 = time.perf_counter()
    cluster = started(lambda: _Launcher(include_dashboard, object_store_bytes, start_timeout_s),
                      start, stop_grace_s, keep_temp).cluster
    try:
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
    start_timeout_s: float = START_TIMEOUT_S,
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
    node_types = config["available_node_types"]

    def start(launcher: _Launcher) -> None:
        cluster = launcher.cluster
        config["provider"]["gcs_address"] = cluster.address
        autoscaling = Path(cluster.temp_dir) / "autoscaling.yaml"
        autoscaling.write_text(yaml.safe_dump(config))
        cluster.declared = tuple(label for label in resource_labels() if any(
            label in t.get("resources", {}) for t in node_types.values()))
        launcher.start_head(node_types[config["head_node_type"]]["resources"],
                            [f"--autoscaling-config={autoscaling}"])

    cluster = started(lambda: _Launcher(include_dashboard, object_store_bytes, start_timeout_s,
                                        extra_env={"RAY_FAKE_CLUSTER": "1"}),
                      start, stop_grace_s, keep_temp).cluster
    try:
        yield cluster
    finally:
        _teardown(cluster, stop_grace_s)
        if not keep_temp:
            shutil.rmtree(cluster.temp_dir, ignore_errors=True)


START_TRIES = 3
"""Cluster start-ups tried before giving up: on a loaded machine a node's ``ray start`` can miss
Ray's own fixed 30 s wait for its raylet, and a second start from scratch gets another try."""


def started(make: Callable[[], _Launcher], start: Callable[[_Launcher], None], grace_s: float,
            keep_temp: bool, tries: int = START_TRIES) -> _Launcher:
    """A launcher from ``make()`` whose nodes ``start`` brought up; when a node fails to start,
    everything of that try is torn down (and its temp dir removed unless ``keep_temp``) and
    the cluster started again from a new launcher, up to ``tries`` in all.

    Raises:
        RuntimeError / TimeoutError: the last try's failure (with its node's log).
    """
    for attempt in range(1, tries + 1):
        launcher = make()
        try:
            start(launcher)
            return launcher
        except (RuntimeError, TimeoutError) as exc:
            _teardown(launcher.cluster, grace_s)
            if not keep_temp:
                shutil.rmtree(launcher.cluster.temp_dir, ignore_errors=True)
            if attempt == tries:
                raise
            log.warning("local cluster start %d of %d failed (%s); starting it again", attempt,
                        tries, (str(exc).splitlines() or [type(exc).__name__])[0][:200])
    raise AssertionError("unreachable")


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


