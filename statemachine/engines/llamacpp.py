"""llama.cpp's server (docs/protocols.md): ``llama-server``; no memory flag vramctl can
render, no sleep API; its in-flight metrics. Pure data."""

from __future__ import annotations

from statemachine.engines.spec import Detection, Engine

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
)
