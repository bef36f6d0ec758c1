"""Reads whether an engine that sleeps by itself is asleep: ``GET {url}{path}`` (llama.cpp's
``/props``, answered from a cache without waking the engine nor resetting its idle
timer: tools/server/README.md, "Sleeping on Idle"), its JSON read by
:func:`statemachine.flags.self_sleep.said_asleep`.

Straight to the serve (``trust_env=False``: no proxy answers for it), one short request
per serve, never retried: an answer that cannot be had is ``None`` (unknown). It must
not decide anything, nor call a route that would wake the engine.
"""

from __future__ import annotations

import httpx

from statemachine.engines.spec import SelfSleep
from statemachine.flags.self_sleep import said_asleep


class SelfSleepReader:
    """One HTTP client kept from call to call; :meth:`close` ends it. Thread-safe."""

    def __init__(self, *, timeout_s: float = 1.0) -> None:
        self._client = httpx.Client(trust_env=False, follow_redirects=False, timeout=timeout_s)

    def asleep(self, base_url: str, config: SelfSleep) -> bool | None:
        """True or False as the engine at ``base_url`` says, None when it cannot be read."""
        try:
            r = self._client.get(base_url.rstrip("/") + config.path)
            r.raise_for_status()
            return said_asleep(config, r.json())
        except (httpx.HTTPError, ValueError):
            return None

    def close(self) -> None:
        self._client.close()
