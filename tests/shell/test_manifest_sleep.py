"""``[serve.sleep]`` and ``[host]`` in the manifest: what they load as, and located errors.

The names are a contract (docs/manifest.md): ``level``, ``residual_mib``,
``host_ram_mib``, ``url``, ``protocol``; ``[host]`` ``ram_mib``, ``reserve_mib``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.manifest_rules import ROLES, Expect, check, errors_of, serve, write

from controller.manifest import load_manifest_set
from controller.snapshot import SnapshotError, parse_snapshot, snapshot_changes
from statemachine.domain.types import (
    HostBudget,
    Sleep,
    SleepObs,
    SleepState,
)
from statemachine.engines import (
    SleepProtocol,
)

S1 = 'serve "s1" (#1)'

BASE = """
gpu_role = "a"
vram_mib = 800
port = 30010
engine = "vLLM"
residency = "evictable"
"""


def sleeping(sleep: str, base: str = BASE) -> str:
    return ROLES + serve(base + "\n[serve.sleep]\n" + sleep)


def test_level_1_loads_with_defaults_from_the_serve(tmp_path: Path) -> None:
    text = sleeping("level = 1\nresidual_mib = 100\nhost_ram_mib = 4096")
    spec = load_manifest_set(write(tmp_path, {"serves.toml": text})).desired().serves["s1"]
    assert spec.sleep == Sleep(
        level=1,
        residual_mib=100,
        protocol=SleepProtocol.VLLM,
        host_ram_mib=4096,
        url="http://127.0.0.1:30010",
    )
    assert spec.sleep.host_mib == 4096


def test_level_2_holds_no_host_ram_and_protocol_and_url_can_be_given(tmp_path: Path) -> None:
    text = sleeping(
        'level = 2\nresidual_mib = 100\nprotocol = "SGLang"\nurl = "http://engine:9000"',
        base='gpu_role = "a"\nvram_mib = 800\nengine = "custom"',
    )
    spec = load_manifest_set(write(tmp_path, {"serves.toml": text})).desired().serves["s1"]
    assert spec.sleep == Sleep(2, 100, SleepProtocol.SGLANG, 0, "http://engine:9000")
    assert spec.sleep.host_mib == 0


def test_a_serve_without_sleep_has_none(tmp_path: Path) -> None:
    text = ROLES + serve(BASE)
    spec = load_manifest_set(write(tmp_path, {"serves.toml": text})).desired().serves["s1"]
    assert spec.sleep is None
    assert load_manifest_set(write(tmp_path, {"serves.toml": text})).desired().host is None


def test_host_table_loads_as_a_budget(tmp_path: Path) -> None:
    text = "[host]\nram_mib = 65536\nreserve_mib = 8192\n" + ROLES
    desired = load_manifest_set(write(tmp_path, {"serves.toml": text})).desired()
    assert desired.host == HostBudget(65536, 8192)
    assert desired.host.budget_mib == 57344


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            sleeping("level = 3\nresidual_mib = 100"),
            (Expect(S1, "sleep.level", ("must be 1", "got 3")),),
            id="level-3",
        ),
        pytest.param(
            sleeping("residual_mib = 100\nhost_ram_mib = 1"),
            (Expect(S1, "sleep.level", ("required",)),),
            id="level-missing",
        ),
        pytest.param(
            sleeping("level = 1\nresidual_mib = 800\nhost_ram_mib = 1"),
            (Expect(S1, "sleep.residual_mib", ("less than vram_mib (800)", "got 800")),),
            id="residual-not-below-vram",
        ),
        pytest.param(
            sleeping("level = 2\nresidual_mib = 0"),
            (Expect(S1, "sleep.residual_mib", ("positive integer",)),),
            id="residual-zero",
        ),
        pytest.param(
            sleeping("level = 1\nresidual_mib = 100"),
            (Expect(S1, "sleep.host_ram_mib", ("required at level 1",)),),
            id="level-1-without-host-ram",
        ),
        pytest.param(
            sleeping("level = 2\nresidual_mib = 100", base='gpu_role = "a"\nvram_mib = 800'),
            (
                Expect(S1, "sleep.url", ("no port",)),
                Expect(S1, "sleep.protocol", ("cannot be told from no engine",)),
            ),
            id="no-port-no-engine",
        ),
        pytest.param(
            sleeping('level = 2\nresidual_mib = 100\nprotocol = "vllmm"'),
            (Expect(S1, "sleep.protocol", ('did you mean "vllm"',)),),
            id="protocol-near-miss",
        ),
        pytest.param(
            sleeping('level = 2\nresidual_mib = 100\nurl = "engine:9000"'),
            (Expect(S1, "sleep.url", ("http://",)),),
            id="url-not-http",
        ),
        pytest.param(
            sleeping("level = 2\nresidual_mb = 100"),
            (
                Expect(S1, "sleep.residual_mb", ('did you mean "residual_mib"',)),
                Expect(S1, "sleep.residual_mib", ("required",)),
            ),
            id="near-miss-key",
        ),
        pytest.param(
            sleeping(
                "level = 2\nresidual_mib = 100", base='gpu_role = "a"\nport = 1\nengine="vllm"'
            ),
            (Expect(S1, "sleep", ("needs the serve's vram_mib",)),),
            id="no-vram",
        ),
        pytest.param(
            "[host]\nram_mib = 100\nreserve_mib = 101\n",
            (Expect(None, "host.reserve_mib", ("must not exceed ram_mib (100)",)),),
            id="host-reserve-above-ram",
        ),
        pytest.param(
            "[host]\nreserve_mib = 1\n",
            (Expect(None, "host.ram_mib", ("required",)),),
            id="host-ram-missing",
        ),
        pytest.param(
            "[host]\nram_mib = 100\nreserv_mib = 1\n",
            (Expect(None, "host.reserv_mib", ('did you mean "reserve_mib"',)),),
            id="host-near-miss",
        ),
        pytest.param(
            'host = "big"\n',
            (Expect(None, "host", ("must be a table",)),),
            id="host-not-a-table",
        ),
        pytest.param(
            "[hosts]\nram_mib = 1\n",
            (Expect(None, "hosts", ('did you mean "host"',)),),
            id="host-table-near-miss",
        ),
        pytest.param(
            "[host]\nram_mib = 1000\nreserve_mib = 100\n"
            + sleeping("level = 1\nresidual_mib = 100\nhost_ram_mib = 901"),
            (Expect(S1, "sleep.host_ram_mib", ("never fit the host", "1000 - 100 = 900")),),
            id="host-ram-above-host-budget",
        ),
    ],
)
def test_located_errors(tmp_path: Path, text: str, expected: tuple[Expect, ...]) -> None:
    check(errors_of(write(tmp_path, {"serves.toml": text})), expected)


def test_level_2_host_ram_is_a_warning(tmp_path: Path) -> None:
    text = sleeping("level = 2\nresidual_mib = 100\nhost_ram_mib = 10")
    loaded = load_manifest_set(write(tmp_path, {"serves.toml": text}))
    assert any("sleep.host_ram_mib" in w and "ignored at level 2" in w for w in loaded.warnings)
    assert loaded.desired().serves["s1"].sleep is not None


def test_host_tables_of_a_set_must_agree(tmp_path: Path) -> None:
    files = {
        "a.toml": "[host]\nram_mib = 1000\n",
        "b.toml": "[host]\nram_mib = 2000\n",
    }
    check(
        errors_of(write(tmp_path, files)),
        (Expect(None, "host.ram_mib", ("conflicting host budget", "2000 here"), "b.toml"),),
    )
    same = {"a.toml": ROLES + "[host]\nram_mib = 1000\n", "b.toml": "[host]\nram_mib = 1000\n"}
    assert load_manifest_set(write(tmp_path, same)).desired().host == HostBudget(1000, 0)


def test_a_mirror_must_agree_on_sleep(tmp_path: Path) -> None:
    owner = ROLES + serve(
        BASE + 'up = "true"\n[serve.sleep]\nlevel = 1\nresidual_mib = 100\nhost_ram_mib = 10'
    )
    mirror = serve(BASE + "\n[serve.sleep]\nlevel = 1\nresidual_mib = 200\nhost_ram_mib = 10")
    errors = errors_of(write(tmp_path, {"a.toml": owner, "b.toml": mirror}))
    assert [e.field for e in errors] == ["sleep"], errors
    assert "disagrees" in errors[0].message and "200" in errors[0].message


def test_the_observed_snapshot_carries_sleep_states() -> None:
    data = {
        "docker": "ok",
        "containers": {"c-coder": {"state": "running"}},
        "sleep": {"coder": {"state": "asleep", "level": 1, "residual_mib": 1200}},
    }
    snap = parse_snapshot(data)
    assert snap.to_observed().sleep_of("coder") == SleepObs(SleepState.ASLEEP, 1, 1200, None)
    assert snap.to_observed().sleep_of("other").state is SleepState.AWAKE
    woke = parse_snapshot({**data, "sleep": {"coder": {"state": "awake"}}})
    assert any("sleep states" in c for c in snapshot_changes(snap, woke, ["c-coder"]))
    for bad in (
        {"state": "dozing"},
        {"state": "asleep", "level": 3},
        {"state": "asleep", "residual_mib": 0},
    ):
        with pytest.raises(SnapshotError) as info:
            parse_snapshot({**data, "sleep": {"coder": bad}})
        assert "sleep.coder" in str(info.value)
