"""Expected reuse: how often a serve is asked for, and what keeping it asleep is worth.

A sleeper keeps its weights in host RAM so that its next request wakes it in seconds
instead of a cold start. That saving is worth having only where the next request comes:
a model asked for once an hour saves its cold start once an hour; one never asked for
again saves nothing, while its host RAM keeps a more popular model from sleeping. The
planner weighs sleepers by that worth (docs/eviction.md, "Which sleepers keep the host
RAM"):

- **reuse rate** (:func:`reuse_rate`): the serve's recent uses (each time it was
  requested or was seen going busy), each counted ``exp(-age / REUSE_TAU_S)``, per
  hour: recency and frequency in one figure; a use an hour ago counts 0.37 of one now;
- **worth asleep** (:func:`sleep_worth`): the reuse rate times the seconds a wake saves
  against a cold start (``cold_s - wake_s``): the seconds of waiting its sleep saves per
  hour. The planner divides it by the MiB it weighs (host RAM, or residual VRAM).

- **expected reload** (:func:`expected_restore_s`): what evicting a serve is expected to
  cost in seconds of waiting: its cold start (or wake) times the chance it is asked for
  again within the hour. A requester whose room would cost more than it has waited,
  while room frees by itself, waits up to that cost before it evicts (the ski-rental
  rule: never more than twice the better of the two choices).

Unknown stays unknown: a serve with no record of its uses, or whose cold start or wake
is unknown, has no worth (``None``), and is neither put before nor after another by it.

Pure: no I/O, no clock (``now`` is an argument).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

#: the decay of a use's weight: ``exp(-age / REUSE_TAU_S)`` (an hour)
REUSE_TAU_S = 3600.0
#: the uses remembered per serve (the oldest forgotten first); 64 uses within an hour
#: are a rate of 40 an hour and more: enough to rank sleepers by
MAX_USES = 64


def reuse_rate(uses: Sequence[float], now: float, tau_s: float = REUSE_TAU_S) -> float:
    """Uses per hour, each weighted by its age (a use in the future counts as now)."""
    return 3600.0 / tau_s * math.fsum(math.exp(-max(0.0, now - t) / tau_s) for t in uses)


def sleep_worth(rate_per_h: float, cold_s: float | None, wake_s: float | None) -> float | None:
    """Seconds of waiting saved per hour by keeping a serve asleep rather than stopped;
    ``None`` when a cost is unknown."""
    if cold_s is None or wake_s is None:
        return None
    return rate_per_h * max(0.0, cold_s - wake_s)


def expected_restore_s(rate_per_h: float, reload_s: float, horizon_s: float = REUSE_TAU_S) -> float:
    """The seconds of reload a victim is expected to cost: its ``reload_s`` times the
    chance it is asked for again within ``horizon_s`` (uses arriving at ``rate_per_h``:
    ``1 - exp(-rate x horizon)``)."""
    return reload_s * -math.expm1(-rate_per_h * horizon_s / 3600.0)


def known_uses(
    serves: Iterable[str],
    seen: Mapping[str, Sequence[float]],
    requested: Iterable[tuple[str, float]],
) -> dict[str, tuple[float, ...]]:
    """``Policy.uses`` for every serve in ``serves``: the times it was ``seen`` going busy
    and those it was requested (serve, when), oldest first, each once, the last
    :data:`MAX_USES`; a serve with neither has none (known: not used since the counting
    began)."""
    out: dict[str, set[float]] = {n: set(seen.get(n, ())) for n in serves}
    for name, at in requested:
        if name in out:
            out[name].add(at)
    return {n: tuple(sorted(times)[-MAX_USES:]) for n, times in out.items()}
