"""The sleep adapter against the test engine (tests/fake_engine.py), both protocols.

The test engine answers as vLLM's and SGLang's HTTP handlers do; these tests check
what the adapter sends (paths, queries, bodies, order), what it makes of each answer
(a 404 is "not started with the flag", a refused release is busy), and that the
engine's memory on the scripted NVML device follows what it was asked.
"""

from __future__ import annotations

import time

import httpx
import pytest
from fake_engine import SGLANG_IDLE_MESSAGE, FakeEngine
from support.fakes_nvml import GIB, FakeDevice
from support.serving import free_port

from controller.adapters.sleep import SleepClient, SleepError, SleepNotEnabledError

MIB = 1024 * 1024


def client() -> SleepClient:
    return SleepClient(timeout_s=10, attempts=3, max_wait_s=2, initial_wait_s=0.05)


def posts(engine: FakeEngine) -> list[str]:
    out = []
    for r in engine.calls:
        if r.method == "POST":
            out.append(r.path + (f"?{r.raw_query}" if r.raw_query else ""))
    return out


def wait_until(check, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


# ── vLLM ──────────────────────────────────────────────────────────────────────


def test_vllm_level1_sleep_and_wake_move_the_memory_on_the_device() -> None:
    dev = FakeDevice(uuid="GPU-a", total=48 * GIB)
    with FakeEngine("vllm", device=dev, weights_mib=6000, kv_mib=3000, residual_mib=1000) as eng:
        assert dev.used == 10_000 * MIB
        assert [p.usedGpuMemory for p in dev.compute] == [10_000 * MIB]
        with client() as c:
            assert c.is_sleeping(eng.url, "vllm") is False
            assert c.sleep(eng.url, "vllm", 1) == "POST /sleep?level=1"
            assert c.is_sleeping(eng.url, "vllm") is True
            wait_until(lambda: dev.used == 1000 * MIB)  # the residual: context and buffers
            assert eng.host_ram_mib == 6000  # the weights, in host RAM
            done = c.wake(eng.url, "vllm", timeout_s=10)
            assert done == ["POST /wake_up?tags=weights", "POST /wake_up?tags=kv_cache"]
            assert c.is_sleeping(eng.url, "vllm") is False
        assert dev.used == 10_000 * MIB
        assert posts(eng) == ["/sleep?level=1", "/wake_up?tags=weights", "/wake_up?tags=kv_cache"]
        assert eng.weights_valid and not eng.prefix_cache_stale


def test_vllm_level2_wake_reloads_the_weights_then_resets_the_prefix_cache() -> None:
    with FakeEngine("vllm") as eng, client() as c:
        c.sleep(eng.url, "vllm", 2)
        assert eng.host_ram_mib == 0  # level 2 keeps nothing in host RAM
        assert not eng.weights_valid
        done = c.wake(eng.url, "vllm", timeout_s=10)
        assert not eng.weights_valid and eng.prefix_cache_stale  # awake, not yet reloaded
        done += c.reload(eng.url, "vllm", timeout_s=10)
        assert done == [
            "POST /wake_up?tags=weights",
            "POST /wake_up?tags=kv_cache",
            "POST /collective_rpc",
            "POST /reset_prefix_cache",
        ]
        rpc = next(r for r in eng.calls if r.path == "/collective_rpc")
        assert rpc.json == {"method": "reload_weights"}
        assert eng.weights_valid and not eng.prefix_cache_stale
        assert c.is_sleeping(eng.url, "vllm") is False


def test_vllm_without_dev_mode_answers_404_which_is_not_enabled() -> None:
    with FakeEngine("vllm", enabled=False) as eng, client() as c:
        with pytest.raises(SleepNotEnabledError) as exc:
            c.sleep(eng.url, "vllm", 1)
        assert exc.value.status == 404 and not exc.value.transient
        assert "not started with its sleep flag" in str(exc.value)
        assert "Not Found" in str(exc.value)
        with pytest.raises(SleepNotEnabledError):
            c.is_sleeping(eng.url, "vllm")
        with pytest.raises(SleepNotEnabledError):
            c.wake(eng.url, "vllm", timeout_s=5)
        assert eng.used_mib == eng.full_mib


@pytest.mark.parametrize("protocol", ["vllm", "sglang"])
def test_either_engine_answers_its_sleep_before_the_memory_is_freed(protocol: str) -> None:
    # the stand-in's default, as the real engines may (docs/protocols.md)
    dev = FakeDevice(uuid="GPU-a")
    with FakeEngine(protocol, device=dev) as eng, client() as c:
        c.sleep(eng.url, protocol, 1)
        assert eng.is_sleeping
        assert dev.used == eng.full_mib * MIB  # answered, not freed yet
        wait_until(lambda: dev.used == eng.residual_mib * MIB)


def test_vllm_sleep_aborts_requests_in_flight() -> None:
    with FakeEngine("vllm") as eng, client() as c:
        eng.set_in_flight(3)
        c.sleep(eng.url, "vllm", 1)
        assert eng.aborted == 3 and eng.in_flight == 0


def test_vllm_sleep_twice_and_wake_when_awake_change_nothing() -> None:
    with FakeEngine("vllm") as eng, client() as c:
        c.wake(eng.url, "vllm", timeout_s=5)
        assert eng.used_mib == eng.full_mib
        c.sleep(eng.url, "vllm", 1)
        c.sleep(eng.url, "vllm", 2)  # already asleep: level 1 stays
        assert eng.level == 1 and eng.weights_valid


def test_vllm_wake_waits_for_the_engine() -> None:
    with FakeEngine("vllm", wake_s=0.3) as eng, client() as c:
        c.sleep(eng.url, "vllm", 1)
        t0 = time.monotonic()
        c.wake(eng.url, "vllm", timeout_s=10)
        assert time.monotonic() - t0 >= 0.6  # two wakes (weights, kv_cache), each awaited
        assert eng.used_mib == eng.full_mib


def test_vllm_wake_that_outlasts_its_bound_is_no_answer() -> None:
    with FakeEngine("vllm", wake_s=2.0) as eng, client() as c:
        c.sleep(eng.url, "vllm", 1)
        with pytest.raises(SleepError) as exc:
            c.wake(eng.url, "vllm", timeout_s=0.3)
        assert exc.value.transient and "no answer within 0.3s" in str(exc.value)


def test_vllm_error_answers_carry_the_engines_message() -> None:
    with FakeEngine("vllm") as eng, client() as c:
        eng.force("/collective_rpc", (400, {"detail": "Missing 'method' in request body"}))
        c.sleep(eng.url, "vllm", 2)
        c.wake(eng.url, "vllm", timeout_s=5)
        with pytest.raises(SleepError) as exc:
            c.reload(eng.url, "vllm", timeout_s=5)
        assert exc.value.status == 400
        assert "/collective_rpc answered 400: Missing 'method' in request body" in str(exc.value)
        assert not eng.weights_valid
        c.sleep(eng.url, "vllm", 1)
        eng.force("/wake_up", (500, "Internal Server Error"))
        with pytest.raises(SleepError, match="answered 500: Internal Server Error"):
            c.wake(eng.url, "vllm", timeout_s=5)
        # the weights were not woken: the engine still says it sleeps
        assert c.is_sleeping(eng.url, "vllm") is True


def test_vllm_engine_checks_what_it_is_sent() -> None:
    with FakeEngine("vllm") as eng:
        r = httpx.post(eng.url + "/collective_rpc", json={})
        assert r.status_code == 400 and r.json() == {"detail": "Missing 'method' in request body"}
        r = httpx.post(eng.url + "/sleep?level=x")
        assert r.status_code == 500
        assert httpx.post(eng.url + "/sleep?level=1").content == b""


def test_unreachable_engine_is_retried_then_transient() -> None:
    port = free_port()
    with client() as c, pytest.raises(SleepError) as exc:
        c.is_sleeping(f"http://127.0.0.1:{port}", "vllm")
    assert exc.value.transient and exc.value.attempts == 3


def test_a_connection_refused_once_is_retried_into_success() -> None:
    eng = FakeEngine("vllm")
    eng.bind_port = free_port()
    url = f"http://127.0.0.1:{eng.bind_port}"
    import threading

    threading.Timer(0.15, eng.start).start()
    try:
        c = SleepClient(attempts=10, max_wait_s=5, initial_wait_s=0.1)
        assert c.sleep(url, "vllm", 1) == "POST /sleep?level=1"
        c.close()
    finally:
        wait_until(lambda: eng._server is not None)
        eng.stop()


# ── SGLang ────────────────────────────────────────────────────────────────────


def test_sglang_release_and_resume_send_both_tags() -> None:
    dev = FakeDevice(uuid="GPU-b")
    with FakeEngine("sglang", device=dev) as eng, client() as c:
        assert c.sleep(eng.url, "sglang", 1) == "POST /release_memory_occupation"
        wait_until(lambda: dev.used == eng.residual_mib * MIB)
        assert c.is_sleeping(eng.url, "sglang") is None  # SGLang cannot say
        assert c.wake(eng.url, "sglang", timeout_s=5) == ["POST /resume_memory_occupation"]
        assert dev.used == eng.full_mib * MIB
        bodies = [r.json for r in eng.calls if r.method == "POST"]
        assert bodies == [{"tags": ["kv_cache", "weights"]}] * 2


def test_sglang_release_refuses_while_requests_run() -> None:
    with FakeEngine("sglang") as eng, client() as c:
        eng.set_in_flight(1)
        with pytest.raises(SleepError) as exc:
            c.sleep(eng.url, "sglang", 1)
        assert exc.value.busy and exc.value.transient and exc.value.status == 400
        assert SGLANG_IDLE_MESSAGE in str(exc.value)
        assert eng.used_mib == eng.full_mib


def test_sglang_without_the_memory_saver_answers_as_if_it_had_released() -> None:
    # the adapter cannot tell: the release looks done and SGLang cannot be asked; only
    # the device shows nothing came back (tests/e2e/test_sleep_executor.py: stopped instead)
    with FakeEngine("sglang", enabled=False) as eng, client() as c:
        assert c.sleep(eng.url, "sglang", 1) == "POST /release_memory_occupation"
        assert c.is_sleeping(eng.url, "sglang") is None
        assert [r.path for r in eng.calls] == ["/release_memory_occupation"]


def test_sglang_resume_of_what_was_not_released_is_refused() -> None:
    with FakeEngine("sglang") as eng, client() as c:
        with pytest.raises(SleepError) as exc:
            c.wake(eng.url, "sglang", timeout_s=5)
        assert exc.value.status == 400 and not exc.value.busy


def test_engine_health_follows_load_and_restart() -> None:
    with FakeEngine("vllm", load_s=3600) as eng:  # loading until the test says it loaded
        assert httpx.get(eng.url + "/health").status_code == 503
        eng.loaded_at = time.monotonic()  # its weights are in
        wait_until(lambda: httpx.get(eng.url + "/health").status_code == 200)
        with client() as c:
            c.sleep(eng.url, "vllm", 1)
            assert httpx.get(eng.url + "/health").status_code == 200  # asleep, alive
            eng.restart()  # the container restarted: awake and full
            assert c.is_sleeping(eng.url, "vllm") is False
            assert eng.used_mib == eng.full_mib


def test_bad_arguments_are_refused_before_anything_is_sent() -> None:
    with client() as c:
        with pytest.raises(ValueError, match="protocol"):
            c.sleep("http://127.0.0.1:1", "tgi", 1)
        with pytest.raises(ValueError, match="level"):
            c.sleep("http://127.0.0.1:1", "vllm", 3)
