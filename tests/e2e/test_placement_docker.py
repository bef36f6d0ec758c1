"""Placement on the real daemon, the loop in-process (docs/placement.md).

Two cards: ``a`` (budget 10000 MiB) holding the evictable ``e`` (3000), and ``b``
(12000) holding the resident ``x`` and the evictable ``f`` (2000 each). The placed ``p``
(4000, on ``a`` or ``b``) fits on both: best fit puts it on ``a`` (3000 left there
against 4000 on ``b``); its ``up`` (``docker run``) is told the card and the container
carries it. The ledger counts ``p`` on ``a`` only. A second controller on the same state
neither moves nor restarts it. Then the on-demand ``q`` (9000, on ``a`` or ``b``) is
requested: no card has room; on ``a`` it would stop ``e`` and ``p``, on ``b`` only
``f``: ``f`` is stopped and ``q`` starts on ``b``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import docker
import pynvml
import pytest
from support.fakes_nvml import FakeNvml, nvml_error
from support.waiting import wait_for
from test_loop_events import Running, names
from test_one_answer import vramctl

from controller.manifest import load_manifest_set
from controller.service.loop import Controller, RunOptions
from statemachine.ledger.reservations import ledger_from_observed
from statemachine.planning.plan_types import How, Policy
from statemachine.planning.planner import plan_transitions

__all__ = ["names"]  # the fixture, shared with test_loop_events

pytestmark = pytest.mark.docker


RESIDENT = 'residency = "resident"\ndesired = "running"'
EVICTABLE = 'residency = "evictable"\ndesired = "running"'
PLACED = 'placement = ["a", "b"]'


def _up(container: str, image: str) -> str:
    return (
        f"docker run -d --name {container} --network host --init --label vramctl.test=1 "
        f"-e VRAMCTL_GPU_ROLE={{gpu_role}} {image} sleep 3600"
    )


def _serve(name: str, container: str, image: str, mib: int, where: str, extra: str) -> str:
    return (
        f'\n[[serve]]\nname = "{name}"\ncontainer = "{container}"\nvram_mib = {mib}\n'
        f'{where}\nstop_timeout_s = 1\nup = "{_up(container, image)}"\n{extra}\n'
    )


def _controller(path: Path, state: Path) -> Controller:
    c = Controller(
        RunOptions(manifests=(path,), state_dir=state, resync_s=3600.0),
        load_manifest_set([path]),
    )
    c.nvml = FakeNvml(init_error=nvml_error(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND))
    return c


def _card_of(client: docker.DockerClient, container: str) -> str | None:
    """The card the container was made for (None: it names none, or is gone)."""
    try:
        env = client.containers.get(container).attrs["Config"]["Env"] or []
    except docker.errors.NotFound:
        return None
    return next((e.split("=", 1)[1] for e in env if e.startswith("VRAMCTL_GPU_ROLE=")), None)


def _running(client: docker.DockerClient, container: str) -> bool:
    try:
        return bool(client.containers.get(container).status == "running")
    except docker.errors.NotFound:
        return False


def test_a_placed_serve_goes_where_it_fits_stays_across_a_restart_and_q_evicts_across_cards(
    docker_client: docker.DockerClient,
    test_image: str,
    names: Callable[[str], str],
    tmp_path: Path,
) -> None:
    ctr = {n: names(n) for n in ("x", "f", "e", "p", "q")}
    text = (
        '[[gpu_roles]]\nid = "a"\nvram_mib = 10000\n\n[[gpu_roles]]\nid = "b"\nvram_mib = 12000\n'
        + _serve("x", ctr["x"], test_image, 2000, 'gpu_role = "b"', RESIDENT)
        + _serve("f", ctr["f"], test_image, 2000, 'gpu_role = "b"', EVICTABLE)
        + _serve("e", ctr["e"], test_image, 3000, 'gpu_role = "a"', EVICTABLE)
        + _serve("p", ctr["p"], test_image, 4000, PLACED, EVICTABLE)
        + _serve("q", ctr["q"], test_image, 9000, PLACED, 'residency = "on-demand"')
    )
    path, state = tmp_path / "serves.toml", tmp_path / "state"
    path.write_text(text)

    first = _controller(path, state)
    run = Running(first)
    try:
        wait_for("x, f, e, p running", lambda: all(_running(docker_client, ctr[n]) for n in "xfep"))
        assert _card_of(docker_client, ctr["p"]) == "a"  # best fit: 3000 left on a
        observed = first.view().observed()
        assert observed is not None
        ledger = ledger_from_observed(first.desired(), observed)
        assert ledger.holdings["p"].gpu_roles == ("a",)
        assert ledger.view("a").committed_mib == 7000  # e and p
        assert ledger.view("b").committed_mib == 4000  # x and f: p is not counted on b
    finally:
        run.stop()
    started = docker_client.containers.get(ctr["p"]).attrs["State"]["StartedAt"]

    second = _controller(path, state)
    run = Running(second)
    try:
        wait_for("a cycle of the second controller", lambda: len(run.seen()) >= 2)
        observed = second.view().observed()
        assert observed is not None
        plan = plan_transitions(second.desired(), observed, Policy(), time.time())
        assert [(d.serve, d.role, d.how) for d in plan.placements] == [
            ("p", "a", How.HELD),
            ("q", "b", How.IDLE),
        ]
        assert plan.empty
        assert docker_client.containers.get(ctr["p"]).attrs["State"]["StartedAt"] == started

        assert second.aio is not None  # the loop's own thread records the request
        second.aio.call_soon_threadsafe(second.request_up, "q", None)
        wait_for("q running", lambda: _running(docker_client, ctr["q"]))
        assert _card_of(docker_client, ctr["q"]) == "b"
        assert not _running(docker_client, ctr["f"])  # the one victim, on b
        assert all(_running(docker_client, ctr[n]) for n in "xep")
        assert docker_client.containers.get(ctr["p"]).attrs["State"]["StartedAt"] == started
    finally:
        run.stop()


def test_a_stopped_container_made_for_another_card_is_made_again_on_the_chosen_one(
    docker_client: docker.DockerClient,
    test_image: str,
    names: Callable[[str], str],
    tmp_path: Path,
) -> None:
    """p runs on a (both cards empty: the first on a tie), is stopped; then x takes a,
    and p, wanted again, goes to b: its container, made for a, is removed and made
    again by ``up`` on b (a running container is never removed)."""
    ctr = {n: names(n) for n in ("p", "x")}
    roles = (
        '[[gpu_roles]]\nid = "a"\nvram_mib = 10000\n\n[[gpu_roles]]\nid = "b"\nvram_mib = 10000\n'
    )
    path, state = tmp_path / "serves.toml", tmp_path / "state"

    def converge(p_desired: str, x_desired: str, until: Callable[[], bool]) -> None:
        path.write_text(
            roles
            + _serve("p", ctr["p"], test_image, 4000, PLACED, f'desired = "{p_desired}"')
            + _serve("x", ctr["x"], test_image, 8000, 'gpu_role = "a"', f'desired = "{x_desired}"')
        )
        run = Running(_controller(path, state))
        try:
            wait_for("the host to converge", until)
        finally:
            run.stop()

    converge("running", "stopped", lambda: _running(docker_client, ctr["p"]))
    assert _card_of(docker_client, ctr["p"]) == "a"
    made_for_a = docker_client.containers.get(ctr["p"]).id
    converge("stopped", "running", lambda: _running(docker_client, ctr["x"]))
    assert docker_client.containers.get(ctr["p"]).status == "exited"
    converge("running", "running", lambda: _running(docker_client, ctr["p"]))
    assert _card_of(docker_client, ctr["p"]) == "b"
    assert docker_client.containers.get(ctr["p"]).id != made_for_a  # made again by `up`
    assert _running(docker_client, ctr["x"])


def _converge(path: Path, state: Path, text: str, until: Callable[[], bool]) -> None:
    """Write ``text`` as the manifest and run a controller until ``until`` holds."""
    path.write_text(text)
    run = Running(_controller(path, state))
    try:
        wait_for("the host to converge", until)
    finally:
        run.stop()


RUNNING = 'desired = "running"'
TWO_CARDS = (
    '[[gpu_roles]]\nid = "a"\nvram_mib = 10000\n\n[[gpu_roles]]\nid = "b"\nvram_mib = 10000\n'
)


def test_a_re_pinned_serve_is_made_again_on_its_new_card_not_restarted_on_the_old(
    docker_client: docker.DockerClient,
    test_image: str,
    names: Callable[[str], str],
    tmp_path: Path,
) -> None:
    """x runs pinned to a and is stopped (killed, or stopped by hand); the manifest then
    pins it to b: its stopped container, made for a, is removed and made again by
    ``up`` on b, never ``docker start``-ed on a while the ledger counts it on b."""
    x = names("x")
    path, state = tmp_path / "serves.toml", tmp_path / "state"

    def pinned(role: str) -> str:
        return TWO_CARDS + _serve("x", x, test_image, 4000, f'gpu_role = "{role}"', RUNNING)

    _converge(path, state, pinned("a"), lambda: _running(docker_client, x))
    assert _card_of(docker_client, x) == "a"
    made_for_a = docker_client.containers.get(x).id
    docker_client.containers.get(x).stop(timeout=1)
    _converge(path, state, pinned("b"), lambda: _running(docker_client, x))
    assert _card_of(docker_client, x) == "b"
    assert docker_client.containers.get(x).id != made_for_a


def _committed(path: Path, state: Path) -> dict[str, int]:
    """What ``vramctl status --json`` (the journal of ``state`` laid over the host as
    docker shows it now) commits on each card."""
    code, status = vramctl("status", "--json", "-m", str(path), "--state-dir", str(state))
    assert code == 0, status
    return {r["gpu_role"]: r["committed_mib"] for r in status["gpu_roles"]}


def test_a_serve_re_pinned_while_it_runs_is_counted_where_it_runs_then_moved(
    docker_client: docker.DockerClient,
    test_image: str,
    names: Callable[[str], str],
    tmp_path: Path,
) -> None:
    """x runs pinned to a; an edit pins it to b. Until it moves it is counted on a alone
    (its container says it was made for a), not on both; the loop stops it on a and
    makes it again on b."""
    x = names("x")
    path, state = tmp_path / "serves.toml", tmp_path / "state"

    def pinned(role: str) -> str:
        return TWO_CARDS + _serve("x", x, test_image, 4000, f'gpu_role = "{role}"', RUNNING)

    _converge(path, state, pinned("a"), lambda: _running(docker_client, x))
    made_for_a = docker_client.containers.get(x).id
    path.write_text(pinned("b"))
    assert _committed(path, state) == {"a": 4000, "b": 0}
    _converge(path, state, pinned("b"), lambda: _card_of(docker_client, x) == "b")
    wait_for("x running on b", lambda: _running(docker_client, x))
    assert docker_client.containers.get(x).id != made_for_a
    assert _committed(path, state) == {"a": 0, "b": 4000}


def test_a_placed_serve_moves_off_the_card_a_pinned_resident_needs(
    docker_client: docker.DockerClient,
    test_image: str,
    names: Callable[[str], str],
    tmp_path: Path,
) -> None:
    """p (4000, a or b) runs on a, the only card with room while f holds b. Then f is
    stopped and the resident r (8000), pinned to a, is declared: r may stop nothing, and
    a holds p. p is moved to b, where it fits, and r starts on a: both run."""
    ctr = {n: names(n) for n in ("p", "f", "r")}
    path, state = tmp_path / "serves.toml", tmp_path / "state"
    roles = (
        '[[gpu_roles]]\nid = "a"\nvram_mib = 12000\n\n[[gpu_roles]]\nid = "b"\nvram_mib = 6000\n'
    )
    p = _serve("p", ctr["p"], test_image, 4000, PLACED, EVICTABLE)

    def f(desired: str) -> str:
        return _serve("f", ctr["f"], test_image, 3000, 'gpu_role = "b"', f'desired = "{desired}"')

    _converge(
        path,
        state,
        roles + f("running") + p,
        lambda: _running(docker_client, ctr["p"]) and _running(docker_client, ctr["f"]),
    )
    assert _card_of(docker_client, ctr["p"]) == "a"
    r = _serve("r", ctr["r"], test_image, 9000, 'gpu_role = "a"', RESIDENT)
    _converge(
        path,
        state,
        roles + f("stopped") + p + r,
        lambda: _running(docker_client, ctr["r"]) and _card_of(docker_client, ctr["p"]) == "b",
    )
    wait_for("p running on b", lambda: _running(docker_client, ctr["p"]))
    assert _committed(path, state) == {"a": 9000, "b": 4000}


def test_a_resident_in_backoff_keeps_its_room_from_an_evictable(
    docker_client: docker.DockerClient,
    test_image: str,
    names: Callable[[str], str],
    tmp_path: Path,
) -> None:
    """The resident x (6000 of a's 10000) is killed until the loop holds it back (its
    failure backoff); the evictable e (6000, on a, desired running) wants the room all
    along. e is never started: x's room is kept, and x starts again in it once its
    backoff ends (docs/eviction.md)."""
    ctr = {n: names(n) for n in ("x", "e")}
    path, state = tmp_path / "serves.toml", tmp_path / "state"
    path.write_text(
        TWO_CARDS
        + _serve("x", ctr["x"], test_image, 6000, 'gpu_role = "a"', RESIDENT)
        + _serve("e", ctr["e"], test_image, 6000, 'gpu_role = "a"', EVICTABLE)
    )
    run = Running(_controller(path, state))

    def held() -> bool:
        return any(
            b.serve == "x" and "held back" in b.reason
            for b in run.controller.situation().plan.blocked
        )

    try:
        wait_for("x running", lambda: _running(docker_client, ctr["x"]))
        for _ in range(4):  # each death counts; the backoff holds it from the second
            docker_client.containers.get(ctr["x"]).kill()
            try:
                wait_for("x back, or held", lambda: held() or _running(docker_client, ctr["x"]))
            except AssertionError:
                raise AssertionError(str(run.controller.situation().plan.to_json())) from None
            if held():
                break
        assert held(), "x was never held back"
        reasons = [b.reason for b in run.controller.situation().plan.blocked if b.serve == "x"]
        assert "its room (6000 MiB on a) is kept for it" in reasons[0]
        wait_for("x running after its backoff", lambda: _running(docker_client, ctr["x"]), 600)
        with pytest.raises(docker.errors.NotFound):  # e's `up` never ran
            docker_client.containers.get(ctr["e"])
    finally:
        run.stop()


def test_a_re_pinned_serve_without_up_is_not_started_on_its_old_card(
    docker_client: docker.DockerClient,
    test_image: str,
    names: Callable[[str], str],
    tmp_path: Path,
) -> None:
    """x has no ``up``: its container, made once for a, is all there is. Pinned to b, it
    is not started (that would run it on a while the ledger counts it on b): the start
    fails with the reason, and the container stays down."""
    x = names("x")
    docker_client.containers.create(
        test_image,
        ["sleep", "3600"],
        name=x,
        environment={"VRAMCTL_GPU_ROLE": "a"},
        labels={"vramctl.test": "1"},
        network_mode="host",
    )
    path, state = tmp_path / "serves.toml", tmp_path / "state"
    path.write_text(
        TWO_CARDS + f'\n[[serve]]\nname = "x"\ncontainer = "{x}"\nvram_mib = 4000\n'
        f'gpu_role = "b"\nstop_timeout_s = 1\n{RUNNING}\n'
    )
    run = Running(_controller(path, state))

    def refused() -> str | None:
        blocked = run.controller.situation().plan.blocked
        return next((b.reason for b in blocked if b.serve == "x" and "no `up`" in b.reason), None)

    try:
        why = wait_for("x's start refused", refused)
        assert f"{x} was made for a, and x is to run on b with no `up` to make it there" in why
        assert not _running(docker_client, x)
    finally:
        run.stop()
