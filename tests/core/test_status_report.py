"""The status report (``statemachine.answers.status_report``): every figure ``vramctl status``
prints.

Written from docs/operations.md (the status tables) and docs/limits.md (figures that
are never guessed): a role's NVML figures come from the device its ``uuid`` links it
to, its drift is NVML used minus committed and device total minus declared capacity,
and each is ``None`` (printed ``unknown``) when an input is missing; a serve's drift is
NVML used minus its declared ``vram_mib`` (its residual while asleep); a container
that exited cleanly or was stopped is ``stopped``, one that crashed ``failed``; an
evictable serve kept down names the requested serves holding its room. Pure: builds
desired states and observations, no Docker, no NVML.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from support.core import spec

from statemachine.answers.status_report import host_status, lifecycle_from_observation
from statemachine.domain import types as sm
from statemachine.engines import SleepProtocol

NOW = 10_000.0
RUN, STOP = sm.DesiredRun.RUNNING, sm.DesiredRun.STOPPED
RES, EVI, OND = sm.Residency.RESIDENT, sm.Residency.EVICTABLE, sm.Residency.ON_DEMAND
ROLE = sm.GpuRole("a", 32_000, 2_000, uuid="GPU-a")  # budget 30000
UP = sm.ContainerObs(sm.ContainerState.RUNNING, health="healthy", started_at=0.0)
DEVICE = sm.GpuObs("GPU-a", index=0, total_mib=32_607, used_mib=12_500)
OTHER_DEVICE = sm.GpuObs("GPU-b", index=1, total_mib=8_192, used_mib=100)


def sv(name: str, mib: int | None, residency: sm.Residency | None, **kw: Any) -> sm.ServeSpec:
    return spec(name, mib, residency, **kw)


def desired_of(*serves: sm.ServeSpec, role: sm.GpuRole = ROLE, **kw: Any) -> sm.DesiredState:
    return sm.DesiredState({role.id: role}, {s.name: s for s in serves}, **kw)


def report(desired: sm.DesiredState, observed: sm.Observed) -> dict[str, Any]:
    out: dict[str, Any] = host_status(desired, observed).to_json()
    return out


def serve_row(desired: sm.DesiredState, observed: sm.Observed, name: str) -> dict[str, Any]:
    rows: dict[str, dict[str, Any]] = {r["serve"]: r for r in report(desired, observed)["serves"]}
    return rows[name]


# --- the lifecycle state an observation implies ------------------------------------


@pytest.mark.parametrize("code", [None, 0, 130, 143])
def test_a_container_that_exited_cleanly_or_was_asked_to_stop_is_stopped(
    code: int | None,
) -> None:
    # 0: a clean end; 143 = 128 + SIGTERM (docker stop); 130 = 128 + SIGINT
    obs = sm.ContainerObs(sm.ContainerState.EXITED, exit_code=code, oom_killed=False)
    assert str(lifecycle_from_observation(obs)) == "stopped"


@pytest.mark.parametrize("code", [1, 2, 129, 131, 137, 139, 142, 144, 255])
def test_a_container_that_exited_with_any_other_code_failed(code: int) -> None:
    obs = sm.ContainerObs(sm.ContainerState.EXITED, exit_code=code, oom_killed=False)
    assert str(lifecycle_from_observation(obs)) == "failed"


@pytest.mark.parametrize(
    ("obs", "state"),
    [
        (sm.ContainerObs(sm.ContainerState.DEAD), "failed"),
        (sm.ContainerObs(sm.ContainerState.DEAD, exit_code=0, oom_killed=False), "failed"),
        (sm.ContainerObs(sm.ContainerState.EXITED, exit_code=0, oom_killed=True), "failed"),
        (sm.ContainerObs(sm.ContainerState.EXITED, exit_code=143, oom_killed=True), "failed"),
        (sm.ContainerObs(sm.ContainerState.CREATED), "stopped"),
        (sm.ContainerObs(sm.ContainerState.ABSENT), "stopped"),
        (sm.ContainerObs(sm.ContainerState.RESTARTING, exit_code=1), "starting"),
        (sm.ContainerObs(sm.ContainerState.RUNNING, health="starting"), "starting"),
        (sm.ContainerObs(sm.ContainerState.RUNNING, health="healthy"), "running"),
    ],
)
def test_dead_or_oom_killed_is_failed_whatever_the_exit_code(
    obs: sm.ContainerObs, state: str
) -> None:
    assert str(lifecycle_from_observation(obs)) == state


# --- a role's NVML figures and drift --------------------------------------------------


def test_a_role_linked_to_its_device_shows_nvml_used_total_and_both_drifts() -> None:
    desired = desired_of(sv("stt", 10_000, RES, desired=RUN))
    observed = sm.Observed(True, {"c-stt": UP}, gpus=(OTHER_DEVICE, DEVICE))
    out = report(desired, observed)
    assert out["nvml"] == "ok"
    (role,) = out["gpu_roles"]
    assert role["uuid"] == "GPU-a" and role["device_found"] is True
    assert role["committed_mib"] == 10_000
    assert role["nvml_total_mib"] == 32_607 and role["nvml_used_mib"] == 12_500
    assert role["drift_used_mib"] == 12_500 - 10_000  # NVML used - committed
    assert role["drift_total_mib"] == 32_607 - 32_000  # device total - declared capacity
    assert role["overcommitted"] is False


@pytest.mark.parametrize(
    ("role", "gpus", "nvml"),
    [
        (sm.GpuRole("a", 32_000, 2_000), (DEVICE,), "ok"),  # no uuid declared
        (ROLE, None, "unavailable"),  # NVML unavailable
        (ROLE, (OTHER_DEVICE,), "ok"),  # no device bears the uuid
    ],
)
def test_a_role_without_its_device_shows_every_nvml_figure_unknown(
    role: sm.GpuRole, gpus: tuple[sm.GpuObs, ...] | None, nvml: str
) -> None:
    desired = desired_of(sv("stt", 10_000, RES, desired=RUN), role=role)
    out = report(desired, sm.Observed(True, {"c-stt": UP}, gpus=gpus))
    assert out["nvml"] == nvml
    (row,) = out["gpu_roles"]
    assert row["device_found"] is False
    assert row["committed_mib"] == 10_000
    for figure in ("nvml_total_mib", "nvml_used_mib", "drift_used_mib", "drift_total_mib"):
        assert row[figure] is None, figure


def test_with_docker_unreadable_the_device_figures_stay_and_the_used_drift_is_unknown() -> None:
    desired = desired_of(sv("stt", 10_000, RES, desired=RUN))
    out = report(desired, sm.Observed(False, gpus=(DEVICE,)))
    assert out["docker"] == "error"
    (row,) = out["gpu_roles"]
    assert row["device_found"] is True and row["nvml_used_mib"] == 12_500
    assert row["committed_mib"] is None
    assert row["drift_used_mib"] is None  # used - unknown committed: unknown, never 12500
    assert row["drift_total_mib"] == 607


# --- a serve's row ---------------------------------------------------------------------


def test_a_serve_shows_docker_health_where_it_has_a_healthcheck_else_the_probe() -> None:
    checked = sv("checked", 1_000, RES, desired=RUN)
    probed = sv("probed", 1_000, RES, desired=RUN)
    desired = desired_of(checked, probed)
    bare = sm.ContainerObs(sm.ContainerState.RUNNING)
    observed = sm.Observed(
        True,
        {"c-checked": UP, "c-probed": bare},
        probes={"checked": "unhealthy", "probed": "healthy"},
    )
    assert serve_row(desired, observed, "checked")["health"] == "healthy"
    assert serve_row(desired, observed, "probed")["health"] == "healthy"
    unprobed = sm.Observed(True, {"c-checked": UP, "c-probed": bare})
    assert serve_row(desired, unprobed, "probed")["health"] is None
    assert serve_row(desired, sm.Observed(False), "checked")["health"] is None


def test_a_serves_drift_is_nvml_used_minus_what_the_ledger_holds_for_it() -> None:
    """docs/operations.md: per-serve drift = used - what the ledger holds for it. An
    elastic serve the controller shrank to 8000 of its declared 16000 and that draws
    8500 is 500 over what it holds (measured against its declaration it would read
    -7500, and its serve_over_reservation alarm could never fire)."""
    coder = sv("coder", 16_000, EVI, desired=RUN, elastic=sm.Elastic("http://x", 4_000))
    desired = desired_of(coder)
    running = sm.ContainerObs(sm.ContainerState.RUNNING, health="healthy", gpu_used_mib=8_500)
    observed = sm.Observed(True, {"c-coder": running}, elastic_mib={"coder": 8_000})
    out = report(desired, observed)
    assert out["gpu_roles"][0]["committed_mib"] == 8_000
    row = {r["serve"]: r for r in out["serves"]}["coder"]
    assert (row["nvml_used_mib"], row["held_mib"], row["reservation_mib"]) == (8_500, 8_000, 16_000)
    assert row["drift_mib"] == 8_500 - 8_000


def test_a_serve_the_ledger_does_not_hold_drifts_against_its_declaration() -> None:
    """Outside the ledger (its role has no capacity row), nothing is held for it: its
    drift is measured against what it declared."""
    free = replace(sv("free", 3_000, EVI, desired=RUN), gpu_roles=("elsewhere",))
    running = sm.ContainerObs(sm.ContainerState.RUNNING, gpu_used_mib=3_200)
    row = serve_row(desired_of(free), sm.Observed(True, {"c-free": running}), "free")
    assert (row["in_ledger"], row["held_mib"], row["drift_mib"]) == (False, None, 200)


def test_a_stopped_container_has_no_nvml_used_nor_drift_whatever_its_last_reading() -> None:
    desired = desired_of(sv("stt", 10_000, RES, desired=RUN))
    stopped = sm.ContainerObs(sm.ContainerState.EXITED, exit_code=0, gpu_used_mib=900)
    row = serve_row(desired, sm.Observed(True, {"c-stt": stopped}), "stt")
    assert row["lifecycle"] == "stopped"
    assert row["nvml_used_mib"] is None and row["drift_mib"] is None


def test_an_awake_sleeper_shows_no_level_residual_nor_host_ram() -> None:
    coder = sv(
        "coder", 16_000, EVI, desired=RUN, sleep=sm.Sleep(1, 1_000, SleepProtocol.VLLM, 20_000)
    )
    desired = desired_of(coder, host=sm.HostBudget(64_000, 4_000))
    row = serve_row(desired, sm.Observed(True, {"c-coder": UP}), "coder")
    assert row["sleep"] == {
        "state": "awake",
        "level": None,
        "residual_mib": None,
        "host_ram_mib": None,
    }
    assert row["committed"] is True and row["reservation_mib"] == 16_000


def test_requests_in_flight_their_source_and_since_when_idle() -> None:
    idle, busy, blind = (sv(n, 1_000, RES, desired=RUN) for n in ("idle", "busy", "blind"))
    desired = desired_of(idle, busy, blind)
    observed = sm.Observed(
        True,
        {"c-idle": UP, "c-busy": UP, "c-blind": UP},
        in_flight={
            "idle": sm.InFlightObs(0, sm.InFlightSource.METRICS, idle_since=NOW - 60),
            "busy": sm.InFlightObs(1, sm.InFlightSource.ROUTER, idle_since=NOW - 60, busy_at=NOW),
        },
    )
    rows = {r["serve"]: r for r in report(desired, observed)["serves"]}
    assert (rows["idle"]["in_flight"], rows["idle"]["in_flight_source"]) == (0, "metrics")
    assert rows["idle"]["idle_since"] == NOW - 60
    assert (rows["busy"]["in_flight"], rows["busy"]["in_flight_source"]) == (1, "router")
    assert rows["busy"]["idle_since"] is None  # busy now: not idle since anything
    assert rows["blind"]["in_flight"] is None and rows["blind"]["in_flight_source"] is None
    assert rows["blind"]["idle_since"] is None


def test_an_unmanaged_serve_is_desired_running_by_its_request_only() -> None:
    od = sv("od", 4_000, None)
    managed = sv("stt", 4_000, RES, desired=RUN)
    desired = desired_of(od, managed, requests=(sm.OnDemandRequest("od", NOW),))
    observed = sm.Observed(True, {"c-od": UP, "c-stt": UP})
    row = serve_row(desired, observed, "od")
    assert (row["desired"], row["desired_by"]) == ("running", "request")
    assert serve_row(desired, observed, "stt")["desired_by"] == "manifest"
    alone = serve_row(desired_of(od), observed, "od")
    assert (alone["desired"], alone["desired_by"]) == (None, None)


def test_when_a_request_ends_and_what_it_counts_from() -> None:
    ttl = sv("ttl", 4_000, OND, idle_ttl_s=600.0)
    plain = sv("plain", 4_000, OND)
    timed = sv("timed", 4_000, OND)
    desired = desired_of(
        ttl,
        plain,
        timed,
        requests=(
            sm.OnDemandRequest("ttl", NOW),
            sm.OnDemandRequest("plain", NOW),
            sm.OnDemandRequest("timed", NOW, ttl_s=300.0),
        ),
    )
    rows = {r["serve"]: r for r in report(desired, sm.Observed(True))["serves"]}
    # idle_ttl_s with no source of in-flight counts: from the request
    assert (rows["ttl"]["ttl_basis"], rows["ttl"]["request_ends_at"]) == ("request", NOW + 600)
    # the request's own ttl_s, from the request, on a serve without idle_ttl_s
    assert (rows["timed"]["ttl_basis"], rows["timed"]["request_ends_at"]) == ("ttl", NOW + 300)
    # no TTL at all: the request lasts until `down`
    assert (rows["plain"]["ttl_basis"], rows["plain"]["request_ends_at"]) == ("none", None)


def test_without_a_request_the_basis_is_shown_for_an_idle_ttl_only_and_no_end() -> None:
    ttl = sv("ttl", 4_000, EVI, desired=RUN, idle_ttl_s=600.0)
    plain = sv("plain", 4_000, EVI, desired=RUN)
    desired = desired_of(ttl, plain)
    observed = sm.Observed(
        True,
        {"c-ttl": UP, "c-plain": UP},
        in_flight={"ttl": sm.InFlightObs(0, sm.InFlightSource.METRICS, idle_since=NOW - 60)},
    )
    rows = {r["serve"]: r for r in report(desired, observed)["serves"]}
    assert (rows["ttl"]["ttl_basis"], rows["ttl"]["request_ends_at"]) == ("measured", None)
    assert (rows["plain"]["ttl_basis"], rows["plain"]["request_ends_at"]) == (None, None)


# --- an evictable serve kept down for requested serves ---------------------------------


def _kept_down(coder: sm.ServeSpec, od_mib: int, **observed: Any) -> tuple[str, ...]:
    od = sv("od", od_mib, OND)
    desired = desired_of(coder, od, requests=(sm.OnDemandRequest("od", NOW),))
    containers = {"c-od": UP, **observed.pop("containers", {})}
    row = serve_row(desired, sm.Observed(True, containers, **observed), coder.name)
    return tuple(row["evicted_for"])


def test_an_evictable_serve_down_for_lack_of_room_names_the_requested_serves_holding_it() -> None:
    # budget 30000, od holds 25000: free 5000 < 16000
    assert _kept_down(sv("coder", 16_000, EVI, desired=RUN), 25_000) == ("od",)


def test_an_evictable_serve_that_fits_exactly_is_not_kept_down() -> None:
    # od holds 14000: free 16000 = its 16000, it can start now
    assert _kept_down(sv("coder", 16_000, EVI, desired=RUN), 14_000) == ()


@pytest.mark.parametrize(
    "coder",
    [
        sv("coder", 16_000, RES, desired=RUN),  # a resident is never evicted
        sv("coder", 16_000, EVI, desired=STOP),  # desired stopped: nothing keeps it down
        sv("coder", 16_000, None),  # unmanaged
    ],
)
def test_only_an_evictable_serve_desired_running_is_kept_down(coder: sm.ServeSpec) -> None:
    assert _kept_down(coder, 25_000) == ()


def test_an_evictable_serve_that_runs_is_not_kept_down() -> None:
    coder = sv("coder", 10_000, EVI, desired=RUN)
    # it holds 10000 beside od's 15000: free 5000 < 10000, yet it is up
    assert _kept_down(coder, 15_000, containers={"c-coder": UP}) == ()


def test_with_docker_unreadable_no_serve_is_said_kept_down() -> None:
    coder = sv("coder", 16_000, EVI, desired=RUN)
    od = sv("od", 25_000, OND)
    desired = desired_of(coder, od, requests=(sm.OnDemandRequest("od", NOW),))
    assert serve_row(desired, sm.Observed(False), "coder")["evicted_for"] == []


# --- the host RAM line ------------------------------------------------------------------


def _sleepers(n: int) -> tuple[sm.DesiredState, sm.Observed]:
    names = [f"s{i}" for i in range(n)]
    serves = [
        sv(name, 2_000, EVI, desired=RUN, sleep=sm.Sleep(1, 500, SleepProtocol.VLLM, 10_000))
        for name in names
    ]
    desired = desired_of(*serves, host=sm.HostBudget(24_000, 4_000))  # budget 20000
    observed = sm.Observed(
        True,
        {f"c-{n}": UP for n in names},
        sleep={n: sm.SleepObs(sm.SleepState.ASLEEP, level=1) for n in names},
    )
    return desired, observed


@pytest.mark.parametrize(("n", "committed", "over"), [(2, 20_000, False), (3, 30_000, True)])
def test_the_host_line_is_overcommitted_only_above_its_budget(
    n: int, committed: int, over: bool
) -> None:
    host = report(*_sleepers(n))["host"]
    assert host["budget_mib"] == 20_000 and host["committed_mib"] == committed
    assert host["overcommitted"] is over


def test_with_docker_unreadable_the_host_line_is_unknown_not_overcommitted() -> None:
    desired, _ = _sleepers(3)
    host = report(desired, sm.Observed(False))["host"]
    assert host["budget_mib"] == 20_000
    assert host["committed_mib"] is None and host["overcommitted"] is None


def test_a_serve_seen_asleep_shows_its_sleep_without_a_sleep_config() -> None:
    # put to sleep by hand: the engine says so, the manifest declares no [sleep]
    bare = sv("bare", 8_000, EVI, desired=RUN)
    plain = sv("plain", 8_000, EVI, desired=RUN)
    desired = desired_of(bare, plain)
    observed = sm.Observed(
        True,
        {"c-bare": UP, "c-plain": UP},
        sleep={"bare": sm.SleepObs(sm.SleepState.ASLEEP, level=2)},
    )
    rows = {r["serve"]: r for r in report(desired, observed)["serves"]}
    assert rows["bare"]["lifecycle"] == "asleep"
    assert rows["bare"]["sleep"]["state"] == "asleep" and rows["bare"]["sleep"]["level"] == 2
    assert "sleep" not in rows["plain"]


@pytest.mark.parametrize("docker_ok", [True, False])
def test_a_serve_outside_the_ledger_is_never_committed(docker_ok: bool) -> None:
    # no vram_mib: outside the ledger, committed false (not unknown) even without docker
    tool = sv("tool", None, RES, desired=RUN)
    desired = desired_of(tool)
    row = serve_row(desired, sm.Observed(docker_ok, {"c-tool": UP}), "tool")
    assert row["in_ledger"] is False and row["committed"] is False
    assert row["reservation_mib"] is None


def test_a_stopped_evictable_serve_on_a_role_without_capacity_row_makes_room_for_nobody() -> None:
    """The manifest loads it with a warning (it takes no part in the ledger): the report
    lists it with nothing it is evicted for, where it read a ledger line of a role the
    ledger does not have (KeyError)."""
    stray = replace(sv("stray", 3_000, EVI, desired=RUN), gpu_roles=("elsewhere",))
    stopped = sm.ContainerObs(sm.ContainerState.EXITED, exit_code=0)
    row = serve_row(desired_of(stray), sm.Observed(True, {"c-stray": stopped}), "stray")
    assert (row["lifecycle"], row["evicted_for"], row["held_mib"]) == ("stopped", [], None)
