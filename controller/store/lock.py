"""One controller per state directory: an exclusive ``flock`` on ``vramctl.lock``.

:class:`StateLock` takes the lock (or raises :class:`AlreadyRunning` naming the
holder's pid); the kernel drops it when the holder dies, so a stale file never blocks a
restart. It also holds the state directory's file modes, the warning for a folder or
file open to every user, and :class:`StateDirError`: a state directory this user may
not read or lock, said in one paragraph with how to fix it. This module must not read
or write the journal.
"""

from __future__ import annotations

import fcntl
import os
import pwd
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


# ── access ───────────────────────────────────────────────────────────────────


class StateDirError(Exception):
    """The state directory exists but this user may not ``doing`` it (read its journal,
    take its lock): one paragraph naming the directory, what the system refused and
    how to fix it (docs/operations.md, "Replay and the journal")."""

    def __init__(self, state_dir: Path, doing: str, exc: OSError) -> None:
        self.state_dir = state_dir.absolute()  # the fix's commands work from anywhere
        super().__init__(_access_paragraph(self.state_dir, doing, exc))


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _access_paragraph(state_dir: Path, doing: str, exc: OSError) -> str:
    me = _user(os.geteuid())
    why = exc.strerror or str(exc)
    if exc.filename is not None and Path(exc.filename).absolute() != state_dir:
        why += f": {Path(exc.filename).absolute()}"
    try:
        st = state_dir.stat()
    except OSError:
        owner, whose = None, f"this command runs as {me}"
    else:
        owner = _user(st.st_uid)
        mode = stat.S_IMODE(st.st_mode)
        whose = f"it belongs to {owner} (mode {mode:04o}) and this command runs as {me}"
    as_owner = (
        f"run this command as {owner}, the user `vramctl run` keeps it for (`sudo -u {owner} "
        "vramctl ...`)"
        if owner is not None and owner != me
        else "run this command as the user `vramctl run` runs as"
    )
    return (
        f"cannot {doing} the state directory {state_dir} ({why}): {whose}. The journal "
        "there is private to the user that runs the controller. Fix: "
        f"{as_owner}; or, if this user is to run the controller, give it the directory "
        f"(`sudo chown -R {me} {state_dir}`); or name another state directory with "
        "--state-dir DIR (VRAMCTL_STATE_DIR)."
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
        """Take the lock, or raise :class:`AlreadyRunning` naming the holder's pid
        (:class:`StateDirError`: this user may not create or open the lock file)."""
        if self._fd is not None:
            return
        try:
            fd = self._open()
        except OSError as exc:
            raise StateDirError(self.path.parent, "lock", exc) from None
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

    def _open(self) -> int:
        """The lock file, opened for writing (the state directory created when missing)."""
        created = not self.path.parent.exists()
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR_MODE)
        if not created:
            warn_if_open(self.path.parent, "the state directory")
        return os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, PRIVATE_FILE_MODE)

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
