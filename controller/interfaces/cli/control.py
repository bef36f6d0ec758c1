"""The commands that change the host: ``apply`` (observe, plan and carry the plan out,
once; or a saved plan still current) and ``run`` (the control loop, with its HTTP API).

They wire the command line to ``controller.service`` (the cycle, the loop, the
executor) and print what it reports; they decide nothing themselves. Must not import
the server, Docker or HTTP libraries, the manifest model, rich or the core at import
time: ``--help`` and the other commands load none of them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from controller.interfaces.cli.common import (
    EXIT_BAD_INPUT,
    _fail,
    _load,
    _observe_live,
)
from controller.interfaces.cli.options import (
    SERVED_API,
    AllowOriginOpt,
    ApiOpt,
    ApplyStateDirOpt,
    DryRunOpt,
    JsonOpt,
    LogJsonOpt,
    ManifestOpt,
    NoApiOpt,
    PlanArg,
    ResyncOpt,
    RouterTokenOpt,
    RouterUrlOpt,
    RunStateDirOpt,
    SettleOpt,
    TokenFileOpt,
)
from controller.interfaces.cli.plain import _lazy, _print_json
from controller.interfaces.cli.typer_app import _command

if TYPE_CHECKING:
    import socket

    from controller.interfaces import render
    from controller.manifest import ManifestSet
    from controller.service.cycle import CycleJournal
    from controller.service.executor import ExecutionReport, StepResult
    from controller.service.loop import Controller
    from controller.service.situation import JournalRecords
    from controller.snapshot import SnapshotModel
    from statemachine.answers.situation import Situation
    from statemachine.domain.types import Observed
    from statemachine.planning.plan_types import (
        Plan,
    )
else:
    render = _lazy("controller.interfaces.render")


def _check_up_env_pass() -> None:
    """Refuse a wrong ``VRAMCTL_UP_ENV_PASS`` before anything runs; warn of a name unset."""
    import os

    from controller.adapters.docker.actions import UP_ENV_PASS_VAR, up_env_pass_names

    try:
        names = up_env_pass_names()
    except ValueError as exc:
        _fail(str(exc))
    unset = [name for name in names if name not in os.environ]
    if unset:
        render.warn(
            f"{UP_ENV_PASS_VAR} names {', '.join(unset)}, which this environment does not "
            "have: the up commands will not get " + ("it" if len(unset) == 1 else "them")
        )


def _load_saved_plan(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        _fail(f"{path}: cannot read the plan: {exc.strerror or exc}")
    except json.JSONDecodeError as exc:
        _fail(f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno}): {exc.msg}")
    if not isinstance(data, dict) or "steps" not in data or "observed" not in data:
        _fail(
            f"{path}: not a saved plan: it has no steps and observation "
            "(`vramctl plan --out FILE` writes one)"
        )
    return data


@_command("Observe, plan and carry the plan out, once.")
def apply(
    plan_file: PlanArg = None,
    manifest: ManifestOpt = [],  # noqa: B006
    router_url: RouterUrlOpt = None,
    router_token_file: RouterTokenOpt = None,
    state_dir: ApplyStateDirOpt = None,
    log_json: LogJsonOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """Execute once: observe, plan and carry the plan out (or a saved plan, if still current).

    Refused while a `vramctl run` holds the same state directory: the loop owns the host
    then (use `vramctl up` / `down`, or stop the loop). Exit 0 when every step succeeded
    and the ledger matches the host afterwards, 2 when the state directory cannot be
    locked, 1 otherwise.
    """
    import asyncio

    from controller.logs import configure_logging
    from controller.service.cycle import run_cycle
    from controller.service.executor import Outcome
    from controller.store.journal import (
        AlreadyRunning,
        StateDirError,
        StateLock,
        default_state_dir,
    )
    from statemachine.ledger.reservations import ledger_from_observed

    configure_logging(json_logs=log_json)
    mset = _load(manifest)
    _check_up_env_pass()
    state_dir = state_dir or default_state_dir(list(manifest))
    lock = StateLock(state_dir)
    try:
        lock.acquire()
    except AlreadyRunning as exc:
        _fail(f"{exc}; a running loop owns this host: use `vramctl up` / `down`, or stop it")
    except StateDirError as exc:
        _fail(str(exc), EXIT_BAD_INPUT)
    steps = _ApplyCycle(mset, plan_file, router_url, router_token_file, json_out, state_dir)
    result = asyncio.run(run_cycle(steps))
    the_plan, report = result.plan, result.report
    if report is None:  # nothing to do
        if json_out:
            _print_json(
                {"ok": True, "steps": [], "blocked": [b.to_json() for b in the_plan.blocked]}
            )
        raise typer.Exit(0)
    desired = result.inputs.placed
    after = _observe_live(mset)
    host_ledger = ledger_from_observed(desired, after.to_observed())
    mismatches = [
        f"{r}: executor ledger {report.ledger.committed_mib(r)} MiB, "
        f"host {host_ledger.committed_mib(r)} MiB"
        for r in desired.roles
        if not host_ledger.unknown
        and report.ledger.committed_mib(r) != host_ledger.committed_mib(r)
    ]
    if json_out:
        data = report.to_json()
        data["ledger_matches_host"] = not mismatches
        data["mismatches"] = mismatches
        _print_json(data)
    else:
        render.apply_summary(report, mismatches)
    ok = report.ok and not mismatches and all(r.outcome is Outcome.OK for r in report.results)
    raise typer.Exit(0 if ok else 1)


class _ApplyCycle:
    """``apply``'s parts of the one cycle: the host now, the default policy (or a saved
    plan still current), every step in order (no start tracker), no journal."""

    def __init__(
        self,
        mset: ManifestSet,
        plan_file: Path | None,
        router_url: str | None,
        router_token_file: Path | None,
        json_out: bool,
        state_dir: Path,
    ) -> None:
        self.state_dir = state_dir
        self.records: JournalRecords | None = None
        self.mset = mset
        self.plan_file = plan_file
        self.router_url = router_url
        self.router_token_file = router_token_file
        self.json_out = json_out
        self.snap: SnapshotModel | None = None

    def observe(self) -> SnapshotModel:
        from controller.service.situation import read_journal

        self.records, why = read_journal(self.state_dir)
        if why is not None:
            render.warn(f"journal: {why}")
        self.snap = _observe_live(self.mset, records=self.records)
        return self.snap

    def inputs(self, snap: SnapshotModel, observed: Observed) -> Situation:
        from controller.service.situation import snapshot_situation

        return snapshot_situation(self.mset, snap, self.records, router=self.router_url is not None)

    def plan(self, inputs: Situation) -> Plan:
        if self.plan_file is not None:
            assert self.snap is not None
            the_plan = _saved_plan(self.plan_file, self.mset, self.snap, inputs.observed)
        else:
            the_plan = inputs.plan
        if not self.json_out:
            render.plan(the_plan)
        return the_plan

    def journal(self, plan: Plan) -> CycleJournal | None:
        return None

    def execute(self, plan: Plan, inputs: Situation, cycle_id: int | None) -> ExecutionReport:
        from controller.service.steps.dispatch import on_planned_cards
        from controller.service.wiring import containers_now, make_executor

        def progress(result: StepResult) -> None:
            if not self.json_out:
                render.step_result(result)

        try:
            executor = make_executor(
                self.mset,
                router_url=self.router_url,
                router_token_file=self.router_token_file,
                on_step=progress,
                # each reserve is admitted against the host as it is now
                observe_now=lambda: containers_now(self.mset),
            )
        except Exception as exc:  # the docker client could not be made: nothing was touched
            _fail(f"cannot reach docker to execute: {exc}")
        # each placed serve on the card the plan chose (a saved plan's too: its steps')
        executor.desired = on_planned_cards(inputs.desired, plan.steps)
        return executor.execute(plan, inputs.observed)

    def outcome(self, cycle_id: int | None, outcome: dict[str, Any]) -> None:
        return None


def _saved_plan(
    plan_file: Path, mset: ManifestSet, snap: SnapshotModel, observed: Observed
) -> Plan:
    """The plan saved in ``plan_file``, if the host is still what it was planned from."""
    from controller.snapshot import SnapshotError, parse_snapshot, snapshot_changes
    from statemachine.ledger.reservations import Refusal, ledger_from_observed
    from statemachine.planning.plan_types import (
        Plan,
        Step,
    )
    from statemachine.planning.simulate import apply_step

    desired = mset.desired()
    saved = _load_saved_plan(plan_file)
    changes: list[str] = []
    if saved.get("manifest_digest") != mset.digest:
        changes.append("the manifest set changed since the plan was made")
    try:
        old = parse_snapshot(saved["observed"], source=f"{plan_file}: observed")
    except SnapshotError as exc:
        _fail(str(exc))
    containers = [s.container for s in desired.serves.values()]
    changes += snapshot_changes(old, snap, containers)
    if changes:
        render.error(f"{plan_file} is stale: the host is no longer what it was planned from:")
        for change in changes:
            render.error(f"  {change}")
        render.error("plan again (`vramctl plan --out`) and review the new plan")
        raise typer.Exit(1)
    if not isinstance(saved["steps"], list):
        _fail(f"{plan_file}: steps: expected a list, got {type(saved['steps']).__name__}")
    try:
        steps = tuple(Step.from_json(x) for x in saved["steps"])
    except ValueError as exc:
        _fail(f"{plan_file}: a step is malformed: {exc}")
    unknown = sorted({st.serve for st in steps} - set(desired.serves))
    if unknown:
        _fail(f"{plan_file}: names serves the manifest does not declare: {', '.join(unknown)}")
    base = ledger_from_observed(desired, observed)
    ledger_after = base
    for i, st in enumerate(steps, 1):
        moved = apply_step(ledger_after, st)
        if isinstance(moved, Refusal):
            _fail(f"{plan_file}: step {i} ({st.action} {st.serve}) is refused: {moved.message}")
        ledger_after = moved
    return Plan(steps, (), base, ledger_after)


@_command("Run the control loop that keeps the host converged.")
def run(
    manifest: ManifestOpt = [],  # noqa: B006
    dry_run: DryRunOpt = False,
    state_dir: RunStateDirOpt = None,
    resync: ResyncOpt = 5.0,
    router_url: RouterUrlOpt = None,
    router_token_file: RouterTokenOpt = None,
    log_json: LogJsonOpt = False,
    api: ApiOpt = SERVED_API,
    no_api: NoApiOpt = False,
    token_file: TokenFileOpt = None,
    settle_s: SettleOpt = 30.0,
    allow_origin: AllowOriginOpt = None,
) -> None:
    """The control loop: keep the host converged to the manifest, beside Compose.

    With the API (default 127.0.0.1:8477; --no-api to disable) the loop also answers
    GET /v1/ledger, /v1/serves, /v1/fit/SERVE, /v1/events, /metrics, /healthz and takes on-demand
    requests (POST /v1/serves/SERVE/up | down, bearer token from --token-file or
    VRAMCTL_TOKEN; without a token those answer 503). An address already in use
    stops the command at once with exit 1; a state directory it may not lock, with 2.
    """
    import asyncio

    from controller.logs import configure_logging
    from controller.service.loop import Controller, RunOptions

    configure_logging(json_logs=log_json)
    mset = _load(manifest)
    _check_up_env_pass()
    options = RunOptions(
        manifests=tuple(manifest),
        state_dir=state_dir,
        dry_run=dry_run,
        resync_s=resync,
        router_url=router_url,
        router_token_file=router_token_file,
        settle_s=settle_s,
    )
    controller = Controller(options, mset)
    sock = None if no_api else _attach_api(controller, api, token_file, allow_origin, resync)
    try:
        code = asyncio.run(controller.run())
    finally:
        if sock is not None:
            sock.close()
    raise typer.Exit(code)


def _attach_api(
    controller: Controller,
    api: str,
    token_file: Path | None,
    allow_origin: list[str] | None,
    resync: float,
) -> socket.socket:
    """Bind the API's socket and attach the API to ``controller``; warn of a missing
    token and of an address other than loopback. A bad address or token file fails."""
    from controller.interfaces.api import ApiSettings, attach_api, bind_socket
    from controller.interfaces.client import ApiConfigError, load_token, parse_address

    try:
        host, port = parse_address(api)
        token = load_token(token_file)
        sock = bind_socket(host, port)
    except ApiConfigError as exc:
        _fail(str(exc))
    if token is None:
        render.warn(
            "the API has no token (--token-file / VRAMCTL_TOKEN): it answers reads, and "
            "refuses every state-changing request with 503 until one is configured"
        )
    if host not in ("127.0.0.1", "::1", "localhost"):
        render.warn(
            f"the API listens on {host}, not loopback: anyone who can reach it can read "
            "the ledger (changes still need the token)"
        )
    settings = ApiSettings(
        token=token,
        allow_origins=tuple(allow_origin or ()),
        retry_after_s=resync,
        bind_host=host,
        bind_port=int(sock.getsockname()[1]),
    )
    attach_api(controller, settings, sock)
    return sock
