"""vLLM (docs/protocols.md): ``vllm serve``; ``--gpu-memory-utilization`` and, for a serve
with ``[serve.model]``, ``--max-model-len``; the sleep API
of ``--enable-sleep-mode`` with ``VLLM_SERVER_DEV_MODE=1`` (development endpoints:
without the variable they answer 404). Pure data."""

from __future__ import annotations

from statemachine.engines.spec import (
    Detection,
    Engine,
    HttpCall,
    LimitFlag,
    LimitKind,
    MemoryFlag,
    SleepApi,
)

FLAG = "--gpu-memory-utilization"
CONTEXT_FLAG = "--max-model-len"
SLEEP_FLAG = "--enable-sleep-mode"
SLEEP_ENV = "VLLM_SERVER_DEV_MODE"

ENGINE = Engine(
    name="vllm",
    display="vLLM",
    detection=Detection(
        commands=(("vllm", "serve"),),
        modules=("vllm.entrypoints",),
        image_words=("vllm",),
    ),
    sizes_from_free=True,
    memory_flag=MemoryFlag(FLAG, default="0.9 or more"),
    sleep=SleepApi(
        # level 1 moves the weights to host RAM and drops the KV cache, level 2 drops both
        sleep=HttpCall("/sleep", level_param="level"),
        wake=(
            HttpCall("/wake_up", params=(("tags", "weights"),)),
            HttpCall("/wake_up", params=(("tags", "kv_cache"),)),
        ),
        # after a level-2 wake the weights are garbage until loaded again
        reload=(
            HttpCall("/collective_rpc", body={"method": "reload_weights"}),
            HttpCall("/reset_prefix_cache"),
        ),
        is_sleeping="/is_sleeping",
        flags=(SLEEP_FLAG,),
        env={SLEEP_ENV: "1"},
    ),
    inflight_metrics=("vllm:num_requests_running", "vllm:num_requests_waiting"),
    limit_flags=(LimitFlag(CONTEXT_FLAG, LimitKind.MAX_CONTEXT),),
)
