"""``vramctl mcp``: the agents' tools over the Model Context Protocol, on stdio.

The server is the official SDK's low-level :class:`mcp.server.lowlevel.Server`: each
tool is declared with a JSON Schema for its input and for its structured result, and
annotated truthfully (the reads: ``readOnlyHint``, idempotent, a closed world; the
writes: ``request_up`` neither read-only nor idempotent, ``release`` destructive).
One backend answers the read tools over both transports (:class:`Tools`): each
renders the one answer of a :class:`~statemachine.answers.situation.Situation`
(:mod:`controller.interfaces.host_answers`), built for the call by a :class:`ToolSource`.
Over stdio (:class:`ObservingSource`) each call loads the manifest set and observes the
host anew with the state directory's journal laid over it, as ``vramctl status`` /
``fit`` / ``plan`` do, through the command line's own helpers, handed in as a
:class:`Sources` (so this module holds no second copy of them); inside ``vramctl run``
the source is the loop's live situation (:mod:`controller.interfaces.api.agents`):

- ``reservation_status``: ``GET /v1/ledger``'s answer: per role what is held and what
  is promised beside it to requests not yet planned, the host line;
- ``serves_status``: ``GET /v1/serves``'s rows, with why the next plan blocks a serve
  and its backoff (``null`` over stdio: only the running loop knows it);
- ``can_fit``: the situation's fit (``fit --json``, ``GET /v1/fit``: the pending
  requests counted as held); for ``{"vram_mib"}`` or ``{"model_path"}`` (weights + KV
  cache from its files) with ``gpu_role`` or ``placement`` a hypothetical on-demand
  serve (:mod:`statemachine.answers.hypothetical`);
- ``plan_preview``: the plan of the situation with an edited manifest, as ``plan
  --json``; nothing is executed.

A refusal (an unknown serve, a manifest that does not load, bad arguments) is a tool
error (``isError``) whose text says what is wrong and how to fix it; an unexpected
failure is one line too, never a traceback. To a caller without the API's token (over
HTTP: :class:`Caller` ``full`` false) a refusal is a fixed wording that echoes nothing
(:attr:`ToolError.public`, :data:`PUBLIC_ERRORS`), and the answers hold no free text.
A figure that cannot be known is ``null`` with a note, never 0.

The same server is served by ``vramctl run``'s API at ``/mcp`` over Streamable HTTP
(:func:`http_transport`), its tools answering from the running controller's live view
and its writes (``request_up``, ``release``) going through the API's own routes
(:mod:`controller.interfaces.api.agents`): a :class:`Backend` gives the answers, a
:class:`Caller` says who asks (detail, writes, progress). Over stdio the writes are
listed and refused: without ``--allow-writes`` for its lack, with it because there is
no running loop to admit a request (:data:`WRITES_NEED_RUN`).

``vramctl mcp --api`` puts the stdio server in front of a running controller's
``/mcp`` (:class:`RemoteBackend`): each call is forwarded with the SDK's Streamable
HTTP client and its result passed on as it is; the writes with ``--allow-writes`` and
the API's token; when the API does not answer, the reads observe directly (with
``-m``) and say so, or a tool error says how to fix it.
"""

from __future__ import annotations

import difflib
import json
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import anyio
import httpx2
from mcp import types
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp
from mcp.server.transport_security import TransportSecuritySettings

from controller.interfaces.fit_answer import fit_answer
from controller.interfaces.host_answers import RowExtras, ledger_answer, serve_rows
from controller.interfaces.redaction import public_blocked, public_manifest_error, public_model
from controller.manifest import ManifestError, load_manifest_set
from statemachine.answers.hypothetical import HYPOTHETICAL, HypotheticalError, with_hypothetical
from statemachine.sizing.needs import KV_DTYPES, MIB

if TYPE_CHECKING:
    from controller.manifest import ManifestSet
    from controller.snapshot import SnapshotModel
    from statemachine.answers.situation import Situation
    from statemachine.domain.types import DesiredState

#: the server's name as clients list it
SERVER_NAME = "vramctl"


#: what a caller without the API's token reads in place of a refusal's words: each a
#: fixed wording that echoes nothing (not an argument, a file, nor the manifest)
WITHHELD = "the reason is shown only with the API's token (Authorization: Bearer TOKEN)"
PUBLIC_REFUSED = f"refused: {WITHHELD}"
PUBLIC_ARGUMENTS = f"the arguments do not fit the tool's input schema (tools/list): {WITHHELD}"
PUBLIC_NO_TOOL = "no such tool: tools/list names them"
PUBLIC_NO_SERVE = "no serve of that name in the manifest set: serves_status lists them"
PUBLIC_NO_ROLE = (
    "gpu_role or placement names a role the manifest set does not declare, or one that "
    "cannot hold the size asked: reservation_status lists the roles and their budgets"
)
PUBLIC_MODEL = f"model_path cannot be sized (unreadable, or its KV cache unknown): {WITHHELD}"
PUBLIC_REPLACES = (
    "replaces must name one of the manifest files (source.manifests), and is needed when "
    "the set has several"
)
PUBLIC_FAILED = f"the call failed on the server: {WITHHELD}, and in the controller's log"
NO_OBSERVATION = "no observation yet: the loop has not completed its first cycle"
ONE_EDIT = (
    "give the edit as manifest_text (the edited TOML) or manifest_path (an edited file), "
    "one of them"
)
NO_FILES = "this controller names no manifest files to edit"
#: ``plan_preview``'s ``manifest_path`` inside ``vramctl run``: only the set's own files
PATH_REFUSED = (
    "manifest_path must be one of the manifest files this controller runs from "
    "(source.manifests): no other file is read; give an edited copy as manifest_text"
)


class ToolError(Exception):
    """A refusal the agent can act on: the message says what is wrong and the fix.

    ``public``: what a caller without the API's token reads instead (one of the fixed
    wordings above; never built from the arguments, a file or the manifest)."""

    def __init__(self, message: str, public: str = PUBLIC_REFUSED) -> None:
        super().__init__(message)
        self.public = public


def manifest_refusal(exc: ManifestError, fix: str) -> ToolError:
    """A manifest set that does not load: its located errors and ``fix``; without the
    token, where each problem is without what it says (the value it quotes)."""
    located = "; ".join(str(e) for e in exc.errors)
    where = "; ".join(public_manifest_error(e, logged=False) for e in exc.errors)
    return ToolError(
        f"the manifest set does not load: {located} ({fix})",
        public=f"the manifest set does not load: {where}",
    )


@dataclass(frozen=True, slots=True)
class Sources:
    """Where each call's inputs come from (the command line's own helpers).

    ``situation(mset, notes)`` takes one observation and builds the situation the
    answers are given from (the state directory's journal laid over it, as ``status``,
    ``fit`` and ``plan`` build it), adding to ``notes`` what could not be read (it
    raises :class:`ToolError` when a saved observation does not load)."""

    manifests: tuple[Path, ...]
    situation: Callable[[ManifestSet, list[str]], tuple[SnapshotModel, Situation]]
    router_url: str | None = None
    #: the saved observation answered from (None: the live host)
    observed_file: Path | None = None


# --- schemas -----------------------------------------------------------------------

_NULLABLE_INT: dict[str, Any] = {"type": ["integer", "null"]}
_NOTES: dict[str, Any] = {
    "type": "array",
    "items": {"type": "string"},
    "description": "What could not be read or known, in words (an unknown figure is null).",
}
_SOURCE: dict[str, Any] = {
    "type": "object",
    "description": "What was answered from: the manifest files and the observation.",
    "properties": {
        "manifests": {"type": "array", "items": {"type": "string"}},
        "observed": {"type": "string", "description": "'live' or the saved file"},
        "observed_at": {"type": ["number", "null"]},
        "docker": {"type": "string", "enum": ["ok", "error", "unknown"]},
    },
}
_ROLE_LINE: dict[str, Any] = {
    "type": "object",
    "properties": {
        "gpu_role": {"type": "string"},
        "capacity_mib": {"type": "integer"},
        "reserve_mib": {"type": "integer"},
        "budget_mib": {"type": "integer"},
        "committed_mib": _NULLABLE_INT,
        "free_mib": _NULLABLE_INT,
        "reservations": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"serve": {"type": "string"}, "mib": {"type": "integer"}},
            },
        },
        "nvml_used_mib": _NULLABLE_INT,
        "drift_used_mib": _NULLABLE_INT,
        "overcommitted": {"type": ["boolean", "null"]},
    },
}

_STATUS_IN: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}
_SERVES_IN: dict[str, Any] = {
    "type": "object",
    "properties": {
        "serve": {
            "type": "string",
            "description": "Only this serve (default: every serve of the manifest set).",
        }
    },
    "additionalProperties": False,
}
_FIT_IN: dict[str, Any] = {
    "type": "object",
    "description": 'One of {"serve": NAME}; {"vram_mib": N, "gpu_role": ROLE} or '
    '{"vram_mib": N, "placement": [ROLE, ...]}; {"model_path": P, "context": N?, '
    '"kv_dtype": D?, "parallel": N?} with "gpu_role" or "placement". A size or model '
    "is asked as a new on-demand serve.",
    "properties": {
        "serve": {"type": "string", "description": "A serve the manifest set declares."},
        "vram_mib": {
            "type": "integer",
            "minimum": 1,
            "description": "MiB a new on-demand serve would reserve (with gpu_role or "
            "placement; not with serve or model_path).",
        },
        "model_path": {
            "type": "string",
            "description": "A model's files (a .gguf, a safetensors file or folder), read "
            "on the machine the server runs on; a relative path is relative to the "
            "server's working directory. The reservation asked is the model's known "
            "need, weights + KV cache, rounded up to whole MiB: the engine's overheads "
            "are not included (with gpu_role or placement; not with serve or vram_mib).",
        },
        "context": {
            "type": "integer",
            "minimum": 1,
            "description": "With model_path: tokens of context per sequence (default: "
            "the model's own).",
        },
        "kv_dtype": {
            "type": "string",
            "enum": list(KV_DTYPES),
            "description": "With model_path: how the engine stores its KV cache (default f16).",
        },
        "parallel": {
            "type": "integer",
            "minimum": 1,
            "description": "With model_path: sequences served at once, each with its own "
            "cache (default 1).",
        },
        "gpu_role": {"type": "string", "description": "The one role it would reserve on."},
        "placement": {
            "type": "array",
            "items": {"type": "string"},
            "minItems": 1,
            "description": "Candidate roles, in order: placed as a manifest serve with "
            "placement is (docs/placement.md). Not with gpu_role.",
        },
    },
    "additionalProperties": False,
}
_PLAN_IN: dict[str, Any] = {
    "type": "object",
    "description": "The edited manifest: its TOML text, or the path of an edited copy.",
    "properties": {
        "manifest_text": {
            "type": "string",
            "description": "The whole edited TOML of one manifest file of the set.",
        },
        "replaces": {
            "type": "string",
            "description": "Which file of the set manifest_text stands for (needed only "
            "when the set has several files).",
        },
        "manifest_path": {
            "type": "string",
            "description": "An edited manifest file, planned as the whole set.",
        },
    },
    "additionalProperties": False,
}

_STATUS_OUT: dict[str, Any] = {
    "type": "object",
    "properties": {
        "docker": {"type": "string", "enum": ["ok", "error", "unknown"]},
        "nvml": {"type": "string", "enum": ["ok", "unavailable", "unknown"]},
        "gpu_roles": {"type": "array", "items": _ROLE_LINE},
        "host": {"type": ["object", "null"], "description": "The host RAM line ([host])."},
        "undeclared_gpu_containers": {"type": "array", "items": {"type": "string"}},
        "no_longer_declared": {"type": "array", "items": {"type": "object"}},
        "notes": _NOTES,
        "source": _SOURCE,
    },
    "required": ["docker", "nvml", "gpu_roles", "host", "notes", "source"],
}
_SERVES_OUT: dict[str, Any] = {
    "type": "object",
    "properties": {
        "docker": {"type": "string", "enum": ["ok", "error", "unknown"]},
        "serves": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "serve": {"type": "string"},
                    "residency": {"type": ["string", "null"]},
                    "desired": {"type": ["string", "null"]},
                    "lifecycle": {"type": "string"},
                    "state": {"type": "string"},
                    "health": {"type": ["string", "null"]},
                    "reservation_mib": _NULLABLE_INT,
                    "held_mib": _NULLABLE_INT,
                    "desired_by": {"type": ["string", "null"]},
                    "request_ends_at": {"type": ["number", "null"]},
                    "backoff": {"type": ["object", "null"]},
                    "blocked": {
                        "type": ["object", "string", "null"],
                        "description": "the plan's blocked entry (a running controller: "
                        "its reason, as GET /v1/serves)",
                    },
                },
            },
        },
        "notes": _NOTES,
        "source": _SOURCE,
    },
    "required": ["docker", "serves", "notes", "source"],
}
_FIT_OUT: dict[str, Any] = {
    "type": "object",
    "properties": {
        "serve": {"type": "string"},
        "fits": {"type": ["boolean", "null"], "description": "null: it cannot be answered"},
        "reason": {"type": "string"},
        "gpu_roles": {"type": "array", "items": {"type": "object"}},
        "drain": {"type": "array", "items": {"type": "string"}},
        "evict": {"type": "array", "items": {"type": "string"}},
        "shrink": {"type": "array", "items": {"type": "object"}},
        "sleep": {"type": "array", "items": {"type": "string"}},
        "blockers": {"type": "array", "items": {"type": "string"}},
        "protected": {"type": "array", "items": {"type": "object"}},
        "hypothetical": {"type": "boolean"},
        "placement": {
            "type": "object",
            "description": "For a placed serve: the card chosen, why, every candidate.",
        },
        "estimate": {
            "type": "object",
            "description": "For model_path: the model's known need (weights + KV cache), "
            "its formula and the unknown terms by name.",
        },
        "notes": _NOTES,
        "source": _SOURCE,
    },
    "required": ["serve", "fits", "reason", "gpu_roles", "drain", "evict", "notes", "source"],
}
_PLAN_OUT: dict[str, Any] = {
    "type": "object",
    "properties": {
        "steps": {"type": "array", "items": {"type": "object"}},
        "blocked": {"type": "array", "items": {"type": "object"}},
        "ledger_before": {"type": "object"},
        "ledger_after": {"type": "object"},
        "notes": _NOTES,
        "manifest_digest": {"type": "string"},
        "executed": {"type": "boolean", "const": False},
        "known": {"type": "boolean", "description": "false: docker unread, plan unknown"},
        "source": _SOURCE,
    },
    "required": ["steps", "blocked", "ledger_after", "notes", "executed", "known", "source"],
}

_READ_ONLY = types.ToolAnnotations(
    read_only_hint=True, destructive_hint=False, idempotent_hint=True, open_world_hint=False
)


def _writes(*, destructive: bool, idempotent: bool) -> types.ToolAnnotations:
    """The hints of a tool that asks the controller for a change (on this host only)."""
    return types.ToolAnnotations(
        read_only_hint=False,
        destructive_hint=destructive,
        idempotent_hint=idempotent,
        open_world_hint=False,
    )


def _tool(
    name: str,
    title: str,
    description: str,
    schema_in: Any,
    schema_out: Any,
    hints: types.ToolAnnotations = _READ_ONLY,
) -> types.Tool:
    """One tool; its annotations are ``hints`` (read-only by default) under its title."""
    return types.Tool(
        name=name,
        title=title,
        description=description,
        input_schema=schema_in,
        output_schema=schema_out,
        annotations=hints.model_copy(update={"title": title}),
    )


TOOLS: tuple[types.Tool, ...] = (
    _tool(
        "reservation_status",
        "GPU reservations",
        "Per GPU role: capacity, reserve, budget (capacity - reserve), committed (each "
        "serve's reservation), free, NVML used and drift (null when unknown), whether "
        "it is overcommitted; and the host RAM line. The answer of `vramctl status`.",
        _STATUS_IN,
        _STATUS_OUT,
    ),
    _tool(
        "serves_status",
        "Serves",
        "Per serve: residency, desired, lifecycle, container state, health, reserved "
        "MiB, its on-demand request and when it ends, backoff, and why it is blocked "
        "(what the loop would do now cannot happen, with every term).",
        _SERVES_IN,
        _SERVES_OUT,
    ),
    _tool(
        "can_fit",
        "Can it fit?",
        'Can {"serve": NAME} start now, or would a new on-demand serve of '
        '{"vram_mib": N} or of a model\'s files {"model_path": P} fit on {"gpu_role": R} '
        'or placed among {"placement": [R, ...]}: where, who would be drained, evicted, '
        "put to sleep or shrunk, and every term of the arithmetic. The answer of "
        "`vramctl fit --json`. Nothing is started.",
        _FIT_IN,
        _FIT_OUT,
    ),
    _tool(
        "plan_preview",
        "Plan preview",
        "The plan an edited manifest would cause on this host now (the steps in order, "
        "what is blocked and why, the ledger after), as `vramctl plan --json`. Nothing "
        "is executed and no file is changed.",
        _PLAN_IN,
        _PLAN_OUT,
    ),
)


_UP_IN: dict[str, Any] = {
    "type": "object",
    "properties": {
        "serve": {"type": "string", "description": "An on-demand serve of the manifest set."},
        "ttl_s": {
            "type": "number",
            "exclusiveMinimum": 0,
            "description": "Seconds the request lasts (default: the serve's idle_ttl_s).",
        },
        "wait_s": {
            "type": "number",
            "minimum": 0,
            "description": "Wait up to this many seconds for the serve to be ready, "
            "with progress notifications (default: answer at once).",
        },
    },
    "required": ["serve"],
    "additionalProperties": False,
}
_RELEASE_IN: dict[str, Any] = {
    "type": "object",
    "properties": {"serve": {"type": "string", "description": "The serve to release."}},
    "required": ["serve"],
    "additionalProperties": False,
}
_WRITE_OUT: dict[str, Any] = {
    "type": "object",
    "description": "The API's answer (POST /v1/serves/{serve}/up or /down), as it is.",
    "properties": {"status": {"type": "integer"}},
    "required": ["status"],
}

WRITE_TOOLS: tuple[types.Tool, ...] = (
    _tool(
        "request_up",
        "Request a serve",
        "Ask the running controller for an on-demand serve, as `vramctl up` / "
        "POST /v1/serves/{serve}/up: admitted (the steps it implies: who is drained, "
        "evicted), or refused with every term of the arithmetic. With wait_s, waits "
        "for it to be ready, with progress notifications. Needs the API's token.",
        _UP_IN,
        _WRITE_OUT,
        _writes(destructive=False, idempotent=False),
    ),
    _tool(
        "release",
        "Release a serve",
        "End a serve's on-demand request, as `vramctl down` / POST "
        "/v1/serves/{serve}/down: the loop stops it unless the manifest wants it "
        "running. Needs the API's token.",
        _RELEASE_IN,
        _WRITE_OUT,
        _writes(destructive=True, idempotent=True),
    ),
)

#: every tool the server lists: the reads, then the writes
ALL_TOOLS: tuple[types.Tool, ...] = TOOLS + WRITE_TOOLS


def check_tool_arguments(name: str, arguments: Mapping[str, Any]) -> None:
    """Refuse an unknown tool, or arguments its input schema does not allow."""
    tool = next((t for t in ALL_TOOLS if t.name == name), None)
    if tool is None:
        names = {t.name: t for t in ALL_TOOLS}
        raise ToolError(f"no tool {name!r}{_did_you_mean(name, names)}", PUBLIC_NO_TOOL)
    _check_arguments(name, tool.input_schema, arguments)
    for key in tool.input_schema.get("required", []):
        if key not in arguments:
            raise ToolError(f"{name}: {key} is missing", PUBLIC_ARGUMENTS)


# --- the tools ---------------------------------------------------------------------


_ASK = (
    'ask {"serve": NAME}, or {"vram_mib": N} or {"model_path": P} with "gpu_role": ROLE '
    'or "placement": [ROLE, ...]'
)
#: a question ``can_fit`` cannot ask, as a caller without the token reads it
PUBLIC_QUESTION = f"can_fit: {_ASK}"
#: every wording a caller without the token may read for a refusal of a read tool
#: (beside them, only a manifest that does not load: where, without what it says)
PUBLIC_ERRORS = frozenset(
    {
        PUBLIC_REFUSED,
        PUBLIC_ARGUMENTS,
        PUBLIC_NO_TOOL,
        PUBLIC_NO_SERVE,
        PUBLIC_NO_ROLE,
        PUBLIC_MODEL,
        PUBLIC_REPLACES,
        PUBLIC_FAILED,
        PUBLIC_QUESTION,
        NO_OBSERVATION,
        ONE_EDIT,
        NO_FILES,
        PATH_REFUSED,
    }
)
_SIZING_KEYS = ("context", "kv_dtype", "parallel")
OVERHEADS_NOTE = (
    "the reservation asked is the model's known need, weights + KV cache: the engine's "
    "overheads (CUDA context, activations, graphs) are not included; measure them with "
    "`vramctl calibrate`"
)


def fit_reply(
    body: dict[str, Any],
    known: bool,
    serve: str | None,
    estimate: dict[str, Any] | None,
    notes: list[str],
    source: dict[str, Any],
) -> dict[str, Any]:
    """``can_fit``'s answer around a fit answer's JSON, for either backend: whether it
    asks of a hypothetical serve, the model's estimate, and the notes (a fit docker
    could not answer; the overheads a model's estimate leaves out)."""
    if not known:
        notes.append("fits is null: it cannot be answered without docker")
    if estimate is not None:
        notes.append(OVERHEADS_NOTE)
    return {
        **body,
        "hypothetical": serve is None,
        **({} if estimate is None else {"estimate": estimate}),
        "notes": notes,
        "source": source,
    }


def _public_fit(
    name: str, body: dict[str, Any], estimate: dict[str, Any] | None
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """``can_fit``'s answer for a caller without the token: a held serve's reason (its
    failure's text) and what model files say withheld, the ``model_path`` not echoed."""
    out = {**body, "reason": public_blocked(name, body.get("reason"))}
    if isinstance(out.get("model"), Mapping):
        out["model"] = public_model(out["model"])
    if estimate is not None:
        estimate = {k: v for k, v in public_model(estimate).items() if k != "model"}
    return out, estimate


def _model_vram(args: Mapping[str, Any]) -> tuple[int, dict[str, Any]]:
    """The MiB ``model_path`` needs at least (weights + KV cache, rounded up) and the
    ``estimate`` object that says so; :class:`ToolError` naming the file when it cannot
    be read, or when its KV cache is unknown."""
    from controller.manifest.runtime import ModelRef
    from controller.service.model_estimates import ModelUnreadable, serve_estimate

    kv_dtype = args.get("kv_dtype", "f16")
    if kv_dtype not in KV_DTYPES:
        raise ToolError(
            f"kv_dtype must be one of {', '.join(KV_DTYPES)}, not {kv_dtype!r}", PUBLIC_ARGUMENTS
        )
    path = Path(str(args["model_path"])).expanduser()
    ref = ModelRef(
        path=(path if path.is_absolute() else Path.cwd() / path).resolve(),
        context=args.get("context"),
        kv_dtype=kv_dtype,
        parallel=args.get("parallel") or 1,
    )
    est = serve_estimate(ref)
    if isinstance(est, ModelUnreadable):
        raise ToolError(f"model_path cannot be read: {est.message}", PUBLIC_MODEL)
    need = est.at_least_bytes
    if need is None:
        why = f"{ref.path}: its KV cache is unknown ({est.kv.reason}); ask with vram_mib"
        raise ToolError(why, PUBLIC_MODEL)
    mib = max(1, -(-need // MIB))
    return mib, {
        "model": str(ref.path),
        "format": est.format,
        "weights_bytes": est.weights.bytes,
        "kv_cache_bytes": est.kv.bytes,
        "at_least_bytes": need,
        "vram_mib": mib,
        "context": est.context,
        "context_source": est.context_source,
        "kv_dtype": est.kv_dtype,
        "parallel": est.parallel,
        "formula": est.kv.formula,
        "unknown": est.unknown(),
        "note": OVERHEADS_NOTE,
    }


def fit_question(
    desired: DesiredState, args: Mapping[str, Any]
) -> tuple[DesiredState, str, dict[str, Any] | None]:
    """``can_fit``'s question: the desired state to answer on, the serve to answer for,
    and the model estimate a ``model_path`` was sized by (shared by ``vramctl mcp`` and
    the controller's ``/mcp``). :class:`ToolError` for a question that cannot be asked."""
    given = [k for k in ("serve", "vram_mib", "model_path") if args.get(k) is not None]
    if len(given) != 1:
        said = "both " + " and ".join(given) if given else "neither"
        raise ToolError(f"{_ASK}; not {said}", PUBLIC_QUESTION)
    role, cands = args.get("gpu_role"), args.get("placement")
    sizing_args = [k for k in _SIZING_KEYS if args.get(k) is not None]
    if args.get("serve") is not None:
        extra = [k for k in ("gpu_role", "placement", *sizing_args) if args.get(k) is not None]
        if extra:
            why = f'{{"serve": NAME}} is asked alone, not with {", ".join(extra)}'
            raise ToolError(why, PUBLIC_QUESTION)
        serve = str(args["serve"])
        if serve not in desired.serves:
            raise ToolError(unknown_serve_message(serve, desired), PUBLIC_NO_SERVE)
        return desired, serve, None
    if role is None and cands is None:
        raise ToolError(f"gpu_role or placement is missing: {_ASK}", PUBLIC_QUESTION)
    if role is not None and cands is not None:
        raise ToolError("ask with exactly one of gpu_role or placement, not both", PUBLIC_QUESTION)
    if cands is not None and not all(isinstance(c, str) for c in cands):
        why = f"placement must be a list of role names, not {json.dumps(cands)}"
        raise ToolError(why, PUBLIC_ARGUMENTS)
    estimate: dict[str, Any] | None = None
    if args.get("model_path") is not None:
        mib, estimate = _model_vram(args)
    else:
        if sizing_args:
            raise ToolError(f"{', '.join(sizing_args)}: only with model_path", PUBLIC_QUESTION)
        mib = args["vram_mib"]
    try:
        desired = with_hypothetical(
            desired, mib, role, placement=None if cands is None else list(cands)
        )
    except HypotheticalError as exc:
        raise ToolError(str(exc), PUBLIC_NO_ROLE) from None
    return desired, HYPOTHETICAL, estimate


@dataclass(frozen=True, slots=True)
class Asked:
    """What one call is answered from: the situation, what the source knows beside it,
    where it came from and what could not be read."""

    sit: Situation
    extras: RowExtras
    #: what was answered from (the manifest files, the observation, its time)
    source: dict[str, Any]
    #: what could not be read or known, in words
    notes: list[str]
    #: whether any observation was taken (the loop, before its first cycle: none)
    observed: bool = True
    #: the digest of the manifest set in force (an edit that keeps it changes nothing)
    digest: str = ""
    #: why NVML could not be read, where the source says (``None``: it does not)
    nvml_error: str | None = None


class ToolSource(Protocol):
    """Where the read tools' inputs come from: one observation with the state
    directory's journal (``vramctl mcp``: :class:`ObservingSource`), or the running
    controller's live situation (``/mcp`` in ``vramctl run``: the API's source)."""

    #: whether ``plan_preview``'s ``manifest_path`` may name any file (over stdio: the
    #: local user's own) or only one of :meth:`files` (a server others reach)
    any_file: bool

    def ask(self, edit: ManifestSet | None = None, *, full: bool = True) -> Asked:
        """The inputs of one call; ``edit``: an edited manifest set to answer for (the
        host and the requests as they are). :class:`ToolError` when none can be had."""
        ...

    def files(self) -> tuple[Path, ...]:
        """The manifest files in force (an edit replaces one of them)."""
        ...

    def load(self, paths: tuple[Path, ...]) -> ManifestSet:
        """An edited manifest set; :class:`ToolError` saying what does not load."""
        ...


class Tools:
    """The read tools' answers, the same over stdio and over HTTP: each renders the one
    answer (:mod:`controller.interfaces.host_answers`, the situation's own) of the inputs
    its :class:`ToolSource` gives for the call."""

    def __init__(self, source: ToolSource) -> None:
        self.source = source
        self.handlers: dict[str, Callable[[dict[str, Any], bool], dict[str, Any]]] = {
            "reservation_status": self.reservation_status,
            "serves_status": self.serves_status,
            "can_fit": self.can_fit,
            "plan_preview": self.plan_preview,
        }

    def call(self, name: str, arguments: Mapping[str, Any], *, full: bool = True) -> dict[str, Any]:
        """The answer of tool ``name`` (``full``: the caller may see free text);
        :class:`ToolError` for a refusal."""
        handler = self.handlers.get(name)
        if handler is None:
            raise ToolError(f"no tool {name!r}{_did_you_mean(name, self.handlers)}", PUBLIC_NO_TOOL)
        tool = next(t for t in TOOLS if t.name == name)
        _check_arguments(name, tool.input_schema, arguments)
        return handler(dict(arguments), full)

    # tools ----------------------------------------------------------------------

    def reservation_status(self, _args: dict[str, Any], full: bool) -> dict[str, Any]:
        """Per role: what is held and what is promised beside it, NVML figures and
        drift; the host RAM line (``GET /v1/ledger``'s answer)."""
        asked = self.source.ask(full=full)
        answer = ledger_answer(asked.sit, observed=asked.observed)
        notes = list(asked.notes)
        if asked.observed and asked.sit.observed.gpus is None:
            why = asked.nvml_error or "no device readings in the observation"
            notes.append(f"nvml unavailable ({why}): NVML used and drift are null (unknown)")
        return {**answer, "notes": notes, "source": asked.source}

    def serves_status(self, args: dict[str, Any], full: bool) -> dict[str, Any]:
        """Per serve: its state, reservation, request, backoff and why the next plan
        blocks it (``GET /v1/serves``'s rows; one serve's with ``serve``)."""
        asked = self.source.ask(full=full)
        only = args.get("serve")
        if only is not None and only not in asked.sit.desired.serves:
            raise ToolError(unknown_serve_message(only, asked.sit.desired), PUBLIC_NO_SERVE)
        docker, rows = serve_rows(
            asked.sit, asked.extras, full=full, only=only, observed=asked.observed
        )
        notes = list(asked.notes)
        if asked.extras.backoff is None:
            notes.append(
                "backoff is known only to the running controller (`vramctl run`): null "
                "here (`vramctl mcp --api` answers from it)"
            )
        return {"docker": docker, "serves": rows, "notes": notes, "source": asked.source}

    def can_fit(self, args: dict[str, Any], full: bool) -> dict[str, Any]:
        """Can a serve (or N MiB, or a model's files, on a role or placed) start now, and
        what would it cost (``GET /v1/fit``'s answer: the pending requests held)."""
        asked = self.source.ask(full=full)
        desired, name, estimate = fit_question(asked.sit.desired, args)
        if not asked.observed:
            raise ToolError(NO_OBSERVATION, NO_OBSERVATION)
        serve = None if name == HYPOTHETICAL else name
        model = asked.extras.models.get(serve) if serve is not None else None
        answer = fit_answer(asked.sit.with_desired(desired), name, model=model)
        body = answer.to_json()
        if not full:  # free text withheld, as GET /v1/fit and /v1/serves withhold it
            body, estimate = _public_fit(name, body, estimate)
        return fit_reply(
            body, answer.result.known, serve, estimate, list(asked.notes), asked.source
        )

    def plan_preview(self, args: dict[str, Any], full: bool) -> dict[str, Any]:
        """The plan an edited manifest would cause now; nothing executed."""
        text, path = args.get("manifest_text"), args.get("manifest_path")
        if (text is None) == (path is None):
            raise ToolError(ONE_EDIT, ONE_EDIT)
        files = list(self.source.files())
        if not files:
            raise ToolError(NO_FILES, NO_FILES)
        if path is not None:
            return self._preview(self._at_path(files, str(path)), full)
        target = self._replaced(files, args.get("replaces"))
        with tempfile.TemporaryDirectory(prefix="vramctl-mcp-") as tmp:
            edited = Path(tmp) / target.name
            edited.write_text(str(text), encoding="utf-8")
            mset = self.source.load(tuple(edited if f == target else f for f in files))
            return self._preview(mset, full)

    def _at_path(self, files: list[Path], path: str) -> ManifestSet:
        """The set ``manifest_path`` asks for. Inside ``vramctl run`` only a file of the
        set is read (the set as it is on disk now); any other path is refused before it
        is opened (:data:`PATH_REFUSED`). Over stdio (the local user's own files), an
        edited copy anywhere, planned as the whole set."""
        given = Path(path).expanduser()
        if not self.source.any_file:
            if given.resolve() not in {f.resolve() for f in files}:
                raise ToolError(PATH_REFUSED, PATH_REFUSED)
            return self.source.load(tuple(files))
        if not given.is_file():
            raise ToolError(f"{path}: no such file (give the edited manifest's path)")
        return self.source.load((given,))

    @staticmethod
    def _replaced(files: list[Path], replaces: Any) -> Path:
        if replaces is None:
            if len(files) != 1:
                names = ", ".join(str(f) for f in files)
                raise ToolError(
                    f"the manifest set has {len(files)} files ({names}): say which one "
                    "manifest_text replaces with replaces=FILE",
                    PUBLIC_REPLACES,
                )
            return files[0]
        wanted = Path(str(replaces)).expanduser().resolve()
        for f in files:
            if Path(f).resolve() == wanted or Path(f).name == str(replaces):
                return f
        names = ", ".join(str(f) for f in files)
        why = f"{replaces} is not a file of the manifest set ({names})"
        raise ToolError(why, PUBLIC_REPLACES)

    def _preview(self, mset: ManifestSet, full: bool) -> dict[str, Any]:
        asked = self.source.ask(mset, full=full)
        notes = [f"manifest: {w}" for w in mset.warnings]
        if not full and notes:  # a warning quotes the file's values
            notes = [f"manifest: {len(notes)} warning(s): {WITHHELD}"]
        known = asked.sit.observed.docker_ok
        if not known:
            notes.append("the plan is unknown, not empty (known: false): docker was not read")
        if mset.digest == asked.digest:
            notes.append("the edit changes nothing the controller reads: this is today's plan")
        data = asked.sit.plan.to_json()
        if not full:  # a held serve's reason withheld, as GET /v1/plans withholds it
            data["blocked"] = [
                {**b, "reason": public_blocked(str(b["serve"]), b.get("reason"))}
                for b in data["blocked"]
            ]
        plan_notes = data.pop("notes", [])
        return {
            **data,
            "known": known,
            "notes": [*plan_notes, *notes, *asked.notes],
            "manifest_digest": mset.digest,
            "executed": False,
            "source": asked.source,
        }


class ObservingSource:
    """``vramctl mcp``'s inputs: each call loads the manifest set and observes the host
    (or reads the saved observation) with the state directory's journal, through the
    command line's own helpers (:class:`Sources`)."""

    any_file = True

    def __init__(self, sources: Sources) -> None:
        self.sources = sources

    def files(self) -> tuple[Path, ...]:
        return tuple(self._load().files)

    def load(self, paths: tuple[Path, ...]) -> ManifestSet:
        return self._load(paths)

    def _load(self, paths: tuple[Path, ...] | None = None) -> ManifestSet:
        try:
            return load_manifest_set(list(paths or self.sources.manifests))
        except ManifestError as exc:
            fix = "fix the file, then ask again; `vramctl validate -m FILE` says the same"
            raise manifest_refusal(exc, fix) from None

    def ask(self, edit: ManifestSet | None = None, *, full: bool = True) -> Asked:
        current = self._load()
        mset = edit or current
        notes: list[str] = [] if edit is not None else [f"manifest: {w}" for w in mset.warnings]
        snap, sit = self.sources.situation(mset, notes)
        if not sit.observed.docker_ok:
            why = snap.docker_error or "no reason recorded"
            said = any(why in note for note in notes)  # a live observation said it
            notes.append(
                "docker could not be read" + ("" if said else f" ({why})") + ": what "
                "depends on the containers is unknown (null), and nothing would be admitted"
            )
        from controller.service.model_estimates import serve_models

        observed = self.sources.observed_file
        return Asked(
            sit,
            RowExtras(models=serve_models(mset)),
            {
                "manifests": [str(f) for f in mset.files],
                "observed": "live" if observed is None else str(observed),
                "observed_at": snap.taken_at_epoch(),
                "docker": "ok" if sit.observed.docker_ok else "error",
            },
            notes,
            digest=current.digest,
            nvml_error=snap.nvml_error,
        )


def _now(snap: SnapshotModel) -> float:
    taken = snap.taken_at_epoch()
    return taken if taken is not None else time.time()


def _did_you_mean(name: str, names: Mapping[str, Any]) -> str:
    close = difflib.get_close_matches(name, list(names), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def unknown_serve_message(name: str, desired: DesiredState) -> str:
    """The command line's message for an unknown serve, with the fix."""
    from controller.interfaces.render import unknown_serve

    names = ", ".join(desired.serves)
    return f"{unknown_serve(name, desired)}; the serves are: {names}"


_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "object": (dict,),
    "array": (list,),
}


def _check_arguments(tool: str, schema: Mapping[str, Any], arguments: Mapping[str, Any]) -> None:
    """Refuse arguments the tool's input schema does not allow (the SDK's low-level
    server passes them through unchecked)."""
    properties: Mapping[str, Any] = schema.get("properties", {})
    for key, value in arguments.items():
        if key not in properties:
            known = ", ".join(properties) or "none"
            raise ToolError(
                f"{tool} takes no argument {key!r}{_did_you_mean(key, properties)} "
                f"(its arguments: {known})",
                PUBLIC_ARGUMENTS,
            )
        want = properties[key].get("type")
        ok = isinstance(value, _JSON_TYPES.get(want, (object,))) and not isinstance(value, bool)
        if not ok:
            why = f"{tool}: {key} must be a JSON {want}, not {json.dumps(value)}"
            raise ToolError(why, PUBLIC_ARGUMENTS)
        minimum = properties[key].get("minimum")
        if minimum is not None and value < minimum:
            why = f"{tool}: {key} must be at least {minimum}, not {value}"
            raise ToolError(why, PUBLIC_ARGUMENTS)
        above = properties[key].get("exclusiveMinimum")
        if above is not None and value <= above:
            why = f"{tool}: {key} must be more than {above}, not {value}"
            raise ToolError(why, PUBLIC_ARGUMENTS)


# --- the server --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Caller:
    """Who asks, as the transport knows it.

    ``full``: the answer may hold free text (a failed start's command line and
    output); ``may_write``: the write tools are allowed (``why_not``: the refusal's
    words otherwise); ``progress``: sends a progress notification for this call
    (``None``: the client asked for none)."""

    full: bool
    may_write: bool
    why_not: str = ""
    progress: Callable[[float, float | None, str | None], Awaitable[None]] | None = None
    #: the transport's own request (over HTTP: the one that carried the call)
    request: Any = None


class Backend(Protocol):
    """Where the tools' answers come from: a fresh observation (:class:`Tools`), a
    running controller's live view (the API's, inside ``vramctl run``), or that
    controller's ``/mcp`` asked from afar (:class:`RemoteBackend`)."""

    async def answer(
        self, name: str, arguments: Mapping[str, Any], caller: Caller
    ) -> dict[str, Any] | types.CallToolResult:
        """The answer of tool ``name`` (a whole result: passed on as it is);
        :class:`ToolError` for a refusal."""
        ...


class ObservingBackend:
    """:class:`Tools` off the event loop (observing reads Docker, NVML, health)."""

    def __init__(self, sources: Sources) -> None:
        self.tools = Tools(ObservingSource(sources))

    async def answer(
        self, name: str, arguments: Mapping[str, Any], caller: Caller
    ) -> dict[str, Any]:
        if name in {t.name for t in WRITE_TOOLS}:
            check_tool_arguments(name, arguments)
            if not caller.may_write:
                raise ToolError(caller.why_not)
            raise ToolError(WRITES_NEED_RUN)
        return await anyio.to_thread.run_sync(self.tools.call, name, arguments)


#: what a write over stdio answers: the writes go through a running controller
WRITES_NEED_RUN = (
    "the writes need a running controller: `vramctl mcp` observes the host and has no "
    "loop to admit a request; connect the agent to `vramctl run`'s API at /mcp "
    "(Streamable HTTP, with its bearer token; docs/agents.md), or start `vramctl mcp "
    "--api HOST:PORT --allow-writes` with its token, or run `vramctl up` / `vramctl down`"
)


def build_server(
    backend: Backend | Sources,
    caller_of: Callable[[ServerRequestContext[Any]], Caller] | None = None,
) -> Server[Any]:
    """The MCP server answering :data:`TOOLS` from ``backend``.

    ``caller_of``: who asks, from the request's context (default: full detail, no
    writes, as the local user of ``vramctl mcp``)."""
    answers: Backend = ObservingBackend(backend) if isinstance(backend, Sources) else backend
    who = caller_of or (lambda _ctx: Caller(full=True, may_write=False, why_not=NO_WRITES))

    async def list_tools(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=list(ALL_TOOLS))

    async def call_tool(
        ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        arguments = params.arguments or {}
        caller = who(ctx)
        # a no-op unless the client asked for progress (its request's progress token)
        caller = replace(caller, progress=ctx.session.report_progress)
        try:
            answer = await answers.answer(params.name, arguments, caller)
            if isinstance(answer, types.CallToolResult):
                return answer  # a remote server's, as it is
        except ToolError as exc:  # without the token: a fixed wording, nothing echoed
            return _error(str(exc) if caller.full else exc.public)
        except Exception as exc:  # one line for the agent, never a traceback
            print(f"vramctl mcp: {params.name}: {type(exc).__name__}: {exc}", file=sys.stderr)
            if not caller.full:
                return _error(PUBLIC_FAILED)
            return _error(
                f"{params.name} failed: {type(exc).__name__}: {exc} (the server's stderr "
                "has the same line; ask again, or run the matching vramctl command)"
            )
        text = json.dumps(answer, indent=2)
        return types.CallToolResult(
            content=[types.TextContent(text=text)], structured_content=answer
        )

    return Server(
        SERVER_NAME,
        version=_version(),
        instructions=(
            "vramctl keeps GPU memory a declared budget. Ask reservation_status for the "
            "ledger, serves_status for each serve, can_fit before asking for a serve, "
            "plan_preview before editing the manifest; request_up and release (writes) "
            "need the API's token inside `vramctl run`. A null figure is unknown, never 0."
        ),
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


#: why a write is refused over stdio without --allow-writes
NO_WRITES = (
    "writes are off: this `vramctl mcp` was started without --allow-writes (and even "
    "with it, writes need a running controller: `vramctl run`'s API at /mcp)"
)


#: an ASGI application (scope, receive, send): the SDK's endpoint of ``/mcp``
Asgi = Callable[[Any, Any, Any], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class HttpTransport:
    """The server over Streamable HTTP, for the API to serve at ``/mcp`` (behind its
    guards and its bounds on sessions: :mod:`controller.interfaces.api.mcp_sessions`)."""

    #: the SDK's endpoint (its session manager: each session's transport and task)
    app: Asgi
    #: the session manager's run (entered by the API's lifespan)
    run: Callable[[], AbstractAsyncContextManager[None]]
    #: ends every open session (before the HTTP server stops: it waits for their streams)
    close_sessions: Callable[[], Awaitable[None]]
    #: the ids of the sessions the manager holds now
    open_sessions: Callable[[], frozenset[str]]
    #: ends one session (its id then answers 404, as after the client's DELETE)
    end_session: Callable[[str], Awaitable[None]]


def http_transport(
    backend: Backend,
    caller_of: Callable[[ServerRequestContext[Any]], Caller],
    *,
    allowed_hosts: list[str] | None,
    allowed_origins: list[str],
    max_sessions: int,
) -> HttpTransport:
    """The server over Streamable HTTP, for the API to serve at ``/mcp``.

    ``allowed_hosts``: the Host values accepted (the SDK's DNS-rebinding protection;
    ``None``: not checked here, the API bound off loopback on purpose);
    ``allowed_origins``: the Origin values accepted (the API's ``--allow-origin``);
    ``max_sessions``: the sessions the SDK holds at once (past it, a new one is 503).
    """
    server = build_server(backend, caller_of)
    security = TransportSecuritySettings(
        enable_dns_rebinding_protection=allowed_hosts is not None,
        allowed_hosts=list(allowed_hosts or []),
        allowed_origins=list(allowed_origins),
    )

    def sdk_app() -> Any:
        return server.streamable_http_app(
            streamable_http_path="/mcp", transport_security=security, max_sessions=max_sessions
        )

    (route,) = sdk_app().routes  # the SDK's one route, without auth: StreamableHTTPASGIApp
    endpoint = getattr(route, "endpoint", None)
    assert isinstance(endpoint, StreamableHTTPASGIApp)

    @asynccontextmanager
    async def run() -> AsyncIterator[None]:
        # a session manager runs once, and the app's lifespan may run more than once (a
        # test client per test): each run gets a fresh one, behind the same route
        sdk_app()  # built for its session manager, now the server's
        endpoint.session_manager = server.session_manager
        async with endpoint.session_manager.run():
            yield

    def transports() -> dict[str, Any]:
        # the SDK keeps its transports private; ending one ends its open streams (a
        # client's GET), which the HTTP server would otherwise wait for, then cut
        found: dict[str, Any] = getattr(endpoint.session_manager, "_server_instances", {})
        return found

    async def close_sessions() -> None:
        for transport in list(transports().values()):
            await transport.terminate()

    async def end_session(sid: str) -> None:
        transport = transports().get(sid)
        if transport is not None:  # its task then forgets it (as after a DELETE)
            await transport.terminate()

    return HttpTransport(
        endpoint, run, close_sessions, lambda: frozenset(transports()), end_session
    )


def _error(message: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(text=message)], is_error=True)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("vramctl")
    except PackageNotFoundError:
        return "0"


def run_stdio(
    sources: Sources | None,
    *,
    allow_writes: bool = False,
    api: str | None = None,
    token: str | None = None,
) -> None:
    """Serve over stdin / stdout until the client closes them.

    Without ``api``: each call observes (``sources``); ``allow_writes``: the write
    tools are not refused for the flag's lack, but for the lack of a running
    controller (:data:`WRITES_NEED_RUN`). With ``api`` (the base URL of ``vramctl
    run``'s API): each call is forwarded to its ``/mcp`` (:class:`RemoteBackend`),
    the writes only with ``allow_writes`` and a ``token``; ``sources`` (None: none
    given) answers the reads when the API does not."""
    backend: Backend | Sources
    if api is None:
        if sources is None:
            raise ValueError("run_stdio: sources or api is needed")
        caller = Caller(full=True, may_write=allow_writes, why_not=NO_WRITES)
        backend = sources
    else:
        why_not = NO_WRITES_API if not allow_writes else NO_TOKEN_API
        caller = Caller(full=True, may_write=allow_writes and token is not None, why_not=why_not)
        fallback = None if sources is None else ObservingBackend(sources)
        backend = RemoteBackend(api, token, fallback)
    server = build_server(backend, lambda _ctx: caller)

    async def main() -> None:
        async with stdio_server() as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())

    anyio.run(main)


# --- vramctl mcp --api: the stdio server in front of a running controller's /mcp ------

#: why a write is refused over stdio with --api but without --allow-writes
NO_WRITES_API = (
    "writes are off: this `vramctl mcp --api` was started without --allow-writes "
    "(start it with --allow-writes and the API's token: --token-file FILE or "
    "VRAMCTL_TOKEN)"
)
#: why a write is refused over stdio with --api and --allow-writes but no token
NO_TOKEN_API = (
    "writes need the API's token: start `vramctl mcp --api` with --token-file FILE or "
    "VRAMCTL_TOKEN set (the token `vramctl run` was given)"
)
#: seconds to connect to the API, and to wait for an answer beyond a call's wait_s
_REMOTE_TIMEOUT_S = 30.0


class ApiUnreachable(Exception):  # noqa: N818 (reads as what happened)
    """Nothing answers at the API's address (the message: what was tried)."""


class RemoteBackend:
    """Each call forwarded to ``vramctl run``'s ``/mcp`` (the SDK's Streamable HTTP
    client, one session a call, with the bearer token), its result passed on as it is
    and the progress it reports relayed; when the API does not answer, a read is
    observed directly by ``fallback`` (None: a tool error that says how to fix it)."""

    def __init__(self, base_url: str, token: str | None, fallback: Backend | None) -> None:
        self.url = f"{base_url.rstrip('/')}/mcp"
        self.token = token
        self.fallback = fallback

    async def answer(
        self, name: str, arguments: Mapping[str, Any], caller: Caller
    ) -> dict[str, Any] | types.CallToolResult:
        write = name in {t.name for t in WRITE_TOOLS}
        if write and not caller.may_write:
            check_tool_arguments(name, arguments)
            raise ToolError(caller.why_not)
        try:
            return await self._forward(name, arguments, caller)
        except ApiUnreachable as exc:
            if write or self.fallback is None:
                raise ToolError(self._unreachable(str(exc), write)) from None
            answer = await self.fallback.answer(name, arguments, caller)
            if isinstance(answer, dict):
                answer = self._observed_instead(answer, str(exc))
            return answer

    async def _forward(
        self, name: str, arguments: Mapping[str, Any], caller: Caller
    ) -> types.CallToolResult:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        wait = arguments.get("wait_s")
        waits = float(wait) if isinstance(wait, int | float) and wait > 0 else 0.0
        timeout = httpx2.Timeout(_REMOTE_TIMEOUT_S, read=_REMOTE_TIMEOUT_S + waits)
        report = caller.progress

        async def relay(progress: float, total: float | None, message: str | None) -> None:
            if report is not None:  # a no-op unless the stdio client asked for progress
                await report(progress, total, message)

        connected = False
        try:
            async with (
                httpx2.AsyncClient(headers=headers, timeout=timeout, trust_env=False) as http,
                streamable_http_client(self.url, http_client=http) as (read, write),
                ClientSession(read, write) as session,
            ):
                await session.initialize()
                connected = True
                return await session.call_tool(name, dict(arguments), progress_callback=relay)
        except Exception as exc:
            cause = _first_cause(exc)
            if not connected and isinstance(cause, httpx2.TransportError):
                raise ApiUnreachable(f"{type(cause).__name__}: {cause}") from None
            raise ToolError(
                f"{name}: the API at {self.url} failed: {type(cause).__name__}: {cause} "
                "(is the token right? `vramctl run`'s log says more)"
            ) from None

    def _unreachable(self, why: str, write: bool) -> str:
        fix = "start `vramctl run` (its API serves /mcp)"
        if not write:
            fix += ", or drop --api (or add -m FILE) to observe the host directly"
        return f"no vramctl run answers at {self.url} ({why}): {fix}"

    def _observed_instead(self, answer: dict[str, Any], why: str) -> dict[str, Any]:
        note = (
            f"no vramctl run answers at {self.url} ({why}): observed directly, as "
            "`vramctl status` does (start `vramctl run` for its live view)"
        )
        source = {**answer.get("source", {}), "controller": None, "api": "unreachable"}
        return {**answer, "notes": [*answer.get("notes", []), note], "source": source}


def _first_cause(exc: BaseException) -> BaseException:
    """What failed inside the SDK's task groups: a transport error if any, else the
    first leaf of the exception group."""
    if not isinstance(exc, BaseExceptionGroup) or not exc.exceptions:
        return exc
    leaves = [_first_cause(e) for e in exc.exceptions]
    return next((e for e in leaves if isinstance(e, httpx2.TransportError)), leaves[0])
