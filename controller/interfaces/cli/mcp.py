"""``vramctl mcp``: the agents' tools over the Model Context Protocol on stdio, each
answered from the situation as ``status``, ``fit`` and ``plan`` answer, or forwarded to
a running ``vramctl run``'s ``/mcp`` (``--api``).

It wires the command line to :mod:`controller.interfaces.mcp_server`, which alone speaks
the protocol. Must not import the MCP SDK, the manifest model, rich, the core, the
server, Docker or HTTP libraries at import time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from controller.interfaces.cli.common import _fail, _load, _observe, _situation
from controller.interfaces.cli.options import (
    AllowWritesOpt,
    ManifestOpt,
    McpApiOpt,
    McpRouterUrlOpt,
    ObservedOpt,
    StateDirOpt,
    TokenFileOpt,
)
from controller.interfaces.cli.typer_app import _command

if TYPE_CHECKING:
    from controller.manifest import ManifestSet
    from controller.snapshot import SnapshotModel
    from statemachine.answers.situation import Situation


@_command("Serve the agents' tools over the Model Context Protocol (stdio).")
def mcp(
    manifest: ManifestOpt = [],  # noqa: B006
    observed: ObservedOpt = None,
    state_dir: StateDirOpt = None,
    router_url: McpRouterUrlOpt = None,
    allow_writes: AllowWritesOpt = False,
    api: McpApiOpt = None,
    token_file: TokenFileOpt = None,
) -> None:
    """Serve the agents' tools over MCP on stdin/stdout: reservation_status,
    serves_status, can_fit and plan_preview, each answered as `status`, `fit` and `plan`
    answer (docs/agents.md). Every call reads the manifest set again and observes the
    host (or reads --observed FILE); nothing is changed. The writes (request_up,
    release) are listed and refused: without --allow-writes, for its lack; with it,
    because they need a running controller (`vramctl run` serves them at /mcp).

    With --api HOST:PORT every call is forwarded to that `vramctl run`'s /mcp and its
    answer passed on (its live view, backoff included; the progress of request_up
    with wait_s relayed); the writes go through it with --allow-writes and the API's
    token. When it does not answer, a read is observed directly when -m is given
    (the answer's source and notes say so), else a tool error says how to fix it.

    The manifest set is checked before serving: exit 1 when it does not load.
    """
    from controller.interfaces.mcp_server import Sources, ToolError, run_stdio
    from controller.snapshot import SnapshotError, load_snapshot

    url = token = None
    if api is not None:
        from controller.interfaces.client import ApiConfigError, base_url, load_token

        try:
            url, token = base_url(api), load_token(token_file)
        except ApiConfigError as exc:
            _fail(str(exc))
        if not manifest:  # nothing to observe when the API does not answer
            run_stdio(None, allow_writes=allow_writes, api=url, token=token)
            return
    mset = _load(manifest)
    if observed is not None:
        _observe(observed, mset)  # a saved observation that does not load: exit 1 now

    def situation_now(current: ManifestSet, notes: list[str]) -> tuple[SnapshotModel, Situation]:
        if observed is not None:
            try:
                load_snapshot(observed)
            except SnapshotError as exc:
                raise ToolError(f"{exc} (write it again with `vramctl observe`)") from None
        return _situation(
            current,
            manifest,
            observed,
            state_dir,
            router_url=router_url,
            nvml_in_answer=True,
            notes=notes,
        )

    run_stdio(
        Sources(
            manifests=tuple(manifest),
            situation=situation_now,
            router_url=router_url,
            observed_file=observed,
        ),
        allow_writes=allow_writes,
        api=url,
        token=token,
    )
