"""End to end with the real engine: llama.cpp's own ``llama-server`` as Compose services.

The serves are Compose services of the image tests/docker/ensure-engine.sh builds,
loading model files tests/engine_models.py writes; each service's command is the
engine's model and address followed by what ``vramctl render`` prints for the serve
(nothing hand-written about memory). ``vramctl run`` (a subprocess with its API, as in
tests/e2e/test_busy_e2e.py) creates them through their ``up`` and waits on the engine's
real ``/health`` (503 while it loads); it reads requests in flight from the engine's
real ``/metrics`` (``llamacpp:requests_processing`` + ``llamacpp:requests_deferred``),
so the on-demand serve's idleness, and with it the end of its request, follows real
requests; it evicts the running server to make room for the requested one and brings
it back when the request ends. Docker's event stream checks that the budget held at
every start and death, and that nothing started twice.
"""

from __future__ import annotations

import shlex
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import test_run_e2e
from compose_stack import ComposeStack, stack_beside
from engine_models import SHAPES, write
from support.waiting import wait_for
from test_busy_e2e import serve_row, start_with_api
from test_run_e2e import RESYNC_S, Fleet, healthy, vramctl

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.xdist_group("real-engine")]

fleet = test_run_e2e.fleet  # the fixture: the test's containers, manifest and controllers

IDLE_TTL_S = 4.0
ROLE = """
[[gpu_roles]]
id = "a"
vram_mib = 10000
reserve_mib = 0
"""


@pytest.fixture
def stack(fleet: Fleet, engine_image: str) -> Iterator[ComposeStack]:
    with stack_beside(fleet, engine_image) as s:
        yield s


def llama_serve(
    stack: ComposeStack, name: str, *, model: str, context: int, residency: str, extra: str = ""
) -> str:
    """A llama.cpp serve of the stack: ``[serve.model]`` names its file, ``up`` is Compose."""
    return f"""
[[serve]]
name = "{name}"
engine = "llama.cpp"
container = "{stack.container(name)}"
gpu_role = "a"
vram_mib = 6000
residency = "{residency}"
port = {stack.services[name].port}
health = "/health"
start_timeout_s = 120
stop_timeout_s = 10
up = "{stack.up_command(name)}"
{extra}
[serve.model]
path = "models/{model}.gguf"
context = {context}
parallel = 1
"""


def rendered(fleet: Fleet, serve: str) -> list[str]:
    """What ``vramctl render`` prints for the serve: its engine's limit flags."""
    r = vramctl("render", serve, "-m", str(fleet.manifest))
    assert r.returncode == 0, r.stdout + r.stderr
    return shlex.split(r.stdout)


def engine_command(model: str, port: int, flags: list[str]) -> tuple[str, ...]:
    """The service's command: the engine's model and address, its metrics on, and the
    flags render gave (the image's entrypoint is ``llama-server``)."""
    address = ("--host", "127.0.0.1", "--port", str(port))
    return ("-m", f"/models/{model}.gguf", *address, "--metrics", *flags)


def build(fleet: Fleet, stack: ComposeStack) -> dict[str, list[str]]:
    """Models, manifest and Compose file for ``chat`` (evictable, running) and ``ask``
    (on-demand, ended by measured idleness); each service's flags from render."""
    models = fleet.tmp / "models"
    write(SHAPES["plain"], models / "plain.gguf")
    write(SHAPES["long"], models / "long.gguf")
    chat, ask = stack.add("chat"), stack.add("ask")
    fleet.mib.update(chat=6000, ask=6000)  # 6000 + 6000 > 10000: chat must make room
    fleet.manifest.write_text(
        ROLE
        + llama_serve(
            stack,
            "chat",
            model="plain",
            context=1024,
            residency="evictable",
            extra='desired = "running"',
        )
        + llama_serve(
            stack,
            "ask",
            model="long",
            context=32768,
            residency="on-demand",
            extra=f"idle_ttl_s = {IDLE_TTL_S}",
        )
    )
    flags = {name: rendered(fleet, name) for name in ("chat", "ask")}
    for svc, model in ((chat, "plain"), (ask, "long")):
        svc.command = engine_command(model, svc.port, flags[svc.name])
        svc.volumes = (f"{models}:/models:ro",)
    stack.write()
    return flags


class Generation:
    """One streamed ``/completion`` to the real engine, held open until :meth:`cancel`
    (the engine drops a request whose client went away)."""

    def __init__(self, port: int) -> None:
        self.started = threading.Event()
        self.finished = False  # the engine ended the stream itself
        self._stop = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(port,), daemon=True)
        self._thread.start()

    def _run(self, port: int) -> None:
        body = {"prompt": "hello", "n_predict": -1, "ignore_eos": True, "stream": True}
        try:
            with httpx.stream(
                "POST", f"http://127.0.0.1:{port}/completion", json=body, timeout=None
            ) as r:
                for _ in r.iter_lines():
                    self.started.set()
                    if self._stop.is_set():
                        return
            self.finished = True
        except BaseException as exc:
            self.error = exc

    def cancel(self) -> None:
        self._stop.set()
        self._thread.join(30)


def test_real_servers_are_started_read_evicted_and_brought_back_by_the_loop(
    fleet: Fleet, stack: ComposeStack
) -> None:
    flags = build(fleet, stack)
    assert flags["chat"][:4] == ["--n-gpu-layers", "5", "--ctx-size", "1024"], flags
    run, http = start_with_api(fleet)
    run.wait_step("chat await_ready ok")
    chat_port, ask_port = stack.services["chat"].port, stack.services["ask"].port
    assert healthy(chat_port)
    props = httpx.get(f"http://127.0.0.1:{chat_port}/props", timeout=5).json()
    assert props["model_path"] == "/models/plain.gguf"
    assert props["default_generation_settings"]["n_ctx"] == 1024  # the rendered context
    row = wait_for(
        "chat's in-flight count read",
        lambda: (r := serve_row(http, "chat"))["in_flight"] is not None and r,
    )
    assert (row["in_flight"], row["in_flight_source"]) == (0, "metrics")

    # a request for ask: chat (evictable) makes room, ask is created by its `up`
    fleet.request("ask")
    run.wait_step("ask await_ready ok")
    assert fleet.state("chat") == "exited"
    assert healthy(ask_port)

    # a real request in flight: the loop reads it from the engine's own /metrics, and
    # ask's request does not end while it runs
    gen = Generation(ask_port)
    assert gen.started.wait(60), gen.error
    since = time.time()

    def busy_past_the_ttl() -> dict[str, Any] | None:
        row = serve_row(http, "ask")
        past = (row["observed_at"] or 0) > since + 2 * IDLE_TTL_S + RESYNC_S
        return row if past and row["in_flight"] == 1 else None

    busy = wait_for("ask observed busy past its idle_ttl_s", busy_past_the_ttl)
    assert (busy["in_flight_source"], busy["request"]["expires_at"]) == ("metrics", None)
    assert fleet.state("ask") == "running"
    assert gen.error is None and not gen.finished  # the engine is still generating
    gen.cancel()

    # idle for idle_ttl_s from the first reading of 0: the request ends, ask stops, and
    # chat comes back
    def idle_with_its_request() -> dict[str, Any] | None:
        r = serve_row(http, "ask")
        return r if r["in_flight"] == 0 and r["request"] is not None else None

    idle = wait_for("ask seen idle", idle_with_its_request)
    assert idle["request"]["expires_at"] == pytest.approx(idle["idle_since"] + IDLE_TTL_S, abs=0.5)
    fleet.wait_state("ask", "exited")
    fleet.wait_state("chat", "running")
    wait_for("chat healthy again", lambda: healthy(chat_port))
    assert run.stop() == 0, run.text()
    fleet.assert_never_overcommitted()
    assert (fleet.starts("chat"), fleet.starts("ask")) == (2, 1)


def test_a_real_server_that_sleeps_by_itself_is_shown_asleep_and_keeps_its_reservation(
    fleet: Fleet, stack: ComposeStack
) -> None:
    """llama.cpp's --sleep-idle-seconds: the engine unloads its model when idle and
    reloads it on any request, outside the ledger. lint explains it; the loop reads the
    engine's own /props and shows it asleep, its whole reservation still held; a real
    request wakes it, and it is shown awake while it serves."""
    models = fleet.tmp / "models"
    write(SHAPES["long"], models / "long.gguf")
    nap = stack.add("nap")
    fleet.mib.update(nap=6000)
    fleet.manifest.write_text(
        ROLE
        + llama_serve(
            stack,
            "nap",
            model="long",
            context=32768,
            residency="evictable",
            extra='desired = "running"',
        )
    )
    nap.command = (
        *engine_command("long", nap.port, rendered(fleet, "nap")),
        "--sleep-idle-seconds",
        "1",
    )
    nap.volumes = (f"{models}:/models:ro",)
    stack.write()
    lint = vramctl("lint", "-m", str(fleet.manifest), "--compose", str(stack.file))
    assert lint.returncode == 0, lint.stdout + lint.stderr
    assert "self-sleep: --sleep-idle-seconds 1: the engine unloads its model" in lint.stdout
    assert "keeps its whole reservation (6000 MiB)" in lint.stdout

    run, http = start_with_api(fleet)
    run.wait_step("nap await_ready ok")
    asleep = wait_for(
        "nap asleep by itself",
        lambda: (r := serve_row(http, "nap")).get("self_sleep") == "asleep" and r,
    )
    assert (asleep["state"], asleep["held_mib"], asleep["committed"]) == ("running", 6000, True)
    props = httpx.get(f"http://127.0.0.1:{nap.port}/props", timeout=5).json()
    assert props["is_sleeping"] is True  # the engine's own word
    shown = vramctl("status", "-m", str(fleet.manifest))
    assert "nap: asleep by itself" in shown.stdout and "keeps 6000 MiB" in shown.stdout, (
        shown.stdout
    )

    # a real request reloads the model: shown awake (and busy) while it serves
    gen = Generation(nap.port)
    assert gen.started.wait(120), gen.error
    awake = wait_for(
        "nap awake and busy",
        lambda: (
            (r := serve_row(http, "nap")).get("self_sleep") == "awake" and r["in_flight"] == 1 and r
        ),
    )
    assert awake["held_mib"] == 6000
    gen.cancel()
    assert run.stop() == 0, run.text()
    fleet.assert_never_overcommitted()
