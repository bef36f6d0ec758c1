"""The engine registry: one module per engine protocol, each an :class:`Engine` as data.

Every piece of engine knowledge (the manifest's accepted ``engine`` and
``sleep.protocol`` values, command and image detection, the memory flag, serialised
starts, the sleep API's paths, the in-flight metrics) is read from here; no other module
spells an engine's name. Adding an engine is one module beside :mod:`.vllm` exposing
``ENGINE``, named in :data:`BUILT_IN` (docs/architecture.md, adding an engine).

Order matters where several engines could match: detection tries them in registration
order, and error messages list the names in it.

This package must not do I/O nor import anything from ``controller``. The registry is
filled once at import; :func:`register` and :func:`unregister` exist for an engine
added by a test or a plug-in.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from enum import StrEnum

from statemachine.engines import llamacpp, onnxgenai, sglang, spec, strata, vllm
from statemachine.engines.spec import *  # noqa: F403  (the package re-exports the records)
from statemachine.engines.spec import Detection, Engine, FlagUnit, SleepApi

__all__ = [
    "BUILT_IN",
    "SleepProtocol",
    "canonical",
    "engines",
    "get",
    "lookup",
    "names",
    "of_argv",
    "of_image",
    "register",
    "sleep_api",
    "sleeping_engines",
    "unregister",
]
__all__ += spec.__all__

#: The engines vramctl ships with, in detection order.
BUILT_IN: tuple[Engine, ...] = (
    vllm.ENGINE,
    sglang.ENGINE,
    llamacpp.ENGINE,
    onnxgenai.ENGINE,
    strata.ENGINE,
)

_ENGINES: dict[str, Engine] = {}
_LABELS: dict[str, str] = {}


def _key(label: str) -> str:
    """A label as the registry compares it: trimmed, lower-cased, ``_`` as ``-``."""
    return label.strip().lower().replace("_", "-")


def register(engine: Engine) -> Engine:
    """Add ``engine``; ValueError when its name or an alias is another engine's, or
    when it declares what vramctl cannot carry out (a memory flag in MiB)."""
    if engine.name != _key(engine.name) or not engine.name:
        raise ValueError(f"engine name {engine.name!r} must be lower-case, without _ or spaces")
    if engine.memory_flag is not None and engine.memory_flag.unit is not FlagUnit.FRACTION:
        raise ValueError(
            f"engine {engine.name!r}: memory flag {engine.memory_flag.name} in "
            f"{engine.memory_flag.unit.value}: only a fraction of the device total is rendered"
        )
    labels = {engine.name, *(_key(a) for a in engine.aliases)}
    taken = sorted(label for label in labels if label in _LABELS)
    if taken:
        owners = ", ".join(f"{label!r} ({_LABELS[label]})" for label in taken)
        raise ValueError(f"engine {engine.name!r}: already registered: {owners}")
    _ENGINES[engine.name] = engine
    _LABELS.update(dict.fromkeys(labels, engine.name))
    return engine


def unregister(name: str) -> None:
    """Remove the engine called ``name`` (KeyError when there is none)."""
    engine = _ENGINES.pop(name)
    for label in [label for label, owner in _LABELS.items() if owner == engine.name]:
        del _LABELS[label]


def engines(where: Callable[[Engine], bool] | None = None) -> tuple[Engine, ...]:
    """Every registered engine (those ``where`` accepts), in registration order."""
    return tuple(e for e in _ENGINES.values() if where is None or where(e))


def names(where: Callable[[Engine], bool] | None = None) -> tuple[str, ...]:
    """The names of :func:`engines`."""
    return tuple(e.name for e in engines(where))


def sleeping_engines() -> tuple[Engine, ...]:
    """The engines with a sleep API, in registration order."""
    return engines(lambda e: e.sleep is not None)


def sleep_api(protocol: str) -> SleepApi | None:
    """The sleep API of the engine called exactly ``protocol`` (``None``: no such engine,
    or it cannot sleep)."""
    found = _ENGINES.get(protocol)
    return None if found is None else found.sleep


def lookup(label: str | None) -> Engine | None:
    """The engine a manifest label names (its name or an alias, any case), or ``None``."""
    if label is None:
        return None
    name = _LABELS.get(_key(label))
    return None if name is None else _ENGINES[name]


def get(name: str) -> Engine:
    """The engine called exactly ``name``; KeyError naming the known ones otherwise."""
    try:
        return _ENGINES[name]
    except KeyError:
        raise KeyError(f"no engine {name!r}; known: {', '.join(_ENGINES)}") from None


def canonical(label: str | None) -> str | None:
    """A label in canonical form: a known engine's name (``"llama.cpp"`` →
    ``"llamacpp"``), other labels trimmed, lower-cased, ``_`` as ``-``; blank → ``None``."""
    if label is None or not label.strip():
        return None
    key = _key(label)
    return _LABELS.get(key, key)


def of_argv(argv: Sequence[str]) -> Engine | None:
    """The engine a command line runs, from its program words, or ``None``.

    Only the words before the first option (``-m`` excepted) are looked at; a path
    prefix (``/usr/bin/vllm``) is ignored.
    """
    words: list[str] = []
    for word in argv:
        if word.startswith("-") and word != "-m":
            break
        words.append(word)
    for i, word in enumerate(words):
        base = word.rsplit("/", 1)[-1]
        after = words[i + 1] if i + 1 < len(words) else None
        for engine in _ENGINES.values():
            if _runs(engine.detection, base, after):
                return engine
    return None


def _runs(found: Detection, base: str, after: str | None) -> bool:
    """True when program word ``base`` (followed by ``after``) runs that engine."""
    return (
        (base, after) in found.commands
        or base in found.programs
        or any(base.startswith(m) for m in found.modules)
    )


def of_image(image: str | None) -> Engine | None:
    """A weaker guess from an image reference's repository (``vllm/vllm-openai:tag``)."""
    if not image:
        return None
    repo = image.split("@", 1)[0]
    last = repo.rsplit("/", 1)[-1]
    if ":" in last:
        repo = repo[: len(repo) - len(last)] + last.split(":", 1)[0]
    repo = repo.lower()
    for engine in _ENGINES.values():
        if any(word in repo for word in engine.detection.image_words):
            return engine
    return None


for _engine in BUILT_IN:
    register(_engine)


#: The engine sleep APIs a serve may speak (docs/protocols.md, engine sleep): one member
#: per built-in engine of this registry that has one (``SleepProtocol.VLLM``).
#: A :class:`~statemachine.domain.types.Sleep`'s ``protocol`` is the engine's name; these members
#: are such names.
SleepProtocol = StrEnum(  # type: ignore[misc]  # members come from the engine registry
    "SleepProtocol", {e.name.upper(): e.name for e in sleeping_engines()}
)
