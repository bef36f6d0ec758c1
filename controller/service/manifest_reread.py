"""The manifest set as the control loop follows it: watched, re-read, checked.

:func:`watch_manifests` watches the manifests' folders for as long as the loop runs and
calls ``changed`` once per settled edit (see :mod:`controller.service.watch`); nothing
ends the watch for good: a failed watch is logged, reported as a change (an edit may
have been missed) and started again. :func:`read_manifests` re-reads the set: an edit
that does not validate (or a loader that fails) gives its located errors and no set, so
the caller keeps the last good set in force. :class:`RouterNotice` says which serves
declare a router tier while no router is configured (at start, again when that changes).

This module must not apply a manifest (the loop does), decide or touch docker.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from loguru import logger

from controller.manifest import LocatedError, ManifestError, ManifestSet, load_manifest_set
from controller.service.watch import watch_files
from statemachine.planning.router_tiers import no_router_warning, router_tiers

#: seconds before a failed watch is started again
_RESTART_S = 1.0


async def watch_manifests(
    manifests: Iterable[Path], debounce_ms: int, settle_ms: int, changed: Callable[[str], None]
) -> None:
    """Watch the manifests' folders until cancelled (or the watch ends by itself);
    ``changed(reason)`` once per settled edit, once each time the watch is set (an edit
    made before it, while the controller started or the watch restarted, is read then:
    a set read again unchanged changes nothing) and once per restart of a failed watch."""

    def watching() -> None:
        changed("manifest watch set: read again")

    while True:
        try:
            files = {_path_key(p) for p in manifests}
            # reported once the files settle (see controller.service.watch): an editor's
            # two writes, or its write and rename, are one change and one reload
            async for _change in watch_files(
                files, debounce_ms=debounce_ms, quiet_ms=settle_ms, watching=watching
            ):
                changed("manifest changed")
            return  # the watch ended without an error (its stop event): we are stopping
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            logger.error("manifest watcher failed ({!r}); restarting it in 1 s", exc)
        await asyncio.sleep(_RESTART_S)
        changed("manifest watcher restarted")


@dataclass(frozen=True, slots=True)
class ManifestRead:
    """A re-read of the manifest set: the set, or why it cannot be had."""

    mset: ManifestSet | None
    errors: list[str] = field(default_factory=list)
    #: the same problems, located (``None``: the loader itself failed, nothing located)
    issues: list[LocatedError] | None = None


def read_manifests(manifests: Iterable[Path]) -> ManifestRead:
    """The manifest set as the files are now; its errors logged where it is not valid."""
    try:
        return ManifestRead(load_manifest_set(list(manifests)))
    except ManifestError as exc:
        errors = [str(e) for e in exc.errors]
        for line in errors:
            logger.error("manifest: {} (the last good manifest stays in force)", line)
        return ManifestRead(None, errors, list(exc.errors))
    except Exception as exc:  # a loader bug must not take the manifest in force away
        logger.exception("manifest: cannot be loaded")
        error = f"cannot be loaded: {type(exc).__name__}: {exc}"
        logger.error("manifest: {} (the last good manifest stays in force)", error)
        return ManifestRead(None, [error], None)


class RouterNotice:
    """Without a router: which serves declare a tier (said when that changes)."""

    def __init__(self) -> None:
        self._said: dict[str, str] = {}  # the tiers last said to need a router

    def say(self, mset: ManifestSet, router_url: str | None) -> None:
        tiers = {} if router_url else router_tiers(mset.desired())
        if tiers and tiers != self._said:
            logger.warning("{}", no_router_warning(tiers))
        self._said = tiers


def _path_key(path: Path) -> Path:
    """``path`` resolved, or only made absolute where it cannot be (a symlink loop)."""
    try:
        return path.resolve()
    except (OSError, RuntimeError):
        return Path(os.path.abspath(path))
