"""One writer per run directory: an exclusive lock held for the whole run.

``<run_dir>/.spice-ray.lock`` is locked with ``flock`` (exclusive, non-blocking) and holds JSON
naming the holder: pid, host, command and start time. The kernel releases an ``flock`` when its
process ends, however it ends (SIGKILL included), so a lock left by a dead process is free: the
next run takes it over and logs a warning naming the previous holder. A second run while the
holder lives is refused at once, naming the holder. On NFS/EFS (NFSv4) ``flock`` is a byte-range
lock that the server tracks, so runs on different hosts exclude each other too.

The file is left in place (emptied) on release: deleting it would let two processes lock two
different files of the same name.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import stat
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spice_ray.common.errors import SpiceRayError

log = logging.getLogger(__name__)

LOCK_NAME = ".spice-ray.lock"


class RunDirectoryLocked(SpiceRayError, RuntimeError):
    """Another live process holds the run directory."""


class UnsafeRunPath(SpiceRayError, OSError):
    """A file the run writes in place is a symbolic link or not a regular file: writing
    through it would change a file outside the run directory."""


def open_in_run(path: str | Path, flags: int, mode: int = 0o644) -> int:
    """``os.open(path, flags | O_CREAT | O_NOFOLLOW)`` of a file a run writes in place (its
    lock, its log): a descriptor of a regular file, never through a symbolic link, and never
    of a file another path shares: a hard link (``cp -al run1 run2`` makes every file one) is
    first replaced by a private copy of its bytes, renamed over it, so the writes stay in this
    run and the other path keeps its file.

    Raises:
        UnsafeRunPath: naming the file, when it is a link, a directory, a FIFO, ...
    """
    fd = _open_regular(Path(path), flags, mode)
    if os.fstat(fd).st_nlink > 1:
        fd = _unshare(Path(path), fd, flags, mode)
    return fd


def _unshare(path: Path, fd: int, flags: int, mode: int) -> int:
    """``path``'s descriptor after the hard-linked file there is replaced by a private copy
    (its bytes, created anew beside it and renamed over it); ``fd`` is closed."""
    links = os.fstat(fd).st_nlink
    os.close(fd)
    with os.fdopen(_open_regular(path, os.O_RDONLY, mode), "rb") as f:  # its bytes, kept
        data = f.read()
    os.close(_replace_by_copy(path, data, links, mode))
    return _open_regular(path, flags, mode)


def _private_locked_copy(path: Path, fd: int) -> int:
    """The lock ``fd`` holds moved to a private file: ``path``'s bytes copied to a new file,
    locked before it is renamed over ``path`` (so no other process can lock the new file
    first), then ``fd`` is closed. A run that had opened the shared file meanwhile finds that
    ``path`` is another file now and tries again (:func:`acquire`)."""
    links = os.fstat(fd).st_nlink
    new = _replace_by_copy(path, os.pread(fd, os.fstat(fd).st_size, 0), links, 0o644,
                           lock=True)
    os.close(fd)
    return new


def _replace_by_copy(path: Path, data: bytes, links: int, mode: int, lock: bool = False) -> int:
    """``path``, a file ``links`` paths share, replaced by a private file holding ``data``:
    created anew beside it, locked first where ``lock``, written and renamed over it. Returns
    the new file's read-write descriptor."""
    tmp = path.with_name(f".{path.name}.unshare-{os.getpid()}")
    tmp.unlink(missing_ok=True)
    new = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    try:
        if lock:
            fcntl.flock(new, fcntl.LOCK_EX | fcntl.LOCK_NB)
        view = memoryview(data)
        while view:  # os.write may take a part
            view = view[os.write(new, view):]
        os.fsync(new)
        os.replace(tmp, path)
    except BaseException:
        os.close(new)
        raise
    log.warning("%s was a hard link (%d paths shared the file, as a cp -al copy of a run "
                "makes): replaced by a private copy, so this run's writes stay in its "
                "directory", path, links)
    return new


def _same_file(fd: int, path: Path) -> bool:
    """Whether ``path`` is (still) the file ``fd`` has open."""
    try:
        here = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    there = os.fstat(fd)
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def _open_regular(path: Path, flags: int, mode: int) -> int:
    """A descriptor of the regular file ``path`` (created if missing), never through a link."""
    try:
        fd = os.open(path, flags | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, mode)
    except OSError:
        if path.is_symlink():
            raise UnsafeRunPath(f"{path} is a symbolic link: refused (writing through it would "
                                "change a file outside the run directory); remove it") from None
        if path.exists() and not path.is_file():
            raise UnsafeRunPath(f"{path} is not a regular file: remove it") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UnsafeRunPath(f"{path} is not a regular file (a FIFO or device?): remove it")
    os.set_blocking(fd, True)
    return fd


def owner_writable_only(root: Path) -> None:
    """Folders 0755 and files 0644 under ``root`` (links untouched): Ray's session folders are
    world-writable (0777), and a copy of them into a run kept that mode."""
    os.chmod(root, 0o755)
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(folder, name)
            if not os.path.islink(path):
                os.chmod(path, 0o755 if name in dirs else 0o644)


def links_out(run_dir: str | Path) -> list[tuple[Path, Path]]:
    """Symbolic links anywhere under ``run_dir`` that lead outside it, as (link, target): a
    run writes inside its directory only, and a linked ``results/`` or ``checkpoints/`` would
    carry its writes (and its atomic renames) to the target. Links that stay inside are fine.
    Nothing is followed while looking."""
    root = Path(run_dir).resolve()
    out = []
    for folder, dirs, files in os.walk(root, followlinks=False):
        for name in sorted(dirs + files):
            path = Path(folder) / name
            if path.is_symlink():
                target = path.resolve()
                if not target.is_relative_to(root):
                    out.append((path, target))
    return out


def _describe(holder: dict[str, Any]) -> str:
    if not holder:
        return "another process (it has not written its name yet)"
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder.get("started", 0)))
    return (f"pid {holder.get('pid')} on host {holder.get('host')} since {started} "
            f"({holder.get('command', '?')})")


def _read_holder(fd: int) -> dict[str, Any]:
    os.lseek(fd, 0, os.SEEK_SET)
    raw = b""
    while chunk := os.read(fd, 65536):
        raw += chunk
    try:
        data = json.loads(raw.decode("utf-8")) if raw.strip() else {}
    except (UnicodeDecodeError, json.JSONDecodeError):
        return {"pid": "?", "host": "?", "command": "unreadable lock file"}
    return data if isinstance(data, dict) else {}


@dataclass
class RunLock:
    """A held lock; :meth:`release` (or process exit) frees it."""

    path: Path
    fd: int | None

    def release(self) -> None:
        if self.fd is None:
            return
        try:
            os.ftruncate(self.fd, 0)
        finally:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def acquire(run_dir: str | Path, command: str | None = None) -> RunLock:
    """Take the run directory's lock (creating the directory if needed).

    Args:
        command: what the holder runs, recorded for others' error messages (default: argv).

    Raises:
        RunDirectoryLocked: naming the live holder (pid, host, command, start time).
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LOCK_NAME
    while True:
        try:
            fd = _open_regular(path, os.O_RDWR, 0o644)
        except UnsafeRunPath as exc:
            raise RunDirectoryLocked(f"the run directory's lock {exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            time.sleep(0.2)  # a holder that has just locked writes its name right after
            holder = _read_holder(fd)
            os.close(fd)
            raise RunDirectoryLocked(f"run directory {run_dir} is in use by "
                                     f"{_describe(holder)}; wait for it to finish or use "
                                     "another --out") from None
        if os.fstat(fd).st_nlink > 1:  # shared by a hard link: ours alone, the lock held
            fd = _private_locked_copy(path, fd)
        if _same_file(fd, path):
            break
        os.close(fd)  # the file there was replaced while this took it: lock the one there now
    previous = _read_holder(fd)
    if previous:
        log.warning("took over the lock of %s, left by %s, which is no longer running",
                    run_dir, _describe(previous))
    me = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(),
          "command": command or " ".join([os.path.basename(sys.argv[0]), *sys.argv[1:]])}
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, json.dumps(me).encode())
    os.fsync(fd)
    return RunLock(path, fd)
