"""``request_up`` with ``wait_s`` over MCP: every step its answer rests on is told first.

The tool relays the controller's events about the request as progress notifications
while the API's ``up`` waits; when ``up`` answers, the relay is told to stop. Events
published before that moment are already queued on the relay's subscription: they are
sent before the answer, not dropped (on a loaded machine the answer came while
``start llm: ok`` was still queued, and the client never heard of the start). The real
event bus; the client's progress callback records what it is sent. No Docker.
"""

from __future__ import annotations

import asyncio

from controller.interfaces.api.agents import _relay
from controller.interfaces.mcp_server import Caller
from controller.service.events import EventBus


def _relayed(published_before_stop: list[tuple[str, dict[str, object]]]) -> list[str]:
    sent: list[str] = []

    async def progress(done: float, total: float | None, message: str | None) -> None:
        sent.append(str(message))

    async def main() -> None:
        bus = EventBus()
        sub = bus.subscribe()
        stop = asyncio.Event()
        relay = asyncio.ensure_future(
            _relay(sub, "llm", Caller(full=True, may_write=True, progress=progress), stop)
        )
        await asyncio.sleep(0)  # the relay is waiting for its next event
        for kind, data in published_before_stop:
            bus.publish(kind, **data)
        stop.set()  # the answer is ready at once: nothing has been relayed yet
        await asyncio.wait_for(relay, 5.0)
        sub.close()

    asyncio.run(main())
    return sent


def test_the_events_published_before_the_answer_are_all_sent() -> None:
    steps = [
        ("step", {"action": "stop", "serve": "omni", "outcome": "ok"}),
        ("step", {"action": "start", "serve": "llm", "outcome": "ok"}),
        ("lifecycle", {"serve": "llm", "from": "starting", "to": "running"}),
        ("lifecycle", {"serve": "omni", "from": "running", "to": "stopped"}),  # not llm's
    ]
    assert _relayed(steps) == ["stop omni: ok", "start llm: ok", "llm: starting -> running"]


def test_a_relay_with_nothing_queued_ends_when_the_answer_is_ready() -> None:
    assert _relayed([]) == []
