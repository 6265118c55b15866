"""Reaching Ray: whether a cluster answers at an address, in bounded time (Ray itself would
retry its GCS connection for minutes, printing warnings), and starting a local one that waits
and retries on a loaded machine instead of failing with Ray's traceback."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

from spice_ray.common.errors import SpiceRayError
from spice_ray.common.faults import fault

log = logging.getLogger(__name__)

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


LOCAL_START_TRIES = 3
"""Local Ray start-ups tried before giving up. Ray's driver waits a fixed 30 s (not a setting in
Ray 2.60) for its own raylet to register with the GCS; a 2-core machine busy with other work
can miss that ("The current node timed out during startup"), and each further start, after the
failed one's processes are shut down, gets another 30 s (three: at load 15 on 2 cores the
suite's multi-node cluster missed two in a row)."""
LOCAL_START_WAITS = {
    # a worker process imports torch and the package before it registers: seconds on a quiet
    # machine, and past Ray's 60 s default on a loaded one
    "RAY_worker_register_timeout_seconds": "300",
    # the dashboard's ten module processes start in ~4 CPU-seconds on a quiet 2-core machine;
    # beside two busy processes they missed Ray's 60 s and `ray start` exited with 1
    "RAY_DASHBOARD_STARTUP_TIMEOUT_S": "300",
}
"""Ray's own start-up timeouts that are settings (environment variables read by the processes
a local start spawns), raised for a loaded machine; a variable already set is kept."""


RAY_START_TIMEOUT = ("The current node timed out during startup. This could happen because some "
                     "of the raylet failed to startup or the GCS has become overloaded.")
"""What Ray 2.60 raises when its raylet misses the driver's fixed 30 s wait."""


class RayStartFailed(SpiceRayError, RuntimeError):
    """A local Ray did not start, after :data:`LOCAL_START_TRIES` tries."""


def start_local(init: Callable[..., Any], shutdown: Callable[[], Any],
                tries: int = LOCAL_START_TRIES, **kwargs: Any) -> Any:
    """``init(address="local", **kwargs)`` (``ray.init``), with Ray's start-up timeouts of
    :data:`LOCAL_START_WAITS` raised and, when a start fails, ``shutdown()`` (``ray.shutdown``,
    which ends what the failed start left) and another start, up to ``tries`` in all.

    Raises:
        RayStartFailed: every try failed; the message gives Ray's reason in one line, the
            tries, the machine's load and what to do.
    """
    for name, value in LOCAL_START_WAITS.items():
        os.environ.setdefault(name, value)
    reason, injected = "", int(fault("ray_start", 0))
    for attempt in range(1, tries + 1):
        try:
            if attempt <= injected:
                raise Exception(f"{RAY_START_TIMEOUT} (injected: {attempt} of {injected})")
            return init(address="local", **kwargs)
        except Exception as exc:  # noqa: BLE001 - Ray raises a bare Exception on a timeout
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
            # the logs only: the retry usually works, and the console's lines stay the run's
            log.info("local Ray start %d of %d failed: %s", attempt, tries, reason)
            try:
                shutdown()
            except Exception as cleanup:  # noqa: BLE001 - the start's own error is the news
                log.warning("shutting the failed Ray start down: %s", cleanup)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    raise RayStartFailed(
        f"the local Ray did not start in {tries} tries ({reason}; load average {load:.1f} on "
        f"{os.cpu_count()} CPUs): run again when the machine is less busy, or start Ray "
        "yourself (ray start --head) and pass --address auto")
