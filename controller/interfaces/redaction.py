"""What a read answer holds for a reader without the API token (docs/design.md §5).

The read routes (``GET /healthz``, ``/v1/ledger``, ``/v1/serves``, ``/v1/plans``, the event
stream) need no token, but without it they show names, states and figures only: the
free text of a failed start (its ``up`` command line and output) and the values quoted
by manifest errors are withheld. These helpers say what is kept; both the API
(:mod:`controller.interfaces.api`) and the page (:mod:`controller.interfaces.ui`) use
them, so neither imports the other for them.

This module formats text; it reads, decides and changes nothing, and serves no HTTP.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from controller.manifest import LocatedError

#: Why a read answer holds less than the journal and the log.
REDACTED_NOTE = (
    "free text (the `up` command line and output of a failed start, manifest values) is "
    "shown only to a request with 'Authorization: Bearer TOKEN', and in the log"
)
#: The failures :meth:`FailureBook.note_deaths` (controller.service.failures) words
#: from states and figures only.
_PUBLIC_FAILURE = re.compile(r"container (?:OOM-killed|exited -?\d+)")
_FIELD_CHARS = 64
#: what stands for words a model's files gave (a read error, why a term is unknown)
MODEL_TEXT_WITHHELD = "withheld: what the model's files say is shown with the API token"


def public_manifest_error(error: LocatedError, *, logged: bool = True) -> str:
    """Where a manifest problem is (file, line, entry, field), without what it says.

    The message quotes the offending value (up to 120 characters), which may be
    anything the file holds: a reader without the token gets the location only.
    ``logged``: the loop's own manifest (its log has the reason); an edit a caller
    sent is not logged.
    """
    parts = [error.file]
    if error.line is not None:
        parts.append(
            f"line {error.line}" + (f", column {error.column}" if error.column is not None else "")
        )
    if error.where is not None:
        parts.append(error.where)
    if error.field:
        field_name = error.field
        if len(field_name) > _FIELD_CHARS:
            field_name = field_name[: _FIELD_CHARS - 3] + "..."
        parts.append(field_name)
    where = "the API token, and in the log" if logged else "the API token"
    parts.append(f"invalid (the reason is shown with {where})")
    return ": ".join(parts)


def public_manifest_errors(lines: list[str], located: list[LocatedError]) -> list[str]:
    """The manifest errors for a reader without the token: one location per problem."""
    if len(located) == len(lines):
        return [public_manifest_error(e) for e in located]
    return [
        "the manifest set is invalid (the reason is shown with the API token, and in the log)"
    ] * len(lines)


def public_blocked(serve: str, reason: str | None) -> str | None:
    """A blocked reason for a reader without the token.

    The planner's own reasons are names and figures; a serve held back by the
    controller (a failure backoff) carries the failure's text, which may quote the
    ``up`` command line: that part is withheld.
    """
    if reason is None or not reason.startswith(f"{serve} is held back"):
        return reason
    return f"{serve} is held back (the reason is shown with the API token, and in the log)"


def public_failure(text: str) -> str | None:
    """A backoff's last failure for a reader without the token: states and figures only."""
    return text if _PUBLIC_FAILURE.fullmatch(text) else None


def public_model(entry: Mapping[str, Any]) -> dict[str, Any]:
    """A model entry (a serve's ``[serve.model]`` in a read answer, its ``estimate`` and
    ``check``, or ``can_fit``'s estimate of a ``model_path``) for a reader without the
    token: figures only. The words that come from the files are withheld: a read
    error (it may quote a value of ``config.json``), why the KV cache is unknown (it
    may name the files' own values), and the check's sentence that repeats it."""
    out = dict(entry)
    if out.get("error") is not None:
        out["error"] = MODEL_TEXT_WITHHELD
    if isinstance(out.get("unknown"), list):  # the other terms' reasons are the code's
        out["unknown"] = [
            {**u, "reason": MODEL_TEXT_WITHHELD} if u.get("term") == "kv_cache" else u
            for u in out["unknown"]
            if isinstance(u, Mapping)
        ]
    if out.get("kv_cache_reason") is not None:
        out["kv_cache_reason"] = MODEL_TEXT_WITHHELD
        out["message"] = MODEL_TEXT_WITHHELD
    for key in ("estimate", "check"):
        inner = out.get(key)
        if isinstance(inner, Mapping):
            out[key] = public_model(inner)
    return out
