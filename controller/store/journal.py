"""The journal: what the controller saw, planned and did, in one SQLite file.

The journal lives in the state directory (:func:`default_state_dir`, or ``--state-dir``)
as ``journal.sqlite3``, beside the single-instance lock ``vramctl.lock``
(:class:`StateLock`). It stores:

- **cycles**: for each reconcile cycle that planned something, the time the plan was
  made for (``at``, the ``now`` handed to the planner), the manifest digest, the
  observed snapshot (docs/design.md §5 JSON), the plan (``Plan.to_json()``), the on-demand
  requests the planner saw, and whether it was a dry run;
- **outcomes**: the executor's report (``ExecutionReport.to_json()``) per cycle, and
  each step's outcome in its own ``steps`` table (cycle, index, action, serve,
  outcome, detail, duration) so that failures can be queried;
- **manifests**: the content of every manifest file of a digest, stored once per
  digest however many cycles used it;
- **requests**: on-demand requests (serve, requested_at, TTL) until they are ended,
  and **elastic** reserves the controller asked for (serve -> MiB), so that a restart
  of the controller loses neither;
- **started**: the reservation each running container was started with (container ->
  serve, gpu roles, MiB), kept until it stops, so that no manifest edit, and no
  restart of the controller, gives its memory away;
- **footprints**: the measured footprint samples of each serve (one per start or stop
  and GPU role, ``statemachine.sizing.footprint.Sample`` JSON), the newest
  ``DEFAULT_KEEP_FOOTPRINTS`` per serve, so calibration survives restarts.
- **reloads**: how long each cold start and each wake the controller carried out took
  until the serve was healthy (serve, kind ``cold`` or ``wake``, seconds, when), the
  newest ``DEFAULT_KEEP_RELOADS`` per serve and kind: what bringing a serve back costs
  (``statemachine/planning/restore_cost.py``) survives restarts.
- **quiesced**: the serves whose router tier the controller quiesced and has not seen
  readmitted (nor stopped), so that a restart of the controller still readmits them.
- **serve_records**: each serve's lifecycle state as the controller last moved it
  (``controller/service/records.py``), so that a restart moves it on from there
  instead of deriving it again from the containers.

Retention is bounded (:meth:`Journal.prune`): at most ``keep_cycles`` cycles and
nothing older than ``keep_days`` (whichever removes more), with their steps, their
manifest contents once no cycle refers to them, and ended requests older than
``keep_days``. :meth:`Journal.record_cycle` prunes every ``prune_every`` records.

Durability: WAL mode with ``synchronous = NORMAL`` (a crash of the process loses
nothing committed; a power cut may lose the last transaction), ``busy_timeout`` so a
concurrent reader (``vramctl replay`` on the live file) never fails a write, and
``PRAGMA user_version`` as the schema version (a journal from a newer vramctl is
refused, not misread).

File modes: the journal stores ``up`` output and container log lines, so it, its
SQLite side files and the lock are created (or tightened to) 0600, and a state
directory created here is 0700; an existing one that every user can read is warned
about (:func:`warn_if_open`), never changed.

Thread-safety: one connection opened with ``check_same_thread=False``, every method
runs under one lock, so the loop's thread and an executor worker thread may both call
it. Each write is one transaction.

This module must not decide anything: it never interprets a plan, expires a request
(a TTL that ran out is the planner's business; a request stays active until
:meth:`Journal.end_request`) or chooses what to record. It only stores and returns
what it is given. It must not touch docker, NVML or the network.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import stat
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

from controller.store.lock import (
    LOCK_NAME,
    PRIVATE_DIR_MODE,
    PRIVATE_FILE_MODE,
    AlreadyRunning,
    StateDirError,
    StateLock,
)
from statemachine.domain.types import OnDemandRequest, StartedWith
from statemachine.planning.restore_cost import COLD, WAKE

__all__ = [
    "JOURNAL_NAME",
    "LOCK_NAME",
    "SCHEMA_VERSION",
    "AlreadyRunning",
    "CycleRecord",
    "Journal",
    "JournalError",
    "SleepRecord",
    "StateDirError",
    "StateLock",
    "StepRecord",
    "default_state_dir",
    "journal_path",
    "journal_to_read",
]

#: The journal's file name inside the state directory.
JOURNAL_NAME = "journal.sqlite3"
#: The folder created beside the first manifest when ``$XDG_STATE_HOME`` is unset.
LOCAL_STATE_DIR = ".vramctl-state"
#: ``PRAGMA user_version`` of the schema below.
SCHEMA_VERSION = 1

#: Retention defaults (see :meth:`Journal.prune`).
DEFAULT_KEEP_CYCLES = 2000
DEFAULT_KEEP_DAYS = 14.0
DEFAULT_PRUNE_EVERY = 100
#: Footprint samples kept per serve (the oldest go first).
DEFAULT_KEEP_FOOTPRINTS = 64
#: Reload measurements kept per serve and kind (the oldest go first).
DEFAULT_KEEP_RELOADS = 20
BUSY_TIMEOUT_MS = 5000
#: What the ``reloads`` table measures: a cold start, a wake.
RELOAD_KINDS = (COLD, WAKE)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS manifests (
    digest     TEXT PRIMARY KEY,
    files      TEXT NOT NULL,          -- JSON: {path: content}
    first_seen REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS cycles (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    at              REAL NOT NULL,
    manifest_digest TEXT NOT NULL REFERENCES manifests (digest),
    observed        TEXT NOT NULL,     -- JSON: the observed snapshot
    plan            TEXT NOT NULL,     -- JSON: Plan.to_json()
    requests        TEXT NOT NULL,     -- JSON: [{serve, requested_at, ttl_s}]
    dry_run         INTEGER NOT NULL,
    outcome         TEXT,              -- JSON: ExecutionReport.to_json(), NULL until known
    policy          TEXT               -- JSON: Policy.to_json(), NULL if not recorded
);
CREATE INDEX IF NOT EXISTS cycles_at ON cycles (at);
CREATE INDEX IF NOT EXISTS cycles_digest ON cycles (manifest_digest);
CREATE TABLE IF NOT EXISTS steps (
    cycle_id   INTEGER NOT NULL REFERENCES cycles (id),
    idx        INTEGER NOT NULL,
    action     TEXT NOT NULL,
    serve      TEXT NOT NULL,
    outcome    TEXT NOT NULL,
    detail     TEXT,
    duration_s REAL,
    PRIMARY KEY (cycle_id, idx)
);
CREATE TABLE IF NOT EXISTS requests (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    serve        TEXT NOT NULL,
    requested_at REAL NOT NULL,
    ttl_s        REAL,
    ended_at     REAL,                 -- NULL while active
    released     INTEGER NOT NULL DEFAULT 0  -- 1: ended by down, not by its TTL
);
CREATE INDEX IF NOT EXISTS requests_active ON requests (serve) WHERE ended_at IS NULL;
CREATE TABLE IF NOT EXISTS elastic (
    serve  TEXT PRIMARY KEY,
    mib    INTEGER NOT NULL,
    set_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS ups (
    serve      TEXT PRIMARY KEY,
    pid        INTEGER NOT NULL,       -- also its process group (it runs in its own session)
    proc_start INTEGER,                -- /proc/<pid>/stat starttime: tells a reused pid apart
    roles      TEXT NOT NULL,          -- JSON: [role, ...]
    mib        INTEGER NOT NULL,       -- what was reserved for the start
    deadline   REAL NOT NULL,          -- epoch seconds: start_timeout_s after it began
    began_at   REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS started (
    container TEXT PRIMARY KEY,
    serve     TEXT NOT NULL,
    gpu_roles TEXT NOT NULL,           -- JSON: [role id, ...]
    mib       INTEGER NOT NULL,
    set_at    REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS footprints (
    id     INTEGER PRIMARY KEY AUTOINCREMENT,
    serve  TEXT NOT NULL,
    kind   TEXT NOT NULL,              -- start | stop
    role   TEXT NOT NULL,
    at     REAL NOT NULL,
    sample TEXT NOT NULL               -- JSON: statemachine.sizing.footprint.Sample.to_json()
);
CREATE INDEX IF NOT EXISTS footprints_serve ON footprints (serve, id);
CREATE TABLE IF NOT EXISTS quiesced (
    serve TEXT PRIMARY KEY,            -- its router tier was left quiesced by the controller
    since REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS sleeping (
    container    TEXT PRIMARY KEY,     -- a container the controller put to sleep
    serve        TEXT NOT NULL,
    level        INTEGER NOT NULL,     -- 1: weights in host RAM, 2: weights dropped
    gpu_roles    TEXT NOT NULL,        -- JSON: [role id, ...]
    residual_mib INTEGER NOT NULL,     -- what it still holds per role asleep
    host_ram_mib INTEGER NOT NULL,     -- host RAM it holds asleep (0 at level 2)
    started_at   TEXT,                 -- the container's start it sleeps in: another = awake
    since        REAL NOT NULL,        -- when its sleep was confirmed
    seen         TEXT,                 -- last observation: asleep | awake | unknown
    seen_at      REAL
);
CREATE TABLE IF NOT EXISTS serve_records (
    serve     TEXT PRIMARY KEY,     -- one record per serve (statemachine/lifecycle/serve_record.py)
    lifecycle TEXT NOT NULL,           -- its lifecycle state, as the machine last left it
    at        REAL NOT NULL            -- when it was last moved
);
CREATE TABLE IF NOT EXISTS reloads (
    id      INTEGER PRIMARY KEY AUTOINCREMENT,
    serve   TEXT NOT NULL,
    kind    TEXT NOT NULL,             -- cold (start until healthy) | wake (wake until healthy)
    seconds REAL NOT NULL,
    at      REAL NOT NULL              -- when it ended (healthy)
);
CREATE INDEX IF NOT EXISTS reloads_serve ON reloads (serve, kind, id);
CREATE TABLE IF NOT EXISTS declared (
    container TEXT PRIMARY KEY,        -- the last reservation a manifest declared for it
    serve     TEXT NOT NULL,
    gpu_roles TEXT NOT NULL,           -- JSON: [role id, ...]
    mib       INTEGER NOT NULL,
    set_at    REAL NOT NULL
);
"""

#: Tables added to schema version 1 after its release: created on open when missing
#: (``CREATE TABLE IF NOT EXISTS``), so a journal written before them still opens (and
#: an earlier vramctl still opens one that has them: it reads none of them).
_ADDED_TABLES = frozenset(
    {
        "started",
        "ups",
        "declared",
        "footprints",
        "quiesced",
        "sleeping",
        "serve_records",
        "reloads",
    }
)

#: Columns added to schema version 1 after its release (table, column, type): added on a
#: writable open when missing (``ALTER TABLE ... ADD COLUMN``); a journal opened
#: read-only without them reads them as NULL.
_ADDED_COLUMNS = (
    ("cycles", "policy", "TEXT"),
    ("requests", "released", "INTEGER NOT NULL DEFAULT 0"),
)

_TABLES = frozenset({"manifests", "cycles", "steps", "requests", "elastic"})


@dataclass(frozen=True, slots=True)
class UpRecord:
    """An ``up`` command the controller started and has not seen end."""

    serve: str
    pid: int
    proc_start: int | None
    roles: tuple[str, ...]
    mib: int
    deadline: float
    began_at: float


@dataclass(frozen=True, slots=True)
class SleepRecord:
    """A container the controller put to sleep, as the journal remembers it.

    ``started_at`` is the container's start it was put to sleep in (Docker's
    ``State.StartedAt``): a container found started at another time restarted, so it
    is awake and full whatever the record says. ``seen`` is what the last observation
    found (``asleep``, ``awake`` or ``unknown``), at ``seen_at``.
    """

    container: str
    serve: str
    level: int
    gpu_roles: tuple[str, ...]
    residual_mib: int
    host_ram_mib: int
    started_at: str | None
    since: float
    seen: str | None = None
    seen_at: float | None = None


class JournalError(Exception):
    """The journal file cannot be opened, is not a vramctl journal, or a call is invalid."""


# ── where state lives ────────────────────────────────────────────────────────


def default_state_dir(manifest_paths: Sequence[str | Path]) -> Path:
    """The state directory when ``--state-dir`` is not given.

    ``$XDG_STATE_HOME/vramctl`` when ``XDG_STATE_HOME`` is set to an absolute path
    (the XDG spec ignores relative ones): the operator has said where per-user state
    goes. Otherwise ``.vramctl-state/`` beside the first manifest file, not under
    ``~/.local/state``: the controller usually runs in a container whose only
    persistent volume is the manifest folder, and two fleets with separate manifests
    then get separate journals and locks. Two controllers that resolve to the same
    directory are refused by :class:`StateLock`, never silently share a journal.
    """
    xdg = os.environ.get("XDG_STATE_HOME", "").strip()
    if xdg and Path(xdg).is_absolute():
        return Path(xdg) / "vramctl"
    if not manifest_paths:
        raise ValueError("no manifest given: cannot place the state directory beside it")
    return Path(manifest_paths[0]).resolve().parent / LOCAL_STATE_DIR


def journal_path(state_dir: Path) -> Path:
    """The journal file inside ``state_dir``."""
    return state_dir / JOURNAL_NAME


def journal_to_read(state_dir: Path) -> Path | None:
    """The journal file in ``state_dir`` when there is one (``None``: none, no controller
    ran there); :class:`StateDirError` when the directory or the file is there but this
    user may not read it."""
    path = journal_path(state_dir)
    try:
        if not path.is_file():
            return None
        with path.open("rb"):
            return path
    except OSError as exc:
        raise StateDirError(state_dir, "read the journal in", exc) from None


# ── records ──────────────────────────────────────────────────────────────────


@dataclass(frozen=True, slots=True)
class CycleRecord:
    """One recorded cycle. ``outcome`` is ``None`` until its report is recorded."""

    id: int
    at: float
    manifest_digest: str
    observed: dict[str, Any]
    plan: dict[str, Any]
    requests: list[dict[str, Any]]
    outcome: dict[str, Any] | None
    dry_run: bool
    #: the planner policy the cycle was planned with (``Policy.to_json()``); ``None`` in
    #: cycles recorded before the journal kept it
    policy: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        """JSON form."""
        return {
            "id": self.id,
            "at": self.at,
            "manifest_digest": self.manifest_digest,
            "observed": self.observed,
            "plan": self.plan,
            "requests": self.requests,
            "outcome": self.outcome,
            "dry_run": self.dry_run,
            "policy": self.policy,
        }


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One step's outcome as recorded in the ``steps`` table."""

    cycle_id: int
    idx: int
    action: str
    serve: str
    outcome: str
    detail: str | None
    duration_s: float | None


def _columns(conn: sqlite3.Connection, table: str) -> set[str]:
    """The column names of ``table``."""
    return {str(row[1]) for row in conn.execute(f"PRAGMA table_info({table})")}


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _opt_float(value: Any) -> float | None:
    return None if value is None else float(value)


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)


#: SQLite's side files beside the journal (WAL, shared memory, rollback journal).
_SIDE_FILES = ("-wal", "-shm", "-journal")


def _private(path: Path, *, create: bool) -> None:
    """Make ``path`` mode 0600 (creating it empty when ``create``), never wider.

    SQLite creates its side files with the main file's mode, so a journal created
    here 0600 keeps its ``-wal`` / ``-shm`` / ``-journal`` private too; files an
    earlier version left wider are tightened.
    """
    flags = os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW | (os.O_CREAT if create else 0)
    try:
        fd = os.open(path, flags, PRIVATE_FILE_MODE)
    except FileNotFoundError:
        if create:
            raise
        return
    try:
        if stat.S_IMODE(os.fstat(fd).st_mode) & 0o077:
            os.fchmod(fd, PRIVATE_FILE_MODE)
    finally:
        os.close(fd)


# ── the journal ──────────────────────────────────────────────────────────────


def _prepare(conn: sqlite3.Connection, path: Path, *, readonly: bool) -> None:
    """Check the file's schema; create it in a new file, add what is missing in an older one."""
    conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    version = int(conn.execute("PRAGMA user_version").fetchone()[0])
    if version > SCHEMA_VERSION:
        raise JournalError(
            f"{path}: journal schema version {version} is newer than this vramctl "
            f"understands ({SCHEMA_VERSION}); use a newer vramctl or another --state-dir"
        )
    tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if version == SCHEMA_VERSION:
        missing = _TABLES - tables
        if missing:
            raise JournalError(f"{path}: journal lacks tables {', '.join(sorted(missing))}")
        if not readonly:
            _add_in_place(conn, tables)
        return
    # version 0: a new file, or some other SQLite database
    if readonly:
        raise JournalError(f"{path}: an SQLite file but not a vramctl journal (no schema)")
    if tables - {"sqlite_sequence"}:
        raise JournalError(
            f"{path}: an SQLite database with other tables ({', '.join(sorted(tables))}) "
            f"and no vramctl schema; refusing to write into it"
        )
    conn.execute("PRAGMA auto_vacuum = INCREMENTAL")  # only takes effect on a new file
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    conn.execute("BEGIN IMMEDIATE")
    _create_tables(conn)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    conn.execute("COMMIT")


def _create_tables(conn: sqlite3.Connection) -> None:
    """Every table and index of the schema not there yet (``IF NOT EXISTS``)."""
    for statement in _SCHEMA.split(";"):
        if statement.strip():
            conn.execute(statement)


def _add_in_place(conn: sqlite3.Connection, tables: set[str]) -> None:
    """A journal of this schema written by an earlier version: the tables and columns
    added since, added in place (its records kept)."""
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    if _ADDED_TABLES - tables:
        conn.execute("BEGIN IMMEDIATE")
        _create_tables(conn)
        conn.execute("COMMIT")
    missing_columns = [
        (table, column, kind)
        for table, column, kind in _ADDED_COLUMNS
        if column not in _columns(conn, table)
    ]
    if missing_columns:
        conn.execute("BEGIN IMMEDIATE")
        for table, column, kind in missing_columns:
            conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
        conn.execute("COMMIT")


class JournalFile:
    """An open journal file: its connection, schema and write transactions.

    Use :meth:`Journal.open`; close it (or use ``with``). The journal's records are the
    layers above: :class:`CycleLog` (the cycles, their steps and retention) and
    :class:`MeasureLog` (each serve's footprint samples and reload timings), then
    :class:`Journal`, both of them and what each serve's facts are between cycles.
    """

    def __init__(
        self,
        conn: sqlite3.Connection,
        path: Path,
        *,
        readonly: bool,
        keep_cycles: int,
        keep_days: float,
        prune_every: int,
    ) -> None:
        """Wrap an open connection; call :meth:`open` instead."""
        self._conn = conn
        self._lock = threading.RLock()
        self._since_prune = 0
        self.path = path
        self.readonly = readonly
        self.keep_cycles = keep_cycles
        self.keep_days = keep_days
        self.prune_every = prune_every

    # ---------------------------------------------------------------- lifecycle
    @classmethod
    def open(
        cls,
        path: Path,
        *,
        readonly: bool = False,
        keep_cycles: int = DEFAULT_KEEP_CYCLES,
        keep_days: float = DEFAULT_KEEP_DAYS,
        prune_every: int = DEFAULT_PRUNE_EVERY,
    ) -> Self:
        """Open (creating file, folder and schema when needed) the journal at ``path``.

        ``readonly`` opens an existing journal without creating or changing anything
        (what ``replay`` does); it must already carry the schema. Raises
        :class:`JournalError` naming the file when it is not a vramctl journal or was
        written by a newer schema.
        """
        path = Path(path)
        if keep_cycles < 1 or keep_days <= 0 or prune_every < 1:
            raise JournalError("retention needs keep_cycles >= 1, keep_days > 0, prune_every >= 1")
        try:
            if readonly:
                if not path.is_file():
                    raise JournalError(f"{path}: no journal file")
                conn = sqlite3.connect(
                    f"{path.resolve().as_uri()}?mode=ro",
                    uri=True,
                    timeout=BUSY_TIMEOUT_MS / 1000,
                    isolation_level=None,
                    check_same_thread=False,
                )
            else:
                if not path.parent.exists():
                    path.parent.mkdir(parents=True, mode=PRIVATE_DIR_MODE)
                _private(path, create=True)
                for suffix in _SIDE_FILES:
                    _private(path.with_name(path.name + suffix), create=False)
                conn = sqlite3.connect(
                    path,
                    timeout=BUSY_TIMEOUT_MS / 1000,
                    isolation_level=None,
                    check_same_thread=False,
                )
        except (sqlite3.Error, OSError) as exc:
            raise JournalError(f"{path}: cannot open journal: {exc}") from None
        try:
            _prepare(conn, path, readonly=readonly)
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise JournalError(f"{path}: not a vramctl journal ({exc})") from None
        except JournalError:
            conn.close()
            raise
        return cls(
            conn,
            path,
            readonly=readonly,
            keep_cycles=keep_cycles,
            keep_days=keep_days,
            prune_every=prune_every,
        )

    def close(self) -> None:
        """Close the connection (idempotent)."""
        with self._lock:
            self._conn.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @contextlib.contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction under the lock."""
        if self.readonly:
            raise JournalError(f"{self.path}: opened read-only")
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    def schema_version(self) -> int:
        """``PRAGMA user_version`` of the file."""
        with self._lock:
            return int(self._conn.execute("PRAGMA user_version").fetchone()[0])


class CycleLog(JournalFile):
    """The journal's cycles: inputs, plan and outcome of each, its steps; their retention."""

    # ---------------------------------------------------------------- cycles
    def record_cycle(
        self,
        *,
        at: float,
        manifest_digest: str,
        manifest_files: Mapping[str, str],
        observed: Mapping[str, Any],
        plan: Mapping[str, Any],
        requests: Sequence[Mapping[str, Any]],
        dry_run: bool,
        policy: Mapping[str, Any] | None = None,
    ) -> int:
        """Record one cycle's inputs and plan; returns its id (increasing, never reused).

        ``policy`` is the planner policy the plan was made with (``Policy.to_json()``:
        backoff holds, ``no_shrink``), so that replay plans as the loop did.
        ``manifest_files`` (path -> content) is stored once per ``manifest_digest``.
        Every ``prune_every`` records, :meth:`prune` runs with ``now = at``.
        """
        with self._tx() as conn:
            conn.execute(
                "INSERT OR IGNORE INTO manifests (digest, files, first_seen) VALUES (?, ?, ?)",
                (manifest_digest, _dumps(dict(manifest_files)), at),
            )
            cur = conn.execute(
                "INSERT INTO cycles "
                "(at, manifest_digest, observed, plan, requests, dry_run, policy) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    at,
                    manifest_digest,
                    _dumps(dict(observed)),
                    _dumps(dict(plan)),
                    _dumps([dict(r) for r in requests]),
                    int(dry_run),
                    None if policy is None else _dumps(dict(policy)),
                ),
            )
            cycle_id = cur.lastrowid
            assert cycle_id is not None
        with self._lock:
            self._since_prune += 1
            if self._since_prune >= self.prune_every:
                self.prune(now=at)
        return cycle_id

    def record_outcome(self, cycle_id: int, report: Mapping[str, Any]) -> None:
        """Attach the executor's report to a cycle, and each step's outcome to ``steps``.

        Recording again for the same cycle replaces the earlier outcome.
        """
        steps = report.get("steps") or []
        with self._tx() as conn:
            cur = conn.execute(
                "UPDATE cycles SET outcome = ? WHERE id = ?", (_dumps(dict(report)), cycle_id)
            )
            if cur.rowcount == 0:
                raise JournalError(f"{self.path}: no cycle {cycle_id} to record an outcome for")
            conn.execute("DELETE FROM steps WHERE cycle_id = ?", (cycle_id,))
            conn.executemany(
                "INSERT INTO steps (cycle_id, idx, action, serve, outcome, detail, duration_s) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                [
                    (
                        cycle_id,
                        idx,
                        str(step.get("action", "")),
                        str(step.get("serve", "")),
                        str(step.get("outcome", "")),
                        _opt_str(step.get("detail")),
                        _opt_float(step.get("duration_s")),
                    )
                    for idx, step in enumerate(steps)
                ],
            )

    def cycles(self, since_id: int | None = None, cycle: int | None = None) -> list[CycleRecord]:
        """Recorded cycles, oldest first: all, those after ``since_id``, or just ``cycle``."""
        with self._lock:
            # a journal opened read-only may predate the policy column: read it as NULL
            policy = "policy" if "policy" in _columns(self._conn, "cycles") else "NULL"
        query = (
            "SELECT id, at, manifest_digest, observed, plan, requests, outcome, dry_run, "
            f"{policy} FROM cycles WHERE 1 = 1"
        )
        args: list[int] = []
        if since_id is not None:
            query += " AND id > ?"
            args.append(since_id)
        if cycle is not None:
            query += " AND id = ?"
            args.append(cycle)
        with self._lock:
            rows = self._conn.execute(query + " ORDER BY id", args).fetchall()
        return [
            CycleRecord(
                id=int(r[0]),
                at=float(r[1]),
                manifest_digest=str(r[2]),
                observed=json.loads(r[3]),
                plan=json.loads(r[4]),
                requests=json.loads(r[5]),
                outcome=None if r[6] is None else json.loads(r[6]),
                dry_run=bool(r[7]),
                policy=None if r[8] is None else json.loads(r[8]),
            )
            for r in rows
        ]

    def cycle_ids(self) -> list[int]:
        """The ids of every recorded cycle, oldest first."""
        with self._lock:
            return [int(r[0]) for r in self._conn.execute("SELECT id FROM cycles ORDER BY id")]

    def steps(self, cycle_id: int) -> list[StepRecord]:
        """The recorded step outcomes of one cycle, in plan order."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT cycle_id, idx, action, serve, outcome, detail, duration_s FROM steps "
                "WHERE cycle_id = ? ORDER BY idx",
                (cycle_id,),
            ).fetchall()
        return [
            StepRecord(int(r[0]), int(r[1]), r[2], r[3], r[4], r[5], _opt_float(r[6])) for r in rows
        ]

    def manifest_files(self, digest: str) -> dict[str, str] | None:
        """The manifest files (path -> content) recorded for ``digest``, if still kept."""
        with self._lock:
            row = self._conn.execute(
                "SELECT files FROM manifests WHERE digest = ?", (digest,)
            ).fetchone()
        if row is None:
            return None
        files: dict[str, str] = json.loads(row[0])
        return files

    # ---------------------------------------------------------------- retention
    def prune(
        self,
        keep_cycles: int | None = None,
        keep_days: float | None = None,
        *,
        now: float,
    ) -> int:
        """Drop old cycles; returns how many were dropped.

        A cycle is kept only while it is among the newest ``keep_cycles`` *and* its
        ``at`` is within ``keep_days`` of ``now`` (defaults: the journal's settings).
        Its steps go with it; a manifest content no remaining cycle refers to goes too,
        as do requests ended more than ``keep_days`` ago. Active requests and elastic
        reserves are never pruned. Freed pages are returned to the file system
        (incremental vacuum) so the file stays bounded.
        """
        keep_n = self.keep_cycles if keep_cycles is None else keep_cycles
        days = self.keep_days if keep_days is None else keep_days
        cutoff = now - days * 86400.0
        with self._tx() as conn:
            doomed = (
                "SELECT id FROM cycles WHERE at < ? "
                "OR id NOT IN (SELECT id FROM cycles ORDER BY id DESC LIMIT ?)"
            )
            conn.execute(f"DELETE FROM steps WHERE cycle_id IN ({doomed})", (cutoff, keep_n))
            dropped = conn.execute(f"DELETE FROM cycles WHERE id IN ({doomed})", (cutoff, keep_n))
            conn.execute(
                "DELETE FROM manifests WHERE digest NOT IN "
                "(SELECT DISTINCT manifest_digest FROM cycles)"
            )
            conn.execute(
                "DELETE FROM requests WHERE ended_at IS NOT NULL AND ended_at < ?", (cutoff,)
            )
            count = dropped.rowcount
        with self._lock:
            self._since_prune = 0
            if count:
                self._conn.execute("PRAGMA incremental_vacuum").fetchall()
        return count


class MeasureLog(JournalFile):
    """The journal's measurements of each serve: its footprint samples and how long its
    cold starts and wakes took, each kept newest-N per serve (no cycle refers to them)."""

    # ---------------------------------------------------------------- footprints
    def add_footprint(
        self,
        serve: str,
        kind: str,
        role: str,
        at: float,
        sample: Mapping[str, Any],
        *,
        keep: int = DEFAULT_KEEP_FOOTPRINTS,
    ) -> int:
        """Record one footprint sample; keeps the newest ``keep`` of ``serve``. Its id."""
        if keep < 1:
            raise JournalError("keep must be >= 1")
        with self._tx() as conn:
            cur = conn.execute(
                "INSERT INTO footprints (serve, kind, role, at, sample) VALUES (?, ?, ?, ?, ?)",
                (serve, kind, role, at, _dumps(dict(sample))),
            )
            conn.execute(
                "DELETE FROM footprints WHERE serve = ? AND id NOT IN "
                "(SELECT id FROM footprints WHERE serve = ? ORDER BY id DESC LIMIT ?)",
                (serve, serve, keep),
            )
            return int(cur.lastrowid or 0)

    def update_footprint(self, sample_id: int, sample: Mapping[str, Any]) -> None:
        """Replace a recorded sample's JSON (its peak grew); gone already: nothing."""
        with self._tx() as conn:
            conn.execute(
                "UPDATE footprints SET sample = ? WHERE id = ?", (_dumps(dict(sample)), sample_id)
            )

    def footprints(self, serve: str | None = None) -> list[tuple[int, dict[str, Any]]]:
        """Recorded samples (id, JSON), oldest first; of one serve when given."""
        query = "SELECT id, sample FROM footprints"
        args: tuple[Any, ...] = ()
        if serve is not None:
            query += " WHERE serve = ?"
            args = (serve,)
        with self._lock:
            try:
                rows = self._conn.execute(query + " ORDER BY id", args).fetchall()
            except sqlite3.OperationalError:  # no such table (read-only, older file)
                return []
        return [(int(r[0]), json.loads(r[1])) for r in rows]

    # ---------------------------------------------------------------- reloads
    def add_restore(
        self,
        serve: str,
        kind: str,
        seconds: float,
        at: float,
        *,
        keep: int = DEFAULT_KEEP_RELOADS,
    ) -> None:
        """Record one measured cold start or wake (``kind``: ``cold`` / ``wake``) of
        ``serve``; keeps the newest ``keep`` of that serve and kind."""
        if keep < 1:
            raise JournalError("keep must be >= 1")
        if kind not in RELOAD_KINDS:
            kinds = ", ".join(RELOAD_KINDS)
            raise JournalError(f"reload kind must be one of {kinds}, got {kind!r}")
        with self._tx() as conn:
            conn.execute(
                "INSERT INTO reloads (serve, kind, seconds, at) VALUES (?, ?, ?, ?)",
                (serve, kind, float(seconds), float(at)),
            )
            conn.execute(
                "DELETE FROM reloads WHERE serve = ? AND kind = ? AND id NOT IN "
                "(SELECT id FROM reloads WHERE serve = ? AND kind = ? ORDER BY id DESC LIMIT ?)",
                (serve, kind, serve, kind, keep),
            )

    def restore_times(self) -> dict[str, dict[str, list[float]]]:
        """Serve -> kind -> the recorded seconds, oldest first (empty without any)."""
        with self._lock:
            try:
                rows = self._conn.execute(
                    "SELECT serve, kind, seconds FROM reloads ORDER BY id"
                ).fetchall()
            except sqlite3.OperationalError:  # no such table (read-only, older file)
                return {}
        out: dict[str, dict[str, list[float]]] = {}
        for serve, kind, seconds in rows:
            out.setdefault(str(serve), {}).setdefault(str(kind), []).append(float(seconds))
        return out


class Journal(CycleLog, MeasureLog):
    """An open journal: its cycles (:class:`CycleLog`), each serve's measurements
    (:class:`MeasureLog`: footprints, reloads) and each serve's facts between cycles
    (requests, elastic figures, `up` records, starts, tiers left quiesced, lifecycle
    states, sleeps). Use :meth:`open`; close it (or use ``with``)."""

    # ---------------------------------------------------------------- requests
    def add_request(
        self, serve: str, requested_at: float, ttl_s: float | None, *, released: bool = False
    ) -> None:
        """Record an on-demand request; it replaces the serve's active one, if any.
        ``released``: the request ended by ``down`` (kept until its serve is down)."""
        with self._tx() as conn:
            conn.execute(
                "UPDATE requests SET ended_at = ? WHERE serve = ? AND ended_at IS NULL",
                (requested_at, serve),
            )
            conn.execute(
                "INSERT INTO requests (serve, requested_at, ttl_s, released) VALUES (?, ?, ?, ?)",
                (serve, requested_at, ttl_s, int(released)),
            )

    def end_request(self, serve: str, at: float) -> None:
        """End the serve's active request (nothing when it has none)."""
        with self._tx() as conn:
            conn.execute(
                "UPDATE requests SET ended_at = ? WHERE serve = ? AND ended_at IS NULL",
                (at, serve),
            )

    def active_requests(self) -> list[OnDemandRequest]:
        """Requests not yet ended, oldest first; TTL-expired ones included (see module)."""
        with self._lock:
            # a journal opened read-only may predate the released column: read it as 0
            released = "released" if "released" in _columns(self._conn, "requests") else "0"
            rows = self._conn.execute(
                f"SELECT serve, requested_at, ttl_s, {released} FROM requests "
                "WHERE ended_at IS NULL ORDER BY requested_at, id"
            ).fetchall()
        return [
            OnDemandRequest(str(r[0]), float(r[1]), _opt_float(r[2]), released=bool(r[3]))
            for r in rows
        ]

    # ---------------------------------------------------------------- elastic
    def set_elastic(self, serve: str, mib: int | None, at: float) -> None:
        """Remember the reserve asked of an elastic serve; ``None`` = back to full (forget)."""
        with self._tx() as conn:
            if mib is None:
                conn.execute("DELETE FROM elastic WHERE serve = ?", (serve,))
            else:
                conn.execute(
                    "INSERT INTO elastic (serve, mib, set_at) VALUES (?, ?, ?) "
                    "ON CONFLICT (serve) DO UPDATE "
                    "SET mib = excluded.mib, set_at = excluded.set_at",
                    (serve, int(mib), at),
                )

    def elastic(self) -> dict[str, int]:
        """Serve -> MiB for every elastic reserve in force."""
        with self._lock:
            rows = self._conn.execute("SELECT serve, mib FROM elastic ORDER BY serve").fetchall()
        return {str(r[0]): int(r[1]) for r in rows}

    def elastic_set_at(self) -> dict[str, float]:
        """Serve -> when its elastic reserve in force was asked for (epoch seconds)."""
        with self._lock:
            rows = self._conn.execute("SELECT serve, set_at FROM elastic ORDER BY serve").fetchall()
        return {str(r[0]): float(r[1]) for r in rows}

    # ------------------------------------------------------------ `up` in flight
    def add_up(self, rec: UpRecord) -> None:
        """Record an ``up`` command that runs now (before the controller waits for it)."""
        with self._tx() as conn:
            conn.execute(
                "INSERT INTO ups (serve, pid, proc_start, roles, mib, deadline, began_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (serve) DO UPDATE SET "
                "pid = excluded.pid, proc_start = excluded.proc_start, roles = excluded.roles, "
                "mib = excluded.mib, deadline = excluded.deadline, began_at = excluded.began_at",
                (
                    rec.serve,
                    rec.pid,
                    rec.proc_start,
                    _dumps(list(rec.roles)),
                    rec.mib,
                    rec.deadline,
                    rec.began_at,
                ),
            )

    def end_up(self, serve: str) -> None:
        """The serve's ``up`` command has exited (or was ended): forget it."""
        with self._tx() as conn:
            conn.execute("DELETE FROM ups WHERE serve = ?", (serve,))

    def ups(self) -> list[UpRecord]:
        """The ``up`` commands recorded as running (a controller killed meanwhile left them)."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT serve, pid, proc_start, roles, mib, deadline, began_at FROM ups "
                "ORDER BY began_at, serve"
            ).fetchall()
        return [
            UpRecord(
                serve=str(r[0]),
                pid=int(r[1]),
                proc_start=None if r[2] is None else int(r[2]),
                roles=tuple(str(x) for x in json.loads(r[3])),
                mib=int(r[4]),
                deadline=float(r[5]),
                began_at=float(r[6]),
            )
            for r in rows
        ]

    # ---------------------------------------------------------------- started
    def set_started(
        self, container: str, serve: str, gpu_roles: Sequence[str], mib: int, at: float
    ) -> None:
        """Remember the reservation ``container`` was started with (replaces any)."""
        self._upsert_reservations(
            "started", {container: StartedWith(serve, tuple(gpu_roles), mib)}, at
        )

    def forget_started(self, container: str) -> None:
        """Forget ``container``'s start reservation (it stopped)."""
        with self._tx() as conn:
            conn.execute("DELETE FROM started WHERE container = ?", (container,))

    def started(self) -> dict[str, StartedWith]:
        """Container -> the reservation it was started with, for every record in force.

        Empty for a read-only journal written before the table existed.
        """
        return self._reservations("started")

    def set_declared(self, records: Mapping[str, StartedWith], at: float) -> None:
        """Remember the reservation a manifest declares for each container (upsert).

        Kept after the manifest stops declaring it: a container that runs while no
        manifest in force declares it (a file caught mid-write, a serve removed and
        started by hand) is counted at its last declared reservation.
        """
        self._upsert_reservations("declared", records, at)

    def declared(self) -> dict[str, StartedWith]:
        """Container -> the last reservation a manifest declared for it."""
        return self._reservations("declared")

    def _upsert_reservations(
        self, table: str, records: Mapping[str, StartedWith], at: float
    ) -> None:
        assert table in ("started", "declared")
        with self._tx() as conn:
            conn.executemany(
                f"INSERT INTO {table} (container, serve, gpu_roles, mib, set_at) "
                "VALUES (?, ?, ?, ?, ?) ON CONFLICT (container) DO UPDATE SET "
                "serve = excluded.serve, gpu_roles = excluded.gpu_roles, "
                "mib = excluded.mib, set_at = excluded.set_at",
                [
                    (c, r.serve, _dumps(list(r.gpu_roles)), int(r.mib), at)
                    for c, r in records.items()
                ],
            )

    def _reservations(self, table: str) -> dict[str, StartedWith]:
        assert table in ("started", "declared")
        with self._lock:
            try:
                rows = self._conn.execute(
                    f"SELECT container, serve, gpu_roles, mib FROM {table} ORDER BY container"
                ).fetchall()
            except sqlite3.OperationalError:  # no such table (read-only, older file)
                return {}
        return {
            str(r[0]): StartedWith(str(r[1]), tuple(str(x) for x in json.loads(r[2])), int(r[3]))
            for r in rows
        }

    # ---------------------------------------------------------------- quiesced
    def set_quiesced(self, serves: Sequence[str], at: float) -> None:
        """Remember that the controller left these serves' tiers quiesced (upsert)."""
        with self._tx() as conn:
            conn.executemany(
                "INSERT INTO quiesced (serve, since) VALUES (?, ?) ON CONFLICT (serve) DO NOTHING",
                [(name, at) for name in serves],
            )

    def forget_quiesced(self, serves: Sequence[str]) -> None:
        """These serves' tiers are readmitted (or no longer the controller's to readmit)."""
        with self._tx() as conn:
            conn.executemany("DELETE FROM quiesced WHERE serve = ?", [(n,) for n in serves])

    def quiesced(self) -> dict[str, float]:
        """Serve -> since when its tier is left quiesced by the controller."""
        with self._lock:
            try:
                rows = self._conn.execute(
                    "SELECT serve, since FROM quiesced ORDER BY serve"
                ).fetchall()
            except sqlite3.OperationalError:  # no such table (read-only, older file)
                return {}
        return {str(r[0]): float(r[1]) for r in rows}

    # ---------------------------------------------------------- serve records
    def set_lifecycles(self, states: Mapping[str, str], at: float) -> None:
        """Remember each serve's lifecycle state (upsert; serves not named are kept)."""
        with self._tx() as conn:
            conn.executemany(
                "INSERT INTO serve_records (serve, lifecycle, at) VALUES (?, ?, ?) "
                "ON CONFLICT (serve) DO UPDATE SET "
                "lifecycle = excluded.lifecycle, at = excluded.at",
                [(name, state, at) for name, state in states.items()],
            )

    def lifecycles(self) -> dict[str, str]:
        """Serve -> its lifecycle state as last remembered (empty for an older journal)."""
        with self._lock:
            try:
                rows = self._conn.execute(
                    "SELECT serve, lifecycle FROM serve_records ORDER BY serve"
                ).fetchall()
            except sqlite3.OperationalError:  # no such table (read-only, older file)
                return {}
        return {str(r[0]): str(r[1]) for r in rows}

    # --------------------------------------------------------------- sleeping
    def set_sleeping(self, rec: SleepRecord) -> None:
        """Remember a container the controller put to sleep (replaces any record of it)."""
        with self._tx() as conn:
            conn.execute(
                "INSERT INTO sleeping (container, serve, level, gpu_roles, residual_mib, "
                "host_ram_mib, started_at, since, seen, seen_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (container) DO UPDATE SET "
                "serve = excluded.serve, level = excluded.level, "
                "gpu_roles = excluded.gpu_roles, residual_mib = excluded.residual_mib, "
                "host_ram_mib = excluded.host_ram_mib, started_at = excluded.started_at, "
                "since = excluded.since, seen = excluded.seen, seen_at = excluded.seen_at",
                (
                    rec.container,
                    rec.serve,
                    int(rec.level),
                    _dumps(list(rec.gpu_roles)),
                    int(rec.residual_mib),
                    int(rec.host_ram_mib),
                    rec.started_at,
                    rec.since,
                    rec.seen,
                    rec.seen_at,
                ),
            )

    def saw_sleeping(self, container: str, seen: str, at: float) -> None:
        """Record what this cycle's observation found of a sleeper (asleep/awake/unknown)."""
        with self._tx() as conn:
            conn.execute(
                "UPDATE sleeping SET seen = ?, seen_at = ? WHERE container = ?",
                (seen, at, container),
            )

    def forget_sleeping(self, container: str) -> None:
        """Forget a sleeper: it was woken, stopped, or restarted (awake and full)."""
        with self._tx() as conn:
            conn.execute("DELETE FROM sleeping WHERE container = ?", (container,))

    def sleeping(self) -> dict[str, SleepRecord]:
        """Container -> its sleep record; empty for a read-only journal without the table."""
        with self._lock:
            try:
                rows = self._conn.execute(
                    "SELECT container, serve, level, gpu_roles, residual_mib, host_ram_mib, "
                    "started_at, since, seen, seen_at FROM sleeping ORDER BY container"
                ).fetchall()
            except sqlite3.OperationalError:  # no such table (read-only, older file)
                return {}
        return {
            str(r[0]): SleepRecord(
                container=str(r[0]),
                serve=str(r[1]),
                level=int(r[2]),
                gpu_roles=tuple(str(x) for x in json.loads(r[3])),
                residual_mib=int(r[4]),
                host_ram_mib=int(r[5]),
                started_at=_opt_str(r[6]),
                since=float(r[7]),
                seen=_opt_str(r[8]),
                seen_at=_opt_float(r[9]),
            )
            for r in rows
        }
