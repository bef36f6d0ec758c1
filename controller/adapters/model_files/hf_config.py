"""A safetensors model's architecture, from the ``config.json`` beside its files.

The KV cache's figures are ``num_hidden_layers``, ``num_key_value_heads`` (default: the
attention heads), ``head_dim`` (else ``hidden_size / num_attention_heads``) and
``max_position_embeddings`` (the model's own context; optional: ``--context`` gives one).
A multimodal config keeps them under ``text_config``. Layers the KV formula does not
describe are said, not guessed: MLA (``kv_lora_rank``), recurrent or linear-attention
layers (``layer_types``, SSM keys) make the architecture ``unsupported`` with the reason;
a sliding window (``sliding_window`` unless ``use_sliding_window`` is false) is counted
on the layers ``layer_types`` (or a ``sliding_window_pattern``) names.

It must not compute the cache (``statemachine.sizing.needs`` does) nor read any other file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from controller.adapters.model_files.common import ModelFileError, positive_int
from statemachine.sizing.needs import Architecture

__all__ = ["read_config"]

ATTENTION_TYPES = frozenset({"full_attention", "sliding_attention", "attention"})
#: keys of recurrent (state-space) layers in the configs that have them
SSM_KEYS = ("ssm_cfg", "state_size", "ssm_state_size", "mamba_d_state", "mamba_d_ssm")


def _load(path: Path) -> dict[str, Any]:
    """The config as a JSON object; ModelFileError naming the file otherwise."""
    if not path.is_file():
        raise ModelFileError(
            f"{path}: no config.json beside the model: the KV cache needs its "
            "num_hidden_layers, num_attention_heads and head_dim"
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelFileError(f"{path}: not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ModelFileError(f"{path}: not a JSON object")
    return data


def _text(config: dict[str, Any], path: Path) -> tuple[dict[str, Any], str]:
    """The part of the config that describes the language model, and how it is named."""
    inner = config.get("text_config")
    if "num_hidden_layers" not in config and isinstance(inner, dict):
        return inner, f"{path} text_config"
    return config, str(path)


def _need(config: dict[str, Any], key: str, where: str) -> int:
    """A required positive integer; ModelFileError naming the key and the file."""
    if config.get(key) is None:
        raise ModelFileError(f"{where}: no {key} (needed for the KV cache)")
    return positive_int(config[key], key, where)


def _unsupported(config: dict[str, Any]) -> str | None:
    """Why the KV formula does not describe these layers, or None."""
    if config.get("kv_lora_rank") is not None:
        return (
            f"MLA (kv_lora_rank {config['kv_lora_rank']}): the cache holds a compressed "
            "latent per token whose layout depends on the engine"
        )
    other = sorted({str(t) for t in config.get("layer_types") or ()} - ATTENTION_TYPES)
    ssm = [k for k in SSM_KEYS if config.get(k) is not None]
    if other or ssm:
        named = ", ".join(other or ssm)
        return (
            f"recurrent or linear-attention layers ({named}) keep a state per sequence "
            "that the KV formula does not describe"
        )
    return None


def _head_dim(config: dict[str, Any], heads: int, where: str) -> int:
    """``head_dim``, else ``hidden_size / num_attention_heads``."""
    if config.get("head_dim") is not None:
        return positive_int(config["head_dim"], "head_dim", where)
    if config.get("hidden_size") is None:
        raise ModelFileError(f"{where}: no head_dim nor hidden_size (needed for the KV cache)")
    hidden = positive_int(config["hidden_size"], "hidden_size", where)
    if hidden % heads:
        raise ModelFileError(
            f"{where}: hidden_size {hidden} is not a multiple of num_attention_heads {heads}"
        )
    return hidden // heads


def _sliding(config: dict[str, Any], layers: int, where: str) -> tuple[int | None, int | None]:
    """The sliding window and how many layers use it (None: the config does not say)."""
    window = config.get("sliding_window")
    if window is None or config.get("use_sliding_window") is False:
        return None, None
    window = positive_int(window, "sliding_window", where)
    types = config.get("layer_types")
    if isinstance(types, list) and len(types) == layers:
        return window, sum(1 for t in types if t == "sliding_attention")
    pattern = config.get("sliding_window_pattern")
    if isinstance(pattern, int) and not isinstance(pattern, bool) and pattern > 0:
        # every pattern-th layer attends to the whole context, the others to the window
        return window, layers - layers // pattern
    return window, None


def _dtype(config: dict[str, Any]) -> str | None:
    """The config's ``torch_dtype`` (newer configs: ``dtype``), as it says it, or None."""
    value = config.get("torch_dtype", config.get("dtype"))
    return None if value is None else str(value)


def _architecture(config: dict[str, Any], where: str) -> Architecture:
    """The figures of the KV cache in ``config`` (named ``where`` in errors)."""
    layers = _need(config, "num_hidden_layers", where)
    context = config.get("max_position_embeddings")
    if context is not None:
        context = positive_int(context, "max_position_embeddings", where)
    why = _unsupported(config)
    if why is not None:
        return Architecture(where, layers, None, None, None, context, unsupported=why)
    heads = _need(config, "num_attention_heads", where)
    kv_heads = heads
    if config.get("num_key_value_heads") is not None:
        kv_heads = positive_int(config["num_key_value_heads"], "num_key_value_heads", where)
    head_dim = _head_dim(config, heads, where)
    window, sliding_layers = _sliding(config, layers, where)
    return Architecture(
        where, layers, kv_heads, head_dim, head_dim, context, window, sliding_layers
    )


def read_config(path: Path) -> tuple[Architecture, str | None]:
    """The architecture ``config.json`` at ``path`` describes, and its torch_dtype."""
    whole = _load(path)
    config, where = _text(whole, path)
    return _architecture(config, where), _dtype(whole) or _dtype(config)
