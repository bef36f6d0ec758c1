"""llama.cpp's server (docs/protocols.md): ``llama-server``; no memory-fraction flag, no
sleep API; its in-flight metrics. For a serve with ``[serve.model]`` (a GGUF file):
``--n-gpu-layers`` and ``--ctx-size``, and ``--cache-type-k``/``--cache-type-v`` where its
``kv_dtype`` is not llama.cpp's default f16 (:mod:`statemachine.enforce`). Pure data."""

from __future__ import annotations

from statemachine.engines.spec import (
    CacheTypeFlag,
    CacheTypes,
    Detection,
    Engine,
    LimitFlag,
    LimitKind,
)

LAYERS_FLAG = "--n-gpu-layers"
CONTEXT_FLAG = "--ctx-size"
#: llama.cpp's common/arg.cpp: ``-ctk, --cache-type-k TYPE`` (env LLAMA_ARG_CACHE_TYPE_K),
#: ``-ctv, --cache-type-v TYPE`` (LLAMA_ARG_CACHE_TYPE_V); f16 where unset
CACHE_TYPE_K_FLAG = "--cache-type-k"
CACHE_TYPE_V_FLAG = "--cache-type-v"
CACHE_TYPE_DEFAULT = "f16"

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
        LimitFlag(LAYERS_FLAG, LimitKind.GPU_LAYERS, ("-ngl", "--gpu-layers")),
        LimitFlag(CONTEXT_FLAG, LimitKind.CONTEXT_SIZE, ("-c",)),
    ),
    cache_types=CacheTypes(
        flags=(
            CacheTypeFlag(CACHE_TYPE_K_FLAG, "keys", ("-ctk",), "LLAMA_ARG_CACHE_TYPE_K"),
            CacheTypeFlag(CACHE_TYPE_V_FLAG, "values", ("-ctv",), "LLAMA_ARG_CACHE_TYPE_V"),
        ),
        default=CACHE_TYPE_DEFAULT,
    ),
)
