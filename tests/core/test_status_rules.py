"""The status report's rules (``statemachine.answers.status_report``) beside
tests/core/test_status_report.py.

Written from docs/placement.md (``vramctl status`` shows a placed serve on the card it
holds, ``gpu_roles``, beside its candidates, ``placement``; every candidate while it
holds nothing), from ``Observed`` (``docker_ok`` False: every container's state is
unknown) and docs/limits.md (what cannot be known is ``None``, never a guess): the
report's JSON carries lists; a pinned serve's row shows the roles its manifest
declares; with Docker unreadable no container's figure is shown, whatever the snapshot
lists; a sleep state read for a container that holds nothing shows no sleep level or
residual; a serve that declares no reservation has no drift; an evictable serve kept
down names only the requested serves that hold memory. Pure: builds desired states
and observations, no Docker, no NVML.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from support.core import spec

from statemachine.answers.status_report import host_status
from statemachine.domain import types as sm

NOW = 10_000.0
RUN = sm.DesiredRun.RUNNING
RES, EVI, OND = sm.Residency.RESIDENT, sm.Residency.EVICTABLE, sm.Residency.ON_DEMAND
ROLES = (sm.GpuRole("a", 32_000, 2_000, uuid="GPU-a"), sm.GpuRole("b", 32_000, 2_000, uuid="GPU-b"))
UP = sm.ContainerObs(sm.ContainerState.RUNNING, health="healthy", started_at=0.0)
ASLEEP = sm.SleepObs(sm.SleepState.ASLEEP, level=1, residual_mib=1_000)


def sv(name: str, mib: int | None, residency: sm.Residency | None, **kw: Any) -> sm.ServeSpec:
    return spec(name, mib, residency, roles=kw.pop("gpu_roles", ("a",)), **kw)


def desired_of(*serves: sm.ServeSpec, **kw: Any) -> sm.DesiredState:
    return sm.DesiredState({r.id: r for r in ROLES}, {s.name: s for s in serves}, **kw)


def row(desired: sm.DesiredState, observed: sm.Observed, name: str) -> dict[str, Any]:
    rows: dict[str, dict[str, Any]] = {
        r["serve"]: r for r in host_status(desired, observed).to_json()["serves"]
    }
    return rows[name]


def on(role: str) -> sm.ContainerObs:
    """A running container whose environment names ``role`` (VRAMCTL_GPU_ROLE)."""
    return sm.ContainerObs(
        sm.ContainerState.RUNNING, health="healthy", started_at=0.0, gpu_role=role
    )


# --- the JSON carries lists -------------------------------------------------------


def test_a_serve_s_roles_are_a_json_list() -> None:
    out = row(
        desired_of(sv("stt", 4_000, RES, desired=RUN)), sm.Observed(True, {"c-stt": UP}), "stt"
    )
    assert out["gpu_roles"] == ["a"]
    assert type(out["gpu_roles"]) is list
    assert "placement" not in out  # only for a placed serve


# --- where a serve is shown --------------------------------------------------------


PLACED = sv("llm", 8_000, OND, gpu_roles=("a", "b"), placement=("a", "b"))


def test_a_placed_serve_holding_memory_is_shown_on_its_card_beside_its_candidates() -> None:
    observed = sm.Observed(
        True, {"c-llm": on("b")}, started_with={"c-llm": sm.StartedWith("llm", ("b",), 8_000)}
    )
    out = row(desired_of(PLACED), observed, "llm")
    assert out["gpu_roles"] == ["b"]
    assert out["placement"] == ["a", "b"]
    assert type(out["placement"]) is list


def test_a_placed_serve_whose_record_and_environment_disagree_is_shown_where_counted() -> None:
    """Running, its start record says a and its environment b: the ledger counts it on
    both (never less than the truth), and its row shows both, not the record's card."""
    observed = sm.Observed(
        True, {"c-llm": on("b")}, started_with={"c-llm": sm.StartedWith("llm", ("a",), 8_000)}
    )
    assert row(desired_of(PLACED), observed, "llm")["gpu_roles"] == ["a", "b"]


def test_a_stopped_placed_serve_started_on_all_its_candidates_is_shown_as_recorded() -> None:
    """Started on b and a together (pinned so before an edit placed it), then stopped:
    its record names every candidate, and its row shows them as the start named them."""
    observed = sm.Observed(
        True,
        {"c-llm": sm.ContainerObs(sm.ContainerState.EXITED, exit_code=0)},
        started_with={"c-llm": sm.StartedWith("llm", ("b", "a"), 8_000)},
    )
    assert row(desired_of(PLACED), observed, "llm")["gpu_roles"] == ["b", "a"]


def test_a_placed_serve_holding_nothing_is_shown_on_every_candidate() -> None:
    out = row(desired_of(PLACED), sm.Observed(True), "llm")
    assert out["gpu_roles"] == ["a", "b"]
    assert out["placement"] == ["a", "b"]


def test_a_placed_serve_a_plan_put_elsewhere_is_shown_where_its_container_ran() -> None:
    """Stopped (evicted from b), it holds nothing; the plan would put it on a next. Its
    row shows the card its container was told (b), not where it has never run; without
    that word, every candidate, whatever card the plan chose."""
    on_a = sv("llm", 8_000, EVI, desired=RUN, gpu_roles=("a",), placement=("a", "b"))
    exited_b = sm.ContainerObs(sm.ContainerState.EXITED, exit_code=0, gpu_role="b")
    assert row(desired_of(on_a), sm.Observed(True, {"c-llm": exited_b}), "llm")["gpu_roles"] == [
        "b"
    ]
    exited = sm.ContainerObs(sm.ContainerState.EXITED, exit_code=0)
    out = row(desired_of(on_a), sm.Observed(True, {"c-llm": exited}), "llm")
    assert out["gpu_roles"] == ["a", "b"]
    # its start record names the card first, whatever the environment says
    record = {"c-llm": sm.StartedWith("llm", ("b",), 8_000)}
    for obs in (exited, replace(exited_b, gpu_role="a")):
        got = row(desired_of(on_a), sm.Observed(True, {"c-llm": obs}, started_with=record), "llm")
        assert got["gpu_roles"] == ["b"]
    # a card it no longer has among its candidates is not where it is
    gone = sm.ContainerObs(sm.ContainerState.EXITED, exit_code=0, gpu_role="c")
    assert row(desired_of(on_a), sm.Observed(True, {"c-llm": gone}), "llm")["gpu_roles"] == [
        "a",
        "b",
    ]


def test_a_placed_evictable_serve_kept_down_names_who_holds_its_other_candidate() -> None:
    """Evicted from b for the requested big, with a full too, it is kept down for big
    though the plan would try it on a: the requested serves are read on every
    candidate."""
    llm = sv("llm", 8_000, EVI, desired=RUN, gpu_roles=("a",), placement=("a", "b"))
    big = sv("big", 30_000, OND, gpu_roles=("b",))
    hog = sv("hog", 30_000, RES, desired=RUN, gpu_roles=("a",))
    desired = desired_of(llm, big, hog, requests=(sm.OnDemandRequest("big", NOW - 1),))
    exited_b = sm.ContainerObs(sm.ContainerState.EXITED, exit_code=0, gpu_role="b")
    observed = sm.Observed(True, {"c-llm": exited_b, "c-big": on("b"), "c-hog": UP})
    out = row(desired, observed, "llm")
    assert out["gpu_roles"] == ["b"]
    assert out["evicted_for"] == ["big"]


def test_a_pinned_serve_is_shown_on_the_roles_its_manifest_declares() -> None:
    # re-pinned from b to a while it runs on b: the ledger counts it on b, where it
    # runs (its start record and its environment say so); its row shows what the
    # manifest declares, as for any serve that is not placed
    observed = sm.Observed(
        True, {"c-stt": on("b")}, started_with={"c-stt": sm.StartedWith("stt", ("b",), 4_000)}
    )
    desired = desired_of(sv("stt", 4_000, RES, desired=RUN))
    assert host_status(desired, observed).to_json()["gpu_roles"][1]["committed_mib"] == 4_000
    assert row(desired, observed, "stt")["gpu_roles"] == ["a"]


# --- what is unknown is not shown -------------------------------------------------


def test_with_docker_unreadable_no_container_figure_is_shown_whatever_it_lists() -> None:
    stt = sv("stt", 4_000, RES, desired=RUN)
    busy = sm.ContainerObs(sm.ContainerState.RUNNING, started_at=0.0, gpu_used_mib=3_900)
    observed = sm.Observed(False, {"c-stt": busy}, sleep={"stt": ASLEEP})
    out = row(desired_of(stt), observed, "stt")
    assert out["state"] == "unknown"
    assert out["nvml_used_mib"] is None
    assert out["drift_mib"] is None
    assert out["sleep"] == {
        "state": "unknown",
        "level": None,
        "residual_mib": None,
        "host_ram_mib": None,
    }


def test_a_sleep_state_read_for_a_container_that_holds_nothing_shows_no_level() -> None:
    # the engine's last answer says asleep, but its container has exited: it holds
    # nothing, so it sleeps at no level and holds no residual
    stt = sv("stt", 4_000, RES, desired=RUN)
    gone = sm.ContainerObs(sm.ContainerState.EXITED, exit_code=0, oom_killed=False)
    out = row(desired_of(stt), sm.Observed(True, {"c-stt": gone}, sleep={"stt": ASLEEP}), "stt")
    assert out["sleep"]["level"] is None
    assert out["sleep"]["residual_mib"] is None
    assert out["held_mib"] is None


def test_a_serve_that_declares_no_reservation_has_no_drift_though_nvml_reads_it() -> None:
    free = sv("free", None, None)
    busy = sm.ContainerObs(sm.ContainerState.RUNNING, started_at=0.0, gpu_used_mib=2_500)
    out = row(desired_of(free), sm.Observed(True, {"c-free": busy}), "free")
    assert out["nvml_used_mib"] == 2_500
    assert out["held_mib"] is None
    assert out["drift_mib"] is None


# --- an evictable serve kept down ---------------------------------------------------


def test_an_evictable_serve_kept_down_names_only_the_requested_serves_holding_memory() -> None:
    coder = sv("coder", 16_000, EVI, desired=RUN)
    od = sv("od", 25_000, OND)  # holds 25000 of a's 30000: coder's 16000 does not fit
    chat = sv("chat", 2_000, OND)  # requested too, not started yet: holds nothing
    desired = desired_of(
        coder, od, chat, requests=(sm.OnDemandRequest("chat", NOW), sm.OnDemandRequest("od", NOW))
    )
    out = row(desired, sm.Observed(True, {"c-od": UP}), "coder")
    assert out["evicted_for"] == ["od"]
    assert type(out["evicted_for"]) is list
