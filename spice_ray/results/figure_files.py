"""Where a figure goes: a PNG (the report embeds it) and, on request, vector copies beside it,
each with a checksum sidecar naming the inputs it was drawn from (:func:`is_drawn`).

Every plotting function of :mod:`spice_ray.results.plots` ends in :func:`save`; the figures
stage wraps itself in :func:`extra_formats` when ``--figure-format pdf`` (or svg) asks for them.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from spice_ray.common.artifacts import atomic_path, is_current, write_sidecar  # noqa: E402

FORMATS = ("png", "pdf", "svg")
"""Figure file formats: PNG always (the report embeds it), PDF and SVG as vector copies."""
_EXTRA_FORMATS: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar(
    "extra_formats", default=())


@contextlib.contextmanager
def extra_formats(formats: tuple[str, ...]) -> Iterator[None]:
    """Inside the block, every figure is also written in each of ``formats`` (of
    :data:`FORMATS` but png), beside its PNG with that suffix (``--figure-format pdf``)."""
    bad = [f for f in formats if f not in FORMATS]
    if bad:
        raise ValueError(f"figure format {bad[0]!r} is invalid: one of {list(FORMATS)}")
    token = _EXTRA_FORMATS.set(tuple(f for f in formats if f != "png"))
    try:
        yield
    finally:
        _EXTRA_FORMATS.reset(token)


def current_formats() -> tuple[str, ...]:
    """The vector formats the enclosing :func:`extra_formats` asks for (() outside one): what
    a figure drawn in another process must be told."""
    return _EXTRA_FORMATS.get()


def copies(path: Path) -> list[Path]:
    """The vector copies of PNG ``path`` that the current :func:`extra_formats` asks for."""
    return [path.with_suffix(f".{f}") for f in _EXTRA_FORMATS.get()]


def is_drawn(paths: list[Path], inputs: str) -> bool:
    """Whether every PNG of ``paths`` and its vector copies were drawn from ``inputs`` (a hash
    of the table and the plotting code), by their checksum sidecars: the one currency rule
    (``common.artifacts.is_current``) every stage's outputs are checked by."""
    return all(is_current(f, inputs)[0] for p in paths for f in (p, *copies(p)))


def mark_drawn(paths: list[Path], inputs: str) -> None:
    """Write the sidecars that make :func:`is_drawn` true for ``paths`` just drawn."""
    for p in paths:
        for f in (p, *copies(p)):
            write_sidecar(f, inputs=inputs)


def save(fig, path: Path, note: str | None = None) -> Path:
    """Write the figure (nothing clipped: the legends outside the axes are kept), with
    ``note`` (what its bands are) under it; also its :func:`copies` in vector formats."""
    if fig.get_layout_engine() is None:  # a constrained figure sizes each gap on its own
        fig.tight_layout()
    if note:
        fig.text(0.01, -0.02, note, fontsize=7, ha="left", va="top")
    try:
        with atomic_path(path) as tmp:  # never a half PNG; a full disk names the file
            fig.savefig(tmp, dpi=120, format="png", bbox_inches="tight")
        for copy in copies(path):
            with atomic_path(copy) as tmp:
                fig.savefig(tmp, format=copy.suffix[1:], bbox_inches="tight")
    finally:
        plt.close(fig)
    return path
