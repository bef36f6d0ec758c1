"""Shared pytest fixtures: a real Docker daemon and the busybox test image.

``bin/test`` brings Docker up (``tests/docker/ensure-docker.sh``) and exports

* ``VRAMCTL_TEST_IMAGE`` - the image to run (``vramctl-test:latest``), a
  ``FROM scratch`` image holding a static busybox;
* ``VRAMCTL_DOCKER=unavailable`` - only on a developer machine where Docker
  could not be brought up: tests marked ``docker`` (and every user of
  ``docker_client``) are then skipped, and the run ends with a loud banner.

Under ``CI=true`` Docker is never optional: an unreachable daemon fails the
tests instead of skipping them.

``bin/test`` runs the tests in parallel workers (pytest-xdist, ``--dist loadgroup``);
this module says how they are handed out: the longest modules first
(:data:`LONG_FIRST`) and the modules with one expensive shared fixture to one worker
each (:data:`ONE_WORKER`). Every test is safe in parallel on one shared daemon: its
containers, Compose projects, ports and state folders are its own (unique names,
``free_port``, ``tmp_path``), and no test removes what another made. Nothing here
changes what a test checks, only where and when it runs.
"""

from __future__ import annotations

import contextlib
import os
import signal
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import docker
import pytest
from docker.errors import DockerException, NotFound
from docker.models.containers import Container
from hypothesis import HealthCheck, settings

# The shared helpers of tests/support/ assert as the tests do (a table's expected errors,
# a plan replayed through the ledger): their failures are explained as a test's are.
pytest.register_assert_rewrite("support")

# Hypothesis: no per-example deadline and no "too slow" health check by default. Both
# judge wall-clock time, which a loaded machine misses: a property fails on what it
# states, never on how busy the machine is. A test that sets either keeps its own.
settings.register_profile("vramctl", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("vramctl")

# Ctrl-C interrupts what the tests start, as at a terminal. A test run started in the
# background by a non-interactive shell inherits SIGINT ignored, and every process it
# starts would keep it ignored (a CLI's KeyboardInterrupt would never come); Python's
# own handler is reset to the default in each child at exec.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

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
        help="tests/shell/test_chaos.py: a long campaign (1000 operations / 15 minutes) "
        "instead of the CI-sized one",
    )


#: The modules whose tests take longest (measured with ``--durations``: the example run
#: for real, the chaos campaign, the controller's image, the property searches, the
#: live serves), longest first. Under parallel workers (bin/test, pytest-xdist) they are
#: handed out first, so that none is left running alone at the end of the run.
LONG_FIRST = (
    "test_examples.py",
    "test_chaos.py",
    "test_container.py",
    "test_planner_properties.py",
    "test_fit_isolated.py",
    "test_sleep_e2e.py",
    "test_mutation_tool.py",
    "test_live_answers.py",
    "test_events.py",
    "test_observe.py",
    "test_executor_e2e.py",
    "test_fuzz_api.py",
    "test_run_e2e.py",
    "test_footprints.py",
    "test_planner_sleep_properties.py",
    "test_busy_e2e.py",
    "test_ui_page.py",
    "test_api.py",
)


#: The modules whose tests share one worker: their module- or session-scoped fixture (a
#: running controller over real containers, a browser, the controller's image build)
#: is set up once, not once per worker; or their tests share one stack on the daemon.
ONE_WORKER = (
    "test_api.py",
    "test_events.py",
    "test_monitoring.py",
    "test_ui_page.py",
    "test_container.py",
    # the examples run for real share one Compose project and the router's port: the
    # run script allows one run at a time, and its cleanup removes the stack
    "test_examples.py",
)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under ``--dist loadgroup`` (bin/test): :data:`ONE_WORKER`'s modules are one unit
    each, the other tests one unit per test (or per ``xdist_group``), handed out in
    collection order.

    pytest-xdist's own grouping renames each marked item's node id on the workers, which
    pytest 9 no longer lets a plugin do; the module is read from the node id instead.
    """
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class ModuleUnits(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            if module.rsplit("/", 1)[-1] in ONE_WORKER:
                return module
            return str(super()._split_scope(nodeid))

    return ModuleUnits(config, log)


def _long_first(items: list[pytest.Item]) -> None:
    """Reorder ``items`` in place: :data:`LONG_FIRST`'s modules in its order, then the rest
    as collected (each module's own order kept)."""
    rank = {name: i for i, name in enumerate(LONG_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under parallel workers, the long modules first (:data:`LONG_FIRST`); skip
    ``@pytest.mark.docker`` tests when Docker is marked unavailable (never in CI)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):  # every worker collects the same order
        _long_first(items)
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


@pytest.fixture(scope="session")
def engine_image() -> str:
    """llama.cpp's own llama-server, built by tests/docker/ensure-engine.sh (bin/test
    runs it): skipped loudly when it could not be had, failed under CI=true."""
    image = os.environ.get("VRAMCTL_ENGINE_IMAGE", "").strip()
    if image and image != "unavailable":
        return image
    why = "the llama.cpp engine image is unavailable (tests/docker/ensure-engine.sh)"
    if os.environ.get("CI", "").strip().lower() in {"true", "1", "yes"}:
        pytest.fail(f"{why}: CI=true, the real-engine tests may not skip")
    pytest.skip(why)


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
