"""The chaos campaign: a controller under test, seeded random operations, the monitor.

:class:`Campaign` owns one run: a temp folder (manifest, state directory, the
controller's JSON logs, the ``up`` scripts), busybox serve containers labelled with
the campaign's id, a :class:`~chaos.proxy.DockerProxy` the controller reaches Docker
through, a :class:`~chaos.monitor.Timeline` fed by Docker's event stream (a client of
the daemon's own socket, never cut), container lists, the proxy's requests and the
driver's own starts.

The driver keeps a *model* (what the manifest means: per serve present or not,
``desired``, ``vram_mib``) and writes it after every edit; faults (a truncated file,
an invalid one, a non-UTF-8 one) are written over it and the model's text is put
back a moment later, as an editor would finish its save. Every operation is logged
with its time so a finding can be told with the operations that led to it.

:meth:`Campaign.mcp_flood` is a round of its own against the controller's API: sessions
of ``/mcp`` opened without the token and never closed (:mod:`chaos.mcp_flood`).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
import tomllib
import uuid
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import docker
import httpx
from docker.errors import APIError, NotFound
from support.cli import run_argv
from support.serving import free_port, httpd

from chaos.mcp_flood import FloodRound, flood_round
from chaos.monitor import (
    NS,
    ControllerView,
    Cycle,
    EventItem,
    LedgerItem,
    ListItem,
    Model,
    ModelItem,
    Monitor,
    RequestItem,
    ServeDecl,
    Timeline,
    Violation,
)
from chaos.proxy import DockerProxy
from controller.snapshot import epoch_seconds
from controller.store.journal import CycleRecord, Journal, JournalError, journal_path

REPO = Path(__file__).resolve().parents[2]
# health probes and API calls go straight to loopback, never through an HTTP_PROXY
_http = httpx.Client(trust_env=False)
ROLE = "a"
BUDGET_MIB = 10_000
TOKEN = "chaos-token-0123456789abcdef"
CARD_LABEL = "vramctl.chaos.card"  # the card an `up` made its container for
MIB_STEPS = (-1000, -500, 0, 0, 500, 1000)  # edits stay within base ± 1000 MiB


@dataclass(frozen=True)
class ServeDef:
    """One serve of the campaign's universe: pinned on ``role``, or placed on one of
    its ``placement`` candidates (its home, where the first and the final manifest put
    it)."""

    name: str
    residency: str
    mib: int
    up_delay_s: float | None  # None: a pre-created container (docker start); else an `up`
    health_delay_s: int = 0
    desired0: str | None = None  # in the first manifest
    desired_end: str = "stopped"  # in the final manifest
    role: str = ROLE
    placement: tuple[str, ...] = ()


UNIVERSE = (
    ServeDef("res1", "resident", 3000, None, 0, "running", "running"),
    ServeDef("res2", "resident", 2000, 1.0, 0, "running", "running"),
    ServeDef("ev1", "evictable", 3000, None, 2, "running", "running"),
    ServeDef("ev2", "evictable", 2000, 0.5, 0, "running", "stopped"),
    ServeDef("od1", "on-demand", 4000, None, 1, None, "stopped"),
    ServeDef("od2", "on-demand", 5000, 2.0, 0, None, "stopped"),
)
# the final manifest wants res1 + res2 + ev1 = 8000 MiB running: with every running
# serve's start reservation at most base + 1000, a start it still needs always fits


@dataclass(frozen=True)
class Universe:
    """What a campaign runs: its cards (role -> budget MiB) and its serves."""

    roles: Mapping[str, int]
    serves: tuple[ServeDef, ...]


ONE_CARD = Universe({ROLE: BUDGET_MIB}, UNIVERSE)


@dataclass
class ServeState:
    """What the manifest says of a serve now (``placement`` empty: pinned on ``role``)."""

    present: bool
    desired: str | None
    mib: int
    role: str = ROLE
    placement: tuple[str, ...] = ()

    @classmethod
    def home(cls, s: ServeDef, desired: str | None) -> ServeState:
        return cls(True, desired, s.mib, s.role, s.placement)

    @property
    def cards(self) -> tuple[str, ...]:
        """The cards it may run on: its candidates, else its role."""
        return self.placement or (self.role,)


@dataclass
class Op:
    t: int
    kind: str
    detail: str
    result: str = ""


@dataclass
class Controller:
    proc: subprocess.Popen[bytes]
    log: Path
    started_ns: int = field(default_factory=time.time_ns)
    ended_ns: int | None = None  # when the driver saw it gone

    def alive(self) -> bool:
        if self.proc.poll() is None:
            return True
        if self.ended_ns is None:
            self.ended_ns = time.time_ns()
        return False


@dataclass
class Campaign:
    client: docker.DockerClient
    image: str
    tmp: Path
    seed: int
    ops_max: int
    seconds_max: float
    echo: Callable[[str], None] = print
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    ops: list[Op] = field(default_factory=list)
    model: dict[str, ServeState] = field(default_factory=dict)
    controllers: list[Controller] = field(default_factory=list)
    requested: set[str] = field(default_factory=set)
    findings: list[str] = field(default_factory=list)  # not budget: exits, convergence
    #: operation kinds (``WEIGHTS``) and edit kinds (``desired``, ``mib``, ``presence``)
    #: left out, to look at one fault at a time
    skip: frozenset[str] = frozenset()

    universe: ClassVar[Universe] = ONE_CARD

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.prefix = f"vramctl-test-chaos-{self.run_id}-"
        self.label = f"vramctl.chaos={self.run_id}"
        self.ports = {s.name: free_port() for s in self.universe.serves}
        self.api_port = free_port()
        self.defs = {s.name: s for s in self.universe.serves}
        self.monitor = Monitor()
        self.timeline = Timeline(self.monitor)
        self.docker_cli = shutil.which("docker") or "docker"
        self.proxy = DockerProxy(self.tmp / "docker.sock", _daemon_socket(), self.timeline.put)
        self._restore_manifest_at: float | None = None
        self._restore_proxy_at: float | None = None
        self._events_client = docker.from_env(timeout=3600)  # a quiet stream is no error
        self._stream: Any = None
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    # ── set-up and tear-down ─────────────────────────────────────────────────
    @property
    def manifest(self) -> Path:
        return self.tmp / "serves.toml"

    def container_name(self, serve: str) -> str:
        return f"{self.prefix}{serve}"

    def labels(self, serve: str) -> dict[str, str]:
        return {"vramctl.test": "1", "vramctl.chaos": self.run_id, "vramctl.chaos.serve": serve}

    def setup(self) -> None:
        (self.tmp / "state").mkdir(exist_ok=True)
        (self.tmp / "token").write_text(TOKEN)
        self._follow_events()
        self.timeline.start()
        self.proxy.start()
        for s in self.universe.serves:
            cmd = httpd(self.ports[s.name], delay_s=s.health_delay_s)
            if s.up_delay_s is None:
                # made for its home card, as its `up` would make it (none when placed)
                told = {} if s.placement else {"VRAMCTL_GPU_ROLE": s.role}
                self.client.containers.create(
                    self.image,
                    cmd,
                    name=self.container_name(s.name),
                    init=True,
                    network_mode="host",
                    labels={**self.labels(s.name), **({CARD_LABEL: s.role} if told else {})},
                    environment=told,
                )
            else:
                self._write_up_script(s, cmd)
            self.model[s.name] = ServeState.home(s, s.desired0)
        self.write_model("initial manifest")
        threading.Thread(target=self._lister, daemon=True, name="chaos-lister").start()
        if len(self.universe.roles) > 1:  # one card: nothing can be counted on two
            threading.Thread(target=self._ledgers, daemon=True, name="chaos-ledger").start()

    def _write_up_script(self, s: ServeDef, cmd: list[str]) -> None:
        labels = " ".join(f"--label {k}={v}" for k, v in self.labels(s.name).items())
        # the card the controller told it goes into the container's environment, as a
        # Compose file passes it on (docs/placement.md), and into a label, which
        # Docker's events carry to the monitor
        card = "${VRAMCTL_GPU_ROLE:+-e VRAMCTL_GPU_ROLE=$VRAMCTL_GPU_ROLE}"
        labels += f" {card} ${{VRAMCTL_GPU_ROLE:+--label {CARD_LABEL}=$VRAMCTL_GPU_ROLE}}"
        # the daemon is named explicitly: the `up` must go through the proxy whatever
        # environment the controller gives its commands
        # a marker file while it runs lets the driver aim a SIGKILL at an `up` in flight
        marker = self.tmp / f"up-{s.name}.in-flight"
        script = (
            "#!/bin/sh\n"
            f"date +%s%N >> {self.spawn_file(s.name)}\n"  # when it began: the monitor's
            f"echo $$ > {marker}\n"
            f"sleep {s.up_delay_s}\n"
            f"{self.docker_cli} -H {self.proxy.url} run -d --name "
            f"{self.container_name(s.name)} {labels} --init --network host {self.image} "
            f"sh -c '{cmd[2]}'\n"
            "rc=$?\n"
            f"rm -f {marker}\n"
            "exit $rc\n"
        )
        (self.tmp / f"up-{s.name}.sh").write_text(script)

    def spawn_file(self, serve: str) -> Path:
        """Where the serve's ``up`` notes when each of its runs began (ns, a line each)."""
        return self.tmp / f"up-{serve}.began"

    def teardown(self) -> None:
        for c in self.controllers:
            if c.alive():
                c.proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                c.proc.wait(10)
        self._stop.set()
        with contextlib.suppress(Exception):
            self._stream.close()
        for t in self._threads:
            t.join(5)
        self.proxy.close()
        for c in self.client.containers.list(all=True, filters={"label": self.label}):
            with contextlib.suppress(NotFound, APIError):
                c.remove(force=True)
        self._events_client.close()

    # ── what the monitor is fed ──────────────────────────────────────────────
    def _follow_events(self) -> None:
        """Docker's events for the campaign's containers, into the timeline, without a gap.

        Should the stream end (a read timeout on a quiet daemon, a hiccup), it is
        opened again from the last event seen (``since``), and events already put in
        are not put in twice.
        """
        filters = {"type": "container", "label": self.label}
        self._stream = self._events_client.events(decode=True, filters=filters)
        seen: set[tuple[int, str, str]] = set()
        last_ns = time.time_ns()

        def pump() -> None:
            nonlocal last_ns
            while not self._stop.is_set():
                with contextlib.suppress(Exception):
                    for e in self._stream:
                        t = int(e.get("timeNano") or time.time_ns())
                        actor = e.get("Actor") or {}
                        attrs = actor.get("Attributes") or {}
                        action = str(e.get("Action") or e.get("status") or "")
                        cid = str(actor.get("ID") or e.get("id") or "")
                        if (t, cid, action) in seen:
                            continue
                        seen.add((t, cid, action))
                        last_ns = max(last_ns, t)
                        self.timeline.put(
                            EventItem(
                                t,
                                action,
                                cid,
                                str(attrs.get("name", "")),
                                str(attrs.get("vramctl.chaos.serve", "")),
                                str(attrs.get(CARD_LABEL, "")),
                            )
                        )
                if self._stop.wait(0.2):
                    return
                with contextlib.suppress(Exception):
                    self._stream = self._events_client.events(
                        decode=True, filters=filters, since=last_ns // NS
                    )

        t = threading.Thread(target=pump, daemon=True, name="chaos-events")
        t.start()
        self._threads.append(t)

    def _lister(self) -> None:
        while not self._stop.wait(1.0):
            with contextlib.suppress(Exception):
                asked = time.time_ns()
                cs = self.client.api.containers(filters={"label": self.label})  # running only
                names = {str(c["Id"]): str((c.get("Names") or ["?"])[0]).lstrip("/") for c in cs}
                self.timeline.put(ListItem(time.time_ns(), frozenset(names), asked, names))

    def _ledgers(self) -> None:
        """The controller's ``GET /v1/ledger``, once a second: what it counts where."""
        while not self._stop.wait(1.0):
            with contextlib.suppress(httpx.HTTPError, ValueError, KeyError, TypeError):
                r = _http.get(self.api("/v1/ledger"), timeout=3)
                item = _api_ledger(r.json(), time.time_ns()) if r.status_code == 200 else None
                if item is not None:
                    self.timeline.put(item)

    def decl_model(self) -> Model:
        serves = {
            n: ServeDecl(
                "" if st.placement else st.role,
                st.mib,
                self.defs[n].up_delay_s or 0.0,
                st.placement,
            )
            for n, st in self.model.items()
            if st.present
        }
        return Model(self.universe.roles, serves)

    # ── the manifest ─────────────────────────────────────────────────────────
    def render(self) -> str:
        parts = [
            f'[[gpu_roles]]\nid = "{role}"\nvram_mib = {mib}\nreserve_mib = 0\n'
            for role, mib in self.universe.roles.items()
        ]
        for s in self.universe.serves:
            st = self.model[s.name]
            if not st.present:
                continue
            cards = ", ".join(f'"{c}"' for c in st.placement)
            lines = [
                "[[serve]]",
                f'name = "{s.name}"',
                f'container = "{self.container_name(s.name)}"',
                f"placement = [{cards}]" if st.placement else f'gpu_role = "{st.role}"',
                f"vram_mib = {st.mib}",
                f'residency = "{s.residency}"',
                f"port = {self.ports[s.name]}",
                'health = "/health"',
                "start_timeout_s = 20",
                "stop_timeout_s = 3",
            ]
            if st.desired:
                lines.append(f'desired = "{st.desired}"')
            if s.up_delay_s is not None:
                lines.append(f'up = "/bin/sh {{dir}}/up-{s.name}.sh"')
            parts.append("\n".join(lines) + "\n")
        return "\n".join(parts)

    def write_model(self, why: str, *, by_rename: bool = False) -> None:
        # the model is in force from the moment the file starts to change
        self.timeline.put(ModelItem(time.time_ns(), self.decl_model()))
        self._write(self.render().encode(), by_rename=by_rename)
        self._restore_manifest_at = None

    def _write(self, data: bytes, *, by_rename: bool) -> None:
        if by_rename:
            tmp = self.manifest.with_name(f".{self.manifest.name}.{self.rng.randrange(10**6)}")
            tmp.write_bytes(data)
            os.replace(tmp, self.manifest)
        else:
            with self.manifest.open("r+b" if self.manifest.exists() else "wb") as fh:
                fh.truncate(0)
                fh.write(data)

    # ── the controller ───────────────────────────────────────────────────────
    @property
    def controller(self) -> Controller | None:
        return self.controllers[-1] if self.controllers else None

    def start_controller(self) -> Controller:
        log = self.tmp / f"run{len(self.controllers) + 1}.log"
        api = ("--api", f"127.0.0.1:{self.api_port}", "--token-file", str(self.tmp / "token"))
        argv = run_argv(self.manifest, self.tmp / "state", "--log-json", *api)
        env = dict(os.environ, DOCKER_HOST=self.proxy.url, COLUMNS="200", NO_COLOR="1")
        with log.open("wb") as fh:
            proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        c = Controller(proc, log)
        self.controllers.append(c)
        return c

    def wait_api(self, timeout: float = 30.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            c = self.controller
            if c is None or not c.alive():
                return False
            with contextlib.suppress(httpx.HTTPError):
                if _http.get(self.api("/healthz"), timeout=2).status_code == 200:
                    return True
            time.sleep(0.2)
        return False

    def api(self, path: str) -> str:
        return f"http://127.0.0.1:{self.api_port}{path}"

    def mcp_flood(self, sessions: int) -> FloodRound:
        """A round of ``sessions`` sessions opened without the token against the running
        controller's ``/mcp``, then its memory and a client with the token
        (:mod:`chaos.mcp_flood`)."""
        c = self.controller
        assert c is not None and c.alive(), "no controller runs"
        result = flood_round(self.api("/mcp"), c.proc.pid, TOKEN, sessions)
        self.log_op("mcp-flood", f"{sessions} sessions without the token", result.brief())
        return result

    def ensure_controller(self) -> None:
        """A controller that exited on its own is a finding; start another."""
        c = self.controller
        if c is not None and not c.alive():
            rc = c.proc.returncode
            tail = _log_tail(c.log)
            if rc == 1 and str(self.manifest) in c.log.read_text(errors="replace"):
                # `vramctl run` refuses to start on a manifest that does not validate
                self.log_op("controller-refused", f"{c.log.name}: invalid manifest", tail[-200:])
            elif rc != -signal.SIGKILL:
                self.findings.append(f"controller {c.log.name} exited {rc} on its own: {tail}")
                self.log_op("controller-exited", f"{c.log.name} rc={rc}", tail[-200:])
        if c is None or not c.alive():
            self.start_controller()
            self.wait_api(20)

    # ── the operations ───────────────────────────────────────────────────────
    def log_op(self, kind: str, detail: str, result: str = "") -> None:
        self.ops.append(Op(time.time_ns(), kind, detail, result))

    def tick(self) -> None:
        """Carry out the restores that are due (a fault's end)."""
        now = time.monotonic()
        if self._restore_manifest_at is not None and now >= self._restore_manifest_at:
            self.write_model("restore after a fault")
            self.log_op("manifest-restore", "the model's text written back")
        if self._restore_proxy_at is not None and now >= self._restore_proxy_at:
            self.proxy.restore()
            self._restore_proxy_at = None
            self.log_op("socket-restore", "the docker socket answers again")

    def pause(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while True:
            self.tick()
            left = end - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(0.1, left))

    def container_status(self, serve: str) -> str | None:
        try:
            return str(
                self.client.api.inspect_container(self.container_name(serve))["State"]["Status"]
            )
        except NotFound:
            return None

    def op_edit(self) -> None:
        by_rename = self.rng.random() < 0.5
        how = "by rename" if by_rename else "in place"
        whats = [w for w in ("desired", "desired", "mib", "presence") if w not in self.skip]
        what = self.rng.choice(whats or ["desired"])
        absent = [n for n, st in self.model.items() if not st.present]
        if what == "presence" and absent and (len(absent) >= 2 or self.rng.random() < 0.6):
            serve = self.rng.choice(absent)  # serves come back more often than they leave
        else:
            serve = self.rng.choice([n for n, st in self.model.items() if st.present])
        st = self.model[serve]
        if what == "desired":
            st.desired = self.rng.choices(("running", "stopped", None), (6, 2, 2))[0]
            detail = f"{serve} desired={st.desired}"
        elif what == "mib":
            st.mib = max(500, self.defs[serve].mib + self.rng.choice(MIB_STEPS))
            detail = f"{serve} vram_mib={st.mib}"
        else:
            st.present = not st.present
            detail = f"{serve} {'added' if st.present else 'removed'}"
        self.write_model(detail, by_rename=by_rename)
        self.log_op("edit", f"{detail} ({how})")

    def op_fault(self) -> None:
        text = self.render()
        kind = self.rng.choice(("truncated-table", "truncated-byte", "invalid", "non-utf8"))
        if kind == "truncated-table":
            cuts = [i for i in range(len(text)) if text.startswith("[[serve]]", i)] + [len(text)]
            cut = self.rng.choice(cuts[1:]) if len(cuts) > 1 else len(text) // 2
            data = text[:cut].encode()
        elif kind == "truncated-byte":
            data = text[: self.rng.randrange(1, len(text))].encode()
        elif kind == "invalid":
            bad = self.rng.choice(
                (
                    ("vram_mib = ", "vram_mib = -"),  # the role's: every serve loses its role
                    ('residency = "evictable"', 'residency = "sometimes"'),
                    ("stop_timeout_s = 3", "stop_timeout_s = 'x"),  # a TOML syntax error
                    ('health = "/health"', 'health = "/health"\nvram_mb = 1'),
                )
            )
            data = text.replace(*bad, 1).encode()
        else:
            data = text.encode().replace(b"resident", b"resid\xffent", 1)
        self._write(data, by_rename=self.rng.random() < 0.5)
        hold = self.rng.uniform(0.3, 2.5)
        self._restore_manifest_at = time.monotonic() + hold
        self.log_op("fault", f"{kind}: {len(data)} of {len(text)} bytes, for {hold:.1f}s")

    def op_api(self) -> None:
        ods = [s.name for s in self.universe.serves if s.residency == "on-demand"]
        serve = self.rng.choice(ods if self.rng.random() < 0.85 else list(self.model))
        down = serve in self.requested and self.rng.random() < 0.4
        verb = "down" if down else "up"
        body: dict[str, Any] | None = None
        if verb == "up" and self.rng.random() < 0.5:
            body = {"ttl_s": self.rng.choice((3, 8, 20))}
        try:
            r = _http.post(
                self.api(f"/v1/serves/{serve}/{verb}"),
                json=body,
                headers={"Authorization": f"Bearer {TOKEN}"},
                timeout=10,
            )
            result = str(r.status_code)
            if r.status_code == 202:
                (self.requested.discard if down else self.requested.add)(serve)
            if r.status_code >= 500 and r.status_code != 503:
                self.findings.append(
                    f"API {verb} {serve} {body} answered {r.status_code}: {r.text}"
                )
        except httpx.HTTPError as exc:
            result = f"no answer ({type(exc).__name__})"
        self.log_op(f"api-{verb}", f"{serve} {body or ''}".strip(), result)

    def _running_serves(self) -> list[str]:
        return [s for s in self.model if self.container_status(s) == "running"]

    def op_kill(self) -> None:
        running = self._running_serves()
        if not running:
            self.log_op("docker-kill", "nothing runs", "skipped")
            return
        serve = self.rng.choice(running)
        with contextlib.suppress(NotFound, APIError):
            self.client.api.kill(self.container_name(serve))
        self.log_op("docker-kill", serve)

    def op_rm(self) -> None:
        ups = [s.name for s in self.universe.serves if s.up_delay_s is not None]
        present = [s for s in ups if self.container_status(s) is not None]
        if not present:
            self.log_op("docker-rm", "no `up` container exists", "skipped")
            return
        serve = self.rng.choice(present)
        with contextlib.suppress(NotFound, APIError):
            self.client.api.remove_container(self.container_name(serve), force=True)
        self.log_op("docker-rm", serve)

    def starting(self) -> list[str]:
        """Serves whose container runs but does not answer its health path yet."""
        return [s for s in self._running_serves() if not _healthy(self.ports[s])]

    def op_outside_start(self) -> None:
        aimed = ""
        if self.rng.random() < 0.5 and self._wait_for(lambda: bool(self.starting()), 3.0):
            aimed = f" during the health wait of {', '.join(self.starting())}"
        stopped = [
            s
            for s, st in self.model.items()
            if st.present and self.container_status(s) in ("created", "exited")
        ]
        if not stopped:
            self.log_op("outside-start", "nothing stopped", "skipped")
            return
        serve = self.rng.choice(stopped)
        name = self.container_name(serve)
        self.timeline.put(RequestItem(time.time_ns(), "outside", "start", name))
        try:
            self.client.api.start(name)
            result = "started"
        except (NotFound, APIError) as exc:
            result = f"failed: {exc}"
        self.log_op("outside-start", serve + aimed, result)

    def _wait_for(self, what: Callable[[], bool], seconds: float) -> bool:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if what():
                return True
            self.pause(0.05)
        return False

    def ups_in_flight(self) -> list[str]:
        return [p.name for p in self.tmp.glob("up-*.in-flight")]

    def op_sigkill(self) -> None:
        c = self.controller
        aimed = ""
        if self.rng.random() < 0.5 and self._wait_for(lambda: bool(self.ups_in_flight()), 3.0):
            aimed = f" while {', '.join(self.ups_in_flight())} ran"  # an `up` may be orphaned
        if c is not None and c.alive():
            c.proc.kill()
            c.proc.wait(10)
            c.alive()  # notes when it ended
        down_s = self.rng.uniform(0, 1.5)
        self.pause(down_s)
        self.start_controller()
        self.log_op("sigkill", f"controller killed{aimed}, restarted after {down_s:.1f}s")

    def op_cut(self) -> None:
        if self.proxy.is_cut:
            self.log_op("socket-cut", "already cut", "skipped")
            return
        hold = self.rng.uniform(1.0, 6.0)
        self.proxy.cut()
        self._restore_proxy_at = time.monotonic() + hold
        self.log_op("socket-cut", f"for {hold:.1f}s")

    WEIGHTS: ClassVar[dict[str, int]] = {
        "edit": 22,
        "fault": 10,
        "api": 18,
        "kill": 10,
        "rm": 5,
        "outside_start": 10,
        "sigkill": 7,
        "cut": 6,
        "idle": 12,
    }

    def run(self) -> None:
        self.start_controller()
        if not self.wait_api(60):
            raise AssertionError(f"the controller never answered: {_log_tail(self.controller.log)}")  # type: ignore[union-attr]
        self.pause(3.0)  # the first manifest converges before the faults begin
        kinds = [k for k in self.WEIGHTS if k not in self.skip]
        weights = [self.WEIGHTS[k] for k in kinds]
        begin = time.monotonic()
        n = 0
        while n < self.ops_max and time.monotonic() - begin < self.seconds_max:
            n += 1
            self.tick()
            if self._restore_manifest_at is None:  # a restart reads the manifest on disk
                self.ensure_controller()
            kind = self.rng.choices(kinds, weights)[0]
            if kind == "idle":
                s = self.rng.uniform(0.5, 3.0)
                self.pause(s)
                self.log_op("idle", f"{s:.1f}s")
            else:
                getattr(self, f"op_{kind}")()
            self.pause(self.rng.uniform(0.1, 1.2))
        self.elapsed_s = time.monotonic() - begin

    # ── the end: settle and check ────────────────────────────────────────────
    def final_model(self) -> None:
        for s in self.universe.serves:
            self.model[s.name] = ServeState.home(s, s.desired_end)

    def settle(self, extra_s: float = 60.0) -> tuple[bool, str, float]:
        """Restore everything, write the final manifest, wait for it to be reached: each
        serve running or not as it wants, each running one on a card its final
        declaration names, and (``check_plan``) nothing left for the controller to do."""
        self.proxy.restore()
        self._restore_proxy_at = None
        self.final_model()
        self.write_model("final manifest", by_rename=True)
        self.log_op("final", "final manifest written, socket restored")
        self.ensure_controller()
        self.wait_api(30)
        for serve in sorted(self.requested):  # a requester left up is not what we check
            self._end_request(serve)
        longest = self._longest_backoff()
        begin = time.monotonic()
        deadline = begin + extra_s + longest
        seen = ""
        while time.monotonic() < deadline:
            reached, seen = self._reached()
            if reached:
                time.sleep(3.0)  # three resyncs: still there
                if self._reached() == (True, seen):
                    return True, seen, time.monotonic() - begin
            self.ensure_controller()
            time.sleep(0.5)
        took = time.monotonic() - begin
        return False, f"after {took:.0f}s (backoff {longest:.0f}s): {seen}", took

    def _end_request(self, serve: str, tries: int = 30) -> None:
        """``down`` for ``serve``, asked again (a second apart) until the API answers."""
        result = ""
        for _ in range(tries):
            try:
                r = _http.post(
                    self.api(f"/v1/serves/{serve}/down"),
                    headers={"Authorization": f"Bearer {TOKEN}"},
                    timeout=10,
                )
                result = str(r.status_code) + ("" if r.status_code == 202 else f": {r.text[:300]}")
                break
            except httpx.HTTPError as exc:
                result = f"no answer ({type(exc).__name__})"
                self.ensure_controller()
                time.sleep(1.0)
        self.log_op("api-down", f"{serve} (its request ends with the final manifest)", result)

    check_plan: ClassVar[bool] = False  # settle waits for `vramctl plan` to have nothing to do

    def _reached(self) -> tuple[bool, str]:
        """Whether the final manifest is reached, and what the host shows."""
        want = {s.name: s.desired_end for s in self.universe.serves}
        state = {s: self.container_status(s) for s in want}
        cards = {s: self.card_of(s) for s, st in state.items() if st == "running"}
        shown = json.dumps(
            {s: f"{st} on {cards[s]}" if s in cards else st for s, st in state.items()}
        )
        if any((state[s] == "running") != (w == "running") for s, w in want.items()):
            return False, shown
        off = [
            f"{s} runs on {card}, declared on {'/'.join(self.model[s].cards)}"
            for s, card in cards.items()
            if card is not None and card not in self.model[s].cards
        ]
        if off:
            return False, f"{shown}; off its cards: {'; '.join(off)}"
        left = self.pending_steps() if self.check_plan else ""
        return (False, f"{shown}; `vramctl plan`: {left}") if left else (True, shown)

    def card_of(self, serve: str) -> str | None:
        """The card the serve's container was made for (its ``VRAMCTL_GPU_ROLE``)."""
        try:
            env = self.client.api.inspect_container(self.container_name(serve))["Config"]["Env"]
        except NotFound:
            return None
        found = [e.split("=", 1)[1] for e in env or [] if e.startswith("VRAMCTL_GPU_ROLE=")]
        return found[0] if found else None

    def pending_steps(self) -> str:
        """What ``vramctl plan`` (on the host as it is, the state directory's journal)
        would still do: empty when nothing; on Docker's own socket, never the proxy's
        (its lists are no looks of the loop's)."""
        argv = [sys.executable, "-m", "controller.interfaces.cli", "plan", "--json"]
        argv += ["--detailed-exitcode", "-m", str(self.manifest)]
        argv += ["--state-dir", str(self.tmp / "state")]
        env = dict(os.environ, DOCKER_HOST=f"unix://{_daemon_socket()}", COLUMNS="200")
        done = subprocess.run(
            argv, check=False, capture_output=True, env=env, cwd=REPO, timeout=120
        )
        if done.returncode == 0:
            return ""
        try:
            steps = json.loads(done.stdout)["steps"]
        except (ValueError, KeyError, TypeError):
            return f"exited {done.returncode}: {done.stderr.decode(errors='replace')[-300:]}"
        return ", ".join(
            f"{st['action']} {st['serve']} on {'/'.join(st.get('gpu_roles') or [])}" for st in steps
        )

    def _longest_backoff(self) -> float:
        try:
            serves = _http.get(self.api("/v1/serves"), timeout=5).json()["serves"]
        except (httpx.HTTPError, ValueError, KeyError):
            return 300.0  # the cap: unknown is not 0
        return max(
            [float((s.get("backoff") or {}).get("retry_in_s") or 0.0) for s in serves] + [0.0]
        )

    def stop(self) -> None:
        c = self.controller
        if c is not None and c.alive():
            c.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                c.proc.wait(30)
        self.timeline.flush()

    # ── the controller's own records ─────────────────────────────────────────
    def controller_view(self) -> ControllerView:
        """What the controller journaled (every controller of the campaign shares the
        state directory), the lists it asked for, when its ``up`` commands began."""
        cycles: list[Cycle] = []
        records: list[CycleRecord] = []
        path = journal_path(self.tmp / "state")
        with contextlib.suppress(JournalError):
            journal = Journal.open(path, readonly=True)
            try:
                for rec in journal.cycles():
                    if not rec.dry_run:
                        files = journal.manifest_files(rec.manifest_digest) or {}
                        cycles.append(_cycle(rec, files))
                        records.append(rec)
            finally:
                journal.close()
        spawns = {s.name: _stamps(self.spawn_file(s.name)) for s in self.universe.serves}
        return ControllerView(
            tuple(sorted(cycles, key=lambda c: c.at)),
            tuple(sorted(self.proxy.looks)),
            spawns,
            tuple(filter(None, map(_journal_ledger, records))),
        )

    # ── the report ───────────────────────────────────────────────────────────
    def controller_log(self) -> list[tuple[int, str, str]]:
        """(time, run, message) of every JSON log record of every controller, in order."""
        out = [
            (t, c.log.stem, msg)
            for c in self.controllers
            if c.log.exists()
            for t, msg in _records(c.log)
        ]
        return sorted(out)

    def context(self, v: Violation, before_s: float = 20.0) -> list[Op]:
        return [o for o in self.ops if v.t - int(before_s * NS) <= o.t <= v.t + NS // 2]

    def summary(self, converged: tuple[bool, str, float]) -> dict[str, Any]:
        m = self.monitor
        # every time of the report counts from the monitor's first item, as its details do
        t0 = m.t0 or (self.ops[0].t if self.ops else 0)

        def op_json(o: Op) -> dict[str, Any]:
            return {
                "t": round((o.t - t0) / NS, 2),
                "op": o.kind,
                "detail": o.detail,
                "result": o.result,
            }

        def v_json(v: Violation, with_ops: bool) -> dict[str, Any]:
            out: dict[str, Any] = {
                "kind": v.kind,
                "t": round((v.t - t0) / NS, 2),
                "serve": v.serve,
                "detail": v.detail,
            }
            if v.request_t and not any(
                c.started_ns <= v.request_t <= (c.ended_ns or 2**63) for c in self.controllers
            ):
                out["detail"] = "[orphaned `up`: no controller ran when it was sent] " + v.detail
            if with_ops:
                out["ops_before"] = [op_json(o) for o in self.context(v)]
                out["controller_log"] = [
                    f"{(t - t0) / NS:.2f} {run}: {msg}"
                    for t, run, msg in log
                    if v.t - 6 * NS <= t <= v.t + NS // 2
                ]
            return out

        log = self.controller_log()
        crashes = Counter(f"{run}: {msg}" for _t, run, msg in log if "[traceback: " in msg)
        findings = [
            *self.findings,
            *(f"a traceback in the controller's log ({n}x): {m}" for m, n in crashes.items()),
        ]
        view = self.controller_view()
        if m.starts.get("controller") and not (view.cycles and view.looks):
            findings.append(  # a judgement on no records would be vacuous
                f"the controller started {m.starts['controller']} container(s) but left "
                f"{len(view.cycles)} journaled cycle(s) and {len(view.looks)} list(s) to judge by"
            )
        m.judge(view)
        violations = m.violations

        return {
            "seed": self.seed,
            "run_id": self.run_id,
            "t0_ns": t0,
            "ops": len(
                [o for o in self.ops if o.kind not in ("manifest-restore", "socket-restore")]
            ),
            "ops_by_kind": dict(Counter(o.kind for o in self.ops)),
            "seconds": round(getattr(self, "elapsed_s", 0.0), 1),
            "controller_runs": len(self.controllers),
            "proxy_cuts": self.proxy.cuts,
            "starts_by_cause": dict(m.starts),
            "max_held_mib": dict(m.max_held),
            "judged_by": {
                "cycles": len(view.cycles),
                "manifests": len({c.digest for c in view.cycles}),
                "looks": len(view.looks),
                "up_runs": sum(len(t) for t in view.spawns.values()),
                "starts_recounted": m.recounted,
                "ledger_answers": len(m.ledgers),
                "journaled_ledgers": len(view.ledgers),
            },
            "violations": [v_json(v, True) for v in violations],
            "notes": dict(Counter(n.kind for n in m.notes)),
            "note_samples": [v_json(n, False) for n in m.notes[:10]],
            "findings": findings,
            "converged": converged[0],
            "final_state": converged[1],
            "settle_s": round(converged[2], 1),
            "logs": str(self.tmp),
            "ops_log": [op_json(o) for o in self.ops],
        }


def _cycle(rec: CycleRecord, files: dict[str, str]) -> Cycle:
    """A journaled cycle as the monitor reads it: the manifest it planned under (an
    unreadable one declares nothing), the reservations it observed and planned."""
    budgets: dict[str, int] = {}
    serves: dict[str, ServeDecl] = {}
    for text in files.values():
        try:
            doc = tomllib.loads(text)
        except tomllib.TOMLDecodeError:
            continue
        for role in doc.get("gpu_roles", []):
            budgets[str(role["id"])] = int(role["vram_mib"]) - int(role.get("reserve_mib", 0))
        for sv in doc.get("serve", []):
            if isinstance(sv.get("vram_mib"), int):
                placed = sv.get("placement")
                serves[str(sv["name"])] = ServeDecl(
                    str(sv.get("gpu_role", "")),
                    sv["vram_mib"],
                    placement=tuple(map(str, placed)) if isinstance(placed, list) else (),
                )
    observed = rec.observed
    reserved: dict[str, int] = {}
    cards: dict[str, tuple[str, ...]] = {}
    for step in rec.plan.get("steps", []):
        if step.get("action") in ("reserve", "start") and step.get("mib"):
            serve = str(step["serve"])
            reserved[serve] = max(reserved.get(serve, 0), int(step["mib"]))
            cards[serve] = tuple(map(str, step.get("gpu_roles") or ())) or cards.get(serve, ())
    return Cycle(
        int(rec.at * NS),
        Model(budgets, serves),
        rec.manifest_digest,
        {str(c): int(w["mib"]) for c, w in (observed.get("started_with") or {}).items()},
        {str(n): int(w["mib"]) for n, w in (observed.get("starting") or {}).items()},
        reserved,
        cards,
    )


def _counted(rows: Mapping[str, Any]) -> dict[str, tuple[str, ...]]:
    """serve -> the roles a ledger's reservations count it on (``rows``: role -> its
    reservations, each ``{"serve": ..., "mib": ...}``)."""
    out: dict[str, list[str]] = {}
    for role, reservations in rows.items():
        for row in reservations or []:
            out.setdefault(str(row["serve"]), []).append(str(role))
    return {serve: tuple(sorted(roles)) for serve, roles in out.items()}


def _api_ledger(data: dict[str, Any], t: int) -> LedgerItem | None:
    """A ``GET /v1/ledger`` answer read at ``t`` as the monitor reads it (see
    :class:`~chaos.monitor.LedgerItem`); none before the first observation."""
    at = data.get("observed_at")
    if at is None:
        return None
    since = data.get("since_observed") or {}
    busy = {str(f["serve"]) for f in data.get("in_flight") or []}
    for key in ("held", "released", "ready", "slept", "elastic"):
        busy.update(map(str, since.get(key) or ()))
    rows = {r["gpu_role"]: r.get("reservations") for r in data.get("gpu_roles") or []}
    return LedgerItem(t, "api", int(float(at) * NS), _counted(rows), frozenset(busy))


def _journal_ledger(rec: CycleRecord) -> LedgerItem | None:
    """A journaled cycle's ledger (``ledger_before``: of its observation)."""
    taken = epoch_seconds(rec.observed.get("taken_at"))
    before = rec.plan.get("ledger_before")
    if taken is None or not isinstance(before, dict):
        return None
    obs = rec.observed
    busy = {*map(str, obs.get("starting") or ()), *map(str, obs.get("unreleased") or ())}
    rows = {role: row.get("reservations") for role, row in before.items()}
    return LedgerItem(int(rec.at * NS), "journal", int(taken * NS), _counted(rows), frozenset(busy))


def _stamps(path: Path) -> tuple[int, ...]:
    """The times (ns) noted one a line in ``path``; none when it does not exist."""
    try:
        lines = path.read_text().split()
    except OSError:
        return ()
    return tuple(sorted(int(x) for x in lines if x.isdigit()))


def _healthy(port: int) -> bool:
    try:
        return _http.get(f"http://127.0.0.1:{port}/health", timeout=0.5).status_code == 200
    except httpx.HTTPError:
        return False


def _records(path: Path) -> list[tuple[int, str]]:
    """(time, message) of each JSON log record; a record with a traceback says so."""
    out = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            rec = json.loads(line)["record"]
            msg = str(rec["message"])[:240]
            exc = rec.get("exception")
            if exc:
                msg += f" [traceback: {exc.get('type')}: {str(exc.get('value'))[:160]}]"
            out.append((int(float(rec["time"]["timestamp"]) * NS), msg))
        except (ValueError, KeyError, TypeError):
            continue
    return out


def _daemon_socket() -> str:
    host = os.environ.get("DOCKER_HOST", "")
    return host.removeprefix("unix://") if host.startswith("unix://") else "/var/run/docker.sock"


def _log_tail(path: Path, lines: int = 5) -> str:
    try:
        out = []
        for line in path.read_text(errors="replace").splitlines()[-lines:]:
            try:
                out.append(str(json.loads(line)["record"]["message"]))
            except (ValueError, KeyError, TypeError):
                out.append(line)
        return " | ".join(out)
    except OSError:
        return "(no log)"
