"""The limit flags at their boundaries (statemachine/enforce.py): a figure that fits
exactly fits, one byte more does not; suffixed values read exactly as the engines read
them; the last of repeated flags wins. Pure: statemachine only."""

from __future__ import annotations

from test_enforce_arithmetic import GIB, llama, model, one

from statemachine import engines
from statemachine.enforce import check_elastic, check_limit, render_elastic, render_limits
from statemachine.engine_flags import FindingKind
from statemachine.sizing import MIB


def test_weights_exactly_the_reservation_leave_no_token_rather_than_exceed_it() -> None:
    (limit,) = one("vllm", 16 * 1024, model(16 * GIB))
    assert limit.refused and "not one token's KV cache" in str(limit.problem)
    (over,) = one("vllm", 16 * 1024, model(16 * GIB + 1))
    assert over.refused and "exceed the reservation by 1 bytes" in str(over.problem)


def test_a_declared_context_that_is_exactly_the_limit_fits() -> None:
    (limit,) = one("vllm", 20000, model(context=28928))
    assert limit.value == 28928 and "does not fit" not in limit.explanation
    (more,) = one("vllm", 20000, model(context=28929))
    assert "the declared context 28929 does not fit" in more.explanation


def test_weights_and_kv_exactly_the_reservation_put_every_layer_on_the_gpu() -> None:
    m = llama((100 * MIB,) * 4, 50 * MIB)  # 450 MiB of weights + 16 MiB of KV
    (layers, _) = one("llamacpp", 466, m)
    assert layers.value == 5  # all 4 and the output layer
    (fewer, _) = one("llamacpp", 465, m)
    assert fewer.value == 3  # 50 + 3 × 104 = 362 ≤ 465 < 466


def test_the_tensors_of_no_layer_exactly_the_reservation_fit_with_no_layer() -> None:
    (layers, _) = one("llamacpp", 50, llama((100 * MIB,) * 4, 50 * MIB))
    assert (layers.value, layers.refused) == (0, False)


def test_a_layer_that_fits_exactly_is_counted_and_one_more_is_named_by_its_own_bytes() -> None:
    # the last layer 150 MiB + 4 MiB of KV beside 50 MiB: exactly 204 MiB
    m = llama((100 * MIB, 120 * MIB, 110 * MIB, 150 * MIB), 50 * MIB)
    (layers, _) = one("llamacpp", 204, m)
    assert layers.value == 1
    # one layer more is the third (110 MiB), not the second: 204 + 110 + 4 = 318 MiB
    assert f"one layer more: {318 * MIB} bytes > {204 * MIB}" in layers.explanation


def test_without_a_model_only_the_flags_that_need_none_are_rendered() -> None:
    assert render_limits(engines.get("vllm"), 20000, None) == ()
    assert render_limits(engines.get("llamacpp"), 20000, None) == ()
    (unread,) = render_limits(engines.get("vllm"), 20000, "m.gguf: no such file")
    assert unread.value is None and "m.gguf: no such file" in str(unread.problem)


def test_every_suffix_reads_its_exact_multiple() -> None:
    (limit,) = one("vllm", 20000, model())  # 28928 tokens
    # 28.928k, 28.25K, 0.028928m and 0.027587890625M are each exactly 28928
    for exact in ("28.928k", "28.25K", "0.028928m", "0.027587890625M", "0k", "0"):
        assert check_limit(limit, exact, serve="s") is None, exact
    for bad in ("-0.001k", "28.9281k"):
        got = check_limit(limit, bad, serve="s")
        assert got is not None and got.kind is FindingKind.BAD_VALUE, bad


def test_the_elastic_configuration_holds_the_segment_and_the_flag_switches_it_on() -> None:
    config = engines.get("strata").elastic
    assert config is not None
    want = render_elastic(config, 1024)
    assert want.to_json()["config"] == {config.key: True, config.segment_key: 1024}
    assert want.to_json()["argv"] == ["--vram-elastic"]
    for on in (["--vram-elastic"], ["--vram_elastic=true"], ["--vram-elastic=ON"]):
        assert [f.kind for f in check_elastic(want, on, serve="moe")] == [
            FindingKind.ELASTIC_SEGMENT_UNREAD
        ], on
    for off in (["--vram-elastic=0"], ["--vram-elasticity"], []):
        assert [f.kind for f in check_elastic(want, off, serve="moe")] == [
            FindingKind.ELASTIC_OFF
        ], off
