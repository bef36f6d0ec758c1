"""vLLM (docs/protocols.md): ``vllm serve``; ``--gpu-memory-utilization`` and, for a serve
with ``[serve.model]``, ``--max-model-len``; the sleep API
of ``--enable-sleep-mode`` with ``VLLM_SERVER_DEV_MODE=1`` (development endpoints:
without the variable they answer 404). Pure data.

Its memory, as vLLM's source counts it (vllm-project/vllm, ``vllm/v1``):

* the fraction is of the device total, and everything it loads lives within it:
  ``requested_memory = total × gpu_memory_utilization``, the KV cache gets what the
  weights and the profiled activations leave (``worker/gpu_worker.py``,
  ``determine_available_memory``): the limits are computed in that budget;
* ``--max-model-len`` must fit one request in whole 16-token blocks, less the null block
  the block pool keeps back (``core/kv_cache_utils.py``, ``check_enough_kv_cache_memory``);
  ``auto`` and ``-1`` make vLLM fit it itself after profiling (``_auto_fit_max_model_len``);
* a sliding-window layer keeps ``cdiv(min(sliding_window − 1 + max_num_batched_tokens,
  max_model_len), block_size) + 1`` blocks (``kv_cache_interface.py``,
  ``SlidingWindowSpec.max_memory_usage_bytes``); ``max_num_batched_tokens`` is 8192 for
  ``vllm serve`` on a card of 70 GiB or more and 2048 below (``engine/arg_utils.py``,
  ``get_batch_defaults``): 8192 is counted unless the command sets it;
* a hybrid model's layers are grouped, each kind padded to a multiple of one group size
  (the smaller kind's count, or the larger's under 1.25 × it:
  ``_get_kv_cache_groups_uniform_page_size``).

Its sleep API, flags and in-flight metrics are checked against vllm-project/vllm at commits
09cb327, 005a810 and 01181dd (tests/shell/test_standin_contract.py)."""

from __future__ import annotations

from statemachine.engines.spec import (
    CacheTypeFlag,
    CacheTypes,
    Detection,
    Engine,
    HttpCall,
    KvLayout,
    LimitFlag,
    LimitKind,
    MemoryFlag,
    SleepApi,
)

FLAG = "--gpu-memory-utilization"
CONTEXT_FLAG = "--max-model-len"
SLEEP_FLAG = "--enable-sleep-mode"
SLEEP_ENV = "VLLM_SERVER_DEV_MODE"
BATCH_FLAG = "--max-num-batched-tokens"
#: ``--kv-cache-dtype`` (vllm/config/cache.py ``CacheDType``): ``auto`` stores the model's
#: own type; ``fp8`` is ``fp8_e4m3`` on CUDA
CACHE_DTYPE_FLAG = "--kv-cache-dtype"
CACHE_TYPES = CacheTypes(
    flags=(CacheTypeFlag(CACHE_DTYPE_FLAG, "keys and values"),),
    default="bf16",
    stores=("f16", "bf16", "fp8", "fp8_e4m3", "fp8_e5m2"),
    default_also=("f16",),
    words={"f16": "auto", "bf16": "auto"},
    reads={"auto": "bf16", "bfloat16": "bf16"},
)

#: vLLM's KV cache layout (the module's docstring says where each figure is from)
KV_LAYOUT = KvLayout(
    granule=16,
    reserved_granules=1,
    batch_tokens=8192,
    batch_flag=BATCH_FLAG,
    window_offset=-1,
    window_granules=1,
    grouped=True,
    source="vllm/v1/core/kv_cache_utils.py, vllm/v1/kv_cache_interface.py",
)

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
    limit_flags=(LimitFlag(CONTEXT_FLAG, LimitKind.MAX_CONTEXT, fits_itself=("auto", "-1")),),
    kv_layout=KV_LAYOUT,
    out_of_memory=(
        ("cuda out of memory", "PyTorch's OutOfMemoryError"),
        ("no available memory for the cache blocks", "vllm/v1/core/kv_cache_utils.py"),
    ),
    budget_from_flag=True,
    cache_types=CACHE_TYPES,
)
