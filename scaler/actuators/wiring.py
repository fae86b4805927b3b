"""Build every Kubernetes adapter from settings over one shared client, and close them."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

from scaler.actuators import (
    base,
    capacitybuffer,
    cluster_reader,
    configmap,
    deletion_cost,
    events,
    leader,
    nodepool,
    replicas,
    timefmt,
)
from scaler.actuators import client as kube
from scaler.actuators import settings as kube_settings
from scaler.policy import model

log = logging.getLogger(__name__)


@dataclass(slots=True)
class KubeAdapters:
    """What the service needs: reader, replica actuator, pool actuators by the pool's
    `actuator` name, the leader elector. `start()` starts the reader's watches; the service
    runs `leader.run()` as a supervised task; `close()` releases the Lease and the client."""

    api: kube.KubeApi
    reader: cluster_reader.KubeClusterReader
    replicas: replicas.KubeReplicaActuator
    leader: base.LeaderElector
    recorder: events.EventRecorder
    pools: dict[str, base.NodePoolActuator] = field(default_factory=dict)
    learned: configmap.ConfigMapStore | None = None
    """The engine's learned state (`kube.learned_state`), None when off."""

    async def start(self) -> None:
        await self.reader.start()

    async def update(self, policies: Iterable[model.ScalePolicy]) -> None:
        """A new policy set: pods are watched in its namespaces only (see the reader)."""
        await self.reader.update(policies)

    async def close(self) -> None:
        await self.reader.stop()
        with contextlib.suppress(kube.KubeError):
            await self.leader.release()
        await self.api.api_client.close()


DRY_RUN_LEASE_SUFFIX = "-dry-run"
LEARNED_SUFFIX = "-learned"


def election(settings: kube_settings.KubeSettings) -> kube_settings.LeaseSettings:
    """The Lease this instance elects on: `lease.name`, or `<lease.name>-dry-run` in dry-run.

    A dry-run instance beside a live one must never hold the live replicas' Lease: while
    it did, the live leader stopped scaling (it would wait out 15 s of a Lease it cannot
    renew, then race for it again). With a Lease of their own, dry-run replicas still elect
    one of themselves, so a dry-run Deployment of 2 logs each would-be patch once, as the
    live one would apply it once; the same Role covers both names (no resourceNames).
    """
    if not settings.dry_run:
        return settings.lease
    return settings.lease.model_copy(
        update={"name": f"{settings.lease.name}{DRY_RUN_LEASE_SUFFIX}"})


def learned_store(api: kube.KubeApi, settings: kube_settings.KubeSettings
                  ) -> configmap.ConfigMapStore | None:
    """The ConfigMap of the engine's learned state, in the Lease's namespace: named
    `kube.learned_state.name`, or after the Lease this instance elects on (so a dry-run
    instance keeps its own)."""
    if not settings.learned_state.enabled:
        return None
    lease = election(settings)
    return configmap.ConfigMapStore(
        api, namespace=lease.namespace,
        name=settings.learned_state.name or f"{lease.name}{LEARNED_SUFFIX}")


async def connect(settings: kube_settings.KubeSettings, *, identity: str,
                  wall_clock: timefmt.WallClock,
                  work: deletion_cost.WorkReader | None = None) -> KubeAdapters:
    """One ApiClient and every adapter over it. With `lease.enabled` false this replica
    always leads (a single replica, or a shard with its own leader elsewhere). `work`
    (each replica's reported work) lets the replica actuator set pod deletion costs
    before a scale-down, when `deletion_cost.enabled`."""
    api_client = await kube.make_api_client(settings)
    api = kube.KubeApi(api_client, timeout_s=settings.request_timeout_s, retry=settings.retry)
    elector: base.LeaderElector
    if settings.lease.enabled:
        elector = leader.LeaseElector(api, settings=election(settings), identity=identity,
                                      wall_clock=wall_clock)
    else:
        elector = base.AlwaysLeader(identity)
    recorder = events.EventRecorder(api, settings=settings.events, wall_clock=wall_clock,
                                    instance=identity)
    if settings.dry_run:
        log.warning("dry-run: decisions are computed and logged, nothing is patched")
    pools: dict[str, base.NodePoolActuator] = {
        "clusterapi": nodepool.ClusterApiActuator(api, settings=settings, leader=elector)}
    if settings.placeholder.enabled:
        pools["placeholder"] = nodepool.PlaceholderActuator(api, settings=settings,
                                                            leader=elector)
    else:
        # Least privilege: without the switch the scaler creates no Deployment anywhere.
        log.info("placeholder node-pool actuator off (kube.placeholder.enabled): pools "
                 "naming it are planned and reported only")
    if settings.capacitybuffer.enabled:
        pools["capacitybuffer"] = capacitybuffer.CapacityBufferActuator(
            api, settings=settings, leader=elector)
    else:
        log.info("capacitybuffer node-pool actuator off (kube.capacitybuffer.enabled): "
                 "pools naming it are planned and reported only")
    return KubeAdapters(
        api=api,
        reader=cluster_reader.KubeClusterReader(api, settings=settings, wall_clock=wall_clock,
                                                recorder=recorder),
        replicas=replicas.KubeReplicaActuator(
            api, settings=settings, recorder=recorder, leader=elector,
            deletion_costs=deletion_cost.DeletionCoster(api, settings=settings, work=work)
            if work is not None and settings.deletion_cost.enabled else None),
        leader=elector,
        recorder=recorder,
        pools=pools,
        learned=learned_store(api, settings),
    )
