"""The failure backoff's arithmetic (statemachine/lifecycle/backoff.py), pure: the holds an
operator reads in docs/operations.md ("backoff 5 s → 300 s"), the words the plan's
``blocked`` shows, and when the loop is woken. The loop's use of it is
tests/shell/test_loop_backoff.py."""

from __future__ import annotations

from pathlib import Path

from statemachine.lifecycle.backoff import (
    DEFAULT_BASE_S,
    DEFAULT_CAP_S,
    Backoff,
    crash_loop_over,
    delay_s,
    hold_reason,
    holds,
    next_end,
    record_failure,
)

DOCS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


def test_the_default_backoff_is_the_documented_5_s_doubling_to_300_s() -> None:
    assert "backoff 5 s → 300 s" in DOCS.read_text()
    held = [delay_s(n, base_s=DEFAULT_BASE_S, cap_s=DEFAULT_CAP_S) for n in range(1, 9)]
    assert held == [5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 300.0, 300.0]


def test_nothing_is_waived_unless_asked() -> None:
    assert delay_s(1, base_s=5.0, cap_s=300.0) == 5.0
    assert delay_s(2, base_s=5.0, cap_s=300.0) == 10.0
    assert delay_s(1, base_s=5.0, cap_s=300.0, waived=1) == 0.0
    assert delay_s(2, base_s=5.0, cap_s=300.0, waived=1) == 5.0


def test_a_failed_start_is_held_from_its_first_failure() -> None:
    b = Backoff()
    assert record_failure(b, "not healthy", 100.0, base_s=5.0, cap_s=300.0) == 5.0
    assert (b.failures, b.waived, b.until, b.last_failure) == (1, 0, 105.0, "not healthy")


def test_a_death_after_a_healthy_run_inside_a_crash_loop_is_not_waived() -> None:
    """Only a crash loop that begins with a death after a healthy run restarts at once: a
    death after a healthy run once failures are counted keeps doubling the hold."""
    b = Backoff()
    assert record_failure(b, "not healthy", 100.0, base_s=5.0, cap_s=300.0) == 5.0
    got = record_failure(b, "exit 1", 200.0, base_s=5.0, cap_s=300.0, after_healthy_run=True)
    assert got == 10.0
    assert (b.failures, b.waived, b.until) == (2, 0, 210.0)


def test_a_serve_never_failed_holds_nothing_at_any_time() -> None:
    fresh = {"llm": Backoff()}
    for now in (0.0, 0.5, 1_700_000_000.0):
        assert holds(fresh, now) == {}
        assert next_end(fresh, now) is None


def test_the_crash_loop_ends_only_past_the_cap() -> None:
    assert not crash_loop_over(None, 1000.0, cap_s=300.0)
    assert not crash_loop_over(100.0, 400.0, cap_s=300.0)
    assert crash_loop_over(100.0, 400.5, cap_s=300.0)


def test_the_hold_reason_says_the_count_the_failure_and_the_seconds_left() -> None:
    b = Backoff(failures=2, until=130.0, last_failure="exit 1")
    assert hold_reason(b, 100.0) == "backing off after 2 failure(s) (exit 1); next try in 30s"


def test_a_hold_that_ends_now_holds_nothing() -> None:
    b = {"a": Backoff(failures=1, until=105.0, last_failure="x")}
    assert holds(b, 105.0) == {}
    assert next_end(b, 105.0) is None
    assert holds(b, 104.0) == {"a": hold_reason(b["a"], 104.0)}
    assert next_end(b, 104.0) == 105.0


def test_the_loop_is_woken_when_the_first_hold_ends() -> None:
    b = {
        "a": Backoff(failures=3, until=140.0, last_failure="x"),
        "b": Backoff(failures=1, until=110.0, last_failure="y"),
        "c": Backoff(failures=1, until=90.0, last_failure="z"),
    }
    assert next_end(b, 100.0) == 110.0
    assert set(holds(b, 100.0)) == {"a", "b"}
