"""The journal (SQLite) and the state directory's single-instance lock."""

from __future__ import annotations

import os
import signal
import sqlite3
import stat
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from controller.store.journal import (
    JOURNAL_NAME,
    SCHEMA_VERSION,
    AlreadyRunning,
    Journal,
    JournalError,
    StateLock,
    default_state_dir,
    journal_path,
)
from statemachine.domain.types import OnDemandRequest

ROOT = Path(__file__).resolve().parents[2]

STEPS: list[dict[str, Any]] = [
    {"action": "reserve", "serve": "emb", "gpu_roles": ["a"], "mib": 4000, "reason": "r"},
    {"action": "start", "serve": "emb", "gpu_roles": ["a"], "mib": 4000, "reason": "s"},
]
PLAN: dict[str, Any] = {
    "steps": STEPS,
    "blocked": [],
    "ledger_after": {},
}
OBSERVED: dict[str, Any] = {"docker": "ok", "containers": {}, "gpus": None}
STEP_OUTCOMES: list[dict[str, Any]] = [
    {**STEPS[0], "outcome": "ok", "detail": "reserved", "duration_s": 0.001},
    {**STEPS[1], "outcome": "failed", "detail": "no such image", "duration_s": 1.5},
]
REPORT: dict[str, Any] = {
    "ok": False,
    "preflight": [],
    "stopped_early": False,
    "steps": STEP_OUTCOMES,
    "lifecycles": {"emb": "failed"},
    "ledger": {},
}


def record(j: Journal, at: float, digest: str = "d1", **kw: Any) -> int:
    args: dict[str, Any] = {
        "at": at,
        "manifest_digest": digest,
        "manifest_files": {"/m/serves.toml": f"# manifest {digest}\n"},
        "observed": OBSERVED,
        "plan": PLAN,
        "requests": [],
        "dry_run": False,
    }
    args.update(kw)
    return j.record_cycle(**args)


@pytest.fixture
def jpath(tmp_path: Path) -> Path:
    return tmp_path / "state" / JOURNAL_NAME


def test_cycle_and_outcome_round_trip(jpath: Path) -> None:
    reqs = [{"serve": "asr", "requested_at": 5.0, "ttl_s": 60.0}]
    with Journal.open(jpath) as j:
        c1 = record(j, 100.0, requests=reqs, dry_run=True)
        c2 = record(j, 200.0)
        assert c2 > c1
        j.record_outcome(c2, REPORT)
    with Journal.open(jpath) as j:
        first, second = j.cycles()
        assert (first.id, first.at, first.dry_run, first.outcome) == (c1, 100.0, True, None)
        assert first.requests == reqs and first.observed == OBSERVED and first.plan == PLAN
        assert second.outcome == REPORT and second.dry_run is False
        assert second.manifest_digest == "d1"
        steps = j.steps(c2)
        assert [(s.idx, s.action, s.serve, s.outcome) for s in steps] == [
            (0, "reserve", "emb", "ok"),
            (1, "start", "emb", "failed"),
        ]
        assert steps[1].detail == "no such image" and steps[1].duration_s == 1.5
        assert [c.id for c in j.cycles(since_id=c1)] == [c2]
        assert [c.id for c in j.cycles(cycle=c1)] == [c1]
        assert j.cycles(cycle=999) == []
        # recording an outcome again replaces it, steps included
        j.record_outcome(c2, {**REPORT, "steps": STEP_OUTCOMES[:1]})
        assert len(j.steps(c2)) == 1
        with pytest.raises(JournalError, match="no cycle 999"):
            j.record_outcome(999, REPORT)


def test_schema_version_and_wal(jpath: Path) -> None:
    with Journal.open(jpath) as j:
        assert j.schema_version() == SCHEMA_VERSION
    conn = sqlite3.connect(jpath)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(JournalError, match="newer"):
        Journal.open(jpath)


def test_not_a_journal(tmp_path: Path) -> None:
    text = tmp_path / "notes.txt"
    text.write_text("hello, not a database at all " * 10)
    with pytest.raises(JournalError, match=r"notes\.txt"):
        Journal.open(text)
    other = tmp_path / "other.db"
    conn = sqlite3.connect(other)
    conn.execute("CREATE TABLE t (x)")
    conn.close()
    with pytest.raises(JournalError, match="other tables"):
        Journal.open(other)
    with pytest.raises(JournalError, match="not a vramctl journal"):
        Journal.open(other, readonly=True)


def test_readonly_refuses_writes(jpath: Path) -> None:
    with Journal.open(jpath) as j:
        record(j, 1.0)
    with Journal.open(jpath, readonly=True) as j:
        assert len(j.cycles()) == 1
        with pytest.raises(JournalError, match="read-only"):
            record(j, 2.0)


def test_manifest_content_stored_once_per_digest(jpath: Path) -> None:
    with Journal.open(jpath) as j:
        for at in range(5):
            record(j, float(at), digest="same")
        record(j, 9.0, digest="other")
        assert j.manifest_files("same") == {"/m/serves.toml": "# manifest same\n"}
        assert j.manifest_files("missing") is None
    conn = sqlite3.connect(jpath)
    assert conn.execute("SELECT count(*) FROM manifests").fetchone()[0] == 2
    conn.close()


def test_requests_survive_reopen_and_replace(jpath: Path) -> None:
    with Journal.open(jpath) as j:
        j.add_request("asr", 10.0, 600.0)
        j.add_request("llm", 11.0, None)
        j.add_request("asr", 20.0, 30.0)  # replaces the active one
        j.add_request("ocr", 12.0, None)
        j.end_request("ocr", 13.0)
        j.end_request("nothing-active", 13.0)  # a no-op
    with Journal.open(jpath) as j:
        active = j.active_requests()
        assert active == [OnDemandRequest("llm", 11.0, None), OnDemandRequest("asr", 20.0, 30.0)]
        assert active[1].to_json() == {"serve": "asr", "requested_at": 20.0, "ttl_s": 30.0}


def test_elastic_survives_reopen(jpath: Path) -> None:
    with Journal.open(jpath) as j:
        j.set_elastic("moe", 12000, 1.0)
        j.set_elastic("moe", 8000, 2.0)
        j.set_elastic("other", 4000, 2.0)
        j.set_elastic("other", None, 3.0)  # back to full: forgotten
    with Journal.open(jpath) as j:
        assert j.elastic() == {"moe": 8000}


def test_prune_keeps_newest_and_drops_steps(jpath: Path) -> None:
    with Journal.open(jpath, prune_every=1000) as j:
        ids = []
        for at in range(10):
            cid = record(j, 1000.0 + at, digest=f"d{at // 5}")  # d0 for 0-4, d1 for 5-9
            j.record_outcome(cid, REPORT)
            ids.append(cid)
        j.add_request("old", 1.0, None)
        j.end_request("old", 2.0)
        j.add_request("keep", 1.0, None)  # active: never pruned
        dropped = j.prune(keep_cycles=3, now=1010.0)
        assert dropped == 7
        assert [c.id for c in j.cycles()] == ids[-3:]
        assert j.steps(ids[0]) == [] and len(j.steps(ids[-1])) == 2
        assert j.manifest_files("d0") is None  # no cycle refers to it any more
        assert j.manifest_files("d1") is not None
        # age: everything older than keep_days goes, however few cycles there are
        assert j.prune(keep_cycles=100, keep_days=1.0, now=1008.5 + 86400.0) == 2
        assert [c.id for c in j.cycles()] == ids[-1:]
        assert j.prune(keep_days=1.0, now=2.0 + 86400.0 * 2) == 1
        assert [r.serve for r in j.active_requests()] == ["keep"]
    conn = sqlite3.connect(jpath)
    assert conn.execute("SELECT count(*) FROM steps").fetchone()[0] == 0
    assert conn.execute("SELECT count(*) FROM requests").fetchone()[0] == 1
    conn.close()


def test_record_cycle_prunes_every_n(jpath: Path) -> None:
    with Journal.open(jpath, keep_cycles=4, prune_every=5) as j:
        for at in range(12):
            record(j, float(at))
        # pruned after the 5th and the 10th record; 2 more since
        assert len(j.cycles()) == 4 + 2


def test_concurrent_threads(jpath: Path) -> None:
    with Journal.open(jpath) as j:
        errors: list[BaseException] = []

        def work(n: int) -> None:
            try:
                for i in range(20):
                    cid = record(j, float(n * 100 + i))
                    j.record_outcome(cid, REPORT)
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        assert len(j.cycles()) == 80


def test_default_state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    manifest = tmp_path / "conf" / "serves.toml"
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert default_state_dir([manifest]) == tmp_path / "xdg" / "vramctl"
    monkeypatch.setenv("XDG_STATE_HOME", "relative/ignored")
    assert default_state_dir([manifest]) == (tmp_path / "conf" / ".vramctl-state")
    monkeypatch.delenv("XDG_STATE_HOME")
    assert default_state_dir([manifest, tmp_path / "b.toml"]) == manifest.parent / ".vramctl-state"
    assert journal_path(tmp_path) == tmp_path / JOURNAL_NAME
    with pytest.raises(ValueError):
        default_state_dir([])


# ── the lock ─────────────────────────────────────────────────────────────────

_HOLDER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from controller.store.journal import StateLock
    lock = StateLock(Path(sys.argv[1]))
    lock.acquire()
    print("locked", flush=True)
    time.sleep(60)
    """
)

_TAKER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from controller.store.journal import AlreadyRunning, StateLock
    try:
        StateLock(Path(sys.argv[1])).acquire()
    except AlreadyRunning as exc:
        print(exc.pid, flush=True)
        sys.exit(3)
    print("acquired", flush=True)
    """
)


def _python(code: str, state: Path, **kw: Any) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-c", code, str(state)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        **kw,
    )


def test_lock_excludes_another_process(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with StateLock(state) as lock:
        assert lock.held
        assert (state / "vramctl.lock").read_text().strip() == str(os.getpid())
        taker = _python(_TAKER, state)
        out, _ = taker.communicate(timeout=30)
        assert taker.returncode == 3 and out.strip() == str(os.getpid())
    assert not lock.held
    taker = _python(_TAKER, state)
    out, _ = taker.communicate(timeout=30)
    assert taker.returncode == 0 and out.strip() == "acquired"


def test_lock_held_by_other_names_pid_and_is_freed_when_it_dies(tmp_path: Path) -> None:
    state = tmp_path / "state"
    holder = _python(_HOLDER, state)
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "locked"
        lock = StateLock(state)
        with pytest.raises(AlreadyRunning) as info:
            lock.acquire()
        assert info.value.pid == holder.pid
        assert f"pid {holder.pid}" in str(info.value) and "vramctl.lock" in str(info.value)
        assert not lock.held
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    with StateLock(state) as lock:  # the kernel dropped the dead holder's lock
        assert lock.held
        assert (state / "vramctl.lock").read_text().strip() == str(os.getpid())


def test_lock_in_process_second_instance_refused(tmp_path: Path) -> None:
    first = StateLock(tmp_path)
    first.acquire()
    first.acquire()  # idempotent for the holder
    with pytest.raises(AlreadyRunning):
        StateLock(tmp_path).acquire()
    first.release()
    first.release()
    with StateLock(tmp_path):
        pass


# ── file modes: the journal holds `up` output and container log lines ────────


@pytest.fixture(params=[0o022, 0o000], ids=["umask-022", "umask-000"])
def umask(request: pytest.FixtureRequest) -> Iterator[int]:
    old = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_journal_lock_and_side_files_are_private_in_a_wide_state_dir(
    tmp_path: Path, umask: int
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    state.chmod(0o777)  # an existing folder with wider rights
    with StateLock(state), Journal.open(state / JOURNAL_NAME) as j:
        record(j, 1.0)
        j.add_request("emb", 1.0, None)
        files = sorted(p.name for p in state.iterdir())
        assert {JOURNAL_NAME, f"{JOURNAL_NAME}-wal", f"{JOURNAL_NAME}-shm", "vramctl.lock"} <= set(
            files
        ), files
        for p in state.iterdir():
            assert mode(p) == 0o600, (p.name, oct(mode(p)))
    assert mode(state) == 0o777  # an existing folder is the operator's: warned about, kept


def test_the_state_dir_is_created_0700(tmp_path: Path, umask: int) -> None:
    state = tmp_path / "a" / "state"
    StateLock(state).acquire()
    assert mode(state) == 0o700
    other = tmp_path / "b" / "state"
    Journal.open(other / JOURNAL_NAME).close()
    assert mode(other) == 0o700


def test_an_older_journal_with_wide_modes_is_tightened_on_open(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    path = state / JOURNAL_NAME
    with Journal.open(path) as j:
        record(j, 1.0)
    for p in state.iterdir():
        p.chmod(0o644)  # as an earlier vramctl left them
    with Journal.open(path) as j:
        record(j, 2.0)
        for p in state.iterdir():
            assert mode(p) == 0o600, (p.name, oct(mode(p)))
    lock = state / "vramctl.lock"
    lock.write_text("")
    lock.chmod(0o644)
    with StateLock(state):
        assert mode(lock) == 0o600


def test_a_world_readable_state_dir_is_warned_about(tmp_path: Path) -> None:
    from loguru import logger

    said: list[str] = []
    sink = logger.add(lambda m: said.append(str(m)), level="WARNING", format="{message}")
    try:
        quiet = tmp_path / "quiet"
        with StateLock(quiet):
            pass
        assert said == []
        wide = tmp_path / "wide"
        wide.mkdir()
        wide.chmod(0o755)
        with StateLock(wide):
            pass
    finally:
        logger.remove(sink)
    [line] = said
    assert str(wide) in line and "0755" in line and "chmod 700" in line
