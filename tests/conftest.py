"""Shared fixtures: one local Ray for the integration tests of the whole session."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")


@pytest.fixture(scope="session")
def ray_local():
    """A fresh 2-CPU local Ray cluster, shut down at the end of the session."""
    import ray
    from ray.data import DataContext

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             logging_level="ERROR")
    ctx = DataContext.get_current()
    ctx.execution_options.verbose_progress = False
    ctx.enable_progress_bars = False
    ctx.execution_no_progress_timeout_s = 120  # a stall becomes an error, not a hang
    yield ray
    ray.shutdown()
