"""The fit answer as ``vramctl fit --json`` prints it, for the CLI and ``vramctl mcp``.

The answer itself is the situation's (:meth:`statemachine.answers.situation.Situation.fit`: the
core's fit with the pending requests counted as held, the router tiers a start would
drain where there is no router); this adds the serve's ``[serve.model]`` estimate, so
``fit --json``, ``GET /v1/fit`` and the ``can_fit`` tool cannot answer differently.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from statemachine.answers.fit import FitResult
from statemachine.answers.situation import FitAnswer, Situation


@dataclass(frozen=True, slots=True)
class FitReply:
    """The situation's fit answer, with the model estimate."""

    answer: FitAnswer
    #: the serve's ``[serve.model]`` estimate (None: it declares none)
    model: dict[str, Any] | None

    @property
    def result(self) -> FitResult:
        """The core's fit result."""
        return self.answer.result

    @property
    def loads(self) -> bool:
        """False when the serve's model cannot load in its reservation (the one verdict
        ``validate`` and ``render`` give: :func:`statemachine.flags.verdict.load_verdict`)."""
        check = (self.model or {}).get("check") or {}
        return check.get("verdict") != "cannot_load"

    @property
    def fits(self) -> bool:
        """True when the serve can run now: its room is there and its model loads."""
        return self.result.fits and self.loads

    @property
    def note(self) -> str | None:
        """Why ``up`` would be refused for want of a router (None: it would not)."""
        return self.answer.note

    def to_json(self) -> dict[str, Any]:
        """docs/design.md §5 fit JSON (:meth:`FitAnswer.to_json`), with ``model`` where
        the serve declares one; a model that cannot load in its reservation makes
        ``fits`` false, its reason the verdict's."""
        out = self.answer.to_json()
        if self.model is None:
            return out
        if not self.loads and out.get("fits"):
            out = {**out, "fits": False, "reason": self.model["check"]["message"]}
        return {**out, "model": self.model}


def fit_answer(sit: Situation, serve: str, *, model: dict[str, Any] | None = None) -> FitReply:
    """Can ``serve`` run now in ``sit``, and at what cost."""
    return FitReply(sit.fit(serve), model)
