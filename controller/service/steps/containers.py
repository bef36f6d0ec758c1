"""The containers' steps: stop, release, reserve, start and await a serve's readiness.

- a reservation is admitted (``reserve``) before its start, against a fresh reading
  of the containers (:func:`admit_against_host_now`), which the start reads again
  right before its Docker call (a container started outside the controller meanwhile
  aborts it; the serve's own, started by hand after its reserve, is taken as started:
  nothing is started twice);
- a release is applied only after the stop is confirmed (the container exited and,
  where NVML sees the role's device, the memory came back within a bound);
- a start runs ``docker start`` on an existing container or the serve's ``up``
  command (its process told to the start tracker; its environment and arguments told
  which GPU it was put on, :mod:`statemachine.ledger.gpu_vars`), and ``await_ready`` waits for the
  Docker healthcheck, the health path or, with neither, the running container.

This module must not decide what to start or stop (the planner does) and reaches
Docker only through the run's :class:`~controller.adapters.docker.actions.DockerActions`.
"""

from __future__ import annotations

import re
import time

from controller.adapters.docker.actions import ActionError
from controller.adapters.health import http_ready
from controller.service.pauses import pauses
from controller.service.steps.context import RunContext
from controller.service.steps.lifecycle import begin_start, fire
from controller.service.steps.results import StepError
from controller.snapshot import ContainerModel
from statemachine import engines
from statemachine.domain.types import COMMITTED_STATES, ContainerState, Observed, ServeSpec
from statemachine.ledger.gpu_vars import UnknownPlaceholderError, free_at_start, gpu_placement
from statemachine.ledger.reservations import GpuReservation, Ledger, Refusal, held_uncounted
from statemachine.lifecycle.machine import Trigger
from statemachine.planning.plan_types import (
    Step,
)
from statemachine.sizing.start_hints import SIGKILLED, memory_hint


def stop(run: RunContext, step: Step, s: ServeSpec) -> str:
    run.used_before_stop[s.name] = run.role_used(s.gpu_roles)
    run.attributed[s.name] = run.observed.container(s.container).gpu_used_mib
    timeout = run.ex.runtime(s.name).stop_timeout_s
    fire(run, s.name, Trigger.STOP)
    try:
        run.ex.docker.stop(s.container, timeout)
        state = run.ex.docker.inspect(s.container)
    except ActionError as exc:
        fire(run, s.name, Trigger.STOP_FAILED)
        raise StepError(f"docker stop {s.container}: {exc}") from None
    if state is not None and state.state in COMMITTED_STATES:
        fire(run, s.name, Trigger.STOP_FAILED)
        raise StepError(f"{s.container} is still {state.state} after docker stop")
    for members in (*run.quiesced.values(), *run.others_quiesced.values()):
        if s.name in members:
            members.remove(s.name)
    if not run.ledger.holds(s.name):
        fire(run, s.name, Trigger.STOPPED)
    code = state.exit_code if state is not None else None
    return f"{s.container} exited" + (f" ({code})" if code is not None else "")


def release(run: RunContext, step: Step, s: ServeSpec) -> str:
    """Confirm the stop freed the memory, then release the reservation.

    A serve need not use all it reserved, so the drop to wait for is what NVML
    attributed to its container before the stop (``gpu_used_mib``); where that is
    unknown (no per-process figures, e.g. WSL2) the exited container is the only
    confirmation there is, and the step says so.
    """
    before = run.used_before_stop.get(s.name, {})
    attributed = run.attributed.get(s.name)
    mib = step.mib or 0
    waited = "; NVML cannot attribute memory to the container: confirmed by its exit"
    if before and attributed is not None:
        # the attributed figure is the container's total over all its devices: what
        # must come back is that total, summed over the roles' devices
        tol = run.ex.config.memory_tolerance_mib
        deadline = time.monotonic() + run.ex.config.memory_wait_s
        pause = pauses(run.ex.config.poll_s)
        while True:
            now = run.role_used(s.gpu_roles)
            back = sum(before[r] - now[r] for r in before if r in now)
            if back >= attributed - tol:
                waited = f"; NVML shows its {attributed} MiB back"
                break
            if time.monotonic() >= deadline:
                detail = ", ".join(f"{r} used {before[r]} -> {now.get(r, '?')} MiB" for r in before)
                raise StepError(
                    f"{s.container} exited but the {attributed} MiB it used did not come "
                    f"back within {run.ex.config.memory_wait_s:g}s ({detail}); "
                    "the release is not confirmed"
                )
            time.sleep(next(pause))
    result = run.ledger.release(s.name)
    if isinstance(result, Refusal):
        return f"nothing to release: {result.message}"
    run.ledger = result
    fire(run, s.name, Trigger.STOPPED)
    return f"released {mib} MiB on {', '.join(s.gpu_roles)}{waited}"


def reserve(run: RunContext, step: Step, s: ServeSpec) -> str:
    assert step.mib is not None
    admit_against_host_now(run, s)
    result = run.ledger.admit(GpuReservation(s.name, s.gpu_roles, step.mib))
    if isinstance(result, Refusal):
        raise StepError(f"the ledger refuses: {result.message}")
    run.ledger = result
    run.reserved[s.name] = step.group
    if run.ex.starts is not None:
        run.tokens[s.name] = run.ex.starts.begin(s.name, s.gpu_roles, step.mib)
    fire(run, s.name, Trigger.RESERVE)
    return f"reserved {step.mib} MiB on {', '.join(s.gpu_roles)}"


def admit_against_host_now(
    run: RunContext, s: ServeSpec, *, aborted: bool = False
) -> Observed | None:
    """Read the containers again before a reserve, and again right before the start's
    Docker call: the plan's observation, and the reserve's, may be old.

    A serve of the manifest whose container holds memory now, though neither the
    plan's ledger nor a start in progress counts it, was started outside the
    controller while the plan ran: it joins this run's ledger (so nothing later in
    the plan is admitted into its room) and the step fails (``aborted``: the start's
    check, no failure of the serve's own), to be planned again from the host as it
    is. Docker unreadable now: nothing is admitted. Returns what it read (None: the
    executor has no reader).
    """
    if run.ex.observe_now is None:
        return None
    fresh = run.ex.observe_now()
    if not fresh.docker_ok:
        raise StepError(
            "docker cannot be read now: nothing is admitted until it can", aborted=aborted
        )
    in_progress = run.ex.starts.snapshot() if run.ex.starts is not None else {}
    parent = run.parent.ledger if run.parent is not None else None

    def counted(name: str) -> bool:  # by this run's ledger, its parent's, or a start
        return (
            run.ledger.holds(name)
            or (parent is not None and parent.holds(name))
            or (name in in_progress)
        )

    outside = held_uncounted(run.desired, fresh, counted)
    if outside:
        run.ledger = Ledger(
            run.desired.roles,
            [*run.ledger.holdings.values(), *outside],
            host=run.ledger.host,
            host_holdings=run.ledger.host_holdings,
        )
        names = ", ".join(r.holder for r in outside)
        raise StepError(
            f"{names} started outside the controller while this plan ran "
            f"({' + '.join(f'{r.holder} {r.mib}' for r in outside)} MiB now held): "
            f"{s.name} is not admitted; the next cycle plans from the host as it is",
            aborted=aborted,
        )
    return fresh


def _made_for_another_card(run: RunContext, step: Step, s: ServeSpec) -> str | None:
    """The card(s) a stopped container was made for when not the card(s) this start
    reserved (``"no card"``: a placed serve's that names none), else None. Such a
    container is removed and made again by ``up`` (docs/placement.md), so a serve
    re-pinned by an edit or placed on another card never restarts on the device its
    old container was given. A container's environment (``VRAMCTL_GPU_ROLE``) says what
    its ``up`` was told; a pinned serve's container made without the variable (by
    Compose, say), or a placed serve's without an ``up`` to make it again, is started as
    it is. Never a running one: a start step runs only for a serve whose container
    holds nothing."""
    roles = step.gpu_roles or s.gpu_roles
    if not roles:
        return None
    told = run.ex.docker.created_for(s.container)
    if told == ",".join(roles):
        return None
    if told is None:
        return "no card" if s.placement and run.ex.runtime(s.name).up_argv else None
    return told


def _made_again(run: RunContext, step: Step, s: ServeSpec) -> bool:
    """True when the stopped container was made for another card and is removed, for
    ``up`` to make it on this start's; a serve without ``up`` is not started then."""
    other = _made_for_another_card(run, step, s)
    if other is None:
        return False
    if not run.ex.runtime(s.name).up_argv:
        raise StepError(
            f"{s.container} was made for {other}, and {s.name} is to run on "
            f"{', '.join(step.gpu_roles or s.gpu_roles)} with no `up` to make it there: not "
            "started (make its container for that card, declare an `up`, or pin it back)"
        )
    run.ex.docker.remove_stopped(s.container)  # `up` creates it on this card
    return True


def start(run: RunContext, step: Step, s: ServeSpec) -> str:
    begin_start(run, s.name)
    try:
        exists = run.ex.docker.exists(s.container)
        if step.mib:  # in the ledger: admitted again, as close to the call as can be
            fresh = admit_against_host_now(run, s, aborted=True)
            if fresh is not None and fresh.container(s.container).holds:
                # started outside the controller after its reserve, into the room the
                # reserve holds for it: what the plan wanted; never started twice
                run.reserved.pop(s.name, None)
                return (
                    f"{s.container} runs already (started outside the controller after "
                    "its reserve): not started again; its reservation counts it"
                )
        if exists and _made_again(run, step, s):
            exists = False
        if exists:
            run.ex.docker.start(s.container)
            how = f"docker start {s.container}"
        else:
            rt = run.ex.runtime(s.name)
            if not rt.up_argv:
                raise StepError(f"{s.container} does not exist and {s.name} has no `up`")
            # where the serve was put, told to `up` (statemachine/ledger/gpu_vars.py): the
            # roles reserved for this start, the declared uuids, NVML's indexes as last seen
            roles = step.gpu_roles or s.gpu_roles
            gpus = run.observed.gpus
            placed = gpu_placement(
                roles,
                run.desired.roles,
                gpus,
                free=free_at_start(roles, s.name, run.ledger, run.desired.roles, gpus),
                vram_mib=step.mib or s.vram_mib,
            )
            try:
                argv = placed.substitute(rt.up_argv)
            except UnknownPlaceholderError as exc:
                raise StepError(f"{exc}; `up` is not run") from None
            timeout = rt.start_timeout_s
            tracker = run.ex.starts
            mib = step.mib or 0

            def spawned(pid: int) -> None:
                if tracker is not None:
                    tracker.up_spawned(s.name, pid, roles=s.gpu_roles, mib=mib, timeout_s=timeout)

            try:
                res = run.ex.docker.run_up(
                    argv,
                    cwd=rt.manifest_dir,
                    timeout_s=timeout,
                    env=placed.environment(rt.up_env),
                    on_spawn=spawned,
                )
            finally:
                if tracker is not None:
                    tracker.up_exited(s.name)
            if res.returncode != 0:
                how = (
                    f"timed out after {timeout:g}s"
                    if res.returncode is None
                    else f"exited {res.returncode}"
                )
                raise StepError(
                    f"`up` {how}: {_reason(res.output)} (`up`: {' '.join(argv)})",
                    logs=res.output,
                )
            if not run.ex.docker.exists(s.container):
                raise StepError(
                    f"`up` succeeded but container {s.container} does not exist",
                    logs=res.output,
                )
            how = f"ran `up` ({argv[0]} …)"
    except ActionError as exc:
        raise StepError(f"start {s.container}: {exc}", logs=run.logs(s.container)) from None
    run.reserved.pop(s.name, None)
    return how


def await_ready(run: RunContext, step: Step, s: ServeSpec) -> str:
    rt = run.ex.runtime(s.name)
    timeout, health = rt.start_timeout_s, rt.health
    deadline = time.monotonic() + timeout
    pause = pauses(run.ex.config.poll_s)
    while True:
        try:
            state = run.ex.docker.inspect(s.container)
        except ActionError as exc:
            raise StepError(f"cannot inspect {s.container}: {exc}") from None
        if state is None:
            raise StepError(f"{s.container} disappeared while starting")
        if state.oom_killed or state.state in (ContainerState.EXITED, ContainerState.DEAD):
            state = _settled(run, s.container, state)
            why = "was OOM-killed" if state.oom_killed else f"exited ({state.exit_code})"
            logs = run.logs(s.container)
            hint = memory_hint(
                s.name,
                s.vram_mib,
                engine=engines.lookup(rt.engine),
                oom_killed=bool(state.oom_killed),
                exit_code=state.exit_code,
                logs=logs,
            )
            said = f": {_log_reason(logs)}" if logs and logs.strip() else ""  # its own words
            raise StepError(
                f"{s.container} {why} while starting{said}" + (f"; {hint}" if hint else ""),
                logs=logs,
                died_started_at=_epoch_or_none(state.started_at),
            )
        if state.state is ContainerState.RUNNING:
            if state.health is not None:
                if state.health == "healthy":
                    fire(run, s.name, Trigger.READY)
                    return "docker healthcheck: healthy"
            elif s.port is not None and health:
                url = f"http://127.0.0.1:{s.port}{health}"
                if http_ready(url):
                    fire(run, s.name, Trigger.READY)
                    return f"GET {url}: 2xx"
            else:
                fire(run, s.name, Trigger.READY)
                return "running (no health path or healthcheck declared)"
        if time.monotonic() >= deadline:
            raise StepError(
                f"{s.name} not healthy after start_timeout_s {timeout:g}s",
                logs=run.logs(s.container),
            )
        if run.ex.stop_event.is_set():
            # leave the start running: the container holds its reservation, and
            # the next controller finds it starting instead of starting it again
            raise StepError(
                "the controller is stopping: left starting, not awaited", interrupted=True
            )
        time.sleep(next(pause))


def _settled(run: RunContext, container: str, state: ContainerModel) -> ContainerModel:
    """A container that died killed (exit 137) without Docker's OOMKilled, inspected again
    for a second: on cgroup v2 the kernel's out-of-memory event can reach Docker after
    the exit (containerd issues 12260, 12372)."""
    deadline = time.monotonic() + 1.0
    while state.exit_code == SIGKILLED and not state.oom_killed and time.monotonic() < deadline:
        time.sleep(0.1)
        try:
            again = run.ex.docker.inspect(container)
        except ActionError:
            return state
        if again is None:
            return state
        state = again
    return state


#: a line of a container's log that names why it failed
_FAILURE = re.compile(
    r"\b(error|failed|unsupported|insufficient|invalid|cannot|out of memory)\b", re.IGNORECASE
)


def _log_reason(logs: str) -> str:
    """The line of a container's log that says why it ended: the first that names a
    failure (what follows is its consequences), else its last line; at most 300 chars."""
    lines = [ln.strip() for ln in logs.splitlines() if ln.strip()]
    if not lines:
        return "no output"
    return next((ln for ln in lines if _FAILURE.search(ln)), lines[-1])[:300]


def _reason(output: str) -> str:
    """The line of an ``up`` command's output that says why it failed (Docker's error)."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    if not lines:
        return "no output"
    marked = [ln for ln in lines if "error" in ln.lower() or "unable" in ln.lower()]
    return (marked or lines)[-1][:300]


def _epoch_or_none(value: str | float | None) -> float | None:
    from controller.snapshot import epoch_seconds

    try:
        return epoch_seconds(value)
    except ValueError:
        return None
