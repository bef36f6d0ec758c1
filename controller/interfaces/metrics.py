"""Prometheus metrics for ``vramctl run`` (served by the HTTP API at ``GET /metrics``).

:class:`Metrics` owns its own :class:`~prometheus_client.CollectorRegistry` (not the
process-global one, so tests and several controllers in one process stay isolated).
It is refreshed from the loop's ``on_cycle`` hook (:meth:`Metrics.on_cycle`), from the
same figures ``vramctl status`` and ``GET /v1/ledger`` print: the loop's live situation's
status (:meth:`statemachine.answers.situation.Situation.status`).

A figure that cannot be measured is *absent*, never 0: when docker cannot be read the
committed / free series (and every serve's committed series) are removed; NVML
figures (used, drift) exist only while NVML reports the device linked to the role.

Series:

- per role: ``vramctl_role_capacity_mib``, ``_reserve_mib``, ``_budget_mib``,
  ``_committed_mib``, ``_free_mib``, ``_nvml_used_mib``, ``_drift_mib`` (NVML used -
  committed), ``vramctl_role_overcommitted`` (1 when committed > budget as observed);
- per placed serve: ``vramctl_serve_placed{serve,role}`` (1 for the card it holds its
  memory on; absent while it holds none or its card is unknown);
- per serve: ``vramctl_serve_reservation_mib`` (declared), ``vramctl_serve_committed_mib``
  (what the ledger holds for it now: 0 when nothing), ``vramctl_serve_state{state}``
  (1 for the current lifecycle state, 0 for the others), ``vramctl_serve_backoff_failures``
  (the failed starts the loop's backoff holds it back after; 0 when none),
  ``vramctl_serve_foreign{serve,compose_project}`` (1 while the serve's container name is
  borne by another Compose project's container, which vramctl never acts on; absent
  otherwise);
- per serve, its measured footprint (docs/limits.md): ``vramctl_serve_measured_mib``
  (the largest attributable sample; absent while none is), ``vramctl_serve_footprint_samples``
  (samples in the journal, attributable or not) and
  ``vramctl_serve_footprint_over_reservation`` (1 when the measured figure exceeds the
  declared reservation, 0 when it does not; absent while nothing is measured);
- the host RAM budget sleepers hold their weights in: ``vramctl_host_ram_mib{figure}``
  (``budget``, ``committed``, ``free``; absent without a ``[host]`` budget, committed and
  free absent while docker cannot be read) and ``vramctl_serve_host_ram_mib`` (what a
  sleeping serve holds there);
- ``vramctl_reconcile_duration_seconds`` (histogram), ``vramctl_cycles_total``,
  ``vramctl_last_cycle_timestamp_seconds``, ``vramctl_steps_total{action,outcome}``
  (outcome ``planned`` for a dry run), ``vramctl_admissions_refused_total{source}``
  (``api``: an ``up`` answered 429; ``loop``: a start the planner newly reports
  blocked), ``vramctl_observation_errors_total{source}`` (``docker`` / ``nvml``: cycles
  whose observation of that source failed, NVML missing on a host without a GPU
  included) and ``vramctl_observation_up{source}`` (1 when the last cycle read it).

Each family's name, help and label names are in one table (``_FAMILIES``); three
methods (roles, serves, the loop's own) declare them, in the order they are exposed.
This module must not decide anything: it reports the figures the core computed.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from loguru import logger
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from statemachine.answers.status_report import HostStatus
from statemachine.lifecycle.machine import STATES

if TYPE_CHECKING:
    from controller.service.loop_port import LoopPort

#: The lifecycle states a serve can be reported in (the machine's, plus ``unknown``).
SERVE_STATES: tuple[str, ...] = (*(str(s["name"]) for s in STATES), "unknown")

#: The exposition format's content type (for the HTTP response).
CONTENT_TYPE = CONTENT_TYPE_LATEST


#: Every gauge and counter family: name -> (help, label names), declared by
#: :class:`Metrics` through :func:`_spec`. The histogram
#: (``vramctl_reconcile_duration_seconds``, with its buckets) is declared in the class.
_FAMILIES: dict[str, tuple[str, tuple[str, ...]]] = {
    # per role: the declaration, the ledger, the device
    "vramctl_role_capacity_mib": ("Declared capacity of the GPU role.", ("role",)),
    "vramctl_role_reserve_mib": ("Never-reservable reserve of the role.", ("role",)),
    "vramctl_role_budget_mib": ("Budget of the role: capacity - reserve.", ("role",)),
    "vramctl_role_committed_mib": (
        "Committed reservations on the role (absent while docker cannot be read).",
        ("role",),
    ),
    "vramctl_role_free_mib": (
        "Budget minus committed (absent while docker cannot be read).",
        ("role",),
    ),
    "vramctl_role_nvml_used_mib": (
        "Memory NVML reports used on the role's device (absent when unknown).",
        ("role",),
    ),
    "vramctl_role_drift_mib": (
        "NVML used minus committed: memory drawn outside the ledger (absent when unknown).",
        ("role",),
    ),
    "vramctl_role_overcommitted": (
        "1 when the role is observed over budget (started outside the controller).",
        ("role",),
    ),
    # per serve: reservation, ledger, lifecycle state
    "vramctl_serve_reservation_mib": (
        "The serve's declared reservation (absent when it declares none).",
        ("serve",),
    ),
    "vramctl_serve_committed_mib": (
        "What the ledger holds for the serve now (0: nothing; absent when unknown).",
        ("serve",),
    ),
    "vramctl_serve_state": (
        "1 for the serve's current lifecycle state, 0 for the others.",
        ("serve", "state"),
    ),
    # the loop's failure backoff per serve (alerts: a serve backing off)
    "vramctl_serve_backoff_failures": (
        "Failed starts the serve is backing off after (0: no backoff).",
        ("serve",),
    ),
    # a container of another Compose project bearing the serve's container name
    "vramctl_serve_foreign": (
        "1 while the serve's container name is borne by another Compose project's "
        "container (never acted on; counted while it runs); absent otherwise.",
        ("serve", "compose_project"),
    ),
    # the card a placed serve holds its memory on (docs/placement.md)
    "vramctl_serve_placed": (
        "1 for the GPU role a placed serve holds its memory on; absent while it holds "
        "none or its card is unknown.",
        ("serve", "role"),
    ),
    # measured footprints (device deltas around starts and stops; docs/limits.md)
    "vramctl_serve_measured_mib": (
        "Measured footprint: the largest attributable sample (absent while none is).",
        ("serve",),
    ),
    "vramctl_serve_footprint_samples": (
        "Footprint samples recorded for the serve (attributable or not).",
        ("serve",),
    ),
    "vramctl_serve_footprint_over_reservation": (
        "1 when the measured footprint exceeds the declared reservation.",
        ("serve",),
    ),
    # the [host] RAM budget the sleepers' weights are held in (docs/eviction.md)
    "vramctl_host_ram_mib": (
        "The host RAM budget (figure=budget), what sleepers hold of it (committed) and "
        "what is left (free); absent without a [host] budget or while unknown.",
        ("figure",),
    ),
    "vramctl_serve_host_ram_mib": (
        "Host RAM a sleeping serve holds (its weights, level 1); absent when none or unknown.",
        ("serve",),
    ),
    # the loop's own series
    "vramctl_cycles": ("Reconcile cycles completed.", ()),
    "vramctl_last_cycle_timestamp_seconds": (
        "When the last cycle observed the host (epoch seconds).",
        (),
    ),
    "vramctl_steps": (
        "Plan steps by action and outcome (planned: a dry run executed nothing).",
        ("action", "outcome"),
    ),
    "vramctl_admissions_refused": (
        "Refused admissions: api = an up answered 429; loop = a start newly blocked.",
        ("source",),
    ),
    "vramctl_observation_errors": (
        "Cycles whose observation of a source (docker, nvml) failed.",
        ("source",),
    ),
    "vramctl_observation_up": (
        "1 when the last cycle could read the source (docker, nvml).",
        ("source",),
    ),
}


def _spec(name: str) -> tuple[str, str, tuple[str, ...]]:
    """The family ``name`` of :data:`_FAMILIES` as a metric's arguments: name, help, labels."""
    doc, labels = _FAMILIES[name]
    return name, doc, labels


def _set_or_absent(gauge: Gauge, labels: tuple[str, ...], value: int | float | None) -> None:
    """Set the series, or remove it when the value is unknown (absent, never 0)."""
    if value is None:
        with contextlib.suppress(KeyError):
            gauge.remove(*labels)
    else:
        gauge.labels(*labels).set(value)


class Metrics:
    """The controller's metrics, in a registry of their own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._declare_roles()
        self._declare_serves()
        self._declare_cycles()
        for source in ("docker", "nvml"):
            self.observation_errors.labels(source)
        for source in ("api", "loop"):
            self.admissions_refused.labels(source)
        self._roles: set[str] = set()
        self._serves: set[str] = set()
        self._footprinted: set[str] = set()
        self._blocked: set[str] = set()
        self._host_held: set[str] = set()
        self._foreign: set[tuple[str, str]] = set()
        self._placed: set[tuple[str, str]] = set()

    def _declare_roles(self) -> None:
        """The per-role gauges: the declaration, the ledger, the device."""
        r = self.registry
        self.role_capacity = Gauge(*_spec("vramctl_role_capacity_mib"), registry=r)
        self.role_reserve = Gauge(*_spec("vramctl_role_reserve_mib"), registry=r)
        self.role_budget = Gauge(*_spec("vramctl_role_budget_mib"), registry=r)
        self.role_committed = Gauge(*_spec("vramctl_role_committed_mib"), registry=r)
        self.role_free = Gauge(*_spec("vramctl_role_free_mib"), registry=r)
        self.role_nvml_used = Gauge(*_spec("vramctl_role_nvml_used_mib"), registry=r)
        self.role_drift = Gauge(*_spec("vramctl_role_drift_mib"), registry=r)
        self.role_overcommitted = Gauge(*_spec("vramctl_role_overcommitted"), registry=r)

    def _declare_serves(self) -> None:
        """The per-serve gauges: reservation, state, footprint, host RAM."""
        r = self.registry
        self.serve_reservation = Gauge(*_spec("vramctl_serve_reservation_mib"), registry=r)
        self.serve_committed = Gauge(*_spec("vramctl_serve_committed_mib"), registry=r)
        self.serve_state = Gauge(*_spec("vramctl_serve_state"), registry=r)
        self.serve_backoff = Gauge(*_spec("vramctl_serve_backoff_failures"), registry=r)
        self.serve_foreign = Gauge(*_spec("vramctl_serve_foreign"), registry=r)
        self.serve_placed = Gauge(*_spec("vramctl_serve_placed"), registry=r)
        self.serve_measured = Gauge(*_spec("vramctl_serve_measured_mib"), registry=r)
        self.serve_samples = Gauge(*_spec("vramctl_serve_footprint_samples"), registry=r)
        self.serve_over = Gauge(*_spec("vramctl_serve_footprint_over_reservation"), registry=r)
        self.host_ram = Gauge(*_spec("vramctl_host_ram_mib"), registry=r)
        self.serve_host_ram = Gauge(*_spec("vramctl_serve_host_ram_mib"), registry=r)

    def _declare_cycles(self) -> None:
        """The loop's own series: cycles, steps, refusals, observation errors."""
        r = self.registry
        self.reconcile_duration = Histogram(
            "vramctl_reconcile_duration_seconds",
            "Duration of one reconcile cycle (observe, plan, execute, journal).",
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600),
            registry=r,
        )
        self.cycles = Counter(*_spec("vramctl_cycles"), registry=r)
        self.last_cycle = Gauge(*_spec("vramctl_last_cycle_timestamp_seconds"), registry=r)
        self.steps = Counter(*_spec("vramctl_steps"), registry=r)
        self.admissions_refused = Counter(*_spec("vramctl_admissions_refused"), registry=r)
        self.observation_errors = Counter(*_spec("vramctl_observation_errors"), registry=r)
        self.observation_up = Gauge(*_spec("vramctl_observation_up"), registry=r)

    # ------------------------------------------------------------------ updates
    def on_cycle(self, controller: LoopPort) -> None:
        """The loop's ``on_cycle`` hook: refresh everything from the last cycle.

        A failure here is logged and never breaks the loop.
        """
        try:
            self._on_cycle(controller)
        except Exception:
            logger.exception("metrics: update failed")

    def _on_cycle(self, controller: LoopPort) -> None:
        summary = controller.view()
        self.cycles.inc()
        self.reconcile_duration.observe(summary.duration_s)
        self.last_cycle.set(summary.at)
        snap = summary.snapshot
        if snap is not None:
            docker_ok = snap.docker == "ok" and not snap.docker_error
            self.observation_up.labels("docker").set(1 if docker_ok else 0)
            self.observation_up.labels("nvml").set(0 if snap.gpus is None else 1)
            if not docker_ok:
                self.observation_errors.labels("docker").inc()
            if snap.gpus is None or snap.nvml_error:
                self.observation_errors.labels("nvml").inc()
            self.update_ledger(controller)
        self.update_footprints(controller)
        if summary.report is not None:
            for result in summary.report.results:
                self.steps.labels(str(result.step.action), str(result.outcome)).inc()
        elif summary.plan is not None and not summary.executed:
            for step in summary.plan.steps:
                self.steps.labels(str(step.action), "planned").inc()
        if summary.plan is not None:
            blocked = {b.serve for b in summary.plan.blocked}
            new = blocked - self._blocked
            if new:
                self.admissions_refused.labels("loop").inc(len(new))
            self._blocked = blocked

    def update_ledger(self, controller: LoopPort) -> None:
        """Per-role and per-serve gauges from the last snapshot and the manifest set."""
        view = controller.view()
        if view.snapshot is None:  # no observation yet: every series absent
            return
        # the live situation, as GET /v1/ledger answers: each placed serve on its card
        report = controller.situation().status()
        roles: set[str] = set()
        for rs in report.roles:
            role = rs.ledger.gpu_role
            roles.add(role)
            labels = (role,)
            self.role_capacity.labels(role).set(rs.ledger.capacity_mib)
            self.role_reserve.labels(role).set(rs.ledger.reserve_mib)
            self.role_budget.labels(role).set(rs.ledger.budget_mib)
            _set_or_absent(self.role_committed, labels, rs.ledger.committed_mib)
            _set_or_absent(self.role_free, labels, rs.ledger.free_mib)
            _set_or_absent(self.role_nvml_used, labels, rs.nvml_used_mib)
            _set_or_absent(self.role_drift, labels, rs.drift_used_mib)
            self.role_overcommitted.labels(role).set(1 if rs.overcommitted else 0)
        for gone in self._roles - roles:
            for gauge in self._role_gauges():
                _set_or_absent(gauge, (gone,), None)
        self._roles = roles

        holdings = {
            holder: held
            for rs in report.roles
            for holder, held in rs.ledger.reservations
            if rs.ledger.committed_mib is not None
        }
        serves: set[str] = set()
        for ss in report.serves:
            serves.add(ss.serve)
            labels = (ss.serve,)
            _set_or_absent(self.serve_reservation, labels, ss.reservation_mib)
            committed: int | None
            if not report.docker_ok or not ss.in_ledger:
                committed = None
            else:
                committed = holdings.get(ss.serve, 0)
            _set_or_absent(self.serve_committed, labels, committed)
            for state in SERVE_STATES:
                self.serve_state.labels(ss.serve, state).set(1 if state == ss.lifecycle else 0)
            held = view.backoff.get(ss.serve)
            self.serve_backoff.labels(ss.serve).set(held.failures if held is not None else 0)
        for gone in self._serves - serves:
            _set_or_absent(self.serve_reservation, (gone,), None)
            _set_or_absent(self.serve_committed, (gone,), None)
            _set_or_absent(self.serve_backoff, (gone,), None)
            for state in SERVE_STATES:
                _set_or_absent(self.serve_state, (gone, state), None)
        self._serves = serves
        self._update_foreign(report)
        self._update_placed(report)
        self._update_host(report)

    def _update_foreign(self, report: HostStatus) -> None:
        """One series per serve whose container is another Compose project's."""
        foreign = {
            (ss.serve, ss.foreign_project) for ss in report.serves if ss.foreign_project is not None
        }
        for labels in foreign:
            self.serve_foreign.labels(*labels).set(1)
        for gone in self._foreign - foreign:
            _set_or_absent(self.serve_foreign, gone, None)
        self._foreign = foreign

    def _update_placed(self, report: HostStatus) -> None:
        """One series per placed serve that holds its memory on one known card."""
        placed = {
            (ss.serve, ss.gpu_roles[0])
            for ss in report.serves
            if ss.placement and ss.committed and len(ss.gpu_roles) == 1
        }
        for labels in placed:
            self.serve_placed.labels(*labels).set(1)
        for gone in self._placed - placed:
            _set_or_absent(self.serve_placed, gone, None)
        self._placed = placed

    def _update_host(self, report: HostStatus) -> None:
        """The host RAM line and what each sleeper holds of it (absent when unknown)."""
        h = report.host
        _set_or_absent(self.host_ram, ("budget",), None if h is None else h.budget_mib)
        _set_or_absent(self.host_ram, ("committed",), None if h is None else h.committed_mib)
        _set_or_absent(self.host_ram, ("free",), None if h is None else h.free_mib)
        held = {
            ss.serve: ss.host_ram_mib
            for ss in report.serves
            if report.docker_ok and ss.host_ram_mib is not None
        }
        for name, mib in held.items():
            self.serve_host_ram.labels(name).set(mib)
        for gone in self._host_held - set(held):
            _set_or_absent(self.serve_host_ram, (gone,), None)
        self._host_held = set(held)

    def update_footprints(self, controller: LoopPort) -> None:
        """Per-serve measured footprints from the loop's view (absent when unknown)."""
        footprints = controller.view().footprints
        for name, f in footprints.items():
            labels = (name,)
            measured = f.get("measured_mib")
            _set_or_absent(self.serve_measured, labels, measured)
            self.serve_samples.labels(name).set(int(f.get("samples") or 0))
            over = None if measured is None else (1 if f.get("exceeds_reservation") else 0)
            _set_or_absent(self.serve_over, labels, over)
        for gone in self._footprinted - set(footprints):
            for gauge in (self.serve_measured, self.serve_samples, self.serve_over):
                _set_or_absent(gauge, (gone,), None)
        self._footprinted = set(footprints)

    def refused(self, source: str = "api") -> None:
        """Count one refused admission (the API's 429)."""
        self.admissions_refused.labels(source).inc()

    def _role_gauges(self) -> tuple[Gauge, ...]:
        return (
            self.role_capacity,
            self.role_reserve,
            self.role_budget,
            self.role_committed,
            self.role_free,
            self.role_nvml_used,
            self.role_drift,
            self.role_overcommitted,
        )

    # ------------------------------------------------------------------ output
    def render(self) -> bytes:
        """The text exposition format."""
        return generate_latest(self.registry)
