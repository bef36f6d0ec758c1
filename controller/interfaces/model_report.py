"""The serves' model estimates as ``status``, ``fit`` and ``calibrate`` print them.

Each serve's entry is ``controller.service.model_estimates.serve_models``' (the
estimate's weights + KV beside the reservation and, where measured, the footprint);
this module only formats it: an unknown figure is printed ``unknown``, never 0. It
must not read files nor compute anything.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.markup import escape
from rich.table import Table
from rich.text import Text

__all__ = ["calibration_lines", "fit_lines", "model_table", "validate_lines"]

UNKNOWN = "unknown"


def _mib(value: int | None) -> str:
    return UNKNOWN if value is None else str(value)


def _figures(entry: Mapping[str, Any]) -> tuple[str, str, str]:
    """Weights, KV and weights + KV in MiB (per GPU role), ``unknown`` where unknown."""
    est = entry.get("estimate")
    if est is None:
        return UNKNOWN, UNKNOWN, UNKNOWN
    return _mib(est["weights_mib"]), _mib(est["kv_cache_mib"]), _mib(est["known_mib"])


def _note(entry: Mapping[str, Any]) -> Text:
    """What is wrong with a serve's model, in words (empty when nothing is)."""
    check = entry.get("check")
    if entry.get("error"):
        return Text(entry["error"], style="red")
    if check is not None and check["verdict"] == "cannot_load":
        short = check["shortfall_mib"]
        why = f"short by {short} MiB" if short is not None else check["message"]
        return Text(f"cannot load: {why}", style="bold red")
    if check is not None and check["verdict"] == "oversized":
        return Text(f"{check['excess_mib']} MiB above weights + KV", style="yellow")
    if check is not None and check.get("note"):
        return Text(check["note"])
    return Text("")


def model_table(models: Mapping[str, Mapping[str, Any]]) -> Table:
    """Reservation, estimate and measured footprint per serve (``status``); a ``note``
    column only where some serve has one."""
    table = Table(title="Model estimates (MiB, per GPU role)", title_justify="left")
    notes = {name: _note(entry) for name, entry in models.items()}
    cols = ("serve", "vram_mib", "weights", "KV", "weights + KV", "rest", "measured")
    noted = any(note.plain for note in notes.values())
    for col in (*cols, "note") if noted else cols:
        table.add_column(col, justify="left" if col in ("serve", "rest", "note") else "right")
    for name, entry in models.items():
        weights, kv, known = _figures(entry)
        row: list[Text | str] = [
            Text(name),
            _mib(entry.get("vram_mib")),
            weights,
            kv,
            known,
            UNKNOWN,
            _mib(entry.get("measured_mib")),
        ]
        table.add_row(*row, *([notes[name]] if noted else []))
    return table


def fit_lines(entry: Mapping[str, Any]) -> list[str]:
    """``fit``'s lines on the serve's model (rich markup escaped)."""
    if entry.get("error"):
        return [f"  model: estimate unknown: {escape(entry['error'])}"]
    weights, kv, known = _figures(entry)
    lines = [
        f"  model: weights {weights} + KV {kv} = {known} MiB known, the rest unknown "
        f"(vram_mib {_mib(entry.get('vram_mib'))})"
    ]
    check = entry.get("check")
    if check is not None and check["verdict"] in ("cannot_load", "oversized"):
        lines.append(f"  {escape(check['message'])}")
    elif check is not None and check.get("note"):
        lines.append(f"  {escape(check['note'])}")
    return lines


def calibration_lines(entry: Mapping[str, Any]) -> list[str]:
    """``calibrate``'s lines comparing reservation, estimate and measured footprint."""
    weights, kv, known = _figures(entry)
    cal = entry.get("calibration") or {}
    head = (
        f"  estimate: weights {weights} + KV {kv} = {known} MiB (the rest unknown); "
        f"measured {_mib(entry.get('measured_mib'))} MiB"
    )
    if entry.get("error"):
        head = f"  estimate unknown: {escape(entry['error'])}"
    return [head, f"  {cal.get('verdict', UNKNOWN)}: {escape(cal.get('reason', ''))}"]


def validate_lines(models: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """``validate``'s line per serve with a model (an error or a hint is said on stderr)."""
    lines = []
    for name, entry in models.items():
        check = entry.get("check")
        if check is None:
            weights, kv, known = _figures(entry)
            what = f"weights {weights} + KV {kv} = {known} MiB, the rest unknown; no reservation"
        else:
            what = check["message"]
        lines.append(f"  {escape(name)}: model: {escape(what)}")
    return lines
