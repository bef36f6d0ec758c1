"""The start records laid over an observation (controller/service/overlay_rules.py).

A container found holding memory without a record gets one: on the card its
environment names (``VRAMCTL_GPU_ROLE``, what its ``up`` was told) where the manifest
declares that role (the container runs where it was made), else on its declared roles
and the card it names (never less than the truth). A placed serve's declared roles
are every candidate, so without that word its record would count it on all of them.
"""

from __future__ import annotations

from controller.service.overlay_rules import started_records
from controller.snapshot import ContainerModel, SnapshotModel
from statemachine.domain import types as sm

ROLES = {r: sm.GpuRole(r, 10000) for r in ("a", "b", "c")}


def snap(**told: str | None) -> SnapshotModel:
    return SnapshotModel(
        docker="ok",
        containers={
            f"c-{n}": ContainerModel(state=sm.ContainerState.RUNNING, gpu_role=role)
            for n, role in told.items()
        },
    )


def serve(name: str, roles: tuple[str, ...], placement: tuple[str, ...] = ()) -> sm.ServeSpec:
    return sm.ServeSpec(
        name, f"c-{name}", roles, 4000, desired=sm.DesiredRun.RUNNING, placement=placement
    )


def added(desired: sm.DesiredState, s: SnapshotModel, **known: sm.StartedWith) -> dict[str, object]:
    found = started_records(desired, s, {}, {f"c-{n}": r for n, r in known.items()})
    return {c: r.gpu_roles for c, r in found.added.items()}


def test_a_pinned_serve_found_on_another_card_is_counted_where_it_was_made() -> None:
    """Re-pinned from a to b, its container (made for a, started from outside) runs on
    a: counted there alone (counted on b too, it was one container on two cards); a
    card no row declares is counted beside the declared ones."""
    desired = sm.DesiredState(ROLES, {"x": serve("x", ("b",))})
    assert added(desired, snap(x="a")) == {"c-x": ("a",)}
    assert added(desired, snap(x="b")) == {"c-x": ("b",)}
    assert added(desired, snap(x=None)) == {"c-x": ("b",)}
    assert added(desired, snap(x="z")) == {"c-x": ("z", "b")}


def test_a_placed_serve_found_on_a_card_is_counted_there_alone() -> None:
    p = serve("p", ("a", "b"), placement=("a", "b"))
    desired = sm.DesiredState(ROLES, {"p": p})
    assert added(desired, snap(p="b")) == {"c-p": ("b",)}
    assert added(desired, snap(p="c")) == {"c-p": ("c",)}  # a card that left placement
    assert added(desired, snap(p="z")) == {"c-p": ("z", "a", "b")}
    assert added(desired, snap(p=None)) == {"c-p": ("a", "b")}


def test_a_container_no_manifest_declares_is_counted_on_the_card_it_names() -> None:
    """Its last declaration (a placed serve's: every candidate) narrowed by its word."""
    known = sm.StartedWith("p", ("a", "b", "c"), 4000)
    desired = sm.DesiredState(ROLES, {})
    assert added(desired, snap(p="c"), p=known) == {"c-p": ("c",)}
    assert added(desired, snap(p="d"), p=known) == {"c-p": ("a", "b", "c", "d")}
    assert added(desired, snap(p=None), p=known) == {"c-p": ("a", "b", "c")}
