"""Manifest watching: report once that the manifest files changed, as soon as they settle.

:func:`watch_files` yields once per change of any of the given files. It watches their
folders, not the files, so an editor that saves by writing a temporary file and renaming
it over the manifest is seen (the rename is the change; the temporary file is not ours).
A change is reported when the files have been quiet for ``quiet_ms`` after the last
event, or ``debounce_ms`` after the first one at the latest (a file written without
pause still gets read): an editor that truncates and then writes, or writes a file in
two writes, is one change, not a half-written file and then the whole one.

On Linux the folders are watched with inotify (through ``ctypes``, on the event loop's
own reader): nothing wakes while nothing changes, and an event is seen at once. Elsewhere
(or where inotify cannot be had) watchfiles polls its notifier every 50 ms and its
batches are settled the same way.

A watch ends with an exception when a folder cannot be watched or stops being watchable
(it is removed, moved, unmounted); the caller logs it and starts a new watch. This module
must not read or parse the files (the loop does), decide anything, or touch docker.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import os
import struct
import sys
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable
from pathlib import Path

QUIET_MS = 20  # a change is read once the files were quiet this long

# inotify(7)
_IN_MODIFY = 0x002
_IN_CLOSE_WRITE = 0x008
_IN_MOVED_FROM = 0x040
_IN_MOVED_TO = 0x080
_IN_CREATE = 0x100
_IN_DELETE = 0x200
_IN_DELETE_SELF = 0x400
_IN_MOVE_SELF = 0x800
_IN_UNMOUNT = 0x2000
_IN_Q_OVERFLOW = 0x4000
_IN_IGNORED = 0x8000
_IN_ONLYDIR = 0x01000000
_IN_NONBLOCK = os.O_NONBLOCK
_IN_CLOEXEC = os.O_CLOEXEC
_CHANGES = _IN_MODIFY | _IN_CLOSE_WRITE | _IN_MOVED_FROM | _IN_MOVED_TO | _IN_CREATE | _IN_DELETE
_GONE = _IN_DELETE_SELF | _IN_MOVE_SELF | _IN_UNMOUNT | _IN_IGNORED
_HEADER = struct.Struct("iIII")  # wd, mask, cookie, len (then len bytes of name)


class WatchError(OSError):
    """A folder cannot be watched, or is no longer watched (removed, moved, unmounted)."""


async def watch_files(
    files: Iterable[Path],
    *,
    debounce_ms: int = 300,
    quiet_ms: int = QUIET_MS,
    watching: Callable[[], None] | None = None,
) -> AsyncIterator[None]:
    """Yield once per settled change of any of ``files`` (absolute, resolved paths).
    ``watching()`` is called once the watch is set (inotify's, on Linux), before any
    change is waited for: what changed before then is the caller's to read again."""
    wanted = {Path(f) for f in files}
    source = _Inotify.open(wanted) if sys.platform.startswith("linux") else None
    changes = source.changes() if source is not None else _watchfiles_changes(wanted, debounce_ms)
    if watching is not None:
        watching()
    try:
        async for _ in _settled(changes, debounce_ms=debounce_ms, quiet_ms=quiet_ms):
            yield
    finally:
        if source is not None:
            source.close()


async def _settled(
    changes: AsyncGenerator[None, None], *, debounce_ms: int, quiet_ms: int
) -> AsyncIterator[None]:
    """One item per burst of ``changes``: once quiet for ``quiet_ms``, or ``debounce_ms``
    after the burst's first change at the latest."""
    loop = asyncio.get_running_loop()
    quiet_s = max(0, quiet_ms) / 1000
    debounce_s = max(quiet_ms, debounce_ms) / 1000
    pending: asyncio.Task[None] | None = None
    try:
        while True:
            if pending is None:
                await anext(changes)
            else:  # the wait for the next change began while the last one settled
                await pending
                pending = None
            first = loop.time()
            deadline = first + quiet_s
            while True:
                left = min(deadline, first + debounce_s) - loop.time()
                if left <= 0:
                    break
                pending = pending or asyncio.ensure_future(anext(changes))
                done, _ = await asyncio.wait({pending}, timeout=left)
                if not done:
                    break
                pending.result()  # a failed watch raises here
                pending = None
                deadline = loop.time() + quiet_s
            yield
    finally:
        if pending is not None:
            pending.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await pending
        await changes.aclose()


class _Inotify:
    """inotify on the folders of the wanted files, read on the running loop."""

    def __init__(self, fd: int, dirs: dict[int, tuple[bytes, frozenset[bytes]]]) -> None:
        self.fd = fd
        self.dirs = dirs  # watch descriptor -> (folder, names of wanted files in it)
        self.ready = asyncio.Event()
        self.seen = False
        self.failed: WatchError | None = None
        self.buffer = b""
        self.closed = False
        asyncio.get_running_loop().add_reader(fd, self._read)

    @classmethod
    def open(cls, wanted: set[Path]) -> _Inotify | None:
        """A watch of the folders of ``wanted``; ``None`` where inotify is not available."""
        libc = _libc()
        if libc is None:
            return None
        fd = libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if fd < 0:
            return None
        by_dir: dict[bytes, set[bytes]] = {}
        for f in wanted:
            by_dir.setdefault(os.fsencode(f.parent), set()).add(os.fsencode(f.name))
        dirs: dict[int, tuple[bytes, frozenset[bytes]]] = {}
        try:
            for folder, names in sorted(by_dir.items()):
                wd = libc.inotify_add_watch(
                    fd, folder, _CHANGES | _IN_DELETE_SELF | _IN_MOVE_SELF | _IN_ONLYDIR
                )
                if wd < 0:
                    code = ctypes.get_errno()
                    raise WatchError(
                        code, f"cannot watch {os.fsdecode(folder)}: {os.strerror(code)}"
                    )
                dirs[wd] = (folder, frozenset(names))
        except BaseException:
            os.close(fd)
            raise
        return cls(fd, dirs)

    def _read(self) -> None:
        try:
            data = os.read(self.fd, 65536)
        except BlockingIOError:
            return
        except OSError as exc:
            self._fail(WatchError(exc.errno or errno.EIO, f"inotify: {exc}"))
            return
        buf = self.buffer + data
        at = 0
        while at + _HEADER.size <= len(buf):
            wd, mask, _cookie, size = _HEADER.unpack_from(buf, at)
            end = at + _HEADER.size + size
            if end > len(buf):
                break
            name = buf[at + _HEADER.size : end].rstrip(b"\0")
            at = end
            watched = self.dirs.get(wd)
            if mask & _IN_Q_OVERFLOW:
                self.seen = True  # events were lost: one of them may have been ours
            elif watched is not None and mask & _GONE:
                self._fail(
                    WatchError(errno.ENOENT, f"{os.fsdecode(watched[0])} is no longer watched")
                )
            elif watched is not None and mask & _CHANGES and name in watched[1]:
                self.seen = True
        self.buffer = buf[at:]
        if self.seen:
            self.ready.set()

    def _fail(self, exc: WatchError) -> None:
        if self.failed is None:
            self.failed = exc
        self.ready.set()

    async def changes(self) -> AsyncGenerator[None, None]:
        """One item per batch of events that concerns a wanted file."""
        while True:
            await self.ready.wait()
            self.ready.clear()
            if self.failed is not None:
                raise self.failed
            if self.seen:
                self.seen = False
                yield

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            asyncio.get_running_loop().remove_reader(self.fd)
            os.close(self.fd)


def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.inotify_init1.argtypes = [ctypes.c_int]
        libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
    except (OSError, AttributeError):
        return None
    return libc


async def _watchfiles_changes(wanted: set[Path], debounce_ms: int) -> AsyncGenerator[None, None]:
    """watchfiles' batches that concern a wanted file (where inotify is not available)."""
    import watchfiles

    def ours(_change: watchfiles.Change, path: str) -> bool:
        return Path(path) in wanted

    async for _batch in watchfiles.awatch(
        *sorted({str(f.parent) for f in wanted}),
        watch_filter=ours,
        debounce=debounce_ms,
        step=50,
        recursive=False,
    ):
        yield
