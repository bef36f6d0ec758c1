"""The read answers about the host: ``observe`` (one live snapshot as JSON), ``status``
(and ``status --watch``), ``calibrate``, ``fit`` and ``plan``, each given from one
situation (:func:`~controller.interfaces.cli.common._situation`).

Renderers: every figure is the core's (``statemachine``) or its reports'
(``controller.interfaces.*_report``); nothing is changed on the host. Must not import
the manifest model, rich, the core, the server, Docker or HTTP libraries at import time.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from controller.interfaces.cli.common import (
    EXIT_BAD_INPUT,
    _exit_if_unobserved,
    _fail,
    _footprint_samples,
    _load,
    _observe,
    _observe_live,
    _readable_state_dir,
    _situation,
)
from controller.interfaces.cli.options import (
    CountOpt,
    DetailedExitcodeOpt,
    FitRouterUrlOpt,
    FitServeArg,
    GranuleMibOpt,
    IntervalOpt,
    JsonOpt,
    ManifestOpt,
    MarginPctOpt,
    MinSamplesOpt,
    ObservedOpt,
    PatchOpt,
    PlanOutOpt,
    StateDirOpt,
    WatchOpt,
)
from controller.interfaces.cli.plain import _lazy, _print_json
from controller.interfaces.cli.typer_app import _command

if TYPE_CHECKING:
    from rich.table import Table

    from controller.interfaces import bars, render
    from controller.manifest import ManifestSet
    from controller.snapshot import SnapshotModel
else:
    render = _lazy("controller.interfaces.render")
    bars = _lazy("controller.interfaces.bars")


@_command("Print one live snapshot of the host as JSON.")
def observe(manifest: ManifestOpt = []) -> None:  # noqa: B006
    """Print one live snapshot of the manifest set's containers and the GPUs as JSON.

    The output is exactly what ``--observed`` reads back. Exit 0, or 3 when Docker could
    not be read (the snapshot is printed all the same, saying why).
    """
    mset = _load(manifest)
    snap = _observe_live(mset)
    _print_json(snap.model_dump(mode="json"))
    _exit_if_unobserved(snap, None)


@_command("Show the ledger, drift and each serve's state.")
def status(
    manifest: ManifestOpt = [],  # noqa: B006
    observed: ObservedOpt = None,
    json_out: JsonOpt = False,
    watch: WatchOpt = False,
    interval: IntervalOpt = 2.0,
    count: CountOpt = 0,
    state_dir: StateDirOpt = None,
) -> None:
    """Per-role ledger, drift, each serve's container and lifecycle state, and its
    measured footprint (declared vs measured), the roles' reserves, and the estimate of
    each serve's [serve.model] (weights + KV, the rest unknown).

    Exit 0; 2 when the state directory is there but cannot be read (it says why and how
    to fix it); 3 when Docker could not be read (the answer is printed, `unknown` where
    unknown).
    """
    from controller.interfaces import footprint_report as fp
    from controller.service.model_estimates import serve_models

    mset = _load(manifest)
    _readable_state_dir(manifest, state_dir)  # its footprints are read from it
    if watch:  # `status --watch`: observe and redraw in place (controller/interfaces/bars.py)
        if json_out:
            _fail("--watch draws for people; for tools, run `status --json` repeatedly")
        _watch_status(manifest, mset, observed, interval, count, state_dir)
        return
    snap, sit = _situation(mset, manifest, observed, state_dir, nvml_in_answer=not json_out)
    report = sit.status()
    footprints = fp.status_footprints(mset, _footprint_samples(manifest, state_dir))
    models = serve_models(mset, {n: f.measured_mib for n, f in footprints.items()})
    if json_out:
        _print_json(
            {
                **report.to_json(),
                "footprints": {n: f.to_json() for n, f in footprints.items()},
                "reserves": fp.reserves_json(mset),
                "models": models,
            }
        )
        _exit_if_unobserved(snap, observed)
        return
    render.out.print(bars.role_bars(report))  # the bars above the tables
    render.status(report, nvml_why=snap.nvml_error)
    reserves = fp.reserve_table(mset)
    if reserves is not None:
        render.table(reserves)
    if any(f.samples for f in footprints.values()):
        render.table(fp.footprint_table(footprints))
    elif footprints:
        render.prose(
            "Measured footprints: no samples recorded in this state directory yet "
            "(`vramctl run` measures each start and stop; --state-dir names another)"
        )
    if models:
        from controller.interfaces.model_report import model_table

        render.table(model_table(models))
    _exit_if_unobserved(snap, observed)


def _watch_status(
    manifest: list[Path],
    mset: ManifestSet,
    observed: Path | None,
    interval: float,
    count: int,
    state_dir: Path | None = None,
) -> None:
    """``status --watch``: each draw from the manifest set as the files are now (the last
    good one while an edit does not load) and a new observation; below it the model
    estimates where a serve declares ``[serve.model]`` (cached by path and mtime)."""
    from controller.interfaces.watched import WatchedManifests
    from controller.service.situation import snapshot_situation
    from controller.snapshot import SnapshotError, load_snapshot

    follow = WatchedManifests(manifest, mset)
    last: list[SnapshotModel] = []

    def produce() -> bars.Frame:
        current, notes = follow.current()
        if observed is None:
            snap, sit = _situation(current, manifest, None, state_dir, notes=notes)
            last[:] = [snap]
            return sit.status(), notes, _watch_models(current, manifest, state_dir, notes)
        else:
            try:
                snap = load_snapshot(observed)
            except SnapshotError as exc:
                if not last:  # the first draw: said before the screen is taken
                    _fail(str(exc))
                notes.append(f"{exc}; the last reading is shown")
                snap = last[0]
            if snap.docker_error:
                notes.append(f"{observed}: docker could not be read: {snap.docker_error}")
        last[:] = [snap]
        below = _watch_models(current, manifest, state_dir, notes)
        sit = snapshot_situation(current, snap, None)
        return sit.status(), notes, below

    bars.watch(produce, interval_s=interval, count=count)


def _watch_models(
    mset: ManifestSet, manifest: list[Path], state_dir: Path | None, notes: list[str]
) -> tuple[Table, ...]:
    """``status``'s model estimates table for a ``--watch`` draw, with the measured
    footprints; none when no serve declares ``[serve.model]``. A state directory that
    cannot be read is told in ``notes`` (nothing is printed beside the draw)."""
    from controller.interfaces import footprint_report as fp
    from controller.interfaces.model_report import model_table
    from controller.service.model_estimates import serve_models
    from controller.store.journal import default_state_dir

    if all(rt.model is None for rt in mset.runtime().values()):
        return ()
    samples, why = fp.load_samples(state_dir or default_state_dir(list(manifest)))
    if why is not None and state_dir is not None:
        notes.append(f"footprints: {why}")
    footprints = fp.status_footprints(mset, samples)
    return (model_table(serve_models(mset, {n: f.measured_mib for n, f in footprints.items()})),)


@_command("Propose each serve's vram_mib from measured footprints.")
def calibrate(
    manifest: ManifestOpt = [],  # noqa: B006
    state_dir: StateDirOpt = None,
    json_out: JsonOpt = False,
    margin_pct: MarginPctOpt = 10.0,
    granule_mib: GranuleMibOpt = 256,
    min_samples: MinSamplesOpt = 3,
    patch: PatchOpt = False,
) -> None:
    """Propose each serve's vram_mib from its measured footprints (never edits a file).

    The proposal is the peak of its attributable samples plus --margin-pct, rounded up
    to --granule-mib; with fewer than --min-samples it says "not enough evidence".
    A serve with a [serve.model] also gets its reservation, estimate (weights + KV) and
    measured footprint compared, and the term that is off named (docs/sizing.md).
    Exit 0 whatever it proposes, 1 when the manifest does not load, 2 when the state
    directory cannot be read.
    """
    from controller.interfaces import footprint_report as fp
    from controller.interfaces.footprint_report import load_samples
    from controller.interfaces.model_report import calibration_lines
    from controller.service.model_estimates import serve_models
    from controller.store.journal import default_state_dir
    from statemachine.sizing.footprint import propose

    mset = _load(manifest)
    _readable_state_dir(manifest, state_dir)
    samples, why = load_samples(state_dir or default_state_dir(list(manifest)))
    if why is not None:
        render.warn(f"footprints: {why}")
    proposals = [
        propose(
            s.name,
            s.vram_mib,
            samples,
            margin_pct=margin_pct,
            granule_mib=granule_mib,
            min_samples=min_samples,
        )
        for s in mset.desired().serves.values()
        if s.gpu_roles
    ]
    diff, problems = fp.manifest_patch(mset, proposals) if patch else ("", [])
    measured = {n: f.measured_mib for n, f in fp.status_footprints(mset, samples).items()}
    models = serve_models(mset, measured)
    if json_out:
        data: dict[str, Any] = {
            "margin_pct": margin_pct,
            "granule_mib": granule_mib,
            "min_samples": min_samples,
            "serves": [_with_model(p.to_json(), models.get(p.serve)) for p in proposals],
        }
        if patch:
            data["patch"] = diff
            data["patch_problems"] = problems
        _print_json(data)
        return
    for p in proposals:
        for line in fp.proposal_lines(p):
            render.out.print(line)
        if p.serve in models:
            for line in calibration_lines(models[p.serve]):
                render.out.print(line)
    if patch:
        for problem in problems:
            render.warn(f"--patch: {problem}")
        sys.stdout.write(diff)


def _with_model(answer: dict[str, Any], model: dict[str, Any] | None) -> dict[str, Any]:
    """``answer`` with the serve's ``model`` entry added, where it declares one."""
    return answer if model is None else {**answer, "model": model}


@_command("Can SERVE run now, and what would it cost?")
def fit(
    serve: FitServeArg,
    manifest: ManifestOpt = [],  # noqa: B006
    observed: ObservedOpt = None,
    json_out: JsonOpt = False,
    router_url: FitRouterUrlOpt = None,
    state_dir: StateDirOpt = None,
) -> None:
    """Can SERVE run now, and what would it cost?

    Exit 0 it fits, 1 it does not, 2 when the serve is unknown (a near miss is named),
    the manifest or --observed FILE does not load, or the state directory cannot be
    read, 3 when Docker could not be read (it cannot be answered). Without --router-url
    (VRAMCTL_ROUTER_URL, as `run` is given) a start that drains a router tier is said to
    be refused, as `up` would be.
    """
    from controller.interfaces.fit_answer import fit_answer
    from controller.service.model_estimates import serve_models

    mset = _load(manifest, code=EXIT_BAD_INPUT)  # 1 is "does not fit"
    desired = mset.desired()
    if serve not in desired.serves:
        render.error(render.unknown_serve(serve, desired))
        raise typer.Exit(EXIT_BAD_INPUT)
    if observed is not None:  # a saved observation that does not load: exit 2 now
        _observe(observed, mset, code=EXIT_BAD_INPUT)
    if observed is None or state_dir is not None:
        _readable_state_dir(manifest, state_dir)
    snap, sit = _situation(mset, manifest, observed, state_dir, router_url=router_url)
    answer = fit_answer(sit, serve, model=serve_models(mset).get(serve))
    result = answer.result
    if json_out:
        _print_json(answer.to_json())
    else:
        render.fit(result)
        if answer.note:
            render.out.print(f"  note: {answer.note}", markup=False)
        if answer.model:
            from controller.interfaces.model_report import fit_lines

            for line in fit_lines(answer.model):
                render.out.print(line)
    if result.fits and not answer.loads:
        render.out.print("  does not fit: its model cannot load in its reservation", markup=False)
    _exit_if_unobserved(snap, observed)
    raise typer.Exit(0 if answer.fits else 1)


@_command("Dry-run: the steps that would converge the host.")
def plan(
    manifest: ManifestOpt = [],  # noqa: B006
    observed: ObservedOpt = None,
    json_out: JsonOpt = False,
    out: PlanOutOpt = None,
    detailed_exitcode: DetailedExitcodeOpt = False,
    state_dir: StateDirOpt = None,
) -> None:
    """Dry-run: the ordered steps that would converge the host, and what is blocked.

    Exit 0 (with --detailed-exitcode: 0 nothing to do, 2 when there are changes), 1 on
    errors (a state directory that cannot be read among them), 3 when Docker could not
    be read (the plan is unknown, not empty).
    """
    mset = _load(manifest)
    if observed is None or state_dir is not None:
        _readable_state_dir(manifest, state_dir, 1)  # 2 is --detailed-exitcode's "changes"
    snap, sit = _situation(mset, manifest, observed, state_dir)
    result = sit.plan
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
    _exit_if_unobserved(snap, observed)  # the plan is unknown, not empty
    if detailed_exitcode:
        raise typer.Exit(0 if result.empty else 2)
