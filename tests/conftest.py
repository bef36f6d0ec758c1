"""Shared pytest fixtures: a real Docker daemon and the busybox test image.

``bin/test`` brings Docker up (``tests/docker/ensure-docker.sh``) and exports

* ``VRAMCTL_TEST_IMAGE`` - the image to run (``vramctl-test:latest``), a
  ``FROM scratch`` image holding a static busybox;
* ``VRAMCTL_DOCKER=unavailable`` - only on a developer machine where Docker
  could not be brought up: tests marked ``docker`` (and every user of
  ``docker_client``) are then skipped, and the run ends with a loud banner.

Under ``CI=true`` Docker is never optional: an unreachable daemon fails the
tests instead of skipping them.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import docker
import pytest
from docker.errors import DockerException, NotFound
from docker.models.containers import Container

DEFAULT_TEST_IMAGE = "vramctl-test:latest"
CONTAINER_PREFIX = "vramctl-test-"
TEST_LABEL = "vramctl.test"

BusyboxFactory = Callable[..., Container]


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"true", "1", "yes"}


def _docker_marked_unavailable() -> bool:
    return os.environ.get("VRAMCTL_DOCKER", "").strip().lower() == "unavailable"


_UNAVAILABLE_REASON = (
    "Docker unavailable on this machine (VRAMCTL_DOCKER=unavailable); "
    "run bin/test as root to install and start it"
)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--chaos-long",
        action="store_true",
        default=False,
        help="tests/test_chaos.py: a long campaign (1000 operations / 15 minutes) "
        "instead of the CI-sized one",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip ``@pytest.mark.docker`` tests when Docker is marked unavailable (never in CI)."""
    if not _docker_marked_unavailable() or _in_ci():
        return
    skip = pytest.mark.skip(reason=_UNAVAILABLE_REASON)
    for item in items:
        if item.get_closest_marker("docker") is not None:
            item.add_marker(skip)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    if _docker_marked_unavailable():
        bar = "#" * 72
        terminalreporter.write_line(bar, red=True, bold=True)
        terminalreporter.write_line(
            "#  WARNING: Docker was UNAVAILABLE: the docker tests were SKIPPED.",
            red=True,
            bold=True,
        )
        terminalreporter.write_line(bar, red=True, bold=True)


@pytest.fixture(scope="session")
def docker_client() -> Iterator[docker.DockerClient]:
    """A client for the local Docker daemon (``docker.from_env()``), checked with a ping."""
    if _docker_marked_unavailable():
        if _in_ci():
            pytest.fail(
                "VRAMCTL_DOCKER=unavailable under CI=true: the docker tests may not be skipped"
            )
        pytest.skip(_UNAVAILABLE_REASON)
    try:
        client = docker.from_env(timeout=60)
        client.ping()
    except DockerException as exc:
        pytest.fail(
            f"Docker daemon unreachable: {exc}. Run the suite with bin/test, which starts "
            "dockerd; on a developer machine without Docker, set VRAMCTL_DOCKER=unavailable "
            "to skip the docker tests.",
            pytrace=False,
        )
    try:
        yield client
    finally:
        client.close()


@pytest.fixture(scope="session")
def test_image() -> str:
    """The busybox test image built by tests/docker/ensure-docker.sh."""
    return os.environ.get("VRAMCTL_TEST_IMAGE", DEFAULT_TEST_IMAGE)


@pytest.fixture
def busybox_container(
    docker_client: docker.DockerClient, test_image: str
) -> Iterator[BusyboxFactory]:
    """Factory: ``busybox_container(command=("sleep", "3600"), **run_kwargs) -> Container``.

    Each container is started detached from the test image with ``init=True``
    (so SIGTERM stops it at once), host networking, a unique
    ``vramctl-test-`` name and the label ``vramctl.test=1``; extra keyword
    arguments go to ``docker_client.containers.run`` (``volumes=...``,
    ``labels=...`` are merged, ``name=...`` overrides). Every container made
    is force-removed at teardown.
    """
    created: list[Container] = []

    def run(command: Sequence[str] = ("sleep", "3600"), **kwargs: Any) -> Container:
        labels = {TEST_LABEL: "1", **kwargs.pop("labels", {})}
        name = kwargs.pop("name", f"{CONTAINER_PREFIX}{uuid.uuid4().hex[:12]}")
        options: dict[str, Any] = {
            "detach": True,
            "init": True,
            "network_mode": "host",
            "name": name,
            "labels": labels,
        }
        options.update(kwargs)
        container: Container = docker_client.containers.run(test_image, list(command), **options)
        created.append(container)
        return container

    yield run

    for container in reversed(created):
        with contextlib.suppress(NotFound):
            container.remove(force=True)
