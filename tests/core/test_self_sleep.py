"""An engine that sleeps by itself (llama.cpp's ``--sleep-idle-seconds``): lint's note,
the engine's own answer read, and status showing it asleep with its whole reservation
held (statemachine/flags/self_sleep.py, statemachine/answers/status_report.py). The real engine
doing it is tests/e2e/test_real_engine_e2e.py."""

from __future__ import annotations

import pytest
from test_status_rules import EVI, RUN, UP, desired_of, row, sv

from statemachine import engines
from statemachine.domain.types import ContainerObs, ContainerState, Observed
from statemachine.engines.spec import SelfSleep
from statemachine.flags.fraction import FindingKind, Severity
from statemachine.flags.self_sleep import check_self_sleep, idle_seconds, said_asleep

LLAMA = engines.get("llamacpp").self_sleep
assert LLAMA is not None


def test_only_llamacpp_sleeps_by_itself_and_its_figures_are_its_sources() -> None:
    have = set(engines.names(lambda e: e.self_sleep is not None))
    assert have == {"llamacpp"}
    assert (LLAMA.name, LLAMA.off, LLAMA.path, LLAMA.key) == (
        "--sleep-idle-seconds",
        "-1",
        "/props",
        "is_sleeping",
    )


@pytest.mark.parametrize(
    ("argv", "seconds"),
    [
        ([], None),
        (["--sleep-idle-seconds", "-1"], None),
        (["--sleep-idle-seconds", "30"], "30"),
        (["--sleep-idle-seconds=45"], "45"),
        (["--sleep-idle-seconds", "30", "--sleep-idle-seconds", "-1"], None),  # the last wins
        (["--sleep-idle-seconds", " 7 "], "7"),
    ],
)
def test_the_idle_seconds_are_the_commands_last_word(argv: list[str], seconds: str | None) -> None:
    assert idle_seconds(LLAMA, argv) == seconds


def test_an_engine_that_sleeps_by_itself_gets_a_note_naming_its_whole_reservation() -> None:
    argv = ["-m", "m.gguf", "--sleep-idle-seconds", "30"]
    found = check_self_sleep(LLAMA, argv, serve="chat", service="svc", vram_mib=6000)
    assert found is not None
    assert (found.kind, found.severity) == (FindingKind.SELF_SLEEP, Severity.NOTE)
    assert (found.serve, found.service) == ("chat", "svc")
    assert found.message.startswith("--sleep-idle-seconds 30: the engine unloads its model")
    assert "keeps its whole reservation (6000 MiB) while it sleeps" in found.message
    assert found.facts["idle_seconds"] == "30"
    unknown = check_self_sleep(LLAMA, argv, serve="chat")
    assert unknown is not None and "keeps its whole reservation while" in unknown.message
    assert check_self_sleep(LLAMA, ["-m", "m.gguf"], serve="chat") is None


def test_a_variable_names_the_seconds_where_the_engine_reads_one() -> None:
    with_env = SelfSleep("--idle", "0", "/p", "k", "src", env="IDLE_S")
    assert idle_seconds(with_env, [], {"IDLE_S": "5"}) == "5"
    assert idle_seconds(with_env, [], {"IDLE_S": "0"}) is None
    assert idle_seconds(LLAMA, [], {"IDLE_S": "5"}) is None


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        ({"is_sleeping": True, "model_path": "m"}, True),
        ({"is_sleeping": False}, False),
        ({"is_sleeping": "true"}, None),  # not a bool: unknown, not asleep
        ({"is_sleeping": 1}, None),
        ({}, None),
        ([True], None),
        (None, None),
    ],
)
def test_the_engines_answer_is_read_as_it_says_and_nothing_else(
    answer: object, said: bool | None
) -> None:
    assert said_asleep(LLAMA, answer) is said


def test_status_shows_it_asleep_by_itself_and_the_ledger_holds_its_whole_reservation() -> None:
    chat = sv("chat", 6_000, EVI, desired=RUN)
    asleep = Observed(True, {"c-chat": UP}, self_asleep={"chat": True})
    out = row(desired_of(chat), asleep, "chat")
    assert out["self_sleep"] == "asleep"
    assert out["held_mib"] == 6_000 and out["committed"] is True
    assert "sleep" not in out  # not a sleep the controller made: no level, no residual
    awake = row(
        desired_of(chat), Observed(True, {"c-chat": UP}, self_asleep={"chat": False}), "chat"
    )
    assert awake["self_sleep"] == "awake"
    assert "self_sleep" not in row(desired_of(chat), Observed(True, {"c-chat": UP}), "chat")


def test_an_answer_for_a_container_that_holds_nothing_or_unread_docker_is_not_shown() -> None:
    chat = sv("chat", 6_000, EVI, desired=RUN)
    gone = ContainerObs(ContainerState.EXITED, exit_code=0, oom_killed=False)
    out = row(
        desired_of(chat), Observed(True, {"c-chat": gone}, self_asleep={"chat": True}), "chat"
    )
    assert "self_sleep" not in out
    blind = Observed(False, {"c-chat": UP}, self_asleep={"chat": True})
    assert "self_sleep" not in row(desired_of(chat), blind, "chat")


@pytest.mark.parametrize("value", ["0", "-2", "-30", "1.5", "soon", ""])
def test_a_value_the_engine_refuses_is_a_lint_error(value: str) -> None:
    found = check_self_sleep(LLAMA, ["--sleep-idle-seconds", value], serve="chat")
    assert found is not None
    assert (found.kind, found.severity) == (FindingKind.BAD_VALUE, Severity.ERROR)
    assert found.message == (
        f"--sleep-idle-seconds {value}: the engine refuses it (a whole number of seconds, "
        "neither 0 nor below -1; -1 turns it off) and does not start"
    )
    assert found.facts["value"] == value


def test_one_second_is_accepted() -> None:
    found = check_self_sleep(LLAMA, ["--sleep-idle-seconds", "1"], serve="chat")
    assert found is not None and found.kind is FindingKind.SELF_SLEEP
