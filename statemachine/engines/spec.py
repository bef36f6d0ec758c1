"""What vramctl knows of one engine, as data (docs/architecture.md, adding an engine).

An :class:`Engine` says how the engine is recognised (its command words, its image's
repository, its labels), whether it sizes its memory pool from the device's free memory
when it loads (its starts are then serialised per GPU), the flag that holds it to its
reservation (rendered and linted by :mod:`statemachine.flags.fraction`), its sleep API
(the paths :mod:`controller.adapters.sleep` calls, and what its command needs for them)
and the Prometheus metrics whose sum is its count of requests in flight
(:mod:`controller.adapters.engine_metrics`). Its :class:`LimitFlag` entries are the
flags that bound what it loads (a context, GPU layers, a byte limit), computed from the
reservation and the model's files by :mod:`statemachine.flags.model_limits`; an
:class:`ElasticConfig` is the configuration its ``POST /v1/vram`` needs.

This module must not do I/O nor import anything from ``controller``: every value is
data, read by the code that acts on it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

__all__ = [
    "CacheTypeFlag",
    "CacheTypes",
    "Detection",
    "DocumentedFigure",
    "ElasticConfig",
    "Engine",
    "FlagUnit",
    "HttpCall",
    "KvLayout",
    "LimitFlag",
    "LimitKind",
    "MemoryFlag",
    "SleepApi",
]


@dataclass(frozen=True, slots=True)
class Detection:
    """How a command line or an image names the engine.

    Only the program words of a command (before its first option) are looked at, each
    without its path: ``commands`` are (program, subcommand) pairs (``vllm serve``),
    ``programs`` whole program names (``llama-server``), ``modules`` prefixes of a
    ``python -m`` module (``vllm.entrypoints``). ``image_words`` are words an image's
    repository contains (``vllm/vllm-openai``): a weaker guess than the command.
    """

    commands: tuple[tuple[str, str], ...] = ()
    programs: tuple[str, ...] = ()
    modules: tuple[str, ...] = ()
    image_words: tuple[str, ...] = ()


class FlagUnit(StrEnum):
    """What a memory flag's value is: a fraction of the device total, or MiB."""

    FRACTION = "fraction"
    MIB = "mib"


@dataclass(frozen=True, slots=True)
class MemoryFlag:
    """The command-line flag that caps the engine's memory (docs/design.md §3).

    ``default`` is the engine's own default, in words, when it has one worth telling
    (a command without the flag is sized by it, not by the reservation).
    """

    name: str
    unit: FlagUnit = FlagUnit.FRACTION
    default: str | None = None
    #: the fraction is of the memory free when the engine starts, not of the device
    #: total (SGLang): rendered as the variable each start sets (statemachine/ledger/gpu_vars.py)
    of_free: bool = False


class LimitKind(StrEnum):
    """What a limit flag's value is computed from (:mod:`statemachine.flags.model_limits`).

    ``max-context``: the largest context whose KV cache fits what the reservation leaves
    after the weights; ``gpu-layers``: the layers whose tensors and KV cache fit (the
    rest run on the CPU); ``context-size``: the serve's context (× its parallel
    sequences: the engine shares one cache among them); ``parallel``: the serve's
    parallel sequences (llama-server's slots); ``vram-bytes``: the reservation in bytes,
    a limit the engine keeps at load.
    """

    MAX_CONTEXT = "max-context"
    GPU_LAYERS = "gpu-layers"
    CONTEXT_SIZE = "context-size"
    PARALLEL = "parallel"
    VRAM_BYTES = "vram-bytes"


@dataclass(frozen=True, slots=True)
class LimitFlag:
    """A command-line flag whose value bounds what the engine loads; ``aliases`` are its
    other spellings on the command line (``-ngl``), ``env`` the environment variable the
    engine reads when the flag is not given; both read by the lint, never rendered.

    The words the engine reads specially, each matched without case: ``fits_itself``
    (vLLM's ``--max-model-len auto``/``-1``: the engine fits the value to the memory its
    memory flag gives it, so the reservation holds), ``from_free`` (llama.cpp's
    ``--n-gpu-layers auto``/``-1``: sized from the device's free memory, not the
    reservation), ``every`` (llama.cpp's ``all``, and any value ≤ ``every_below``: every
    layer); ``fit_target`` below."""

    name: str
    kind: LimitKind
    aliases: tuple[str, ...] = ()
    env: str | None = None
    fits_itself: tuple[str, ...] = ()
    from_free: tuple[str, ...] = ()
    every: tuple[str, ...] = ()
    every_below: int | None = None
    #: the flag (and its other spellings) that, given the start's
    #: ``${VRAMCTL_FIT_TARGET_MIB}`` (free less the reservation), makes a value sized from
    #: free memory, or none at all, keep to the reservation (llama.cpp's ``--fit-target``)
    fit_target: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class KvLayout:
    """How the engine lays its KV cache out, as its source does (cited in its module).

    Each sequence takes whole ``granule``s of tokens on each layer (vLLM's blocks of 16;
    llama.cpp pads its context to 256 cells); the pool keeps ``reserved_granules`` back
    (vLLM's null block, one block of one layer group). A sliding-window layer keeps
    ``min(window + window_offset + batch_tokens, context)`` tokens, in whole granules,
    and ``window_granules`` more (vLLM: ``window − 1 + max_num_batched_tokens`` and one
    block; llama.cpp: ``n_swa + n_ubatch``); ``batch_flag`` sets ``batch_tokens`` on the
    command line. ``grouped``: the layers of each kind are padded to a multiple of one
    group size (vLLM's hybrid allocator: the smaller kind's count, or the larger's where
    it is under 1.25 × the smaller)."""

    granule: int = 1
    reserved_granules: int = 0
    batch_tokens: int = 0
    batch_flag: str | None = None
    window_offset: int = 0
    window_granules: int = 0
    grouped: bool = False
    source: str = ""


@dataclass(frozen=True, slots=True)
class CacheTypeFlag:
    """A flag that sets the element type of one ``half`` (``keys`` or ``values``) of the
    engine's KV cache; ``aliases`` are its other spellings on the command line (``-ctk``),
    ``env`` the environment variable the engine reads when the flag is not given."""

    name: str
    half: str
    aliases: tuple[str, ...] = ()
    env: str | None = None


@dataclass(frozen=True, slots=True)
class CacheTypes:
    """The flags that set the element type of the engine's KV cache, and what it stores.

    ``stores``: the ``[serve.model]`` ``kv_dtype`` names it can store
    (:data:`statemachine.sizing.needs.KV_DTYPES`; a serve asking another is an error where the
    manifest is read); ``default``: the type it stores where a flag is absent, and
    ``default_also`` the others that are the same without a flag (vLLM's ``auto``: the
    model's own 16-bit type); ``words``: the engine's word for a ``kv_dtype`` where it
    differs, ``reads``: a word on the command line read as a ``kv_dtype`` (``auto`` as
    the default). A serve whose ``kv_dtype`` is not a default has the flags rendered
    (:mod:`statemachine.flags.model_limits`)."""

    flags: tuple[CacheTypeFlag, ...]
    default: str
    stores: tuple[str, ...] = ()
    default_also: tuple[str, ...] = ()
    words: Mapping[str, str] = field(default_factory=dict)
    reads: Mapping[str, str] = field(default_factory=dict)

    def is_default(self, kv_dtype: str) -> bool:
        """True when the engine stores ``kv_dtype`` without a flag."""
        return kv_dtype == self.default or kv_dtype in self.default_also

    def word(self, kv_dtype: str) -> str:
        """The engine's word for ``kv_dtype``."""
        return self.words.get(kv_dtype, kv_dtype)

    def read(self, word: str) -> str:
        """The ``kv_dtype`` a word on the command line stands for (unknown: itself)."""
        key = word.strip().lower()
        return self.reads.get(key, key)


@dataclass(frozen=True, slots=True)
class ElasticConfig:
    """What an engine with ``POST /v1/vram`` needs to be elastic: ``flag`` on the command
    line (or its configuration key ``key`` true), and the segment size, equal to the
    manifest's ``elastic.segment_mib``: ``segment_flag`` on the command line, else its
    configuration key ``segment_key`` (``default_segment_mib`` when neither is set)."""

    flag: str
    key: str
    segment_key: str
    default_segment_mib: int
    segment_flag: str | None = None


@dataclass(frozen=True, slots=True)
class HttpCall:
    """One ``POST`` of a sleep API: its path, query, JSON body, and the query
    parameter that carries the sleep level (``None``: the level is not sent)."""

    path: str
    params: tuple[tuple[str, str], ...] = ()
    body: Any = None
    level_param: str | None = None

    def query(self, level: int | None = None) -> dict[str, str] | None:
        """The query parameters, with the level where this call carries it."""
        params = dict(self.params)
        if self.level_param is not None and level is not None:
            params[self.level_param] = str(level)
        return params or None


@dataclass(frozen=True, slots=True)
class SelfSleep:
    """An engine that unloads its model by itself after ``name`` seconds of idleness and
    reloads it on the next request, outside any ledger (llama.cpp's
    ``--sleep-idle-seconds``): ``off`` is the value that disables it (also its
    default), ``path`` the read-only route whose JSON says it sleeps (``key``, a bool),
    answered without waking it. ``aliases``/``env``: other spellings (none known)."""

    name: str
    off: str
    path: str
    key: str
    source: str
    aliases: tuple[str, ...] = ()
    env: str | None = None


@dataclass(frozen=True, slots=True)
class SleepApi:
    """An engine's sleep API (docs/protocols.md, engine sleep).

    ``sleep`` puts it to sleep; ``wake`` are the calls that wake it, in order;
    ``reload`` the calls that load its weights again after a level-2 wake (none when it
    keeps them). ``is_sleeping`` is the ``GET`` path that answers
    ``{is_sleeping_key: bool}``, ``None`` when the engine cannot say. ``flags`` and
    ``env`` are what its command line and environment need for the API to exist.
    """

    sleep: HttpCall
    wake: tuple[HttpCall, ...]
    reload: tuple[HttpCall, ...] = ()
    is_sleeping: str | None = None
    is_sleeping_key: str = "is_sleeping"
    flags: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)

    @property
    def can_say(self) -> bool:
        """True when the engine can be asked whether it sleeps."""
        return self.is_sleeping is not None


@dataclass(frozen=True, slots=True)
class DocumentedFigure:
    """A memory term no model file holds (``cuda_context``, ``activations``,
    ``cuda_graphs``, ``engine_overhead``: :data:`statemachine.sizing.needs.OVERHEAD_TERMS`),
    as the engine documents it: ``bytes`` and the ``source`` that says so.
    ``vramctl estimate`` shows it as an assumption naming its source (docs/sizing.md)."""

    term: str
    bytes: int
    source: str


@dataclass(frozen=True, slots=True)
class Engine:
    """One engine protocol: its name (the manifest's ``engine`` and ``sleep.protocol``
    value), how it is shown and recognised, and what vramctl does with it."""

    name: str
    display: str
    detection: Detection
    aliases: tuple[str, ...] = ()
    #: the engine sizes its pool from the device's free memory at load: starts serialised
    sizes_from_free: bool = False
    memory_flag: MemoryFlag | None = None
    sleep: SleepApi | None = None
    #: it may unload its model by itself when idle (statemachine/flags/self_sleep.py)
    self_sleep: SelfSleep | None = None
    #: what it prints (lower case) when an allocation on the device fails at load
    #: (statemachine/sizing/start_hints.py), each with the file of its source that prints it
    out_of_memory: tuple[tuple[str, str], ...] = ()
    #: the metrics whose sum is its count of requests in flight (empty: none known)
    inflight_metrics: tuple[str, ...] = ()
    #: overheads the engine documents (none of the built-in entries does: unknown)
    documented_overheads: tuple[DocumentedFigure, ...] = ()
    #: the flags that bound what it loads, rendered and linted beside ``memory_flag``
    limit_flags: tuple[LimitFlag, ...] = ()
    #: the flags that set its KV cache's element type (``None``: none known)
    cache_types: CacheTypes | None = None
    #: the configuration its elastic VRAM endpoint needs (``None``: it has none)
    elastic: ElasticConfig | None = None
    #: how it lays its KV cache out (the default: token by token, no padding)
    kv_layout: KvLayout = KvLayout()
    #: its KV cache and weights live within what its memory flag gives it (vLLM:
    #: fraction × the device total): the limits are computed in that budget
    budget_from_flag: bool = False
