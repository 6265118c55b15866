"""Whether a Ray cluster answers at an address, in bounded time (Ray itself would retry its
GCS connection for minutes, printing warnings)."""

from __future__ import annotations

from spice_ray.common.errors import SpiceRayError

REACH_TIMEOUT_S = 4.0
"""Seconds to wait for a cluster's GCS to answer before refusing the address."""


class ClusterUnreachable(SpiceRayError, ConnectionError):
    """No Ray cluster answers at the address given."""


def check_reachable(address: str, timeout_s: float = REACH_TIMEOUT_S) -> None:
    """Refuse, within ``timeout_s``, a ``host:port`` address where nothing answers (Ray itself
    would retry its GCS connection for minutes, printing warnings). "auto" and ``ray://``
    addresses are left to Ray, whose discovery fails fast.

    Raises:
        ClusterUnreachable: naming the address and the time waited.
    """
    import socket
    import time

    host, sep, port = address.rpartition(":")
    if address == "auto" or "://" in address or not sep or not port.isdigit():
        return
    t0 = time.monotonic()
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as exc:
        _unreachable(address, exc.strerror or str(exc), t0)
    # Something listens; Ray's GCS speaks gRPC. Anything else (a web server, a closed tunnel)
    # would leave ray.init retrying for minutes.
    import grpc

    channel = grpc.insecure_channel(address)
    try:
        left = max(0.1, timeout_s - (time.monotonic() - t0))
        grpc.channel_ready_future(channel).result(timeout=left)
    except grpc.FutureTimeoutError:
        _unreachable(address, "no gRPC server answers there", t0)
    finally:
        channel.close()


def _unreachable(address: str, why: str, t0: float) -> None:
    import time

    raise ClusterUnreachable(
        f"no Ray cluster answers at --address {address} ({why}, waited "
        f"{time.monotonic() - t0:.1f} s): start one there (ray start --head), or leave "
        "--address out to run on a local Ray") from None
