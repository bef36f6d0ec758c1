"""Which sleepers are in force each cycle: journal records against containers and engines."""

from __future__ import annotations

from pathlib import Path

from fake_engine import FakeEngine
from support.serving import free_port

from controller.adapters.sleep import SleepClient
from controller.manifest import load_manifest_set
from controller.service.sleeping import (
    ContainerNow,
    ask_engines,
    observe_sleep,
    sleepers_in_force,
)
from controller.snapshot import ContainerModel, SnapshotModel
from controller.store.journal import SleepRecord

STARTED = "2026-12-01T10:00:00.000000001Z"


def rec(container: str = "c-big", serve: str = "big", **kw: object) -> SleepRecord:
    base: dict[str, object] = {
        "container": container,
        "serve": serve,
        "level": 1,
        "gpu_roles": ("a",),
        "residual_mib": 1000,
        "host_ram_mib": 6000,
        "started_at": STARTED,
        "since": 1.0,
    }
    base.update(kw)
    return SleepRecord(**base)  # type: ignore[arg-type]


def probe() -> SleepClient:
    return SleepClient(probe_timeout_s=1, attempts=1, max_wait_s=0)


def test_a_stopped_or_restarted_container_is_no_longer_asleep() -> None:
    records = {"c-big": rec(), "c-b": rec("c-b", "b"), "c-c": rec("c-c", "c")}
    containers = {
        "c-big": ContainerNow(True, STARTED),
        "c-b": ContainerNow(False, STARTED),  # stopped
        "c-c": ContainerNow(True, "2026-12-01T11:00:00Z"),  # restarted: awake and full
    }
    now = sleepers_in_force(records, containers, lambda r: True)
    assert list(now.asleep) == ["c-big"]
    assert sorted(now.forget) == ["c-b", "c-c"]
    assert any("started again" in n for n in now.notes)


def test_an_engine_that_says_it_is_awake_or_cannot_say() -> None:
    records = {"c-big": rec(), "c-sg": rec("c-sg", "sg")}
    containers = {"c-big": ContainerNow(True, STARTED), "c-sg": ContainerNow(True, STARTED)}
    now = sleepers_in_force(records, containers, lambda r: False if r.serve == "big" else None)
    assert now.forget == ["c-big"]  # woken outside the controller: counted full
    assert list(now.asleep) == ["c-sg"]  # SGLang cannot say: its record stands


def test_an_unreachable_engine_is_unknown_and_keeps_its_record() -> None:
    port = free_port()
    ask = ask_engines(probe(), {"big": (f"http://127.0.0.1:{port}", "vllm")})
    now = sleepers_in_force({"c-big": rec()}, {"c-big": ContainerNow(True, STARTED)}, ask)
    assert now.asleep == {} and now.forget == [] and now.seen == {"c-big": "unknown"}
    # said once: a record already seen unknown is not noted again
    again = sleepers_in_force(
        {"c-big": rec(seen="unknown")}, {"c-big": ContainerNow(True, STARTED)}, ask
    )
    assert again.notes == []


def manifest(tmp: Path, engine: FakeEngine) -> object:
    """One evictable serve ``big`` (container ``c-big``) that sleeps through ``engine``."""
    (tmp / "m.toml").write_text(
        f"""
[[gpu_roles]]
id = "a"
vram_mib = 10000

[[serve]]
name = "big"
container = "c-big"
gpu_role = "a"
vram_mib = 8000
residency = "evictable"
port = {free_port()}
engine = "{engine.protocol}"

[serve.sleep]
level = 1
residual_mib = 1000
host_ram_mib = 6000
url = "{engine.url}"
protocol = "{engine.protocol}"
"""
    )
    return load_manifest_set([tmp / "m.toml"])


def snapshot(state: str = "running") -> SnapshotModel:
    return SnapshotModel(
        docker="ok", containers={"c-big": ContainerModel(state=state, started_at=STARTED)}
    )


def test_observe_sleep_reads_records_and_asks_engines_without_one(tmp_path: Path) -> None:
    with FakeEngine("vllm") as engine:
        desired = manifest(tmp_path, engine).desired()  # type: ignore[attr-defined]
        # awake, no record: nothing to report (missing = awake)
        models, _ = observe_sleep(desired, snapshot(), {}, probe())
        assert models == {}
        # asleep with no record (put to sleep by hand, or the journal lost): reported
        import httpx

        httpx.post(engine.url + "/sleep?level=1")
        models, now = observe_sleep(desired, snapshot(), {}, probe())
        assert models["big"].state == "asleep" and models["big"].residual_mib is None
        assert any("no record" in n for n in now.notes)
        # with its record: asleep with what it was put to sleep with
        models, now = observe_sleep(desired, snapshot(), {"c-big": rec()}, probe())
        assert models["big"].model_dump(exclude_none=True) == {
            "state": "asleep",
            "level": 1,
            "residual_mib": 1000,
            "host_ram_mib": 6000,
        }
        assert now.seen == {"c-big": "asleep"}
        # the container stopped: forgotten, nothing reported
        models, now = observe_sleep(desired, snapshot("exited"), {"c-big": rec()}, probe())
        assert models == {} and now.forget == ["c-big"]
    # the engine gone, its container running: unknown (counted full), record kept
    models, now = observe_sleep(desired, snapshot(), {"c-big": rec()}, probe())
    assert models["big"].state == "unknown" and now.forget == []
    models, _ = observe_sleep(desired, snapshot(), {}, probe())
    assert models["big"].state == "unknown"
    # docker unreadable: nothing asked, nothing changed
    models, now = observe_sleep(desired, SnapshotModel(docker="error"), {"c-big": rec()}, probe())
    assert models == {} and now.forget == []


def test_observe_sleep_takes_an_sglang_sleeper_from_its_record(tmp_path: Path) -> None:
    """SGLang cannot say whether it sleeps (docs/protocols.md): its record and its
    container's start are all there is, and the engine is never asked."""
    import httpx

    with FakeEngine("sglang") as engine:
        desired = manifest(tmp_path, engine).desired()  # type: ignore[attr-defined]
        # released by hand, no record: nothing can tell, so nothing is reported (counted
        # full, as the ledger never counts less than it may hold)
        httpx.post(engine.url + "/release_memory_occupation", json={})
        models, now = observe_sleep(desired, snapshot(), {}, probe())
        assert models == {} and now.notes == [] and now.forget == []
        # with its record: asleep with what it was put to sleep with
        models, now = observe_sleep(desired, snapshot(), {"c-big": rec()}, probe())
        assert models["big"].model_dump(exclude_none=True) == {
            "state": "asleep",
            "level": 1,
            "residual_mib": 1000,
            "host_ram_mib": 6000,
        }
        assert now.seen == {"c-big": "asleep"} and now.forget == []
        # its container started again since: awake and full, the record forgotten
        restarted = SnapshotModel(
            docker="ok",
            containers={
                "c-big": ContainerModel(state="running", started_at="2026-12-01T11:00:00Z")
            },
        )
        models, now = observe_sleep(desired, restarted, {"c-big": rec()}, probe())
        assert models == {} and now.forget == ["c-big"]
        assert any("started again since it was put to sleep" in n for n in now.notes)
        assert [r.path for r in engine.calls] == ["/release_memory_occupation"]  # never asked
