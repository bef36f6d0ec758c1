"""``placement``: a serve that lists the gpu roles it may run on, one card each time.

- each loader rule refuses with its located message (combined with ``gpu_role`` or
  ``gpu_roles``, no ``vram_mib``, an undeclared or too-small candidate, a candidate
  twice, an empty list, ``dual-gpu-exclusive``);
- a valid placed serve gives ``ServeSpec(placement=candidates, gpu_roles=candidates)``
  (the ledger counts it on every candidate until one is chosen), a pinned one
  ``placement=()``; a mirror must agree on it; placed residents are not summed on every
  candidate;
- ``render`` gives one fraction when every candidate's is the same, and names each
  card's when they differ (``fraction-per-card``, a note in ``lint``);
- the JSON Schema documents the field.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.files import compose

from controller.manifest import LocatedError, ManifestError, ManifestSet, load_manifest_set
from controller.manifest.schema import render_schema
from controller.tools.compose_lint import lint_compose, render_serve
from statemachine.domain.types import ServeSpec
from statemachine.flags.fraction import FindingKind

ROLES = """
[[gpu_roles]]
id = "gpu-a"
vram_mib = 24576
reserve_mib = 512

[[gpu_roles]]
id = "gpu-b"
vram_mib = 8192
reserve_mib = 192

[[gpu_roles]]
id = "gpu-c"
vram_mib = 24576
reserve_mib = 512
"""


def serve(name: str, body: str) -> str:
    return f'\n[[serve]]\nname = "{name}"\ncontainer = "c-{name}"\n{body}\n'


def write(tmp_path: Path, text: str, name: str = "serves.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def load(tmp_path: Path, text: str) -> ManifestSet:
    return load_manifest_set([write(tmp_path, text)])


def errors_of(tmp_path: Path, text: str) -> list[str]:
    path = write(tmp_path, text)
    with pytest.raises(ManifestError) as info:
        load_manifest_set([path])
    return [str(e).removeprefix(f"{path}: ") for e in info.value.errors]


def only_error(tmp_path: Path, text: str) -> str:
    (error,) = errors_of(tmp_path, text)
    return error


# ── the rules ──────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("pin", ['gpu_role = "gpu-a"', 'gpu_roles = ["gpu-a", "gpu-c"]'])
def test_placement_is_not_combined_with_a_pinned_role(tmp_path: Path, pin: str) -> None:
    field = pin.partition(" ")[0]
    body = f'placement = ["gpu-a", "gpu-c"]\n{pin}\nvram_mib = 6000'
    assert only_error(tmp_path, ROLES + serve("x", body)) == (
        f'serve "x" (#1): placement: cannot be combined with {field}; declare one of them'
    )


def test_placement_with_both_pinned_fields_names_both(tmp_path: Path) -> None:
    body = (
        'placement = ["gpu-a"]\ngpu_role = "gpu-a"\ngpu_roles = ["gpu-a", "gpu-c"]\nvram_mib = 6000'
    )
    errors = errors_of(tmp_path, ROLES + serve("x", body))
    assert (
        'serve "x" (#1): placement: cannot be combined with gpu_role or gpu_roles; '
        "declare one of them"
    ) in errors
    # the existing rule between the two pinned fields still speaks
    assert 'serve "x" (#1): gpu_roles: cannot be combined with gpu_role; declare one of them' in (
        errors
    )


def test_placement_needs_vram_mib(tmp_path: Path) -> None:
    text = ROLES + serve("x", 'placement = ["gpu-a", "gpu-c"]')
    assert only_error(tmp_path, text) == (
        'serve "x" (#1): placement: needs vram_mib: the controller places the serve on a '
        "candidate its reservation fits"
    )


def test_every_candidate_needs_a_role_row_with_a_hint_for_a_near_miss(tmp_path: Path) -> None:
    body = 'placement = ["gpu-a", "gpu-bb", "scratch"]\nvram_mib = 6000'
    assert errors_of(tmp_path, ROLES + serve("x", body)) == [
        'serve "x" (#1): placement: no [[gpu_roles]] row "gpu-bb" in this manifest set '
        '(each placement candidate must be a declared role); did you mean "gpu-b"?',
        'serve "x" (#1): placement: no [[gpu_roles]] row "scratch" in this manifest set '
        "(each placement candidate must be a declared role)",
    ]


def test_a_pinned_role_far_from_any_row_is_still_a_warning(tmp_path: Path) -> None:
    mset = load(tmp_path, ROLES + serve("x", 'gpu_role = "scratch"\nvram_mib = 6000'))
    assert any('gpu_role: no [[gpu_roles]] capacity row for "scratch"' in w for w in mset.warnings)


def test_each_candidates_budget_must_hold_the_reservation(tmp_path: Path) -> None:
    body = 'placement = ["gpu-a", "gpu-b"]\nvram_mib = 12000'
    assert only_error(tmp_path, ROLES + serve("x", "") + serve("y", body)) == (
        'serve "y" (#2): placement: role "gpu-b" has a budget of 8000 MiB (capacity 8192 '
        "- reserve 192), less than vram_mib 12000: it can never hold this serve"
    )


def test_a_budget_exactly_the_reservation_holds_it(tmp_path: Path) -> None:
    mset = load(tmp_path, ROLES + serve("y", 'placement = ["gpu-a", "gpu-b"]\nvram_mib = 8000'))
    assert mset.desired().serves["y"].placement == ("gpu-a", "gpu-b")


def test_a_candidate_twice_is_refused(tmp_path: Path) -> None:
    body = 'placement = ["gpu-a", "gpu-c", "gpu-a"]\nvram_mib = 6000'
    assert only_error(tmp_path, ROLES + serve("x", body)) == (
        'serve "x" (#1): placement: must list each gpu role once ("gpu-a" is there twice), '
        'got ["gpu-a", "gpu-c", "gpu-a"]'
    )


@pytest.mark.parametrize(
    ("value", "shown"),
    [("[]", "[]"), ('["gpu-a", ""]', '["gpu-a", ""]'), ('"gpu-a"', '"gpu-a"'), ("[1]", "[1]")],
)
def test_placement_is_a_list_of_one_or_more_role_ids(
    tmp_path: Path, value: str, shown: str
) -> None:
    body = f"placement = {value}\nvram_mib = 6000"
    assert only_error(tmp_path, ROLES + serve("x", body)) == (
        'serve "x" (#1): placement: must list one or more gpu role ids (non-empty strings), '
        f"got {shown}"
    )


def test_dual_gpu_exclusive_is_refused_with_placement(tmp_path: Path) -> None:
    body = (
        'placement = ["gpu-a", "gpu-c"]\nvram_mib = 6000\noperating_mode = "dual-gpu-exclusive"\n'
        "tensor_parallel_size = 2"
    )
    assert only_error(tmp_path, ROLES + serve("x", body)) == (
        'serve "x" (#1): operating_mode: "dual-gpu-exclusive" cannot be combined with '
        "placement: it needs gpu_roles = [two roles], and a placed serve runs on one card"
    )


def test_errors_are_located_objects(tmp_path: Path) -> None:
    path = write(tmp_path, ROLES + serve("x", 'placement = ["gpu-a"]'))
    with pytest.raises(ManifestError) as info:
        load_manifest_set([path])
    (error,) = info.value.errors
    assert error == LocatedError(
        str(path),
        "x",
        "placement",
        "needs vram_mib: the controller places the serve on a candidate its reservation fits",
        "serve",
        1,
    )


# ── what a valid placed serve becomes ───────────────────────────────────────────────


PLACED = ROLES + serve(
    "ocr",
    'placement = ["gpu-c", "gpu-a", "gpu-b"]\nvram_mib = 6000\nresidency = "evictable"\n'
    'desired = "running"\nengine = "vllm"',
)


def test_a_placed_serve_is_counted_on_every_candidate_in_declared_order(tmp_path: Path) -> None:
    mset = load(tmp_path, PLACED + serve("pinned", 'gpu_role = "gpu-a"\nvram_mib = 1000'))
    spec = mset.desired().serves["ocr"]
    assert spec == ServeSpec(
        name="ocr",
        container="c-ocr",
        gpu_roles=("gpu-c", "gpu-a", "gpu-b"),
        vram_mib=6000,
        residency=spec.residency,
        desired=spec.desired,
        sizes_from_free=spec.sizes_from_free,
        placement=("gpu-c", "gpu-a", "gpu-b"),
    )
    assert not spec.placed
    assert mset.desired().in_ledger(spec)
    pinned = mset.desired().serves["pinned"]
    assert (pinned.placement, pinned.gpu_roles) == ((), ("gpu-a",))
    assert mset.warnings == []


def test_the_model_names_its_candidates_and_runs_on_one_card(tmp_path: Path) -> None:
    text = PLACED + serve("tp", 'gpu_roles = ["gpu-a", "gpu-c"]\nvram_mib = 1000')
    mset = load(tmp_path, text + serve("free", "vram_mib = 1"))
    ocr, tp, free = (mset.serves[n] for n in ("ocr", "tp", "free"))
    assert (ocr.roles, ocr.roles_field, ocr.cards) == (("gpu-c", "gpu-a", "gpu-b"), "placement", 1)
    assert (tp.roles, tp.roles_field, tp.cards) == (("gpu-a", "gpu-c"), "gpu_roles", 2)
    assert (free.roles, free.cards) == ((), 0)


def test_a_mirror_must_agree_on_placement(tmp_path: Path) -> None:
    owner = write(tmp_path, PLACED.replace('engine = "vllm"', 'up = "true"'), "owner.toml")
    mirror_body = 'gpu_roles = ["gpu-c", "gpu-a"]\nvram_mib = 6000\nresidency = "evictable"'
    mirror = write(tmp_path, ROLES + serve("ocr", mirror_body), "mirror.toml")
    with pytest.raises(ManifestError) as info:
        load_manifest_set([owner, mirror])
    fields = {e.field: e.message for e in info.value.errors}
    assert "placement" in fields, fields
    assert fields["placement"] == (
        f'mirror of container "c-ocr" disagrees with {owner} serve "ocr" (#1): null here, '
        '["gpu-c", "gpu-a", "gpu-b"] there'
    )


def test_placed_residents_are_not_summed_on_every_candidate(tmp_path: Path) -> None:
    resident = 'residency = "resident"\ndesired = "running"\nvram_mib = 20000'
    text = ROLES + "".join(
        serve(n, f'placement = ["gpu-a", "gpu-c"]\n{resident}') for n in ("one", "two")
    )
    assert set(load(tmp_path, text).serves) == {"one", "two"}


def test_a_resident_with_one_candidate_is_summed_like_a_pinned_one(tmp_path: Path) -> None:
    resident = 'residency = "resident"\ndesired = "running"\nvram_mib = 20000'
    text = ROLES + serve("one", f'placement = ["gpu-a"]\n{resident}')
    text += serve("two", f'gpu_role = "gpu-a"\n{resident}')
    (error,) = errors_of(tmp_path, text)
    assert error.startswith('gpu_roles "gpu-a" (#1): the residents desired "running" on it')


# ── render and lint ─────────────────────────────────────────────────────────────────


def test_render_gives_one_fraction_when_the_candidates_agree(tmp_path: Path) -> None:
    text = ROLES + serve("same", 'placement = ["gpu-a", "gpu-c"]\nvram_mib = 6000\nengine="vllm"')
    answer = render_serve(load(tmp_path, text), "same")
    assert answer.result.argv == ("--gpu-memory-utilization", "0.2441")
    assert "tensor parallel" not in answer.result.explanation
    assert answer.result.explanation.endswith(
        "; the same on each placement candidate (gpu-a, gpu-c): the serve runs on one of them"
    )
    assert [t.role for t in answer.result.totals] == ["gpu-a", "gpu-c"]


def test_render_names_each_cards_fraction_when_they_differ(tmp_path: Path) -> None:
    answer = render_serve(load(tmp_path, PLACED), "ocr")
    result = answer.result
    assert result.argv == () and result.problem_kind is FindingKind.PER_CARD
    assert result.problem == (
        "the fraction differs per card: 6000 MiB is 0.2441 on 24576 MiB (declared capacity "
        "of role gpu-c); 0.2441 on 24576 MiB (declared capacity of role gpu-a); 0.7324 on "
        "8192 MiB (declared capacity of role gpu-b); the serve runs on whichever placement "
        "candidate the controller chooses, so no one command line holds its reservation on "
        "each (render one card's flag with its --device-total, or give the candidates one "
        "capacity)"
    )


def test_render_with_one_device_total_gives_that_cards_flag(tmp_path: Path) -> None:
    mset = load(tmp_path, PLACED)
    answer = render_serve(mset, "ocr", measured=dict.fromkeys(mset.serves["ocr"].roles, 8192))
    assert answer.result.argv == ("--gpu-memory-utilization", "0.7324")


def test_lint_notes_a_placed_serve_whose_fraction_differs_per_card(tmp_path: Path) -> None:
    services = """
    ocr:
      image: vllm/vllm-openai:v0.11.0
      container_name: c-ocr
      command: --model m --gpu-memory-utilization 0.2441
    """
    report = lint_compose(load(tmp_path, PLACED), [compose(tmp_path, services)], environ={})
    assert report.ok
    (note,) = report.findings
    assert (note.kind, note.serve) == (FindingKind.PER_CARD, "ocr")
    assert note.message.startswith(
        "cannot check --gpu-memory-utilization: the fraction differs per card"
    )


def test_lint_checks_a_placed_serve_on_every_candidate_when_they_agree(tmp_path: Path) -> None:
    text = ROLES + serve("same", 'placement = ["gpu-a", "gpu-c"]\nvram_mib = 6000\nengine="vllm"')
    services = """
    same:
      image: vllm/vllm-openai:v0.11.0
      container_name: c-same
      command: --model m --gpu-memory-utilization 0.5
    """
    report = lint_compose(load(tmp_path, text), [compose(tmp_path, services)], environ={})
    (error,) = report.errors
    assert error.kind is FindingKind.DISAGREES


# ── the schema ───────────────────────────────────────────────────────────────────


def test_the_schema_documents_placement() -> None:
    schema = json.loads(render_schema())
    field = schema["$defs"]["ServeModel"]["properties"]["placement"]
    assert field["type"] == "array"
    assert field["items"] == {"type": "string", "minLength": 1}
    assert (field["minItems"], field["uniqueItems"]) == (1, True)
    assert "controller chooses one card" in field["description"]
    assert "docs/placement.md" in field["description"]
