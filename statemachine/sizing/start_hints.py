"""What a failed start says about its budget: a hint from how the engine died and its own
last words (docs/operations.md, "A start that fails for memory").

:func:`memory_hint` reads the serve's engine's out-of-memory words (its registry entry's
``out_of_memory``; every known engine's where the serve names none), whether the
container was OOM-killed, and its exit code:

* the engine says an allocation on the device failed: its reservation may be below what
  it needs; ``render`` says what its model's files need, ``calibrate`` what its runs
  measured;
* the kernel killed it for memory (Docker's OOMKilled, or exit 137, SIGKILL, where
  Docker did not say): that is host memory (the container's memory limit or the host's
  RAM), not the card: what the engine keeps in host memory is more than it may have.

Pure: no I/O; it never decides, it only explains.
"""

from __future__ import annotations

from statemachine import engines
from statemachine.engines.spec import Engine

__all__ = ["memory_hint", "out_of_memory_words"]

#: a process killed by SIGKILL (128 + 9): the kernel's out-of-memory killer, or by hand
SIGKILLED = 137


def out_of_memory_words(engine: Engine | None) -> tuple[tuple[str, str], ...]:
    """The words ``engine`` prints when a device allocation fails; every known engine's
    where it is unknown."""
    if engine is not None:
        return engine.out_of_memory
    return tuple(w for e in engines.engines() for w in e.out_of_memory)


def memory_hint(
    serve: str,
    vram_mib: int | None,
    *,
    engine: Engine | None,
    oom_killed: bool,
    exit_code: int | None,
    logs: str | None,
) -> str | None:
    """The hint for a start that failed for memory, or None where nothing says so."""
    text = (logs or "").lower()
    said = next((f for phrase, f in out_of_memory_words(engine) if phrase in text), None)
    if said is not None:
        given = f"its reservation ({vram_mib} MiB)" if vram_mib is not None else "its reservation"
        return (
            f"{serve}: its engine ran out of device memory while loading ({said}): {given} "
            f"may be below what it needs; `vramctl render {serve}` shows what its model's "
            "files need, and `vramctl calibrate` proposes a vram_mib from what its runs measured"
        )
    if not oom_killed and exit_code != SIGKILLED:
        return None
    how = "for memory" if oom_killed else "(exit 137: SIGKILL, as the kernel kills for memory)"
    return (
        f"{serve}: it was killed {how} while loading: host memory, not the card's (its "
        "container's memory limit, or the host's RAM), is below what the engine keeps in "
        f"it; raise the limit, or keep less of the model in host memory (`vramctl render "
        f"{serve}` shows what its files need)"
    )
