"""Where the Docker client looks for the daemon, and why it could not get there.

:func:`docker_endpoint` says where :func:`controller.adapters.docker.read.make_client`
looks, in the order ``docker.from_env`` does: ``DOCKER_HOST``, else the current Docker
context (``DOCKER_CONTEXT`` or ``~/.docker/config.json``), else the default socket.
:func:`unreachable_message` turns a failed call into one line for the operator: where it
looked, what the connection met (no such socket, permission denied, refused, no answer)
and what to do about it — never the exception's own text when a cause is recognised
(docs/operations.md, "Docker cannot be reached").

This module only describes: it must not connect to anything or change the environment.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator, Mapping

__all__ = ["DEFAULT_SOCKET", "docker_endpoint", "unreachable_message"]

DEFAULT_SOCKET = "unix:///var/run/docker.sock"

_START = "start the Docker daemon, or set DOCKER_HOST to where it listens"
#: errno of the connection's failure -> (what it met, what to do)
_CAUSES: dict[int, tuple[str, str]] = {
    errno.ENOENT: ("no such socket", _START),
    errno.ECONNREFUSED: ("connection refused", _START),
    errno.EACCES: (
        "permission denied",
        "run vramctl as a user in the socket's group (usually docker), or as root",
    ),
    errno.EHOSTUNREACH: ("host unreachable", "check the network path to DOCKER_HOST"),
    errno.ENETUNREACH: ("network unreachable", "check the network path to DOCKER_HOST"),
    errno.ETIMEDOUT: ("no answer", "the daemon is hung or the network path drops packets"),
}
_CAUSES[errno.EPERM] = _CAUSES[errno.EACCES]
_TIMEOUT = ("no answer in time", "the daemon is overloaded or hung: `docker info` shows which")
_OTHER = "check that the Docker daemon runs and that DOCKER_HOST (or the Docker context) names it"


def docker_endpoint(environment: Mapping[str, str] | None = None) -> str:
    """Where the client looks, and why there: ``URL (DOCKER_HOST)``, ``URL (Docker
    context NAME)`` or ``unix:///var/run/docker.sock (the default: DOCKER_HOST is not set)``."""
    env = os.environ if environment is None else environment
    host = env.get("DOCKER_HOST")
    if host:
        return f"{host} (DOCKER_HOST)"
    try:
        from docker.context import ContextAPI

        context = ContextAPI.get_context(env.get("DOCKER_CONTEXT"))
    except Exception:  # an unreadable config: the client fails on it too, and says so
        context = None
    name = getattr(context, "Name", None)
    url = getattr(context, "Host", None)
    if context is not None and name != "default" and url:
        return f"{url} (Docker context {name})"
    return f"{DEFAULT_SOCKET} (the default: DOCKER_HOST is not set)"


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and every exception beneath it: causes, contexts, arguments, ``reason``."""
    seen: set[int] = set()
    todo = [exc]
    while todo:
        e = todo.pop(0)
        if id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        below = [e.__cause__, e.__context__, getattr(e, "reason", None), *e.args]
        todo.extend(b for b in below if isinstance(b, BaseException))


def _cause(exc: BaseException) -> tuple[str, str] | None:
    """What the connection met, from the first errno (or timeout) beneath ``exc``."""
    for e in _chain(exc):
        if isinstance(e, OSError) and e.errno in _CAUSES:
            return _CAUSES[e.errno]
        if isinstance(e, TimeoutError) or "Timeout" in type(e).__name__:
            return _TIMEOUT
    return None


def unreachable_message(exc: BaseException, where: str) -> str:
    """One line: ``docker unreachable at WHERE: WHAT; WHAT TO DO``."""
    cause = _cause(exc)
    if cause is None:
        text = " ".join((str(exc).strip() or type(exc).__name__).split())
        cause = (f"{type(exc).__name__}: {text}", _OTHER)
    met, todo = cause
    return f"docker unreachable at {where}: {met}; {todo}"
