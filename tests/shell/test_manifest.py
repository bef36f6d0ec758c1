"""Tests of controller.manifest: the real fixtures load, every rule has a located error.

The rule tables write small TOML files to ``tmp_path`` and check each
:class:`LocatedError`'s file, entry (``serve "name" (#N)`` or ``serve #N``), field and
the key words of its message; each table asserts the exact number of errors, so a rule
that fires twice (or a cascade) fails too. Fixtures are the real serving stack's
manifests (MIT, see tests/fixtures/anvil-serving/LICENSE), copied beside the tests so a
clone of this repository alone runs them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.manifest_rules import ROLES, Expect, check, errors_of, serve, write

from controller.manifest import (
    ManifestError,
    ManifestSet,
    load_manifest,
    load_manifest_set,
    normalize_residency,
)
from controller.manifest.runtime import ServeRuntime
from controller.manifest.schema import SCHEMA_PATH, render_schema
from statemachine.domain.types import DesiredRun, DesiredState, Elastic, Residency

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "anvil-serving"
SHARED_FIXTURES = Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "anvil-serving"
FIXTURE_FILES = ("serves.toml", "serves.voice.toml", "serves.comfyui.toml")

BUDGET = 97887 - 3072  # 94815: both RTX PRO 6000 roles
TP2_650K = "tp2-deepseek-v4-flash-0731-r16-b12x-dspark5-maxseq16-650k"


def loaded(tmp_path: Path, files: dict[str, str]) -> ManifestSet:
    """Load ``files`` written under ``tmp_path`` as one set."""
    return load_manifest_set(write(tmp_path, files))


# ── the real fixtures ───────────────────────────────────────────────────────────


@pytest.mark.parametrize(
    ("name", "serves", "roles", "warnings"),
    [
        pytest.param("serves.toml", 42, ("dark-compute-a", "dark-compute-b"), 0, id="main"),
        pytest.param("serves.voice.toml", 3, (), 2, id="voice"),
        pytest.param("serves.comfyui.toml", 5, ("dark-compute-b",), 0, id="comfyui"),
    ],
)
def test_fixture_loads_alone(name: str, serves: int, roles: tuple[str, ...], warnings: int) -> None:
    manifest = load_manifest(FIXTURES / name)
    assert len(manifest.serves) == serves
    assert tuple(manifest.roles) == roles
    assert all(role.budget_mib == BUDGET for role in manifest.roles.values())
    assert len(manifest.warnings) == warnings
    desired = manifest.desired()
    assert isinstance(desired, DesiredState)
    assert tuple(desired.serves) == tuple(manifest.serves)


def test_voice_alone_warns_about_the_missing_capacity_row() -> None:
    manifest = load_manifest(FIXTURES / "serves.voice.toml")
    assert manifest.warnings == [
        f'{FIXTURES / "serves.voice.toml"}: serve "{name}" (#{i}): gpu_role: no [[gpu_roles]] '
        'capacity row for "dark-compute-b" in this manifest set; the serve takes no part '
        "in the ledger"
        for i, name in ((1, "stt"), (2, "tts"))
    ]
    assert not manifest.desired().in_ledger(manifest.desired().serves["stt"])


@pytest.fixture(scope="module")
def fixture_set() -> ManifestSet:
    """The three real manifests as one set."""
    return load_manifest_set([FIXTURES / name for name in FIXTURE_FILES])


def test_fixture_set_merges_the_mirrors(fixture_set: ManifestSet) -> None:
    # 42 in serves.toml + 3 voice + comfyui; the 4 comfyui mirrors merge into their owners
    assert len(fixture_set.serves) == 42 + 3 + 1
    assert fixture_set.warnings == []
    assert fixture_set.files == tuple(FIXTURES / name for name in FIXTURE_FILES)
    for mirrored in ("omni", "omni-small", "embeddings", "reranker"):
        assert fixture_set.source(mirrored) == FIXTURES / "serves.toml"
        assert fixture_set.sources(mirrored) == (
            FIXTURES / "serves.toml",
            FIXTURES / "serves.comfyui.toml",
        )
        assert fixture_set.serves[mirrored].up is not None  # the owner won
    assert fixture_set.source("comfyui") == FIXTURES / "serves.comfyui.toml"
    assert fixture_set.source("stt") == FIXTURES / "serves.voice.toml"
    assert fixture_set.role_sources("dark-compute-b") == (
        FIXTURES / "serves.toml",
        FIXTURES / "serves.comfyui.toml",
    )
    omni = fixture_set.desired().serves["omni"]
    assert (omni.gpu_roles, omni.vram_mib, omni.residency, omni.router_tier) == (
        ("dark-compute-b",),
        27999,
        Residency.EVICTABLE,
        "omni-local",
    )


def test_fixture_set_desired_state(fixture_set: ManifestSet) -> None:
    desired = fixture_set.desired()
    assert {rid: role.budget_mib for rid, role in desired.roles.items()} == {
        "dark-compute-a": BUDGET,
        "dark-compute-b": BUDGET,
    }
    tp2 = desired.serves[TP2_650K]
    assert tp2.exclusive
    assert tp2.gpu_roles == ("dark-compute-a", "dark-compute-b")
    assert tp2.vram_mib == 94721
    assert tp2.residency is Residency.ON_DEMAND
    assert desired.in_ledger(tp2)
    assert not desired.serves["primary"].exclusive
    assert desired.serves["realtime-proxy"].gpu_inference is False
    assert desired.serves["realtime-proxy"].gpu_roles == ()
    assert desired.serves["comfyui"].residency is Residency.ON_DEMAND
    # the real manifests declare no `desired`: pointed at them, vramctl manages nothing
    assert not any(spec.managed for spec in desired.serves.values())


def test_fixture_extra_keys_are_kept(fixture_set: ManifestSet) -> None:
    tp2 = fixture_set.serves[TP2_650K]
    assert tp2.model_extra is not None
    assert tp2.model_extra["router_config"] == "{dir}/anvil-router.deepseek-pi.toml"
    assert fixture_set.serves["primary"].served_name is None
    assert fixture_set.serves["primary"].stack == "serving"


def test_fixture_up_argv(fixture_set: ManifestSet) -> None:
    assert fixture_set.up_argv("omni") == [
        "docker",
        "compose",
        "-f",
        f"{FIXTURES.resolve()}/docker-compose.yml",
        "up",
        "-d",
        "omni",
    ]
    assert fixture_set.up_argv("stt") is not None


@pytest.mark.skipif(not SHARED_FIXTURES.is_dir(), reason="no shared fixtures beside the repo")
@pytest.mark.parametrize("name", [*FIXTURE_FILES, "LICENSE"])
def test_fixture_copy_matches_shared(name: str) -> None:
    assert (FIXTURES / name).read_bytes() == (SHARED_FIXTURES / name).read_bytes()


# ── one-file rules ──────────────────────────────────────────────────────────────

S1 = 'serve "s1" (#1)'
S2 = 'serve "s2" (#2)'
OMNI = 'serve "omni" (#1)'
ROLE_A = 'gpu_roles "a" (#1)'

SINGLE_FILE_CASES = [
    pytest.param(
        ROLES + serve('gpu_role = "a"\nvram_mib = true', name="omni"),
        (Expect(OMNI, "vram_mib", ("must be a positive integer of MiB", "got true")),),
        id="serve-vram-bool",
    ),
    pytest.param(
        ROLES + serve('gpu_role = "a"\nvram_mib = 1.5'),
        (Expect(S1, "vram_mib", ("positive integer of MiB", "got 1.5")),),
        id="serve-vram-float",
    ),
    pytest.param(
        ROLES + serve('gpu_role = "a"\nvram_mib = 0'),
        (Expect(S1, "vram_mib", ("positive integer of MiB", "got 0")),),
        id="serve-vram-zero",
    ),
    pytest.param(
        ROLES + serve('gpu_role = "a"\nvram_mib = -5'),
        (Expect(S1, "vram_mib", ("positive integer of MiB", "got -5")),),
        id="serve-vram-negative",
    ),
    pytest.param(
        ROLES + serve('gpu_role = "a"\nvram_mib = "100"'),
        (Expect(S1, "vram_mib", ("positive integer of MiB", 'got "100"')),),
        id="serve-vram-string",
    ),
    pytest.param(
        '[[gpu_roles]]\nid = "dark-compute-a"\nvram_mib = true\n',
        (
            Expect(
                'gpu_roles "dark-compute-a" (#1)',
                "vram_mib",
                ("positive integer of MiB", "got true"),
            ),
        ),
        id="role-vram-bool",
    ),
    pytest.param(
        '[[gpu_roles]]\nid = "a"\nvram_mib = 0\n',
        (Expect(ROLE_A, "vram_mib", ("positive integer of MiB", "got 0")),),
        id="role-vram-zero",
    ),
    pytest.param(
        '[[gpu_roles]]\nid = "a"\nvram_mib = 9.5\n',
        (Expect(ROLE_A, "vram_mib", ("positive integer of MiB", "got 9.5")),),
        id="role-vram-float",
    ),
    pytest.param(
        '[[gpu_roles]]\nid = "a"\nvram_mib = 1000\nreserve_mib = -1\n',
        (Expect(ROLE_A, "reserve_mib", ("non-negative integer of MiB", "got -1")),),
        id="role-reserve-negative",
    ),
    pytest.param(
        '[[gpu_roles]]\nid = "a"\nvram_mib = 1000\nreserve_mib = 2000\n',
        (Expect(ROLE_A, "reserve_mib", ("must not exceed vram_mib (1000)", "got 2000")),),
        id="role-reserve-above-capacity",
    ),
    pytest.param(
        ROLES + '\n[[gpu_roles]]\nid = "a"\nvram_mib = 1000\n',
        (Expect('gpu_roles "a" (#3)', "id", ("duplicate role id", "gpu_roles #1")),),
        id="role-duplicate-id",
    ),
    pytest.param(
        "[[gpu_roles]]\nvram_mib = 1000\n",
        (Expect("gpu_roles #1", "id", ("required",)),),
        id="role-missing-id",
    ),
    pytest.param(
        serve() + serve(container="c2"),
        (Expect('serve "s1" (#2)', "name", ("duplicate serve name", "serve #1")),),
        id="serve-duplicate-name",
    ),
    pytest.param(
        serve() + serve(name="s2"),
        (Expect(S2, "container", ('"c1"', "already declared", '"s1" (#1)')),),
        id="serve-duplicate-container",
    ),
    pytest.param(
        serve('residency = "sometimes"'),
        (Expect(S1, "residency", ("unknown residency", "on-demand", 'got "sometimes"')),),
        id="residency-unknown",
    ),
    pytest.param(
        serve('residency = "Evictible"'),
        (Expect(S1, "residency", ("unknown residency", 'did you mean "evictable"')),),
        id="residency-near-miss",
    ),
    pytest.param(
        serve("residency = 3"),
        (Expect(S1, "residency", ("resident, evictable, on-demand", "got 3")),),
        id="residency-not-a-string",
    ),
    pytest.param(
        ROLES + serve('gpu_roles = ["a"]\nvram_mib = 10'),
        (Expect(S1, "gpu_roles", ("exactly two distinct", '["a"]')),),
        id="gpu-roles-one",
    ),
    pytest.param(
        ROLES + serve('gpu_roles = ["a", "b", "c"]\nvram_mib = 10'),
        (Expect(S1, "gpu_roles", ("exactly two distinct",)),),
        id="gpu-roles-three",
    ),
    pytest.param(
        ROLES + serve('gpu_roles = ["a", "a"]\nvram_mib = 10'),
        (Expect(S1, "gpu_roles", ("exactly two distinct",)),),
        id="gpu-roles-same-twice",
    ),
    pytest.param(
        ROLES + serve('gpu_role = "a"\ngpu_roles = ["a", "b"]\nvram_mib = 10'),
        (Expect(S1, "gpu_roles", ("cannot be combined with gpu_role",)),),
        id="gpu-roles-with-gpu-role",
    ),
    pytest.param(
        ROLES
        + serve('gpu_roles = ["a", "b"]\nvram_mib = 10\noperating_mode = "dual-gpu-exclusive"'),
        (
            Expect(
                S1,
                "tensor_parallel_size",
                ("dual-gpu-exclusive", "tensor_parallel_size = 2", "missing"),
            ),
        ),
        id="exclusive-without-tp",
    ),
    pytest.param(
        ROLES
        + serve(
            'gpu_roles = ["a", "b"]\nvram_mib = 10\noperating_mode = "dual-gpu-exclusive"\n'
            "tensor_parallel_size = 1"
        ),
        (Expect(S1, "tensor_parallel_size", ("tensor_parallel_size = 2", "got 1")),),
        id="exclusive-tp-1",
    ),
    pytest.param(
        ROLES
        + serve(
            'gpu_role = "a"\nvram_mib = 10\noperating_mode = "dual-gpu-exclusive"\n'
            "tensor_parallel_size = 2"
        ),
        (Expect(S1, "gpu_roles", ("dual-gpu-exclusive", "needs gpu_roles")),),
        id="exclusive-without-gpu-roles",
    ),
    pytest.param(
        ROLES
        + serve(
            'gpu_roles = ["a", "b"]\nvram_mib = 10\noperating_mode = "dual-gpu-exlusive"\n'
            "tensor_parallel_size = 2"
        ),
        (Expect(S1, "operating_mode", ('did you mean "dual-gpu-exclusive"',)),),
        id="operating-mode-typo",
    ),
    pytest.param(
        serve('port = 8000\ndesired = "running"')
        + serve('port = 8000\ndesired = "running"', name="s2", container="c2"),
        (Expect(S2, "port", ("port 8000", 'serve "s1" (#1)', "running")),),
        id="port-shared-by-two-running",
    ),
    pytest.param(
        ROLES + serve('gpu_role = "a"\nvram_mb = 100'),
        (Expect(S1, "vram_mb", ("unknown key", 'did you mean "vram_mib"?')),),
        id="near-miss-serve-key",
    ),
    pytest.param(
        '[[gpu_roles]]\nid = "a"\nvram_mib = 1000\nreserve_mb = 10\n',
        (Expect(ROLE_A, "reserve_mb", ('did you mean "reserve_mib"?',)),),
        id="near-miss-role-key",
    ),
    pytest.param(
        ROLES
        + serve('gpu_role = "a"\nvram_mib = 100\nelastic = { url = "http://x", floor_mb = 10 }'),
        (
            Expect(S1, "elastic.floor_mb", ('did you mean "floor_mib"?',)),
            Expect(S1, "elastic.floor_mib", ("required",)),
        ),
        id="near-miss-elastic-key",
    ),
    pytest.param(
        '[[serves]]\nname = "s1"\ncontainer = "c1"\n',
        (Expect(None, "serves", ("unknown table", 'did you mean "serve"?')),),
        id="near-miss-top-level",
    ),
    pytest.param(
        ROLES
        + serve('gpu_role = "a"\nvram_mib = 100\nelastic = { url = "http://x", floor_mib = 200 }'),
        (Expect(S1, "elastic.floor_mib", ("must not exceed vram_mib (100)", "got 200")),),
        id="elastic-floor-above-vram",
    ),
    pytest.param(
        ROLES
        + serve('gpu_role = "a"\nvram_mib = 100\nelastic = { url = "http://x", floor_mib = 0 }'),
        (Expect(S1, "elastic.floor_mib", ("positive integer of MiB", "got 0")),),
        id="elastic-floor-zero",
    ),
    pytest.param(
        ROLES
        + serve(
            'gpu_role = "a"\nvram_mib = 100\n'
            'elastic = { url = "http://x", floor_mib = 10, segment_mib = 32 }'
        ),
        (Expect(S1, "elastic.segment_mib", ("at least 64", "got 32")),),
        id="elastic-segment-below-the-engines-minimum",
    ),
    pytest.param(
        ROLES
        + serve(
            'gpu_role = "a"\nvram_mib = 100\n'
            'elastic = { url = "http://x", floor_mib = 10, segment_mib = "512" }'
        ),
        (Expect(S1, "elastic.segment_mib", ("whole number of MiB", 'got "512"')),),
        id="elastic-segment-not-a-number",
    ),
    pytest.param(
        serve('elastic = { url = "http://x", floor_mib = 10 }'),
        (Expect(S1, "elastic", ("needs", "vram_mib")),),
        id="elastic-without-vram",
    ),
    pytest.param(
        ROLES + serve('gpu_role = "a"\nvram_mib = 100\nelastic = { url = "x:1", floor_mib = 10 }'),
        (Expect(S1, "elastic.url", ("http", 'got "x:1"')),),
        id="elastic-url-not-http",
    ),
    pytest.param(
        serve('desired = "run"'),
        (Expect(S1, "desired", ('"running" or "stopped"', 'got "run"')),),
        id="desired-invalid",
    ),
    pytest.param(
        serve(container=None),
        (Expect(S1, "container", ("required",)),),
        id="missing-container",
    ),
    pytest.param(
        serve(name=None),
        (Expect("serve #1", "name", ("required",)),),
        id="missing-name",
    ),
    pytest.param(
        serve() + '\n[[serve]]\nname = 5\ncontainer = "c2"\n',
        (Expect("serve #2", "name", ("non-empty string", "got 5")),),
        id="unnamed-serve-by-position",
    ),
    pytest.param(
        serve("port = 70000"),
        (Expect(S1, "port", ("TCP port", "got 70000")),),
        id="port-out-of-range",
    ),
    pytest.param(
        serve("priority = true"),
        (Expect(S1, "priority", ("must be an integer", "got true")),),
        id="priority-bool",
    ),
    pytest.param(
        serve("stop_timeout_s = -1"),
        (Expect(S1, "stop_timeout_s", ("positive number of seconds", "got -1")),),
        id="timeout-negative",
    ),
    pytest.param(
        serve("start_timeout_s = 0"),
        (Expect(S1, "start_timeout_s", ("positive number of seconds", "got 0")),),
        id="timeout-zero",
    ),
    pytest.param(
        serve("drain_timeout_s = 7200"),
        (Expect(S1, "drain_timeout_s", ("at most 3600 seconds", "got 7200")),),
        id="drain-timeout-above-router-limit",
    ),
    pytest.param(
        serve('idle_ttl_s = "1h"'),
        (Expect(S1, "idle_ttl_s", ("non-negative number of seconds", 'got "1h"')),),
        id="ttl-string",
    ),
    pytest.param(
        serve('gpu_inference = "no"'),
        (Expect(S1, "gpu_inference", ("true or false", 'got "no"')),),
        id="gpu-inference-string",
    ),
    pytest.param(
        serve('groups = "voice"'),
        (Expect(S1, "groups", ("list of non-empty strings", 'got "voice"')),),
        id="groups-not-a-list",
    ),
    pytest.param(
        serve("up = 'docker compose up \"omni'"),
        (Expect(S1, "up", ("cannot be split", "No closing quotation")),),
        id="up-unbalanced-quote",
    ),
    pytest.param(
        serve('health = "health"'),
        (Expect(S1, "health", ('starting with "/"',)),),
        id="health-not-a-path",
    ),
    pytest.param(
        serve('metrics_url = "127.0.0.1:8000/metrics"'),
        (Expect(S1, "metrics_url", ("http:// or https:// URL", "127.0.0.1:8000")),),
        id="metrics-url-without-scheme",
    ),
    pytest.param(
        serve("metrics_url = 8000"),
        (Expect(S1, "metrics_url", ("http:// or https:// URL",)),),
        id="metrics-url-not-a-string",
    ),
    pytest.param(
        'serve = ["x"]\n',
        (Expect("serve #1", None, ("must be a table", '"x"')),),
        id="serve-entry-not-a-table",
    ),
    pytest.param(
        'serve = "x"\n',
        (Expect(None, "serve", ("array of tables ([[serve]])",)),),
        id="serve-not-an-array",
    ),
]


@pytest.mark.parametrize(("text", "expected"), SINGLE_FILE_CASES)
def test_single_file_rule(tmp_path: Path, text: str, expected: tuple[Expect, ...]) -> None:
    check(errors_of(write(tmp_path, {"serves.toml": text})), expected)


def test_error_line_reads_like_the_contract(tmp_path: Path) -> None:
    text = serve(name="a", container="ca") + serve(name="b", container="cb")
    text += serve("vram_mib = true", name="omni", container="co")
    (err,) = errors_of(write(tmp_path, {"serves.toml": text}))
    assert str(err) == (
        f"{tmp_path / 'serves.toml'}: "
        'serve "omni" (#3): vram_mib: must be a positive integer of MiB, got true'
    )
    assert (err.serve, err.field, err.index, err.table) == ("omni", "vram_mib", 3, "serve")


def test_all_errors_of_a_file_are_collected(tmp_path: Path) -> None:
    text = (
        '[[gpu_roles]]\nid = "a"\nvram_mib = -1\n'
        + serve("vram_mib = 0\nport = 0")
        + serve(
            'residency = "x"\ngpu_role = "a"\ngpu_roles = ["a", "b"]', name="s2", container="c2"
        )
        + serve(name=None, container=None)
    )
    check(
        errors_of(write(tmp_path, {"serves.toml": text})),
        (
            Expect(ROLE_A, "vram_mib", ("positive",)),
            Expect(S1, "vram_mib", ("positive",)),
            Expect(S1, "port", ("TCP port",)),
            Expect(S2, "residency", ("unknown residency",)),
            Expect(S2, "gpu_roles", ("cannot be combined",)),
            Expect("serve #3", "name", ("required",)),
            Expect("serve #3", "container", ("required",)),
        ),
    )


def test_toml_syntax_error_has_line_and_column(tmp_path: Path) -> None:
    (err,) = errors_of(write(tmp_path, {"serves.toml": '[[serve]]\nname = "s1"\nport = \n'}))
    assert (err.line, err.column) == (3, 8)
    assert (
        str(err)
        == f"{tmp_path / 'serves.toml'}: line 3, column 8: TOML syntax error: Invalid value"
    )


def test_missing_file_is_a_located_error(tmp_path: Path) -> None:
    good = write(tmp_path, {"serves.toml": serve()})
    errors = errors_of([*good, tmp_path / "nope.toml"])
    check(errors, (Expect(None, None, ("no such file",), file="nope.toml"),))


def test_no_file_at_all() -> None:
    with pytest.raises(ManifestError, match="no manifest file given"):
        load_manifest_set([])


def test_unknown_keys_are_kept_and_reported_informational_ones_quietly(tmp_path: Path) -> None:
    text = "schema_version = 1\n" + serve('router_config = "{dir}/r.toml"\nstack = "x"')
    text += '\n[[promotion]]\nname = "p"\ntarget = "s1"\n'
    manifest = loaded(tmp_path, {"serves.toml": text})
    assert manifest.serves["s1"].model_extra == {"router_config": "{dir}/r.toml"}
    [warning] = manifest.warnings
    assert warning.endswith(
        "serves.toml: schema_version: unknown key, ignored (this version does not know it)"
    )


# ── set rules (several files) ───────────────────────────────────────────────────

OWNER = serve('gpu_role = "a"\nvram_mib = 100\nresidency = "evictable"\nup = "run s1"')
MIRROR = serve('gpu_role = "a"\nvram_mib = 100\nresidency = "evictable"')

SET_CASES = [
    pytest.param(
        {"serves.toml": ROLES + OWNER, "mirror.toml": MIRROR.replace("100", "200")},
        (
            Expect(
                S1,
                "vram_mib",
                ("disagrees with", "serves.toml", "200 here", "100 there"),
                file="mirror.toml",
            ),
        ),
        id="mirror-disagrees-with-owner",
    ),
    pytest.param(
        {
            "serves.toml": ROLES,
            "one.toml": MIRROR,
            "two.toml": MIRROR.replace("evictable", "resident"),
        },
        (
            Expect(
                S1,
                "residency",
                ("one.toml", '"resident" here', '"evictable" there'),
                file="two.toml",
            ),
        ),
        id="mirrors-disagree-with-each-other",
    ),
    pytest.param(
        {"serves.toml": ROLES + OWNER, "mirror.toml": MIRROR.replace('"a"', '"b"')},
        (Expect(S1, "gpu_role(s)", ("serves.toml", '["b"] here'), file="mirror.toml"),),
        id="mirror-on-another-role",
    ),
    pytest.param(
        {"serves.toml": ROLES + OWNER, "mirror.toml": MIRROR.replace('"s1"', '"s9"')},
        (Expect('serve "s9" (#1)', "name", ("serves.toml", '"s9" here'), file="mirror.toml"),),
        id="mirror-under-another-name",
    ),
    pytest.param(
        {"serves.toml": ROLES + OWNER, "other.toml": OWNER},
        (Expect(S1, "up", ("already owned", "serves.toml"), file="other.toml"),),
        id="two-owners-of-one-container",
    ),
    pytest.param(
        {"serves.toml": serve(), "other.toml": serve(container="c2")},
        (Expect(S1, "name", ("already used by", "serves.toml", '"c1"'), file="other.toml"),),
        id="one-name-two-containers",
    ),
    pytest.param(
        {
            "serves.toml": ROLES,
            "other.toml": '[[gpu_roles]]\nid = "a"\nvram_mib = 2000\nreserve_mib = 100\n',
        },
        (
            Expect(
                ROLE_A,
                "vram_mib",
                ("conflicting capacity", "2000 here", "1000", "serves.toml"),
                file="other.toml",
            ),
        ),
        id="conflicting-role-capacity",
    ),
    pytest.param(
        {"serves.toml": ROLES, "other.toml": '[[gpu_roles]]\nid = "a"\nvram_mib = 1000\n'},
        (
            Expect(
                ROLE_A, "reserve_mib", ("conflicting capacity", "serves.toml"), file="other.toml"
            ),
        ),
        id="conflicting-role-reserve",
    ),
    pytest.param(
        {
            "serves.toml": '[[gpu_roles]]\nid = "a"\nvram_mib = 1000\nuuid = "GPU-1"\n',
            "other.toml": '[[gpu_roles]]\nid = "a"\nvram_mib = 1000\nuuid = "GPU-2"\n',
        },
        (Expect(ROLE_A, "uuid", ('"GPU-2" here', '"GPU-1"', "serves.toml"), file="other.toml"),),
        id="conflicting-role-uuid",
    ),
    pytest.param(
        {
            "serves.toml": serve('port = 9000\ndesired = "running"'),
            "other.toml": serve('port = 9000\ndesired = "running"', name="s2", container="c2"),
        },
        (Expect('serve "s2" (#1)', "port", ("port 9000", "serves.toml"), file="other.toml"),),
        id="port-shared-across-files",
    ),
]


@pytest.mark.parametrize(("files", "expected"), SET_CASES)
def test_set_rule(tmp_path: Path, files: dict[str, str], expected: tuple[Expect, ...]) -> None:
    check(errors_of(write(tmp_path, files)), expected)


def test_owner_beats_mirror_in_any_order(tmp_path: Path) -> None:
    manifest = loaded(tmp_path, {"mirror.toml": MIRROR, "serves.toml": ROLES + OWNER})
    assert list(manifest.serves) == ["s1"]
    assert manifest.source("s1") == tmp_path / "serves.toml"
    assert manifest.sources("s1") == (tmp_path / "serves.toml", tmp_path / "mirror.toml")
    assert manifest.serves["s1"].up == "run s1"


def test_mirrors_without_owner_merge(tmp_path: Path) -> None:
    manifest = loaded(tmp_path, {"serves.toml": ROLES, "one.toml": MIRROR, "two.toml": MIRROR})
    assert manifest.source("s1") == tmp_path / "one.toml"
    assert manifest.up_argv("s1") is None


def test_role_uuid_merges_from_the_one_file_that_has_it(tmp_path: Path) -> None:
    manifest = loaded(
        tmp_path,
        {
            "serves.toml": '[[gpu_roles]]\nid = "a"\nvram_mib = 1000\n',
            "other.toml": '[[gpu_roles]]\nid = "a"\nvram_mib = 1000\nuuid = "GPU-1"\n',
        },
    )
    assert manifest.roles["a"].uuid == "GPU-1"
    assert manifest.desired().roles["a"].uuid == "GPU-1"


def test_desired_on_a_mirror_is_a_warning(tmp_path: Path) -> None:
    manifest = loaded(
        tmp_path,
        {"serves.toml": ROLES + OWNER, "mirror.toml": MIRROR + 'desired = "running"\n'},
    )
    assert manifest.serves["s1"].desired is None
    (warning,) = manifest.warnings
    assert "mirror.toml" in warning
    assert "desired: ignored on a mirror" in warning


def test_role_without_capacity_row_is_a_warning_not_an_error(tmp_path: Path) -> None:
    manifest = loaded(tmp_path, {"serves.toml": ROLES + serve('gpu_role = "zz"\nvram_mib = 5')})
    (warning,) = manifest.warnings
    assert 'serve "s1" (#1): gpu_role: no [[gpu_roles]] capacity row for "zz"' in warning
    desired = manifest.desired()
    assert not desired.in_ledger(desired.serves["s1"])


def test_reservation_without_role_warns(tmp_path: Path) -> None:
    manifest = loaded(tmp_path, {"serves.toml": serve("vram_mib = 5")})
    (warning,) = manifest.warnings
    assert "vram_mib: declared without gpu_role/gpu_roles" in warning


def test_same_file_twice_loads_once(tmp_path: Path) -> None:
    (path,) = write(tmp_path, {"serves.toml": ROLES + OWNER})
    manifest = load_manifest_set([path, path])
    assert manifest.files == (path,)
    assert any("given twice" in w for w in manifest.warnings)


# ── normalisation and conversion ───────────────────────────────────────────────


@pytest.mark.parametrize(
    ("written", "residency"),
    [
        ("ON_DEMAND", Residency.ON_DEMAND),
        ("On-Demand", Residency.ON_DEMAND),
        ("on_demand", Residency.ON_DEMAND),
        ("on-demand", Residency.ON_DEMAND),
        ("Resident", Residency.RESIDENT),
        (" EVICTABLE ", Residency.EVICTABLE),
    ],
)
def test_residency_normalisation(tmp_path: Path, written: str, residency: Residency) -> None:
    assert normalize_residency(written) is residency
    manifest = loaded(tmp_path, {"serves.toml": serve(f"residency = {json.dumps(written)}")})
    assert manifest.serves["s1"].residency is residency
    assert manifest.desired().serves["s1"].residency is residency


def test_up_is_split_without_a_shell_and_dir_substituted(tmp_path: Path) -> None:
    folder = tmp_path / "my manifests"
    folder.mkdir()
    up = "docker compose -f '{dir}/docker compose.yml' up -d omni; rm -rf {dir} $(whoami)"
    manifest = loaded(folder, {"serves.toml": serve(f"up = {json.dumps(up)}")})
    absolute = str(folder.resolve())
    expected = [
        "docker",
        "compose",
        "-f",
        f"{absolute}/docker compose.yml",
        "up",
        "-d",
        "omni;",
        "rm",
        "-rf",
        absolute,
        "$(whoami)",
    ]
    assert manifest.up_argv("s1") == expected
    assert manifest.serves["s1"].up_argv(folder) == expected
    assert manifest.serves["s1"].up == up  # the model keeps what was written


def test_desired_state_conversion(tmp_path: Path) -> None:
    body = """
        gpu_roles = ["a", "b"]
        vram_mib = 500
        residency = "on_demand"
        operating_mode = "Dual_GPU_Exclusive"
        tensor_parallel_size = 2
        desired = "running"
        port = 8001
        priority = -3
        min_runtime_s = 60
        idle_ttl_s = 900
        router_tier = "tier"
        groups = ["g1", "g2"]
        gpu_inference = false
        elastic = { url = "http://127.0.0.1:8001", floor_mib = 200, token_env = "TOK" }
    """
    manifest = loaded(tmp_path, {"serves.toml": ROLES + serve(body)})
    model = manifest.serves["s1"]
    assert (model.start_timeout_s, model.stop_timeout_s, model.drain_timeout_s) == (
        600.0,
        30.0,
        120.0,
    )
    desired = manifest.desired()
    assert desired.roles["a"].budget_mib == 900
    assert desired.roles["b"].budget_mib == 1000
    spec = desired.serves["s1"]
    assert spec.gpu_roles == ("a", "b")
    assert spec.exclusive
    assert spec.vram_mib == 500
    assert spec.residency is Residency.ON_DEMAND
    assert spec.desired is DesiredRun.RUNNING
    assert (spec.port, spec.priority, spec.min_runtime_s, spec.idle_ttl_s) == (
        8001,
        -3,
        60.0,
        900.0,
    )
    assert (spec.router_tier, spec.groups, spec.gpu_inference) == ("tier", ("g1", "g2"), False)
    assert spec.elastic == Elastic(url="http://127.0.0.1:8001", floor_mib=200, token_env="TOK")
    assert spec.elastic.segment_mib == 512  # the engine's default segment
    assert desired.in_ledger(spec)


def test_runtime_record_is_built_once_with_the_manifests_defaults(tmp_path: Path) -> None:
    """The executor's per-serve record: what the table says, else the one set of defaults."""
    body = """
        gpu_role = "a"
        vram_mib = 100
        health = "/health"
        start_timeout_s = 42
        stop_timeout_s = 7
        drain_timeout_s = 9
        up = "./up.sh {dir}"
        up_env = { HF_HOME = "/models" }
    """
    manifest = loaded(
        tmp_path, {"serves.toml": ROLES + serve(body) + serve(name="s2", container="c2")}
    )
    runtime = manifest.runtime()
    assert runtime is manifest.runtime()  # built once per set
    one = runtime["s1"]
    folder = str(tmp_path.resolve())
    assert (one.start_timeout_s, one.stop_timeout_s, one.drain_timeout_s) == (42.0, 7.0, 9.0)
    assert one.health == "/health"
    assert one.up_argv == ("./up.sh", folder)
    assert manifest.up_argv("s1") == ["./up.sh", folder]
    assert one.manifest_dir == tmp_path.resolve()
    assert dict(one.up_env or {}) == {"HF_HOME": "/models"}
    with pytest.raises(TypeError):
        one.up_env["HF_HOME"] = "/elsewhere"  # type: ignore[index]
    two = runtime["s2"]
    default = ServeRuntime.default("s2")
    assert (
        (two.start_timeout_s, two.stop_timeout_s, two.drain_timeout_s)
        == (
            default.start_timeout_s,
            default.stop_timeout_s,
            default.drain_timeout_s,
        )
        == (600.0, 30.0, 120.0)
    )
    assert (two.health, two.up_argv, two.up_env) == (None, None, None)
    model = manifest.serves["s2"]
    assert model.start_timeout_s == default.start_timeout_s  # one place for the defaults


def test_digest_follows_the_bytes(tmp_path: Path) -> None:
    one, two = write(tmp_path, {"one.toml": serve(), "two.toml": serve(name="s2", container="c2")})
    first = load_manifest_set([one, two]).digest
    assert first == load_manifest_set([one, two]).digest
    assert len(first) == 64
    assert first != load_manifest_set([two, one]).digest
    one.write_text(serve() + "# a comment\n", encoding="utf-8")
    assert load_manifest_set([one, two]).digest != first


def test_digest_sees_bytes_move_between_files(tmp_path: Path) -> None:
    one, two = write(tmp_path, {"one.toml": "allow_empty = true\n#x\n", "two.toml": "#y\n"})
    before = load_manifest_set([one, two]).digest
    one.write_text("allow_empty = true\n", encoding="utf-8")
    two.write_text("#x\n#y\n", encoding="utf-8")
    assert load_manifest_set([one, two]).digest != before


# ── the JSON Schema ────────────────────────────────────────────────────────────


def test_schema_file_is_current() -> None:
    fresh = render_schema()
    on_disk = SCHEMA_PATH.read_text(encoding="utf-8") if SCHEMA_PATH.exists() else ""
    assert on_disk == fresh, (
        f"{SCHEMA_PATH} is stale; regenerate it with: python -m controller.manifest.schema"
    )


def test_schema_describes_the_manifest() -> None:
    schema = json.loads(render_schema())
    serve_schema = schema["$defs"]["ServeModel"]
    assert schema["properties"]["serve"]["items"] == {"$ref": "#/$defs/ServeModel"}
    assert serve_schema["additionalProperties"] is True
    assert serve_schema["properties"]["vram_mib"]["minimum"] == 1
    assert set(serve_schema["required"]) == {"name", "container"}
    assert schema["$defs"]["GpuRoleModel"]["required"] == ["id", "vram_mib"]


def test_near_miss_role_is_an_error_and_an_oversized_reservation_too(tmp_path: Path) -> None:
    path = tmp_path / "m.toml"
    path.write_text(
        '[[gpu_roles]]\nid = "card"\nvram_mib = 8192\nreserve_mib = 1024\n\n'
        '[[serve]]\nname = "a"\ncontainer = "ca"\ngpu_role = "crad"\nvram_mib = 1000\n\n'
        '[[serve]]\nname = "b"\ncontainer = "cb"\ngpu_role = "card"\nvram_mib = 9000\n'
    )
    with pytest.raises(ManifestError) as exc:
        load_manifest_set([path])
    text = "\n".join(str(e) for e in exc.value.errors)
    assert 'serve "a" (#1): gpu_role: no [[gpu_roles]] row "crad"' in text
    assert 'did you mean "card"?' in text
    assert 'serve "b" (#2): vram_mib: 9000 MiB can never fit role "card"' in text
    assert "8192 - 1024 = 7168 MiB" in text


@pytest.mark.parametrize(
    ("body", "url"),
    [
        pytest.param('engine = "vllm"\nport = 8001', "http://127.0.0.1:8001/metrics", id="vllm"),
        pytest.param(
            'engine = "SGLang"\nport = 30000', "http://127.0.0.1:30000/metrics", id="sglang"
        ),
        pytest.param(
            'engine = "llama.cpp"\nport = 8080', "http://127.0.0.1:8080/metrics", id="llama"
        ),
        pytest.param('engine = "tgi"\nport = 8080', None, id="unknown-engine"),
        pytest.param('engine = "vllm"', None, id="no-port"),
        pytest.param(
            'engine = "vllm"\nport = 8001\nmetrics_url = "http://10.0.0.5:9000/m"',
            "http://10.0.0.5:9000/m",
            id="explicit-wins",
        ),
    ],
)
def test_where_the_engine_metrics_are_read(tmp_path: Path, body: str, url: str | None) -> None:
    mset = loaded(tmp_path, {"serves.toml": ROLES + serve(body)})
    assert mset.serves["s1"].metrics_source() == url
