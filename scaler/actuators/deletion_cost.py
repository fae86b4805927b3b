"""Scale-down that spares work: `controller.kubernetes.io/pod-deletion-cost` on a
Deployment's pods from the work each reports, and the busy count batch tiers keep.

How Kubernetes reads the annotation (kubernetes/kubernetes, read with the search tool):
the ReplicaSet controller's `getPodsToDelete` sorts the candidates by
`controller.ActivePodsWithRanks.Less` (pkg/controller/controller_utils.go): unscheduled
before scheduled, Pending < Unknown < Running, not ready before ready, then the **lower
pod-deletion-cost first** (feature PodDeletionCost, beta and on by default since 1.22),
then pods doubled up on a node, the most recently ready, the most restarted, the newest.
`helper.GetDeletionCostFromPodAnnotations` (pkg/apis/core/helper) reads the value as an
int32 in plain decimal ("+10" and "008" are invalid) and takes an absent or invalid value
as 0; pod validation (`ValidatePodSpecificAnnotations`) refuses an invalid one with 422
"must be a 32bit integer". So the cost only orders pods that tie on scheduling, phase and
readiness: a starting pod still goes before a ready idle one, which is what we want.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from scaler.actuators import base, cluster_reader, resources
from scaler.actuators import client as kube
from scaler.actuators import settings as kube_settings
from scaler.core import vocabulary
from scaler.engine import spare, types
from scaler.policy import model

log = logging.getLogger(__name__)

ANNOTATION = "controller.kubernetes.io/pod-deletion-cost"

HONORED = frozenset({("apps", "Deployment"), ("apps", "ReplicaSet")})
"""(group, kind) of targets whose pods a ReplicaSet removes, the only controller that reads
the annotation (a StatefulSet removes the highest ordinal whatever it says)."""

PATCHES_IN_FLIGHT = 8
"""Pod patches sent at once: 64 pods take 8 round trips, and a burst never queues more
than 8 requests in front of the scale patch at the API server's priority and fairness."""

WorkReader = Callable[[model.ScalePolicy], Mapping[str, spare.PodWork]]
"""The fresh work of a policy's model per source (its pod name): the signal store's
per-source in-flight and queue values, as the service reads them."""

_INT32 = re.compile(r"^(0|-?[1-9][0-9]*)$")


def parse_cost(value: str) -> int | None:
    """The annotation's value as the ReplicaSet controller reads it; None when invalid.

    Plain decimal int32 only: "0", "42", "-7"; not "+10", "008", "1e3" or 2^31.
    """
    if not _INT32.match(value):
        return None
    number = int(value)
    return number if -(2**31) <= number <= spare.INT32_MAX else None


def effective_cost(pod: Mapping[str, Any]) -> int:
    """The cost the controller sees on a pod: its annotation, 0 when absent or invalid."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    value = annotations.get(ANNOTATION)
    parsed = parse_cost(value) if isinstance(value, str) else None
    return 0 if parsed is None else parsed


def is_active(pod: Mapping[str, Any]) -> bool:
    """Not terminated and not being deleted: a pod the ReplicaSet may still choose
    (`controller.IsPodActive`)."""
    meta = pod.get("metadata") or {}
    phase = (pod.get("status") or {}).get("phase")
    return phase not in ("Succeeded", "Failed") and not meta.get("deletionTimestamp")


@dataclass(frozen=True, slots=True)
class Change:
    """One pod's annotation to write: from what the controller sees now to `cost`."""

    pod: str
    before: int
    cost: int


def changes(pods: Iterable[Mapping[str, Any]], work: Mapping[str, spare.PodWork], *,
            tier: vocabulary.Tier) -> list[Change]:
    """The active pods whose cost differs from what they carry (`spare.costs` for `tier`),
    biggest change first (then by name, so the order is stable); pods already right are
    left alone."""
    active = {str(p["metadata"]["name"]): p for p in pods if is_active(p)}
    wanted = spare.costs(active, work, tier=tier)
    found = [Change(name, effective_cost(active[name]), cost)
             for name, cost in wanted.items() if cost != effective_cost(active[name])]
    return sorted(found, key=lambda c: (-abs(c.cost - c.before), c.pod))


@dataclass(frozen=True, slots=True)
class Annotated:
    """What one pass before a scale-down did: pods patched, failed (each only makes the
    scale-down less gentle), left for the next pass (over `max_pods`), or why nothing was
    tried."""

    patched: int = 0
    failed: int = 0
    deferred: int = 0
    skipped: str = ""

    @property
    def summary(self) -> str:
        if self.skipped:
            return f"deletion costs not set: {self.skipped}"
        parts = [f"{self.patched} pods annotated"]
        parts += [f"{n} {what}" for n, what in ((self.failed, "failed"),
                                                 (self.deferred, "deferred")) if n]
        return "deletion costs: " + ", ".join(parts)


class DeletionCoster:
    """Writes each pod's deletion cost before its Deployment is scaled down.

    `counts` keeps the pod patches by outcome (`patched`, `failed`) and passes that could
    not list the pods (`list_failed`), for the service's observability.
    """

    def __init__(self, api: kube.KubeApi, *, settings: kube_settings.KubeSettings,
                 work: WorkReader) -> None:
        self.api = api
        self.settings = settings
        self.work = work
        self.counts: collections.Counter[str] = collections.Counter()

    async def annotate(self, policy: model.ScalePolicy, *, ref: resources.ObjectRef,
                       scale: kube.Obj) -> Annotated:
        """Annotate the pods the Scale's selector selects in the target's namespace.

        Never raises for an API error: a failed list or patch is counted and reported, and
        the caller scales down all the same. Bounded by `kube.request_timeout_s` in all.
        """
        if (ref.group, ref.kind) not in HONORED:
            return Annotated(skipped=f"{ref.kind} does not remove pods by deletion cost")
        selector = (scale.get("status") or {}).get("selector")
        if not selector:  # never list the whole namespace for want of a selector
            return Annotated(skipped="the Scale shows no pod selector")
        path = cluster_reader.pods_path(ref.namespace)
        try:
            listing = await self.api.get(path, query={"labelSelector": str(selector)})
        except kube.KubeError as error:
            self.counts["list_failed"] += 1
            log.warning("%s: cannot list pods for deletion costs: %s", ref.key, error)
            return Annotated(skipped=f"cannot list pods: {error}")
        pods = listing.get("items") or []
        todo = changes(pods, self.work(policy), tier=policy.spec.tier)
        chosen = todo[: self.settings.deletion_cost.max_pods]
        done: set[str] = set()
        limit = asyncio.Semaphore(PATCHES_IN_FLIGHT)

        async def write(change: Change) -> None:
            async with limit:
                try:
                    await self.api.merge_patch(f"{path}/{change.pod}", {"metadata": {
                        "annotations": {ANNOTATION: str(change.cost)}}})
                except kube.KubeError as error:
                    log.warning("%s: deletion cost of pod %s not set: %s", ref.key,
                                change.pod, error)
                    return
                done.add(change.pod)

        try:
            async with asyncio.timeout(self.settings.request_timeout_s), \
                    asyncio.TaskGroup() as group:
                for change in chosen:
                    group.create_task(write(change))
        except TimeoutError:
            log.warning("%s: deletion costs: %d of %d pods left unwritten after %g s",
                        ref.key, len(chosen) - len(done), len(chosen),
                        self.settings.request_timeout_s)
        failed = len(chosen) - len(done)
        self.counts += collections.Counter(patched=len(done), failed=failed)  # drops zeros
        return Annotated(patched=len(done), failed=failed, deferred=len(todo) - len(chosen))


class BusyReader:
    """A cluster reader that adds, for batch-tier policies, the replicas that may hold
    unfinished work (`ClusterState.busy_replicas`, `spare.possibly_busy`: those reporting some,
    and the silent ready pods when `inner` names them) to what `inner` reads; the engine
    then never scales them down unless the model is over its GPU budget
    (`spare.busy_floor`).

    `work` gives replicas only (the sources of signal messages, DESIGN 4.2: Prometheus
    and JetStream readings are the model's, no replica's); a publisher that is no pod (a
    gateway reporting its queue under a source of its own) counts as one, and the engine
    never keeps more than the target has.
    """

    def __init__(self, inner: base.ClusterReader, *, work: WorkReader) -> None:
        self.inner = inner
        self.work = work

    async def read(self, policy: model.ScalePolicy) -> types.ClusterState:
        state = await self.inner.read(policy)
        if policy.spec.tier is not vocabulary.Tier.BATCH:
            return state
        pods = ready = None
        if isinstance(self.inner, base.PodNamer):
            pods, ready = self.inner.pod_names(policy), self.inner.ready_pod_names(policy)
        return dataclasses.replace(state, busy_replicas=spare.possibly_busy(
            self.work(policy), pods=pods, ready=ready))

    def variant_busy(self, policy: model.ScalePolicy, view: model.ScalePolicy) -> int | None:
        """The replicas of one variant of a batch-tier `policy` reporting unfinished work
        (`view`: the policy as that variant, `service.variants.views`, read just before).

        A report is the variant's when its source names a live pod of the variant's
        target: the pods its Scale selector selects, the ones the reader counted as that
        variant's replicas. A source naming no such pod (a gateway, a pod of another
        variant, a pod already gone) keeps nothing; a ready pod of the variant that
        sends none while another of its pods does may be busy, and is kept
        (`spare.possibly_busy`). None for other tiers, and when the inner reader cannot name
        pods.
        """
        if policy.spec.tier is not vocabulary.Tier.BATCH or not isinstance(self.inner,
                                                                          base.PodNamer):
            return None
        pods = self.inner.pod_names(view)
        if pods is None:
            return None
        return spare.possibly_busy({name: each for name, each in self.work(policy).items()
                              if name in pods}, pods=pods,
                             ready=self.inner.ready_pod_names(view))
