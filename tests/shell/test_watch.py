"""The manifest watcher: one settled change per edit, however the editor writes the file.

Real files and the real watcher (inotify on Linux): an editor that writes a file in two
writes, or truncates it and writes it, or writes a temporary file and renames it over
the manifest, makes one change (one reload), and files beside the manifest make none.
No timed assertions: the settle window is made long (``quiet_ms``) where two writes must
fall inside it, and every wait polls against a generous deadline. Nothing is written
before the watch is seen in place (this process's inotify watch of the folder, in
``/proc/self/fdinfo``), the second of two writes only once the watcher has read the
events of the first (its inotify queue is empty: ``FIONREAD``), and a check that
nothing came waits only after the watcher has read what it must ignore.
"""

from __future__ import annotations

import array
import asyncio
import fcntl
import os
import termios
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
from support.waiting import WAIT_S

from controller.manifest import load_manifest_set
from controller.service.loop import Controller, RunOptions
from controller.service.watch import WatchError, watch_files

ROLE = '[[gpu_roles]]\nid = "a"\nvram_mib = 1000\n'


def serve(name: str, desired: str = "running") -> str:
    return (
        f'\n[[serve]]\nname = "{name}"\ncontainer = "c-{name}"\ngpu_role = "a"\n'
        f'vram_mib = 100\nresidency = "resident"\ndesired = "{desired}"\n'
    )


class Seen:
    """Counts what a watch of ``files`` yields, in a task on the running loop."""

    def __init__(self, files: set[Path], quiet_ms: int) -> None:
        self.count = 0
        self.error: BaseException | None = None

        async def follow() -> None:
            try:
                async for _ in watch_files(files, debounce_ms=5000, quiet_ms=quiet_ms):
                    self.count += 1
            except WatchError as exc:
                self.error = exc

        self.task = asyncio.create_task(follow())

    async def until(self, what: str, check: Callable[[], bool]) -> None:
        deadline = asyncio.get_running_loop().time() + WAIT_S
        while not check():
            assert asyncio.get_running_loop().time() < deadline, f"never: {what}"
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        self.task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await self.task


def inotify_of(folder: Path) -> int | None:
    """This process's inotify descriptor that watches ``folder``; ``None`` while none does.

    Read from ``/proc/self/fdinfo``: a watch's line names the folder's inode and its
    device (the kernel's encoding, major << 20 | minor).
    """
    st = folder.stat()
    ino, dev = f" ino:{st.st_ino:x} ", f" sdev:{os.major(st.st_dev) << 20 | os.minor(st.st_dev):x} "
    for fd in os.listdir("/proc/self/fdinfo"):
        try:
            info = Path("/proc/self/fdinfo", fd).read_text(encoding="ascii")
        except OSError:  # closed meanwhile
            continue
        if any(ln.startswith("inotify ") and ino in ln and dev in ln for ln in info.splitlines()):
            return int(fd)
    return None


async def watched(folder: Path) -> int:
    """Wait until a watch of ``folder`` is in place; its inotify descriptor."""
    deadline = asyncio.get_running_loop().time() + WAIT_S
    while (fd := inotify_of(folder)) is None:
        assert asyncio.get_running_loop().time() < deadline, f"{folder} was never watched"
        await asyncio.sleep(0.01)
    return fd


def drained(fd: int) -> None:
    """Wait (in a thread) until the watcher has read every event queued on ``fd``."""
    deadline = time.monotonic() + WAIT_S
    queued = array.array("i", [0])
    while fcntl.ioctl(fd, termios.FIONREAD, queued) == 0 and queued[0] > 0:
        assert time.monotonic() < deadline, f"{queued[0]} bytes of events never read"
        time.sleep(0.005)


def two_writes(path: Path, text: str, fd: int) -> None:
    """An editor's save in two writes (truncate and write half, then the rest)."""
    with path.open("w", encoding="utf-8") as fh:
        fh.write(text[: len(text) // 2])
        fh.flush()
        os.fsync(fh.fileno())
        drained(fd)  # the events of the first write are read before the second
        fh.write(text[len(text) // 2 :])


def run(scenario: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(scenario())


def test_two_writes_in_quick_succession_are_one_change(tmp_path: Path) -> None:
    path = tmp_path / "serves.toml"
    path.write_text(ROLE + serve("s1"), encoding="utf-8")
    text = ROLE + serve("s1", "stopped") + serve("s2")

    async def scenario() -> None:
        seen = Seen({path.resolve()}, quiet_ms=2000)
        fd = await watched(tmp_path)
        # truncate, write half, a pause well inside the settle window, then the rest
        await asyncio.to_thread(two_writes, path, text, fd)
        await seen.until("the edit is seen", lambda: seen.count >= 1)
        # a second settle window later, nothing more came: the two writes were one change
        await asyncio.sleep(2.5)
        assert seen.count == 1
        await seen.stop()

    run(scenario)


def test_a_save_by_rename_is_one_change_and_files_beside_are_none(tmp_path: Path) -> None:
    path = tmp_path / "serves.toml"
    path.write_text(ROLE + serve("s1"), encoding="utf-8")

    async def scenario() -> None:
        seen = Seen({path.resolve()}, quiet_ms=100)
        fd = await watched(tmp_path)
        (tmp_path / "notes.txt").write_text("not a manifest", encoding="utf-8")
        (tmp_path / "other.toml").write_text(ROLE, encoding="utf-8")
        await asyncio.to_thread(drained, fd)  # the watcher has read their events
        await asyncio.sleep(0.5)  # five settle windows after that
        assert seen.count == 0, "a file beside the manifest was taken for it"
        # the editor's save: a temporary file in the folder, renamed over the manifest
        tmp = tmp_path / ".serves.toml.swp"
        tmp.write_text(ROLE + serve("s1", "stopped"), encoding="utf-8")
        tmp.replace(path)
        await seen.until("the rename is seen", lambda: seen.count >= 1)
        await asyncio.sleep(0.5)
        assert seen.count == 1
        # and each later edit is seen again
        path.write_text(ROLE + serve("s1"), encoding="utf-8")
        await seen.until("the next edit is seen", lambda: seen.count >= 2)
        await seen.stop()

    run(scenario)


def test_a_folder_removed_while_watched_ends_the_watch(tmp_path: Path) -> None:
    folder = tmp_path / "manifests"
    folder.mkdir()
    path = folder / "serves.toml"
    path.write_text(ROLE, encoding="utf-8")

    async def scenario() -> None:
        seen = Seen({path.resolve()}, quiet_ms=50)
        await watched(folder)  # removed while watched, not before the watch began
        path.unlink()
        folder.rmdir()
        await seen.until("the watch ends", seen.task.done)
        assert isinstance(seen.error, WatchError), seen.error

    run(scenario)


def test_the_loop_reloads_two_quick_writes_once(tmp_path: Path) -> None:
    """The controller's own watch: the two writes ask for one reload, of the whole file."""
    path = tmp_path / "serves.toml"
    path.write_text(ROLE + serve("s1"), encoding="utf-8")
    c = Controller(
        RunOptions(manifests=(path,), state_dir=tmp_path / "state", settle_ms=2000),
        load_manifest_set([path]),
    )
    text = ROLE + serve("s1", "stopped") + serve("s2")

    async def scenario() -> None:
        task = asyncio.create_task(c.watch_manifests())
        fd = await watched(tmp_path)
        await asyncio.to_thread(two_writes, path, text, fd)  # the first half does not validate
        deadline = asyncio.get_running_loop().time() + WAIT_S
        while "manifest changed" not in c.reasons:
            assert asyncio.get_running_loop().time() < deadline, "the edit was never seen"
            await asyncio.sleep(0.01)
        await asyncio.sleep(2.5)
        assert c.reasons.count("manifest changed") == 1, c.reasons
        task.cancel()

    run(scenario)
    assert c.manifest_dirty
    c.reconciler.reread_manifest()  # the one reload the cycle makes: the whole file, valid
    assert c.manifest_error == []
    assert set(c.mset.serves) == {"s1", "s2"}
