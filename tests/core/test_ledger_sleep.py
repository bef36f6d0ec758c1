"""The ledger with sleepers: residuals on the GPU roles, host RAM as a second budget.

Rules: a sleep brings a reservation down to its residual and takes the level-1 host RAM
(refused, with every term, when the host budget cannot take it); a wake admits the full
reservation again first, then gives the host RAM back; a stop of a sleeper frees both.
Built from an observation, an asleep serve counts its residual (never less than it was
put to sleep with) and its host RAM. A property test drives random admit / sleep / wake /
resize / release sequences against a naive model: neither GPU roles nor host RAM are
ever committed above their budgets, and the ledger grants exactly what the model does.
"""

from __future__ import annotations

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    rule,
)

from statemachine.domain import types as sm
from statemachine.engines import SleepProtocol
from statemachine.ledger.reservations import (
    GpuReservation,
    Ledger,
    Refusal,
    RefusalKind,
    ledger_from_observed,
)

A = sm.GpuRole("a", 10_000, 1_000)  # budget 9000
B = sm.GpuRole("b", 10_000, 0)
ROLES = {"a": A, "b": B}
HOST = sm.HostBudget(32_000, 2_000)  # budget 30000

RUNNING = sm.ContainerObs(sm.ContainerState.RUNNING)
EXITED = sm.ContainerObs(sm.ContainerState.EXITED, exit_code=0)


def ok(result: Ledger | Refusal) -> Ledger:
    assert isinstance(result, Ledger), result
    return result


def two_serves() -> Ledger:
    ledger = Ledger(ROLES, host=HOST)
    ledger = ok(ledger.admit(GpuReservation("coder", ("a", "b"), 6000)))
    return ok(ledger.admit(GpuReservation("ocr", ("a",), 2000)))


# -- the operations ---------------------------------------------------------------------


def test_sleep_comes_down_to_the_residual_on_every_role_and_takes_host_ram() -> None:
    ledger = ok(two_serves().sleep("coder", 1000, 20_000))
    assert ledger.committed_mib("a") == 3000 and ledger.committed_mib("b") == 1000
    assert ledger.holdings["coder"].mib == 1000
    assert ledger.host_holdings == {"coder": 20_000}
    assert ledger.host_committed_mib() == 20_000 and ledger.host_free_mib() == 10_000
    view = ledger.host_view()
    assert view is not None and view.to_json()["reservations"] == [
        {"serve": "coder", "mib": 20_000}
    ]


def test_a_sleep_that_would_overcommit_host_ram_is_refused_with_every_term() -> None:
    ledger = ok(two_serves().sleep("coder", 1000, 20_000))
    before = (ledger.committed_mib("a"), dict(ledger.host_holdings))
    refusal = ledger.sleep("ocr", 500, 10_001)
    assert isinstance(refusal, Refusal) and refusal.kind is RefusalKind.OVER_BUDGET
    assert refusal.host is not None
    host = refusal.host.to_json()
    assert host == {
        "ram_mib": 32_000,
        "reserve_mib": 2_000,
        "budget_mib": 30_000,
        "committed_mib": 20_000,
        "free_mib": 10_000,
        "requested_mib": 10_001,
        "shortfall_mib": 1,
        "reservations": [{"serve": "coder", "mib": 20_000}],
    }
    for words in ("10001 MiB of host RAM", "free 10000", "budget 30000", "coder 20000", "by 1"):
        assert words in refusal.message, refusal.message
    assert refusal.to_json()["host"] == host
    # the GPU terms are kept too, residuals included
    (a,) = refusal.terms
    assert a.reservations == (("coder", 1000), ("ocr", 2000))
    assert (a.requested_mib, a.shortfall_mib) == (0, 0)  # a sleep asks nothing of the GPU
    assert (ledger.committed_mib("a"), dict(ledger.host_holdings)) == before
    # exactly what is free is granted
    assert ok(ledger.sleep("ocr", 500, 10_000)).host_free_mib() == 0


def test_level_2_and_no_host_budget_never_refuse_for_host_ram() -> None:
    ledger = ok(two_serves().sleep("coder", 1000, 0))
    assert ledger.host_holdings == {}
    free = Ledger(ROLES)
    free = ok(free.admit(GpuReservation("coder", ("a",), 6000)))
    slept = ok(free.sleep("coder", 1000, 10**9))
    assert slept.host_free_mib() is None and slept.host_view() is None
    assert slept.host_holdings == {"coder": 10**9}  # recorded all the same
    assert slept.host_terms(1) is None


def test_a_sleep_never_grows_and_needs_a_holder_and_a_known_state() -> None:
    ledger = two_serves()
    grow = ledger.sleep("ocr", 2001, 0)
    assert isinstance(grow, Refusal) and grow.kind is RefusalKind.INVALID
    assert "cannot grow" in grow.message
    same = ok(ledger.sleep("ocr", 2000, 0))  # a residual equal to what it holds: nothing moves
    assert same.committed_mib("a") == ledger.committed_mib("a")
    missing = ledger.sleep("nobody", 1, 0)
    assert isinstance(missing, Refusal) and missing.kind is RefusalKind.NOT_HELD
    for bad in (0, -1):
        r = ledger.sleep("ocr", bad, 0)
        assert isinstance(r, Refusal) and r.kind is RefusalKind.INVALID
    neg_host = ledger.sleep("ocr", 100, -1)
    assert isinstance(neg_host, Refusal) and neg_host.kind is RefusalKind.INVALID
    # host RAM is whole MiB: a bool (an int to Python) or a float is refused, not counted
    for not_mib in (True, 1.5):
        r = ledger.sleep("ocr", 100, not_mib)  # type: ignore[arg-type]
        assert isinstance(r, Refusal) and r.kind is RefusalKind.INVALID, not_mib
        assert repr(not_mib) in r.message
    twice = ok(ledger.sleep("ocr", 100, 5))
    again = twice.sleep("ocr", 50, 5)
    assert isinstance(again, Refusal) and again.kind is RefusalKind.ALREADY_HELD
    unknown = Ledger(ROLES, [GpuReservation("ocr", ("a",), 2000)], unknown=True, host=HOST)
    r = unknown.sleep("ocr", 100, 0)
    assert isinstance(r, Refusal) and r.kind is RefusalKind.UNKNOWN_STATE
    view = unknown.host_view()
    assert view is not None and view.committed_mib is None and view.free_mib is None


def test_wake_admits_the_full_reservation_first_then_gives_host_ram_back() -> None:
    slept = ok(two_serves().sleep("coder", 1000, 20_000))
    # something took the room while it slept: the wake is refused with the arithmetic
    crowded = ok(slept.admit(GpuReservation("llm", ("b",), 8000)))
    refusal = crowded.wake("coder", 6000)
    assert isinstance(refusal, Refusal) and refusal.kind is RefusalKind.OVER_BUDGET
    (b,) = [t for t in refusal.terms if t.shortfall_mib]
    assert (b.gpu_role, b.requested_mib, b.free_mib, b.shortfall_mib) == ("b", 5000, 1000, 4000)
    assert b.reservations == (("coder", 1000), ("llm", 8000))
    assert crowded.host_holdings == {"coder": 20_000}  # still asleep, still holding it
    woken = ok(slept.wake("coder", 6000))
    assert woken.committed_mib("a") == 8000 and woken.committed_mib("b") == 6000
    assert woken.host_holdings == {} and woken.host_free_mib() == 30_000
    # waking an awake holder is just a resize
    assert ok(two_serves().wake("ocr", 2500)).holdings["ocr"].mib == 2500


def test_stopping_a_sleeper_frees_its_residual_and_its_host_ram() -> None:
    slept = ok(two_serves().sleep("coder", 1000, 20_000))
    stopped = ok(slept.release("coder"))
    assert stopped.committed_mib("a") == 2000 and stopped.committed_mib("b") == 0
    assert stopped.host_holdings == {}
    # an awake holder's release leaves the sleepers' host RAM alone
    assert ok(slept.release("ocr")).host_holdings == {"coder": 20_000}


def test_host_holdings_must_be_mib() -> None:
    for bad in (-1, True, 1.5):
        try:
            Ledger(ROLES, host=HOST, host_holdings={"x": bad})  # type: ignore[dict-item]
        except ValueError as exc:
            assert "host reservation" in str(exc)
        else:
            raise AssertionError(f"{bad!r} accepted")
    assert Ledger(ROLES, host=HOST, host_holdings={"x": 0}).host_holdings == {}
    over = Ledger(ROLES, host=HOST, host_holdings={"x": 30_001})
    assert over.host_overcommitted() and not Ledger(ROLES, host=HOST).host_overcommitted()
    assert not Ledger(ROLES, host_holdings={"x": 10**9}).host_overcommitted()


# -- built from an observation ----------------------------------------------------------


def coder(
    sleep: sm.Sleep | None = sm.Sleep(1, 1000, SleepProtocol.VLLM, 20_000),
) -> sm.ServeSpec:
    return sm.ServeSpec(
        "coder",
        "c-coder",
        ("a", "b"),
        6000,
        sm.Residency.EVICTABLE,
        sm.DesiredRun.RUNNING,
        sleep=sleep,
    )


def observed_ledger(
    spec: sm.ServeSpec, obs: sm.SleepObs | None, container: sm.ContainerObs = RUNNING, **kw: object
) -> Ledger:
    desired = sm.DesiredState(ROLES, {spec.name: spec}, host=HOST)
    sleep = {} if obs is None else {spec.name: obs}
    return ledger_from_observed(
        desired,
        sm.Observed(True, {spec.container: container}, sleep=sleep, **kw),  # type: ignore[arg-type]
    )


def test_an_asleep_serve_counts_its_residual_and_host_ram() -> None:
    ledger = observed_ledger(coder(), sm.SleepObs(sm.SleepState.ASLEEP, level=1))
    assert ledger.holdings["coder"] == GpuReservation("coder", ("a", "b"), 1000)
    assert ledger.host_holdings == {"coder": 20_000}
    assert ledger.host == HOST
    level2 = observed_ledger(coder(), sm.SleepObs(sm.SleepState.ASLEEP, level=2))
    assert level2.holdings["coder"].mib == 1000 and level2.host_holdings == {}


def test_what_it_was_put_to_sleep_with_is_never_undercounted() -> None:
    obs = sm.SleepObs(sm.SleepState.ASLEEP, level=1, residual_mib=1500, host_ram_mib=25_000)
    ledger = observed_ledger(coder(), obs)
    assert ledger.holdings["coder"].mib == 1500 and ledger.host_holdings == {"coder": 25_000}
    smaller = sm.SleepObs(sm.SleepState.ASLEEP, level=1, residual_mib=500, host_ram_mib=5)
    ledger = observed_ledger(coder(), smaller)
    assert ledger.holdings["coder"].mib == 1000 and ledger.host_holdings == {"coder": 20_000}


def test_awake_unknown_and_exited_count_as_before() -> None:
    for obs in (None, sm.SleepObs(sm.SleepState.AWAKE)):
        ledger = observed_ledger(coder(), obs)
        assert ledger.holdings["coder"].mib == 6000 and ledger.host_holdings == {}
    # unknown: full on the roles; host RAM only when it is known to have been put to sleep
    unknown = observed_ledger(coder(), sm.SleepObs(sm.SleepState.UNKNOWN))
    assert unknown.holdings["coder"].mib == 6000 and unknown.host_holdings == {}
    recorded = observed_ledger(coder(), sm.SleepObs(sm.SleepState.UNKNOWN, level=1, host_ram_mib=1))
    assert recorded.holdings["coder"].mib == 6000 and recorded.host_holdings == {"coder": 20_000}
    # a container that exited holds nothing, whatever the sleep state says
    gone = observed_ledger(coder(), sm.SleepObs(sm.SleepState.ASLEEP, level=1), EXITED)
    assert "coder" not in gone.holdings and gone.host_holdings == {}


def test_a_sleeper_the_manifest_no_longer_lets_sleep_counts_full_and_its_host_ram() -> None:
    obs = sm.SleepObs(sm.SleepState.ASLEEP, level=1, residual_mib=1000, host_ram_mib=20_000)
    ledger = observed_ledger(coder(sleep=None), obs)
    assert ledger.holdings["coder"].mib == 6000
    assert ledger.host_holdings == {"coder": 20_000}


def test_an_asleep_serve_started_bigger_counts_its_residual_on_every_role_it_was_on() -> None:
    record = {"c-coder": sm.StartedWith("coder", ("a",), 9000)}
    ledger = observed_ledger(
        coder(), sm.SleepObs(sm.SleepState.ASLEEP, level=1), started_with=record
    )
    assert ledger.holdings["coder"] == GpuReservation("coder", ("a", "b"), 1000)


def test_unknown_docker_keeps_the_host_budget_and_knows_nothing() -> None:
    desired = sm.DesiredState(ROLES, {"coder": coder()}, host=HOST)
    ledger = ledger_from_observed(desired, sm.Observed(False))
    view = ledger.host_view()
    assert ledger.unknown and view is not None and view.committed_mib is None


# -- the property -----------------------------------------------------------------------

ROLE_SETS = [("a",), ("b",), ("a", "b")]


class SleepLedgerMachine(RuleBasedStateMachine):
    """admit / sleep / wake / resize / release at random, checked against a naive model."""

    awake = Bundle("awake")
    asleep = Bundle("asleep")

    def __init__(self) -> None:
        super().__init__()
        self.ledger = Ledger({})
        self.roles: dict[str, sm.GpuRole] = {}
        self.host_budget = 0
        # holder -> (roles, MiB on each role, host MiB)
        self.model: dict[str, tuple[tuple[str, ...], int, int]] = {}
        self.full: dict[str, int] = {}
        self.n = 0

    @initialize(
        caps=st.tuples(st.integers(1, 6000), st.integers(1, 6000)),
        host=st.tuples(st.integers(1, 8000), st.integers(0, 8000)),
    )
    def setup(self, caps: tuple[int, int], host: tuple[int, int]) -> None:
        self.roles = {"a": sm.GpuRole("a", caps[0], 0), "b": sm.GpuRole("b", caps[1], 0)}
        budget = sm.HostBudget(host[0], min(host[1], host[0]))
        self.host_budget = budget.budget_mib
        self.ledger = Ledger(self.roles, host=budget)

    def committed(self, role: str) -> int:
        return sum(m for rs, m, _ in self.model.values() if role in rs)

    def host_committed(self) -> int:
        return sum(h for _, _, h in self.model.values())

    @rule(target=awake, roles=st.sampled_from(ROLE_SETS), mib=st.integers(1, 4000))
    def admit(self, roles: tuple[str, ...], mib: int) -> str:
        self.n += 1
        name = f"s{self.n}"
        fits = all(self.committed(r) + mib <= self.roles[r].budget_mib for r in roles)
        out = self.ledger.admit(GpuReservation(name, roles, mib))
        assert isinstance(out, Ledger) == fits
        event("admit: granted" if fits else "admit: refused")
        if isinstance(out, Ledger):
            self.ledger = out
            self.model[name] = (roles, mib, 0)
            self.full[name] = mib
        return name

    @rule(target=asleep, name=consumes(awake), frac=st.floats(0.01, 1.0), host=st.integers(0, 5000))
    def sleep(self, name: str, frac: float, host: int) -> str:
        if name not in self.model:
            return name  # its admit was refused
        roles, mib, _ = self.model[name]
        residual = max(1, int(mib * frac))
        fits = self.host_committed() + host <= self.host_budget
        out = self.ledger.sleep(name, residual, host)
        assert isinstance(out, Ledger) == fits, out
        event("sleep: granted" if fits else "sleep: refused for host RAM")
        if isinstance(out, Ledger):
            self.ledger = out
            self.model[name] = (roles, residual, host)
        else:
            assert out.host is not None and out.host.shortfall_mib == (
                self.host_committed() + host - self.host_budget
            )
            # a refused sleep is a stop in the planner: model that
            self.ledger = ok(self.ledger.release(name))
            del self.model[name]
        return name

    @rule(target=awake, name=consumes(asleep))
    def wake(self, name: str) -> str:
        if name not in self.model:
            return name
        roles, mib, host = self.model[name]
        full = self.full[name]
        fits = all(self.committed(r) - mib + full <= self.roles[r].budget_mib for r in roles)
        out = self.ledger.wake(name, full)
        assert isinstance(out, Ledger) == fits
        event("wake: granted" if fits else "wake: refused, no room")
        if isinstance(out, Ledger):
            self.ledger = out
            self.model[name] = (roles, full, 0)
        else:
            assert self.ledger.host_holdings.get(name, 0) == host  # untouched
            self.ledger = ok(self.ledger.release(name))  # a failed wake: stop, cold start
            del self.model[name]
        return name

    @rule(name=consumes(asleep))
    def stop_sleeper(self, name: str) -> None:
        if name in self.model:
            self.ledger = ok(self.ledger.release(name))
            del self.model[name]

    @rule(name=consumes(awake))
    def stop(self, name: str) -> None:
        if name in self.model:
            self.ledger = ok(self.ledger.release(name))
            del self.model[name]

    @invariant()
    def never_overcommitted_and_equal_to_the_model(self) -> None:
        if not self.roles:
            return
        for r, role in self.roles.items():
            assert self.ledger.committed_mib(r) == self.committed(r)
            assert self.ledger.committed_mib(r) <= role.budget_mib
        assert self.ledger.host_committed_mib() == self.host_committed()
        assert self.ledger.host_committed_mib() <= self.host_budget
        assert not self.ledger.overcommitted() and not self.ledger.host_overcommitted()
        assert set(self.ledger.holdings) == set(self.model)


TestSleepLedger = SleepLedgerMachine.TestCase
TestSleepLedger.settings = settings(
    max_examples=150, stateful_step_count=30, suppress_health_check=[HealthCheck.too_slow]
)


def test_records_alone_count_nothing_for_an_awake_serve_or_an_unknown_host_figure() -> None:
    # awake, with a stale record of a past sleep: awake and full, no host RAM
    stale = sm.SleepObs(sm.SleepState.AWAKE, level=1, residual_mib=1000, host_ram_mib=20_000)
    ledger = observed_ledger(coder(), stale)
    assert ledger.holdings["coder"].mib == 6000 and ledger.host_holdings == {}
    # asleep at level 1 under a manifest that no longer declares sleep, no host record:
    # full on the roles, and no host figure to count
    ledger = observed_ledger(coder(sleep=None), sm.SleepObs(sm.SleepState.ASLEEP, level=1))
    assert ledger.holdings["coder"].mib == 6000 and ledger.host_holdings == {}
    # a level-2 record keeps no host RAM, whatever the record says
    level2 = sm.SleepObs(sm.SleepState.ASLEEP, level=2, host_ram_mib=7)
    assert observed_ledger(coder(), level2).host_holdings == {}
