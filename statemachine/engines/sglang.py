"""SGLang (docs/protocols.md): ``sglang serve`` / ``python -m sglang.launch_server``;
``--mem-fraction-static``; ``--kv-cache-dtype``; the memory-saver API of
``--enable-memory-saver``, which cannot say whether the engine sleeps. Pure data.

Its memory, as SGLang's source counts it (sgl-project/sglang,
``python/sglang/srt/model_executor/model_runner.py``): ``--mem-fraction-static`` is a
fraction of the memory free when it starts (``pre_model_load_memory``, from
``get_available_gpu_memory``, the least of its GPUs), and the KV pool is what the weights
leave of that share (``profile_max_num_token``: ``rest = available − free_at_start × (1 −
fraction)``): on a shared card a fraction of the device total gives it less than its
reservation, or more. It is rendered as ``${VRAMCTL_FRACTION_OF_FREE}``, which each start
sets to ``vram_mib ÷`` the MiB free then (statemachine/ledger/gpu_vars.py). ``--context-length``
bounds no memory (the pool is sized by the fraction; a longer context is capped at it):
it is not rendered as a limit.

Its memory-saver API, flag and in-flight metrics are checked against sgl-project/sglang at
commits 9c0549b, c20e3fe, 123c0bc, 00ae9c1 and 067bfe9 (tests/shell/test_standin_contract.py)."""

from __future__ import annotations

from statemachine.engines.spec import (
    CacheTypeFlag,
    CacheTypes,
    Detection,
    Engine,
    HttpCall,
    MemoryFlag,
    SleepApi,
)

#: what a release and a resume act on: the KV cache and the weights. SGLang has more
#: (``srt/constants.py``: ``cuda_graph``, ``weights_drafter``; a call without tags acts
#: on all of them): those stay on the device while it sleeps, part of its residual_mib
TAGS = ("kv_cache", "weights")

FLAG = "--mem-fraction-static"
CONTEXT_FLAG = "--context-length"
SLEEP_FLAG = "--enable-memory-saver"
#: ``--kv-cache-dtype`` (python/sglang/srt/server_args.py): ``auto`` stores the model's
#: own type; ``fp8_e5m2`` and ``fp8_e4m3`` an 8-bit float
CACHE_DTYPE_FLAG = "--kv-cache-dtype"
CACHE_TYPES = CacheTypes(
    flags=(CacheTypeFlag(CACHE_DTYPE_FLAG, "keys and values"),),
    default="bf16",
    stores=("f16", "bf16", "fp8_e4m3", "fp8_e5m2"),
    default_also=("f16",),
    words={"f16": "auto", "bf16": "auto"},
    reads={"auto": "bf16", "bfloat16": "bf16"},
)

ENGINE = Engine(
    name="sglang",
    display="SGLang",
    detection=Detection(
        commands=(("sglang", "serve"),),
        modules=("sglang.launch_server",),
        image_words=("sglang",),
    ),
    sizes_from_free=True,
    memory_flag=MemoryFlag(FLAG, of_free=True),
    out_of_memory=(
        ("cuda out of memory", "PyTorch's OutOfMemoryError"),
        ("not enough memory", "python/sglang/srt/model_executor/model_runner.py"),
    ),
    sleep=SleepApi(
        sleep=HttpCall("/release_memory_occupation", body={"tags": list(TAGS)}),
        wake=(HttpCall("/resume_memory_occupation", body={"tags": list(TAGS)}),),
        flags=(SLEEP_FLAG,),
    ),
    inflight_metrics=("sglang:num_running_reqs", "sglang:num_queue_reqs"),
    cache_types=CACHE_TYPES,
)
