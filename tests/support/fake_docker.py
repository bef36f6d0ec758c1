"""An in-memory container runtime for the executor's tests (a state per container name,
``start`` and ``stop`` flip it, ``inspect`` reads it) and an executor on it that polls
and waits briefly.

Modules that need more (a gate before a start, a record of restarts, a card that a
start fills) subclass :class:`FakeContainers`. Nothing here talks to Docker or checks
what a test asserts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from controller.adapters.elastic import ElasticClient
from controller.service.executor import Executor, ExecutorConfig
from controller.snapshot import ContainerModel
from statemachine.domain.types import ContainerState, DesiredState


class FakeContainers:
    """In-memory container runtime: ``running``, ``exited`` and ``created`` containers
    exist (a later group wins a name); stop/start flip them."""

    def __init__(
        self,
        running: Iterable[str] = (),
        *,
        exited: Iterable[str] = (),
        created: Iterable[str] = (),
    ) -> None:
        self.state: dict[str, str] = {c: "running" for c in running}
        self.state |= {c: "exited" for c in exited}
        self.state |= {c: "created" for c in created}

    def created_for(self, name: str) -> str | None:
        return None  # made without VRAMCTL_GPU_ROLE: started as it is

    def exists(self, name: str) -> bool:
        return name in self.state

    def stop(self, name: str, timeout_s: float) -> None:
        self.state[name] = "exited"

    def start(self, name: str) -> None:
        self.state[name] = "running"

    def inspect(self, name: str) -> ContainerModel | None:
        if name not in self.state:
            return None
        return ContainerModel(state=ContainerState(self.state[name]), exit_code=0)

    def logs(self, name: str, tail: int = 40) -> str:
        return ""


def quick_elastic() -> ElasticClient:
    """An elastic client that tries once and waits at most 0.1 s."""
    return ElasticClient(attempts=1, initial_wait_s=0.01, max_wait_s=0.1)


def quick_executor(
    desired: DesiredState,
    docker: Any,
    gpus: Callable[[], Any] = lambda: None,
    **kw: Any,
) -> Executor:
    """An executor of ``desired`` on ``docker`` that polls every 10 ms and waits 0.2 s for
    memory; ``kw``: the executor's other arguments (``elastic``, ``footprints``...)."""
    config = ExecutorConfig(poll_s=0.01, memory_wait_s=0.2)
    return Executor(desired, docker=docker, gpus=gpus, config=config, **kw)
