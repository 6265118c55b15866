"""Files the stages write: atomic writes, SHA-256 sidecars, and "is this output current?".

Every file a later stage (or a user) trusts is written the same way:

1. to a temporary name in the same directory, then renamed (``os.replace``), so a killed
   writer never leaves a half file under the final name;
2. followed by a *sidecar* ``<file>.sha256``: JSON ``{"file", "bytes", "sha256", ...}`` plus
   whatever the writer records beside it (row counts, the hash of the inputs).

A file is *valid* when it and its sidecar exist and its size and SHA-256 match the sidecar;
it is *current* for some inputs when it is valid and the sidecar's ``inputs`` equal the hash of
those inputs (:func:`is_current`). A truncated, bit-flipped or half-written file is therefore
named and recomputed, never read. Dataset shards, result tables and sweep tables all use this;
the records inside such files (a tuning choice, a checkpoint's identity, a sweep's inputs) are
judged by the same :func:`is_current`.

No Ray and no pandas here: plain files.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

SIDECAR_SUFFIX = ".sha256"
MISSING = "missing"
""":func:`verify`'s reason when the file does not exist."""
NO_SIDECAR = "no checksum sidecar (interrupted write)"
""":func:`verify`'s reason when the file has no sidecar (an interrupted write, or a file from
before sidecars: callers that read such legacy files test for it)."""


def file_sha256(path: str | Path) -> str:
    """Hex SHA-256 of a file's bytes, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success rename it to ``path``.

    On an exception the temporary file is removed and ``path`` is left as it was.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.unlink(missing_ok=True)  # a leftover, or a link planted there: never written through
    try:
        yield tmp
        os.replace(tmp, path)
    except OSError as exc:
        if exc.filename is None:  # e.g. a full disk inside a library's writer: name the file
            raise OSError(exc.errno, exc.strerror, str(path)) from exc
        raise
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` atomically; returns the path."""
    with atomic_path(path) as tmp:
        tmp.write_text(text)
    return Path(path)


def sidecar_path(path: str | Path) -> Path:
    """``<file>.sha256`` beside ``path``."""
    path = Path(path)
    return path.with_name(path.name + SIDECAR_SUFFIX)


def write_sidecar(path: str | Path, **extra: Any) -> dict[str, Any]:
    """Checksum ``path`` and write its sidecar (atomically); returns the record.

    Args:
        extra: JSON-able fields stored beside the checksum (e.g. ``rows``, ``inputs``).
    """
    path = Path(path)
    record = {"file": f"{path.parent.name}/{path.name}", "bytes": path.stat().st_size,
              "sha256": file_sha256(path), **extra}
    atomic_write_text(sidecar_path(path), json.dumps(record))
    return record


def write_checked(path: str | Path, write: Callable[[Path], Any], **extra: Any
                  ) -> dict[str, Any]:
    """Write a file through ``write(tmp_path)`` atomically, then its sidecar; returns the record.

    The sidecar is written after the file, so a crash in between leaves a file that fails its
    (old or missing) sidecar: it is recomputed, not trusted.
    """
    path = Path(path)
    sidecar_path(path).unlink(missing_ok=True)
    with atomic_path(path) as tmp:
        write(tmp)
    return write_sidecar(path, **extra)


def write_checked_text(path: str | Path, text: str, **extra: Any) -> dict[str, Any]:
    """:func:`write_checked` of a text file."""
    return write_checked(path, lambda tmp: tmp.write_text(text), **extra)


def publish_dir(directory: str | Path, write: Callable[[Path], Any], *,
                sidecars: bool = True) -> Path:
    """Publish a directory whole, the one way every stage does it: ``write(staging)`` fills a
    staging directory beside ``directory``; every file in it gets a SHA-256 sidecar, the one
    checksum format of every artifact (a file copied in with its sidecar is checked against it
    first, never re-signed blind); the staging directory is renamed into place (an older
    ``directory`` is replaced). ``sidecars=False`` is for copies nothing later trusts (Ray's
    logs). A failed write leaves no staging directory and the old ``directory`` as it was."""
    import shutil

    directory = Path(directory)
    staging = directory.with_name(f".{directory.name}.tmp-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        write(staging)
        files = sorted(p for p in staging.rglob("*")
                       if p.is_file() and not p.name.endswith(SIDECAR_SUFFIX))
        for path in files if sidecars else ():
            name = f"{directory.name}/{path.relative_to(staging)}"
            if sidecar_path(path).exists():  # copied in with its sidecar: checked, not laundered
                record, why = verify(path)
                if record is None:
                    raise UnreadableFile(f"{name} fails its SHA-256 checksum ({why}): "
                                         f"{directory} not published")
            write_sidecar(path, file=name)
        shutil.rmtree(directory, ignore_errors=True)
        os.replace(staging, directory)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return directory


def verify(path: str | Path) -> tuple[dict[str, Any] | None, str]:
    """Check a file against its sidecar.

    Returns:
        (sidecar record, "") when valid, else (None, reason): "missing", "no checksum sidecar
        (interrupted write)", "unreadable checksum sidecar", a size mismatch ("truncated?") or
        "SHA-256 mismatch (corrupted)".
    """
    path = Path(path)
    side = sidecar_path(path)
    if not path.is_file():
        return None, MISSING
    if not side.is_file():
        return None, NO_SIDECAR
    try:
        record = json.loads(side.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None, "unreadable checksum sidecar"
    if not isinstance(record, dict):
        return None, "unreadable checksum sidecar"
    size = path.stat().st_size
    if size != record.get("bytes"):
        return None, f"size {size} bytes, expected {record.get('bytes')} (truncated?)"
    if file_sha256(path) != record.get("sha256"):
        return None, "SHA-256 mismatch (corrupted)"
    return record, ""


def is_current(source: str | Path | Mapping[str, Any] | None, inputs: str,
               field: str = "inputs") -> tuple[bool, str]:
    """The one freshness rule: whether an output was computed from ``inputs`` (a hash of
    everything it depends on), by the record it carries.

    ``source`` is a file (its sidecar is the record, after :func:`verify`: a table, a figure,
    a dataset shard) or a record already read from a verified file (a tuning choice in
    ``tuning.json``, a checkpoint's ``meta.json``, a sweep's ``<name>.inputs.json``); ``None``
    is one never written. ``field`` names the record's hash (``"identity"`` for a checkpoint).

    Returns:
        (True, "") or (False, reason): why it must be (re)computed; "missing" when it was
        never written.
    """
    if source is None:
        return False, MISSING
    if isinstance(source, Mapping):
        record: Mapping[str, Any] | None = source
    else:
        record, reason = verify(source)
        if record is None:
            return False, reason
    if record.get(field) != inputs:
        return False, "computed from other inputs"
    return True, ""


class UnreadableFile(ValueError):
    """A JSON file that exists but cannot be read as the expected mapping."""


def stays_inside(base: str | Path, relative: Any, root: str | Path | None = None) -> bool:
    """Whether ``relative``, a path read from a run file and meant relative to ``base``, stays
    inside ``root`` (default ``base``): a string, not absolute, no ``..``, and resolving
    (links followed) inside it. A checkpoint index's entries and a manifest's shards are
    checked so; one that leads out is refused, whatever its checksums say."""
    if not isinstance(relative, str):
        return False
    path = Path(relative)
    inside = Path(root if root is not None else base).resolve()
    return not path.is_absolute() and ".." not in path.parts \
        and (Path(base) / path).resolve().is_relative_to(inside)


def read_json(path: str | Path) -> dict[str, Any]:
    """A JSON object from ``path``.

    Raises:
        FileNotFoundError: the file does not exist.
        UnreadableFile: it is not UTF-8, not JSON, or not an object; the message names the file.
    """
    path = Path(path)
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except FileNotFoundError:
        raise
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UnreadableFile(f"{path} is corrupted ({type(exc).__name__}: {exc})") from exc
    if not isinstance(data, dict):
        raise UnreadableFile(f"{path} is corrupted: expected a JSON object, got "
                             f"{type(data).__name__}")
    return data
