"""The hint a start that failed for memory carries (statemachine/start_hints.py); the
real engine killed for memory is tests/test_real_engine_faults.py."""

from __future__ import annotations

import pytest

from statemachine.start_hints import OUT_OF_MEMORY, memory_hint

HINT_TAIL = (
    "`vramctl render chat` shows what its model's files need, and `vramctl calibrate` "
    "proposes a vram_mib from what its runs measured"
)


def test_a_container_killed_for_memory_gets_the_hint_with_its_reservation() -> None:
    got = memory_hint("chat", 6000, oom_killed=True, logs="loading model")
    assert got == (
        "chat: it was killed for memory while loading: its reservation (6000 MiB) may be "
        f"below what it needs; {HINT_TAIL}"
    )
    assert memory_hint("chat", None, oom_killed=True, logs=None) == (
        "chat: it was killed for memory while loading: what it was given may be below what "
        f"it needs; {HINT_TAIL}"
    )


@pytest.mark.parametrize(("phrase", "engine"), OUT_OF_MEMORY)
def test_an_engines_own_out_of_memory_words_get_the_hint_naming_it(
    phrase: str, engine: str
) -> None:
    logs = f"load: something\nERROR: {phrase.upper()} at load\nexiting"
    got = memory_hint("chat", 6000, oom_killed=False, logs=logs)
    assert got is not None
    assert got.startswith(f"chat: its engine ran out of memory ({engine}) while loading")


def test_a_start_that_failed_for_another_reason_gets_no_hint() -> None:
    logs = 'Error while handling argument "--cache-type-k": Unsupported cache type: q3_k'
    assert memory_hint("chat", 6000, oom_killed=False, logs=logs) is None
    assert memory_hint("chat", 6000, oom_killed=False, logs=None) is None
    assert memory_hint("chat", 6000, oom_killed=False, logs="") is None
