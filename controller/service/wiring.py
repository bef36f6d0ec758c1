"""Wiring: builds the executor and the readers from a manifest set and the options.

Shared by ``vramctl apply`` and the control loop so both drive the host the same way
(``apply`` builds its executor here; the loop builds it here too, with its start
tracker and its own container reader).
It must not decide or mutate anything itself: it only constructs.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from controller.adapters.docker.actions import DockerActions
from controller.adapters.docker.read import ContainerObserver, make_client, manifest_containers
from controller.adapters.elastic import ElasticClient
from controller.adapters.nvml import NvmlApi, observe_gpus
from controller.adapters.router import RouterClient, busy_budget_s, router_token
from controller.manifest import ManifestSet
from controller.service.executor import Executor, ExecutorConfig, StepResult
from controller.service.footprints import Footprints
from controller.service.starts import StartTracker
from statemachine.domain.types import GpuObs, Observed


def read_gpus(api: NvmlApi | None = None) -> tuple[GpuObs, ...] | None:
    """The devices now, as the core sees them; ``None`` when NVML is unavailable."""
    obs = observe_gpus(api)
    if obs.gpus is None:
        return None
    return tuple(g.to_obs() for g in obs.gpus)


def containers_now(mset: ManifestSet, observer: ContainerObserver | None = None) -> Observed:
    """The manifest set's containers as they are now (no NVML): for admission mid-plan."""
    own = observer is None
    reader = ContainerObserver() if observer is None else observer
    try:
        return reader.observe(manifest_containers(mset.serves)).to_snapshot_model().to_observed()
    finally:
        if own:
            reader.close()


def make_executor(
    mset: ManifestSet,
    *,
    router_url: str | None,
    router_token_file: Path | None,
    on_step: Callable[[StepResult], None] | None = None,
    stop_event: threading.Event | None = None,
    gpus: Callable[[], tuple[GpuObs, ...] | None] = read_gpus,
    config: ExecutorConfig | None = None,
    observe_now: Callable[[], Observed] | None = None,
    starts: StartTracker | None = None,
    footprints: Footprints | None = None,
    reuse: Executor | None = None,
) -> Executor:
    """An executor for ``mset`` talking to the local docker daemon (DOCKER_HOST honoured).

    ``observe_now``: a fresh reading of the containers each reserve is admitted against;
    ``starts``: the tracker that carries starts out beside the loop (``None``: in order);
    ``reuse``: an executor (of an earlier manifest) whose docker and elastic clients the
    new one shares, instead of connecting again (a docker client negotiates the API
    version, an HTTP client loads its TLS context: more than a whole cycle costs).
    """
    router = None
    if router_url:
        # the router holds its one mutation lock for a whole drain: a quiesce may meet
        # 503 server_busy for as long as the longest drain of the manifest's tiers
        drains = [
            rt.drain_timeout_s
            for name, rt in mset.runtime().items()
            if mset.serves[name].router_tier
        ]
        router = RouterClient(
            router_url, router_token(router_token_file), busy_wait_s=busy_budget_s(drains)
        )
    return Executor(
        mset.desired(),
        docker=reuse.docker if reuse is not None else DockerActions(make_client()),
        runtime=mset.runtime(),
        router=router,
        # the engine may hold a resize up to 300 s before answering 409 (busy): the
        # client's own bound (20 s) keeps the loop going; no answer is not proof
        elastic=reuse.elastic if reuse is not None else ElasticClient(),
        gpus=gpus,
        config=config,
        on_step=on_step,
        stop_event=stop_event,
        observe_now=observe_now,
        starts=starts,
        footprints=footprints,
    )
