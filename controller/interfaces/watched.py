"""The manifest set a long-running command draws from, re-read when one of its files changes.

``status --watch`` draws for minutes or hours while the operator edits the manifest:
:class:`WatchedManifests` looks at its files' identity (inode, size, modification time)
at every draw and loads the set again when any changed, so the next draw shows the
edit. An edit that does not load (a half-written save, a mistake) keeps the last good
set in force, as the loop does (docs/operations.md), and its located errors are told
with every draw until the files change again.

This module reads the manifest files only; it must not observe the host or decide
anything.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from controller.manifest import ManifestError, ManifestSet, load_manifest_set

__all__ = ["WatchedManifests"]

#: a file's identity as seen by ``stat``: (inode, size, mtime ns); ``None``: unreadable
_Stamp = tuple[int, int, int] | None


def _stamp(path: Path) -> _Stamp:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


class WatchedManifests:
    """The set in force for ``paths`` (first ``mset``), re-read when a file changes."""

    def __init__(self, paths: Sequence[Path], mset: ManifestSet) -> None:
        self.paths = tuple(paths)
        self.mset = mset
        #: the located errors of the files as they are now, when they do not load
        self.errors: tuple[str, ...] = ()
        self._stamps = self._now()

    def _now(self) -> tuple[_Stamp, ...]:
        return tuple(_stamp(p) for p in (*self.paths, *self.mset.files))

    def current(self) -> tuple[ManifestSet, list[str]]:
        """The set in force, and what to tell beside it (an edit that does not load, or
        the warnings of one that did)."""
        stamps = self._now()
        if stamps != self._stamps:
            self._stamps = stamps
            try:
                self.mset = load_manifest_set(self.paths)
            except ManifestError as exc:
                self.errors = tuple(str(e) for e in exc.errors)
            else:
                self.errors = ()
                self._stamps = self._now()  # the set's own files may have changed
        if self.errors:
            return self.mset, [
                "manifest: the files as they are now do not load; the last good set is "
                "shown until they do:",
                *(f"  {e}" for e in self.errors),
            ]
        return self.mset, [f"manifest: {w}" for w in self.mset.warnings]
