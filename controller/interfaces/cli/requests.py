"""The commands that talk to a running ``vramctl run`` through its API: ``up`` (with
``--wait``'s stages), ``down`` and ``events``, and how an API answer is put in words:
by the first row of ``_ANSWER_TEXTS`` that fits it (ready, queued, dry run, accepted),
else as a refusal with the terms its message does not give already.

They load the HTTP client only (:mod:`controller.interfaces.client`), when they run:
must not import the server (FastAPI, uvicorn), Docker, the loop or
``controller.service`` at all, nor the manifest model or rich at import time.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from controller.interfaces.cli.common import _fail
from controller.interfaces.cli.options import (
    ApiOpt,
    DownServeArg,
    EventsCountOpt,
    EventsJsonOpt,
    JsonOpt,
    QueueOpt,
    SinceOpt,
    TokenFileOpt,
    TtlOpt,
    UpServeArg,
    WaitOpt,
)
from controller.interfaces.cli.plain import _lazy, _print_json
from controller.interfaces.cli.typer_app import STARTED, _command

if TYPE_CHECKING:
    from controller.interfaces import render
else:
    render = _lazy("controller.interfaces.render")


def _api_call(
    api: str,
    token_file: Path | None,
    method: str,
    path: str,
    body: dict[str, Any] | None,
    timeout_s: float = 30.0,
) -> tuple[int, dict[str, Any]]:
    from controller.interfaces.client import ApiConfigError, ApiUnreachable, call_api, load_token

    try:
        token = load_token(token_file)
        return call_api(api, method, path, token=token, body=body, timeout_s=timeout_s)
    except (ApiConfigError, ApiUnreachable) as exc:
        _fail(str(exc))


def _print_api_answer(status_code: int, data: dict[str, Any], json_out: bool) -> None:
    """An API answer: its JSON, or in words by the first row of :data:`_ANSWER_TEXTS`
    that fits it (a refusal when none does)."""
    if json_out:
        _print_json(data)
        return
    for fits, printer in _ANSWER_TEXTS:
        if fits(status_code, data):
            printer(data)
            return
    _print_refusal(status_code, data)


def _took(data: dict[str, Any]) -> str:
    """The answer's ``timings`` in words (``wait healthy 3.1s, …``); empty without any."""
    timings = data.get("timings") or {}
    return ", ".join(
        f"{k.removesuffix('_s').replace('_', ' ')} {v:.1f}s"
        for k, v in timings.items()
        if isinstance(v, int | float)
    )


def _print_ready(data: dict[str, Any]) -> None:
    took = _took(data)
    render.out.print(f"ready: {data.get('message', '')}" + (f" ({took})" if took else ""))


def _print_queued(data: dict[str, Any]) -> None:
    message = str(data.get("message", "")).removeprefix("queued: ")
    waited = data.get("waited_s")
    head = f"still queued after {waited:.0f}s" if isinstance(waited, int | float) else "queued"
    render.out.print(f"{head}: {message}", markup=False)


def _print_dry_run(data: dict[str, Any]) -> None:
    """Answered at once: nothing executes."""
    render.out.print(f"accepted, not executed: {data.get('message', '')}", markup=False)
    for step in data.get("steps") or []:
        render.out.print(
            f"  would {step.get('action')} {step.get('serve')}: {step.get('reason')}",
            markup=False,
        )


def _print_not_ready(data: dict[str, Any]) -> None:
    render.out.print(f"accepted, not ready yet: {data.get('message', '')}")
    took = _took(data)
    if took:
        render.out.print(f"  so far: {took}")


def _print_accepted(data: dict[str, Any]) -> None:
    render.out.print(f"accepted: {data.get('message', '')}")
    for step in data.get("steps") or []:
        render.out.print(f"  {step.get('action')} {step.get('serve')}: {step.get('reason')}")
    req = data.get("request") or {}
    if req.get("ttl_s") is not None:
        if req.get("ttl_basis") in ("measured", "unknown"):
            render.out.print(
                f"  the request ends once {data.get('serve', 'the serve')} has had no "
                f"request in flight for {req['ttl_s']:g}s (idle_ttl_s)"
            )
        else:
            render.out.print(f"  the request lasts {req['ttl_s']:g}s")
    if data.get("note"):
        render.out.print(f"  note: {data['note']}")


#: Which answers read how, first fit first: (does it fit, print it).
_ANSWER_TEXTS: tuple[
    tuple[Callable[[int, dict[str, Any]], bool], Callable[[dict[str, Any]], None]], ...
] = (
    (lambda code, data: code == 200, _print_ready),
    (lambda code, data: code == 202 and bool(data.get("queued")), _print_queued),
    (lambda code, data: code == 202 and bool(data.get("dry_run")), _print_dry_run),
    (lambda code, data: code == 202 and data.get("ready") is False, _print_not_ready),
    (lambda code, data: code == 202, _print_accepted),
)


def _print_refusal(status_code: int, data: dict[str, Any]) -> None:
    """A refusal or failure, with the terms its message does not give already."""
    render.error(f"{status_code}: {data.get('error', data)}")
    if data.get("queue") and isinstance(data["queue"], str):
        render.err.print(f"  {data['queue']}")
    if data.get("note"):
        render.err.print(f"  note: {data['note']}")
    roles = _print_role_terms(data)
    told = bool(data.get("gpu_roles")) and not roles  # with each role's evictable MiB
    if data.get("evictable_mib") and not told:
        render.err.print(f"  evictable: {_per_role(data['evictable_mib'])}")
    if data.get("shrinkable_mib") and any(data["shrinkable_mib"].values()) and not told:
        render.err.print(f"  shrinkable: {_per_role(data['shrinkable_mib'])}")
    for p in data.get("protected") or []:
        render.err.print(f"  protected: {p['serve']} ({render.mib(p['mib'])} MiB): {p['why']}")
    if data.get("retry_after_s") is not None:
        render.err.print(f"  retry after {data['retry_after_s']}s")
    if status_code == 401:
        render.err.print("  pass --token-file FILE or set VRAMCTL_TOKEN")


def _print_role_terms(data: dict[str, Any]) -> list[dict[str, Any]]:
    """Each role's arithmetic the message does not give already (a refusal's message
    names its arithmetic: the terms are printed once); the roles printed."""
    roles = [t for t in data.get("gpu_roles") or [] if not _told(data, t["gpu_role"])]
    for t in roles:
        held = [(r["serve"], r["mib"]) for r in t.get("reservations", [])]
        render.err.print(
            f"  {t['gpu_role']}: capacity {t['capacity_mib']} - reserve {t['reserve_mib']} = "
            f"budget {t['budget_mib']}; committed {render.committed(t['committed_mib'], held)}"
            f"; free {render.mib(t['free_mib'])}; requested "
            f"{t['requested_mib']}; shortfall {render.mib(t['shortfall_mib'])}"
        )
    return roles


def _per_role(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{role} {render.mib(m)} MiB" for role, m in value.items())
    return str(value)


def _told(data: dict[str, Any], role: str) -> bool:
    """Whether an error answer's message already gives ``role``'s arithmetic."""
    message = str(data.get("error", ""))
    return f"{role}: capacity " in message and "evictable " in message


@_command("Ask the running loop to start SERVE on demand.")
def up(
    serve: UpServeArg,
    ttl: TtlOpt = None,
    wait: WaitOpt = None,
    queue: QueueOpt = False,
    api: ApiOpt = "127.0.0.1:8477",
    token_file: TokenFileOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Ask the running loop to start SERVE on demand.

    Exit 0 accepted (with --wait: ready), 2 with --wait when S passed before it was
    ready (it goes on; the answer says where it stands) or at once against a dry run
    (nothing is executed: the answer lists the steps a real run would take), 1 refused
    or failed.

    Talks to `vramctl run`'s API (--api, token from --token-file / VRAMCTL_TOKEN); with
    no loop running it refuses rather than acting on its own.
    """
    from urllib.parse import quote

    if wait is not None and not 0 < wait <= 600:
        _fail(f"--wait {wait:g}: give a number of seconds, more than 0 and at most 600")
    body: dict[str, Any] = {}
    if ttl is not None:
        body["ttl_s"] = ttl
    if wait is not None:
        body["wait_s"] = wait
    if queue:
        body["queue"] = True

    def send() -> tuple[int, dict[str, Any]]:
        return _api_call(
            api,
            token_file,
            "POST",
            f"/v1/serves/{quote(serve, safe='')}/up",
            body or None,
            timeout_s=30.0 + (wait or 0.0),
        )

    if wait is not None and not json_out:  # tell the stages while the answer is held
        status_code, data = _up_with_progress(serve, api, token_file, send)
    else:
        status_code, data = send()
    _print_api_answer(status_code, data, json_out)
    if wait is not None:
        raise typer.Exit(0 if status_code == 200 else 2 if status_code == 202 else 1)
    raise typer.Exit(0 if status_code in (200, 202) else 1)


def _up_with_progress(
    serve: str,
    api: str,
    token_file: Path | None,
    send: Callable[[], tuple[int, dict[str, Any]]],
) -> tuple[int, dict[str, Any]]:
    """``send()`` while the event stream tells its stages (controller/interfaces/upprogress)."""
    from controller.interfaces.client import ApiConfigError, base_url, load_token
    from controller.interfaces.upprogress import follow_up

    try:
        token, url = load_token(token_file), base_url(api)
    except ApiConfigError:
        return send()  # it says what is wrong with the address or the token
    return follow_up(serve, url, token, send, render.out, started=STARTED)


@_command("End SERVE's on-demand request through the running loop.")
def down(
    serve: DownServeArg,
    api: ApiOpt = "127.0.0.1:8477",
    token_file: TokenFileOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """End SERVE's on-demand request through the running loop. Exit 0 accepted, 1 otherwise."""
    from urllib.parse import quote

    status_code, data = _api_call(
        api, token_file, "POST", f"/v1/serves/{quote(serve, safe='')}/down", None
    )
    _print_api_answer(status_code, data, json_out)
    raise typer.Exit(0 if status_code == 202 else 1)


@_command("Follow the running loop's event stream.")
def events(
    api: ApiOpt = "127.0.0.1:8477",
    token_file: TokenFileOpt = None,
    since: SinceOpt = None,
    count: EventsCountOpt = 0,
    json_out: EventsJsonOpt = False,
) -> None:
    """Follow the running loop's event stream (GET /v1/events), one line per event.

    Lifecycle transitions, plans begun and ended, step outcomes, ledger changes,
    requests and drift alarms, as they happen. A dropped connection is resumed from the
    last event seen (Last-Event-ID); a `gap` line says what could not be replayed. With
    the token (--token-file / VRAMCTL_TOKEN) free-text details are shown too. Ctrl-C
    stops; exit 1 when nothing answers or the API refuses the stream.
    """
    from controller.interfaces.client import (
        ApiConfigError,
        StreamRefused,
        StreamUnreachable,
        base_url,
        describe,
        follow_events,
        load_token,
    )

    try:
        token = load_token(token_file)
        url = base_url(api)
    except ApiConfigError as exc:
        _fail(str(exc))
    seen = 0

    def show(item: dict[str, Any]) -> bool:
        nonlocal seen
        if json_out:
            sys.stdout.write(json.dumps(item, separators=(",", ":")) + "\n")
            sys.stdout.flush()
        else:
            render.out.print(describe(item), markup=False)
        seen += 1
        return count == 0 or seen < count

    def reconnecting(why: str) -> None:
        render.warn(f"{why}: reconnecting to {url}")

    try:
        follow_events(url, show, token=token, since=since, on_reconnect=reconnecting)
    except StreamRefused as exc:
        _fail(f"{url} refused the event stream: {exc}")
    except StreamUnreachable as exc:
        _fail(f"{exc}; start `vramctl run` (events only follow the running loop)")
    except KeyboardInterrupt:
        raise typer.Exit(0) from None
    raise typer.Exit(0)
