"""Cluster launcher checks and a command line for operators (not library code).

* :func:`validate_cluster_config`: Ray's own schema check of a launcher YAML, offline;
* :func:`check_cluster_policy`: this project's rules for its launcher file (labels on every
  node type, declared labels, only SSH open to the world, no credentials in the file);
* :func:`simulate_aws_bootstrap`: Ray's AWS bootstrap against moto's in-memory AWS;
* a local multi-node cluster on one machine (``tools/local_cluster.py``).

Command line, from the repository root::

    python -m tools.cluster validate cluster.yaml
    python -m tools.cluster aws-dry-run cluster.yaml
    python -m tools.cluster node-usage --address auto
    python -m tools.cluster local --workers 1 --cpus 2

Placing work by label is library code: ``spice_ray/common/placement.py``. Guide:
``docs/cluster.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import logging
import os
import re
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from spice_ray.common.placement import (
    DATAGEN,
    HEAD,
    LABELS_ENV,
    TRAINER,
    labelled_nodes,
    node_usage,
    placement_resources,
    resource_labels,
)
from tools.local_cluster import (
    ClusterConfigError,
    _load_yaml,
    local_autoscaling_cluster,
    local_multinode_cluster,
)

log = logging.getLogger(__name__)

_AWS_KEY_RE = re.compile(r"\b(AKIA|ASIA)[0-9A-Z]{16}\b")




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



def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tools.cluster {validate,aws-dry-run,node-usage,local}``."""
    parser = argparse.ArgumentParser(prog="python -m tools.cluster", description=__doc__,
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
