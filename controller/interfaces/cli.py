"""The ``vramctl`` command line (typer): the CLI contract (docs/operations.md).

Each command loads the manifest set, reads or takes the observation, calls the pure
core, and renders the answer (rich for people, ``--json`` for tools). Exit codes are
part of the contract, and each command's help names its own: ``validate`` 0/1, ``fit``
0 fits / 1 does not / 2 a question it cannot ask (an unknown serve, a manifest or
saved observation that does not load), ``plan --detailed-exitcode`` 0 nothing to do /
2 changes / 1 error, ``estimate`` 0 / 2 bad input (a usage error's code); ``status``, ``fit``,
``plan`` and ``observe`` exit :data:`EXIT_UNOBSERVED` (3) when Docker could not be read
(their answer is printed, ``unknown`` where unknown, with one line saying where Docker
was looked for). A state directory that is there but that this user may not read or
lock is :data:`EXIT_BAD_INPUT` (2; ``plan`` 1, its 2 means changes), said in one paragraph
with how to fix it; ``mcp`` still serves and its tools say it in their notes.

This module must not decide anything itself: the arithmetic lives in ``statemachine``;
it only wires inputs to the core and prints what the core answers. Errors are printed
as located one-line messages, never tracebacks. An API answer is put in words by the
first row of ``_ANSWER_TEXTS`` that fits it (ready, queued, dry run, accepted), else
as a refusal with the terms its message does not give already.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

#: when the command began (before its libraries load): what ``up --wait`` counts from
STARTED = time.monotonic()

import typer  # noqa: E402 (after STARTED: its load counts as the command's time)
import typer.core  # noqa: E402
from typer import _click as click  # noqa: E402 (the click typer carries: its own copy)

if TYPE_CHECKING:
    import socket

    from rich.table import Table

    from controller.interfaces import bars, render
    from controller.manifest import ManifestSet
    from controller.service.cycle import CycleJournal
    from controller.service.executor import ExecutionReport, StepResult
    from controller.service.loop import Controller
    from controller.service.situation import JournalRecords
    from controller.snapshot import SnapshotModel
    from controller.tools.compose_lint import RenderedServe
    from statemachine.planner import Plan
    from statemachine.situation import Situation
    from statemachine.types import Observed


def _lazy(name: str) -> ModuleType:
    """Module ``name``, loaded on its first attribute access (importlib's LazyLoader).

    ``--help`` and a command's usage errors then import no manifest model, rich or
    core module at all; each command imports what it uses (docs/operations.md,
    "Install": how fast the command line answers; benchmarks/bench_cli.py).
    """
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.loader is not None, name
    spec.loader = importlib.util.LazyLoader(spec.loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


if not TYPE_CHECKING:
    render = _lazy("controller.interfaces.render")
    bars = _lazy("controller.interfaces.bars")

app = typer.Typer(
    name="vramctl",
    help="Make GPU memory an explicit, declared budget on a model-serving host.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # click's plain help: paragraphs reflowed to the terminal's width (rich's kept each
    # docstring line break, cutting sentences), and no rich/markdown import for --help
    rich_markup_mode=None,
    context_settings={"max_content_width": 120},
)


class _Command(typer.core.TyperCommand):
    """click's plain help, each argument named by its metavar (``SERVE``, ``[PLAN]``) in
    the usage line and the Arguments section, not typer's ``{serve}`` and ``<str>``."""

    def collect_usage_pieces(self, ctx: click.Context) -> list[str]:
        """``[OPTIONS]``, then each argument as the operator types it."""
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if param.param_type_name == "argument":
                name = param.metavar or (param.name or "").upper()
                pieces.append(name if param.required else f"[{name}]")
        return pieces

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The Arguments section (by metavar) and the Options section."""
        sections: dict[str, list[tuple[str, str]]] = {"Arguments": [], "Options": []}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:
                continue
            if param.param_type_name == "argument":
                sections["Arguments"].append((param.metavar or record[0], record[1]))
            else:
                sections["Options"].append(record)
        for title, rows in sections.items():
            if rows:
                with formatter.section(title):
                    formatter.write_dl(rows)


def _command(summary: str, name: str | None = None) -> Callable[[Callable[..., None]], Any]:
    """``@app.command`` with ``summary``, the whole sentence ``vramctl --help`` lists (click
    would cut the docstring's first sentence to the width), and :class:`_Command`'s help."""
    return app.command(name, cls=_Command, short_help=summary)


ManifestOpt = Annotated[
    list[Path],
    typer.Option(
        "--manifest",
        "-m",
        envvar="VRAMCTL_MANIFEST",
        metavar="FILE",
        help="Manifest file (TOML); repeat to load several files as one set "
        "(VRAMCTL_MANIFEST: paths separated by ':').",
    ),
]
ObservedOpt = Annotated[
    Path | None,
    typer.Option(
        "--observed",
        metavar="FILE",
        help="Observed snapshot JSON (what `vramctl observe` prints) instead of the live host.",
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")]


def _router_url_option(help_text: str) -> Any:
    """The ``--router-url`` option (``VRAMCTL_ROUTER_URL``), with a command's help."""
    return typer.Option("--router-url", envvar="VRAMCTL_ROUTER_URL", metavar="URL", help=help_text)


#: ``status``, ``fit``, ``plan``, ``observe``: Docker could not be read, so the answer is unknown
EXIT_UNOBSERVED = 3
#: bad input, as a usage error's (``estimate``'s input; a state directory this user may
#: not read or lock)
EXIT_BAD_INPUT = 2


def _fail(message: str, code: int = 1) -> NoReturn:
    render.error(message)
    raise typer.Exit(code)


def _load(
    manifests: list[Path], *, strict: bool = False, json_out: bool = False, code: int = 1
) -> ManifestSet:
    """The manifest set; exit ``code`` (1; ``fit``: 2, its 1 is "does not fit") with its
    located errors on stderr (``json_out``: and ``validate``'s JSON answer on stdout)
    when it does not load."""
    if not manifests:
        _fail("no manifest given: pass -m/--manifest FILE (repeat for a set)", code)
    from controller.manifest import ManifestError, load_manifest_set

    try:
        mset = load_manifest_set(manifests, strict=strict)
    except ManifestError as exc:
        for err in exc.errors:
            render.error(str(err))
        if json_out:
            _print_json(
                {
                    "valid": False,
                    "files": [str(f) for f in manifests],
                    "errors": [err.to_json() for err in exc.errors],
                    "warnings": exc.warnings,
                }
            )
        raise typer.Exit(code) from None
    for warning in mset.warnings:
        render.warn(warning)
    return mset


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


def _observe(
    observed: Path | None,
    mset: ManifestSet,
    *,
    nvml_in_answer: bool = False,
    records: JournalRecords | None = None,
    notes: list[str] | None = None,
    code: int = 1,
) -> SnapshotModel:
    """The observation: live, or the saved ``observed`` (exit ``code`` when it does not
    load)."""
    from controller.snapshot import SnapshotError, load_snapshot

    if observed is None:
        return _observe_live(mset, notes, nvml_in_answer=nvml_in_answer, records=records)
    try:
        return load_snapshot(observed)
    except SnapshotError as exc:
        _fail(str(exc), code)


def _observe_live(
    mset: ManifestSet,
    notes: list[str] | None = None,
    *,
    nvml_in_answer: bool = False,
    records: JournalRecords | None = None,
) -> SnapshotModel:
    """One live observation; what could not be read is printed on stderr, or added to
    ``notes`` (``status --watch`` tells it inside its draw). ``nvml_in_answer``: the
    answer itself says NVML is unavailable and why (``status``), so it is not said here.
    ``records``: the loop's journal, whose recorded containers are observed too and
    whose sleepers are asked whether they still sleep, as the loop asks."""
    from controller.adapters.docker.read import ContainerObserver, manifest_containers
    from controller.adapters.health import HealthProber
    from controller.adapters.self_sleep import SelfSleepReader
    from controller.adapters.sleep import SleepClient
    from controller.service.inflight import InFlightTracker, observe_in_flight
    from controller.service.observe import observe_host, observe_probes, observe_self_sleep
    from controller.service.sleeping import observe_sleep

    names = manifest_containers(mset.serves)
    if records is not None:
        names = tuple(dict.fromkeys((*names, *records.started, *records.declared)))
    observer = ContainerObserver()
    try:
        snap = observe_host(names, observer=observer)
    finally:
        observer.close()
    sleeping = records.sleeping if records is not None else {}
    snap.sleep, _now_asleep = observe_sleep(
        mset.desired(), snap, sleeping, SleepClient(probe_timeout_s=1.0, attempts=1, max_wait_s=0)
    )
    # one reading, no history: idleness is known as of now only (counted from a request)
    tracker = InFlightTracker(log_changes=False)  # no log line amid the answer
    try:
        readings = observe_in_flight(snap, mset, tracker)
    finally:
        tracker.close()  # one reading: its HTTP client is not kept
    for name, reading in readings.items():
        if reading.error:
            render.warn(f"{name}: requests in flight unknown: {reading.error}")
    snap.in_flight = {
        name: reading.model_copy(update={"idle_since": None}) for name, reading in readings.items()
    }
    prober, reader = HealthProber(), SelfSleepReader()
    try:
        snap.probes = observe_probes(snap, mset, prober)
        snap.self_asleep = observe_self_sleep(snap, mset, reader)
    finally:
        prober.close()
        reader.close()
    if snap.docker_error:  # one line: where it looked and what to do (adapters/docker/reach)
        _say(render.error, f"{snap.docker_error}", notes)
    if snap.nvml_error and not nvml_in_answer:
        _say(render.warn, f"nvml: {snap.nvml_error}", notes)
    return snap


def _say(show: Callable[[str], None], message: str, notes: list[str] | None) -> None:
    if notes is None:
        show(message)
    else:
        notes.append(message)


def _exit_if_unobserved(snap: SnapshotModel, observed: Path | None) -> None:
    """Exit :data:`EXIT_UNOBSERVED` when the observation has no Docker state (the answer
    printed before is then unknown, not an answer about the host)."""
    if snap.to_observed().docker_ok:
        return
    if observed is not None:  # live, the error line was printed as it was observed
        why = snap.docker_error or "no reason recorded"
        render.error(f"{observed}: docker could not be read when this was observed: {why}")
    raise typer.Exit(EXIT_UNOBSERVED)


def _now(snapshot: SnapshotModel) -> float:
    taken = snapshot.taken_at_epoch()
    return taken if taken is not None else time.time()


def _print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False) + "\n")


StrictOpt = Annotated[
    bool,
    typer.Option(
        "--strict", help="Refuse keys this version does not know (otherwise warned of, ignored)."
    ),
]


@_command("Check a manifest set and say where it is wrong.")
def validate(
    manifest: ManifestOpt = [],  # noqa: B006
    json_out: JsonOpt = False,
    router_url: Annotated[
        str | None,
        _router_url_option(
            "The router `run` is given; without one, serves with a router_tier are "
            "warned about (they cannot be stopped)."
        ),
    ] = None,
    strict: StrictOpt = False,
) -> None:
    """Check a manifest set: every error located by file, entry and field.

    A serve with a [serve.model] is checked against its model's files: one that cannot
    be read (model.path), or whose vram_mib is below its weights + KV cache, is an
    error; a vram_mib above them by more than 25 % + 2 GiB is a hint (docs/sizing.md).

    Exit 0 when valid, 1 when not (the errors on stderr, and with --json in the answer).
    """
    from controller.service.model_estimates import model_problems, serve_models
    from statemachine.admission import no_router_warning, router_tiers

    mset = _load(manifest, strict=strict, json_out=json_out)
    desired = mset.desired()
    models = serve_models(mset)
    model_errors, hints = model_problems(mset, models)
    tiers = {} if router_url else router_tiers(desired)
    router_warnings = [no_router_warning(tiers)] if tiers else []
    for warning in router_warnings:
        render.warn(warning)
    for hint in hints:
        render.warn(f"hint: {hint}")
    if model_errors:
        _model_invalid(mset, model_errors, hints, models, json_out)
    if json_out:
        _print_json(_valid_json(mset, [*mset.warnings, *router_warnings], hints, models))
        return
    render.validated(mset, desired)
    if models:
        from controller.interfaces.model_report import validate_lines

        for line in validate_lines(models):
            render.out.print(line)


def _valid_json(
    mset: ManifestSet, warnings: list[str], hints: list[str], models: dict[str, Any]
) -> dict[str, Any]:
    """``validate --json``'s answer for a valid set."""
    desired = mset.desired()
    return {
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
        "warnings": warnings,
        "hints": hints,
        "models": models,
    }


def _model_invalid(
    mset: ManifestSet,
    errors: list[Any],
    hints: list[str],
    models: dict[str, Any],
    json_out: bool,
) -> NoReturn:
    """Exit 1 on the models' errors: each on stderr, and with --json the answer."""
    for err in errors:
        render.error(str(err))
    if json_out:
        _print_json(
            {
                "valid": False,
                "files": [str(f) for f in mset.files],
                "errors": [err.to_json() for err in errors],
                "warnings": mset.warnings,
                "hints": hints,
                "models": models,
            }
        )
    raise typer.Exit(1)


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


# `status --watch` (controller/interfaces/bars.py)
WatchOpt = Annotated[
    bool, typer.Option("--watch", "-w", help="Observe again and redraw in place until Ctrl-C.")
]
IntervalOpt = Annotated[
    float,
    typer.Option(
        "--interval", min=0.2, metavar="SECONDS", help="Seconds between redraws of --watch."
    ),
]
CountOpt = Annotated[
    int, typer.Option("--count", min=0, metavar="N", help="Stop --watch after N draws (0: never).")
]


StateDirOpt = Annotated[
    Path | None,
    typer.Option(
        "--state-dir",
        envvar="VRAMCTL_STATE_DIR",
        metavar="DIR",
        readable=False,  # one that cannot be read is said by _readable_state_dir
        help="The state directory of `run` whose journal is read, never written: the "
        "requests, the card each placed serve was started on, sleepers, elastic reserves, "
        "reload costs and footprints (default: as `run`'s; with --observed, none unless "
        "given).",
    ),
]


def _readable_state_dir(
    manifest: list[Path], state_dir: Path | None, code: int = EXIT_BAD_INPUT
) -> None:
    """Exit ``code`` with one paragraph (the directory, what could not be read, how to fix
    it) when the state directory the command reads is there but this user may not read
    it: its answer would be given without the loop's requests and records."""
    from controller.store.journal import StateDirError, default_state_dir, journal_to_read

    try:
        journal_to_read(state_dir or default_state_dir(list(manifest)))
    except StateDirError as exc:
        _fail(str(exc), code)


def _footprint_samples(manifest: list[Path], state_dir: Path | None) -> list[Any]:
    """The footprint samples of the state directory `run` uses (read only)."""
    from controller.interfaces.footprint_report import load_samples
    from controller.store.journal import default_state_dir

    samples, why = load_samples(state_dir or default_state_dir(list(manifest)))
    if why is not None and state_dir is not None:
        render.warn(f"footprints: {why}")
    return samples


def _situation(
    mset: ManifestSet,
    manifest: list[Path],
    observed: Path | None,
    state_dir: Path | None,
    *,
    router_url: str | None = None,
    nvml_in_answer: bool = False,
    notes: list[str] | None = None,
) -> tuple[SnapshotModel, Situation]:
    """The situation every answer of the CLI is given from (docs/design.md, one
    situation): one observation (live, or the saved ``observed``) with the running
    loop's journal laid over it, read only, from ``state_dir`` (default: the one `run`
    uses). A saved observation is read with a journal only when ``--state-dir`` names
    one. What could not be read, and what was assumed instead, is said on stderr (or in
    ``notes``)."""
    from controller.service.situation import read_journal, snapshot_situation
    from controller.store.journal import default_state_dir

    records, why = None, None
    if observed is None or state_dir is not None:
        records, why = read_journal(state_dir or default_state_dir(list(manifest)))
    snap = _observe(observed, mset, nvml_in_answer=nvml_in_answer, records=records, notes=notes)
    sit = snapshot_situation(mset, snap, records, unread=why, router=bool(router_url))
    for note in sit.notes:
        _say(render.warn, note, notes)
    return snap, sit


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
    margin_pct: Annotated[
        float,
        typer.Option("--margin-pct", min=0.0, metavar="PCT", help="Added to the peak, in percent."),
    ] = 10.0,
    granule_mib: Annotated[
        int,
        typer.Option(
            "--granule-mib", min=1, metavar="MIB", help="The proposal is rounded up to a multiple."
        ),
    ] = 256,
    min_samples: Annotated[
        int,
        typer.Option(
            "--min-samples",
            min=1,
            metavar="N",
            help="Attributable samples needed before proposing.",
        ),
    ] = 3,
    patch: Annotated[
        bool,
        typer.Option("--patch", help="Also print a unified diff of the manifest (not applied)."),
    ] = False,
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
    from statemachine.footprint import propose

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
    serve: Annotated[str, typer.Argument(metavar="SERVE", help="The serve to ask about.")],
    manifest: ManifestOpt = [],  # noqa: B006
    observed: ObservedOpt = None,
    json_out: JsonOpt = False,
    router_url: Annotated[
        str | None,
        _router_url_option(
            "The router `run` is given; without one, a start that drains a router "
            "tier is said to be refused."
        ),
    ] = None,
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
    out: Annotated[
        Path | None,
        typer.Option("--out", metavar="FILE", help="Also write the plan JSON to this file."),
    ] = None,
    detailed_exitcode: Annotated[
        bool,
        typer.Option(
            "--detailed-exitcode",
            help="Exit 0 when there is nothing to do, 2 when there are changes.",
        ),
    ] = False,
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


@_command("Serve the agents' tools over the Model Context Protocol (stdio).")
def mcp(
    manifest: ManifestOpt = [],  # noqa: B006
    observed: ObservedOpt = None,
    state_dir: StateDirOpt = None,
    router_url: Annotated[
        str | None,
        _router_url_option(
            "The router `run` is given; without one, can_fit says a start that drains a "
            "router tier would be refused, as `fit` does."
        ),
    ] = None,
    allow_writes: Annotated[
        bool,
        typer.Option(
            "--allow-writes",
            help="Allow the write tools (request_up, release): with --api and the API's "
            "token, through the running controller; without --api they answer that the "
            "writes need `vramctl run` (there is no running loop to admit a request).",
        ),
    ] = False,
    api: Annotated[
        str | None,
        typer.Option(
            "--api",
            envvar="VRAMCTL_API",
            metavar="HOST:PORT",
            help="Answer from the running controller: forward each call to `vramctl "
            "run`'s /mcp at HOST:PORT (token from --token-file / VRAMCTL_TOKEN). When "
            "it does not answer, the reads observe directly if -m is given.",
        ),
    ] = None,
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


RouterUrlOpt = Annotated[
    str | None,
    _router_url_option("The router whose tiers are quiesced, drained and readmitted."),
]
RouterTokenOpt = Annotated[
    Path | None,
    typer.Option(
        "--router-token-file",
        envvar="VRAMCTL_ROUTER_TOKEN_FILE",
        metavar="FILE",
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
        _fail(
            f"{path}: not a saved plan: it has no steps and observation "
            "(`vramctl plan --out FILE` writes one)"
        )
    return data


@_command("Observe, plan and carry the plan out, once.")
def apply(
    plan_file: Annotated[
        Path | None,
        typer.Argument(
            metavar="PLAN", help="A plan saved by `vramctl plan --out`; default: plan now."
        ),
    ] = None,
    manifest: ManifestOpt = [],  # noqa: B006
    router_url: RouterUrlOpt = None,
    router_token_file: RouterTokenOpt = None,
    state_dir: Annotated[
        Path | None,
        typer.Option(
            "--state-dir",
            envvar="VRAMCTL_STATE_DIR",
            metavar="DIR",
            readable=False,  # one that cannot be locked is said by StateLock
            help="The state dir whose lock a running `vramctl run` holds (same default).",
        ),
    ] = None,
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
    from statemachine.ledger import ledger_from_observed

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
    from statemachine.ledger import Refusal, ledger_from_observed
    from statemachine.planner import Plan, Step
    from statemachine.simulate import apply_step

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


ApiOpt = Annotated[
    str,
    typer.Option(
        "--api",
        envvar="VRAMCTL_API",
        metavar="HOST:PORT",
        help="HOST:PORT of the loop's HTTP API ([::1]:PORT for IPv6).",
    ),
]
TokenFileOpt = Annotated[
    Path | None,
    typer.Option(
        "--token-file",
        envvar="VRAMCTL_TOKEN_FILE",
        metavar="FILE",
        help="File holding the API's bearer token (else the VRAMCTL_TOKEN variable).",
    ),
]


@_command("Run the control loop that keeps the host converged.")
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
            metavar="DIR",
            readable=False,  # one that cannot be locked is said by StateLock
            help="Journal and lock (default: $XDG_STATE_HOME/vramctl, else .vramctl-state/ "
            "beside the first manifest).",
        ),
    ] = None,
    resync: Annotated[
        float,
        typer.Option(
            "--resync",
            envvar="VRAMCTL_RESYNC",
            min=0.5,
            metavar="SECONDS",
            help="Seconds between resyncs.",
        ),
    ] = 5.0,
    router_url: RouterUrlOpt = None,
    router_token_file: RouterTokenOpt = None,
    log_json: LogJsonOpt = False,
    api: ApiOpt = "127.0.0.1:8477",
    no_api: Annotated[
        bool,
        typer.Option("--no-api", envvar="VRAMCTL_NO_API", help="Run without the HTTP API."),
    ] = False,
    token_file: TokenFileOpt = None,
    settle_s: Annotated[
        float,
        typer.Option(
            "--settle-s",
            envvar="VRAMCTL_SETTLE_S",
            min=0.0,
            metavar="SECONDS",
            help="Seconds after a start is healthy before its footprint's steady reading.",
        ),
    ] = 30.0,
    allow_origin: Annotated[
        list[str] | None,
        typer.Option(
            "--allow-origin",
            envvar="VRAMCTL_ALLOW_ORIGIN",
            metavar="ORIGIN",
            help="A browser Origin the API accepts (repeat; the variable takes a space-"
            "separated list). Requests with any other Origin header are refused.",
        ),
    ] = None,
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
    serve: Annotated[str, typer.Argument(metavar="SERVE", help="The serve to start on demand.")],
    ttl: Annotated[
        float | None,
        typer.Option(
            "--ttl",
            metavar="SECONDS",
            help="Seconds the request lasts (default: until the serve has had no request "
            "in flight for its idle_ttl_s).",
        ),
    ] = None,
    wait: Annotated[
        float | None,
        typer.Option(
            "--wait",
            metavar="S",
            help="Wait up to S seconds (at most 600) until the serve is healthy and "
            "routable, the attempt fails, or S passes.",
        ),
    ] = None,
    queue: Annotated[
        bool,
        typer.Option(
            "--queue",
            help="If it cannot fit now only because memory or a port is held by serves "
            "that go away by themselves, wait in the GPU role's FIFO queue instead of a 429.",
        ),
    ] = False,
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
    serve: Annotated[
        str, typer.Argument(metavar="SERVE", help="The serve whose on-demand request ends.")
    ],
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
    since: Annotated[
        int | None,
        typer.Option(
            "--since",
            min=0,
            metavar="ID",
            help="Begin after this event id (those still kept are replayed; a gap says "
            "what is no longer kept). Default: only new events.",
        ),
    ] = None,
    count: Annotated[
        int, typer.Option("--count", min=0, metavar="N", help="Stop after N events (0: never).")
    ] = 0,
    json_out: Annotated[
        bool, typer.Option("--json", help="Print each event as one JSON line.")
    ] = False,
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


@_command("Re-plan recorded cycles; show where the plans differ.", "replay")
def replay_cmd(
    source: Annotated[
        Path,
        typer.Argument(
            metavar="SOURCE",
            help="A journal (state dir's journal.sqlite3) or an observed snapshot.",
        ),
    ],
    manifest: ManifestOpt = [],  # noqa: B006
    cycle: Annotated[
        int | None, typer.Option("--cycle", metavar="N", help="Only this cycle.")
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Re-plan recorded cycles with this manifest; show where the plans differ. Executes nothing.

    Exit 0 when every cycle plans the same, 2 when some differ, 1 on errors.
    """
    from controller.tools.replay import ReplayError, render_replay, replay

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


ComposeOpt = Annotated[
    list[Path],
    typer.Option(
        "--compose",
        "-c",
        metavar="FILE",
        help="Docker Compose file; repeat to merge several, like `docker compose -f a -f b`.",
    ),
]


def _measured_totals(observed: Path | None, mset: ManifestSet) -> dict[str, int] | None:
    """NVML device totals by role id from an observed snapshot; None without one."""
    from statemachine.engine_flags import measured_totals

    if observed is None:
        return None
    gpus = _observe(observed, mset).to_observed().gpus
    return measured_totals(mset.desired().roles, gpus)


@_command(
    "Print the engine flag that enforces SERVE's reservation.", "render"
)  # not `def render`: that would shadow the `render` module
def render_cmd(
    serve: Annotated[
        str, typer.Argument(metavar="SERVE", help="The serve whose engine flag to print.")
    ],
    manifest: ManifestOpt = [],  # noqa: B006
    compose: ComposeOpt = [],  # noqa: B006
    engine: Annotated[
        str | None,
        typer.Option(
            "--engine",
            metavar="ENGINE",
            help="The engine that runs SERVE (vllm, sglang); overrides "
            "its label and its compose command.",
        ),
    ] = None,
    device_total: Annotated[
        int | None,
        typer.Option(
            "--device-total",
            min=1,
            metavar="MIB",
            help="Device total in MiB for SERVE's roles, instead of their declared "
            "vram_mib (or the NVML total of --observed).",
        ),
    ] = None,
    observed: ObservedOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Print the engine flag that enforces SERVE's reservation (docs/limits.md), and with
    [serve.model] its engine's limit flags (docs/sizing.md); the arithmetic on stderr.

    Exit 0 with the flags, 1 when there is none (no reservation, an engine without a
    memory-fraction or limit flag, no device total), when the model cannot load in the
    reservation, or on errors.
    """
    from controller.service.model_estimates import limit_inputs
    from controller.tools.compose_lint import ComposeError, render_serve
    from statemachine.engine_flags import SOURCE_NVML

    mset = _load(manifest)
    if serve not in mset.serves:
        _fail(render.unknown_serve(serve, mset.desired()))
    measured: dict[str, int] | None = None
    source = SOURCE_NVML
    if device_total is not None:
        measured = dict.fromkeys(mset.serves[serve].roles, device_total)
        source = "--device-total"
    else:
        measured = _measured_totals(observed, mset)
    try:
        answer = render_serve(
            mset,
            serve,
            measured=measured,
            measured_source=source,
            engine=engine,
            compose_paths=compose,
            models=limit_inputs(mset, [serve]),
        )
    except ComposeError as exc:
        for problem in exc.problems:
            render.error(problem)
        raise typer.Exit(1) from None
    # the engine's fraction flag, where it has one, is needed as before
    unfit = answer.result.flag is not None and answer.result.text is None
    rendered = bool(answer.argv) and not answer.cannot_load and not unfit
    now = _start_values(mset, serve, observed) if answer.result.of_free else None
    if json_out:
        _print_json(answer.to_json() if now is None else {**answer.to_json(), "at_start": now})
    elif not rendered:
        problems = [str(answer.result.problem)] if unfit or not answer.argv else []
        problems += [f"{x.flag.name}: {x.explanation}" for x in answer.refused]
        if not answer.refused and answer.verdict is not None and answer.verdict.error:
            problems.append(answer.verdict.message)
        for problem in problems:
            render.error(f"{serve}: {problem}")
    else:
        _render_flags(answer)
        if now is not None:
            render.err.print(f"at a start on the observed host: {now['text']}", markup=False)
    raise typer.Exit(0 if rendered else 1)


def _start_values(mset: ManifestSet, serve: str, observed: Path | None) -> dict[str, Any] | None:
    """What a start of ``serve`` would set now on the host ``observed`` saw
    (``VRAMCTL_FREE_MIB``, ``VRAMCTL_FRACTION_OF_FREE``: statemachine/gpu_vars.py), the
    others counted as the ledger counts them; ``None`` without an observation."""
    from statemachine.gpu_vars import free_at_start, gpu_placement
    from statemachine.ledger import ledger_from_observed

    if observed is None:
        return None
    obs = _observe(observed, mset).to_observed()
    desired = mset.desired()
    spec = desired.serves[serve]
    roles = spec.gpu_roles
    free = free_at_start(roles, serve, ledger_from_observed(desired, obs), desired.roles, obs.gpus)
    placed = gpu_placement(roles, desired.roles, obs.gpus, free=free, vram_mib=spec.vram_mib)
    names = ("VRAMCTL_FREE_MIB", "VRAMCTL_FRACTION_OF_FREE")
    values = {n: placed.values.get(n) for n in names}
    said = "; ".join(
        f"{n}={v}" if v is not None else f"{n} unknown: {placed.unknown[n]}"
        for n, v in values.items()
    )
    return {**values, "text": f"{said} (vram_mib {spec.vram_mib} ÷ the MiB free)"}


def _render_flags(answer: RenderedServe) -> None:
    """``render``'s answer: the flags on stdout, their arithmetic on stderr (a limit
    whose value is unknown is said so, never 0)."""
    result, needs = answer.result, answer.sleep
    flags = " ".join(needs.flags) if needs is not None else ""
    render.out.print(" ".join(w for w in (*answer.argv, flags) if w), markup=False)
    if result.text is not None:
        render.err.print(result.explanation, markup=False)
    for limit in answer.limits:
        value = "unknown" if limit.value is None else str(limit.value)
        render.err.print(f"{limit.flag.name} {value}: {limit.explanation}", markup=False)
    if answer.cache_types is not None:
        cache = answer.cache_types
        render.err.print(f"{' '.join(cache.argv)}: {cache.explanation}", markup=False)
    if answer.elastic is not None:
        render.err.print(f"elastic: {answer.elastic.explanation}", markup=False)
    if needs is not None:
        env = " ".join(f"{k}={v}" for k, v in sorted(needs.env.items()))
        render.err.print(
            f"[serve.sleep]: the engine's sleep API needs {needs.text}"
            + (f" (set {env} in its environment)" if env else ""),
            markup=False,
        )


@_command("Check the compose files' engine memory flags.")
def lint(
    manifest: ManifestOpt = [],  # noqa: B006
    compose: ComposeOpt = [],  # noqa: B006
    tolerance: Annotated[
        float,
        typer.Option(
            "--tolerance",
            min=0.0,
            metavar="FRACTION",
            help="How far a fraction may be from vram_mib / device total, as a "
            "fraction of the device total (default 0.001).",
        ),
    ] = 0.001,
    observed: ObservedOpt = None,
    use_env: Annotated[
        bool,
        typer.Option(
            "--env/--no-env",
            help="Resolve ${VARS} from this shell, as compose would; default: their defaults only.",
        ),
    ] = False,
    json_out: JsonOpt = False,
) -> None:
    """Do the compose files' engine flags enforce the reservations? Exit 0 clean, 1 not.

    Errors: a serve whose command lacks its engine's memory-fraction flag or sets a
    fraction off its reservation by more than the tolerance. Notes explain the rest.
    """
    import os
    from decimal import Decimal

    from controller.service.model_estimates import limit_inputs
    from controller.tools.compose_lint import ComposeError, lint_compose, report_lines

    mset = _load(manifest)
    if not compose:
        _fail("no compose file given: pass --compose FILE (repeat to merge several)")
    try:
        report = lint_compose(
            mset,
            compose,
            measured=_measured_totals(observed, mset),
            tolerance=Decimal(str(tolerance)),
            environ=dict(os.environ) if use_env else None,
            models=limit_inputs(mset),
        )
    except ComposeError as exc:
        for problem in exc.problems:
            render.error(problem)
        raise typer.Exit(1) from None
    if json_out:
        _print_json(report.to_json())
    else:
        for line in report_lines(report):
            render.out.print(line, markup=False)
    raise typer.Exit(0 if report.ok else 1)


PathArg = Annotated[
    Path,
    typer.Argument(
        metavar="PATH",
        help="A .gguf file (the first of a split model), a .safetensors file, a folder of "
        "safetensors shards with its config.json, or a model.safetensors.index.json.",
    ),
]


@_command("What a model needs, term by term, read from its files.")
def estimate(
    path: PathArg,
    context: Annotated[
        int | None,
        typer.Option(
            "--context",
            min=1,
            metavar="N",
            help="Tokens each sequence may hold (default: the model's own context length).",
        ),
    ] = None,
    kv_dtype: Annotated[
        str,
        typer.Option(
            "--kv-dtype",
            metavar="TYPE",
            help="How the KV cache is stored: f16, bf16, f32, or ggml's q8_0 / q4_0 blocks.",
        ),
    ] = "f16",
    parallel: Annotated[
        int,
        typer.Option("--parallel", min=1, metavar="N", help="Sequences cached at once."),
    ] = 1,
    engine: Annotated[
        str | None,
        typer.Option(
            "--engine",
            metavar="ENGINE",
            help="The engine that will run it (vllm, sglang, llamacpp): the KV cache as it "
            "lays it out (vLLM's blocks, llama.cpp's 256-cell padding), and the overheads "
            "its registry entry documents shown as assumptions.",
        ),
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """What a model needs, term by term, read from its files without loading a tensor.

    Weights are the tensors' sizes; the KV cache is 2 × layers × KV heads × head_dim ×
    context × bytes per element × parallel; the CUDA context, activations, CUDA graphs
    and the engine's overheads are unknown (measure them with `vramctl calibrate`).
    Exit 0 with the estimate, 2 on bad input (a missing path, another format, a
    truncated file, a config.json without a figure).
    """
    from controller.adapters.model_files import ModelFileError, read_model
    from controller.interfaces.estimate_report import print_estimate
    from statemachine import engines, sizing
    from statemachine.kv_layout import engine_kv_term

    if kv_dtype not in sizing.KV_DTYPES:
        known = ", ".join(sizing.KV_DTYPES)
        raise typer.BadParameter(f"{kv_dtype!r}: one of {known}", param_hint="'--kv-dtype'")
    found = engines.lookup(engine)
    if engine is not None and found is None:
        known = ", ".join(engines.names())
        raise typer.BadParameter(f"no engine {engine!r}; known: {known}", param_hint="'--engine'")
    try:
        files = read_model(path)
    except ModelFileError as exc:
        _fail(str(exc), 2)
    layout_kv = None
    if found is not None:
        layout_kv = engine_kv_term(
            files.architecture,
            context=context,
            kv_dtype=kv_dtype,
            parallel=parallel,
            layout=found.kv_layout,
        )
    result = sizing.estimate(
        str(path),
        files.format,
        files.weights,
        files.architecture,
        context=context,
        kv_dtype=kv_dtype,
        parallel=parallel,
        engine=found,
        kv=layout_kv,
    )
    if json_out:
        _print_json(result.to_json())
        return
    print_estimate(result, render.out)


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
