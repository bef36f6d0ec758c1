"""The control loop's parts, each on its own contract (no daemon, no running loop).

The Docker event source is driven with a stand-in client and streams (what it does
with them is under test: which events ask for a cycle, when a stream is opened again
and with which filter; the real daemon's stream is in tests/e2e/test_loop_events.py); the
start outcomes and the tier tracking write a real journal; the manifest re-read reads
real files.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from support.manifests import ONE_RESIDENT

from controller.adapters.docker.read import EVERY_CONTAINER, EventStreamRefusedError
from controller.service import manifest_reread, tiers
from controller.service.docker_events import DockerEvents
from controller.service.executor import Outcome, StepResult
from controller.service.manifest_reread import read_manifests
from controller.service.overlays import JournalOverlays, Learned
from controller.service.records import RecordStore
from controller.service.start_outcomes import StartOutcomes
from controller.snapshot import ContainerModel, SnapshotModel, StartedWithModel
from controller.store.journal import Journal, journal_path
from statemachine.domain.types import ContainerState, DesiredState, StartedWith
from statemachine.planning.plan_types import (
    Action,
    Step,
)


# ----- the Docker event source ---------------------------------------------------------
class _Stream:
    """A stand-in event stream: yields what is put in it until it is closed."""

    def __init__(self, filters: dict[str, Any]) -> None:
        self.filters = filters
        self.items: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.closed = threading.Event()

    def __iter__(self) -> Iterator[dict[str, Any]]:
        while (item := self.items.get()) is not None:
            yield item

    def close(self) -> None:
        self.closed.set()
        self.items.put(None)


class _Stop(threading.Event):
    """The loop's stop event, recording each pause the events thread takes."""

    def __init__(self) -> None:
        super().__init__()
        self.pauses: list[float | None] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.pauses.append(timeout)
        return super().wait(0)


class _Docker:
    """Opens stand-in streams; refuses a filtered one when told to."""

    def __init__(self, refuse_filtered: bool = False) -> None:
        self.opened: queue.Queue[_Stream] = queue.Queue()
        self.refuse_filtered = refuse_filtered

    def client(self) -> Any:
        return SimpleNamespace(api=SimpleNamespace(base_url="http+docker://localhost"), close=_no)

    def open(self, client: Any, filters: dict[str, Any]) -> _Stream:
        if self.refuse_filtered and "container" in filters:
            raise EventStreamRefusedError(414)
        stream = _Stream(filters)
        self.opened.put(stream)
        return stream


def _no() -> None:
    return None


def _event(status: str, name: str, cid: str = "0" * 64) -> dict[str, Any]:
    return {"status": status, "Actor": {"ID": cid, "Attributes": {"name": name}}}


def _source(docker: _Docker, stop: threading.Event, touched: list[str]) -> DockerEvents:
    return DockerEvents(docker.client, docker.open, touched.append, stop)


def test_an_event_of_a_followed_container_asks_for_a_cycle_and_no_other_does() -> None:
    """Docker matches a filter by prefix: ``web-old``'s events come with ``web``'s and
    are dropped here; a renamed container is followed by its id; an exec is no change."""
    docker, stop, touched, woken = _Docker(), _Stop(), [], queue.Queue[str]()
    events = _source(docker, stop, touched)
    events.follow_observed(("web",), ("abcdef123456",))
    thread = threading.Thread(target=events.run, args=(woken.put,), daemon=True)
    thread.start()
    try:
        stream = docker.opened.get(timeout=10)
        assert stream.filters == {"type": "container", "container": ["abcdef123456", "web"]}
        assert woken.get(timeout=10) == "docker events followed"
        for event in (
            _event("start", "web-old", "f" * 64),
            _event("exec_start: sh", "web"),
            _event("die", "renamed", "abcdef123456" + "0" * 52),
            _event("health_status: healthy", "web"),
        ):
            stream.items.put(event)
        assert woken.get(timeout=10) == "docker die renamed"
        assert woken.get(timeout=10) == "docker health_status: healthy web"
        # opened: every container again (what died while none was open), then the events'
        assert touched == [EVERY_CONTAINER, "abcdef123456" + "0" * 52, "0" * 64]
    finally:
        stop.set()
        events.close()
        thread.join(10)
    assert woken.empty()


def test_a_new_filter_closes_the_stream_and_it_is_opened_again_with_it_at_once() -> None:
    """Opened again, it asks for a cycle that inspects every container again: a death
    while no stream was open has no event, and the list may not show it yet."""
    docker, stop, woken, touched = _Docker(), _Stop(), queue.Queue[str](), list[str]()
    events = _source(docker, stop, touched)
    events.follow(("a",))
    thread = threading.Thread(target=events.run, args=(woken.put,), daemon=True)
    thread.start()
    try:
        first = docker.opened.get(timeout=10)
        events.follow(("a",))  # the same names: the stream stays open
        assert not first.closed.is_set()
        events.follow(("a", "b"))
        assert first.closed.wait(10)
        second = docker.opened.get(timeout=10)
        assert second.filters["container"] == ["a", "b"]
        assert stop.pauses == []  # closed for a new filter: no pause before it is opened
        assert [woken.get(timeout=10) for _ in range(2)] == ["docker events followed"] * 2
        assert touched == [EVERY_CONTAINER] * 2  # each before the cycle it asks for
    finally:
        stop.set()
        events.close()
        thread.join(10)


def test_a_stream_that_ends_by_itself_is_opened_again_after_a_pause() -> None:
    docker, stop, woken = _Docker(), _Stop(), queue.Queue[str]()
    events = _source(docker, stop, [])
    thread = threading.Thread(target=events.run, args=(woken.put,), daemon=True)
    thread.start()
    try:
        docker.opened.get(timeout=10).close()  # the daemon ended it
        docker.opened.get(timeout=10)
        assert stop.pauses[:1] == [2.0]
    finally:
        stop.set()
        events.close()
        thread.join(10)


def test_a_filtered_stream_a_proxy_refuses_is_followed_unfiltered() -> None:
    docker, stop, woken = _Docker(refuse_filtered=True), _Stop(), queue.Queue[str]()
    events = _source(docker, stop, [])
    events.follow(("a",))
    thread = threading.Thread(target=events.run, args=(woken.put,), daemon=True)
    thread.start()
    try:
        stream = docker.opened.get(timeout=10)
        assert stream.filters == {"type": "container"}
        assert stop.pauses == []  # not retried with the same filter, nor paused
        assert woken.get(timeout=10) == "docker events followed"
    finally:
        stop.set()
        events.close()
        thread.join(10)


# ----- the starts' outcomes -----------------------------------------------------------
def _start_result(serve: str, outcome: Outcome) -> StepResult:
    step = Step(Action.START, serve, ("a",), 2000, "a start", group=serve)
    return StepResult(step, outcome, "", 0.1, ended_at=1000.0)


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[Journal]:
    j = Journal.open(journal_path(tmp_path / "state"))
    yield j
    j.close()


def _cycle(journal: Journal) -> int:
    return journal.record_cycle(
        at=1000.0,
        manifest_digest="d",
        manifest_files={},
        observed={},
        plan={"steps": []},
        requests=[],
        dry_run=False,
        policy={},
    )


def test_a_start_that_ends_while_its_plan_executes_joins_the_outcome(journal: Journal) -> None:
    outcomes, learned, released = StartOutcomes(), [], []
    cid = _cycle(journal)
    outcomes.executing(cid)
    result = _start_result("llm", Outcome.FAILED)
    outcomes.ended(
        cid, [result], lambda: journal, learn=learned.append, release=lambda: released.append(1)
    )
    assert learned == [[result]] and released == [1]
    outcome: dict[str, Any] = {"ok": True, "steps": [], "pending": ["llm", "emb"]}
    outcomes.complete(cid, outcome)
    assert outcome["pending"] == ["emb"] and outcome["ok"] is False
    assert [s["serve"] for s in outcome["steps"]] == ["llm"]
    assert outcomes.early == {}


def test_a_start_that_ends_after_its_plan_is_added_to_the_journalled_outcome(
    journal: Journal,
) -> None:
    outcomes = StartOutcomes()
    cid = _cycle(journal)
    outcomes.complete(cid, {"ok": True, "steps": [], "pending": ["llm"]})
    outcomes.ended(
        cid, [_start_result("llm", Outcome.OK)], lambda: journal, learn=_ignore, release=_no
    )
    (rec,) = journal.cycles(cycle=cid)
    assert rec.outcome is not None and rec.outcome["pending"] == []


def test_a_start_is_released_even_when_learning_it_fails(journal: Journal) -> None:
    released: list[int] = []

    def learn(results: list[StepResult]) -> None:
        raise RuntimeError("a bug")

    with pytest.raises(RuntimeError):
        StartOutcomes().ended(
            1, [], lambda: journal, learn=learn, release=lambda: released.append(1)
        )
    assert released == [1]


def test_only_the_recent_cycles_outcomes_are_kept() -> None:
    outcomes = StartOutcomes()
    for cid in range(1, 41):
        outcomes.complete(cid, {"steps": []})
    assert sorted(outcomes.outcomes) == list(range(9, 41))


def _ignore(results: list[StepResult]) -> None:
    return None


# ----- the tiers left quiesced --------------------------------------------------------
def _step(action: str, serve: str, outcome: str) -> dict[str, Any]:
    return {"action": action, "serve": serve, "outcome": outcome}


def test_tiers_are_tracked_and_journalled(journal: Journal) -> None:
    quiesced: set[str] = set()
    tiers.track_tiers(
        quiesced,
        lambda: journal,
        [_step("quiesce", "a", "ok"), _step("quiesce", "b", "ok"), _step("stop", "b", "ok")],
    )
    assert quiesced == {"a"} and set(journal.quiesced()) == {"a"}
    tiers.track_tiers(quiesced, lambda: journal, [_step("readmit", "a", "ok")])
    assert quiesced == set() and not journal.quiesced()


def test_tiers_are_kept_when_the_journal_cannot_be_written() -> None:
    def no_journal() -> Journal:
        raise RuntimeError("the journal is locked")

    quiesced: set[str] = set()
    tiers.track_tiers(quiesced, no_journal, [_step("readmit", "a", "failed")])
    assert quiesced == {"a"}


def test_a_cycle_that_ended_mid_plan_leaves_its_tiers_to_readmit(journal: Journal) -> None:
    journal.record_cycle(
        at=1000.0,
        manifest_digest="d",
        manifest_files={},
        observed={},
        plan={"steps": [_step("quiesce", "a", "") | {"group": "a"}]},
        requests=[],
        dry_run=False,
        policy={},
    )
    quiesced: set[str] = set()
    tiers.recover_tiers(quiesced, lambda: journal, dry_run=True)
    assert quiesced == set()  # a dry run executed nothing
    tiers.recover_tiers(quiesced, lambda: journal, dry_run=False)
    assert quiesced == {"a"} and set(journal.quiesced()) == {"a"}


# ----- the manifest re-read -----------------------------------------------------------
GOOD = ONE_RESIDENT


def test_an_invalid_edit_gives_its_located_errors_and_no_set(tmp_path: Path) -> None:
    path = tmp_path / "serves.toml"
    path.write_text(GOOD.replace("vram_mib = 2000", "vram_mib = -1"))
    read = read_manifests([path])
    assert read.mset is None and read.errors and read.issues
    assert all("serves.toml" in e for e in read.errors)
    path.write_text(GOOD)
    good = read_manifests([path])
    assert good.mset is not None and good.errors == [] and not good.issues


def test_a_loader_that_fails_gives_an_error_and_nothing_located(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(paths: list[Path]) -> Any:
        raise KeyError("a bug")

    monkeypatch.setattr(manifest_reread, "load_manifest_set", broken)
    read = read_manifests([tmp_path / "serves.toml"])
    assert read.mset is None and read.issues is None
    assert read.errors == ["cannot be loaded: KeyError: 'a bug'"]


# ----- the journal's overlays ---------------------------------------------------------
def _started_in_force(
    journal: Journal,
    snap: SnapshotModel,
    records: dict[str, StartedWith],
    known: dict[str, StartedWith] | None = None,
) -> dict[str, StartedWithModel]:
    """The start records an observation holds, and what it found, journalled after it."""
    held, found = JournalOverlays().started_in_force(DesiredState({}, {}), snap, records, known)
    Learned(started=found, at=1001.0).write(journal, RecordStore(journal))
    return held


def test_with_docker_unreadable_no_start_reservation_is_dropped(journal: Journal) -> None:
    journal.set_started("c-gone", "gone", ("a",), 2000, 1000.0)
    records = journal.started()
    snap = SnapshotModel(docker="error", containers={})
    held = _started_in_force(journal, snap, records)
    assert set(held) == {"c-gone"} and set(journal.started()) == {"c-gone"}
    snap = SnapshotModel(
        docker="ok", containers={"c-other": ContainerModel(state=ContainerState.RUNNING)}
    )
    known = {"c-other": StartedWith("other", ("a",), 1000)}
    held = _started_in_force(journal, snap, records, known)
    assert set(held) == {"c-other"} and set(journal.started()) == {"c-other"}
