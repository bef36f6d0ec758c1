"""llama.cpp's server (docs/protocols.md): ``llama-server``; no memory-fraction flag, no
sleep API; its in-flight metrics. For a serve with ``[serve.model]`` (a GGUF file):
``--n-gpu-layers`` and ``--ctx-size`` (:mod:`statemachine.enforce`). Pure data."""

from __future__ import annotations

from statemachine.engines.spec import Detection, Engine, LimitFlag, LimitKind

LAYERS_FLAG = "--n-gpu-layers"
CONTEXT_FLAG = "--ctx-size"

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
)
