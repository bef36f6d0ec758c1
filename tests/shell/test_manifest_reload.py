"""``cold_start_s`` and ``[serve.sleep] wake_s``: the declared reload figures.

Both are optional positive seconds (at most a day); they load onto the serve's spec
(``ServeSpec.cold_start_s``, ``Sleep.wake_s``) and become its declared reload cost
until one is measured (statemachine/planning/restore_cost.py). A bad value is refused with a located
error, as the manifest's other fields are.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.manifest_rules import ROLES, Expect, check, errors_of, serve, write

from controller.manifest import ManifestError, load_manifest_set
from controller.manifest.schema import manifest_json_schema
from statemachine.planning.plan_types import RestoreCost
from statemachine.planning.restore_cost import declared_costs

S1 = 'serve "s1" (#1)'

BASE = """
gpu_role = "a"
vram_mib = 800
port = 30010
engine = "vLLM"
residency = "evictable"
"""

SLEEP = "\n[serve.sleep]\nlevel = 2\nresidual_mib = 100\n"


def test_declared_figures_load_onto_the_spec_and_the_declared_costs(tmp_path: Path) -> None:
    text = ROLES + serve(BASE + "cold_start_s = 47\n" + SLEEP + "wake_s = 2.9\n")
    text += serve('gpu_role = "b"\nvram_mib = 500\ncold_start_s = 0.5', "s2", "c2")
    text += serve('gpu_role = "b"\nvram_mib = 100', "s3", "c3")
    desired = load_manifest_set(write(tmp_path, {"serves.toml": text})).desired()
    s1, s2, s3 = (desired.serves[n] for n in ("s1", "s2", "s3"))
    assert s1.cold_start_s == 47.0 and isinstance(s1.cold_start_s, float)
    assert s1.sleep is not None and s1.sleep.wake_s == 2.9
    assert (s2.cold_start_s, s2.sleep) == (0.5, None)
    assert s3.cold_start_s is None
    assert declared_costs(desired) == {"s1": RestoreCost(47.0, 2.9), "s2": RestoreCost(0.5, None)}


def test_a_sleeper_may_declare_a_wake_without_a_cold_start(tmp_path: Path) -> None:
    text = ROLES + serve(BASE + SLEEP + "wake_s = 3")
    desired = load_manifest_set(write(tmp_path, {"serves.toml": text})).desired()
    assert declared_costs(desired) == {"s1": RestoreCost(None, 3.0)}


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        pytest.param("cold_start_s = 0", "cold_start_s", ("positive number", "got 0"), id="zero"),
        pytest.param("cold_start_s = -5", "cold_start_s", ("positive number",), id="negative"),
        pytest.param('cold_start_s = "47s"', "cold_start_s", ("positive number",), id="string"),
        pytest.param("cold_start_s = true", "cold_start_s", ("positive number",), id="bool"),
        pytest.param("cold_start_s = nan", "cold_start_s", ("positive number",), id="nan"),
        pytest.param("cold_start_s = inf", "cold_start_s", ("positive number",), id="inf"),
        pytest.param("cold_start_s = 86401", "cold_start_s", ("at most 86400",), id="over-a-day"),
        pytest.param(SLEEP + "wake_s = 0", "sleep.wake_s", ("positive number",), id="wake-zero"),
        pytest.param(
            SLEEP + "wake_s = -1.5", "sleep.wake_s", ("positive number",), id="wake-negative"
        ),
        pytest.param(SLEEP + "wake_s = [2]", "sleep.wake_s", ("positive number",), id="wake-list"),
    ],
)
def test_bad_figures_are_refused_with_their_location(
    tmp_path: Path, body: str, field: str, words: tuple[str, ...]
) -> None:
    text = ROLES + serve(BASE + body)
    check(errors_of(write(tmp_path, {"serves.toml": text})), (Expect(S1, field, words),))


def test_a_near_miss_of_the_key_is_named(tmp_path: Path) -> None:
    text = ROLES + serve(BASE + "cold_start = 47")
    with pytest.raises(ManifestError) as info:  # strict: a key it does not know refuses
        load_manifest_set(write(tmp_path, {"serves.toml": text}), strict=True)
    assert 'did you mean "cold_start_s"' in str(info.value)


def test_the_shipped_schema_describes_both_fields() -> None:
    defs = manifest_json_schema()["$defs"]
    cold = defs["ServeModel"]["properties"]["cold_start_s"]
    wake = defs["SleepModel"]["properties"]["wake_s"]
    for prop in (cold, wake):
        assert (prop["type"], prop["exclusiveMinimum"], prop["maximum"]) == ("number", 0, 86400)
