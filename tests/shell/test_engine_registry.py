"""Adding an engine is one module: a made-up engine, registered as one module here, is
picked up by render (``statemachine.flags.fraction``), lint (``compose_lint``), the manifest,
the sleep adapter (against a stand-in speaking its sleep API on loopback) and the
in-flight metrics (``engine_metrics``), with no other code changed.
"""

from __future__ import annotations

import textwrap
import types
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import httpx
import pytest
from fake_http import FakeHTTPServer, Recorded, Reply, ReplyLike
from support.files import compose, manifest

from controller.adapters.engine_metrics import engine_kind, parse_in_flight, read_metrics
from controller.adapters.sleep import SleepClient
from controller.manifest import ManifestError
from controller.service.sleeping import Sleeper, wake_engine
from controller.tools.compose_lint import lint_compose, render_serve
from statemachine import engines
from statemachine.engines import Detection, Engine, FlagUnit, HttpCall, MemoryFlag, SleepApi
from statemachine.flags.fraction import (
    DeviceTotal,
    FindingKind,
    SleepNeeds,
    check_fraction,
    engine_of_argv,
    engine_of_image,
    normalize_engine,
    render_flag,
    sleep_needs,
)

# ── the made-up engine, as its own module would declare it ─────────────────────

TINY_SOURCE = '''
"""TinyServe: a made-up engine, declared the way statemachine/engines/vllm.py is."""
from statemachine.engines.spec import Detection, Engine, HttpCall, MemoryFlag, SleepApi

ENGINE = Engine(
    name="tinyserve",
    display="TinyServe",
    aliases=("tiny-serve",),
    detection=Detection(commands=(("tiny", "serve"),), image_words=("tinyserve",)),
    sizes_from_free=True,
    memory_flag=MemoryFlag("--vram-fraction", default="0.8"),
    sleep=SleepApi(
        sleep=HttpCall("/v1/nap", level_param="depth"),
        wake=(HttpCall("/v1/rise", body={"all": True}),),
        reload=(HttpCall("/v1/reload"),),
        is_sleeping="/v1/napping",
        is_sleeping_key="napping",
        flags=("--allow-naps",),
        env={"TINY_NAPS": "on"},
    ),
    inflight_metrics=("tiny:active", "tiny:queued"),
)
'''


def tiny_module() -> types.ModuleType:
    module = types.ModuleType("tinyserve")
    exec(compile(TINY_SOURCE, "tinyserve.py", "exec"), module.__dict__)
    return module


@pytest.fixture
def tiny() -> Iterator[Engine]:
    engine: Engine = tiny_module().ENGINE
    engines.register(engine)
    try:
        yield engine
    finally:
        engines.unregister(engine.name)


# ── the registry itself ─────────────────────────────────────────────────────────


def test_the_built_in_engines_are_registered_in_detection_order() -> None:
    assert engines.names() == ("vllm", "sglang", "llamacpp", "onnx-genai", "strata")
    assert [e.name for e in engines.sleeping_engines()] == ["vllm", "sglang"]
    assert engines.canonical("Llama_CPP") == "llamacpp"
    assert engines.canonical(" Embedding ") == "embedding"
    assert engines.canonical("  ") is None


def test_a_registered_engine_is_known_by_name_and_alias_then_forgotten(tiny: Engine) -> None:
    assert engines.names()[-1] == "tinyserve"
    assert engines.lookup("Tiny_Serve") is tiny
    assert normalize_engine("TINYSERVE") == "tinyserve"
    engines.unregister("tinyserve")
    assert engines.lookup("tiny-serve") is None
    engines.register(tiny)  # the fixture removes it again


def test_a_name_or_alias_taken_by_another_engine_is_refused(tiny: Engine) -> None:
    clash = Engine("other", "Other", Detection(), aliases=("tiny-serve", "llama.cpp"))
    with pytest.raises(ValueError, match=r"'llama\.cpp' \(llamacpp\), 'tiny-serve' \(tinyserve\)"):
        engines.register(clash)
    assert engines.lookup("other") is None


def test_what_cannot_be_carried_out_is_refused_at_registration() -> None:
    mib = Engine("mibby", "Mibby", Detection(), memory_flag=MemoryFlag("--vram-mib", FlagUnit.MIB))
    with pytest.raises(ValueError, match="--vram-mib in mib: only a fraction"):
        engines.register(mib)
    with pytest.raises(ValueError, match="lower-case"):
        engines.register(Engine("Tiny_Serve", "x", Detection()))
    with pytest.raises(KeyError, match="known: vllm, sglang, llamacpp"):
        engines.get("mibby")


# ── render and lint ─────────────────────────────────────────────────────────────


def test_render_uses_its_flag_detection_and_default(tiny: Engine) -> None:
    assert engine_of_argv(["/opt/bin/tiny", "serve", "m", "--vram-fraction", "0.5"]) == "tinyserve"
    assert engine_of_image("ghcr.io/acme/tinyserve:1.2") == "tinyserve"
    result = render_flag("t", "TinyServe", 4000, ["a"], {"a": DeviceTotal("a", 80000)})
    assert (result.engine, result.text) == ("tinyserve", "--vram-fraction 0.0500")
    missing = check_fraction(result, None)
    assert missing is not None and missing.kind is FindingKind.MISSING_FLAG
    assert "runs TinyServe without --vram-fraction" in missing.message
    assert "(TinyServe's default is 0.8)" in missing.message
    assert sleep_needs("tinyserve") == SleepNeeds(
        "tinyserve", ("--allow-naps",), {"TINY_NAPS": "on"}
    )
    unknown = render_flag("t", "nosuch", 4000, ["a"], {"a": DeviceTotal("a", 80000)})
    assert unknown.problem is not None and "TinyServe --vram-fraction" in unknown.problem


TINY_MANIFEST = """
[[gpu_roles]]
id = "a"
vram_mib = 80000

[[serve]]
name = "small"
container = "tiny-small"
engine = "embedding"
gpu_role = "a"
vram_mib = 4000

[[serve]]
name = "nappy"
container = "tiny-nappy"
engine = "TinyServe"
gpu_role = "a"
vram_mib = 8000
port = 31000

[serve.sleep]
level = 2
residual_mib = 500
"""

TINY_SERVICES = """
small:
  image: ghcr.io/acme/other:1
  container_name: tiny-small
  command: tiny serve m --vram-fraction 0.05
nappy:
  image: ghcr.io/acme/tinyserve:1.2
  container_name: tiny-nappy
  command: ["--model", "m", "--vram-fraction=0.1"]
"""


def test_lint_reads_its_command_flag_and_sleep_needs(tmp_path: Path, tiny: Engine) -> None:
    mset = manifest(tmp_path, TINY_MANIFEST)
    report = lint_compose(mset, [compose(tmp_path, TINY_SERVICES)], environ={})
    checked = {c.serve: c for c in report.checked}
    assert (checked["small"].engine, checked["small"].engine_source) == ("tinyserve", "command")
    assert (checked["small"].flag, checked["small"].found, checked["small"].ok) == (
        "--vram-fraction",
        "0.05",
        True,
    )
    assert (checked["nappy"].engine, checked["nappy"].engine_source) == ("tinyserve", "image")
    assert [(f.kind, f.serve) for f in report.errors] == [(FindingKind.SLEEP_MODE_OFF, "nappy")]
    assert "add --allow-naps and TINY_NAPS=on" in report.errors[0].message
    wrong = TINY_SERVICES.replace("--vram-fraction 0.05", "--vram-fraction 0.5")
    report = lint_compose(mset, [compose(tmp_path, wrong, "wrong.yml")], environ={})
    assert (FindingKind.DISAGREES, "small") in [(f.kind, f.serve) for f in report.errors]
    assert render_serve(mset, "nappy").result.text == "--vram-fraction 0.1000"


def test_the_manifest_takes_its_name_for_sleep_starts_and_metrics(
    tmp_path: Path, tiny: Engine
) -> None:
    mset = manifest(tmp_path, TINY_MANIFEST)
    serve = mset.serves["nappy"]
    spec = serve.to_spec()
    assert spec.sleep is not None and spec.sleep.protocol == "tinyserve"
    assert spec.sizes_from_free
    assert serve.metrics_source() == "http://127.0.0.1:31000/metrics"
    bad = TINY_MANIFEST.replace("level = 2", 'level = 2\nprotocol = "tinyserv"')
    with pytest.raises(ManifestError) as err:
        manifest(tmp_path, bad)
    assert "must be one of vllm, sglang, tinyserve" in str(err.value)


# ── the sleep adapter against a stand-in ────────────────────────────────────────


class TinyEngine(FakeHTTPServer):
    """Speaks TinyServe's sleep API as the module above declares it."""

    def __init__(self) -> None:
        super().__init__()
        self.napping = False
        self.depth: str | None = None

    def handle(self, request: Recorded) -> ReplyLike:
        if (request.method, request.path) == ("POST", "/v1/nap"):
            self.napping, self.depth = True, request.query.get("depth")
            return Reply(200, {"ok": True})
        if (request.method, request.path) == ("POST", "/v1/rise"):
            if request.json != {"all": True}:
                return Reply(400, {"detail": "rise what?"})
            self.napping = False
            return Reply(200, {"ok": True})
        if (request.method, request.path) == ("POST", "/v1/reload"):
            return Reply(200, {"ok": True})
        if (request.method, request.path) == ("GET", "/v1/napping"):
            return Reply(200, {"napping": self.napping})
        return Reply(404, {"detail": "Not Found"})


def test_the_sleep_adapter_calls_its_paths(tiny: Engine) -> None:
    with TinyEngine() as eng, SleepClient(attempts=1, timeout_s=5) as client:
        assert client.sleep(eng.url, "tinyserve", 2) == "POST /v1/nap?depth=2"
        assert (eng.napping, eng.depth) == (True, "2")
        assert client.is_sleeping(eng.url, "tinyserve") is True
        sl = Sleeper("nappy", "tiny-nappy", eng.url, "tinyserve", 2, ("a",), 500, 0)
        said = wake_engine(client, sl, timeout_s=5, poll_s=0.01)
        assert said == "POST /v1/rise; the engine says it is awake"
        assert client.reload(eng.url, "tinyserve", timeout_s=5) == ["POST /v1/reload"]
        assert [(c.method, c.path) for c in eng.calls] == [
            ("POST", "/v1/nap"),
            ("GET", "/v1/napping"),
            ("POST", "/v1/rise"),
            ("GET", "/v1/napping"),
            ("POST", "/v1/reload"),
        ]
    with pytest.raises(ValueError, match="one of vllm, sglang, tinyserve, not 'tiny'"):
        SleepClient().sleep("http://127.0.0.1:1", "tiny", 1)


# ── in-flight metrics ───────────────────────────────────────────────────────────

TINY_PAGE = textwrap.dedent(
    """\
    # TYPE tiny:active gauge
    tiny:active{model_name="m",rank="0"} 2
    tiny:active{model_name="m",rank="1"} 1
    # TYPE tiny:queued gauge
    tiny:queued{model_name="m"} 4
    """
)


def test_the_metrics_reader_sums_its_metric_names(tiny: Engine) -> None:
    assert engine_kind("Tiny_Serve") == "tinyserve"
    assert parse_in_flight(TINY_PAGE) == 7
    assert parse_in_flight(TINY_PAGE, "vllm") is None
    page = Reply(200, TINY_PAGE, {"Content-Type": "text/plain; version=0.0.4"})
    with FakeHTTPServer(lambda _: page) as eng, httpx.Client() as client:
        reading = read_metrics(client, eng.url + "/metrics", "tinyserve")
    assert (reading.count, reading.error) == (7, None)
    missing = parse_in_flight(TINY_PAGE.replace("tiny:queued", "tiny:later"), "tinyserve")
    assert missing is None


def test_fractions_are_exact_for_a_new_engine_too(tiny: Engine) -> None:
    result = render_flag("t", "tinyserve", 3200, ["a"], {"a": DeviceTotal("a", 97887)})
    assert result.fraction == Decimal("0.0326")
    assert result.flag == "--vram-fraction"


def test_an_engine_without_sleep_or_metrics_is_left_out_of_both() -> None:
    plain = Engine("plainserve", "PlainServe", Detection(programs=("plain-server",)))
    engines.register(plain)
    try:
        assert engine_of_argv(["plain-server", "-m", "x"]) == "plainserve"
        assert sleep_needs("plainserve") is None
        assert engine_kind("plainserve") is None
        assert engines.sleep_api("plainserve") is None
    finally:
        engines.unregister("plainserve")


def test_a_sleep_call_sends_what_its_entry_declares() -> None:
    call = HttpCall("/x", params=(("a", "1"),), level_param="lvl")
    assert call.query(2) == {"a": "1", "lvl": "2"}
    assert HttpCall("/y").query(1) is None
    api = SleepApi(sleep=call, wake=())
    assert not api.can_say
