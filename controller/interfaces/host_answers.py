"""The read answers every front end renders, each built once from a situation.

``GET /v1/ledger``, the ``reservation_status`` tool of both MCP transports and the
page's bars are :func:`ledger_answer`; ``GET /v1/serves`` and ``serves_status`` are
:func:`serve_rows`. Each takes the :class:`~statemachine.answers.situation.Situation` its
source built (the running loop's, or a snapshot's with the state directory's journal:
``controller/service/situation.py``) and what that source knows beside it
(:class:`RowExtras`: the loop's backoff and queue; the footprints and model estimates),
so the same situation gets the same answer over HTTP, MCP and the CLI.

Free text (a blocked reason, a failure, what a model's files say) is withheld from a
caller without the token (``full`` false), as ``controller/interfaces/redaction.py``
says. Pure formatting: no I/O, nothing decided here that the core does not decide.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from controller.interfaces.redaction import public_blocked, public_failure, public_model
from controller.service.loop_port import BackoffView
from statemachine.answers.pending import PENDING_STATE, PendingStart, role_pending
from statemachine.answers.situation import Situation
from statemachine.domain.types import Observed, OnDemandRequest, ServeSpec
from statemachine.planning.admission import can_request
from statemachine.planning.idleness import request_end

__all__ = ["RowExtras", "fit_json", "ledger_answer", "ledger_roles", "request_json", "serve_rows"]


@dataclass(frozen=True, slots=True)
class RowExtras:
    """What a source knows of each serve beside its situation."""

    #: serve -> its backoff; ``None``: the source cannot know it (only the loop holds it)
    backoff: Mapping[str, BackoffView] | None = None
    #: serve -> declared vs measured (``statemachine.sizing.footprint.Footprint.to_json()``)
    footprints: Mapping[str, Any] = field(default_factory=dict)
    #: serve -> its ``[serve.model]`` estimate
    models: Mapping[str, Any] = field(default_factory=dict)
    #: serve -> its place in the request queue (the API's), or ``None``
    queued: Callable[[str], dict[str, Any] | None] = lambda _serve: None


def status_json(sit: Situation, *, observed: bool = True) -> dict[str, Any]:
    """The host status of ``sit`` as JSON (``observed`` false: no observation was ever
    taken, so docker and NVML are ``unknown``)."""
    data = sit.status().to_json()
    if not observed:
        data["docker"] = "unknown"
        data["nvml"] = "unknown"
    return data


def ledger_roles(data: dict[str, Any], pending: tuple[PendingStart, ...]) -> list[dict[str, Any]]:
    """Each role of the status JSON ``data`` (what is held: its committed, free and
    ``overcommitted`` stand) with its pending requests beside it (``pending``, each
    with the room its plan is still making there), ``pending_mib``, ``making_room_mib``
    and ``promised_mib`` (committed + pending: what ``up`` counts; ``null`` when
    committed is unknown)."""
    rows = []
    for row in data.get("gpu_roles", []):
        here, taken, freed = role_pending(pending, row["gpu_role"])
        committed = row.get("committed_mib")
        rows.append(
            {
                **row,
                "pending": [
                    {
                        "serve": p.serve,
                        "mib": p.mib,
                        "state": PENDING_STATE,
                        "making_room": [
                            r.to_json() for r in p.making_room if row["gpu_role"] in r.gpu_roles
                        ],
                    }
                    for p in here
                ],
                "pending_mib": taken,
                "making_room_mib": freed,
                "promised_mib": None if committed is None else committed + taken,
            }
        )
    return rows


def ledger_answer(sit: Situation, *, observed: bool = True) -> dict[str, Any]:
    """What is held per role and what is promised beside it: ``GET /v1/ledger`` and
    ``reservation_status``."""
    data = status_json(sit, observed=observed)
    pending = sit.pending()
    return {
        "docker": data["docker"],
        "nvml": data["nvml"],
        "gpu_roles": ledger_roles(data, pending),
        "host": data.get("host"),
        "pending": [p.to_json() for p in pending],
        "undeclared_gpu_containers": data["undeclared_gpu_containers"],
        "no_longer_declared": data["no_longer_declared"],
    }


def request_json(
    r: OnDemandRequest, now: float, spec: ServeSpec | None, observed: Observed
) -> dict[str, Any]:
    """A request's JSON: when it ends and what that counts from (``ttl_basis``: its own
    ``ttl``; ``measured`` idleness; ``request``: no source, from the request;
    ``unknown``: a source whose count is unknown now; ``pending``: a source, and the
    serve has not run since the request; ``none``: no TTL)."""
    end = request_end(r, spec, observed)
    return {"requested_at": r.requested_at, **end.to_json(now)}


def serve_rows(
    sit: Situation,
    extras: RowExtras,
    *,
    full: bool,
    only: str | None = None,
    observed: bool = True,
) -> tuple[str, list[dict[str, Any]]]:
    """Docker's word (``ok``, ``error``, ``unknown``) and each serve's row (``only``:
    that serve's): its status, whether it may be requested, its request, footprint,
    model estimate, queue place, why the next plan blocks it, and its backoff
    (``null`` where the source cannot know it)."""
    data = status_json(sit, observed=observed)
    requests = {r.serve: r for r in sit.desired.requests}
    blocked = {b.serve: b.reason for b in sit.plan.blocked}
    rows = [
        _row(sit, extras, row, requests.get(row["serve"]), blocked.get(row["serve"]), full)
        for row in data["serves"]
        if only is None or row["serve"] == only
    ]
    return str(data["docker"]), rows


def _row(
    sit: Situation,
    extras: RowExtras,
    row: dict[str, Any],
    req: OnDemandRequest | None,
    blocked: str | None,
    full: bool,
) -> dict[str, Any]:
    name = row["serve"]
    spec = sit.desired.serves.get(name)
    why_not = can_request(sit.desired, name)
    return {
        **row,
        "requestable": why_not is None,
        "not_requestable_reason": why_not,
        "request": None if req is None else request_json(req, sit.now, spec, sit.observed),
        # declared vs measured (docs/limits.md): null before any sample
        "footprint": extras.footprints.get(name),
        # [serve.model]: weights + KV beside the reservation and the footprint (docs/sizing.md)
        "model": _model(extras.models.get(name), full),
        "queued": extras.queued(name),
        "blocked": blocked if full else public_blocked(name, blocked),
        "backoff": _backoff(extras, name, sit.now, full),
    }


def fit_json(sit: Situation, serve: str, *, full: bool) -> dict[str, Any]:
    """Can ``serve`` start now, and at what cost (``GET /v1/fit``, ``can_fit``): the
    situation's fit; for a reader without the token, a held serve's reason (its
    failure's text, which may quote its ``up`` command line) withheld."""
    data = sit.fit(serve).to_json()
    if full:
        return data
    return {**data, "reason": public_blocked(serve, data.get("reason"))}


def _model(entry: dict[str, Any] | None, full: bool) -> dict[str, Any] | None:
    """A serve's model entry; without the token, what its files say withheld."""
    return entry if entry is None or full else public_model(entry)


def _backoff(extras: RowExtras, name: str, now: float, full: bool) -> dict[str, Any] | None:
    b = None if extras.backoff is None else extras.backoff.get(name)
    if b is None or not b.failures:
        return None
    return {
        "failures": b.failures,
        "last_failure": b.last_failure if full else public_failure(b.last_failure),
        "until": b.until,
        "retry_in_s": max(0.0, b.until - now),
    }
