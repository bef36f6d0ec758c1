"""The fit answer as ``vramctl fit --json`` prints it, for the CLI and ``vramctl mcp``.

One place assembles it (the core's :func:`statemachine.fit.fit_serve`, the router tiers
a start would drain when no router is given, the serve's ``[serve.model]`` estimate), so
``fit --json`` and the ``can_fit`` tool cannot answer differently.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from statemachine.admission import RouterNeed, no_router_reason, start_router_needs
from statemachine.fit import FitResult, fit_serve
from statemachine.types import DesiredState, Observed


@dataclass(frozen=True, slots=True)
class FitAnswer:
    """The core's answer, with the router tiers it needs and the model estimate."""

    result: FitResult
    #: the router tiers the start drains, where no router is given (else empty)
    needs: tuple[RouterNeed, ...]
    #: why ``up`` would be refused for want of a router (None: it would not)
    note: str | None
    #: the serve's ``[serve.model]`` estimate (None: it declares none)
    model: dict[str, Any] | None

    def to_json(self) -> dict[str, Any]:
        """docs/design.md §5 fit JSON, with ``needs_router`` / ``note`` and ``model``
        where they apply."""
        out = self.result.to_json()
        if self.note:
            out.update({"needs_router": [n.to_json() for n in self.needs], "note": self.note})
        return out if self.model is None else {**out, "model": self.model}


def fit_answer(
    desired: DesiredState,
    observed: Observed,
    serve: str,
    *,
    now: float,
    router_url: str | None,
    model: dict[str, Any] | None = None,
) -> FitAnswer:
    """Can ``serve`` run now, and at what cost; without ``router_url``, a start that
    drains a router tier is said to be refused, as ``up`` would be (the API's own test,
    statemachine/admission.py)."""
    result = fit_serve(desired, observed, serve, now=now)
    needs: tuple[RouterNeed, ...] = ()
    if not router_url and result.known:
        needs = start_router_needs(desired, observed, result.serve, result.drain, result.sleep)
    note = no_router_reason(f"up {serve}", needs) if needs else None
    return FitAnswer(result, needs, note, model)
