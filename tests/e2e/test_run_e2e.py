"""End to end: ``vramctl run`` as a subprocess on the real Docker daemon.

Each test gets a temp folder (manifest, state directory, the controller's JSON log)
and busybox serve containers with a unique name prefix and the ``vramctl.test=1``
label (httpd answering the serve's health path on loopback, as in
tests/e2e/test_executor_e2e.py). The controller runs as
``python -m controller.interfaces.cli run -m MANIFEST --state-dir STATE --resync 1 --log-json``
(plus ``--no-api`` when this vramctl has it), and the tests only edit files, send
signals and look at Docker, never at the controller's memory. A test that checks
that nothing more happens over some cycles runs the controller with its API on a
free loopback port (``api=True``) and waits on the loop's own cycle count
(``GET /healthz``), so the window is never one in which no cycle ran.

Safety is checked against Docker itself: a thread follows Docker's event stream for
the test's containers from before the first one starts, so every start and death is
seen in order; replaying them, the reservations of the running test containers never
exceed the role's budget at any moment (no overcommit), and a container's starts can
be counted exactly (nothing started twice). Every poll of container states checks the
budget too.

Every wait is for an event, polled against a generous deadline (``tests/support/waiting.py``);
no fixed sleep stands for a cycle.
Controllers still running at the end are SIGKILLed before the
containers are removed.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import subprocess
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
import pytest
from docker.errors import NotFound
from support.cli import run_argv, run_cli
from support.manifests import serve_toml as serve_text
from support.serving import free_port, httpd
from support.waiting import WAIT_S, wait_for

from controller.store.journal import Journal, journal_path

pytestmark = pytest.mark.docker

REPO = Path(__file__).resolve().parents[2]
RESYNC_S = 1.0
BUDGET_MIB = 10_000
HOLDS = frozenset({"running", "paused", "restarting"})


# ── helpers ──────────────────────────────────────────────────────────────────


def healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
            return 200 <= int(r.status) < 300
    except OSError:
        return False


def _env() -> dict[str, str]:
    return dict(os.environ, COLUMNS="200", NO_COLOR="1")


def vramctl(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, env=_env(), cwd=REPO, timeout=timeout)


@functools.cache
def run_flags() -> tuple[str, ...]:
    """``--no-api`` when this vramctl's ``run`` has it (the API is optional here)."""
    r = vramctl("run", "--help")
    assert r.returncode == 0, r.stdout + r.stderr
    return ("--no-api",) if "--no-api" in r.stdout else ()


ROLE = f"""
[[gpu_roles]]
id = "a"
vram_mib = {BUDGET_MIB}
reserve_mib = 0
"""


def serve_toml(
    name: str,
    *,
    mib: int,
    residency: str,
    port: int,
    desired: str | None = None,
    extra: str = "",
) -> str:
    want = f'desired = "{desired}"' if desired else ""
    return serve_text(name, f"@{name}", mib, residency, port, extra=f"{want}\n{extra}")


# ── the controller process ───────────────────────────────────────────────────


@dataclass
class Run:
    """One ``vramctl run`` subprocess and its JSON log (a file: no pipe to fill up)."""

    proc: subprocess.Popen[bytes]
    log: Path
    api: str | None = None  # HOST:PORT of its API (``Fleet.start(api=True)``)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def records(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for line in self.log.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                rec = json.loads(line)["record"]
            except (ValueError, KeyError, TypeError):  # a half-written line, or not loguru
                rec = {"message": line, "extra": {}}
            out.append(rec)
        return out

    def messages(self) -> list[str]:
        return [str(r.get("message", "")) for r in self.records()]

    def steps(self) -> list[str]:
        """``"serve action outcome"`` for each executed step, in order."""
        out = []
        for r in self.records():
            x = r.get("extra") or {}
            if "action" in x and "outcome" in x:
                out.append(f"{x.get('serve')} {x['action']} {x['outcome']}")
        return out

    def text(self) -> str:
        return "\n".join(self.messages())

    def wait_log(self, needle: str, timeout: float = WAIT_S) -> str:
        def seen() -> str | None:
            hit = next((m for m in self.messages() if needle in m), None)
            if hit is None and self.proc.poll() is not None:
                raise AssertionError(
                    f"vramctl run exited {self.proc.returncode} before logging {needle!r}:\n"
                    + self.text()
                )
            return hit

        return wait_for(f"{needle!r} in the log", seen, timeout)

    def wait_step(self, step: str, timeout: float = WAIT_S) -> None:
        wait_for(f"step {step!r}", lambda: step in self.steps(), timeout)

    def cycles(self) -> int | None:
        """The loop's count of completed cycles (``/healthz``); ``None`` while it cannot say."""
        assert self.api is not None, "started without its API: Fleet.start(api=True)"
        try:
            with urllib.request.urlopen(f"http://{self.api}/healthz", timeout=2) as r:
                return int(json.load(r)["cycles"])
        except (OSError, ValueError, KeyError):
            return None

    def cycled(self, n: int, timeout: float = WAIT_S) -> None:
        """Wait until ``n`` whole cycles ran after this call (the one under way may have
        begun before it, so it does not count): each looked at what came before."""

        def now() -> int | None:
            if self.proc.poll() is not None:
                raise AssertionError(f"vramctl run exited {self.proc.returncode}:\n{self.text()}")
            return self.cycles()

        under_way = wait_for("the loop's cycle count", lambda: (c := now()) is not None and c + 1)
        wait_for(f"{n} more cycles", lambda: (now() or 0) >= under_way + n, timeout)

    def started(self) -> Run:
        """Wait until the loop runs (its signal handlers are installed by then)."""
        self.wait_log("vramctl run: ")
        return self

    def stop(self, sig: signal.Signals = signal.SIGTERM, timeout: float = WAIT_S) -> int:
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"vramctl run did not exit on {sig.name}:\n{self.text()}"
            ) from None


# ── the test's host ──────────────────────────────────────────────────────────


@dataclass
class Fleet:
    """One test's containers, manifest, state directory, controllers and event record."""

    client: docker.DockerClient
    image: str
    tmp: Path
    prefix: str
    mib: dict[str, int] = field(default_factory=dict)  # serve -> reservation, for the budget
    events: list[dict[str, Any]] = field(default_factory=list)
    created: list[str] = field(default_factory=list)
    runs: list[Run] = field(default_factory=list)

    @property
    def manifest(self) -> Path:
        return self.tmp / "serves.toml"

    @property
    def state_dir(self) -> Path:
        return self.tmp / "state"

    @property
    def journal(self) -> Path:
        return journal_path(self.state_dir)

    def name(self, serve: str) -> str:
        return f"{self.prefix}{serve}"

    def container(
        self, serve: str, *, port: int, mib: int, running: bool, command: list[str] | None = None
    ) -> None:
        self.mib[serve] = mib
        c = self.client.containers.create(
            self.image,
            command or httpd(port),
            name=self.name(serve),
            init=True,
            network_mode="host",
            labels={"vramctl.test": "1"},
        )
        self.created.append(self.name(serve))
        if running:
            c.start()

    def write(self, body: str, path: Path | None = None, *, by_rename: bool = False) -> Path:
        """Save a manifest in place, or the way many editors do (temp file + rename)."""
        path = path or self.manifest
        text = body.replace("@", self.prefix)
        if by_rename:
            tmp = path.with_name(f".{path.name}.swp")
            tmp.write_text(text)
            os.replace(tmp, path)
        else:
            path.write_text(text)
        return path

    def start(self, *extra: str, log: str | None = None, api: bool = False) -> Run:
        log_path = self.tmp / (log or f"run{len(self.runs) + 1}.log")
        address = f"127.0.0.1:{free_port()}" if api else None
        flags = ("--api", address) if address else run_flags()
        argv = run_argv(
            self.manifest, self.state_dir, "--log-json", *flags, *extra, resync=str(RESYNC_S)
        )
        with log_path.open("wb") as fh:
            proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, env=_env(), cwd=REPO)
        run = Run(proc, log_path, address)
        self.runs.append(run)
        return run

    # -- what docker shows ----------------------------------------------------------
    def states(self) -> dict[str, str]:
        """serve -> container status; every look also checks the budget."""
        cs = self.client.containers.list(
            all=True, filters={"name": self.prefix, "label": "vramctl.test=1"}
        )
        out = {str(c.name).removeprefix(self.prefix): str(c.status) for c in cs}
        held = sum(self.mib.get(s, 0) for s, st in out.items() if st in HOLDS)
        assert held <= BUDGET_MIB, f"overcommit seen by a poll: {out} holds {held} MiB"
        return out

    def state(self, serve: str) -> str:
        return self.states()[serve]

    def wait_state(self, serve: str, state: str, timeout: float = WAIT_S) -> None:
        wait_for(f"{serve} {state}", lambda: self.state(serve) == state, timeout)

    def started_at(self, serve: str) -> str:
        return str(self.client.api.inspect_container(self.name(serve))["State"]["StartedAt"])

    def our_events(self, since_ns: int = 0) -> list[dict[str, Any]]:
        return [e for e in list(self.events) if int(e.get("timeNano", 0)) >= since_ns]

    def starts(self, serve: str, since_ns: int = 0) -> int:
        name = self.name(serve)
        return sum(
            1
            for e in self.our_events(since_ns)
            if e.get("Action") == "start" and e["Actor"]["Attributes"].get("name") == name
        )

    def assert_never_overcommitted(self) -> None:
        """Replay every start / death of the test's containers: the budget always held."""
        running: set[str] = set()
        for e in list(self.events):
            serve = str(e["Actor"]["Attributes"].get("name", "")).removeprefix(self.prefix)
            if e.get("Action") == "start":
                running.add(serve)
            elif e.get("Action") == "die":
                running.discard(serve)
            held = sum(self.mib.get(s, 0) for s in running)
            assert held <= BUDGET_MIB, (
                f"overcommit after {e.get('Action')} {serve}: {sorted(running)} hold {held} MiB"
            )

    def ups(self) -> list[str]:
        """The serves whose ``up`` command the journal records as running."""
        if not self.journal.is_file():
            return []
        with Journal.open(self.journal, readonly=True) as j:
            return [u.serve for u in j.ups()]

    def request(self, serve: str, ttl_s: float | None = None) -> None:
        """An on-demand request, written into the journal before the controller starts."""
        with Journal.open(self.journal) as j:
            j.add_request(serve, time.time(), ttl_s)

    def end_request(self, serve: str) -> None:
        """End the serve's on-demand request in the journal, as ``vramctl down`` does (kept
        as ended until its serve is down); the running loop reads it at its next cycle."""
        with Journal.open(self.journal) as j:
            j.add_request(serve, time.time() - 1.0, 0.0, released=True)

    def cycles(self, *, dry_run: bool = False) -> list[Any]:
        path = self.journal.with_name("journal.dry-run.sqlite3") if dry_run else self.journal
        with Journal.open(path, readonly=True) as j:
            return j.cycles()


def _follow_events(
    client: docker.DockerClient, prefix: str, sink: list[dict[str, Any]]
) -> tuple[Any, threading.Thread]:
    stream = client.events(decode=True, filters={"type": "container", "label": "vramctl.test=1"})

    def pump() -> None:
        with contextlib.suppress(Exception):  # the stream is closed at teardown
            for e in stream:
                name = str((e.get("Actor") or {}).get("Attributes", {}).get("name", ""))
                if name.startswith(prefix):
                    sink.append(e)

    thread = threading.Thread(target=pump, daemon=True, name="docker-events")
    thread.start()
    return stream, thread


@pytest.fixture
def fleet(docker_client: docker.DockerClient, test_image: str, tmp_path: Path) -> Iterator[Fleet]:
    prefix = f"vramctl-test-run-{uuid.uuid4().hex[:8]}-"
    f = Fleet(docker_client, test_image, tmp_path, prefix)
    # a stream quiet for longer than the client's read timeout would end silently and
    # miss the events after it: an hour, and the stream is closed at teardown
    events_client = docker.from_env(timeout=3600)
    stream, thread = _follow_events(events_client, prefix, f.events)
    try:
        yield f
    finally:
        for run in f.runs:  # the controllers first: none may act on what is removed next
            if run.proc.poll() is None:
                run.proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                run.proc.wait(10)
        for name in f.created:
            with contextlib.suppress(NotFound):
                docker_client.containers.get(name).remove(force=True)
        with contextlib.suppress(Exception):
            stream.close()
        thread.join(5)
        events_client.close()


# ── the tests ────────────────────────────────────────────────────────────────


def test_run_converges_on_manifest_edits_and_restarts_nothing(fleet: Fleet) -> None:
    pa, pb, pc = free_port(), free_port(), free_port()
    fleet.container("a", port=pa, mib=2000, running=False)
    fleet.container("b", port=pb, mib=2000, running=True)
    fleet.container("c", port=pc, mib=2000, running=False)
    a = serve_toml("a", mib=2000, residency="resident", port=pa, desired="running")
    b_running = serve_toml("b", mib=2000, residency="evictable", port=pb, desired="running")
    b_stopped = serve_toml("b", mib=2000, residency="evictable", port=pb, desired="stopped")
    c = serve_toml("c", mib=2000, residency="on-demand", port=pc, desired="running")
    fleet.write(ROLE + a + b_running)

    run = fleet.start().started()
    run.wait_step("a await_ready ok")
    assert healthy(pa)
    assert fleet.state("b") == "running"
    assert fleet.state("c") == "created"  # not in the manifest: untouched

    # an edit in place: b desired stopped
    fleet.write(ROLE + a + b_stopped)
    fleet.wait_state("b", "exited")
    run.wait_log("manifest: reloaded (2 serves)")

    # saved the way editors do (rename): a new serve, desired running
    fleet.write(ROLE + a + b_stopped + c, by_rename=True)
    fleet.wait_state("c", "running")
    wait_for("c healthy", lambda: healthy(pc))

    # a broken file: located error, the last good manifest stays in force
    fleet.write(ROLE + a + b_stopped + c + '\n[[serve]]\nname = "broken\n')
    run.wait_log("the last good manifest stays in force")
    assert fleet.states() == {"a": "running", "b": "exited", "c": "running"}
    fleet.write(ROLE + a + b_stopped + c)
    run.wait_log("manifest: valid again")

    # a container dies after a healthy run: it is brought back (at once)
    before = fleet.started_at("c")
    fleet.client.containers.get(fleet.name("c")).kill()
    wait_for(
        "c brought back",
        lambda: fleet.state("c") == "running" and fleet.started_at("c") != before,
    )
    wait_for("c healthy again", lambda: healthy(pc))
    assert any("c: container exited 137" in m for m in run.messages()), run.text()

    assert run.stop(signal.SIGTERM) == 0, run.text()
    assert "vramctl run: stopped" in run.messages()

    # restart on a converged fleet, with one real change (b desired running again):
    # b starts once; a and c, already running, are not started again
    started = {s: fleet.started_at(s) for s in ("a", "c")}
    restart_ns = time.time_ns()
    fleet.write(ROLE + a + b_running + c)
    run2 = fleet.start(api=True).started()
    fleet.wait_state("b", "running")
    run2.wait_step("b await_ready ok")
    run2.cycled(2)  # two more cycles with nothing to do
    assert fleet.starts("b", restart_ns) == 1
    assert fleet.starts("a", restart_ns) == 0 and fleet.starts("c", restart_ns) == 0
    assert {s: fleet.started_at(s) for s in ("a", "c")} == started
    assert not any(" start " in s for s in run2.steps() if not s.startswith("b ")), run2.steps()
    assert run2.stop(signal.SIGINT) == 0, run2.text()
    assert "vramctl run: stopped" in run2.messages()
    fleet.assert_never_overcommitted()

    # replay the journal these runs wrote: it executes nothing
    with Journal.open(fleet.journal, readonly=True) as j:
        last = j.cycle_ids()[-1]
    host = (fleet.states(), {s: fleet.started_at(s) for s in ("a", "b", "c")})
    replay_ns = time.time_ns()
    # against the last manifest: each cycle recorded under it plans the same, and each
    # recorded under an earlier one (a + b; then b stopped; then c added) differs, since
    # every earlier manifest wants a serve started or stopped that the last does not
    r = vramctl("replay", str(fleet.journal), "-m", str(fleet.manifest), "--json")
    assert r.returncode == 2, r.stdout + r.stderr
    replayed = json.loads(r.stdout)
    assert replayed["summary"]["cycles"] >= 4 and replayed["summary"]["errors"] == 0
    assert [(c["id"], c["status"]) for c in replayed["cycles"]] == [
        (c["id"], "differs" if c["manifest_changed"] else "same") for c in replayed["cycles"]
    ], r.stdout
    assert replayed["cycles"][0]["manifest_changed"] is True  # a + b: c was not started
    assert replayed["cycles"][-1]["id"] == last and replayed["cycles"][-1]["status"] == "same"
    r = vramctl(
        "replay", str(fleet.journal), "-m", str(fleet.manifest), "--cycle", str(last), "--json"
    )
    assert r.returncode == 0, r.stdout + r.stderr  # the manifest it was recorded under
    assert json.loads(r.stdout)["cycles"][0]["status"] == "same"
    changed = fleet.write(ROLE + a + b_stopped + c, fleet.tmp / "changed.toml")
    r = vramctl("replay", str(fleet.journal), "-m", str(changed), "--cycle", str(last), "--json")
    assert r.returncode == 2, r.stdout + r.stderr
    assert json.loads(r.stdout)["cycles"][0]["status"] == "differs"
    assert (fleet.states(), {s: fleet.started_at(s) for s in ("a", "b", "c")}) == host
    assert fleet.our_events(replay_ns) == []


def _gated_httpd(port: int) -> list[str]:
    """:func:`serving.httpd` that answers only once the test opens its gate
    (:func:`_open_gate`): until then, an await_ready on it cannot end."""
    serve = " ".join(httpd(port)[2:])
    return ["sh", "-c", f"until [ -e /gate ]; do sleep 0.05; done; {serve}"]


def _open_gate(fleet: Fleet, serve: str) -> None:
    done = fleet.client.containers.get(fleet.name(serve)).exec_run(["touch", "/gate"])
    assert done.exit_code == 0, done.output


def _eviction_fleet(
    fleet: Fleet, *, llm_delay_s: int = 3, llm_gated: bool = False
) -> dict[str, int]:
    """emb resident 2000 + omni evictable 6000 running; llm on-demand 6000 (slow start,
    or healthy only once the test opens its gate)."""
    ports = {"emb": free_port(), "omni": free_port(), "llm": free_port()}
    fleet.container("emb", port=ports["emb"], mib=2000, running=True)
    fleet.container("omni", port=ports["omni"], mib=6000, running=True)
    fleet.container(
        "llm",
        port=ports["llm"],
        mib=6000,
        running=False,
        # await_ready takes that long, or until the test opens the gate
        command=_gated_httpd(ports["llm"])
        if llm_gated
        else httpd(ports["llm"], delay_s=llm_delay_s),
    )
    fleet.write(
        ROLE
        + serve_toml("emb", mib=2000, residency="resident", port=ports["emb"], desired="running")
        + serve_toml("omni", mib=6000, residency="evictable", port=ports["omni"], desired="running")
        + serve_toml("llm", mib=6000, residency="on-demand", port=ports["llm"])
    )
    wait_for("emb and omni up", lambda: healthy(ports["emb"]) and healthy(ports["omni"]))
    fleet.request("llm")  # no TTL
    return ports


def test_sigkill_mid_eviction_then_restart_converges_once(fleet: Fleet) -> None:
    ports = _eviction_fleet(fleet, llm_gated=True)
    t0 = time.time_ns()

    def outcome() -> dict[str, Any] | None:
        if not fleet.journal.exists():
            return None
        cycles = fleet.cycles()
        return cycles[0].outcome if cycles else None

    run1 = fleet.start().started()
    # killed once the eviction's outcome is journaled and llm's container runs, while
    # llm's await_ready still runs beside the loop (llm answers only once its gate is
    # opened, below)
    wait_for("the eviction's outcome journaled", outcome)
    fleet.wait_state("llm", "running")
    run1.proc.send_signal(signal.SIGKILL)
    assert run1.proc.wait(WAIT_S) == -signal.SIGKILL
    assert fleet.state("omni") == "exited"
    (cycle,) = fleet.cycles()  # the eviction plan was journaled; the start's end never came
    done = [f"{s['action']} {s['serve']}" for s in cycle.outcome["steps"]]
    assert done[:3] == ["stop omni", "release omni", "reserve llm"], done
    assert "await_ready llm" not in done, done  # the start ran beside the loop, unfinished
    # and the journal says so: the next controller treats its start as not ended
    assert cycle.outcome["pending"] == ["llm"], cycle.outcome
    assert [f"{s['action']} {s['serve']}" for s in cycle.plan["steps"]] == [
        "stop omni",
        "release omni",
        "reserve llm",
        "start llm",
        "await_ready llm",
    ]

    _open_gate(fleet, "llm")
    run2 = fleet.start(api=True).started()  # the dead controller's lock does not block it
    wait_for("llm healthy", lambda: healthy(ports["llm"]))
    wait_for("llm running", lambda: fleet.state("llm") == "running")
    run2.cycled(2)  # two more cycles: nothing else may happen
    assert fleet.states() == {"emb": "running", "omni": "exited", "llm": "running"}
    assert fleet.starts("llm", t0) == 1, run1.steps() + run2.steps()
    assert fleet.starts("omni", t0) == 0 and fleet.starts("emb", t0) == 0
    fleet.assert_never_overcommitted()
    assert run2.stop() == 0, run2.text()

    host = fleet.states()
    replay_ns = time.time_ns()
    r = vramctl("replay", str(fleet.journal), "-m", str(fleet.manifest))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "cycle 1" in r.stdout
    assert fleet.states() == host and fleet.our_events(replay_ns) == []


def test_evict_for_a_request_then_backfill_when_it_ends(fleet: Fleet) -> None:
    ports = _eviction_fleet(fleet, llm_delay_s=0)
    t0 = time.time_ns()

    run = fleet.start().started()
    run.wait_step("llm await_ready ok")
    assert fleet.states() == {"emb": "running", "omni": "exited", "llm": "running"}
    assert run.steps()[:3] == ["omni stop ok", "omni release ok", "llm reserve ok"]

    # the request ends (what `vramctl down` records): llm stops, then omni comes back
    fleet.end_request("llm")
    fleet.wait_state("llm", "exited")
    wait_for("omni backfilled", lambda: healthy(ports["omni"]))
    run.wait_step("omni await_ready ok")
    assert fleet.starts("omni", t0) == 1 and fleet.starts("llm", t0) == 1
    # omni exited non-zero because the controller stopped it: not counted as a crash
    assert not any(m.startswith("omni: container exited") for m in run.messages()), run.text()
    fleet.assert_never_overcommitted()
    assert run.stop() == 0, run.text()


def test_sigterm_mid_plan_stops_after_the_step_and_journals_the_truth(fleet: Fleet) -> None:
    _eviction_fleet(fleet)

    run = fleet.start().started()
    run.wait_step("omni stop ok")
    assert run.stop(signal.SIGTERM) == 0, run.text()
    messages = run.messages()
    assert "stopping after the current step" in messages and "vramctl run: stopped" in messages

    (cycle,) = fleet.cycles()
    assert cycle.outcome is not None, "the interrupted plan's outcome was not journaled"
    steps = cycle.outcome["steps"]
    assert [s["outcome"] for s in steps[:2]] == ["ok", "ok"]  # stop, release omni
    assert any("the controller is stopping" in (s.get("detail") or "") for s in steps), steps
    # the journal's ledger is what docker shows now
    host = fleet.states()
    held = sum(fleet.mib[s] for s, st in host.items() if st in HOLDS)
    assert cycle.outcome["ledger"]["a"]["committed_mib"] == held, (cycle.outcome, host)
    assert host["omni"] == "exited" and host["emb"] == "running"
    fleet.assert_never_overcommitted()


def test_dry_run_executes_nothing(fleet: Fleet) -> None:
    port = free_port()
    fleet.container("a", port=port, mib=2000, running=False)
    fleet.write(
        ROLE + serve_toml("a", mib=2000, residency="resident", port=port, desired="running")
    )
    t0 = time.time_ns()

    run = fleet.start("--dry-run", api=True).started()
    assert any(m.startswith("vramctl run: ") and "dry run" in m for m in run.messages())
    run.wait_log("dry run: would start a")
    # the same plan is logged and journalled once, however many cycles pass; a
    # manifest edit that changes the plan is planned (in words) again
    run.cycled(2)
    assert sum("dry run: would reserve a" in m for m in run.messages()) == 1
    fleet.write(
        ROLE + serve_toml("a", mib=3000, residency="resident", port=port, desired="running")
    )
    wait_for(
        "the edited plan",
        lambda: any("would reserve a: reserve 3000 MiB" in m for m in run.messages()),
    )
    assert fleet.state("a") == "created"
    assert run.steps() == []
    assert run.stop() == 0, run.text()
    assert fleet.our_events(t0) == []
    # a dry run journals apart: nothing of it (cycles, requests) reaches a real run
    cycles = fleet.cycles(dry_run=True)
    assert len(cycles) == 2 and all(c.dry_run and c.outcome is None for c in cycles)
    assert not fleet.journal.exists() or fleet.cycles() == []


def test_second_controller_on_a_state_dir_is_refused(fleet: Fleet) -> None:
    port = free_port()
    fleet.container("a", port=port, mib=2000, running=True)
    fleet.write(ROLE + serve_toml("a", mib=2000, residency="resident", port=port))  # unmanaged

    first = fleet.start().started()
    t = time.monotonic()
    second = fleet.start()
    try:
        rc = second.proc.wait(WAIT_S)
    except subprocess.TimeoutExpired:
        raise AssertionError("a second controller on the same state dir kept running") from None
    assert rc != 0
    assert time.monotonic() - t < WAIT_S
    assert f"pid {first.pid}" in second.text(), second.text()
    assert first.proc.poll() is None  # the first one is not disturbed
    assert first.stop(signal.SIGINT) == 0, first.text()

    third = fleet.start().started()  # once the holder stops, the state dir is free
    assert third.stop() == 0, third.text()
    assert fleet.state("a") == "running"


def test_a_plan_the_preflight_refuses_backs_off_instead_of_spinning(fleet: Fleet) -> None:
    port = free_port()
    fleet.mib["ghost"] = 2000
    # desired running, but its container does not exist and it has no `up` to create it
    fleet.write(
        ROLE + serve_toml("ghost", mib=2000, residency="resident", port=port, desired="running")
    )

    run = fleet.start(api=True).started()
    run.wait_log("preflight: ghost: container")
    run.cycled(2)  # two more cycles (the first backoff is 5 s): held back, not retried
    refused = [m for m in run.messages() if m.startswith("preflight: ")]
    assert 1 <= len(refused) <= 2, f"{len(refused)} preflight refusals over 3 cycles or more"
    assert any("ghost: preflight: " in m and "next try in" in m for m in run.messages())
    assert len(fleet.cycles()) <= 2
    assert run.stop() == 0, run.text()


def test_a_non_utf8_manifest_does_not_stop_the_cycles(fleet: Fleet) -> None:
    """A manifest saved as Latin-1 is a located error; the last good one keeps working."""
    port = free_port()
    fleet.container("a", port=port, mib=2000, running=False)
    good = ROLE + serve_toml("a", mib=2000, residency="resident", port=port, desired="running")
    fleet.write(good)

    run = fleet.start().started()
    run.wait_step("a await_ready ok")
    fleet.manifest.write_bytes(good.replace("@", fleet.prefix).encode() + b"# caf\xe9\n")
    run.wait_log("not UTF-8 text")
    before = fleet.started_at("a")
    fleet.client.containers.get(fleet.name("a")).kill()
    wait_for(
        "a brought back under the last good manifest",
        lambda: fleet.state("a") == "running" and fleet.started_at("a") != before,
    )
    assert not any("reconcile failed" in m for m in run.messages()), run.text()
    assert run.stop() == 0, run.text()


def test_manifests_that_hang_or_recurse_are_located_and_the_watcher_survives(
    fleet: Fleet,
) -> None:
    """A symlink loop beside the manifest, tables nested 1000 deep, a FIFO at its path:
    each is a located error under ``run``, and a later valid edit is still applied."""
    port = free_port()
    fleet.container("a", port=port, mib=2000, running=False)
    fleet.write(
        ROLE + serve_toml("a", mib=2000, residency="resident", port=port, desired="running")
    )
    run = fleet.start(api=True).started()
    run.wait_step("a await_ready ok")

    (fleet.tmp / "loop1").symlink_to(fleet.tmp / "loop2")  # the watch filter resolves it
    (fleet.tmp / "loop2").symlink_to(fleet.tmp / "loop1")
    run.cycled(2)
    fleet.write(ROLE + "deep = " + "[" * 1000 + "]" * 1000 + "\n", by_rename=True)
    run.wait_log("nested too deep")
    fifo = fleet.tmp / "fifo"
    os.mkfifo(fifo)
    os.replace(fifo, fleet.manifest)
    run.wait_log("not a regular file (a FIFO)")
    assert fleet.state("a") == "running"  # the last good manifest stays in force

    fleet.write(
        ROLE + serve_toml("a", mib=2000, residency="resident", port=port, desired="stopped"),
        by_rename=True,
    )
    fleet.wait_state("a", "exited")
    assert not any("reconcile failed" in m for m in run.messages()), run.text()
    assert run.stop() == 0, run.text()


def test_a_half_written_manifest_does_not_hand_away_a_running_serves_room(fleet: Fleet) -> None:
    """A file caught mid-write, still valid TOML, cut after its first ``[[serve]]``: the
    serve in the lost tail keeps running, so its room is not given to another serve."""
    pa, pb = free_port(), free_port()
    fleet.container("a", port=pa, mib=6000, running=False)
    fleet.container("b", port=pb, mib=6000, running=False)
    b = serve_toml("b", mib=6000, residency="on-demand", port=pb, desired="running")
    a = serve_toml("a", mib=6000, residency="resident", port=pa, desired="running")
    fleet.write(ROLE + b + a)  # b fits only in a's room: blocked while a runs
    t0 = time.time_ns()

    run = fleet.start(api=True).started()
    run.wait_step("a await_ready ok")
    run.cycled(2)
    assert fleet.states() == {"a": "running", "b": "created"}

    fleet.write(ROLE + b, by_rename=True)  # the tail with a is lost
    run.wait_log("manifest: reloaded (1 serves)")
    run.wait_log(f"{fleet.name('a')} is no longer declared")
    run.cycled(2)  # two more cycles: b must not be started into a's room
    assert fleet.states() == {"a": "running", "b": "created"}
    assert fleet.starts("b", t0) == 0, run.steps()

    # once a stops, its room is free: b starts
    fleet.client.containers.get(fleet.name("a")).stop(timeout=5)
    fleet.wait_state("b", "running")
    fleet.assert_never_overcommitted()
    assert run.stop() == 0, run.text()
