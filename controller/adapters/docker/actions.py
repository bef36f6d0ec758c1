"""Docker actions: the mutating Docker adapter the executor calls, one container at a time.

:class:`DockerActions` wraps a :class:`docker.DockerClient` and offers exactly what
the executor needs to carry out a plan step on a container that already exists:

* :meth:`~DockerActions.start` (``docker start``; a container that already runs is a
  success) and :meth:`~DockerActions.stop` (``docker stop -t N``; the container is
  kept, and one that is already stopped is a success);
* :meth:`~DockerActions.inspect` / :meth:`~DockerActions.exists`: a fresh reading of
  one container in the observed-snapshot vocabulary (:class:`ContainerModel`, mapped
  by the read-only adapter's own helpers so both speak the same words);
* :meth:`~DockerActions.logs`: the last lines of a container's output for an error
  message (never raises);
* :meth:`~DockerActions.run_up`: one operator-declared command line (a serve's
  ``up`` command, e.g. ``docker compose up -d SERVICE``) run without a shell, in a
  clean environment (what Docker and Compose need, the variables the operator names
  in ``VRAMCTL_UP_ENV_PASS``, plus the serve's ``up_env``; never the controller's
  tokens), with its output captured and its run time bounded;
* preflight probes: :meth:`~DockerActions.executable_exists` and
  :meth:`~DockerActions.port_in_use`.

Errors are :class:`ActionError` with ``transient`` set. Transient faults (the daemon
unreachable or slow, a 5xx from it) are retried inside the method with tenacity,
bounded both in attempts (``attempts``) and in time (``max_wait_s``: no retry starts
after that many seconds, and the sleeps never add up to more); when they run out the
method raises ``ActionError(transient=True)``. A permanent fault (no such container,
a 4xx, a 5xx whose message says the request itself cannot work) is raised at once.

Everything here is synchronous: the executor calls it from a worker thread.

This module must not decide anything (which container to stop, in what order, or
whether a fault is worth another reconcile: that is the planner's and the
executor's job), must not create, remove, kill, rename, pause or pull anything, and
must not be called by anything but the executor.
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import docker
from docker.errors import APIError, DockerException, NotFound
from requests import exceptions as requests_errors  # type: ignore[import-untyped,unused-ignore]
from tenacity import retry_if_exception

from controller.adapters.docker.read import (
    COMPOSE_PROJECT_LABEL,
    _details,
    map_docker_state,
    told_gpu_role,
)
from controller.adapters.retry import AdapterError, RetryKnobs, attempts_of, exhausted
from controller.snapshot import ContainerModel
from statemachine.ledger.gpu_vars import GPU_ENV_NAMES

__all__ = [
    "DEFAULT_LOG_TAIL",
    "UP_ENV_NEVER",
    "UP_ENV_PASS",
    "UP_ENV_PASS_VAR",
    "UP_ENV_PREFIXES",
    "ActionError",
    "DockerActions",
    "UpResult",
    "is_transient",
    "up_env_pass_names",
    "up_environment",
]

T = TypeVar("T")

#: ``requests``' faults that mean the daemon could not be reached or was too slow.
_UNREACHABLE: tuple[type[BaseException], ...] = (
    requests_errors.ConnectionError,
    requests_errors.Timeout,
)

#: Lines :meth:`DockerActions.logs` returns by default.
DEFAULT_LOG_TAIL = 40
#: Lines and characters of a command's output an :class:`UpResult` keeps.
_OUTPUT_TAIL_LINES = 40
_OUTPUT_TAIL_CHARS = 4000
#: Seconds to wait for the output of a command killed at its timeout.
_KILL_GRACE_S = 5.0

#: Variables of the controller's environment an ``up`` command is given (when set);
#: every other one (the API and router tokens, engine tokens, proxies, cloud
#: credentials) stays with the controller. A serve adds its own with ``up_env``.
UP_ENV_PASS: tuple[str, ...] = (
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "LANG",
    "LANGUAGE",
    "TZ",
    "TMPDIR",
    "XDG_RUNTIME_DIR",
    "DOCKER_HOST",
    "DOCKER_CONTEXT",
    "DOCKER_CONFIG",
    "DOCKER_CERT_PATH",
    "DOCKER_TLS_VERIFY",
    "DOCKER_API_VERSION",
    "DOCKER_BUILDKIT",
    "DOCKER_DEFAULT_PLATFORM",
)
#: Prefixes of the variables passed on as well: the locale's and Docker Compose's.
UP_ENV_PREFIXES: tuple[str, ...] = ("LC_", "COMPOSE_")
#: The controller's variable that names further variables of its own environment to
#: pass on to every ``up`` command (names separated by spaces or commas): the operator's
#: explicit choice, as systemd's ``PassEnvironment=`` (e.g. the image tag a compose
#: file interpolates, which changes between runs and so cannot sit in ``up_env``).
UP_ENV_PASS_VAR = "VRAMCTL_UP_ENV_PASS"
#: The controller's secrets: never passed on, even when named there.
UP_ENV_NEVER: tuple[str, ...] = ("VRAMCTL_TOKEN", "VRAMCTL_ROUTER_TOKEN", "ANVIL_ROUTER_TOKEN")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*", re.ASCII)


def up_env_pass_names(environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The names :data:`UP_ENV_PASS_VAR` lists in ``environ`` (default: the controller's).

    Raises :class:`ValueError` saying which name is wrong: one that is not a variable
    name, one of the controller's secrets (:data:`UP_ENV_NEVER`), or one the controller
    sets for each start (``VRAMCTL_GPU_*``, :mod:`statemachine.ledger.gpu_vars`).
    """
    source = os.environ if environ is None else environ
    names = tuple(dict.fromkeys(source.get(UP_ENV_PASS_VAR, "").replace(",", " ").split()))
    for name in names:
        if not _ENV_NAME.fullmatch(name):
            raise ValueError(
                f"{UP_ENV_PASS_VAR}: {name!r} is not an environment variable name "
                "(letters, digits and _, not starting with a digit)"
            )
        if name in UP_ENV_NEVER:
            raise ValueError(
                f"{UP_ENV_PASS_VAR}: {name} is the controller's own secret and is never "
                "passed to an up command; give the command what it needs with the serve's "
                "up_env, or in the compose project's .env file"
            )
        if name in GPU_ENV_NAMES:
            raise ValueError(
                f"{UP_ENV_PASS_VAR}: {name} is set by the controller for each start (the "
                "GPU it put the serve on, what its engine will find free there) and is never "
                "passed on from its own environment"
            )
    return names


def up_environment(
    extra: Mapping[str, str] | None = None, environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The environment of an ``up`` command: the passed-on part of ``environ`` + ``extra``.

    Passed on: :data:`UP_ENV_PASS`, :data:`UP_ENV_PREFIXES` and the names
    :data:`UP_ENV_PASS_VAR` lists (:func:`up_env_pass_names`; a wrong list raises
    :class:`ValueError`), those that are set. ``environ`` defaults to the controller's
    own; ``extra`` (a serve's ``up_env``) wins over it. ``PATH`` falls back to the
    system default when unset.
    """
    source = os.environ if environ is None else environ
    named = frozenset(up_env_pass_names(source))
    env = {
        name: value
        for name, value in source.items()
        if name in UP_ENV_PASS or name in named or name.startswith(UP_ENV_PREFIXES)
    }
    env.setdefault("PATH", os.defpath)
    env.update(extra or {})
    return env


#: Phrases in a 5xx answer that say the request itself cannot work, so a retry
#: would only repeat it (Docker reports some of these as 500, not 4xx).
_PERMANENT_5XX = (
    "no such container",
    "no such image",
    "oci runtime",
    "executable file not found",
    "exec format error",
    "port is already allocated",
    "address already in use",
    "is marked for removal",
)


class ActionError(AdapterError):
    """A Docker action that failed (404 ``status`` for a missing container)."""


@dataclass(frozen=True, slots=True)
class UpResult:
    """The outcome of :meth:`DockerActions.run_up`.

    ``returncode`` is the command's exit status, 127 when the executable (or the
    working directory) does not exist, 126 when it cannot be executed, and
    ``None`` when it was killed at its timeout. ``output`` is the tail of its
    stdout and stderr, interleaved; ``message`` says in one line what happened.
    """

    argv: tuple[str, ...]
    returncode: int | None
    output: str
    message: str
    duration_s: float

    @property
    def ok(self) -> bool:
        """Whether the command ran and exited 0."""
        return self.returncode == 0

    @property
    def timed_out(self) -> bool:
        """Whether the command was killed at its timeout."""
        return self.returncode is None


def _describe(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return f"{type(exc).__name__}: {text}"


def _api_status(exc: APIError) -> int | None:
    status = getattr(exc, "status_code", None)
    return status if isinstance(status, int) else None


def _api_message(exc: APIError) -> str:
    explanation = getattr(exc, "explanation", None)
    if isinstance(explanation, bytes):
        explanation = explanation.decode("utf-8", errors="replace")
    text = str(explanation or exc).strip()
    return text or type(exc).__name__


def is_transient(exc: BaseException) -> bool:
    """Whether a fault from the Docker SDK may go away by itself (retry it).

    The daemon unreachable or too slow (``requests``' connection errors and
    timeouts), or an API answer with a 5xx status whose message does not say the
    request itself is impossible. Everything else (404, 409, other 4xx, malformed
    arguments) is permanent.
    """
    if isinstance(exc, _UNREACHABLE):
        return True
    if isinstance(exc, NotFound):
        return False
    if isinstance(exc, APIError):
        status = _api_status(exc)
        if status is None or status < 500:
            return False
        message = _api_message(exc).lower()
        return not any(phrase in message for phrase in _PERMANENT_5XX)
    return False


class DockerActions(RetryKnobs):
    """The executor's hands on Docker: start, stop, inspect, logs, ``up`` commands.

    ``attempts`` bounds how many times a call is made for transient faults, and
    ``max_wait_s`` how many seconds may pass before no further retry starts;
    ``initial_wait_s`` is the first backoff sleep (it doubles each time, with
    jitter). The client is the caller's: this class never closes it.
    """

    def __init__(
        self,
        client: docker.DockerClient,
        *,
        attempts: int = 4,
        max_wait_s: float = 20,
        initial_wait_s: float = 0.5,
    ) -> None:
        self.set_retry_knobs(
            attempts=attempts, max_wait_s=max_wait_s, initial_wait_s=initial_wait_s
        )
        self._client = client
        self._api: Any = client.api

    # ── plumbing ──────────────────────────────────────────────────────────────

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        """Run one Docker call, retrying transient faults; map every fault to ActionError."""
        retrying = self.bounded(retry_if_exception(is_transient))
        try:
            return retrying(fn)
        except NotFound as exc:
            raise ActionError(
                f"{what}: not found: {_api_message(exc)}",
                transient=False,
                status=404,
                attempts=attempts_of(retrying),
            ) from exc
        except APIError as exc:
            transient = is_transient(exc)
            status = _api_status(exc)
            tries = attempts_of(retrying)
            after = f" (after {tries} attempts)" if transient else ""
            raise ActionError(
                f"{what}: docker answered {status}: {_api_message(exc)}{after}",
                transient=transient,
                status=status,
                attempts=tries,
            ) from exc
        except _UNREACHABLE as exc:
            raise exhausted(
                ActionError,
                retrying,
                "{what}: docker unreachable (after {n} attempts): {fault}",
                what=what,
                fault=_describe(exc),
            ) from exc
        except (DockerException, requests_errors.RequestException, OSError) as exc:
            raise ActionError(
                f"{what}: {_describe(exc)}", transient=False, attempts=attempts_of(retrying)
            ) from exc

    # ── container actions ─────────────────────────────────────────────────────

    def start(self, name: str) -> None:
        """``docker start NAME``; a container that is already running is a success.

        Raises :class:`ActionError` (``status=404``, permanent) when it does not
        exist. Starting a container does not wait for it to become ready.
        """
        self._call(f"docker start {name}", lambda: self._api.start(name))

    def remove_stopped(self, name: str) -> None:
        """``docker rm NAME`` of a container that is not running (Docker refuses a
        running one without force, which is never asked: a running engine is never
        removed). One already gone is a success."""

        def remove() -> None:
            with contextlib.suppress(NotFound):
                self._api.remove_container(name)

        self._call(f"docker rm {name}", remove)

    def created_for(self, name: str) -> str | None:
        """The ``VRAMCTL_GPU_ROLE`` the container was created with (its environment):
        the card its ``up`` was told; ``None`` when it does not say or does not exist."""

        def read() -> str | None:
            try:
                doc = self._api.inspect_container(name)
            except NotFound:
                return None
            return told_gpu_role(doc) if isinstance(doc, Mapping) else None

        return self._call(f"docker inspect {name}", read)

    def stop(self, name: str, timeout_s: float) -> None:
        """``docker stop -t N NAME``: SIGTERM, then SIGKILL after ``timeout_s`` seconds.

        The container is kept (not removed); one already stopped is a success.
        Docker takes whole seconds, so ``timeout_s`` is rounded up. The HTTP call
        is given that long on top of the client's own timeout.
        """
        if not math.isfinite(timeout_s) or timeout_s < 0:
            raise ValueError(f"stop timeout must be a finite number ≥ 0, not {timeout_s}")
        seconds = math.ceil(timeout_s)
        self._call(f"docker stop {name}", lambda: self._api.stop(name, timeout=seconds))

    def inspect(self, name: str) -> ContainerModel | None:
        """A fresh reading of one container; ``None`` when it does not exist.

        Same vocabulary as the observed snapshot (docs/design.md §5): ``state``, ``health``,
        ``started_at``, ``exit_code``, ``oom_killed``, ``id`` and ``compose_project`` (its
        ``com.docker.compose.project`` label), mapped by the
        read-only adapter's helpers. Raises :class:`ActionError` for Docker faults
        and for a state word the snapshot does not know.
        """

        def read() -> Mapping[str, Any] | None:
            try:
                doc = self._api.inspect_container(name)
            except NotFound:
                return None
            if not isinstance(doc, Mapping):
                raise DockerException(f"unexpected inspect answer {type(doc).__name__}")
            return doc

        doc = self._call(f"docker inspect {name}", read)
        if doc is None:
            return None
        raw_state = doc.get("State")
        word = ""
        if isinstance(raw_state, Mapping):
            status = raw_state.get("Status")
            word = status.lower() if isinstance(status, str) else ""
        state = map_docker_state(word)
        if state is None:
            raise ActionError(
                f"docker inspect {name}: unknown docker state {word!r}", transient=False
            )
        details = _details(doc, state)
        config = doc.get("Config")
        labels = config.get("Labels") if isinstance(config, Mapping) else None
        project = labels.get(COMPOSE_PROJECT_LABEL) if isinstance(labels, Mapping) else None
        fields: dict[str, Any] = {
            "id": doc.get("Id") if isinstance(doc.get("Id"), str) else None,
            "compose_project": project if isinstance(project, str) else None,
            "state": state,
            "health": details.health,
            "started_at": details.started_at,
            "exit_code": details.exit_code,
            "oom_killed": details.oom_killed,
        }
        if word == "removing":
            fields["docker_state"] = word
        return ContainerModel.model_validate(fields)

    def exists(self, name: str) -> bool:
        """Whether a container of that name (or id) exists, in any state."""
        return self.inspect(name) is not None

    def logs(self, name: str, tail: int = DEFAULT_LOG_TAIL) -> str:
        """The last ``tail`` lines of the container's stdout and stderr, decoded.

        Never raises: when they cannot be read, the answer is a line saying why.
        One attempt only (it serves error messages, which must not wait on retries).
        """
        tail = max(0, int(tail))
        try:
            raw = self._api.logs(name, stdout=True, stderr=True, tail=tail)
        except NotFound:
            return f"(no logs: container {name} does not exist)"
        except Exception as exc:
            return f"(logs of {name} unavailable: {_describe(exc)})"
        if isinstance(raw, bytes | bytearray):
            text = bytes(raw).decode("utf-8", errors="replace")
        else:
            text = str(raw)
        lines = text.rstrip("\n").splitlines()
        return "\n".join(lines[-tail:]) if tail else ""

    # ── operator commands ─────────────────────────────────────────────────────

    def run_up(
        self,
        argv: Sequence[str],
        *,
        cwd: Path,
        timeout_s: float,
        env: Mapping[str, str] | None = None,
        on_spawn: Callable[[int], None] | None = None,
    ) -> UpResult:
        """Run one command line (no shell) in ``cwd``, bounded by ``timeout_s`` seconds.

        The command gets a clean environment (:func:`up_environment`): the variables
        of :data:`UP_ENV_PASS` / :data:`UP_ENV_PREFIXES` and those named in
        :data:`UP_ENV_PASS_VAR` that the controller has, plus ``env`` (the serve's
        ``up_env``); never the controller's tokens.
        stdout and stderr are captured together and the tail is kept; stdin is
        ``/dev/null``. The command runs in its own session, so at the timeout the
        whole process group is killed (a ``docker compose`` and whatever it spawned)
        and the result has ``returncode=None``. A missing executable or working
        directory gives 127 and one that cannot be executed 126, as a shell would;
        nothing here raises for what the command does. ``on_spawn`` is called with the
        process id (= its process group id) as soon as the command runs, so the caller
        can record it before waiting (a command must never outlive its controller
        unsupervised).
        """
        args = tuple(str(a) for a in argv)
        if not args:
            raise ValueError("run_up needs a command line, got an empty argv")
        if not math.isfinite(timeout_s) or timeout_s <= 0:
            raise ValueError(f"run_up timeout must be a finite number > 0, not {timeout_s}")
        shown = " ".join(args)
        begin = time.monotonic()
        if not Path(cwd).is_dir():
            return UpResult(args, 127, "", f"working directory not found: {cwd}", 0.0)
        # output goes to a file, not a pipe: a command that outlives a killed controller
        # must not die of SIGPIPE on its next line of progress
        with tempfile.TemporaryFile(prefix="vramctl-up-") as out_file:
            try:
                proc = subprocess.Popen(
                    args,
                    cwd=cwd,
                    env=up_environment(env),
                    stdin=subprocess.DEVNULL,
                    stdout=out_file,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            except OSError as exc:
                code, why = _spawn_failure(args[0], exc)
                return UpResult(args, code, "", why, 0.0)
            if on_spawn is not None:
                _announce_spawn(proc, on_spawn)
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                _kill_and_reap(proc)
                return UpResult(
                    args,
                    None,
                    _tail(_read_back(out_file)),
                    f"{shown}: timed out after {timeout_s:g} s (killed)",
                    time.monotonic() - begin,
                )
            out = _read_back(out_file)
        code = proc.returncode
        message = f"{shown}: exit {code}" if code >= 0 else f"{shown}: killed by signal {-code}"
        return UpResult(args, code, _tail(out), message, time.monotonic() - begin)

    # ── preflight probes ──────────────────────────────────────────────────────

    @staticmethod
    def executable_exists(argv0: str, *, cwd: Path | None = None) -> bool:
        """Whether ``argv0`` names a program that can be run.

        A name with a slash is a path (relative to ``cwd`` when given) that must be
        an executable file; a bare name is looked up on ``PATH``.
        """
        if not argv0:
            return False
        if os.sep in argv0 or (os.altsep and os.altsep in argv0):
            path = Path(argv0)
            if not path.is_absolute() and cwd is not None:
                path = Path(cwd) / path
            return path.is_file() and os.access(path, os.X_OK)
        return shutil.which(argv0) is not None

    @staticmethod
    def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
        """Whether a TCP listener holds ``host:port`` (so a server could not bind it).

        Tries to bind the address (with ``SO_REUSEADDR``, so connections lingering
        in TIME_WAIT do not count); when binding is not allowed at all (a privileged
        port, an address not on this host) it falls back to trying to connect.
        """
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((host, port))
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    return True
            else:
                return False
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.settimeout(0.5)
            return sock.connect_ex((host, port)) == 0


def _spawn_failure(argv0: str, exc: OSError) -> tuple[int, str]:
    """The shell's exit code (127 not found, 126 not runnable) and message for a failed spawn."""
    if isinstance(exc, FileNotFoundError):
        return 127, f"executable not found: {argv0} ({exc.strerror})"
    if isinstance(exc, PermissionError):
        return 126, f"cannot execute {argv0}: {exc.strerror or exc}"
    return 126, f"cannot run {argv0}: {_describe(exc)}"


def _announce_spawn(proc: subprocess.Popen[bytes], on_spawn: Callable[[int], None]) -> None:
    """Hand the process id to ``on_spawn``; if that fails, kill and reap the group, re-raise."""
    try:
        on_spawn(proc.pid)
    except BaseException:  # unrecorded, it must not run on unsupervised
        _kill_group(proc)
        proc.wait()
        raise


def _kill_and_reap(proc: subprocess.Popen[bytes]) -> None:
    """Kill the process group and wait up to the grace period for the leader to exit."""
    _kill_group(proc)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=_KILL_GRACE_S)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()


def _read_back(fh: Any) -> bytes:
    """What a command wrote to its output file (the last 1 MiB at most)."""
    size = fh.seek(0, os.SEEK_END)
    fh.seek(max(0, size - 2**20))
    data: bytes = fh.read()
    return data


def _tail(raw: bytes | None) -> str:
    if not raw:
        return ""
    text = raw.decode("utf-8", errors="replace").rstrip("\n")
    lines = text.splitlines()[-_OUTPUT_TAIL_LINES:]
    out = "\n".join(lines)
    return out[-_OUTPUT_TAIL_CHARS:]
