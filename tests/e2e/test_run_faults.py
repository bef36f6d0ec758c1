"""Faults that used to break the promise, reproduced on the real daemon with ``vramctl run``.

Each test drives a real controller subprocess over busybox containers (the harness of
``test_run_e2e``) into one fault and checks the promise from Docker's own event stream:
no moment where the containers the controller started take the role over budget, no
serve started twice, and the loop keeps converging elsewhere.

- an outside start while a plan runs (before its reserve) is not built on;
- an ``up`` left running by a SIGKILLed controller keeps its room until it exits;
- a serve the preflight refuses does not hold back the others;
- a slow ``up`` does not keep the loop from restarting another serve;
- a failed ``up`` says Docker's reason.
"""

from __future__ import annotations

import shlex
import signal
import time
from pathlib import Path

import pytest
from support.serving import free_port, httpd
from support.waiting import WAIT_S, wait_for
from test_run_e2e import (  # the fixture is used by name: pytest finds it here
    ROLE,
    Fleet,
    fleet,  # noqa: F401
    healthy,
    serve_toml,
)

pytestmark = pytest.mark.docker


def slow_to_stop(port: int) -> list[str]:
    """A serve that ignores SIGTERM: ``docker stop`` waits its whole stop timeout."""
    return [
        "sh",
        "-c",
        "trap '' TERM; mkdir -p /www && echo ok > /www/health && "
        f"httpd -p 127.0.0.1:{port} -h /www; while true; do sleep 1; done",
    ]


def up_script(fleet: Fleet, serve: str, *, port: int) -> tuple[Path, Path, Path, Path]:
    """An ``up`` command that marks its start, waits until the test touches its gate, then
    runs the serve's container; without the gate after 10 minutes (a failed test's), it
    exits 1 and runs nothing, so nothing is left behind the test's teardown."""
    began, done = fleet.tmp / f"{serve}.began", fleet.tmp / f"{serve}.done"
    gate = fleet.tmp / f"{serve}.go"
    script = fleet.tmp / f"up-{serve}.sh"
    script.write_text(
        "#!/bin/sh\n"
        f"touch {began}\n"
        f"i=0; while [ ! -e {gate} ] && [ $i -lt 6000 ]; do sleep 0.1; i=$((i+1)); done\n"
        f"[ -e {gate} ] || exit 1\n"
        f"docker run -d --init --network host --label vramctl.test=1 --name {fleet.name(serve)} "
        f"{fleet.image} {shlex.join(httpd(port))} >/dev/null\n"
        f"touch {done}\n"
    )
    script.chmod(0o755)
    return script, began, done, gate


def test_an_outside_start_during_a_plan_is_not_built_on(fleet: Fleet) -> None:
    ports = {s: free_port() for s in ("res", "evi", "llm", "side")}
    fleet.container("res", port=ports["res"], mib=2000, running=True)
    fleet.container(
        "evi", port=ports["evi"], mib=4000, running=True, command=slow_to_stop(ports["evi"])
    )
    fleet.container("llm", port=ports["llm"], mib=6000, running=False)
    fleet.container("side", port=ports["side"], mib=3000, running=False)
    fleet.write(
        ROLE
        + serve_toml("res", mib=2000, residency="resident", port=ports["res"], desired="running")
        + serve_toml("evi", mib=4000, residency="evictable", port=ports["evi"], desired="running")
        + serve_toml("llm", mib=6000, residency="on-demand", port=ports["llm"])
        # unmanaged: counted in the ledger, never started or stopped by the controller
        + serve_toml("side", mib=3000, residency="resident", port=ports["side"])
    )
    # evi takes its whole stop_timeout_s (5 s) to stop: the plan's reserve comes after it
    wait_for("res and evi up", lambda: healthy(ports["res"]) and healthy(ports["evi"]))
    fleet.request("llm")
    t0 = time.time_ns()
    run = fleet.start(api=True).started()
    wait_for(
        "evi's stop to begin",
        lambda: any(
            e.get("Action") == "kill" and e["Actor"]["Attributes"].get("name") == fleet.name("evi")
            for e in fleet.our_events(t0)
        ),
    )
    fleet.client.containers.get(fleet.name("side")).start()  # behind the controller's back
    wait_for(
        "evi's stop to end",
        lambda: any(
            e.get("Action") == "die" and e["Actor"]["Attributes"].get("name") == fleet.name("evi")
            for e in fleet.our_events(t0)
        ),
    )
    run.cycled(3)  # three more cycles: llm does not fit beside side, evi may come back
    fleet.assert_never_overcommitted()
    assert fleet.starts("llm", t0) == 0, run.steps()
    assert fleet.state("llm") != "running"
    run.wait_log("started outside the controller while this plan ran")
    assert run.stop() == 0, run.text()


def test_an_up_left_by_a_killed_controller_keeps_its_room(fleet: Fleet) -> None:
    ports = {s: free_port() for s in ("od", "res")}
    fleet.mib["od"] = 6000
    fleet.created.append(fleet.name("od"))  # od's `up` creates it: removed at teardown
    fleet.container("res", port=ports["res"], mib=6000, running=False)
    script, began, done, gate = up_script(fleet, "od", port=ports["od"])
    # its deadline (start_timeout_s) outlasts the take-over: past it, the up would be ended
    od = (
        serve_toml("od", mib=6000, residency="on-demand", port=ports["od"]).replace(
            "start_timeout_s = 30", "start_timeout_s = 600"
        )
        + f'up = "{script}"\n'
    )
    res_stopped = serve_toml(
        "res", mib=6000, residency="resident", port=ports["res"], desired="stopped"
    )
    fleet.write(ROLE + od + res_stopped)
    fleet.request("od")
    t0 = time.time_ns()
    run1 = fleet.start().started()
    wait_for("od's up to begin", began.exists)
    # the controller records the up once it has spawned it: killed before, it leaves
    # nothing to take over (the up itself marks its beginning a moment earlier)
    wait_for("od's up recorded in the journal", lambda: "od" in fleet.ups())
    run1.proc.send_signal(signal.SIGKILL)
    assert run1.proc.wait(WAIT_S) == -signal.SIGKILL
    assert not done.exists()  # the up runs on, in its own session

    fleet.write(ROLE + od + res_stopped.replace('desired = "stopped"', 'desired = "running"'))
    run2 = fleet.start(api=True).started()
    run2.wait_log("left by a controller that was killed")  # taken over while it runs
    gate.touch()
    wait_for("the orphaned up to finish", done.exists, timeout=WAIT_S)
    wait_for("od running", lambda: fleet.state("od") == "running")
    run2.cycled(3)  # three more cycles: res must not be started into od's room
    fleet.assert_never_overcommitted()
    assert fleet.starts("res", t0) == 0, run2.steps()
    assert fleet.starts("od", t0) == 1
    assert run2.stop() == 0, run2.text()


def test_a_serve_the_preflight_refuses_does_not_hold_back_the_others(fleet: Fleet) -> None:
    ports = {s: free_port() for s in ("ok", "ghost")}
    fleet.container("ok", port=ports["ok"], mib=2000, running=False)
    fleet.mib["ghost"] = 2000
    fleet.write(
        ROLE
        + serve_toml("ok", mib=2000, residency="resident", port=ports["ok"], desired="running")
        # desired running, but no container and no `up`: the preflight refuses it
        + serve_toml(
            "ghost", mib=2000, residency="resident", port=ports["ghost"], desired="running"
        )
    )
    run = fleet.start().started()
    run.wait_log("preflight: ghost: container")
    fleet.wait_state("ok", "running")
    run.wait_step("ok await_ready ok")
    assert any("ghost: preflight: " in m and "next try in" in m for m in run.messages())
    assert not any(m.startswith("ok: preflight") for m in run.messages())
    assert run.stop() == 0, run.text()


def test_a_slow_up_does_not_hold_the_loop(fleet: Fleet) -> None:
    ports = {s: free_port() for s in ("res", "slow")}
    fleet.container("res", port=ports["res"], mib=2000, running=True)
    fleet.mib["slow"] = 3000
    fleet.created.append(fleet.name("slow"))  # made by its `up`: removed at teardown
    script, began, done, gate = up_script(fleet, "slow", port=ports["slow"])
    fleet.write(
        ROLE
        + serve_toml("res", mib=2000, residency="resident", port=ports["res"], desired="running")
        + serve_toml(
            "slow", mib=3000, residency="resident", port=ports["slow"], desired="running"
        ).replace("start_timeout_s = 30", "start_timeout_s = 600")
        + f'up = "{script}"\n'
    )
    wait_for("res up", lambda: healthy(ports["res"]))
    run = fleet.start().started()
    wait_for("slow's up to begin", began.exists)
    t0 = time.time_ns()
    fleet.client.containers.get(fleet.name("res")).kill()
    # res comes back while slow's `up` still runs: the loop was not held by it
    wait_for("res restarted", lambda: fleet.starts("res", t0) >= 1)
    assert not done.exists(), "res came back only after the slow `up` ended"
    gate.touch()  # the slow `up` ends, and only now
    wait_for("slow's up to end", done.exists)
    assert run.stop() == 0, run.text()


def test_a_failed_up_says_dockers_reason(fleet: Fleet) -> None:
    port = free_port()
    fleet.mib["noimg"] = 2000
    fleet.created.append(fleet.name("noimg"))
    up = f"docker run -d --pull never --name {fleet.name('noimg')} vramctl-test-no-such-image:never"
    fleet.write(
        ROLE
        + serve_toml("noimg", mib=2000, residency="resident", port=port, desired="running")
        + f'up = "{up}"\n'
    )
    run = fleet.start().started()
    run.wait_step("noimg start failed")
    failed = next(
        str(r.get("message", ""))
        for r in run.records()
        if (r.get("extra") or {}).get("action") == "start"
        and (r.get("extra") or {}).get("outcome") == "failed"
    )
    assert "exited 125" in failed, failed
    assert "no such image" in failed.lower() or "unable to find image" in failed.lower(), failed
    assert run.stop() == 0, run.text()


def test_a_serve_started_by_hand_while_undeclared_counts_at_its_last_reservation(
    fleet: Fleet,
) -> None:
    # found by the chaos campaign (seed 928792186): a file caught mid-write drops `od`;
    # `od`'s container is started by hand meanwhile; a request must not take its room
    ports = {s: free_port() for s in ("big", "small", "od")}
    fleet.container("big", port=ports["big"], mib=6000, running=True)
    fleet.container("small", port=ports["small"], mib=2000, running=False)
    fleet.container("od", port=ports["od"], mib=4000, running=False)
    big = serve_toml("big", mib=6000, residency="resident", port=ports["big"], desired="running")
    small = serve_toml("small", mib=2000, residency="on-demand", port=ports["small"])
    od = serve_toml("od", mib=4000, residency="on-demand", port=ports["od"])
    fleet.write(ROLE + big + small + od)
    wait_for("big up", lambda: healthy(ports["big"]))
    t0 = time.time_ns()
    run = fleet.start(api=True).started()
    run.cycled(1)  # a whole cycle under the whole manifest
    fleet.write(ROLE + big + small, by_rename=True)  # od's table lost
    run.wait_log("manifest: reloaded (2 serves)")
    fleet.client.containers.get(fleet.name("od")).start()  # by hand, undeclared now
    run.cycled(1)  # a whole cycle saw od running, undeclared
    fleet.request("small")
    run.cycled(4)  # four more cycles with the request
    fleet.assert_never_overcommitted()
    assert fleet.starts("small", t0) == 0, run.steps()
    assert run.stop() == 0, run.text()
