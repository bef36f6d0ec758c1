"""The engine registry's own contract (statemachine/engines/): what each built-in engine
declares, how a label finds its engine, and what registration refuses.

These are the facts the shell acts on: vLLM and SGLang size their pools from the
device's free memory at load (their starts are serialised per GPU), llama.cpp does not;
vLLM can be asked whether it sleeps, SGLang cannot; each sleep call carries the level
only where the engine takes one. Pure: imports statemachine only (the tests that show a
registered engine picked up by render, lint, sleep and metrics are in
tests/shell/test_engine_registry.py).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from statemachine import engines
from statemachine.engines.spec import Detection, Engine, HttpCall, SleepApi


@pytest.fixture
def scratch() -> Iterator[Engine]:
    engine = Engine("tinyserve", "TinyServe", Detection(programs=("tiny-serve",)), ("Tiny_Serve",))
    engines.register(engine)
    yield engine
    if "tinyserve" in engines.names():
        engines.unregister("tinyserve")


def test_which_built_in_engines_size_themselves_from_free_memory() -> None:
    sizing = {e.name: e.sizes_from_free for e in engines.engines()}
    assert sizing == {
        "vllm": True,
        "sglang": True,
        "llamacpp": False,
        "onnx-genai": False,
        "strata": False,
    }


def test_an_engine_declared_without_sizing_does_not_size_from_free_memory() -> None:
    assert Engine("x", "X", Detection()).sizes_from_free is False


def test_the_engines_that_sleep_are_vllm_and_sglang() -> None:
    assert [e.name for e in engines.sleeping_engines()] == ["vllm", "sglang"]


def test_only_vllm_can_be_asked_whether_it_sleeps() -> None:
    vllm, sglang = engines.sleep_api("vllm"), engines.sleep_api("sglang")
    assert vllm is not None and sglang is not None
    assert (vllm.can_say, sglang.can_say) == (True, False)
    assert engines.sleep_api("llamacpp") is None  # it has no sleep API
    assert engines.sleep_api("nosuch") is None


def test_a_sleep_call_carries_the_level_only_where_the_engine_takes_one() -> None:
    with_level = HttpCall("/sleep", level_param="level")
    assert with_level.query(2) == {"level": "2"}
    assert with_level.query(None) is None
    fixed = HttpCall("/wake_up", params=(("tags", "weights"),))
    assert fixed.query(1) == {"tags": "weights"}
    assert HttpCall("/release").query(1) is None


def test_a_sleep_api_without_an_is_sleeping_path_cannot_say() -> None:
    api = SleepApi(HttpCall("/s"), (HttpCall("/w"),))
    assert api.can_say is False
    assert SleepApi(HttpCall("/s"), (), is_sleeping="/is").can_say is True


def test_a_label_finds_its_engine_by_name_or_alias_in_any_case(scratch: Engine) -> None:
    assert engines.lookup("TINYSERVE") is scratch
    assert engines.lookup(" tiny-serve ") is scratch  # the alias, _ read as -
    assert engines.lookup("llama.cpp") is engines.get("llamacpp")
    assert engines.lookup("nosuch") is None and engines.lookup(None) is None
    assert engines.get("tinyserve") is scratch


def test_get_names_the_known_engines_when_there_is_none_so_called() -> None:
    with pytest.raises(KeyError, match="no engine 'nosuch'; known: vllm, sglang, llamacpp"):
        engines.get("nosuch")


def test_unregister_removes_the_engine_and_its_aliases_only(scratch: Engine) -> None:
    engines.unregister("tinyserve")
    assert engines.lookup("tiny-serve") is None and engines.lookup("tinyserve") is None
    assert engines.lookup("vllm") is engines.get("vllm")
    assert engines.names() == ("vllm", "sglang", "llamacpp", "onnx-genai", "strata")


@pytest.mark.parametrize("name", ["", "Tiny", "tiny_serve", " tiny"])
def test_a_name_that_is_not_its_own_canonical_label_is_refused(name: str) -> None:
    with pytest.raises(ValueError, match="must be lower-case, without _ or spaces"):
        engines.register(Engine(name, "X", Detection()))


def test_an_alias_another_engine_owns_is_refused_naming_the_owner(scratch: Engine) -> None:
    with pytest.raises(ValueError, match=r"already registered: 'tiny-serve' \(tinyserve\)"):
        engines.register(Engine("other", "Other", Detection(), ("tiny_serve",)))
    assert engines.lookup("tiny-serve") is scratch


@pytest.mark.parametrize("label", ["", "   ", "\t"])
def test_a_blank_label_names_no_engine(label: str) -> None:
    """A blank label is no label: its canonical form is ``None``, not an empty name."""
    assert engines.canonical(label) is None
    assert engines.canonical(None) is None


@pytest.mark.parametrize(
    ("image", "engine"),
    [
        ("VLLM/VLLM-OpenAI:Latest", "vllm"),  # the repository in any case
        ("ghcr.io/Acme/SGLang", "sglang"),
        ("ghcr.io/vllm/tts:1", "vllm"),  # the owner's path is the repository's too
        ("ghcr.io/acme/tts:vllm", None),  # a tag is not
    ],
)
def test_an_image_names_its_engine_by_its_whole_repository_in_any_case(
    image: str, engine: str | None
) -> None:
    """An image's repository (its registry and owner path, without tag or digest) names
    the engine whose word it holds, whatever its letters' case."""
    found = engines.of_image(image)
    assert (None if found is None else found.name) == engine
