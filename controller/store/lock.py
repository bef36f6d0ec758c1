"""One controller per state directory: an exclusive ``flock`` on ``vramctl.lock``.

:class:`StateLock` takes the lock (or raises :class:`AlreadyRunning` naming the
holder's pid); the kernel drops it when the holder dies, so a stale file never blocks a
restart. It also holds the state directory's file modes and the warning for a folder or
file open to every user. This module must not read or write the journal.
"""

from __future__ import annotations

import fcntl
import os
import stat
from pathlib import Path
from types import TracebackType
from typing import Self

from loguru import logger

#: The single-instance lock's file name inside the state directory.
LOCK_NAME = "vramctl.lock"
#: The mode of every file vramctl creates in the state directory: the journal holds
#: ``up`` output and container log lines, which may quote secrets.
PRIVATE_FILE_MODE = 0o600
#: The mode of a state directory vramctl creates.
PRIVATE_DIR_MODE = 0o700


def warn_if_open(path: Path, what: str) -> None:
    """Log a warning when ``path`` (a state directory, a token file) is world-readable.

    Nothing is changed: an existing folder or file is the operator's.
    """
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except OSError:
        return
    if mode & 0o006:
        fix = "chmod 700" if path.is_dir() else "chmod 600"
        logger.warning(
            "{} {} is open to every user of this host (mode {:04o}): {}; {} it",
            what,
            path,
            mode,
            "it holds the journal (`up` output, container logs)"
            if path.is_dir()
            else "it holds a secret",
            fix,
        )


# ── single instance ──────────────────────────────────────────────────────────


class AlreadyRunning(Exception):  # noqa: N818 (the name the CLI and API contract use)
    """Another process holds the state directory's lock."""

    def __init__(self, path: Path, pid: int | None) -> None:
        """Name the lock file and the holder's pid (``None`` when it wrote none yet)."""
        self.path = path
        self.pid = pid
        who = f"pid {pid}" if pid is not None else "a process whose pid is not recorded yet"
        super().__init__(
            f"another vramctl ({who}) holds {path}: only one controller may use a state "
            f"directory; stop it, or give this one another --state-dir"
        )


class StateLock:
    """An exclusive, non-blocking ``flock`` on ``state_dir/vramctl.lock``.

    The holder writes its pid into the file. The kernel drops the lock when the
    holder's file is closed or the process dies (even by SIGKILL), so a stale lock
    file never blocks a restart. The file is never deleted (deleting a flock file
    lets two processes lock two different inodes).
    """

    def __init__(self, state_dir: Path) -> None:
        """A lock on ``state_dir`` (not taken until :meth:`acquire`)."""
        self.path = Path(state_dir) / LOCK_NAME
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        """True while this object holds the lock."""
        return self._fd is not None

    def acquire(self) -> None:
        """Take the lock, or raise :class:`AlreadyRunning` naming the holder's pid."""
        if self._fd is not None:
            return
        created = not self.path.parent.exists()
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR_MODE)
        if not created:
            warn_if_open(self.path.parent, "the state directory")
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, PRIVATE_FILE_MODE)
        try:
            if stat.S_IMODE(os.fstat(fd).st_mode) & 0o077:
                os.fchmod(fd, PRIVATE_FILE_MODE)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _read_pid(fd)
            os.close(fd)
            raise AlreadyRunning(self.path, pid) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        os.fsync(fd)
        self._fd = fd

    def release(self) -> None:
        """Drop the lock (idempotent); the pid is cleared from the file."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def close(self) -> None:
        """Same as :meth:`release`."""
        self.release()

    def __enter__(self) -> Self:
        self.acquire()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 64, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None
