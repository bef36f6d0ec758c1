"""The ``vramctl`` command line (typer): the contracts of DESIGN §5.

Each command loads the manifest set, reads or takes the observation, calls the pure
core, and renders the answer (rich for people, ``--json`` for tools). Exit codes are
part of the contract: ``validate`` 0/1, ``fit`` 0 fits / 1 does not, ``plan
--detailed-exitcode`` 0 nothing to do / 2 changes / 1 error.

This module must not decide anything itself: the arithmetic lives in ``statemachine``;
it only wires inputs to the core and prints what the core answers. Errors are printed
as located one-line messages, never tracebacks.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

from controller import render
from controller.manifest import ManifestError, ManifestSet, load_manifest_set
from controller.snapshot import SnapshotError, SnapshotModel, load_snapshot
from statemachine.fit import fit_serve
from statemachine.planner import Action, Policy, plan_transitions
from statemachine.status import host_status

app = typer.Typer(
    name="vramctl",
    help="Make GPU memory an explicit, declared budget on a model-serving host.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

ManifestOpt = Annotated[
    list[Path],
    typer.Option(
        "--manifest",
        "-m",
        help="Manifest file (TOML); repeat to load several files as one set.",
    ),
]
ObservedOpt = Annotated[
    Path | None,
    typer.Option(
        "--observed",
        help="Observed snapshot JSON (what `vramctl observe` prints) instead of the live host.",
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")]


def _fail(message: str, code: int = 1) -> NoReturn:
    render.error(message)
    raise typer.Exit(code)


def _load(manifests: list[Path]) -> ManifestSet:
    if not manifests:
        _fail("no manifest given: pass -m/--manifest FILE (repeat for a set)")
    try:
        mset = load_manifest_set(manifests)
    except ManifestError as exc:
        for err in exc.errors:
            render.error(str(err))
        raise typer.Exit(1) from None
    for warning in mset.warnings:
        render.warn(warning)
    return mset


def _observe(observed: Path | None, mset: ManifestSet) -> SnapshotModel:
    if observed is None:
        return _observe_live(mset)
    try:
        return load_snapshot(observed)
    except SnapshotError as exc:
        _fail(str(exc))


def _observe_live(mset: ManifestSet) -> SnapshotModel:
    from controller.docker_adapter import ContainerObserver, manifest_containers
    from controller.observe import observe_host

    observer = ContainerObserver()
    try:
        snap = observe_host(manifest_containers(mset.serves), observer=observer)
    finally:
        observer.close()
    if snap.docker_error:
        render.warn(f"docker: {snap.docker_error}")
    if snap.nvml_error:
        render.warn(f"nvml: {snap.nvml_error}")
    return snap


def _now(snapshot: SnapshotModel) -> float:
    taken = snapshot.taken_at_epoch()
    return taken if taken is not None else time.time()


def _print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False) + "\n")


@app.command()
def validate(manifest: ManifestOpt = [], json_out: JsonOpt = False) -> None:  # noqa: B006
    """Check a manifest set; exit 0 when valid, 1 with located errors on stderr."""
    mset = _load(manifest)
    desired = mset.desired()
    if json_out:
        _print_json(
            {
                "valid": True,
                "files": [str(f) for f in mset.files],
                "digest": mset.digest,
                "gpu_roles": {
                    r.id: {
                        "capacity_mib": r.capacity_mib,
                        "reserve_mib": r.reserve_mib,
                        "budget_mib": r.budget_mib,
                    }
                    for r in desired.roles.values()
                },
                "serves": len(desired.serves),
                "warnings": list(mset.warnings),
            }
        )
        return
    render.validated(mset, desired)


@app.command()
def observe(manifest: ManifestOpt = []) -> None:  # noqa: B006
    """Print one live snapshot of the manifest set's containers and the GPUs as JSON.

    The output is exactly what ``--observed`` reads back.
    """
    mset = _load(manifest)
    _print_json(_observe_live(mset).model_dump(mode="json"))


@app.command()
def status(
    manifest: ManifestOpt = [],  # noqa: B006
    observed: ObservedOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Per-role ledger, drift, and each serve's container and lifecycle state."""
    mset = _load(manifest)
    snap = _observe(observed, mset)
    report = host_status(mset.desired(), snap.to_observed())
    if json_out:
        _print_json(report.to_json())
        return
    render.status(report)


@app.command()
def fit(
    serve: Annotated[str, typer.Argument(help="The serve to ask about.")],
    manifest: ManifestOpt = [],  # noqa: B006
    observed: ObservedOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Can SERVE run now, and what would it cost? Exit 0 yes, 1 no."""
    mset = _load(manifest)
    desired = mset.desired()
    if serve not in desired.serves:
        render.error(render.unknown_serve(serve, desired))
        raise typer.Exit(1)
    snap = _observe(observed, mset)
    result = fit_serve(desired, snap.to_observed(), serve, now=_now(snap))
    if json_out:
        _print_json(result.to_json())
    else:
        render.fit(result)
    raise typer.Exit(0 if result.fits else 1)


@app.command()
def plan(
    manifest: ManifestOpt = [],  # noqa: B006
    observed: ObservedOpt = None,
    json_out: JsonOpt = False,
    out: Annotated[
        Path | None, typer.Option("--out", help="Also write the plan JSON to this file.")
    ] = None,
    detailed_exitcode: Annotated[
        bool,
        typer.Option(
            "--detailed-exitcode",
            help="Exit 0 when there is nothing to do, 2 when there are changes.",
        ),
    ] = False,
) -> None:
    """Dry-run: the ordered steps that would converge the host, and what is blocked."""
    mset = _load(manifest)
    snap = _observe(observed, mset)
    result = plan_transitions(mset.desired(), snap.to_observed(), Policy(), _now(snap))
    data = result.to_json()
    data["manifest_digest"] = mset.digest
    data["observed"] = snap.model_dump(mode="json")
    if out is not None:
        try:
            out.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
        except OSError as exc:
            _fail(f"{out}: cannot write the plan: {exc.strerror or exc}")
    if json_out:
        _print_json(data)
    else:
        render.plan(result)
    if detailed_exitcode:
        raise typer.Exit(0 if result.empty else 2)


RouterUrlOpt = Annotated[
    str | None,
    typer.Option(
        "--router-url",
        envvar="VRAMCTL_ROUTER_URL",
        help="The router whose tiers are quiesced, drained and readmitted.",
    ),
]
RouterTokenOpt = Annotated[
    Path | None,
    typer.Option(
        "--router-token-file",
        envvar="VRAMCTL_ROUTER_TOKEN_FILE",
        help="File holding the router's bearer token "
        "(else VRAMCTL_ROUTER_TOKEN / ANVIL_ROUTER_TOKEN).",
    ),
]
LogJsonOpt = Annotated[
    bool, typer.Option("--log-json", envvar="VRAMCTL_LOG_JSON", help="Log JSON lines.")
]


def _load_saved_plan(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        _fail(f"{path}: cannot read the plan: {exc.strerror or exc}")
    except json.JSONDecodeError as exc:
        _fail(f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno}): {exc.msg}")
    if not isinstance(data, dict) or "steps" not in data or "observed" not in data:
        _fail(f"{path}: not a saved plan (write one with `vramctl plan --out {path}`)")
    return data


@app.command()
def apply(
    plan_file: Annotated[
        Path | None, typer.Argument(help="A plan saved by `vramctl plan --out`; default: plan now.")
    ] = None,
    manifest: ManifestOpt = [],  # noqa: B006
    router_url: RouterUrlOpt = None,
    router_token_file: RouterTokenOpt = None,
    log_json: LogJsonOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """Execute once: observe, plan and carry the plan out (or a saved plan, if still current)."""
    from controller.executor import Outcome, StepResult
    from controller.logs import configure_logging
    from controller.runtime import make_executor
    from controller.snapshot import parse_snapshot, snapshot_changes
    from statemachine.ledger import ledger_from_observed
    from statemachine.planner import Plan, Step

    configure_logging(json_logs=log_json)
    mset = _load(manifest)
    desired = mset.desired()
    snap = _observe_live(mset)
    observed = snap.to_observed()
    if plan_file is not None:
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
        try:
            steps = tuple(
                Step(
                    action=Action(x["action"]),
                    serve=x["serve"],
                    gpu_roles=tuple(x.get("gpu_roles", ())),
                    mib=x.get("mib"),
                    reason=x.get("reason", ""),
                    to_mib=x.get("to_mib"),
                    group=x.get("group", x["serve"]),
                )
                for x in saved["steps"]
            )
        except (KeyError, ValueError, TypeError) as exc:
            _fail(f"{plan_file}: a step is malformed: {exc}")
        unknown = sorted({st.serve for st in steps} - set(desired.serves))
        if unknown:
            _fail(f"{plan_file}: names serves the manifest does not declare: {', '.join(unknown)}")
        base = ledger_from_observed(desired, observed)
        the_plan = Plan(steps, (), base, base)
    else:
        the_plan = plan_transitions(desired, observed, Policy(), _now(snap))
    if not json_out:
        render.plan(the_plan)
    if the_plan.empty:
        if json_out:
            _print_json(
                {"ok": True, "steps": [], "blocked": [b.to_json() for b in the_plan.blocked]}
            )
        raise typer.Exit(0)

    def progress(result: StepResult) -> None:
        if not json_out:
            render.step_result(result)

    try:
        executor = make_executor(
            mset, router_url=router_url, router_token_file=router_token_file, on_step=progress
        )
    except Exception as exc:  # the docker client could not be made: nothing was touched
        _fail(f"cannot reach docker to execute: {exc}")
    report = executor.execute(the_plan, observed)
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


@app.command()
def run(
    manifest: ManifestOpt = [],  # noqa: B006
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run", envvar="VRAMCTL_DRY_RUN", help="Observe and plan; execute nothing."
        ),
    ] = False,
    state_dir: Annotated[
        Path | None,
        typer.Option(
            "--state-dir",
            envvar="VRAMCTL_STATE_DIR",
            help="Journal and lock (default: $XDG_STATE_HOME/vramctl, else .vramctl-state/ "
            "beside the first manifest).",
        ),
    ] = None,
    resync: Annotated[
        float,
        typer.Option("--resync", envvar="VRAMCTL_RESYNC", min=0.5, help="Seconds between resyncs."),
    ] = 5.0,
    router_url: RouterUrlOpt = None,
    router_token_file: RouterTokenOpt = None,
    log_json: LogJsonOpt = False,
) -> None:
    """The control loop: keep the host converged to the manifest, beside Compose."""
    import asyncio

    from controller.logs import configure_logging
    from controller.loop import Controller, RunOptions

    configure_logging(json_logs=log_json)
    mset = _load(manifest)
    options = RunOptions(
        manifests=tuple(manifest),
        state_dir=state_dir,
        dry_run=dry_run,
        resync_s=resync,
        router_url=router_url,
        router_token_file=router_token_file,
    )
    controller = Controller(options, mset)
    raise typer.Exit(asyncio.run(controller.run()))


@app.command("replay")
def replay_cmd(
    source: Annotated[
        Path,
        typer.Argument(help="A journal (state dir's journal.sqlite3) or an observed snapshot."),
    ],
    manifest: ManifestOpt = [],  # noqa: B006
    cycle: Annotated[int | None, typer.Option("--cycle", help="Only this cycle.")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Re-plan recorded cycles with this manifest; show where the plans differ. Executes nothing.

    Exit 0 when every cycle plans the same, 2 when some differ, 1 on errors.
    """
    from controller.replay import ReplayError, render_replay, replay

    mset = _load(manifest)
    try:
        report = replay(source, mset, cycle=cycle)
    except ReplayError as exc:
        _fail(str(exc))
    if json_out:
        _print_json(report.to_json())
    else:
        render_replay(report, render.out)
    if report.errors:
        raise typer.Exit(1)
    raise typer.Exit(2 if report.differs else 0)


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
