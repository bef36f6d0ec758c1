"""The limit flags that hold an engine to its reservation, from the model's files
(docs/design.md §3, docs/sizing.md): every value with the terms it is made of.

Each engine's :class:`~statemachine.engines.spec.LimitFlag` entries name a
:class:`~statemachine.engines.spec.LimitKind`; :data:`_RENDER` computes each kind:

* ``max-context`` (vLLM ``--max-model-len``, SGLang ``--context-length``): the largest
  context whose KV cache, at the serve's ``kv_dtype`` and ``parallel`` sequences and as
  the engine lays it out (:mod:`statemachine.sizing.kv_layout`), fits the reservation (or the
  budget the engine's memory flag gives it, where smaller) less the weights; capped at
  the serve's declared context (it asks no more) or else the model's own context length;
  refused when the weights alone exceed the reservation, and when the declared context
  does not fit (the serve would not get what it declares).
* ``gpu-layers`` (llama.cpp ``--n-gpu-layers``): every layer and the output layer (the
  layer count + 1, as llama.cpp counts them) when weights + KV fit; else the largest N
  whose last N layers (llama.cpp offloads the last ones) and their KV fit beside the
  tensors of no layer, counted on the GPU (an upper bound: llama.cpp keeps the token
  embeddings on the CPU); refused when not even those fit.
* ``context-size`` (llama.cpp ``--ctx-size``): the serve's context (default the model's)
  × its parallel sequences, which llama-server shares among its slots.
* ``vram-bytes`` (onnx-genai ``--vram-limit``): (``vram_mib`` − ``engine_overhead_mib``)
  × 1048576: the engine's limit holds its weights and KV cache, not its CUDA context,
  activations nor runtime; unknown while the overhead is undeclared. Lint reads it as
  the engine does: bytes, ``KiB``/``MiB``/``GiB``/``KB``/``MB``/``GB``, a fraction of
  the device, ``auto`` (sized from the device, not the reservation).

A serve on several GPU roles reserves ``vram_mib`` on each: its engine splits weights and
KV heads among them (tensor parallel), so the context and layer limits count the
reservation on all of them; ``--vram-limit`` is one device's.

A kind that needs the model is not rendered for a serve without ``[serve.model]``: such
a serve keeps only its memory-fraction flag, as before. What no file holds (the CUDA
context, activations, CUDA graphs) is not subtracted, and each explanation says so.
The elastic engine (:func:`render_elastic`, :func:`check_elastic`) needs its flag on the
command line and the manifest's ``elastic.segment_mib`` in its configuration, which is
the only place the engine reads the segment from. The KV cache above is sized at
``[serve.model]`` ``kv_dtype``; an engine with :class:`~statemachine.engines.spec.CacheTypes`
(llama.cpp's ``--cache-type-k``/``--cache-type-v``) gets them where that is not its default
(:func:`render_cache_types`), and a command storing another type is an error naming how
much larger or smaller its cache is (:func:`check_cache_types`).

Pure: no I/O, nothing from ``controller``; integers and exact fractions only.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from typing import Any

from statemachine.engines.spec import (
    CacheTypeFlag,
    CacheTypes,
    ElasticConfig,
    Engine,
    KvLayout,
    LimitFlag,
    LimitKind,
    SelfSleep,
)
from statemachine.flags.fraction import Finding, FindingKind
from statemachine.sizing.kv_layout import EngineKv, engine_kv
from statemachine.sizing.needs import KV_DTYPES, MIB, Architecture, KvTerm, Weights, kv_cache

__all__ = [
    "CacheTypeRender",
    "ElasticRender",
    "Limit",
    "Model",
    "ModelInput",
    "Reserved",
    "check_cache_types",
    "check_elastic",
    "check_limit",
    "fits_to_reservation",
    "found_value",
    "largest_context",
    "render_cache_types",
    "render_elastic",
    "render_limits",
]

#: what the explanations add about the terms no file holds
NOT_SUBTRACTED = (
    "the CUDA context, activations and CUDA graphs are unknown (no file holds them) and "
    "not subtracted: the engine itself refuses to start when they do not fit"
)

#: the longest context searched where the files give none to cap it
_SEARCH_CAP = 1 << 40


@dataclass(frozen=True, slots=True)
class ModelInput:
    """What the limits are computed from: the model's figures (its files') and the
    serve's cache settings (``[serve.model]``: ``context`` ``None`` is the model's own)."""

    weights: Weights
    arch: Architecture
    context: int | None = None
    kv_dtype: str = "f16"
    parallel: int = 1

    def kv(self, context: int, parallel: int | None = None) -> KvTerm:
        """The KV cache at ``context`` tokens per sequence."""
        seqs = self.parallel if parallel is None else parallel
        return kv_cache(self.arch, context=context, kv_dtype=self.kv_dtype, parallel=seqs)

    def laid_out(self, context: int, layout: KvLayout) -> EngineKv:
        """The KV cache at ``context`` tokens per sequence as an engine with ``layout``
        allocates it (:mod:`statemachine.sizing.kv_layout`)."""
        return engine_kv(
            self.arch,
            context=context,
            kv_dtype=self.kv_dtype,
            parallel=self.parallel,
            layout=layout,
        )


#: a model's figures, or why they are unknown (its files could not be read)
Model = ModelInput | str


@dataclass(frozen=True, slots=True)
class Limit:
    """One limit flag's value and its terms; ``value`` ``None``: ``problem`` says why,
    ``refused`` when the model is known not to fit (else the value is unknown).
    ``all_at``: a value from which on every layer is on the GPU (any larger one is the same)."""

    flag: LimitFlag
    value: int | None
    terms: tuple[str, ...]
    problem: str | None = None
    refused: bool = False
    all_at: int | None = None
    #: what the engine reads a value of 0 as (llama.cpp's ``--ctx-size 0``: the model's own)
    zero_means: int | None = None
    #: the device's bytes, which a fraction written for a byte limit is of (unknown: None)
    device_bytes: int | None = None

    @property
    def argv(self) -> tuple[str, ...]:
        """``("--max-model-len", "8192")``, or ``()`` without a value."""
        return () if self.value is None else (self.flag.name, str(self.value))

    @property
    def explanation(self) -> str:
        """The terms in one line, the problem first where there is one."""
        return "; ".join(([self.problem] if self.problem else []) + list(self.terms))

    def to_json(self) -> dict[str, Any]:
        """``{"flag", "kind", "value", "terms", "problem", "refused"}``."""
        return {
            "flag": self.flag.name,
            "kind": self.flag.kind.value,
            "value": self.value,
            "terms": list(self.terms),
            "problem": self.problem,
            "refused": self.refused,
        }


@dataclass(frozen=True, slots=True)
class Reserved:
    """A serve's reservation: ``vram_mib`` on each of its ``gpus`` roles; ``flag_bytes``:
    what the engine's memory flag gives it on one GPU where that bounds its weights and
    KV cache (vLLM's fraction × the device total, rounded down), and how (``flag_text``)."""

    vram_mib: int
    gpus: int = 1
    flag_bytes: int | None = None
    flag_text: str = ""
    #: the engine's use outside its own limit (``engine_overhead_mib``; None: undeclared)
    overhead_mib: int | None = None
    #: the smallest of its devices' totals (for a limit written as a fraction)
    device_mib: int | None = None


def _reservation(reserved: Reserved) -> tuple[int, str]:
    """The bytes the weights and KV cache may take on all its GPUs (a tensor-parallel
    engine splits its weights and KV heads among them), and the term that says so: the
    reservation, or the memory flag's budget where that is smaller."""
    size = reserved.vram_mib * MIB * reserved.gpus
    gpus = "" if reserved.gpus == 1 else f" × {reserved.gpus} GPUs (tensor parallel)"
    term = f"reservation {reserved.vram_mib} MiB × {MIB}{gpus} = {size} bytes"
    flag = reserved.flag_bytes
    if flag is None or flag * reserved.gpus >= size:
        return size, term
    budget = flag * reserved.gpus
    return budget, (
        f"{term}; the engine's budget is its memory flag's, {reserved.flag_text} = "
        f"{flag} bytes{gpus and f' × {reserved.gpus}'} = {budget} bytes (the smaller)"
    )


def _weights_term(weights: Weights) -> str:
    return f"weights {weights.bytes} bytes ({weights.tensors} tensors, read from the files)"


def largest_context(
    model: ModelInput, left: int, cap: int | None, layout: KvLayout | None = None
) -> int:
    """The largest context (≤ ``cap``) whose KV cache, as an engine with ``layout`` lays
    it out (token by token without one), is at most ``left`` bytes; 0 when not one
    token's fits. The KV cache never shrinks as the context grows: a search."""
    low, high = 0, _SEARCH_CAP if cap is None else cap
    while low < high:
        mid = (low + high + 1) // 2
        size = (model.kv(mid) if layout is None else model.laid_out(mid, layout)).bytes
        assert size is not None
        if size <= left:
            low = mid
        else:
            high = mid - 1
    return low


def _refusal(flag: LimitFlag, terms: list[str], why: str) -> Limit:
    return Limit(flag, None, tuple(terms), problem=why, refused=True)


def _unknown(flag: LimitFlag, terms: list[str], why: str) -> Limit:
    return Limit(flag, None, tuple(terms), problem=why)


def _max_context(flag: LimitFlag, budget: Reserved, model: ModelInput, layout: KvLayout) -> Limit:
    """``max-context``: the largest context whose KV cache, as the engine lays it out,
    fits after the weights."""
    size, reserved = _reservation(budget)
    weights = model.weights.bytes
    terms = [reserved, _weights_term(model.weights)]
    if weights > size:
        why = f"the weights alone exceed the reservation by {weights - size} bytes"
        return _refusal(flag, terms, f"cannot load in its reservation: {why}")
    left = size - weights
    terms.append(f"left for the KV cache {size} − {weights} = {left} bytes")
    one = model.laid_out(1, layout)
    if one.bytes is None:
        return _unknown(flag, terms, f"the KV cache is unknown: {one.reason}")
    terms.append(f"KV cache at one token, as the engine lays it out: {one.formula}")
    cap, capped_at = _context_cap(model)
    found = largest_context(model, left, cap, layout)
    if found == 0:
        why = f"not one token's KV cache ({one.bytes} bytes) fits the {left} bytes left"
        return _refusal(flag, terms, f"cannot load in its reservation: {why}")
    terms.append(f"at {found} tokens: {model.laid_out(found, layout).formula} ≤ {left}")
    if found == cap:
        terms.append(f"capped at {capped_at}")
    else:
        more = model.laid_out(found + 1, layout).bytes
        terms.append(f"one token more: {more} bytes > {left}")
    if found != cap and model.context is not None and model.context > found:
        why = f"the declared context {model.context} does not fit: at most {found} tokens do"
        return _refusal(flag, terms, f"cannot load in its reservation: {why}")
    return Limit(flag, found, (*terms, NOT_SUBTRACTED))


def _context_cap(model: ModelInput) -> tuple[int | None, str]:
    """The longest context worth allowing, and what it is: the declared context (the
    serve asks no more), else the model's own length (it was trained to no more)."""
    own = model.arch.context_length
    if model.context is not None and (own is None or model.context <= own):
        return model.context, f"the declared context {model.context} ([serve.model] context)"
    return own, f"the model's own context length {own} ({model.arch.source})"


def _serve_context(model: ModelInput) -> tuple[int | None, str]:
    """The serve's context and where it came from."""
    if model.context is not None:
        return model.context, "[serve.model] context"
    return model.arch.context_length, f"the model's own, {model.arch.source}"


def _context_size(flag: LimitFlag, budget: Reserved, model: ModelInput, layout: KvLayout) -> Limit:
    """``context-size``: the serve's context × its parallel sequences."""
    context, source = _serve_context(model)
    if context is None:
        return _unknown(flag, [], "no context: the files give none and [serve.model] sets none")
    total = context * model.parallel
    terms = (
        f"context {context} ({source}) × {model.parallel} parallel sequences = {total} "
        "tokens (llama-server shares its context among its --parallel slots)",
        *_above_trained(-(-context // layout.granule) * layout.granule, model.arch),
    )
    return Limit(flag, total, terms, zero_means=model.arch.context_length)


def _above_trained(context: int, arch: Architecture) -> tuple[str, ...]:
    """A term where the serve's context per sequence, padded as the engine pads it, is
    above the model's own: the engine allocates it (and sizes the KV cache for it) but
    warns, and answers past the model's own may degrade."""
    own = arch.context_length
    if own is None or context <= own:
        return ()
    return (
        f"context {context} is above the model's own {own} ({arch.source}): llama.cpp "
        f'allocates it and warns "n_ctx_seq ({context}) > n_ctx_train ({own}) -- possible '
        'training context overflow" (src/llama-context.cpp); answers past '
        f"{own} tokens may degrade",
    )


def _parallel(flag: LimitFlag, budget: Reserved, model: ModelInput, layout: KvLayout) -> Limit:
    """``parallel``: the serve's parallel sequences, each a slot with its own share of
    the context (more slots: more sliding-window cache, each keeps its window)."""
    terms = (
        f"[serve.model] parallel {model.parallel}: one slot per sequence, each with "
        "context ÷ slots (without the flag llama-server takes 4 slots sharing one cache)",
    )
    return Limit(flag, model.parallel, terms)


def _layer_kv(model: ModelInput, context: int, layout: KvLayout) -> EngineKv:
    """One layer's KV cache at ``context`` tokens, every sequence, as the engine lays
    it out: exact where every layer caches the whole context, the largest layer's
    otherwise."""
    one = replace(model.arch, layers=1, sliding_window=None, sliding_layers=None)
    return engine_kv(
        one, context=context, kv_dtype=model.kv_dtype, parallel=model.parallel, layout=layout
    )


def _gpu_layers(flag: LimitFlag, budget: Reserved, model: ModelInput, layout: KvLayout) -> Limit:
    """``gpu-layers``: all layers when weights + KV fit, else the largest N that does."""
    size, reserved = _reservation(budget)
    context, _ = _serve_context(model)
    layers, blocks = model.arch.layers, model.weights.layer_bytes
    terms = [reserved, _weights_term(model.weights)]
    if context is None:
        return _unknown(flag, terms, "no context: the files give none and [serve.model] sets none")
    if len(blocks) != layers:
        why = f"the files give tensor bytes for {len(blocks)} layers of {layers}"
        return _unknown(flag, terms, f"the layers' bytes are unknown: {why}")
    kv = model.laid_out(context, layout)
    if kv.bytes is None:
        return _unknown(flag, terms, f"the KV cache is unknown: {kv.reason}")
    whole = model.weights.bytes + kv.bytes
    terms.append(f"KV cache as the engine lays it out: {kv.formula}")
    if whole <= size:
        terms.append(
            f"weights + KV cache {model.weights.bytes} + {kv.bytes} = {whole} ≤ {size}: "
            f"all {layers} layers and the output layer, {layers + 1} as llama.cpp counts them"
        )
        return Limit(flag, layers + 1, (*terms, NOT_SUBTRACTED), all_at=layers + 1)
    terms.append(f"weights + KV cache {whole} bytes > {size}")
    return _partial_layers(flag, size, model, context, terms, layout)


def _partial_layers(
    flag: LimitFlag,
    size: int,
    model: ModelInput,
    context: int,
    terms: list[str],
    layout: KvLayout,
) -> Limit:
    """The largest N whose last N layers and their KV fit after the tensors of no layer;
    rendered N + 1: llama.cpp's count puts the output layer on the GPU first."""
    rest = model.weights.non_layer_bytes
    terms.append(
        f"tensors of no layer {rest} bytes, counted on the GPU (an upper bound: llama.cpp "
        "keeps the token embeddings on the CPU)"
    )
    if rest > size:
        return _refusal(flag, terms, f"not even the tensors of no layer fit: {rest} > {size}")
    per = _layer_kv(model, context, layout)
    assert per.bytes is not None
    terms.append(f"KV cache of one layer {per.formula}")
    blocks = model.weights.layer_bytes
    used, count = rest, 0
    for block in reversed(blocks):  # llama.cpp offloads the last layers first
        if used + block + per.bytes > size:
            break
        used, count = used + block + per.bytes, count + 1
    offloaded = sum(blocks[len(blocks) - count :])
    terms.append(
        f"the last {count} layers {offloaded} bytes + {count} × {per.bytes} bytes of KV + "
        f"{rest} = {used} ≤ {size}"
    )
    if count < len(blocks):
        more = used + blocks[len(blocks) - count - 1] + per.bytes
        terms.append(f"one layer more: {more} bytes > {size}")
    terms.append(
        f"{flag.name} {count + 1}: llama.cpp counts the output layer first, then the last "
        f"{count} layers; the other {len(blocks) - count} run on the CPU"
    )
    return Limit(flag, count + 1, (*terms, NOT_SUBTRACTED))


def _vram_bytes(flag: LimitFlag, budget: Reserved) -> Limit:
    """``vram-bytes``: the reservation less the engine's declared overhead, in bytes (of
    one GPU): the engine's limit holds its weights and KV cache only, not its CUDA
    context, activations nor runtime (its docs), which stay within the reservation."""
    _, reserved = _reservation(Reserved(budget.vram_mib))
    device = None if budget.device_mib is None else budget.device_mib * MIB
    overhead = budget.overhead_mib
    keeps = (
        "the engine keeps its weights and KV cache within the limit and fails at load, with "
        "its arithmetic, when the model cannot fit; its CUDA context, activations and "
        "runtime are outside it"
    )
    if overhead is None:
        why = (
            "the engine's use outside its limit is unknown: declare engine_overhead_mib "
            "(measure it with vramctl calibrate); the whole reservation as its limit would "
            "let the process exceed it by that much"
        )
        return Limit(flag, None, (reserved, keeps), problem=why, device_bytes=device)
    value = (budget.vram_mib - overhead) * MIB
    terms = (
        reserved,
        f"engine_overhead_mib {overhead} (declared): ({budget.vram_mib} − {overhead}) MiB × "
        f"{MIB} = {value} bytes",
        keeps,
    )
    if value <= 0:
        why = f"engine_overhead_mib {overhead} leaves nothing of vram_mib {budget.vram_mib}"
        return Limit(flag, None, terms, problem=why, refused=True, device_bytes=device)
    return Limit(flag, value, terms, device_bytes=device)


#: byte units a byte limit may carry (onnx-genai's parse_resource_limit)
_BYTE_UNITS = {
    "KiB": 1024,
    "MiB": 1024**2,
    "GiB": 1024**3,
    "KB": 1000,
    "MB": 1000**2,
    "GB": 1000**3,
}


def _bytes_value(word: str, limit: Limit) -> int | None:
    """A byte limit as written: a count of bytes, a number with a byte unit (``8GiB``,
    ``1.5MB``, rounded), or a fraction in [0, 1] of the device (``None``: unreadable, or
    a fraction of a device whose total is unknown)."""
    if word.isdigit():
        return int(word)
    unit = next((u for u in _BYTE_UNITS if word.endswith(u)), None)
    number = word[: -len(unit)] if unit else word
    try:
        value = Decimal(number)
    except InvalidOperation:
        return None
    if not value.is_finite() or value < 0:
        return None
    if unit is not None:
        return int((value * _BYTE_UNITS[unit]).to_integral_value())
    if value > 1 or limit.device_bytes is None:
        return None
    return int(value * limit.device_bytes)


#: the kinds computed from the model's files, and the one that needs none
_FROM_MODEL: dict[LimitKind, Callable[[LimitFlag, Reserved, ModelInput, KvLayout], Limit]] = {
    LimitKind.MAX_CONTEXT: _max_context,
    LimitKind.GPU_LAYERS: _gpu_layers,
    LimitKind.CONTEXT_SIZE: _context_size,
    LimitKind.PARALLEL: _parallel,
}
_NO_MODEL: dict[LimitKind, Callable[[LimitFlag, Reserved], Limit]] = {
    LimitKind.VRAM_BYTES: _vram_bytes,
}


def _render_one(
    flag: LimitFlag, budget: Reserved, model: Model | None, layout: KvLayout
) -> Limit | None:
    """One flag's limit. A kind computed from the model's files is not rendered for a
    serve without ``[serve.model]``, and is unknown when its files could not be read."""
    if flag.kind in _NO_MODEL:
        return _NO_MODEL[flag.kind](flag, budget)
    if model is None:
        return None
    if isinstance(model, str):
        return _unknown(flag, [], f"the model's files cannot be read: {model}")
    return _FROM_MODEL[flag.kind](flag, budget, model, layout)


def render_limits(
    engine: Engine | None,
    vram_mib: int | None,
    model: Model | None,
    *,
    gpus: int,
    flag_budget: tuple[int, str] | None = None,
    overhead_mib: int | None = None,
    device_mib: int | None = None,
) -> tuple[Limit, ...]:
    """The limit flags of ``engine`` for a reservation of ``vram_mib`` on each of ``gpus``
    roles and the serve's ``model`` (``None``: no ``[serve.model]``; a text: why its
    files are unknown). ``flag_budget``: the bytes the engine's memory flag gives it on
    one GPU, and how (:meth:`statemachine.flags.fraction.RenderResult.budget`), counted
    where the engine's weights and KV cache live within it (``budget_from_flag``);
    ``overhead_mib`` the serve's ``engine_overhead_mib``; ``device_mib`` the smallest of
    its devices' totals (what a byte limit written as a fraction is of)."""
    if engine is None or vram_mib is None:
        return ()
    flag_bytes, flag_text = flag_budget if flag_budget else (None, "")
    if not engine.budget_from_flag:
        flag_bytes = None
    reserved = Reserved(vram_mib, max(1, gpus), flag_bytes, flag_text, overhead_mib, device_mib)
    found = (_render_one(flag, reserved, model, engine.kv_layout) for flag in engine.limit_flags)
    return tuple(limit for limit in found if limit is not None)


# ── checks ─────────────────────────────────────────────────────────────────────


def found_value(
    argv: Sequence[str],
    flag: LimitFlag | CacheTypeFlag | SelfSleep,
    env: Mapping[str, str] | None = None,
) -> str | None:
    """The value the command gives ``flag`` under any of its spellings (the engine takes
    the last), else the one of its variable in ``env``; ``None`` when neither is given."""
    names = {flag.name, *flag.aliases}
    found: str | None = None
    i = 0
    while i < len(argv):
        name, eq, value = argv[i].partition("=")
        if (name.replace("_", "-") if name.startswith("--") else name) in names:
            found = value if eq else (argv[i + 1] if i + 1 < len(argv) else "")
            i += 0 if eq else 1
        i += 1
    if found is None and flag.env is not None:
        return (env or {}).get(flag.env)
    return found


#: vLLM and SGLang read a context of ``32k`` as 32000 and ``32K`` as 32768
_SUFFIXES = {"k": 1000, "K": 1024, "m": 1000**2, "M": 1024**2}


def _every(word: str, flag: LimitFlag) -> bool:
    """True when the engine reads ``word`` as every layer (llama.cpp: ``all``, ≤ −2)."""
    if word.lower() in flag.every:
        return True
    low = flag.every_below
    return low is not None and word.lstrip("-").isdigit() and int(word) <= low


def _number(text: str, limit: Limit) -> int | None:
    """A limit's value as written (``None``: unreadable): the words the engine reads as
    every layer (:func:`_every`), ``--ctx-size 0`` as the model's own context; a context
    may carry a ``k``/``K``/``m``/``M`` suffix."""
    word = text.strip()
    kind = limit.flag.kind
    if kind is LimitKind.VRAM_BYTES:
        return _bytes_value(word, limit)
    if _every(word, limit.flag):
        return _SEARCH_CAP
    if word == "0" and limit.zero_means is not None:
        return limit.zero_means
    if kind is LimitKind.MAX_CONTEXT and word[-1:] in _SUFFIXES:
        try:
            value = Decimal(word[:-1]) * _SUFFIXES[word[-1]]
        except InvalidOperation:
            return None
        whole = value.is_finite() and value >= 0 and value == value.to_integral_value()
        return int(value) if whole else None
    return int(word) if word.isdigit() else None


#: the variable each start sets to the free MiB less the reservation (gpu_vars.py)
FIT_TARGET_VARIABLE = "VRAMCTL_FIT_TARGET_MIB"


def _fit_switch(argv: Sequence[str]) -> str | None:
    """The last value the command gives llama.cpp's ``--fit``/``-fit`` (``None``: unset)."""
    found: str | None = None
    for i, word in enumerate(argv):
        name, eq, value = word.partition("=")
        if name in {"--fit", "-fit"}:
            found = value if eq else (argv[i + 1] if i + 1 < len(argv) else "")
    return found


def fits_to_reservation(flag: LimitFlag, argv: Sequence[str], raw: str) -> bool:
    """True when the command has the engine fit ``flag``'s value to the reservation: its
    fit-target flag is the start's ``${VRAMCTL_FIT_TARGET_MIB}`` (in the raw command,
    before interpolation) and the fitting is not switched off (``--fit off``)."""
    if not flag.fit_target or _fit_switch(argv) == "off":
        return False
    names = "|".join(re.escape(name) for name in flag.fit_target)
    pattern = rf"(?:{names})(?:=|\s+)[\"']?\$\{{?{FIT_TARGET_VARIABLE}\b"
    return re.search(pattern, raw) is not None


def check_limit(
    limit: Limit,
    found: str | None,
    *,
    serve: str,
    service: str | None = None,
    fitted: bool = False,
) -> Finding | None:
    """The finding about ``found`` (``None``: the command lacks the flag), or ``None``
    when it is within ``limit``: a smaller value keeps the engine within it too.
    ``fitted``: the engine fits a value it sizes from free memory (or none given) to
    the reservation (:func:`fits_to_reservation`)."""
    name = limit.flag.name
    word = (found or "").strip().lower()
    if fitted and (found is None or word in limit.flag.from_free) and limit.value is not None:
        return None
    facts: dict[str, Any] = {"flag": name, "found": found, **limit.to_json()}

    def finding(kind: FindingKind, message: str) -> Finding:
        return Finding(kind, message, serve, service, facts)

    if limit.value is None:
        kind = FindingKind.DOES_NOT_FIT if limit.refused else FindingKind.LIMIT_UNKNOWN
        return finding(kind, f"{name}: {limit.explanation}")
    if found is None:
        return finding(
            FindingKind.MISSING_LIMIT,
            f"the command lacks {name}: add {name} {limit.value} ({limit.explanation})",
        )
    if word in limit.flag.fits_itself:
        return None  # the engine fits it to what its memory flag gives it
    if word in limit.flag.from_free:
        return finding(
            FindingKind.SIZED_FROM_FREE,
            f"{name} {found} is sized by the engine from the device when it starts (its "
            f"free memory, or its capacity), not from the reservation: on a shared card it "
            f"takes what the others have not claimed; write {name} {limit.value} "
            f"({limit.explanation})",
        )
    value = _number(found, limit)
    if value is None:
        return finding(FindingKind.BAD_VALUE, f"{name} {found!r} is not a whole number")
    if value > limit.value and not (limit.all_at is not None and value >= limit.all_at):
        return finding(
            FindingKind.LIMIT_TOO_LARGE,
            f"{name} {found} is more than the {limit.value} the reservation allows "
            f"({limit.explanation})",
        )
    return None


# ── the elastic engine's configuration ─────────────────────────────────────────


@dataclass(frozen=True, slots=True)
class ElasticRender:
    """What an elastic serve's engine needs: its flag on the command line, and the
    manifest's segment: its segment flag where it has one, else its configuration."""

    config: ElasticConfig
    segment_mib: int

    @property
    def argv(self) -> tuple[str, ...]:
        """``("--vram-elastic", "--vram-segment-mib", "1024")``; without a segment flag,
        the elastic flag alone (the segment is configuration only)."""
        c = self.config
        segment = () if c.segment_flag is None else (c.segment_flag, str(self.segment_mib))
        return (c.flag, *segment)

    @property
    def is_default(self) -> bool:
        """True when the manifest's segment is the engine's own default."""
        return self.segment_mib == self.config.default_segment_mib

    @property
    def setting(self) -> str:
        """The configuration entry the segment needs, and whether it may be left unset."""
        c = self.config
        entry = f'"{c.segment_key}": {self.segment_mib}'
        if self.is_default:
            return f"{entry}, or no entry (the engine's default is {c.default_segment_mib})"
        return f"{entry} (the engine's default, {c.default_segment_mib}, is not it)"

    @property
    def explanation(self) -> str:
        """Where the segment comes from and where the engine reads it."""
        c = self.config
        where = (
            f"its {c.segment_flag} {self.segment_mib}, else its configuration: {self.setting}"
            if c.segment_flag is not None
            else f"only its configuration: {self.setting}"
        )
        return (
            f"elastic.segment_mib {self.segment_mib} (the manifest): the engine reads its "
            f"expert-cache segment from {where}"
        )

    def to_json(self) -> dict[str, Any]:
        """``{"argv", "config", "explanation"}``."""
        c = self.config
        return {
            "argv": list(self.argv),
            "config": {c.key: True, c.segment_key: self.segment_mib},
            "explanation": self.explanation,
        }


def render_elastic(config: ElasticConfig, segment_mib: int) -> ElasticRender:
    """What an engine with ``config`` needs to match ``elastic.segment_mib``."""
    return ElasticRender(config, segment_mib)


def _switched_on(argv: Sequence[str], flag: str) -> bool:
    """True when ``flag`` is on the command line, alone or set to a true word."""
    for word in argv:
        key, eq, value = word.partition("=")
        if key.replace("_", "-") == flag:
            return not eq or value.strip().lower() in {"true", "1", "yes", "on"}
    return False


def _segment_given(want: ElasticRender, argv: Sequence[str]) -> str | None:
    """The value the command gives the engine's segment flag (the last), or ``None``."""
    flag = want.config.segment_flag
    return None if flag is None else found_value(argv, LimitFlag(flag, LimitKind.VRAM_BYTES))


def check_elastic(
    want: ElasticRender, argv: Sequence[str], *, serve: str, service: str | None = None
) -> list[Finding]:
    """An error for an elastic serve whose command lacks the engine's elastic flag, or
    gives its segment flag another segment than the manifest's; a note where the
    segment is left to the engine's configuration, which lint does not read: it is
    unknown here, never assumed to be the default."""
    c = want.config
    facts: dict[str, Any] = {"needs": want.to_json()}
    if not _switched_on(argv, c.flag):
        message = (
            f"declares elastic but its command lacks {c.flag}: unless its configuration says "
            f'"{c.key}": true, every POST /v1/vram is refused; add {c.flag}'
        )
        return [Finding(FindingKind.ELASTIC_OFF, message, serve, service, facts)]
    given = _segment_given(want, argv)
    if given is not None and given.strip() == str(want.segment_mib):
        return []
    if given is not None:
        message = (
            f"{c.segment_flag} {given} is not the manifest's elastic.segment_mib "
            f"{want.segment_mib}: every POST /v1/vram would resize by another step than "
            f"the ledger counts; write {c.segment_flag} {want.segment_mib}"
        )
        return [Finding(FindingKind.DISAGREES, message, serve, service, facts)]
    hint = f"; or write {c.segment_flag} {want.segment_mib}" if c.segment_flag else ""
    message = (
        f"the engine's segment is unknown: the command leaves it to the engine's "
        f"configuration, which lint does not read; that configuration must hold "
        f"{want.setting}{hint}"
    )
    return [Finding(FindingKind.ELASTIC_SEGMENT_UNREAD, message, serve, service, facts)]


# ── the KV cache's element type ────────────────────────────────────────────────


@dataclass(frozen=True, slots=True)
class CacheTypeRender:
    """The flags that make an engine store its KV cache as ``kv_dtype``, the type the
    limits above were computed at."""

    config: CacheTypes
    kv_dtype: str

    @property
    def argv(self) -> tuple[str, ...]:
        """``("--cache-type-k", "q8_0", "--cache-type-v", "q8_0")``."""
        value = self.config.word(self.kv_dtype)
        return tuple(word for flag in self.config.flags for word in (flag.name, value))

    @property
    def explanation(self) -> str:
        """Where the type comes from and what it is."""
        return (
            f"[serve.model] kv_dtype {self.kv_dtype}: {KV_DTYPES[self.kv_dtype].text()} a "
            "cache element, the size the limits' KV cache was computed at; without these "
            f"flags the engine stores {self.config.default}"
        )

    def to_json(self) -> dict[str, Any]:
        """``{"argv", "kv_dtype", "default", "explanation"}``."""
        return {
            "argv": list(self.argv),
            "kv_dtype": self.kv_dtype,
            "default": self.config.default,
            "explanation": self.explanation,
        }


def render_cache_types(config: CacheTypes | None, kv_dtype: str | None) -> CacheTypeRender | None:
    """The cache-type flags of an engine with ``config`` for a serve whose ``[serve.model]``
    says ``kv_dtype``; ``None`` without either, or where it is the engine's default."""
    if config is None or kv_dtype is None or config.is_default(kv_dtype):
        return None
    return CacheTypeRender(config, kv_dtype)


def _times(ratio: Fraction) -> str:
    """``2×``, or ``1.88× (32/17)`` where the ratio is not whole."""
    if ratio.denominator == 1:
        return f"{ratio.numerator}×"
    return f"{float(ratio):.2f}× ({ratio.numerator}/{ratio.denominator})"


def _scale(found: str, want: str) -> tuple[str, str]:
    """How a cache stored as ``found`` compares with one stored as ``want`` (``2× larger
    than``), and why (the bytes of an element of each)."""
    if found not in KV_DTYPES:
        return "of a size unknown here, not", f"{found} is not one of {', '.join(KV_DTYPES)}"
    size, sized = KV_DTYPES[found], KV_DTYPES[want]
    ratio = size.per_element / sized.per_element
    if ratio > 1:
        how = f"{_times(ratio)} larger than"
    elif ratio < 1:
        how = f"{_times(1 / ratio)} smaller than"
    else:
        how = "the same size as"
    return how, f"{size.text()} an element against {sized.text()}"


def _consequence(found: Mapping[CacheTypeFlag, str], want: str) -> str:
    """What storing ``found`` does to the KV cache the limits were sized for."""
    if len(set(found.values())) == 1:
        how, why = _scale(next(iter(found.values())), want)
        return f"the KV cache would be {how} the one the limits were sized for ({why})"
    parts = ((flag.half, *_scale(kind, want)) for flag, kind in found.items() if kind != want)
    return "; ".join(
        f"its {half} would be {how} those the limits were sized for ({why})"
        for half, how, why in parts
    )


def _given(flag: CacheTypeFlag, value: str | None, default: str) -> str:
    """``--cache-type-k q8_0``, or ``no --cache-type-k (the default f16)``."""
    return f"no {flag.name} (the default {default})" if value is None else f"{flag.name} {value}"


def check_cache_types(
    config: CacheTypes,
    kv_dtype: str,
    argv: Sequence[str],
    env: Mapping[str, str] | None = None,
    *,
    serve: str,
    service: str | None = None,
) -> Finding | None:
    """The error of a command whose KV cache type (the engine's default where a flag is
    absent) is not the serve's ``kv_dtype``, which the limits were computed at."""
    given = {flag: found_value(argv, flag, env) for flag in config.flags}
    found = {flag: config.read(value) if value else config.default for flag, value in given.items()}
    if all(kind == kv_dtype for kind in found.values()):
        return None
    if config.is_default(kv_dtype) and all(config.is_default(kind) for kind in found.values()):
        return None
    said = ", ".join(_given(flag, value, config.default) for flag, value in given.items())
    write = " ".join(CacheTypeRender(config, kv_dtype).argv)
    message = (
        f"the command stores its KV cache as {said} but [serve.model] kv_dtype is {kv_dtype}: "
        f"{_consequence(found, kv_dtype)}; write {write}"
    )
    facts: dict[str, Any] = {
        "kv_dtype": kv_dtype,
        "default": config.default,
        "found": {flag.name: value for flag, value in given.items()},
    }
    return Finding(FindingKind.CACHE_TYPE, message, serve, service, facts)
