"""The replica actuator: a decision becomes one PATCH of the target's scale subresource."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from scaler.actuators import base, resources, timefmt
from scaler.actuators import client as kube
from scaler.actuators import events as kube_events
from scaler.actuators import settings as kube_settings
from scaler.engine import types
from scaler.policy import model

log = logging.getLogger(__name__)

HPA_PATH = "/apis/autoscaling/v2/namespaces/{namespace}/horizontalpodautoscalers"
KEDA_PATH = "/apis/keda.sh/v1alpha1/namespaces/{namespace}/scaledobjects"


@dataclass(frozen=True, slots=True)
class _Owners:
    expires_at: float
    # (owner description, its scaleTargetRef) for every HPA and ScaledObject in a namespace
    refs: tuple[tuple[str, dict[str, object]], ...]


def scale_patch(*, replicas: int, resource_version: str) -> kube.Obj:
    """The merge patch for `/scale`: the replicas, guarded by the version we read.

    With the resourceVersion in the body the API server refuses (409) a write based on a
    stale read, so two writers can never both apply a change computed from the same value.
    """
    return {"metadata": {"resourceVersion": resource_version}, "spec": {"replicas": replicas}}


class KubeReplicaActuator:
    """Implements `base.ReplicaActuator` against the Kubernetes API.

    Flow per decision: leader? -> owned by an HPA/KEDA? -> GET /scale -> the decision was
    made on what the cluster still has? -> anything to change? -> dry-run? -> PATCH with a
    resourceVersion precondition -> Event. A 409 is handed back as CONFLICT with the fresh
    value, so the caller re-decides: a blind retry would write a stale decision.
    """

    def __init__(self, api: kube.KubeApi, *, settings: kube_settings.KubeSettings,
                 recorder: kube_events.EventRecorder, leader: base.LeaderElector,
                 monotonic: Callable[[], float] | None = None) -> None:
        self.api = api
        self.settings = settings
        self.recorder = recorder
        self.leader = leader
        self._monotonic = monotonic
        self._owners: dict[str, _Owners] = {}
        self._announced: set[tuple[str, str]] = set()

    def _now(self) -> float:
        return timefmt.loop_now(self._monotonic)

    async def _list_refs(self, path: str, label: str, *, optional: bool
                         ) -> list[tuple[str, dict[str, object]]]:
        try:
            listing = await self.api.get(path)
        except kube.KubeError as error:
            # KEDA is optional: no CRD (404) or no permission to read it (403) means none.
            if optional and error.status in (403, 404):
                return []
            raise
        return [
            (f"{label}/{item['metadata']['name']}",
             dict((item.get("spec") or {}).get("scaleTargetRef") or {}))
            for item in listing.get("items") or []
        ]

    async def owner_of(self, ref: resources.ObjectRef) -> str | None:
        """The HPA or ScaledObject that scales `ref`, if any (cached `ownership_ttl_s`)."""
        now = self._now()
        cached = self._owners.get(ref.namespace)
        if cached is None or now >= cached.expires_at:
            refs = await self._list_refs(HPA_PATH.format(namespace=ref.namespace),
                                         "HorizontalPodAutoscaler", optional=False)
            refs += await self._list_refs(KEDA_PATH.format(namespace=ref.namespace),
                                          "ScaledObject", optional=True)
            cached = _Owners(now + self.settings.ownership_ttl_s, tuple(refs))
            self._owners[ref.namespace] = cached
        return next((owner for owner, target in cached.refs
                     if resources.same_target(ref, target)), None)

    async def apply(self, policy: model.ScalePolicy, decision: types.Decision
                    ) -> base.ApplyOutcome:
        ref = resources.target_ref(policy, plurals=self.settings.resource_plurals)

        def outcome(kind: base.Outcome, previous: int | None, reason: str) -> base.ApplyOutcome:
            return base.ApplyOutcome(kind, ref.key, previous, decision.desired, reason)

        if not self.leader.is_leader:
            return outcome(base.Outcome.NOT_LEADER, None, "not the leader")
        try:
            owner = await self.owner_of(ref)
        except kube.KubeError as error:
            return outcome(base.Outcome.FAILED, None, f"cannot check HPA ownership: {error}")
        if owner is not None:
            if (ref.key, owner) not in self._announced:
                self._announced.add((ref.key, owner))
                message = (f"{owner} scales this object; scaler will not patch it and serves "
                           "its decisions through the external metrics API instead")
                log.warning("%s: %s", ref.key, message)
                await self.recorder.record(ref, reason="ScalerSkipped", message=message,
                                           warning=True)
            return outcome(base.Outcome.SKIPPED_HPA_OWNED, None, f"owned by {owner}")
        try:
            scale = await self.api.get(ref.scale_path)
        except kube.KubeError as error:
            return outcome(base.Outcome.FAILED, None, f"cannot read scale: {error}")
        current = int((scale.get("spec") or {}).get("replicas") or 0)
        version = str(scale["metadata"]["resourceVersion"])
        if current != decision.current:
            return outcome(base.Outcome.CONFLICT, current,
                           f"spec.replicas is {current}, the decision assumed "
                           f"{decision.current}: re-decide")
        if decision.desired == current:
            return outcome(base.Outcome.UNCHANGED, current, "already at desired replicas")
        if self.settings.dry_run:
            log.info("dry-run: would scale %s %d -> %d (%s)", ref.key, current,
                     decision.desired, decision.summary)
            return outcome(base.Outcome.DRY_RUN, current, decision.summary)
        if not self.leader.is_leader:  # leadership may have lapsed during the reads
            return outcome(base.Outcome.NOT_LEADER, current, "lost leadership before writing")
        try:
            await self.api.merge_patch(
                ref.scale_path, scale_patch(replicas=decision.desired, resource_version=version))
        except kube.KubeError as error:
            if not error.conflict:
                return outcome(base.Outcome.FAILED, current, f"patch failed: {error}")
            try:
                fresh = await self.api.get(ref.scale_path)
                current = int((fresh.get("spec") or {}).get("replicas") or 0)
            except kube.KubeError:
                pass
            return outcome(base.Outcome.CONFLICT, current,
                           f"{ref.key} changed since it was read (now {current}): re-decide")
        log.info("scaled %s %d -> %d: %s", ref.key, current, decision.desired, decision.summary)
        await self.recorder.record(
            ref, reason="ScaledUp" if decision.desired > current else "ScaledDown",
            message=decision.summary)
        return outcome(base.Outcome.APPLIED, current, decision.summary)
