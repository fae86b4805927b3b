"""The replica actuator against the API: patches, no-ops, conflicts, HPA ownership, retries."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from scaler.actuators import base, client, events, replicas, resources
from scaler.actuators import settings as kube_settings
from scaler.emulator import Fault
from scaler.emulator.env import KubeTestEnv, ManualClock

from .factories import interleaved, make_decision, make_policy, write_status

pytestmark = pytest.mark.kube


def actuator(kube: KubeTestEnv, wall_clock: ManualClock, *, api: client.KubeApi | None = None,
             leader: base.LeaderElector | None = None, dry_run: bool = False,
             monotonic: ManualClock | None = None) -> replicas.KubeReplicaActuator:
    api_ = api or kube.api
    settings = kube_settings.KubeSettings(dry_run=dry_run)
    recorder = events.EventRecorder(api_, settings=settings.events, wall_clock=wall_clock,
                                    instance="test", monotonic=monotonic)
    return replicas.KubeReplicaActuator(api_, settings=settings, recorder=recorder,
                                        leader=leader or base.AlwaysLeader(), monotonic=monotonic)


def deployment_path(kube: KubeTestEnv, name: str) -> str:
    return f"{kube.collection('apps/v1', 'deployments')}/{name}"


async def spec_replicas(kube: KubeTestEnv, name: str) -> int:
    """The Scale's spec.replicas; a real Scale omits the field when it is 0."""
    scale = await kube.api.get(f"{deployment_path(kube, name)}/scale")
    return int(scale["spec"].get("replicas", 0))


async def events_for(kube: KubeTestEnv, name: str) -> list[dict[str, object]]:
    """The scaler's Events on `name` (a real cluster's controllers post their own too)."""
    listing = await kube.api.get(kube.collection("v1", "events"),
                                 query={"fieldSelector": f"involvedObject.name={name}"})
    return [e for e in listing["items"] if (e.get("source") or {}).get("component") == "scaler"]


async def test_applies_scale_change_and_records_event(kube: KubeTestEnv,
                                                      wall_clock: ManualClock) -> None:
    await kube.create_deployment("llama", replicas=1)
    policy = make_policy(kube.namespace, "llama")
    decision = make_decision(policy.key, current=1, desired=3)

    outcome = await actuator(kube, wall_clock).apply(policy, decision)

    assert outcome.outcome is base.Outcome.APPLIED
    assert (outcome.previous, outcome.desired) == (1, 3)
    assert await spec_replicas(kube, "llama") == 3
    posted = await events_for(kube, "llama")
    assert [(e["reason"], e["message"]) for e in posted] == [("ScaledUp", decision.summary)]


async def test_a_scale_down_that_cuts_answers_posts_a_warning(kube: KubeTestEnv,
                                                              wall_clock: ManualClock) -> None:
    """The decision's cut warning (`spare.cut_warning`) goes out as a Warning Event beside
    the ScaledDown one, so `kubectl describe` shows why answers were cut."""
    await kube.create_deployment("reasoner", replicas=4)
    policy = make_policy(kube.namespace, "reasoner")
    why = "answers run 100 s at a replica on average"
    down = dataclasses.replace(make_decision(policy.key, current=4, desired=2), cut_warning=why)

    assert (await actuator(kube, wall_clock).apply(policy, down)).outcome is base.Outcome.APPLIED

    posted = {e["reason"]: e for e in await events_for(kube, "reasoner")}
    assert sorted(posted) == ["ScaleDownCutsAnswers", "ScaledDown"]
    assert (posted["ScaleDownCutsAnswers"]["type"], posted["ScaledDown"]["type"]) == (
        "Warning", "Normal")
    assert posted["ScaleDownCutsAnswers"]["message"] == why


async def test_no_patch_when_desired_equals_current(kube: KubeTestEnv,
                                                    wall_clock: ManualClock) -> None:
    await kube.create_deployment("steady", replicas=2)
    policy = make_policy(kube.namespace, "steady")
    before = await kube.api.get(deployment_path(kube, "steady"))

    outcome = await actuator(kube, wall_clock).apply(
        policy, make_decision(policy.key, current=2, desired=2))

    after = await kube.api.get(deployment_path(kube, "steady"))
    assert outcome.outcome is base.Outcome.UNCHANGED
    # No write of ours: the spec and its generation did not move (the resourceVersion may:
    # the deployment controller writes status), and no Event was posted.
    assert after["metadata"]["generation"] == before["metadata"]["generation"]
    assert after["spec"]["replicas"] == 2
    assert await events_for(kube, "steady") == []
    if kube.emulator is not None:
        assert kube.emulator.count(method="PATCH", path="/scale$") == 0


async def test_stale_decision_is_handed_back_not_written(kube: KubeTestEnv,
                                                         wall_clock: ManualClock) -> None:
    await kube.create_deployment("stale", replicas=2)
    policy = make_policy(kube.namespace, "stale")
    # Someone else scales to 5 after our decision was made on 2.
    await kube.api.merge_patch(f"{kube.collection('apps/v1', 'deployments')}/stale/scale",
                               {"spec": {"replicas": 5}})

    outcome = await actuator(kube, wall_clock).apply(
        policy, make_decision(policy.key, current=2, desired=3))

    assert outcome.outcome is base.Outcome.CONFLICT
    assert outcome.previous == 5
    assert await spec_replicas(kube, "stale") == 5


async def test_concurrent_writers_lose_no_update(kube: KubeTestEnv,
                                                 wall_clock: ManualClock) -> None:
    """Four writers each add one replica five times, re-deciding on every conflict: with
    the spec.replicas precondition the total is exactly 20 (a blind write would lose
    some), starting from 0, which a real Scale shows as no replicas field at all."""
    await kube.create_deployment("contended", replicas=0)
    policy = make_policy(kube.namespace, "contended")
    outcomes: list[base.Outcome] = []

    async def writer() -> None:
        act = actuator(kube, wall_clock)
        applied = 0
        while applied < 5:
            current = await spec_replicas(kube, "contended")
            outcome = await act.apply(policy, make_decision(policy.key, current=current,
                                                            desired=current + 1))
            outcomes.append(outcome.outcome)
            applied += outcome.outcome is base.Outcome.APPLIED

    async with asyncio.TaskGroup() as writers:  # one failing writer stops the others
        for _ in range(4):
            writers.create_task(writer())

    assert await spec_replicas(kube, "contended") == 20
    assert outcomes.count(base.Outcome.APPLIED) == 20
    assert set(outcomes) <= {base.Outcome.APPLIED, base.Outcome.CONFLICT}


@pytest.mark.parametrize("start", [0, 1])
async def test_status_write_between_read_and_write_is_not_a_conflict(
        kube: KubeTestEnv, wall_clock: ManualClock, start: int) -> None:
    """The deployment controller writes status right after every change: the object's
    resourceVersion moves, spec.replicas does not, and the scale change still applies."""
    await kube.create_deployment("status-race", replicas=start)
    policy = make_policy(kube.namespace, "status-race")
    scale_path = f"{deployment_path(kube, 'status-race')}/scale"
    versions: list[tuple[str, str]] = []

    async def controller(read: client.Obj) -> None:
        versions.append((read["metadata"]["resourceVersion"],
                         await write_status(kube.api, deployment_path(kube, "status-race"))))

    api = interleaved(kube.api, after_read_of=scale_path, other_writer=controller)
    outcome = await actuator(kube, wall_clock, api=api).apply(
        policy, make_decision(policy.key, current=start, desired=3))

    (read_version, written_version), = versions
    assert read_version != written_version  # the object did change between read and write
    assert (outcome.outcome, outcome.previous) == (base.Outcome.APPLIED, start)
    assert await spec_replicas(kube, "status-race") == 3


@pytest.mark.parametrize("start", [0, 2])
async def test_replicas_changed_between_read_and_write_is_a_conflict(
        kube: KubeTestEnv, wall_clock: ManualClock, start: int) -> None:
    """Another writer sets spec.replicas between our read and our write: the patch is
    refused whole, reported as a conflict with the new value, and the other value stands."""
    await kube.create_deployment("fought", replicas=start)
    policy = make_policy(kube.namespace, "fought")
    scale_path = f"{deployment_path(kube, 'fought')}/scale"

    async def other_autoscaler(read: client.Obj) -> None:
        await kube.api.merge_patch(scale_path, {"spec": {"replicas": 7}})

    api = interleaved(kube.api, after_read_of=scale_path, other_writer=other_autoscaler)
    outcome = await actuator(kube, wall_clock, api=api).apply(
        policy, make_decision(policy.key, current=start, desired=3))

    assert (outcome.outcome, outcome.previous) == (base.Outcome.CONFLICT, 7)
    assert f"({start} -> 7): another writer" in outcome.reason
    assert await spec_replicas(kube, "fought") == 7
    assert await events_for(kube, "fought") == []


async def test_scales_to_zero_and_back(kube: KubeTestEnv, wall_clock: ManualClock) -> None:
    """A real Scale at 0 replicas has no spec.replicas field; the next change still works."""
    await kube.create_deployment("sleepy", replicas=1)
    policy = make_policy(kube.namespace, "sleepy")
    act = actuator(kube, wall_clock)

    down = await act.apply(policy, make_decision(policy.key, current=1, desired=0))
    assert await spec_replicas(kube, "sleepy") == 0
    up = await act.apply(policy, make_decision(policy.key, current=0, desired=2))

    assert [(o.outcome, o.previous) for o in (down, up)] == [
        (base.Outcome.APPLIED, 1), (base.Outcome.APPLIED, 0)]
    assert await spec_replicas(kube, "sleepy") == 2


async def test_refused_value_is_a_failure_not_a_conflict(kube: KubeTestEnv,
                                                         wall_clock: ManualClock) -> None:
    """A 422 whose precondition held (an invalid value) is no race: nothing to re-decide."""
    await kube.create_deployment("invalid", replicas=1)
    policy = make_policy(kube.namespace, "invalid")

    outcome = await actuator(kube, wall_clock).apply(
        policy, make_decision(policy.key, current=1, desired=-1))

    assert outcome.outcome is base.Outcome.FAILED
    assert outcome.reason.startswith("patch refused: 422")
    assert await spec_replicas(kube, "invalid") == 1


async def test_dry_run_writes_nothing(kube: KubeTestEnv, wall_clock: ManualClock) -> None:
    await kube.create_deployment("dry", replicas=1)
    policy = make_policy(kube.namespace, "dry")

    outcome = await actuator(kube, wall_clock, dry_run=True).apply(
        policy, make_decision(policy.key, current=1, desired=4))

    assert outcome.outcome is base.Outcome.DRY_RUN
    assert await spec_replicas(kube, "dry") == 1
    assert await events_for(kube, "dry") == []


async def test_hpa_owned_target_is_skipped_with_one_event(kube: KubeTestEnv,
                                                          wall_clock: ManualClock) -> None:
    await kube.create_deployment("owned", replicas=1)
    await kube.create_deployment("free", replicas=1)
    await kube.create("autoscaling/v2", "horizontalpodautoscalers", {
        "metadata": {"name": "owned-hpa"},
        "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                                    "name": "owned"},
                 "minReplicas": 1, "maxReplicas": 3,
                 "metrics": [{"type": "Resource", "resource": {
                     "name": "cpu", "target": {"type": "Utilization", "averageUtilization": 50}}}]},
    })
    act = actuator(kube, wall_clock)
    owned = make_policy(kube.namespace, "owned")
    free = make_policy(kube.namespace, "free")

    first = await act.apply(owned, make_decision(owned.key, current=1, desired=2))
    second = await act.apply(owned, make_decision(owned.key, current=1, desired=2))
    other = await act.apply(free, make_decision(free.key, current=1, desired=2))

    assert first.outcome is second.outcome is base.Outcome.SKIPPED_HPA_OWNED
    assert "HorizontalPodAutoscaler/owned-hpa" in first.reason
    assert other.outcome is base.Outcome.APPLIED
    assert await spec_replicas(kube, "owned") == 1
    skipped = [e for e in await events_for(kube, "owned") if e["reason"] == "ScalerSkipped"]
    assert len(skipped) == 1 and skipped[0]["type"] == "Warning"


@pytest.mark.emulator_only
async def test_keda_scaled_object_is_detected(kube: KubeTestEnv, wall_clock: ManualClock) -> None:
    await kube.create_deployment("keda-owned", replicas=1)
    await kube.create("keda.sh/v1alpha1", "scaledobjects", {
        "metadata": {"name": "so"}, "spec": {"scaleTargetRef": {"name": "keda-owned"}}})
    policy = make_policy(kube.namespace, "keda-owned")

    outcome = await actuator(kube, wall_clock).apply(
        policy, make_decision(policy.key, current=1, desired=2))

    assert outcome.outcome is base.Outcome.SKIPPED_HPA_OWNED
    assert "ScaledObject/so" in outcome.reason


@pytest.mark.emulator_only
async def test_scales_a_custom_resource_through_its_scale_subresource(
        kube: KubeTestEnv, wall_clock: ManualClock) -> None:
    await kube.create("leaderworkerset.x-k8s.io/v1", "leaderworkersets", {
        "metadata": {"name": "lws"}, "spec": {"replicas": 1}})
    policy = make_policy(kube.namespace, "lws", kind="LeaderWorkerSet",
                         api_version="leaderworkerset.x-k8s.io/v1")

    outcome = await actuator(kube, wall_clock).apply(
        policy, make_decision(policy.key, current=1, desired=2))

    assert outcome.outcome is base.Outcome.APPLIED
    lws_path = kube.collection("leaderworkerset.x-k8s.io/v1", "leaderworkersets") + "/lws"
    lws = await kube.api.get(lws_path)
    assert lws["spec"]["replicas"] == 2
    assert kube.emulator is not None
    patch = [r for r in kube.emulator.requests if r.method == "PATCH"][-1]
    # JSON patch (CRDs reject strategic merge) guarded by a test of the replicas read.
    assert patch.content_type.startswith("application/json-patch+json")
    assert patch.body[0] == {"op": "test", "path": "/spec/replicas", "value": 1}


@pytest.mark.emulator_only
async def test_conflict_on_patch_is_not_retried(kube: KubeTestEnv, wall_clock: ManualClock) -> None:
    assert kube.emulator is not None
    await kube.create_deployment("racy", replicas=1)
    policy = make_policy(kube.namespace, "racy")
    kube.emulator.inject(Fault(verb="patch", path="/racy/scale$", status=409))

    outcome = await actuator(kube, wall_clock).apply(
        policy, make_decision(policy.key, current=1, desired=2))

    assert outcome.outcome is base.Outcome.CONFLICT
    assert kube.emulator.count(method="PATCH", path="/racy/scale$") == 1
    assert await spec_replicas(kube, "racy") == 1


class RecordingSleep:
    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)


@pytest.mark.emulator_only
async def test_429_honours_retry_after(kube: KubeTestEnv, wall_clock: ManualClock) -> None:
    assert kube.emulator is not None
    await kube.create_deployment("busy", replicas=1)
    policy = make_policy(kube.namespace, "busy")
    kube.emulator.inject(Fault(verb="get", path="/busy/scale$", status=429, retry_after=7,
                               times=2))
    sleep = RecordingSleep()

    outcome = await actuator(kube, wall_clock, api=kube.with_api(sleep=sleep)).apply(
        policy, make_decision(policy.key, current=1, desired=2))

    assert outcome.outcome is base.Outcome.APPLIED
    assert sleep.delays == [7.0, 7.0]


@pytest.mark.emulator_only
async def test_5xx_backs_off_exponentially_with_jitter_then_gives_up(
        kube: KubeTestEnv, wall_clock: ManualClock) -> None:
    assert kube.emulator is not None
    await kube.create_deployment("flaky", replicas=1)
    policy = make_policy(kube.namespace, "flaky")
    retry = kube_settings.RetrySettings(max_attempts=4, base_delay_s=1.0, jitter_ratio=0.2)
    kube.emulator.inject(Fault(verb="patch", path="/flaky/scale$", status=503, times=2))
    sleep = RecordingSleep()
    act = actuator(kube, wall_clock, api=kube.with_api(sleep=sleep, retry=retry))

    outcome = await act.apply(policy, make_decision(policy.key, current=1, desired=2))

    assert outcome.outcome is base.Outcome.APPLIED
    # 1 s then 2 s, each within +-20 %.
    assert len(sleep.delays) == 2
    assert 0.8 <= sleep.delays[0] <= 1.2 and 1.6 <= sleep.delays[1] <= 2.4

    kube.emulator.inject(Fault(verb="patch", path="/flaky/scale$", status=500, times=10))
    failed = await act.apply(policy, make_decision(policy.key, current=2, desired=3))
    assert failed.outcome is base.Outcome.FAILED
    assert len(sleep.delays) == 2 + 3  # four attempts, three waits
    assert await spec_replicas(kube, "flaky") == 2


@pytest.mark.emulator_only
async def test_timeouts_are_retried(kube: KubeTestEnv, wall_clock: ManualClock) -> None:
    assert kube.emulator is not None
    await kube.create_deployment("slow", replicas=1)
    policy = make_policy(kube.namespace, "slow")
    kube.emulator.inject(Fault(verb="get", path="/slow/scale$", delay_s=1.0))
    sleep = RecordingSleep()

    outcome = await actuator(kube, wall_clock, api=kube.with_api(sleep=sleep, timeout_s=0.2)
                             ).apply(policy, make_decision(policy.key, current=1, desired=2))

    assert outcome.outcome is base.Outcome.APPLIED
    assert len(sleep.delays) == 1


async def test_not_leader_does_not_write(kube: KubeTestEnv, wall_clock: ManualClock) -> None:
    class Follower(base.AlwaysLeader):
        @property
        def is_leader(self) -> bool:
            return False

    await kube.create_deployment("follower", replicas=1)
    policy = make_policy(kube.namespace, "follower")

    outcome = await actuator(kube, wall_clock, leader=Follower()).apply(
        policy, make_decision(policy.key, current=1, desired=2))

    assert outcome.outcome is base.Outcome.NOT_LEADER
    assert await spec_replicas(kube, "follower") == 1


async def test_events_are_rate_limited_per_object(kube: KubeTestEnv, wall_clock: ManualClock,
                                                  monotonic: ManualClock) -> None:
    recorder = events.EventRecorder(
        kube.api, settings=kube_settings.EventSettings(burst=2, refill_seconds=60),
        wall_clock=wall_clock, instance="test", monotonic=monotonic)
    ref = resources.ObjectRef("apps/v1", "Deployment", "deployments", kube.namespace, "noisy")
    other = resources.ObjectRef("apps/v1", "Deployment", "deployments", kube.namespace, "quiet")

    posted = [await recorder.record(ref, reason="ScaledUp", message=str(i)) for i in range(5)]
    monotonic.advance(60)  # one token back
    posted.append(await recorder.record(ref, reason="ScaledUp", message="later"))
    other_posted = await recorder.record(other, reason="ScaledUp", message="x")

    assert posted == [True, True, False, False, False, True]
    assert other_posted
    assert recorder.suppressed == 3
    assert len(await events_for(kube, "noisy")) == 3


async def test_ownership_is_rechecked_after_its_ttl(kube: KubeTestEnv, wall_clock: ManualClock,
                                                    monotonic: ManualClock) -> None:
    await kube.create_deployment("handover", replicas=1)
    await kube.create("autoscaling/v2", "horizontalpodautoscalers", {
        "metadata": {"name": "handover"},
        "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                                    "name": "handover"}, "maxReplicas": 2}})
    act = actuator(kube, wall_clock, monotonic=monotonic)
    policy = make_policy(kube.namespace, "handover")
    decision = make_decision(policy.key, current=1, desired=2)
    assert (await act.apply(policy, decision)).outcome is base.Outcome.SKIPPED_HPA_OWNED

    # The team removes its HPA; within the 30 s TTL the cached answer still holds.
    await kube.api.request(
        "DELETE", f"{kube.collection('autoscaling/v2', 'horizontalpodautoscalers')}/handover")
    monotonic.advance(29)
    assert (await act.apply(policy, decision)).outcome is base.Outcome.SKIPPED_HPA_OWNED
    monotonic.advance(2)
    assert (await act.apply(policy, decision)).outcome is base.Outcome.APPLIED
