"""One situation, one answer: a decision's inputs as one value, and every answer from it.

A :class:`Situation` is what the planner decides from: the desired state (the manifest
in force and the recorded on-demand requests), the observation with what the
controller knows beside it (the card each container was started on, sleepers, elastic
reserves, quiesced tiers, requests in flight, starts in progress), the loop's whole
:class:`~statemachine.planning.plan_types.Policy` (backoff holds, no-shrink, no-sleep, reload costs,
last use) and ``now``. The shell builds it once per source (the running loop; a
snapshot plus the state directory's journal: ``controller/service/situation.py``), and
every question is answered here, by one function each:

* :attr:`Situation.plan` — the plan the loop makes next (its placements chosen);
* :attr:`Situation.placed` — the desired state with those placements applied;
* :meth:`Situation.status` — the host status (ledger, drift, lifecycle per serve);
* :meth:`Situation.pending` — the requests accepted and not yet planned;
* :meth:`Situation.fit` — can a serve start now, and what it costs (the pending
  requests counted as held; the router tiers a start drains where there is no router);
* :meth:`Situation.up` — the answer to ``up`` (202, 409, 429, 503).

The CLI, the HTTP API, both MCP transports and the page only render these answers, so
the same situation gets the same answer whoever asks (docs/design.md, "One situation,
one answer").

Pure: no I/O, no clock (``now`` is a field), no docker. It must not decide anything
the planner does not: each answer is the core's own function on these inputs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from statemachine.answers.fit import FitResult, fit_serve
from statemachine.answers.pending import PendingStart, pending_starts, with_pending
from statemachine.answers.status_report import HostStatus, host_status
from statemachine.answers.up_decision import UpDecision, decide_up, mark_pending
from statemachine.domain.types import DesiredState, Observed
from statemachine.lifecycle.serve_record import ServeRecord
from statemachine.planning import placement
from statemachine.planning.admission import RouterNeed, no_router_reason, start_router_needs
from statemachine.planning.plan_types import Plan, Policy
from statemachine.planning.planner import plan_transitions
from statemachine.planning.restore_cost import (
    Measured,
    RestoreEstimate,
    declared_costs,
    last_used,
    restore_costs,
    restore_estimates,
)
from statemachine.planning.reuse import known_uses

__all__ = ["FitAnswer", "Situation"]


@dataclass(frozen=True, slots=True)
class FitAnswer:
    """Can a serve start now, and at what cost: the core's fit with the pending
    requests counted as held, and the router tiers its start drains where the
    controller has no router (then ``up`` would be refused: ``note`` says why)."""

    result: FitResult
    #: the requests accepted and not yet planned, counted as held
    pending: tuple[PendingStart, ...] = ()
    #: the router tiers the start drains, where no router is given (else empty)
    needs: tuple[RouterNeed, ...] = ()
    #: why ``up`` would be refused for want of a router (None: it would not)
    note: str | None = None

    def to_json(self) -> dict[str, Any]:
        """docs/design.md §5 fit JSON, the pending requests marked and listed
        (``pending``), ``needs_router`` / ``note`` where they apply."""
        out = mark_pending(self.result.to_json(), self.pending)
        if self.note:
            out.update({"needs_router": [n.to_json() for n in self.needs], "note": self.note})
        return out


@dataclass(frozen=True)
class Situation:
    """A decision's inputs (module docstring). Frozen; its plan is made once, when first
    asked for."""

    #: the manifest in force with the recorded requests (in force or not: the rule of
    #: :func:`statemachine.planning.idleness.in_force` decides, with the observation)
    desired: DesiredState
    #: the observation with the controller's own knowledge laid over it
    observed: Observed
    #: the epoch seconds the answers are given for (the observation's time)
    now: float
    #: the loop's whole policy (holds, no-shrink, no-sleep, reload costs, last use)
    policy: Policy = field(default_factory=Policy)
    #: serve -> its lifecycle record (the loop's; a serve without one: a fresh record)
    records: Mapping[str, ServeRecord] = field(default_factory=dict)
    #: serve -> its reload cost and basis, shown by status (None: the declared figures)
    reload: Mapping[str, RestoreEstimate] | None = None
    #: whether the controller that carries the answer out has a router for its tiers
    router: bool = True
    #: what the source could not read, and what it assumed instead
    notes: tuple[str, ...] = ()

    # ── the plan ────────────────────────────────────────────────────────────────

    @cached_property
    def plan(self) -> Plan:
        """The plan the loop makes next from these inputs."""
        return plan_transitions(self.desired, self.observed, self.policy, self.now)

    @cached_property
    def placed(self) -> DesiredState:
        """The desired state with the plan's placements applied: each placed serve on
        the card the plan holds or puts it on (every candidate where that is unknown)."""
        return placement.apply(self.desired, self.plan.placements)

    @classmethod
    def of(
        cls,
        desired: DesiredState,
        observed: Observed,
        now: float,
        *,
        measured: Mapping[str, Measured] | None = None,
        busy_at: Mapping[str, float] | None = None,
        uses: Mapping[str, Sequence[float]] | None = None,
        no_shrink: Iterable[str] = (),
        no_sleep: Iterable[str] = (),
        hold: Mapping[str, str] | None = None,
        records: Mapping[str, ServeRecord] | None = None,
        router: bool = True,
        notes: Iterable[str] = (),
    ) -> Situation:
        """The situation of what a source knows, its policy made here, once, for every
        source: the reload costs from the ``measured`` cold starts and wakes (else the
        manifest's figures), when each serve was last used (last seen busy,
        ``busy_at``, or its latest request), how often each is used where the source
        counts it (``uses``: the times each was seen going busy, with its requests;
        ``None``: none counted yet, as for a loop just begun), and the source's holds,
        no-shrink and no-sleep serves."""
        declared = declared_costs(desired)
        measured = measured or {}
        policy = Policy(
            no_shrink=frozenset(no_shrink),
            hold=dict(hold or {}),
            no_sleep=frozenset(no_sleep),
            reload=restore_costs(declared, measured),
            last_used=last_used(busy_at or {}, desired.requests),
            uses=known_uses(
                desired.serves, uses or {}, ((r.serve, r.requested_at) for r in desired.requests)
            ),
        )
        return cls(
            desired,
            observed,
            now,
            policy,
            records=records or {},
            reload=restore_estimates(declared, measured),
            router=router,
            notes=tuple(notes),
        )

    def with_desired(self, desired: DesiredState) -> Situation:
        """The same situation with another desired state (an edit previewed, a
        hypothetical serve asked about); its plan is made anew. The requests it adds
        count as their serves' uses and latest use, as :meth:`of` counts them."""
        policy = replace(
            self.policy,
            last_used=last_used(self.policy.last_used, desired.requests),
            uses=known_uses(
                desired.serves,
                self.policy.uses,
                ((r.serve, r.requested_at) for r in desired.requests),
            ),
        )
        return replace(self, desired=desired, policy=policy)

    # ── the answers ─────────────────────────────────────────────────────────────

    def status(self) -> HostStatus:
        """The host status: what is held (the pending requests are told apart by
        :meth:`pending`), each placed serve counted on its card."""
        return host_status(self.placed, self.observed, self.records, self.reload)

    def pending(self, requester: str | None = None) -> tuple[PendingStart, ...]:
        """The recorded requests the next cycle starts that nothing holds yet;
        ``requester``'s own is the question, never counted."""
        return pending_starts(
            self.desired, self.observed, policy=self.policy, now=self.now, requester=requester
        )

    def fit(self, serve: str) -> FitAnswer:
        """Can ``serve`` run now, and at what cost (the pending requests held)."""
        pending = self.pending(serve)
        seen = with_pending(self.observed, pending)
        result = fit_serve(
            self.desired, seen, serve, policy=self.policy, now=self.now, placed_on=self.observed
        )
        needs: tuple[RouterNeed, ...] = ()
        if not self.router and result.known:
            needs = start_router_needs(self.desired, seen, result.serve, result.drain, result.sleep)
        note = no_router_reason(f"up {serve}", needs) if needs else None
        return FitAnswer(result, pending, needs, note)

    def up(self, serve: str, *, default_retry_s: float) -> UpDecision:
        """The answer to ``up`` for ``serve`` (its 404 and request-level 409 are the
        caller's to check first)."""
        return decide_up(
            self.desired,
            self.observed,
            serve,
            policy=self.policy,
            now=self.now,
            default_retry_s=default_retry_s,
            router=self.router,
        )
