"""The page's answer (``GET /v1/serves``) carries each serve's ``[serve.model]``
estimate beside its reservation and its measured footprint; the files are read again
only when they change (docs/sizing.md, "A serve's model")."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support.service import controller_on
from test_api import Asgi, auth, client, observe  # noqa: F401
from test_model_estimate_cli import safetensors_model

from controller.interfaces.redaction import MODEL_TEXT_WITHHELD
from controller.manifest import load_manifest_set
from controller.service import model_estimates
from controller.service.footprints import FootprintRecorder, Reading
from controller.service.loop import Controller
from statemachine.sizing.footprint import Method, Sample

MANIFEST = """
[[gpu_roles]]
id = "a"
vram_mib = 24000

[[serve]]
name = "llm"
container = "c-llm"
gpu_role = "a"
vram_mib = 1500
[serve.model]
path = "st"

[[serve]]
name = "later"
container = "c-later"
gpu_role = "a"
vram_mib = 1500
[serve.model]
path = "mounted-later"

[[serve]]
name = "plain"
container = "c-plain"
gpu_role = "a"
vram_mib = 1000
"""


@pytest.fixture
def loop(tmp_path: Path) -> Iterator[Controller]:
    safetensors_model(tmp_path / "st")
    controller = controller_on(tmp_path, MANIFEST)
    yield controller
    controller.journal.close()


def test_the_serves_answer_carries_the_estimate_and_the_measured_footprint(
    loop: Controller,
    client: Callable[..., Asgi],  # noqa: F811
) -> None:
    loop.footprints = FootprintRecorder(lambda: Reading(None), journal=loop.journal, settle_s=0)
    sample = Sample("llm", "start", "a", 1.0, 1500, Method.DELTA, True, delta_mib=1300)
    loop.journal.add_footprint("llm", "start", "a", 1.0, sample.to_json())
    observe(loop, {"llm": {"state": "running"}})
    api = client(loop)
    rows = {r["serve"]: r for r in api.get("/v1/serves", headers=auth()).json()["serves"]}
    llm = rows["llm"]["model"]
    assert (llm["vram_mib"], llm["measured_mib"]) == (1500, 1300)
    assert llm["calibration"]["verdict"] == "consistent"
    assert llm["calibration"]["overheads_mib"] == 1300 - 1026
    est = llm["estimate"]
    assert (est["weights_mib"], est["kv_cache_mib"], est["known_mib"]) == (2, 1024, 1026)
    assert llm["check"]["verdict"] == "ok" and llm["check"]["rest"] == "unknown"
    later = rows["later"]["model"]
    assert later["estimate"] is None and "mounted-later: no such file" in later["error"]
    assert later["measured_mib"] is None  # unknown, never 0
    assert rows["plain"]["model"] is None
    # without the token the figures, not what the files (or their absence) say
    bare = {r["serve"]: r["model"] for r in api.get("/v1/serves").json()["serves"]}
    assert bare["later"]["error"] == MODEL_TEXT_WITHHELD
    assert bare["llm"]["estimate"] == est and bare["llm"]["calibration"] == llm["calibration"]


def test_an_unchanged_model_is_not_read_again_and_a_mounted_one_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads: list[Path] = []
    real = model_estimates.read_model

    def counting(path: Path) -> object:
        reads.append(path)
        return real(path)

    monkeypatch.setattr(model_estimates, "read_model", counting)
    folder = safetensors_model(tmp_path / "m")
    path = tmp_path / "serves.toml"
    path.write_text(MANIFEST.replace('path = "st"', 'path = "m"'))
    mset = load_manifest_set([path])
    first = model_estimates.serve_models(mset)
    again = model_estimates.serve_models(mset)
    assert first == again and reads.count(folder.resolve()) == 1
    config = folder / "config.json"
    config.write_text(
        config.read_text().replace(
            '"max_position_embeddings": 8192', '"max_position_embeddings": 4096'
        )
    )
    os.utime(config, ns=(1, 1))  # a changed file, whatever the clock's resolution
    changed = model_estimates.serve_models(mset)
    assert reads.count(folder.resolve()) == 2
    assert changed["llm"]["estimate"]["kv_cache_mib"] == 512
    safetensors_model(tmp_path / "mounted-later")
    assert model_estimates.serve_models(mset)["later"]["error"] is None
