"""Helpers for tests whose serves are Docker Compose services.

A :class:`ComposeStack` is a stack folder with a ``docker-compose.yml`` (Compose v2,
installed by ``tests/docker/ensure-compose.sh``) whose services are busybox test
containers answering ``GET /health`` on the host's loopback, each with a unique
``container_name`` (``vramctl-test-…``) and the ``vramctl.test=1`` label, in a
project of their own (the file's top-level ``name:``). :meth:`ComposeStack.down`
removes everything the project made, every profile included.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from support.serving import free_port


def compose_available() -> None:
    """Skip (fail under CI) when ensure-compose.sh could not bring Compose up."""
    if os.environ.get("VRAMCTL_COMPOSE", "").strip().lower() != "unavailable":
        return
    if os.environ.get("CI", "").strip().lower() in {"true", "1", "yes"}:
        pytest.fail("VRAMCTL_COMPOSE=unavailable under CI=true: the Compose tests may not skip")
    pytest.skip("Docker Compose v2 unavailable (VRAMCTL_COMPOSE=unavailable)")


def docker_compose(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["docker", "compose", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@dataclass
class Service:
    name: str
    port: int
    profiles: tuple[str, ...] = ()
    delay_s: int = 0  # health answers only after this long
    image: str | None = None  # default: the stack's test image
    command: tuple[str, ...] | None = None  # default: busybox httpd answering /health
    volumes: tuple[str, ...] = ()  # Compose's short syntax, HOST:CONTAINER[:ro]
    mem_limit: str | None = None  # the container's memory (and swap) limit, e.g. "48m"
    ulimits: dict[str, int] = field(default_factory=dict)  # e.g. {"data": 180_000_000}


@dataclass
class ComposeStack:
    """A Compose project in ``dir``; services are added, then :meth:`write` saves the file."""

    dir: Path
    image: str
    project: str = field(default_factory=lambda: f"vramctl-test-{uuid.uuid4().hex[:8]}")
    services: dict[str, Service] = field(default_factory=dict)

    @property
    def file(self) -> Path:
        return self.dir / "docker-compose.yml"

    def container(self, service: str) -> str:
        return f"{self.project}-{service}"

    def add(self, name: str, **kw: object) -> Service:
        svc = Service(name, free_port(), **kw)  # type: ignore[arg-type]
        self.services[name] = svc
        return svc

    def write(self) -> None:
        lines = [f"name: {self.project}", "services:"]
        for s in self.services.values():
            pre = f"sleep {s.delay_s}; " if s.delay_s else ""
            httpd = (
                f"{pre}mkdir -p /www && echo ok > /www/health && "
                f"exec httpd -f -p 127.0.0.1:{s.port} -h /www"
            )
            command = list(s.command) if s.command is not None else ["sh", "-c", httpd]
            lines += [
                f"  {s.name}:",
                f"    image: {s.image or self.image}",
                "    pull_policy: never",
                f"    container_name: {self.container(s.name)}",
                "    network_mode: host",
                "    init: true",
                f"    command: {json.dumps(command)}",
                '    labels: {"vramctl.test": "1"}',
            ]
            if s.volumes:
                lines.append(f"    volumes: {json.dumps(list(s.volumes))}")
            if s.mem_limit:
                lines += [f"    mem_limit: {s.mem_limit}", f"    memswap_limit: {s.mem_limit}"]
            if s.ulimits:
                lines.append(f"    ulimits: {json.dumps(s.ulimits)}")
            if s.profiles:
                lines.append(f"    profiles: {json.dumps(list(s.profiles))}")
        self.dir.mkdir(parents=True, exist_ok=True)
        self.file.write_text("\n".join(lines) + "\n")

    def up_command(self, service: str, *, profile: str | None = None) -> str:
        prof = f" --profile {profile}" if profile else ""
        return f"docker compose -f {{dir}}/docker-compose.yml{prof} up -d {service}"

    def down(self) -> None:
        if shutil.which("docker") is None or not self.file.exists():
            return
        docker_compose(
            "-f",
            str(self.file),
            "--profile",
            "*",
            "down",
            "-t",
            "0",
            "-v",
            "--remove-orphans",
            cwd=self.dir,
        )


@contextlib.contextmanager
def stack_beside(fleet: Any, image: str) -> Iterator[ComposeStack]:
    """A Compose stack of ``image`` in the project of ``fleet`` (a run fleet: its ``tmp``,
    ``prefix`` and ``runs``); at the end every run still up is killed, then the stack is
    brought down, so that no controller acts on what is removed."""
    compose_available()
    s = ComposeStack(fleet.tmp, image, project=fleet.prefix.rstrip("-"))
    try:
        yield s
    finally:
        for run in fleet.runs:
            if run.proc.poll() is None:
                run.proc.kill()
                run.proc.wait(10)
        s.down()
