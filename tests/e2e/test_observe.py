"""Observing the host end to end: real containers, a scripted NVML, drift in ``status``.

Two halves (docs/design.md §3 drift, §5 contracts):

* :func:`controller.service.observe.observe_host` against the real Docker daemon, with real
  busybox containers named in a manifest written to ``tmp_path`` and a
  :class:`fakes_nvml.FakeNvml` whose processes carry PIDs mapped to those
  containers' real ids (``pid_to_container``; one test instead uses a real
  container's host PID and the default ``/proc/<pid>/cgroup`` lookup). The snapshot
  goes through its JSON form into :func:`statemachine.answers.status_report.host_status`, whose
  per-role and per-serve NVML figures and drift are checked to the MiB: unknown stays
  ``None``, never 0.
* The ``vramctl`` CLI in a subprocess against the same daemon: ``observe`` prints
  what ``--observed`` reads back, and ``status`` / ``fit`` / ``plan`` answer the
  same from that file as they do live. This host has no NVML library, so the live
  GPU figures are unknown (those assertions are skipped where one is installed).
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import docker
import pynvml
import pytest
from docker.models.containers import Container
from support.cli import cli_env, run_cli
from support.fakes_nvml import GIB, FakeDevice, FakeNvml, FakeProc, nvml_error

from controller.adapters.docker.read import ContainerObserver
from controller.adapters.nvml import MIB
from controller.manifest import load_manifest_set
from controller.service.observe import observe_host
from controller.snapshot import SnapshotModel, parse_snapshot, snapshot_to_json
from statemachine.answers.status_report import HostStatus, RoleStatus, ServeStatus, host_status

BusyboxFactory = Callable[..., Container]

UUID_A = "GPU-00000000-1111-2222-3333-444444444444"
UUID_B = "GPU-55555555-6666-7777-8888-999999999999"
UUID_GONE = "GPU-deadbeef-0000-0000-0000-000000000000"  # declared, not on the host

# Declared capacities differ from the fake devices' totals on purpose (drift_total).
CAP_A, RESERVE_A, TOTAL_A = 48000, 1024, 48 * 1024  # device 48 GiB = 49152 MiB
CAP_B, TOTAL_B = 24000, 24 * 1024  # device 24 GiB = 24576 MiB
CAP_C = 16000

# Reservations (MiB).
LLM_MIB, EMBED_MIB, OCR_MIB, IDLE_MIB = 20000, 4000, 3000, 10000

# What the fake NVML reports (MiB). llm runs on both devices; a host process (not in a
# container) uses memory on device A that no serve accounts for.
LLM_ON_A, LLM_ON_B, HOST_ON_A = 21000, 500, 2000
USED_A, USED_B = 30 * 1024, 9 * 1024

PID_LLM_A, PID_LLM_B, PID_EMBED, PID_HOST = 41001, 41002, 42001, 49999


def libnvml_present() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


no_libnvml = pytest.mark.skipif(libnvml_present(), reason="libnvidia-ml.so.1 is installed here")


@dataclass(frozen=True)
class Host:
    """The manifest written for a test and the real containers it names."""

    manifest: Path
    llm: Container  # running, role a
    embed: Container  # running, role b
    ocr: Container  # running, role c (a device NVML does not list)
    idle: Container  # exited 0, role a
    missing: str  # declared container that does not exist

    @property
    def names(self) -> list[str]:
        return [
            self.llm.name,
            self.embed.name,
            self.ocr.name,
            self.idle.name,
            self.missing,
        ]


def write_manifest(path: Path, llm: str, embed: str, ocr: str, idle: str, missing: str) -> Path:
    path.write_text(
        f"""
[[gpu_roles]]
id = "role-a"
vram_mib = {CAP_A}
reserve_mib = {RESERVE_A}
uuid = "{UUID_A}"

[[gpu_roles]]
id = "role-b"
vram_mib = {CAP_B}
reserve_mib = 0
uuid = "{UUID_B}"

[[gpu_roles]]
id = "role-c"
vram_mib = {CAP_C}
reserve_mib = 0
uuid = "{UUID_GONE}"

[[serve]]
name = "llm"
container = "{llm}"
gpu_role = "role-a"
vram_mib = {LLM_MIB}
residency = "evictable"

[[serve]]
name = "embed"
container = "{embed}"
gpu_role = "role-b"
vram_mib = {EMBED_MIB}
residency = "resident"

[[serve]]
name = "ocr"
container = "{ocr}"
gpu_role = "role-c"
vram_mib = {OCR_MIB}
residency = "evictable"

[[serve]]
name = "idle"
container = "{idle}"
gpu_role = "role-a"
vram_mib = {IDLE_MIB}
residency = "on-demand"

[[serve]]
name = "ghost"
container = "{missing}"
gpu_role = "role-b"
vram_mib = 1000
residency = "on-demand"
""",
        encoding="utf-8",
    )
    return path


@pytest.fixture
def host(tmp_path: Path, busybox_container: BusyboxFactory) -> Host:
    llm = busybox_container()
    embed = busybox_container()
    ocr = busybox_container()
    idle = busybox_container(command=("true",))
    assert idle.wait(timeout=30)["StatusCode"] == 0
    missing = f"vramctl-test-absent-{tmp_path.name[-12:]}"
    manifest = write_manifest(
        tmp_path / "serves.toml", llm.name, embed.name, ocr.name, idle.name, missing
    )
    return Host(manifest, llm, embed, ocr, idle, missing)


def fake_nvml(*, embed_used: int | None = 3 * GIB) -> FakeNvml:
    """Two devices: A (llm + a host process) and B (llm + embed)."""
    return FakeNvml(
        [
            FakeDevice(
                UUID_A,
                total=TOTAL_A * MIB,
                used=USED_A * MIB,
                compute=[FakeProc(PID_LLM_A, LLM_ON_A * MIB), FakeProc(PID_HOST, HOST_ON_A * MIB)],
            ),
            FakeDevice(
                UUID_B,
                name="NVIDIA GeForce RTX 4090",
                total=TOTAL_B * MIB,
                used=USED_B * MIB,
                compute=[FakeProc(PID_LLM_B, LLM_ON_B * MIB), FakeProc(PID_EMBED, embed_used)],
            ),
        ]
    )


def observe_and_report(
    host: Host,
    client: docker.DockerClient,
    nvml: FakeNvml,
    pid_to_container: Callable[[int], str | None] | None,
) -> tuple[SnapshotModel, HostStatus]:
    """observe_host -> snapshot JSON -> parsed back -> host_status (as ``--observed`` does)."""
    snap = observe_host(
        host.names,
        observer=ContainerObserver(client),
        nvml=nvml,
        now=datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
        pid_to_container=pid_to_container,
    )
    assert nvml.calls[0] == "init"
    assert nvml.initialised == 0, "every successful nvmlInit is matched by nvmlShutdown"
    reread = parse_snapshot(json.loads(json.dumps(snapshot_to_json(snap))))
    assert reread == snap
    desired = load_manifest_set([host.manifest]).desired()
    return snap, host_status(desired, reread.to_observed())


def by_role(report: HostStatus) -> dict[str, RoleStatus]:
    return {r.ledger.gpu_role: r for r in report.roles}


def by_serve(report: HostStatus) -> dict[str, ServeStatus]:
    return {s.serve: s for s in report.serves}


# ------------------------------------------------------------ observe_host + status


@pytest.mark.docker
def test_drift_from_faked_nvml_end_to_end(host: Host, docker_client: docker.DockerClient) -> None:
    pids = {
        PID_LLM_A: host.llm.id,
        PID_LLM_B: host.llm.id,
        PID_EMBED: host.embed.id,
        PID_HOST: None,  # a host process: no container
    }
    snap, report = observe_and_report(host, docker_client, fake_nvml(), pids.get)

    # The snapshot: real docker states, the fake's devices, attributed usage.
    assert snap.docker == "ok" and snap.nvml_error is None
    assert snap.taken_at == "2026-01-02T03:04:05Z"
    c = snap.containers
    assert host.missing not in c  # absent
    assert c[host.llm.name].state == "running" and c[host.llm.name].id == host.llm.id
    assert c[host.idle.name].state == "exited" and c[host.idle.name].exit_code == 0
    assert c[host.llm.name].gpu_used_mib == LLM_ON_A + LLM_ON_B  # summed over devices
    assert c[host.embed.name].gpu_used_mib == 3 * 1024
    assert c[host.ocr.name].gpu_used_mib == 0  # running, no process, lists complete
    assert c[host.idle.name].gpu_used_mib is None  # not running: not measured
    assert snap.gpus is not None
    assert [(g.uuid, g.index, g.total_mib, g.used_mib, g.free_mib) for g in snap.gpus] == [
        (UUID_A, 0, TOTAL_A, USED_A, TOTAL_A - USED_A),
        (UUID_B, 1, TOTAL_B, USED_B, TOTAL_B - USED_B),
    ]

    # Per role: NVML used vs committed, device total vs declared capacity.
    assert report.docker_ok and report.nvml_ok
    assert report.to_json()["nvml"] == "ok"
    roles = by_role(report)
    a, b, cc = roles["role-a"], roles["role-b"], roles["role-c"]
    assert a.ledger.committed_mib == LLM_MIB  # idle exited: not committed
    assert (a.device_found, a.nvml_total_mib, a.nvml_used_mib) == (True, TOTAL_A, USED_A)
    assert a.drift_used_mib == USED_A - LLM_MIB == 10720
    assert a.drift_total_mib == TOTAL_A - CAP_A == 1152
    assert b.ledger.committed_mib == EMBED_MIB  # ghost absent: not committed
    assert (b.device_found, b.nvml_total_mib, b.nvml_used_mib) == (True, TOTAL_B, USED_B)
    assert b.drift_used_mib == USED_B - EMBED_MIB == 5216
    assert b.drift_total_mib == TOTAL_B - CAP_B == 576
    # A role whose uuid NVML does not list: unknown, not 0.
    assert cc.ledger.committed_mib == OCR_MIB
    assert cc.device_found is False
    assert (cc.nvml_total_mib, cc.nvml_used_mib) == (None, None)
    assert (cc.drift_used_mib, cc.drift_total_mib) == (None, None)

    # Per serve: attributed usage vs reservation.
    s = by_serve(report)
    assert s["llm"].state == "running" and s["llm"].committed is True
    assert s["llm"].nvml_used_mib == LLM_ON_A + LLM_ON_B
    assert s["llm"].drift_mib == LLM_ON_A + LLM_ON_B - LLM_MIB == 1500
    assert (s["embed"].nvml_used_mib, s["embed"].drift_mib) == (3072, 3072 - EMBED_MIB)
    assert (s["ocr"].nvml_used_mib, s["ocr"].drift_mib) == (0, -OCR_MIB)
    assert s["idle"].state == "exited" and s["idle"].committed is False
    assert (s["idle"].nvml_used_mib, s["idle"].drift_mib) == (None, None)
    assert s["ghost"].state == "absent"
    assert (s["ghost"].nvml_used_mib, s["ghost"].drift_mib) == (None, None)

    js = report.to_json()
    ra = next(r for r in js["gpu_roles"] if r["gpu_role"] == "role-a")
    assert (ra["nvml_used_mib"], ra["drift_used_mib"], ra["drift_total_mib"]) == (
        USED_A,
        10720,
        1152,
    )
    rc = next(r for r in js["gpu_roles"] if r["gpu_role"] == "role-c")
    assert rc["nvml_used_mib"] is None and rc["drift_used_mib"] is None


@pytest.mark.docker
def test_process_without_memory_figure_makes_that_serve_unknown(
    host: Host, docker_client: docker.DockerClient
) -> None:
    pids = {PID_LLM_A: host.llm.id, PID_LLM_B: host.llm.id, PID_EMBED: host.embed.id}
    snap, report = observe_and_report(host, docker_client, fake_nvml(embed_used=None), pids.get)

    assert snap.containers[host.embed.name].gpu_used_mib is None
    s = by_serve(report)
    assert s["embed"].committed is True
    assert (s["embed"].nvml_used_mib, s["embed"].drift_mib) == (None, None)
    # The other serves and the device figures are still known.
    assert s["llm"].nvml_used_mib == LLM_ON_A + LLM_ON_B
    assert s["ocr"].nvml_used_mib == 0
    b = by_role(report)["role-b"]
    assert (b.nvml_used_mib, b.drift_used_mib) == (USED_B, USED_B - EMBED_MIB)


@pytest.mark.docker
def test_nvml_missing_every_figure_unknown(host: Host, docker_client: docker.DockerClient) -> None:
    fake = FakeNvml(fake_nvml().devices, init_error=nvml_error(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND))
    pids = {PID_LLM_A: host.llm.id, PID_EMBED: host.embed.id}
    snap, report = observe_and_report(host, docker_client, fake, pids.get)

    assert fake.calls == ["init"]  # nothing else touched
    assert snap.docker == "ok" and snap.gpus is None
    assert snap.nvml_error is not None and "NVMLError_LibraryNotFound" in snap.nvml_error
    assert snapshot_to_json(snap)["gpus"] is None
    assert all(c.gpu_used_mib is None for c in snap.containers.values())
    assert snap.containers[host.llm.name].state == "running"  # docker still read

    assert report.docker_ok and not report.nvml_ok
    js = report.to_json()
    assert js["nvml"] == "unavailable"
    for r in js["gpu_roles"]:
        assert r["device_found"] is False
        for key in ("nvml_total_mib", "nvml_used_mib", "drift_used_mib", "drift_total_mib"):
            assert r[key] is None, (r["gpu_role"], key)
    # The ledger itself is still known: it comes from docker and the manifest.
    assert {r["gpu_role"]: r["committed_mib"] for r in js["gpu_roles"]} == {
        "role-a": LLM_MIB,
        "role-b": EMBED_MIB,
        "role-c": OCR_MIB,
    }
    for s in js["serves"]:
        assert s["nvml_used_mib"] is None and s["drift_mib"] is None, s["serve"]


@pytest.mark.docker
def test_default_attribution_reads_the_real_cgroup(
    host: Host, docker_client: docker.DockerClient
) -> None:
    """No ``pid_to_container``: the real container's host PID is mapped via /proc."""
    host.llm.reload()
    pid = int(host.llm.attrs["State"]["Pid"])
    if not Path(f"/proc/{pid}").exists():
        pytest.skip("the daemon's processes are not visible here (other PID namespace)")
    fake = FakeNvml(
        [
            FakeDevice(
                UUID_A,
                total=TOTAL_A * MIB,
                used=USED_A * MIB,
                compute=[FakeProc(pid, 7 * GIB), FakeProc(os.getpid(), GIB)],
            )
        ]
    )
    snap, report = observe_and_report(host, docker_client, fake, None)
    assert snap.containers[host.llm.name].gpu_used_mib == 7 * 1024
    s = by_serve(report)
    assert (s["llm"].nvml_used_mib, s["llm"].drift_mib) == (7168, 7168 - LLM_MIB)
    assert s["embed"].nvml_used_mib == 0  # our own pid is not in any container


# ------------------------------------------------------------------- the CLI, live


def vramctl(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, env=cli_env(), cwd=Path(__file__).parents[2])


def json_of(r: subprocess.CompletedProcess[str]) -> Any:
    assert "Traceback" not in r.stderr, r.stderr
    return json.loads(r.stdout)


@pytest.mark.docker
def test_cli_observe_round_trips_through_observed(host: Host, tmp_path: Path) -> None:
    m = ["-m", str(host.manifest)]
    r = vramctl("observe", *m)
    assert r.returncode == 0, r.stderr
    observed = json_of(r)
    snap_file = tmp_path / "observed.json"
    snap_file.write_text(r.stdout, encoding="utf-8")

    assert observed["docker"] == "ok"
    assert parse_snapshot(observed).model_dump(mode="json") == observed  # lossless
    c = observed["containers"]
    assert c[host.llm.name]["state"] == "running"
    assert c[host.llm.name]["id"] == host.llm.id
    assert c[host.idle.name]["state"] == "exited"
    assert host.missing not in c

    # status: the same report from the file as live (no field depends on taken_at).
    from_file = vramctl("status", *m, "--observed", str(snap_file), "--json")
    live = vramctl("status", *m, "--json")
    assert from_file.returncode == 0 and live.returncode == 0, (from_file.stderr, live.stderr)
    assert json_of(from_file) == json_of(live)
    serves = {s["serve"]: s for s in json_of(live)["serves"]}
    assert serves["llm"]["state"] == "running" and serves["llm"]["committed"] is True
    assert serves["ghost"]["state"] == "absent"

    # fit: same answer and exit code.
    fit_file = vramctl("fit", "idle", *m, "--observed", str(snap_file), "--json")
    fit_live = vramctl("fit", "idle", *m, "--json")
    assert fit_file.returncode == fit_live.returncode == 0, fit_live.stderr
    assert json_of(fit_file) == json_of(fit_live)

    # plan: same steps; the embedded observation differs only in taken_at.
    plan_file = json_of(vramctl("plan", *m, "--observed", str(snap_file), "--json"))
    plan_live = json_of(vramctl("plan", *m, "--json"))
    assert plan_file["observed"]["taken_at"] == observed["taken_at"]
    for p in (plan_file, plan_live):
        p["observed"].pop("taken_at")
    assert plan_file == plan_live
    assert {k: v for k, v in observed.items() if k != "taken_at"} == plan_live["observed"]


@no_libnvml
@pytest.mark.docker
def test_cli_live_gpu_figures_unknown_without_nvml(host: Host) -> None:
    m = ["-m", str(host.manifest)]
    r = vramctl("observe", *m)
    assert r.returncode == 0, r.stderr
    observed = json_of(r)
    assert observed["gpus"] is None
    assert "NVMLError_LibraryNotFound" in observed["nvml_error"]
    assert "Shared Library Not Found" in observed["nvml_error"]
    assert all(c["gpu_used_mib"] is None for c in observed["containers"].values())
    assert "warning: nvml:" in r.stderr

    js = json_of(vramctl("status", *m, "--json"))
    assert js["docker"] == "ok" and js["nvml"] == "unavailable"
    assert all(r["nvml_used_mib"] is None for r in js["gpu_roles"])

    human = vramctl("status", *m)
    assert human.returncode == 0, human.stderr
    assert "NVML unavailable" in human.stdout
    lines = [ln for ln in human.stdout.splitlines() if "│" in ln or "┃" in ln]
    header = next(ln for ln in lines if "nvml used" in ln)
    cols = [cell.strip() for cell in header.replace("┃", "│").split("│")]
    at = cols.index("nvml used")
    for role in ("role-a", "role-b", "role-c"):
        row = next(ln for ln in lines if f"│ {role} " in ln)
        cells = [cell.strip() for cell in row.split("│")]
        assert cells[at] == "unknown", row
        assert cells[cols.index("drift")] == "unknown", row
        assert cells[cols.index("committed")] != "unknown", row  # docker was read
