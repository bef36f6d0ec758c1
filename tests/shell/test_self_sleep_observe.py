"""The loop asks an engine that sleeps by itself, and only with ``GET /props``
(controller/service/observe.py ``observe_self_sleep``, controller/adapters/self_sleep.py):
a test server that answers as llama.cpp's does records every request."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_http import FakeHTTPServer, Recorded, Reply, ReplyLike
from support.serving import free_port

from controller.adapters.self_sleep import SelfSleepReader
from controller.manifest.load import load_manifest
from controller.service.observe import observe_self_sleep
from controller.snapshot import ContainerModel, SnapshotModel
from statemachine.domain.types import ContainerState


class Props(FakeHTTPServer):
    """``GET /props`` as llama-server answers it; anything else is recorded and 404."""

    def __init__(self, answer: ReplyLike) -> None:
        super().__init__()
        self.answer = answer

    def handle(self, request: Recorded) -> ReplyLike:
        return self.answer if (request.method, request.path) == ("GET", "/props") else (404, {})


def serve(name: str, port: int | None, engine: str) -> str:
    where = f"port = {port}\n" if port is not None else ""
    return (
        f'[[serve]]\nname = "{name}"\ncontainer = "c-{name}"\nengine = "{engine}"\n'
        f'gpu_role = "a"\nvram_mib = 1000\nresidency = "evictable"\n{where}'
    )


@pytest.fixture
def reader() -> Iterator[SelfSleepReader]:
    r = SelfSleepReader(timeout_s=1.0)
    yield r
    r.close()


def test_each_running_llamacpp_serve_is_asked_once_with_get_props_only(
    tmp_path: Path, reader: SelfSleepReader
) -> None:
    with Props((200, {"is_sleeping": True})) as nap, Props((200, {"is_sleeping": False})) as up:
        other = free_port()
        text = '[[gpu_roles]]\nid = "a"\nvram_mib = 10000\n\n' + "\n".join(
            (
                serve("nap", nap.port, "llama.cpp"),
                serve("up", up.port, "llama-server"),
                serve("down", nap.port, "llama.cpp"),  # not running: not asked
                serve("portless", None, "llama.cpp"),  # nowhere to ask
                serve("vllm", other, "vllm"),  # an engine that does not sleep by itself
            )
        )
        (tmp_path / "m.toml").write_text(text)
        mset = load_manifest(tmp_path / "m.toml")
        running = ContainerModel(state=ContainerState.RUNNING)
        snap = SnapshotModel(
            docker="ok",
            containers={
                "c-nap": running,
                "c-up": running,
                "c-down": ContainerModel(state=ContainerState.EXITED, exit_code=0),
                "c-portless": running,
                "c-vllm": running,
            },
        )
        got = observe_self_sleep(snap, mset, reader)
        assert got == {"nap": True, "up": False}
        assert [(c.method, c.path) for c in nap.calls] == [("GET", "/props")]
        assert [(c.method, c.path) for c in up.calls] == [("GET", "/props")]


@pytest.mark.parametrize(
    "answer",
    [(500, {"error": "x"}), (200, "not json"), (200, {"is_sleeping": "yes"}), (200, [True])],
)
def test_an_answer_that_says_nothing_is_unknown(answer: ReplyLike, reader: SelfSleepReader) -> None:
    from statemachine import engines

    config = engines.get("llamacpp").self_sleep
    assert config is not None
    with Props(answer) as props:
        assert reader.asleep(props.url, config) is None


def test_a_server_that_does_not_answer_is_unknown(reader: SelfSleepReader) -> None:
    from statemachine import engines

    config = engines.get("llamacpp").self_sleep
    assert config is not None
    assert reader.asleep(f"http://127.0.0.1:{free_port()}", config) is None
    with Props(Reply(200, {"is_sleeping": True}, delay_s=2.0)) as slow:
        assert reader.asleep(slow.url, config) is None  # past its 1 s timeout
