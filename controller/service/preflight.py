"""The preflight: what is knowable before a plan's first mutation and would make it
fail half-way.

It checks that no container the plan touches has passed to another Compose project
(docs/design.md §3, foreign containers), that containers or ``up`` executables exist,
that an ``up`` names no ``{gpu_*}`` placeholder whose value is unknown (the plan's
observation given), that the router is configured, reachable, has its transition API
enabled and knows every planned tier by name when a router step is planned, that
elastic serves have an endpoint, that every step kind is implemented, and that ports
are free. Each :class:`PreflightProblem` names the plan groups it refuses;
:func:`refuse_dependents` refuses too the starts that needed a refused group's stop.

This module reads the host (Docker, the router) but must not change it, and must not
decide what to do (the planner does).
"""

from __future__ import annotations

from dataclasses import dataclass

from controller.adapters.docker.actions import ActionError
from controller.adapters.router import RouterClient
from controller.service.steps.context import ExecutorReads
from controller.service.steps.dispatch import IMPLEMENTED_ACTIONS
from statemachine.domain.types import DesiredState, Observed, ServeSpec
from statemachine.ledger.gpu_vars import Unknown, UnknownPlaceholderError, gpu_placement
from statemachine.planning.plan_types import (
    Action,
    Plan,
    Step,
)
from statemachine.planning.planner import (
    conflict,
)


@dataclass(frozen=True, slots=True)
class PreflightProblem:
    """One preflight finding: the serve it concerns (``None``: the plan) and the groups
    of the plan it refuses."""

    serve: str | None
    groups: frozenset[str]
    text: str


def preflight_problems(
    plan: Plan, host: ExecutorReads, observed: Observed | None = None
) -> list[PreflightProblem]:
    """Each problem the preflight finds, with the plan groups it refuses.

    A problem of one serve (its container or ``up`` missing, its port taken, an
    elastic step without an endpoint, with the plan's ``observed``: an ``up`` that names
    a ``{gpu_*}`` placeholder whose value is unknown) refuses only the groups of that
    serve's steps; a router that is missing or unreachable refuses the groups that need it.
    """
    problems: list[PreflightProblem] = []
    actions = {s.action for s in plan.steps}
    router_groups = frozenset(
        s.group for s in plan.steps if s.action in (Action.QUIESCE, Action.DRAIN, Action.READMIT)
    )
    if actions & {Action.QUIESCE, Action.DRAIN}:
        tiers = sorted({s.serve for s in plan.steps if s.action is Action.DRAIN})
        if host.router is None:
            problems.append(
                PreflightProblem(
                    None,
                    router_groups,
                    "the plan drains router tiers (" + ", ".join(tiers) + ") before "
                    "stopping them, but no router is configured: set --router-url / "
                    "VRAMCTL_ROUTER_URL",
                )
            )
    if host.router is not None and router_groups:
        problems.extend(_preflight_router(plan, host, host.router, router_groups))
    problems.extend(_preflight_foreign(plan, host))
    stopped_ports: set[int] = set()
    for step in plan.steps:
        serve = host.desired.serves[step.serve]
        if step.action not in IMPLEMENTED_ACTIONS:
            problems.append(
                PreflightProblem(
                    serve.name,
                    frozenset({step.group}),
                    f"{serve.name}: {step.action} planned, but this executor does not implement it",
                )
            )
        if step.action is Action.STOP and serve.port is not None:
            stopped_ports.add(serve.port)
        if step.action is Action.START:
            groups = frozenset({step.group})
            problems.extend(
                PreflightProblem(serve.name, groups, text)
                for text in _preflight_start(host, serve, stopped_ports, step, observed)
            )
        if step.action in (Action.SHRINK, Action.GROW) and serve.elastic is None:
            problems.append(
                PreflightProblem(
                    serve.name,
                    frozenset({step.group}),
                    f"{serve.name}: {step.action} planned but it has no elastic url",
                )
            )
    return problems


def _preflight_router(
    plan: Plan, host: ExecutorReads, router: RouterClient, router_groups: frozenset[str]
) -> list[PreflightProblem]:
    """The router answers, accepts the token, has its transition API enabled, and
    knows each planned tier by name (an unknown one refuses its serve's groups)."""
    err = router.check()
    if err is not None:
        return [PreflightProblem(None, router_groups, f"router {router.base_url}: {err}")]
    groups: dict[str, set[str]] = {}
    for step in plan.steps:
        if step.action in (Action.QUIESCE, Action.DRAIN, Action.READMIT):
            groups.setdefault(step.serve, set()).add(step.group)
    problems: list[PreflightProblem] = []
    for name, gs in groups.items():
        tier = host.desired.serves[name].router_tier
        if not tier:
            continue
        err = router.check(tier_id=tier)
        if err is not None:
            problems.append(
                PreflightProblem(name, frozenset(gs), f"{name}: router_tier {tier!r}: {err}")
            )
    return problems


def _preflight_foreign(plan: Plan, host: ExecutorReads) -> list[PreflightProblem]:
    """A serve that declares its Compose project whose container now bears another
    project's label (it appeared since the observation): its groups are refused, so
    nothing of another stack is started, stopped or drained (docs/design.md §3)."""
    groups: dict[str, set[str]] = {}
    for step in plan.steps:
        if host.desired.serves[step.serve].compose_project is not None:
            groups.setdefault(step.serve, set()).add(step.group)
    problems: list[PreflightProblem] = []
    for name, gs in groups.items():
        serve = host.desired.serves[name]
        try:
            now = host.docker.inspect(serve.container)
        except ActionError as exc:
            text = f"{name}: cannot ask docker whose container {serve.container} is: {exc}"
            problems.append(PreflightProblem(name, frozenset(gs), text))
            continue
        project = None if now is None else now.compose_project
        if project is not None and project != serve.compose_project:
            text = (
                f"{name}: container {serve.container} belongs to compose project "
                f"{project}, not {serve.compose_project}: it is left alone (never started, "
                "stopped or removed)"
            )
            problems.append(PreflightProblem(name, frozenset(gs), text))
    return problems


def _preflight_start(
    host: ExecutorReads,
    serve: ServeSpec,
    stopped_ports: set[int],
    step: Step,
    observed: Observed | None,
) -> list[str]:
    problems: list[str] = []
    try:
        exists = host.docker.exists(serve.container)
    except ActionError as exc:
        return [f"{serve.name}: cannot ask docker whether {serve.container} exists: {exc}"]
    if not exists:
        rt = host.runtime(serve.name)
        argv = rt.up_argv
        if not argv:
            problems.append(
                f"{serve.name}: container {serve.container} does not exist and the serve "
                "has no `up` command to create it"
            )
        elif not host.docker.executable_exists(argv[0], cwd=rt.manifest_dir):
            problems.append(f"{serve.name}: `up` executable {argv[0]!r} not found")
        if argv and observed is not None:  # as the start will substitute them
            roles = step.gpu_roles or serve.gpu_roles
            # what the start will find free is known only then (the plan's stops run
            # first): here each card is taken as empty, to check the placeholders only
            free: dict[str, int | Unknown] = {
                r: host.desired.roles[r].capacity_mib for r in roles if r in host.desired.roles
            }
            placed = gpu_placement(
                roles,
                host.desired.roles,
                observed.gpus,
                free=free,
                vram_mib=step.mib or serve.vram_mib,
            )
            try:
                placed.substitute(argv)
            except UnknownPlaceholderError as exc:
                problems.append(f"{serve.name}: {exc}")
    if (
        serve.port is not None
        and serve.port not in stopped_ports
        and host.docker.port_in_use(serve.port)
    ):
        problems.append(
            f"{serve.name}: port {serve.port} is already in use on 127.0.0.1 "
            "and nothing in the plan frees it"
        )
    return problems


def refuse_dependents(plan: Plan, desired: DesiredState, refused: dict[str, list[str]]) -> None:
    """A refused group's stops do not happen: refuse the starts that needed them.

    Memory is guarded by the ledger at each reserve; exclusivity and ports are not, so
    a start that conflicts with a serve whose stop was refused (in another group) is
    refused too, and so on until nothing more changes.
    """
    while True:
        kept = {st.serve for st in plan.steps if st.action is Action.STOP and st.group in refused}
        added = False
        for st in plan.steps:
            if st.action is not Action.START or st.group in refused:
                continue
            s = desired.serves[st.serve]
            for name in sorted(kept):
                other = desired.serves[name]
                why = conflict(s, other) or conflict(other, s)
                if why is not None:
                    refused[st.group] = [
                        f"{s.name} needs {name} stopped ({why}), and that stop was refused"
                    ]
                    added = True
                    break
        if not added:
            return
