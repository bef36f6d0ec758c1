"""An engine that sleeps by itself (llama.cpp's ``--sleep-idle-seconds``; docs/limits.md,
"An engine that sleeps by itself").

Such an engine unloads its model and KV cache after some idle seconds and reloads them
on the next request, without asking anyone: outside the ledger. vramctl does not count
the memory it gives back while asleep as free, since any request may wake it at any
moment; it keeps the serve's whole reservation, shows the engine asleep by itself
(``status``), and ``lint`` says so in a note (:func:`check_self_sleep`).
:func:`said_asleep` reads the engine's own answer (its ``/props`` JSON).

Pure: no I/O; the reading of the engine's route is controller/adapters/self_sleep.py.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from statemachine.engines.spec import SelfSleep
from statemachine.flags.fraction import Finding, FindingKind
from statemachine.flags.model_limits import found_value

__all__ = ["check_self_sleep", "idle_seconds", "said_asleep"]


def idle_seconds(
    config: SelfSleep, argv: Sequence[str], env: Mapping[str, str] | None = None
) -> str | None:
    """The idle seconds after which the command's engine sleeps by itself, as written,
    or None where it does not (the flag absent, or its ``off`` value)."""
    value = found_value(argv, config, env)
    if value is None or value.strip() == config.off:
        return None
    return value.strip()


def check_self_sleep(
    config: SelfSleep,
    argv: Sequence[str],
    env: Mapping[str, str] | None = None,
    *,
    serve: str,
    service: str | None = None,
    vram_mib: int | None = None,
) -> Finding | None:
    """The note on a command whose engine sleeps by itself: what vramctl does about it."""
    seconds = idle_seconds(config, argv, env)
    if seconds is None:
        return None
    if not _accepted(seconds):
        message = (
            f"{config.name} {seconds}: the engine refuses it (a whole number of seconds, "
            f"neither 0 nor below -1; {config.off} turns it off) and does not start"
        )
        facts: dict[str, Any] = {"flag": config.name, "value": seconds, "source": config.source}
        return Finding(FindingKind.BAD_VALUE, message, serve, service, facts)
    kept = f"its whole reservation ({vram_mib} MiB)" if vram_mib else "its whole reservation"
    message = (
        f"{config.name} {seconds}: the engine unloads its model after {seconds} s without a "
        "request and reloads it on the next one, by itself and outside the ledger; "
        f"vramctl keeps {kept} while it sleeps, since any request may wake it, and "
        "`status` shows it asleep by itself. To give its memory to other serves while it "
        "is idle, leave the flag out and declare it evictable, or on-demand with idle_ttl_s"
    )
    said = {"flag": config.name, "idle_seconds": seconds, "source": config.source}
    return Finding(FindingKind.SELF_SLEEP, message, serve, service, said)


def _accepted(seconds: str) -> bool:
    """What llama.cpp's parser takes (common/arg.cpp): an integer, not 0, not below -1."""
    try:
        value = int(seconds)
    except ValueError:
        return False
    return value > 0


def said_asleep(config: SelfSleep, answer: object) -> bool | None:
    """What the engine's answer at ``config.path`` says: asleep, awake, or None where
    the answer is not a JSON object whose ``config.key`` is a bool."""
    if not isinstance(answer, Mapping):
        return None
    value = answer.get(config.key)
    return value if isinstance(value, bool) else None
