"""The cluster reader: a target's replicas, its pods' start timelines and the pool's free GPUs."""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from collections.abc import Iterable

from scaler.actuators import client as kube
from scaler.actuators import replicas, resources, selectors, timefmt, timeline, watch
from scaler.actuators import settings as kube_settings
from scaler.engine import types
from scaler.policy import model

_MAX_OBSERVATIONS = 1024  # across all models; a few per model per hour is typical
ALL_NAMESPACES = ""  # key of the one cluster-wide pod informer (kube.cluster_wide)


class NamespaceNotWatched(Exception):
    """A policy's target is in a namespace outside `kube.watch_namespaces`: the scaler has
    no rights there (the Roles of `scaler kube rbac` exist only in the listed ones)."""


class NotSynced(Exception):
    """An informer has not completed its first list within the request timeout."""


def pods_path(namespace: str) -> str:
    """The pod collection one informer lists and watches ("" = every namespace)."""
    if namespace == ALL_NAMESPACES:
        return "/api/v1/pods"
    return f"/api/v1/namespaces/{namespace}/pods"


class KubeClusterReader:
    """Implements `base.ClusterReader`.

    `spec.replicas` is read from the target's `/scale` at each call (one GET), so a change
    made by someone else is seen at once. Pods and nodes come from watched informers, not
    polls: ready and starting replicas, each pod's start timeline (learned the moment it
    turns Ready) and the free GPUs of the policy's node pool.

    Pods are watched where the settings say, least privilege first: one informer per
    namespace of `kube.watch_namespaces`; with that list empty, one per namespace of the
    policies (started by `update(policies)`, or by the first `read` of a policy there);
    one cluster-wide informer only with `kube.cluster_wide`. Pool capacity therefore counts
    the GPUs used by pods of watched namespaces only (docs/security.md).
    Start with `start()` and stop with `stop()`; `read` waits for the first lists.
    """

    def __init__(self, api: kube.KubeApi, *, settings: kube_settings.KubeSettings,
                 wall_clock: timefmt.WallClock) -> None:
        self.api = api
        self.settings = settings
        self.wall_clock = wall_clock
        # namespace (ALL_NAMESPACES when cluster-wide) -> its pod informer and task
        self.pods: dict[str, watch.Informer] = {}
        self._pod_tasks: dict[str, asyncio.Task[None]] = {}
        self.nodes = watch.Informer(api, path="/api/v1/nodes", settings=settings,
                                    on_change=self._on_node)
        # uid -> timeline of pods that turned Ready, oldest first. The observation is made
        # when read, not when the pod turns Ready: the node watch may not have delivered the
        # pod's (new) node yet, and its creation time decides the node-boot part.
        self._ready: OrderedDict[str, timeline.PodTimeline] = OrderedDict()
        # node name -> creationTimestamp, kept after the node is gone (scale-down)
        self._node_created: OrderedDict[str, float] = OrderedDict()
        # Parsed views, kept current by the watch callbacks, so a read costs the pods of
        # one namespace, not a parse of every pod in the cluster.
        self._pods_by_namespace: dict[str, dict[str, timeline.PodTimeline]] = {}
        self._node_infos: dict[str, timeline.NodeInfo] = {}
        self._node_task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._node_task = asyncio.create_task(self.nodes.run(), name="kube-informer-nodes")
        if self.settings.cluster_wide:
            self._watch_pods(ALL_NAMESPACES)
        for namespace in self.settings.watch_namespaces:
            self._watch_pods(namespace)

    async def stop(self) -> None:
        for namespace in list(self.pods):
            await self._unwatch_pods(namespace)
        if self._node_task is not None:
            self._node_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._node_task
            self._node_task = None

    async def update(self, policies: Iterable[model.ScalePolicy]) -> None:
        """Watch the pods of exactly the policies' namespaces, when neither
        `watch_namespaces` nor `cluster_wide` fixes them: a new namespace is listed, one
        without policies any more is no longer watched (and its pods forgotten)."""
        if self.settings.cluster_wide or self.settings.watch_namespaces:
            return
        wanted = {policy.metadata.namespace for policy in policies}
        for namespace in sorted(wanted - set(self.pods)):
            self._watch_pods(namespace)
        for namespace in sorted(set(self.pods) - wanted):
            await self._unwatch_pods(namespace)

    def _watch_pods(self, namespace: str) -> watch.Informer:
        informer = watch.Informer(self.api, path=pods_path(namespace), settings=self.settings,
                                  on_change=self._on_pod)
        self.pods[namespace] = informer
        self._pod_tasks[namespace] = asyncio.create_task(
            informer.run(), name=f"kube-informer-pods:{namespace or '*'}")
        return informer

    async def _unwatch_pods(self, namespace: str) -> None:
        task = self._pod_tasks.pop(namespace)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        del self.pods[namespace]
        self._pods_by_namespace.pop(namespace, None)

    def pod_informer(self, namespace: str) -> watch.Informer:
        """The informer that sees `namespace`'s pods (started now when the policies'
        namespaces decide); NamespaceNotWatched outside `kube.watch_namespaces`."""
        if self.settings.cluster_wide:
            return self.pods[ALL_NAMESPACES]
        informer = self.pods.get(namespace)
        if informer is not None:
            return informer
        if self.settings.watch_namespaces:
            raise NamespaceNotWatched(
                f"namespace {namespace!r} is not in kube.watch_namespaces "
                f"{list(self.settings.watch_namespaces)}: the scaler has no rights there "
                "(add it to the list, the chart's watchNamespaces, and its RBAC)")
        return self._watch_pods(namespace)

    async def wait_synced(self, namespace: str) -> None:
        """Until the nodes and `namespace`'s pods are listed; NotSynced after the request
        timeout, with the last error (a 403 names a missing Role)."""
        pods = self.pod_informer(namespace)
        try:
            async with asyncio.timeout(self.settings.request_timeout_s):
                await pods.synced.wait()
                await self.nodes.synced.wait()
        except TimeoutError:
            late = pods if not pods.synced.is_set() else self.nodes
            raise NotSynced(f"{late.path} not listed within {self.settings.request_timeout_s}"
                            f" s (last error: {late.last_error})") from None

    def _on_node(self, kind: str, node: kube.Obj) -> None:
        info = timeline.node_info(node)
        if kind == "DELETED":
            self._node_infos.pop(info.name, None)
        else:
            self._node_infos[info.name] = info
        if info.created_at is not None:
            self._node_created[info.name] = info.created_at
            while len(self._node_created) > _MAX_OBSERVATIONS:
                self._node_created.popitem(last=False)

    def _on_pod(self, kind: str, pod: kube.Obj) -> None:
        pod_timeline = timeline.pod_timeline(pod)
        in_namespace = self._pods_by_namespace.setdefault(pod_timeline.namespace, {})
        if kind == "DELETED":
            in_namespace.pop(pod_timeline.name, None)
            return  # keep what it taught us in _ready; the window prunes it later
        in_namespace[pod_timeline.name] = pod_timeline
        if (pod_timeline.uid in self._ready or pod_timeline.placeholder
                or pod_timeline.ready_at is None):
            return
        self._ready[pod_timeline.uid] = pod_timeline
        while len(self._ready) > _MAX_OBSERVATIONS:
            self._ready.popitem(last=False)

    def observations(self, namespace: str, selector: selectors.Selector
                     ) -> tuple[types.ColdStartObservation, ...]:
        """Start observations of pods the selector picks, within the window, oldest first."""
        since = self.wall_clock() - self.settings.observation_window_s
        found = []
        for pod in self._ready.values():
            if pod.namespace != namespace or not selector.matches(pod.labels):
                continue
            node_created_at = self._node_created.get(pod.node_name or "")
            observation = timeline.cold_start(pod, node_created_at=node_created_at)
            if observation is not None and observation.ready_at >= since:
                found.append(observation)
        return tuple(sorted(found, key=lambda o: o.ready_at))

    def pool_capacity(self, pool: model.NodePool, *, resource_name: str,
                      gpus_per_replica: int) -> timeline.PoolCapacity:
        return timeline.pool_capacity(
            nodes=list(self._node_infos.values()),
            pods=[p for pods in self._pods_by_namespace.values() for p in pods.values()],
            node_selector=pool.node_selector, resource_name=resource_name,
            gpus_per_replica=gpus_per_replica,
        )

    async def read(self, policy: model.ScalePolicy) -> types.ClusterState:
        ref = resources.target_ref(policy, plurals=self.settings.resource_plurals)
        await self.wait_synced(ref.namespace)
        scale = await self.api.get(ref.scale_path)
        current = replicas.spec_replicas(scale)
        raw_selector = (scale.get("status") or {}).get("selector")
        if raw_selector:
            selector = selectors.parse_selector(str(raw_selector))
            pods = self._pods_by_namespace.get(ref.namespace, {}).values()
            mine = [p for p in pods if p.live and selector.matches(p.labels)]
            ready = sum(1 for p in mine if p.ready)
            starting = tuple(sorted(p.created_at for p in mine if not p.ready))
            observations = self.observations(ref.namespace, selector)
        else:
            # A scale subresource without a selector: trust its replica count as ready.
            ready = int((scale.get("status") or {}).get("replicas") or 0)
            starting, observations = (), ()
        free_slots = None
        if policy.spec.node_pool is not None:
            free_slots = self.pool_capacity(
                policy.spec.node_pool, resource_name=policy.spec.resources.resource_name,
                gpus_per_replica=policy.spec.resources.gpus_per_replica).free_replica_slots
        return types.ClusterState(current=current, ready=ready, starting=starting,
                                  free_replica_slots=free_slots, observations=observations)
