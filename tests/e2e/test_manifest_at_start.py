"""An edit saved while ``vramctl run`` starts is read (the real daemon, the loop in-process).

The controller loads its manifest, then sets its watch on the manifests' folders; an
edit saved between the two raises no event. Once the watch is set the set is read again
(a set read unchanged changes nothing), so the edit comes into force: a controller that
planned on the stale set would never start the serve.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import docker
import pytest
from support.waiting import wait_for
from test_loop_events import Running, names
from test_placement_docker import RUNNING, TWO_CARDS, _controller, _running, _serve

__all__ = ["names"]  # the fixture, shared with test_loop_events

pytestmark = pytest.mark.docker


def test_an_edit_saved_before_the_watch_is_set_comes_into_force(
    docker_client: docker.DockerClient,
    test_image: str,
    names: Callable[[str], str],
    tmp_path: Path,
) -> None:
    x = names("x")
    path, state = tmp_path / "serves.toml", tmp_path / "state"
    serve = _serve("x", x, test_image, 4000, 'gpu_role = "a"', "DESIRED")
    path.write_text(TWO_CARDS + serve.replace("DESIRED", 'desired = "stopped"'))
    controller = _controller(path, state)  # the set is loaded here
    path.write_text(TWO_CARDS + serve.replace("DESIRED", RUNNING))  # saved before run() watches
    run = Running(controller)
    try:
        wait_for("x started from the edit", lambda: _running(docker_client, x))
    finally:
        run.stop()
