"""What the real llama.cpp server does with a wrong budget, and what vramctl says of it.

Each case is a serve whose flags come from ``vramctl render`` (tests/engine_oracle.py),
run on the real ``llama-server`` (tests/docker/ensure-engine.sh):

* a reservation below the model's weights + KV cache: render gives a partial offload
  (``--n-gpu-layers`` below every layer) that loads; a CPU build has no GPU, so the
  engine says it ignores the layer count and holds everything on the host, the figures
  the estimate gives;
* a context above the model's own: render's explanation quotes the warning the engine
  prints, and the engine allocates the whole context;
* a cache type the engine does not have, written into the command by hand: ``lint``
  refuses it, and the start ``vramctl run`` makes fails with the engine's own words;
* a container memory limit the engine cannot load in: the kernel kills it while it
  loads, and the failed start says it was host memory, not the card, and what to do;
* an allocation the engine itself sees fail (a data-segment limit, as a full card would
  make ``cudaMalloc`` fail): the start fails in its own words, with what to run
  (``render``, ``calibrate``).
"""

from __future__ import annotations

from pathlib import Path

import docker
import pytest
from compose_stack import ComposeStack
from engine_models import SHAPES, write
from engine_oracle import MIB, Case, estimate, load_figures, manifest, render_flags
from test_real_engine_e2e import ROLE, engine_command, llama_serve, rendered, stack
from test_run_e2e import Fleet, fleet, vramctl

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.xdist_group("real-engine")]
__all__ = ["fleet", "stack"]  # the fixtures, used by name


def test_a_reservation_below_the_model_renders_a_partial_offload_that_loads(
    engine_image: str, docker_client: docker.DockerClient, tmp_path: Path
) -> None:
    model = write(SHAPES["plain"], tmp_path / "plain.gguf")
    case = Case("plain", 1024, 1, "f16")
    small = vramctl("render", "chat", "-m", str(manifest(tmp_path, model, case, vram_mib=8)))
    assert small.returncode == 0, small.stdout + small.stderr
    assert small.stdout.split()[:2] == ["--n-gpu-layers", "4"]  # 3 layers and the output
    assert "weights + KV cache 9711616 bytes > 8388608" in small.stderr
    assert "the other 1 run on the CPU" in small.stderr
    figures = load_figures(docker_client, engine_image, model, small.stdout.split())
    assert "no usable GPU found, --gpu-layers option will be ignored" in figures.log
    est = estimate(model, case)
    assert (figures.model_mib, figures.kv_mib) == (
        round(est["weights_bytes"] / MIB, 2),
        round(est["kv_cache_bytes"] / MIB, 2),
    )


def test_a_context_above_the_models_own_is_allocated_with_the_warning_render_quotes(
    engine_image: str, docker_client: docker.DockerClient, tmp_path: Path
) -> None:
    model = write(SHAPES["plain"], tmp_path / "plain.gguf")  # trained at 2048
    case = Case("plain", 8192, 1, "f16")
    flags = render_flags(tmp_path, model, case)
    said = vramctl("render", "chat", "-m", str(tmp_path / f"{case.id}.toml")).stderr
    words = "n_ctx_seq (8192) > n_ctx_train (2048) -- possible training context overflow"
    assert f'llama.cpp allocates it and warns "{words}"' in said
    figures = load_figures(docker_client, engine_image, model, flags)
    assert words in figures.log  # the engine's own line
    assert figures.kv_cells == 8192


def test_a_cache_type_the_engine_lacks_is_refused_by_lint_and_fails_the_start_in_its_words(
    fleet: Fleet, stack: ComposeStack
) -> None:
    models = fleet.tmp / "models"
    write(SHAPES["plain"], models / "plain.gguf")
    bad = stack.add("bad")
    fleet.manifest.write_text(
        ROLE
        + llama_serve(
            stack,
            "bad",
            model="plain",
            context=1024,
            residency="evictable",
            extra='desired = "running"',
        )
    )
    argv = engine_command("plain", bad.port, rendered(fleet, "bad"))
    bad.command, bad.volumes = (*argv, "--cache-type-k", "q3_k"), (f"{models}:/models:ro",)
    stack.write()
    lint = vramctl("lint", "-m", str(fleet.manifest), "--compose", str(stack.file))
    assert lint.returncode == 1, lint.stdout + lint.stderr
    assert "cache-type-disagrees" in lint.stdout and "q3_k is not one of" in lint.stdout

    run = fleet.start().started()
    run.wait_step("bad await_ready failed")
    assert "exited (1) while starting" in run.text()
    assert "Unsupported cache type: q3_k" in run.text()  # the engine's own words
    assert run.stop() == 0, run.text()


def test_a_start_killed_for_memory_says_so_and_what_to_run(
    fleet: Fleet, stack: ComposeStack
) -> None:
    """A 48 MiB container memory limit for a model whose 32768-token KV cache alone is
    128 MiB (zero-filled at load, no swap): killed by the kernel, whatever the load."""
    models = fleet.tmp / "models"
    write(SHAPES["long"], models / "long.gguf")
    big = stack.add("big")
    fleet.manifest.write_text(
        ROLE
        + llama_serve(
            stack,
            "big",
            model="long",
            context=32768,
            residency="evictable",
            extra='desired = "running"',
        )
    )
    big.command = engine_command("long", big.port, rendered(fleet, "big"))
    big.volumes, big.mem_limit = (f"{models}:/models:ro",), "48m"
    stack.write()
    run = fleet.start().started()
    run.wait_step("big await_ready failed")
    text = run.text()
    # Docker's OOMKilled, or exit 137 where the kernel's event came too late to say
    assert "was OOM-killed while starting" in text or "exited (137) while starting" in text
    assert "big: it was killed " in text
    assert "while loading: host memory, not the card's (its container's memory limit" in text
    assert "`vramctl render big` shows what its files need" in text
    assert run.stop() == 0, text


def test_an_allocation_the_engine_sees_fail_fails_the_start_in_its_words_with_calibrate(
    fleet: Fleet, stack: ComposeStack
) -> None:
    """A data-segment limit of about 170 MB: the engine's 128 MiB KV cache cannot be
    allocated, and llama.cpp says so and exits, as a full card makes its cudaMalloc fail
    (its words are the same: "failed to allocate buffer for kv cache"); the step quotes
    its first line naming the failure."""
    models = fleet.tmp / "models"
    write(SHAPES["long"], models / "long.gguf")
    kv = stack.add("kv")
    fleet.manifest.write_text(
        ROLE
        + llama_serve(
            stack,
            "kv",
            model="long",
            context=32768,
            residency="evictable",
            extra='desired = "running"',
        )
    )
    kv.command = engine_command("long", kv.port, rendered(fleet, "kv"))
    kv.volumes, kv.ulimits = (f"{models}:/models:ro",), {"data": 170_000_000}
    stack.write()
    run = fleet.start().started()
    run.wait_step("kv await_ready failed")
    text = run.text()
    # the engine's own first words of the failure
    assert "exited (1) while starting: " in text
    assert "insufficient memory (attempted to allocate 128.00 MB)" in text
    assert (
        "kv: its engine ran out of device memory while loading (src/llama-model.cpp, "
        "src/llama-kv-cache.cpp): its reservation (6000 MiB) may be below what it needs; "
        "`vramctl render kv` shows what its model's files need, and `vramctl calibrate` "
        "proposes a vram_mib from what its runs measured"
    ) in text
    assert run.stop() == 0, text
