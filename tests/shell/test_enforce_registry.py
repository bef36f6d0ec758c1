"""An engine added as one module, declaring limit flags and an elastic configuration the
way statemachine/engines/llamacpp.py and strata.py do, is rendered and linted with no
other change: render, lint and the arithmetic read everything from its registry entry.
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.files import compose, manifest

from controller.tools.compose_lint import lint_compose, render_serve
from statemachine import engines
from statemachine.engines import Engine
from statemachine.flags.fraction import FindingKind
from statemachine.flags.model_limits import ModelInput
from statemachine.sizing.needs import MIB, Architecture, Weights

SOURCE = '''
"""NimbleServe: a made-up engine with a context limit, a byte limit and an elastic cache."""
from statemachine.engines.spec import (
    Detection, ElasticConfig, Engine, LimitFlag, LimitKind,
)

ENGINE = Engine(
    name="nimble",
    display="NimbleServe",
    detection=Detection(programs=("nimble-serve",)),
    limit_flags=(
        LimitFlag("--max-tokens", LimitKind.MAX_CONTEXT, ("-t",)),
        LimitFlag("--byte-cap", LimitKind.VRAM_BYTES),
    ),
    elastic=ElasticConfig("--elastic", "elastic", "segment", 256),
)
'''


@pytest.fixture
def nimble() -> Iterator[Engine]:
    module = types.ModuleType("nimble")
    exec(compile(SOURCE, "nimble.py", "exec"), module.__dict__)
    engine: Engine = module.ENGINE
    engines.register(engine)
    try:
        yield engine
    finally:
        engines.unregister(engine.name)


MANIFEST = """
[[gpu_roles]]
id = "a"
vram_mib = 97887

[[serve]]
name = "n"
container = "nimble-n"
engine = "nimble"
gpu_role = "a"
vram_mib = 2048
engine_overhead_mib = 0
elastic = { url = "http://127.0.0.1:30009", floor_mib = 1024, segment_mib = 256 }
"""

#: 1 GiB of weights; 4 layers × 4 KV heads × 64 head_dim at f16: 4096 bytes per token
MODEL = ModelInput(
    Weights(1024 * MIB, 10, ("m.safetensors",)),
    Architecture("config.json", 4, 4, 64, 64, 1 << 20),
)


def test_render_reads_the_new_engines_limits_and_elastic_flags(
    tmp_path: Path, nimble: Engine
) -> None:
    mset = manifest(tmp_path, MANIFEST)
    answer = render_serve(mset, "n", models={"n": MODEL})
    # (2048 − 1024) MiB left / 4096 bytes a token = 262144 tokens
    assert answer.argv == (
        "--max-tokens",
        "262144",
        "--byte-cap",
        str(2048 * MIB),
        "--elastic",
    )
    assert answer.to_json()["elastic"]["config"] == {"elastic": True, "segment": 256}
    without = render_serve(mset, "n")  # no [serve.model] figures: the byte cap only
    assert [limit.flag.name for limit in without.limits] == ["--byte-cap"]


def test_lint_reads_the_new_engines_flags_under_every_spelling(
    tmp_path: Path, nimble: Engine
) -> None:
    mset = manifest(tmp_path, MANIFEST)
    good = f"""
    n:
      image: ghcr.io/acme/nimble:1
      container_name: nimble-n
      command: nimble-serve -t 4096 --byte-cap {2048 * MIB} --elastic
    """
    path = compose(tmp_path, good)
    report = lint_compose(mset, [path], environ={}, models={"n": MODEL})
    assert report.errors == (), [f.message for f in report.errors]
    (checked,) = report.checked
    assert (checked.engine, checked.engine_source) == ("nimble", "command")
    bad = good.replace("-t 4096", "-t 300000").replace(" --elastic", "")
    report = lint_compose(mset, [compose(tmp_path, bad, "bad.yml")], models={"n": MODEL})
    assert sorted(f.kind.value for f in report.errors) == [
        FindingKind.ELASTIC_OFF.value,
        FindingKind.LIMIT_TOO_LARGE.value,
    ]
