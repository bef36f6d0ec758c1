"""Every option and argument of the ``vramctl`` commands, each an ``Annotated`` alias a
command's signature names (``manifest: ManifestOpt = []``): the shared ones first, then
each command's own, in the order ``vramctl --help`` lists the commands. Their help, names,
environment variables, defaults and metavars are the CLI contract (docs/operations.md).

Declarations (and ``--version``'s callback) only: must not import the manifest model,
rich, the core, the server, Docker or HTTP libraries (``--help`` builds every option from
here).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer


def _version() -> str:
    """This install's version (its metadata); run from a checkout that is not installed,
    the version its pyproject.toml declares."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("vramctl")
    except PackageNotFoundError:
        import tomllib

        pyproject = Path(__file__).resolve().parents[3] / "pyproject.toml"
        try:
            with pyproject.open("rb") as file:
                return str(tomllib.load(file)["project"]["version"])
        except (OSError, KeyError, tomllib.TOMLDecodeError):
            return "unknown"


def _print_version(value: bool) -> None:
    """``--version`` (eager: before any command is parsed): ``vramctl VERSION``, exit 0."""
    if value:
        sys.stdout.write(f"vramctl {_version()}\n")
        raise typer.Exit(0)


VersionOpt = Annotated[
    bool,
    typer.Option(
        "--version", is_eager=True, callback=_print_version, help="Print the version and exit."
    ),
]

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


def _serve_argument(help_text: str) -> Any:
    """The ``SERVE`` argument, with a command's help."""
    return typer.Argument(metavar="SERVE", help=help_text)


# the SERVE argument of `fit`, `up`, `down` and `render`
FitServeArg = Annotated[str, _serve_argument("The serve to ask about.")]
UpServeArg = Annotated[str, _serve_argument("The serve to start on demand.")]
DownServeArg = Annotated[str, _serve_argument("The serve whose on-demand request ends.")]
RenderServeArg = Annotated[str, _serve_argument("The serve whose engine flag to print.")]


StrictOpt = Annotated[
    bool,
    typer.Option(
        "--strict", help="Refuse keys this version does not know (otherwise warned of, ignored)."
    ),
]


def _state_dir_option(help_text: str) -> Any:
    """The ``--state-dir`` option (``VRAMCTL_STATE_DIR``), with a command's help. Not
    checked readable here: one that cannot be read is said by ``_readable_state_dir``,
    one that cannot be locked by ``StateLock``."""
    return typer.Option(
        "--state-dir", envvar="VRAMCTL_STATE_DIR", metavar="DIR", readable=False, help=help_text
    )


StateDirOpt = Annotated[
    Path | None,
    _state_dir_option(
        "The state directory of `run` whose journal is read, never written: the "
        "requests, the card each placed serve was started on, sleepers, elastic reserves, "
        "reload costs and footprints (default: as `run`'s; with --observed, none unless "
        "given)."
    ),
]


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


#: where `run` serves its HTTP API unless ``--api`` says otherwise
SERVED_API = "127.0.0.1:8477"


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


ComposeOpt = Annotated[
    list[Path],
    typer.Option(
        "--compose",
        "-c",
        metavar="FILE",
        help="Docker Compose file; repeat to merge several, like `docker compose -f a -f b`.",
    ),
]


PathArg = Annotated[
    Path,
    typer.Argument(
        metavar="PATH",
        help="A .gguf file (the first of a split model), a .safetensors file, a folder of "
        "safetensors shards with its config.json, or a model.safetensors.index.json.",
    ),
]

# `validate`
ValidateRouterUrlOpt = Annotated[
    str | None,
    _router_url_option(
        "The router `run` is given; without one, serves with a router_tier are "
        "warned about (they cannot be stopped)."
    ),
]


# `calibrate`
MarginPctOpt = Annotated[
    float,
    typer.Option("--margin-pct", min=0.0, metavar="PCT", help="Added to the peak, in percent."),
]
GranuleMibOpt = Annotated[
    int,
    typer.Option(
        "--granule-mib", min=1, metavar="MIB", help="The proposal is rounded up to a multiple."
    ),
]
MinSamplesOpt = Annotated[
    int,
    typer.Option(
        "--min-samples",
        min=1,
        metavar="N",
        help="Attributable samples needed before proposing.",
    ),
]
PatchOpt = Annotated[
    bool,
    typer.Option("--patch", help="Also print a unified diff of the manifest (not applied)."),
]


# `fit`
FitRouterUrlOpt = Annotated[
    str | None,
    _router_url_option(
        "The router `run` is given; without one, a start that drains a router "
        "tier is said to be refused."
    ),
]


# `plan`
PlanOutOpt = Annotated[
    Path | None,
    typer.Option("--out", metavar="FILE", help="Also write the plan JSON to this file."),
]
DetailedExitcodeOpt = Annotated[
    bool,
    typer.Option(
        "--detailed-exitcode",
        help="Exit 0 when there is nothing to do, 2 when there are changes.",
    ),
]


# `mcp`
McpRouterUrlOpt = Annotated[
    str | None,
    _router_url_option(
        "The router `run` is given; without one, can_fit says a start that drains a "
        "router tier would be refused, as `fit` does."
    ),
]
AllowWritesOpt = Annotated[
    bool,
    typer.Option(
        "--allow-writes",
        help="Allow the write tools (request_up, release): with --api and the API's "
        "token, through the running controller; without --api they answer that the "
        "writes need `vramctl run` (there is no running loop to admit a request).",
    ),
]
McpApiOpt = Annotated[
    str | None,
    typer.Option(
        "--api",
        envvar="VRAMCTL_API",
        metavar="HOST:PORT",
        help="Answer from the running controller: forward each call to `vramctl "
        "run`'s /mcp at HOST:PORT (token from --token-file / VRAMCTL_TOKEN). When "
        "it does not answer, the reads observe directly if -m is given.",
    ),
]


# `apply`
PlanArg = Annotated[
    Path | None,
    typer.Argument(metavar="PLAN", help="A plan saved by `vramctl plan --out`; default: plan now."),
]
ApplyStateDirOpt = Annotated[
    Path | None,
    _state_dir_option("The state dir whose lock a running `vramctl run` holds (same default)."),
]


# `run`
DryRunOpt = Annotated[
    bool,
    typer.Option("--dry-run", envvar="VRAMCTL_DRY_RUN", help="Observe and plan; execute nothing."),
]
RunStateDirOpt = Annotated[
    Path | None,
    _state_dir_option(
        "Journal and lock (default: $XDG_STATE_HOME/vramctl, else .vramctl-state/ "
        "beside the first manifest)."
    ),
]
ResyncOpt = Annotated[
    float,
    typer.Option(
        "--resync",
        envvar="VRAMCTL_RESYNC",
        min=0.5,
        metavar="SECONDS",
        help="Seconds between resyncs.",
    ),
]
NoApiOpt = Annotated[
    bool,
    typer.Option("--no-api", envvar="VRAMCTL_NO_API", help="Run without the HTTP API."),
]
SettleOpt = Annotated[
    float,
    typer.Option(
        "--settle-s",
        envvar="VRAMCTL_SETTLE_S",
        min=0.0,
        metavar="SECONDS",
        help="Seconds after a start is healthy before its footprint's steady reading.",
    ),
]
AllowOriginOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--allow-origin",
        envvar="VRAMCTL_ALLOW_ORIGIN",
        metavar="ORIGIN",
        help="A browser Origin the API accepts (repeat; the variable takes a space-"
        "separated list). Requests with any other Origin header are refused.",
    ),
]


# `up`
TtlOpt = Annotated[
    float | None,
    typer.Option(
        "--ttl",
        metavar="SECONDS",
        help="Seconds the request lasts (default: until the serve has had no request "
        "in flight for its idle_ttl_s).",
    ),
]
WaitOpt = Annotated[
    float | None,
    typer.Option(
        "--wait",
        metavar="S",
        help="Wait up to S seconds (at most 600) until the serve is healthy and "
        "routable, the attempt fails, or S passes.",
    ),
]
QueueOpt = Annotated[
    bool,
    typer.Option(
        "--queue",
        help="If it cannot fit now only because memory or a port is held by serves "
        "that go away by themselves, wait in the GPU role's FIFO queue instead of a 429.",
    ),
]


# `events`
SinceOpt = Annotated[
    int | None,
    typer.Option(
        "--since",
        min=0,
        metavar="ID",
        help="Begin after this event id (those still kept are replayed; a gap says "
        "what is no longer kept). Default: only new events.",
    ),
]
EventsCountOpt = Annotated[
    int, typer.Option("--count", min=0, metavar="N", help="Stop after N events (0: never).")
]
EventsJsonOpt = Annotated[bool, typer.Option("--json", help="Print each event as one JSON line.")]


# `replay`
SourceArg = Annotated[
    Path,
    typer.Argument(
        metavar="SOURCE",
        help="A journal (state dir's journal.sqlite3) or an observed snapshot.",
    ),
]
CycleOpt = Annotated[int | None, typer.Option("--cycle", metavar="N", help="Only this cycle.")]


# `render`
RenderEngineOpt = Annotated[
    str | None,
    typer.Option(
        "--engine",
        metavar="ENGINE",
        help="The engine that runs SERVE (vllm, sglang); overrides "
        "its label and its compose command.",
    ),
]
DeviceTotalOpt = Annotated[
    int | None,
    typer.Option(
        "--device-total",
        min=1,
        metavar="MIB",
        help="Device total in MiB for SERVE's roles, instead of their declared "
        "vram_mib (or the NVML total of --observed).",
    ),
]


# `lint`
ToleranceOpt = Annotated[
    float,
    typer.Option(
        "--tolerance",
        min=0.0,
        metavar="FRACTION",
        help="How far a fraction may be from vram_mib / device total, as a "
        "fraction of the device total (default 0.001).",
    ),
]
UseEnvOpt = Annotated[
    bool,
    typer.Option(
        "--env/--no-env",
        help="Resolve ${VARS} from this shell, as compose would; default: their defaults only.",
    ),
]


# `estimate`
ContextOpt = Annotated[
    int | None,
    typer.Option(
        "--context",
        min=1,
        metavar="N",
        help="Tokens each sequence may hold (default: the model's own context length).",
    ),
]
KvDtypeOpt = Annotated[
    str,
    typer.Option(
        "--kv-dtype",
        metavar="TYPE",
        help="How the KV cache is stored: f16, bf16, f32, or ggml's q8_0 / q4_0 blocks.",
    ),
]
ParallelOpt = Annotated[
    int,
    typer.Option("--parallel", min=1, metavar="N", help="Sequences cached at once."),
]
EstimateEngineOpt = Annotated[
    str | None,
    typer.Option(
        "--engine",
        metavar="ENGINE",
        help="The engine that will run it (vllm, sglang, llamacpp): the KV cache as it "
        "lays it out (vLLM's blocks, llama.cpp's 256-cell padding), and the overheads "
        "its registry entry documents shown as assumptions.",
    ),
]
