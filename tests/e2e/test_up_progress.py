"""``vramctl up --wait`` tells where the request stands while it waits, from the event stream.

A real ``vramctl run`` (the harness of ``tests/e2e/test_live_answers.py``: busybox containers
on the real daemon, the API on a loopback port) and the real CLI in a subprocess:

- ``--wait 1`` that passes while queued: one line, ``still queued after Ns: position 1 on
  a; …`` (once, in words);
- piped (not a terminal): one plain line per stage, each with the seconds since the
  command began — queued at position N, making room (stopping the victim), starting,
  waiting for health — then the answer once, with the timings of each phase (no
  "queued: queued:", no Python dict);
- on a terminal (a pseudo-terminal): the stage is drawn live (rich) while the start
  awaits its health, which the test holds back until it has seen that stage drawn.

Nothing here is timed: the victim is protected by a ``min_runtime_s`` longer than any
run (so the request queues) until the test, having seen the request queued, saves the
manifest without it; and the health gate is a file the test creates.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading

import pytest
from support.serving import free_port
from support.waiting import WAIT_S, wait_for
from test_live_answers import (  # the fixture is used by name: pytest finds it here
    ROOT,
    TOKEN,
    Daemon,
    daemon,  # noqa: F401
    held_health,
    httpd,
    serve_toml,
)
from test_status_bars import Pty

pytestmark = pytest.mark.docker

STAGE = re.compile(r"^\s*(\d+(?:\.\d)?)s  (.+)$")


def up_env(d: Daemon) -> dict[str, str]:
    return dict(
        os.environ,
        NO_COLOR="1",
        COLUMNS="200",
        VRAMCTL_API=f"127.0.0.1:{d.api_port}",
        VRAMCTL_TOKEN=TOKEN,
    )


#: ev's protection: longer than any run of the test, lifted by an edit (:func:`unprotect`)
PROTECTED = "min_runtime_s = 3600"


def manifest(d: Daemon, ports: dict[str, int]) -> None:
    """Budget 10000: res 4000 runs; the loop starts ev 3000, protected from then until the
    test lifts it; od (4000) needs ev's room, so it queues until ev may go; od and slow (1000)
    are healthy only once the test says."""
    d.manifest.write_text(
        '[[gpu_roles]]\nid = "a"\nvram_mib = 10000\nreserve_mib = 0\n'
        + serve_toml("res", d.name("res"), 4000, "resident", ports["res"], 'desired = "running"')
        + serve_toml(
            "ev",
            d.name("ev"),
            3000,
            "evictable",
            ports["ev"],
            f'desired = "running"\n{PROTECTED}',
        )
        + serve_toml("od", d.name("od"), 4000, "on-demand", ports["od"])
        + serve_toml("slow", d.name("slow"), 1000, "on-demand", ports["slow"])
    )
    d.create("res", httpd(ports["res"]), running=True)
    d.create("ev", httpd(ports["ev"]), running=False)  # the loop starts it: protected from then
    d.create("od", held_health(ports["od"], "od.ready"), running=False)
    d.create("slow", held_health(ports["slow"], "slow.ready"), running=False)


def unprotect(d: Daemon) -> None:
    """Save the manifest with ev's ``min_runtime_s`` ended: the loop re-reads it."""
    text = d.manifest.read_text(encoding="utf-8")
    assert PROTECTED in text
    d.manifest.write_text(text.replace(PROTECTED, "min_runtime_s = 0"), encoding="utf-8")


def queued(d: Daemon) -> list[str]:
    """The serves waiting in role a's queue, in order."""
    return [e["serve"] for e in d.http.get("/v1/queue").json()["roles"].get("a", [])]


def queued_then_admitted(d: Daemon, *args: str) -> subprocess.CompletedProcess[str]:
    """``vramctl up od ARGS``, piped: once the request is seen queued, ev's protection
    is lifted, so the request is admitted in turn; od's health is held until the command
    has said it waits for it (a health that passes at once would end that stage before
    the stream tells it); what the command said."""
    argv = [sys.executable, "-m", "controller.cli", "up", "od", *args]
    said: list[str] = []
    with subprocess.Popen(
        argv, cwd=ROOT, env=up_env(d), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        reader = threading.Thread(target=lambda: said.extend(proc.stdout or ()), daemon=True)
        reader.start()
        try:
            wait_for("od queued", lambda: queued(d) == ["od"], seen=lambda: queued(d))
            unprotect(d)
            awaited = "waiting for od to be healthy"
            wait_for(awaited, lambda: any(awaited in line for line in said), seen=lambda: said)
            (d.marks / "od.ready").touch()
            proc.wait(timeout=WAIT_S)
            reader.join(timeout=WAIT_S)
            err = proc.stderr.read()
        finally:
            if proc.poll() is None:
                proc.kill()
    return subprocess.CompletedProcess(argv, proc.returncode, "".join(said), err)


def test_up_wait_tells_each_stage_plain_when_piped_and_live_on_a_terminal(d: Daemon) -> None:
    ports = {n: free_port() for n in ("res", "ev", "od", "slow")}
    manifest(d, ports)
    d.start()
    wait_for("res + ev counted", lambda: d.ledger_role()["committed_mib"] == 7000)

    def up(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "controller.cli", *args],
            cwd=ROOT,
            env=up_env(d),
            capture_output=True,
            text=True,
            timeout=WAIT_S,
            check=False,
        )

    # S passes while it is queued: where it stands, said once, in words
    r = up("up", "od", "--wait", "1", "--queue")
    assert r.returncode == 2, r.stdout + r.stderr
    last = r.stdout.splitlines()[-1]
    assert re.fullmatch(
        r"still queued after \d+s: position 1 on a; it is admitted when it fits", last
    )
    assert "queued: queued" not in r.stdout and "{" not in r.stdout
    assert up("down", "od").returncode == 0  # out of the queue: the next one queues afresh

    r = queued_then_admitted(d, "--wait", "600", "--queue")
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    stages = [m.group(2) for m in map(STAGE.match, lines) if m]
    said = "\n".join(lines)
    # every stage, in order, each once, with its elapsed seconds
    expected = [
        "queued at position 1 on a",
        "making room: stopping ev",
        "starting od",
        "waiting for od to be healthy",
    ]
    at = [next((i for i, s in enumerate(stages) if s.startswith(e)), -1) for e in expected]
    assert -1 not in at and at == sorted(at), said
    assert len(stages) == len(set(stages)), said
    seconds = [float(m.group(1)) for m in map(STAGE.match, lines) if m]
    assert seconds == sorted(seconds), said
    # the answer, once, with the final timings
    [ready] = [line for line in lines if line.startswith("ready: ")]
    assert ready == lines[-1], said
    for phase in ("queued", "made room", "started", "ready", "total"):
        assert re.search(rf"\b{phase} \d+\.\ds", ready), ready
    assert "queued: queued" not in said and "{" not in said
    assert "\x1b[" not in r.stdout  # piped: plain lines, no cursor movement

    # on a terminal: the stage is drawn live while the start awaits its health
    term = Pty(
        [sys.executable, "-m", "controller.cli", "up", "slow", "--wait", "600"],
        env={"VRAMCTL_API": f"127.0.0.1:{d.api_port}", "VRAMCTL_TOKEN": TOKEN},
    )
    try:
        term.wait_for("the live stage", lambda: "waiting for slow to be healthy" in term.text)
        assert term.proc.poll() is None  # still waiting: the stage was drawn while it waits
        (d.marks / "slow.ready").touch()
        assert term.wait_exit("the answer") == 0, term.text
        assert "ready: slow is healthy and routable" in term.text
        assert re.search(r"\d+s", term.text)  # elapsed seconds beside the stage
        assert "\x1b[" in term.raw.decode("utf-8", "replace")  # drawn, not printed plain
    finally:
        term.close()


@pytest.fixture
def d(daemon: Daemon) -> Daemon:  # noqa: F811
    return daemon
