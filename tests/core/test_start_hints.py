"""The hint a start that failed for memory carries (statemachine/sizing/start_hints.py); the
real engine killed for memory is tests/e2e/test_real_engine_faults.py."""

from __future__ import annotations

import pytest

from statemachine import engines
from statemachine.sizing.start_hints import SIGKILLED, memory_hint, out_of_memory_words

LLAMA, VLLM, SGLANG = (engines.get(n) for n in ("llamacpp", "vllm", "sglang"))


def test_the_kernels_kill_is_named_host_memory_not_the_card() -> None:
    got = memory_hint("chat", 6000, engine=LLAMA, oom_killed=True, exit_code=137, logs="load")
    assert got == (
        "chat: it was killed for memory while loading: host memory, not the card's (its "
        "container's memory limit, or the host's RAM), is below what the engine keeps in "
        "it; raise the limit, or keep less of the model in host memory (`vramctl render "
        "chat` shows what its files need)"
    )
    unsaid = memory_hint("chat", 6000, engine=None, oom_killed=False, exit_code=137, logs="")
    assert unsaid is not None and SIGKILLED == 137  # 128 + SIGKILL's 9
    assert unsaid.startswith("chat: it was killed (exit 137: SIGKILL, as the kernel kills")
    for code in (136, 138, 1, None):  # another end, and Docker's flag unset: nothing said
        assert (
            memory_hint("chat", 6000, engine=None, oom_killed=False, exit_code=code, logs="")
            is None
        )
    # Docker's flag alone says it, whatever the code it reports
    flagged = memory_hint("chat", 6000, engine=None, oom_killed=True, exit_code=None, logs="")
    assert flagged is not None and flagged.startswith("chat: it was killed for memory while")


@pytest.mark.parametrize("engine", [LLAMA, VLLM, SGLANG], ids=lambda e: e.name)
def test_an_engines_own_out_of_memory_words_name_its_reservation_and_calibrate(
    engine: engines.Engine,
) -> None:
    for phrase, source in engine.out_of_memory:
        logs = f"load: something\nERROR: {phrase.upper()} at load\nexiting"
        got = memory_hint("chat", 6000, engine=engine, oom_killed=True, exit_code=1, logs=logs)
        assert got == (
            f"chat: its engine ran out of device memory while loading ({source}): its "
            "reservation (6000 MiB) may be below what it needs; `vramctl render chat` shows "
            "what its model's files need, and `vramctl calibrate` proposes a vram_mib from "
            "what its runs measured"
        )
    unknown = memory_hint(
        "chat", None, engine=engine, oom_killed=False, exit_code=1, logs=engine.out_of_memory[0][0]
    )
    assert unknown is not None and "): its reservation may be below" in unknown


def test_only_the_serves_own_engines_words_count_and_every_engines_where_unknown() -> None:
    vllm_words = "torch: No available memory for the cache blocks"
    assert (
        memory_hint("chat", 6000, engine=LLAMA, oom_killed=False, exit_code=1, logs=vllm_words)
        is None
    )
    got = memory_hint("chat", 6000, engine=None, oom_killed=False, exit_code=1, logs=vllm_words)
    assert got is not None and "vllm/v1/core/kv_cache_utils.py" in got
    every = set(out_of_memory_words(None))
    assert every == {w for e in engines.engines() for w in e.out_of_memory}
    assert every >= {*LLAMA.out_of_memory, *VLLM.out_of_memory, *SGLANG.out_of_memory}


def test_a_start_that_failed_for_another_reason_gets_no_hint() -> None:
    logs = 'Error while handling argument "--cache-type-k": Unsupported cache type: q3_k'
    assert memory_hint("chat", 6000, engine=LLAMA, oom_killed=False, exit_code=1, logs=logs) is None
    assert (
        memory_hint("chat", 6000, engine=LLAMA, oom_killed=False, exit_code=None, logs=None) is None
    )
    assert memory_hint("chat", 6000, engine=None, oom_killed=False, exit_code=0, logs="") is None
