"""What a failed start says about its budget: a hint from how the engine died and its own
last words (docs/operations.md, "A start that fails for memory").

:func:`memory_hint` reads whether the container was OOM-killed and the tail of its log,
and where either says the engine ran out of memory at load, returns the sentence the
failed step carries: the reservation may be below what the engine needs, and which
commands say how much (``render`` from the model's files, ``calibrate`` from measured
runs). The engines' own words are a small table (:data:`OUT_OF_MEMORY`), each with the
engine whose source prints it.

Pure: no I/O; it never decides, it only explains.
"""

from __future__ import annotations

__all__ = ["OUT_OF_MEMORY", "memory_hint"]

#: lower-cased phrases an engine prints when an allocation at load fails, and whose
OUT_OF_MEMORY: tuple[tuple[str, str], ...] = (
    ("cudamalloc failed: out of memory", "llama.cpp (ggml-cuda.cu)"),
    ("failed to allocate", "llama.cpp (src/llama-model.cpp, llama-kv-cache.cpp)"),
    ("cuda out of memory", "PyTorch (vLLM, SGLang)"),
    ("no available memory for the cache blocks", "vLLM (v1/core/kv_cache_utils.py)"),
    ("not enough memory", "SGLang (model_runner.py)"),
)


def memory_hint(
    serve: str, vram_mib: int | None, *, oom_killed: bool, logs: str | None
) -> str | None:
    """The hint for a start that failed for memory, or None where nothing says so."""
    text = (logs or "").lower()
    said = next((who for phrase, who in OUT_OF_MEMORY if phrase in text), None)
    if not oom_killed and said is None:
        return None
    why = "it was killed for memory" if oom_killed else f"its engine ran out of memory ({said})"
    given = f"its reservation ({vram_mib} MiB)" if vram_mib is not None else "what it was given"
    return (
        f"{serve}: {why} while loading: {given} may be below what it needs; "
        f"`vramctl render {serve}` shows what its model's files need, and `vramctl calibrate` "
        "proposes a vram_mib from what its runs measured"
    )
