"""onnx-genai's server (docs/protocols.md): ``onnx-genai serve`` / ``onnx-genai-server``;
``--vram-limit``, a limit the engine keeps at load (it derives its weight offload from
``limit − device state`` and fails at load, with its arithmetic, when the model cannot
fit), or ``ONNX_GENAI_VRAM_LIMIT`` without the flag; no sleep API. Pure data.

As its source reads the limit (``parse_resource_limit``): a count of bytes, a number with
``KiB``/``MiB``/``GiB`` or ``KB``/``MB``/``GB``, a fraction in [0, 1] of the device's
capacity, or ``auto`` (0.90 of it); the limit is the ceiling for its weights and KV
cache, not its CUDA context, activations or runtime (its server's ``--vram-limit``
help): vramctl renders ``vram_mib`` less the serve's declared ``engine_overhead_mib``."""

from __future__ import annotations

from statemachine.engines.spec import Detection, Engine, LimitFlag, LimitKind

LIMIT_FLAG = "--vram-limit"
#: what the server reads when the flag is not given
LIMIT_ENV = "ONNX_GENAI_VRAM_LIMIT"

ENGINE = Engine(
    name="onnx-genai",
    display="onnx-genai",
    aliases=("onnxgenai", "onnx-genai-server"),
    detection=Detection(
        commands=(("onnx-genai", "serve"),),
        programs=("onnx-genai-server",),
        image_words=("onnx-genai",),
    ),
    limit_flags=(LimitFlag(LIMIT_FLAG, LimitKind.VRAM_BYTES, env=LIMIT_ENV, from_free=("auto",)),),
)
