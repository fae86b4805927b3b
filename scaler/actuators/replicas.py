"""The replica actuator: a decision becomes one PATCH of the target's scale subresource."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from scaler.actuators import base, deletion_cost, resources, timefmt
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


def spec_replicas(obj: kube.Obj) -> int:
    """`spec.replicas` of a Scale or a workload; a real Scale omits the field when it is 0."""
    return int((obj.get("spec") or {}).get("replicas") or 0)


def replicas_test(read: kube.Obj) -> kube.Obj:
    """The JSON patch `test` that `spec.replicas` is still what `read` holds.

    A Scale read with 0 replicas has `spec: {}` (the field is omitempty), and a test of a
    missing path fails even against the value 0; a Scale's spec has no field but replicas,
    so there the whole spec read is tested instead.
    """
    spec = read.get("spec") or {}
    if "replicas" in spec:
        return {"op": "test", "path": "/spec/replicas", "value": spec["replicas"]}
    return {"op": "test", "path": "/spec", "value": spec}


@dataclass(frozen=True, slots=True)
class Written:
    """What a guarded write did (APPLIED, CONFLICT or FAILED), with spec.replicas
    as the write found it and a one-line reason."""

    outcome: base.Outcome
    current: int
    reason: str = ""


@dataclass(frozen=True, slots=True)
class _Checked:
    """A decision that passed every check before its write, with the Scale as read."""

    policy: model.ScalePolicy
    decision: types.Decision
    ref: resources.ObjectRef
    scale: kube.Obj

    @property
    def current(self) -> int:
        return spec_replicas(self.scale)

    def outcome(self, kind: base.Outcome, reason: str) -> base.ApplyOutcome:
        return base.ApplyOutcome(kind, self.ref.key, self.current, self.decision.desired,
                                 reason)


def replicas_patch(*, read: kube.Obj, replicas: int,
                   also: tuple[kube.Obj, ...] = ()) -> list[kube.Obj]:
    """The JSON patch that sets `replicas` (and `also`) only if spec.replicas is as read:
    `[{"op": "test", "path": "/spec/replicas", "value": 2},
      {"op": "add", "path": "/spec/replicas", "value": 5}]`.

    The precondition is what the decision depends on and nothing more. The object's
    resourceVersion would also refuse the write after a status-only change, and the
    deployment controller writes status a few milliseconds after every create and scale,
    so every second change would be a false conflict. The API server checks the `test`
    against the object as stored when it applies the patch (with no resourceVersion in
    the body it retries its own storage conflicts), so only a change of spec.replicas
    between our read and our write refuses it, and a refused patch changes nothing.
    `add` sets the member whether or not the read object omitted it.
    """
    return [replicas_test(read), {"op": "add", "path": "/spec/replicas", "value": replicas},
            *also]


async def guarded_patch(api: kube.KubeApi, path: str, *, read: kube.Obj, replicas: int,
                        also: tuple[kube.Obj, ...] = (), read_path: str | None = None
                        ) -> Written:
    """Send `replicas_patch` to `path` and classify the answer.

    `read` is the object as `path` shows it (a Scale for `/scale`); `read_path` is where
    spec.replicas is read again after a refusal (default `path`). The API server answers a
    failed test with 422 Invalid ("the server rejected our request due to an error in our
    request"), as it does an invalid value; the re-read tells them apart: spec.replicas
    moved -> CONFLICT (another writer, or an earlier attempt of this write that landed
    before a timeout and its retry: either way the caller re-decides from the new value);
    not moved -> FAILED with the server's reason. A 409 is CONFLICT too (no
    resourceVersion is sent, so only a proxy or an injected fault sends one).
    """
    before = spec_replicas(read)
    try:
        await api.json_patch(path, replicas_patch(read=read, replicas=replicas, also=also))
    except kube.KubeError as error:
        if error.status != 422 and not error.conflict:
            return Written(base.Outcome.FAILED, before, f"patch failed: {error}")
        try:
            now = spec_replicas(await api.get(read_path or path))
        except kube.KubeError as read_error:
            return Written(base.Outcome.FAILED, before,
                           f"patch refused ({error}); re-read failed: {read_error}")
        if now != before:
            return Written(base.Outcome.CONFLICT, now,
                           f"spec.replicas changed since it was read ({before} -> {now}): "
                           "another writer; re-decide")
        if error.conflict:
            return Written(base.Outcome.CONFLICT, now, f"patch refused ({error}): re-decide")
        return Written(base.Outcome.FAILED, before, f"patch refused: {error}")
    return Written(base.Outcome.APPLIED, before)


class KubeReplicaActuator:
    """Implements `base.ReplicaActuator` against the Kubernetes API.

    Flow per decision: leader? -> owned by an HPA/KEDA? -> GET /scale -> the decision was
    made on what the cluster still has? -> anything to change? -> dry-run? -> (scaling
    down: pod deletion costs, `deletion_costs`) -> JSON PATCH
    guarded by a test of spec.replicas (`guarded_patch`) -> Event. Another writer's change
    is handed back as CONFLICT with the fresh value, so the caller re-decides: a blind
    retry would write a stale decision.
    """

    def __init__(self, api: kube.KubeApi, *, settings: kube_settings.KubeSettings,
                 recorder: kube_events.EventRecorder, leader: base.LeaderElector,
                 monotonic: Callable[[], float] | None = None,
                 deletion_costs: deletion_cost.DeletionCoster | None = None) -> None:
        self.api = api
        self.deletion_costs = deletion_costs
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

    async def _check(self, policy: model.ScalePolicy, decision: types.Decision, *,
                     variant: bool = False) -> _Checked | base.ApplyOutcome:
        """Everything before the write: leader, owner, the Scale read, the decision made on
        what the cluster still has, anything to change, dry-run. A `_Checked` is ready to
        write; an outcome says why nothing is to be written. `variant`: the target is one
        of a model's variants (`apply_all`), which the Event of an owned target says."""
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
                message = (f"{owner} scales this object; scaler will not patch it and "
                           + (f"counts its replicas in the mix of ScalePolicy {policy.key}'s "
                              "variants" if variant else
                              "serves its decisions through the external metrics API instead"))
                log.warning("%s: %s", ref.key, message)
                await self.recorder.record(ref, reason="ScalerSkipped", message=message,
                                           warning=True)
            return base.ApplyOutcome(base.Outcome.SKIPPED_HPA_OWNED, ref.key, None,
                                     decision.desired, f"owned by {owner}", owner=owner)
        try:
            scale = await self.api.get(ref.scale_path)
        except kube.KubeError as error:
            return outcome(base.Outcome.FAILED, None, f"cannot read scale: {error}")
        current = spec_replicas(scale)
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
        return _Checked(policy=policy, decision=decision, ref=ref, scale=scale)

    async def _write(self, checked: _Checked) -> base.ApplyOutcome:
        """The write of a checked decision: (scaling down: pod deletion costs) -> the
        guarded patch -> an Event."""
        policy, decision, ref, scale = checked.policy, checked.decision, checked.ref, checked.scale
        current = checked.current
        spared = ""
        if self.deletion_costs is not None and decision.desired < current:
            # Before the replicas patch: the ReplicaSet picks the pods to remove as soon as
            # it sees the new count. A failure only makes the scale-down less gentle.
            spared = "; " + (await self.deletion_costs.annotate(
                policy, ref=ref, scale=scale)).summary
        if not self.leader.is_leader:  # leadership may have lapsed during the reads
            return checked.outcome(base.Outcome.NOT_LEADER, "lost leadership before writing")
        written = await guarded_patch(self.api, ref.scale_path, read=scale,
                                      replicas=decision.desired)
        if written.outcome is not base.Outcome.APPLIED:
            return base.ApplyOutcome(written.outcome, ref.key, written.current,
                                     decision.desired, written.reason)
        log.info("scaled %s %d -> %d: %s", ref.key, current, decision.desired, decision.summary)
        await self.recorder.record(
            ref, reason="ScaledUp" if decision.desired > current else "ScaledDown",
            message=decision.summary)
        if decision.cut_warning is not None and decision.desired < current:
            await self.recorder.record(ref, reason="ScaleDownCutsAnswers", warning=True,
                                       message=decision.cut_warning)
        return checked.outcome(base.Outcome.APPLIED, decision.summary + spared)

    async def apply(self, policy: model.ScalePolicy, decision: types.Decision
                    ) -> base.ApplyOutcome:
        checked = await self._check(policy, decision)
        if isinstance(checked, base.ApplyOutcome):
            return checked
        return await self._write(checked)

    async def apply_all(self, parts: Sequence[tuple[model.ScalePolicy, types.Decision]]
                        ) -> list[base.ApplyOutcome]:
        """Implements `base.MixActuator`: every part checked, then written, scale-ups
        first (a mix left half-written then errs on the side of capacity).

        A part refused by its checks (not the leader, owned by an HPA while the mix
        would change it, the Scale not readable, spec.replicas moved) writes none, and
        the parts that passed report that refusal's outcome. A part owned by an HPA that
        the mix leaves at its count (`decision.changed` False: the caller counts it as
        it is) is no refusal: it reports SKIPPED_HPA_OWNED with its owner, and the rest
        are written. A write refused after others landed (the patch's own precondition,
        the API) stops the rest the same way; Kubernetes has no transaction over several
        objects, so that is the one half-applied case, reported (see
        `service.variants.combined`) and decided again by the caller.
        """
        checked = [await self._check(policy, decision, variant=True)
                   for policy, decision in parts]
        out: list[base.ApplyOutcome | None] = [
            c if isinstance(c, base.ApplyOutcome) else None for c in checked]
        refused = next((o for o, (_, decision) in zip(out, parts, strict=True)
                        if o is not None and o.outcome not in (
                            base.Outcome.UNCHANGED, base.Outcome.DRY_RUN)
                        and not o.left_to_owner(decision)), None)
        ready = [(i, c) for i, c in enumerate(checked) if isinstance(c, _Checked)]
        ready.sort(key=lambda item: item[1].decision.desired < item[1].current)
        for i, item in ready:
            if refused is None:
                written = await self._write(item)
                refused = None if written.outcome is base.Outcome.APPLIED else written
            else:
                written = item.outcome(refused.outcome,
                                       f"not written: {refused.target} {refused.outcome}")
            out[i] = written
        return [o for o in out if o is not None]
