"""The cluster reader: a target's replicas, its pods' start timelines and the pool's usable GPUs."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from scaler.actuators import client as kube
from scaler.actuators import (
    dra,
    events,
    gpu_health,
    replicas,
    resources,
    selectors,
    timefmt,
    timeline,
    watch,
)
from scaler.actuators import settings as kube_settings
from scaler.core import gpus
from scaler.engine import types
from scaler.policy import model

log = logging.getLogger(__name__)

_MAX_OBSERVATIONS = 1024  # across all models; a few per model per hour is typical
ALL_NAMESPACES = ""  # key of the one cluster-wide pod informer (kube.cluster_wide)


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def _task_name(plural: str, namespace: str) -> str:
    """The name of a namespaced informer started on demand: `resourceclaims:inference`,
    `deployments:*` (cluster-wide)."""
    return f"{plural}:{namespace or '*'}"


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


# Built-in kinds read from informers, by (apiVersion, plural): spec.target's default kind
# and the other built-in one with a scale subresource. Any other kind (LeaderWorkerSet, a
# CAPI MachineDeployment, a CRD with a scale subresource) is read with a GET of its /scale.
WATCHED_KINDS = frozenset({("apps/v1", "deployments"), ("apps/v1", "statefulsets")})


def workloads_path(plural: str, namespace: str) -> str:
    """The apps/v1 collection one workload informer lists and watches ("" = every
    namespace)."""
    if namespace == ALL_NAMESPACES:
        return f"/apis/apps/v1/{plural}"
    return f"/apis/apps/v1/namespaces/{namespace}/{plural}"


def workload_kept(obj: kube.Obj) -> kube.Obj:
    """What a workload informer keeps of a Deployment or StatefulSet: its name and version,
    and the fields `ScaleView.of_workload` reads. The pod template, conditions and managed
    fields are most of the object, held for every target: 15.8 KiB in memory a
    Deployment as the emulator serves one after a scale write, 1.4 KiB kept
    (`bench/kube_actuation.py`, its last line)."""
    meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
    return {"metadata": {key: meta[key] for key in ("name", "namespace", "resourceVersion")
                         if key in meta},
            "spec": {key: spec[key] for key in ("replicas", "selector") if key in spec},
            "status": {"replicas": (obj.get("status") or {}).get("replicas")}}


@dataclass(frozen=True, slots=True)
class ScaleView:
    """What the reader takes of a target, as its Scale shows it: spec.replicas,
    status.replicas and the label selector (None when the Scale shows none)."""

    replicas: int
    status_replicas: int
    selector: selectors.Selector | None

    @classmethod
    def of_scale(cls, scale: kube.Obj) -> ScaleView:
        status = scale.get("status") or {}
        raw = status.get("selector")
        return cls(replicas=replicas.spec_replicas(scale),
                   status_replicas=int(status.get("replicas") or 0),
                   selector=selectors.parse_selector(str(raw)) if raw else None)

    @classmethod
    def of_workload(cls, obj: kube.Obj) -> ScaleView:
        """A Deployment or StatefulSet as its /scale would show it: the API server derives
        the Scale's `status.selector` from `spec.selector` (matchLabels and
        matchExpressions), an empty one showing no selector."""
        selector = selectors.from_label_selector((obj.get("spec") or {}).get("selector") or {})
        return cls(replicas=replicas.spec_replicas(obj),
                   status_replicas=int((obj.get("status") or {}).get("replicas") or 0),
                   selector=selector if selector.requirements else None)


@dataclass(frozen=True, slots=True)
class PoolReading:
    """A pool's capacity now and why some of its GPUs do not count.

    capacity: None when it cannot be known (a DRA DeviceClass not found or with a selector
      the scaler cannot evaluate): the engine then assumes a node must boot.
    notes: one line per node with GPUs excluded, then any reason capacity is unknown.
    """

    capacity: timeline.PoolCapacity | None
    exclusions: tuple[gpu_health.NodeExclusion, ...] = ()
    problem: str | None = None

    @property
    def excluded_gpus(self) -> int:
        return sum(e.excluded for e in self.exclusions)

    @property
    def notes(self) -> tuple[str, ...]:
        lines = tuple(e.text for e in self.exclusions)
        return (*lines, self.problem) if self.problem else lines


Telemetry = Callable[[], gpus.GpuTelemetry | None]


class KubeClusterReader:
    """Implements `base.ClusterReader`.

    A target's `spec.replicas`, `status.replicas` and label selector come from a watched
    informer for the built-in kinds (`WATCHED_KINDS`: apps/v1 Deployments and
    StatefulSets), so a read sends no request: a GET of `/scale` per read was 2,000 GETs a
    second from one client at 10,000 models evaluated every 5 s (docs/scaling.md). Another
    writer's change is seen once its watch event arrives (p50 0.6 ms, p99 7 to 11 ms after the
    write's answer, emulator on loopback, `bench/kube_actuation.py`; a real API server adds
    its watch delay). A stale read is safe: the actuator GETs `/scale` itself before its
    guarded PATCH (`replicas.guarded_patch`), so a decision made on an old count costs at
    worst one CONFLICT and a re-read, the existing path (or, deciding the old count, one
    evaluation without a write). A target the informer does not hold (absent, or created a
    moment ago) is read with one GET of `/scale`, which answers 404 for an absent one, as
    before; so is every other kind (custom resources with a scale subresource), and a
    built-in kind whose list is refused or late (RBAC of a release without list/watch on
    deployments and statefulsets; warned once).

    Pods and nodes come from watched informers, not polls: ready and starting replicas,
    each pod's start timeline (learned the moment it turns Ready) and the free GPUs of the
    policy's node pool.

    Pods and targets are watched where the settings say, least privilege first: informers
    per namespace of `kube.watch_namespaces`; with that list empty, per namespace of the
    policies (pods from `update(policies)` or the first `read` of a policy there, each
    target kind from the first `read` of one there; all stopped by `update` when the last
    policy there goes); one cluster-wide informer each only with `kube.cluster_wide`. Pool
    capacity therefore counts the GPUs used by pods of watched namespaces only
    (docs/security.md).
    Start with `start()` and stop with `stop()`; `read` waits for the first lists.

    Honest capacity: GPUs with DCGM health errors (`telemetry`, the latest reading of
    dcgm-exporter) are not counted, and a policy with `resources.deviceClassName` counts
    the DeviceClass's devices in ResourceSlices, used by allocated ResourceClaims (those
    informers start with the first such policy). A change in what is excluded is posted as
    an Event on each affected target (`recorder`).
    """

    def __init__(self, api: kube.KubeApi, *, settings: kube_settings.KubeSettings,
                 wall_clock: timefmt.WallClock, telemetry: Telemetry | None = None,
                 recorder: events.EventRecorder | None = None) -> None:
        self.api = api
        self.settings = settings
        self.wall_clock = wall_clock
        self.telemetry = telemetry
        self.recorder = recorder
        # DRA: slices and classes cluster-wide, claims beside each pod informer.
        self.slices: watch.Informer | None = None
        self.classes: watch.Informer | None = None
        self.claims: dict[str, watch.Informer] = {}
        # (plural, namespace or ALL_NAMESPACES) -> the informer of that kind's targets
        self.workloads: dict[tuple[str, str], watch.Informer] = {}
        self._refused: set[str] = set()  # workload paths whose refusal was logged
        # informers started on demand (DRA, workloads), by task name
        self._tasks: dict[str, asyncio.Task[None]] = {}
        # target key -> the exclusion notes last posted as an Event on it (a policy with
        # variants has one target per variant, each on its own pool)
        self._posted: dict[str, tuple[str, ...]] = {}
        # target key -> names of the live pods its Scale selector selected at its latest
        # read, and of the ready ones among them (`pod_names`: whose reports are a
        # variant's own; `ready_pod_names`: which silent pods may hold work)
        self._target_pods: dict[str, tuple[frozenset[str], frozenset[str]]] = {}
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
        for name in list(self._tasks):
            await self._stop_task(name)
        self.slices = self.classes = None
        self.workloads.clear()
        if self._node_task is not None:
            await _cancel(self._node_task)
            self._node_task = None

    async def update(self, policies: Iterable[model.ScalePolicy]) -> None:
        """Watch the pods of exactly the policies' namespaces, when neither
        `watch_namespaces` nor `cluster_wide` fixes them: a new namespace is listed, one
        without policies any more is no longer watched (and its pods forgotten)."""
        policies = list(policies)
        if any(p.spec.resources.device_class_name for p in policies):
            self._watch_dra()
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
        if self.slices is not None:
            self._watch_claims(namespace)
        return informer

    async def _unwatch_pods(self, namespace: str) -> None:
        await _cancel(self._pod_tasks.pop(namespace))
        del self.pods[namespace]
        self._pods_by_namespace.pop(namespace, None)
        if namespace in self.claims:
            await self._stop_task(_task_name("resourceclaims", namespace))
            del self.claims[namespace]
        for plural, where in [key for key in self.workloads if key[1] == namespace]:
            await self._stop_task(_task_name(plural, where))
            del self.workloads[(plural, where)]

    def _start_informer(self, name: str, path: str, *,
                        keep: Callable[[kube.Obj], kube.Obj] = watch.kept) -> watch.Informer:
        informer = watch.Informer(self.api, path=path, settings=self.settings, keep=keep)
        self._tasks[name] = asyncio.create_task(informer.run(), name=f"kube-informer-{name}")
        return informer

    async def _stop_task(self, name: str) -> None:
        await _cancel(self._tasks.pop(name))

    def _watch_dra(self) -> None:
        """Start the resource.k8s.io/v1 informers (once): only a cluster that serves DRA
        (Kubernetes 1.34+) and a policy asking for it need them."""
        if self.slices is not None:
            return
        self.slices = self._start_informer("resourceslices", dra.SLICES_PATH)
        self.classes = self._start_informer("deviceclasses", dra.CLASSES_PATH)
        for namespace in self.pods:
            self._watch_claims(namespace)

    def _watch_claims(self, namespace: str) -> None:
        self.claims[namespace] = self._start_informer(_task_name("resourceclaims", namespace),
                                                      dra.claims_path(namespace))

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

    def workload_informer(self, ref: resources.ObjectRef) -> watch.Informer | None:
        """The informer that holds `ref`'s kind in its namespace (started now), None for a
        kind outside `WATCHED_KINDS`. Call after `pod_informer`, which refuses a namespace
        outside `kube.watch_namespaces`."""
        if (ref.api_version, ref.plural) not in WATCHED_KINDS:
            return None
        where = ALL_NAMESPACES if self.settings.cluster_wide else ref.namespace
        informer = self.workloads.get((ref.plural, where))
        if informer is None:
            informer = self._start_informer(_task_name(ref.plural, where),
                                            workloads_path(ref.plural, where),
                                            keep=workload_kept)
            self.workloads[(ref.plural, where)] = informer
        return informer

    async def _listed(self, informer: watch.Informer) -> bool:
        """Whether a workload informer has listed, waiting up to the request timeout for
        its first list; False (read /scale instead) when it failed or is late, so a
        release whose RBAC lacks list/watch on the kind still reads its targets."""
        if not informer.synced.is_set() and informer.last_error is None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.settings.request_timeout_s):
                    await informer.synced.wait()
        if informer.synced.is_set():
            return True
        if informer.path not in self._refused:
            self._refused.add(informer.path)
            log.warning("%s not listed (last error: %s): reading targets' /scale until "
                        "it is; a 403 means the Role lacks list and watch on it (scaler "
                        "kube rbac prints them)", informer.path, informer.last_error)
        return False

    async def scale_view(self, ref: resources.ObjectRef) -> ScaleView:
        """`ref`'s replicas and selector: from its informer when it holds `ref`, else from
        one GET of its /scale (KubeError 404 for a target that does not exist)."""
        informer = self.workload_informer(ref)
        if informer is not None and await self._listed(informer):
            found = informer.objects.get(f"{ref.namespace}/{ref.name}")
            if found is not None:
                return ScaleView.of_workload(found)
        return ScaleView.of_scale(await self.api.get(ref.scale_path))

    async def wait_synced(self, namespace: str) -> None:
        """Until the nodes and `namespace`'s pods are listed; NotSynced after the request
        timeout, with the last error (a 403 names a missing Role)."""
        pods = self.pod_informer(namespace)
        if pods.synced.is_set() and self.nodes.synced.is_set():
            return  # every read once listed: no timer to arm and cancel
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

    def _telemetry(self) -> gpus.GpuTelemetry | None:
        return self.telemetry() if self.telemetry is not None else None

    def pool_reading(self, *, node_selector: Mapping[str, str], resource_name: str,
                     gpus_per_replica: int, device_class_name: str | None = None
                     ) -> PoolReading:
        """The pool's capacity on Ready, uncordoned nodes without GPUs in DCGM error: from
        the extended resource `resource_name`, or with `device_class_name` from that
        DeviceClass's devices in ResourceSlices and the claims allocating them."""
        telemetry = self._telemetry()
        nodes = list(self._node_infos.values())
        if device_class_name is None:
            counted, exclusions = gpu_health.exclude_faulty(nodes, telemetry,
                                                            resource_name=resource_name)
            capacity = timeline.pool_capacity(
                nodes=counted,
                pods=[p for pods in self._pods_by_namespace.values() for p in pods.values()],
                node_selector=node_selector, resource_name=resource_name,
                gpus_per_replica=gpus_per_replica)
            return PoolReading(capacity=capacity, exclusions=exclusions)
        if self.slices is None or self.classes is None:
            return PoolReading(capacity=None, problem="DRA informers not started")
        device_class = self.classes.objects.get(f"/{device_class_name}")
        if device_class is None:
            return PoolReading(capacity=None,
                               problem=f"DeviceClass {device_class_name} not found")
        try:
            class_devices = dra.of_class(dra.devices(self.slices.objects.values()),
                                         dra.class_selectors(device_class))
        except dra.UnsupportedSelector as error:
            return PoolReading(capacity=None,
                               problem=f"DeviceClass {device_class_name}: {error}")
        in_use = dra.allocated(c for informer in self.claims.values()
                               for c in informer.objects.values())
        capacity, exclusions = dra.pool_capacity(
            nodes=nodes, class_devices=class_devices, in_use=in_use,
            node_selector=node_selector, device_class=device_class_name,
            gpus_per_replica=gpus_per_replica, telemetry=telemetry)
        return PoolReading(capacity=capacity, exclusions=exclusions)

    def pool_capacity(self, pool: model.NodePool, *, resource_name: str,
                      gpus_per_replica: int, device_class_name: str | None = None
                      ) -> timeline.PoolCapacity | None:
        return self.pool_reading(
            node_selector=pool.node_selector, resource_name=resource_name,
            gpus_per_replica=gpus_per_replica, device_class_name=device_class_name).capacity

    def usable_gpus(self, *, node_selector: Mapping[str, str], resource_name: str,
                    device_class_name: str | None = None) -> int | None:
        """GPUs of a pool that can serve now: on Ready, uncordoned nodes, without DCGM
        health errors, in use or not (the fleet step's `FleetPool.gpus`); None when
        unknown (a DRA class not found). 3 nodes of 8, one cordoned, one GPU with XID 79:
        15."""
        reading = self.pool_reading(node_selector=node_selector, resource_name=resource_name,
                                    gpus_per_replica=1, device_class_name=device_class_name)
        return reading.capacity.allocatable_gpus if reading.capacity is not None else None

    def sm_active(self, pods: Iterable[timeline.PodTimeline]) -> float | None:
        """Mean DCGM SM-active ratio of the pods' GPUs (pods without a series are left
        out); None without a reading for any of them."""
        telemetry = self._telemetry()
        if telemetry is None:
            return None
        found = [value for p in pods
                 if (value := telemetry.sm_active.get((p.namespace, p.name))) is not None]
        return sum(found) / len(found) if found else None

    async def _announce(self, policy: model.ScalePolicy, ref: resources.ObjectRef,
                        reading: PoolReading) -> None:
        """An Event on the target when what its pool excludes changes (both ways)."""
        notes = tuple(e.text for e in reading.exclusions)
        if self._posted.get(ref.key, ()) == notes:
            return
        self._posted[ref.key] = notes
        if self.recorder is None:
            return
        pool = policy.spec.node_pool.name if policy.spec.node_pool else ""
        if notes:
            await self.recorder.record(ref, reason="GpuCapacityExcluded", warning=True,
                                       message=f"pool {pool}: " + "; ".join(notes))
        else:
            await self.recorder.record(ref, reason="GpuCapacityRestored",
                                       message=f"pool {pool}: no GPUs excluded")

    async def _wait_dra_synced(self, namespace: str) -> str | None:
        """Until the DRA informers have listed; what is missing after the request timeout
        (a cluster without resource.k8s.io/v1 answers 404), None when all are listed.
        Not fatal: the policy is still decided, with its pool capacity unknown."""
        self._watch_dra()
        wanted = [i for i in (self.slices, self.classes, self.claims.get(namespace)
                              or self.claims.get(ALL_NAMESPACES)) if i is not None]
        failed = [i for i in wanted if not i.synced.is_set() and i.last_error is not None]
        if failed:  # already refused (404, 403): say so at once, do not wait each read
            return f"{failed[0].path} not listed: {failed[0].last_error}"
        try:
            async with asyncio.timeout(self.settings.request_timeout_s):
                for informer in wanted:
                    await informer.synced.wait()
        except TimeoutError:
            late = next(i for i in wanted if not i.synced.is_set())
            return (f"{late.path} not listed within {self.settings.request_timeout_s} s "
                    f"(last error: {late.last_error})")
        return None

    def _pods_read(self, policy: model.ScalePolicy
                   ) -> tuple[frozenset[str], frozenset[str]] | None:
        return self._target_pods.get(
            resources.target_ref(policy, plurals=self.settings.resource_plurals).key)

    def pod_names(self, policy: model.ScalePolicy) -> frozenset[str] | None:
        """Names of the live pods the target's Scale selector selected at its latest
        `read` (None before one, or when its Scale shows no selector)."""
        found = self._pods_read(policy)
        return None if found is None else found[0]

    def ready_pod_names(self, policy: model.ScalePolicy) -> frozenset[str] | None:
        """The ready ones among `pod_names` (None as there)."""
        found = self._pods_read(policy)
        return None if found is None else found[1]

    async def read(self, policy: model.ScalePolicy) -> types.ClusterState:
        ref = resources.target_ref(policy, plurals=self.settings.resource_plurals)
        await self.wait_synced(ref.namespace)
        device_class = policy.spec.resources.device_class_name
        dra_missing = None
        if device_class is not None:
            dra_missing = await self._wait_dra_synced(ref.namespace)
        scale = await self.scale_view(ref)
        current = scale.replicas
        selector = scale.selector
        if selector is not None:
            pods = self._pods_by_namespace.get(ref.namespace, {}).values()
            mine = [p for p in pods if p.live and selector.matches(p.labels)]
            ready = sum(1 for p in mine if p.ready)
            starting = tuple(sorted(p.created_at for p in mine if not p.ready))
            observations = self.observations(ref.namespace, selector)
            sm_active = self.sm_active(p for p in mine if p.ready)
            grace = min((p.grace_period_s for p in mine if p.grace_period_s is not None),
                        default=None)
            self._target_pods[ref.key] = (frozenset(p.name for p in mine),
                                          frozenset(p.name for p in mine if p.ready))
        else:
            self._target_pods.pop(ref.key, None)
            # A scale subresource without a selector: trust its replica count as ready.
            ready = scale.status_replicas
            starting, observations, sm_active, grace = (), (), None, None
        free_slots = None
        reading = PoolReading(capacity=None)
        pool = policy.spec.node_pool
        if pool is not None and dra_missing is not None:
            reading = PoolReading(capacity=None, problem=dra_missing)
        elif pool is not None:
            reading = self.pool_reading(
                node_selector=pool.node_selector,
                resource_name=policy.spec.resources.resource_name,
                gpus_per_replica=policy.spec.resources.gpus_per_replica,
                device_class_name=device_class)
            free_slots = reading.capacity.free_replica_slots if reading.capacity else None
            await self._announce(policy, ref, reading)
        return types.ClusterState(current=current, ready=ready, starting=starting,
                                  free_replica_slots=free_slots, observations=observations,
                                  excluded_gpus=reading.excluded_gpus,
                                  capacity_notes=reading.notes, gpu_sm_active=sm_active,
                                  grace_period_s=grace)
