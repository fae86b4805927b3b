"""Pod deletion costs before a scale-down: from each pod's reported work, written before
the replicas patch, only where they change, failures counted and never in the way; the
idlest pods are the ones removed. Runs against the emulator or SCALER_TEST_KUBECONFIG."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from scaler.actuators import base, client, cluster_reader, deletion_cost, events, rbac, replicas
from scaler.actuators import settings as kube_settings
from scaler.core import vocabulary
from scaler.emulator import ControllerSettings, EmulatorController, Fault
from scaler.emulator import controller as emulator_controller
from scaler.emulator.env import KubeTestEnv, ManualClock
from scaler.engine import spare, types
from scaler.policy import model
from scaler.service import runner
from scaler.service import settings as service_settings
from scaler.signals import samples

from .factories import make_decision, make_policy

pytestmark = pytest.mark.kube

Work = spare.PodWork


@dataclass(slots=True)
class RecordingApi(client.KubeApi):
    """The API as the actuator sees it, keeping (method, path) of every call it makes."""

    calls: list[tuple[str, str]] = field(default_factory=list)

    async def request(self, method: str, path: str, *, query: dict[str, str] | None = None,
                      body: Any = None, content_type: str = "application/json") -> client.Obj:
        self.calls.append((method, path))
        return await client.KubeApi.request(self, method, path, query=query, body=body,
                                            content_type=content_type)


def recording(kube: KubeTestEnv) -> RecordingApi:
    return RecordingApi(kube.api.api_client, timeout_s=kube.api.timeout_s, retry=kube.api.retry)


def actuator(kube: KubeTestEnv, wall_clock: ManualClock, api: client.KubeApi,
             work: Mapping[str, Work], *, settings: kube_settings.KubeSettings | None = None,
             ) -> tuple[replicas.KubeReplicaActuator, deletion_cost.DeletionCoster]:
    settings = settings or kube_settings.KubeSettings()
    costs = deletion_cost.DeletionCoster(api, settings=settings, work=lambda _: work)
    recorder = events.EventRecorder(api, settings=settings.events, wall_clock=wall_clock,
                                    instance="test")
    return replicas.KubeReplicaActuator(api, settings=settings, recorder=recorder,
                                        leader=base.AlwaysLeader(),
                                        deletion_costs=costs), costs


async def active_pods(kube: KubeTestEnv, app: str) -> dict[str, client.Obj]:
    listing = await kube.api.get(cluster_reader.pods_path(kube.namespace),
                                 query={"labelSelector": f"app={app}"})
    return {p["metadata"]["name"]: p for p in listing["items"] if deletion_cost.is_active(p)}


async def ready_pods(kube: KubeTestEnv, app: str, count: int,
                     controller: EmulatorController | None) -> list[str]:
    """Until `count` pods of the Deployment are Ready (the emulator's controller walks them;
    a real cluster's controllers and kubelet do it themselves). Sorted by name."""
    async with asyncio.timeout(60):
        while True:
            if controller is not None:
                controller.reconcile()
            pods = await active_pods(kube, app)
            ready = sorted(n for n, p in pods.items()
                           if any(c.get("type") == "Ready" and c.get("status") == "True"
                                  for c in (p.get("status") or {}).get("conditions") or []))
            if len(pods) == count and len(ready) == count:
                return ready
            await asyncio.sleep(0.01 if controller is not None else 0.5)


def controller_for(kube: KubeTestEnv) -> EmulatorController | None:
    return None if kube.emulator is None else EmulatorController(kube.emulator,
                                                                  ControllerSettings())


def cost_of(pod: client.Obj) -> str | None:
    return ((pod["metadata"].get("annotations") or {}).get(deletion_cost.ANNOTATION))


async def scale_of(kube: KubeTestEnv, name: str) -> int:
    scale = await kube.api.get(f"{kube.collection('apps/v1', 'deployments')}/{name}/scale")
    return int(scale["spec"].get("replicas", 0))


async def test_costs_follow_the_work_and_are_written_before_the_replicas_patch(
        kube: KubeTestEnv, wall_clock: ManualClock) -> None:
    controller = controller_for(kube)
    await kube.create_deployment("llama", replicas=4)
    await ready_pods(kube, "llama", 4, controller)
    # The busy pod is the one the ReplicaSet would remove first without costs (by the
    # emulator's rendering of its order), the idle one the one it would remove last.
    busy, some, silent, idle = [p["metadata"]["name"] for p in sorted(
        (await active_pods(kube, "llama")).values(), key=emulator_controller.deletion_rank)]
    work = {busy: Work(in_flight=30, queue_depth=2), some: Work(in_flight=5), idle: Work(),
            "gateway": Work(queue_depth=900)}  # a source that is no pod: ignored
    api = recording(kube)
    act, costs = actuator(kube, wall_clock, api, work)
    policy = make_policy(kube.namespace, "llama")

    outcome = await act.apply(policy, make_decision(policy.key, current=4, desired=3))

    assert outcome.outcome is base.Outcome.APPLIED
    # 32 running + waiting, 5, idle (0: already what the absent annotation means, so not
    # written), and the silent pod the median of the reports (0, 5, 32 -> 5).
    pods = await active_pods(kube, "llama")
    assert {name: cost_of(pod) for name, pod in pods.items()} == {
        busy: "32", some: "5", idle: None, silent: "5"}
    assert costs.counts == {"patched": 3}
    writes = [(method, path) for method, path in api.calls if method == "PATCH"]
    pods_path = cluster_reader.pods_path(kube.namespace)
    assert sorted(writes[:3]) == sorted(("PATCH", f"{pods_path}/{name}")
                                        for name in (busy, some, silent))
    assert writes[3:] == [("PATCH", f"{kube.collection('apps/v1', 'deployments')}/llama/scale")]
    assert outcome.reason.endswith("; deletion costs: 3 pods annotated")

    # The ReplicaSet removes the idlest ready pod: the one reporting nothing in flight.
    if controller is not None:
        controller.reconcile()
    async with asyncio.timeout(60):
        while len(remaining := await active_pods(kube, "llama")) != 3:
            await asyncio.sleep(0.01 if controller is not None else 0.5)
    assert sorted(remaining) == sorted((busy, some, silent))


def pod_writes(api: RecordingApi) -> list[str]:
    """The pods the actuator patched, in order."""
    return [path.rsplit("/", 1)[1] for method, path in api.calls
            if method == "PATCH" and "/pods/" in path]


async def test_only_changed_costs_are_written_and_none_on_a_scale_up(
        kube: KubeTestEnv, wall_clock: ManualClock) -> None:
    controller = controller_for(kube)
    await kube.create_deployment("steady", replicas=3)
    first, second, third = await ready_pods(kube, "steady", 3, controller)
    work = {first: Work(in_flight=8), second: Work(in_flight=2), third: Work(in_flight=2)}
    policy = make_policy(kube.namespace, "steady")
    api = recording(kube)
    act, costs = actuator(kube, wall_clock, api, work)

    assert (await act.apply(policy, make_decision(policy.key, current=3, desired=4))).written
    assert pod_writes(api) == [] and costs.counts == {}
    (fourth,) = set(await ready_pods(kube, "steady", 4, controller)) - {first, second, third}
    api.calls.clear()
    # Down: the three reporting pods, and the new silent one at the median (8, 2, 2 -> 2).
    assert (await act.apply(policy, make_decision(policy.key, current=4, desired=3))).written
    assert sorted(pod_writes(api)) == sorted((first, second, third, fourth))

    # Again, with one pod's work changed: that pod alone is written. (Whichever pod of
    # cost 2 was removed, the silent one's median stays 2.)
    await ready_pods(kube, "steady", 3, controller)
    work[first] = Work(in_flight=9)
    api.calls.clear()
    assert (await act.apply(policy, make_decision(policy.key, current=3, desired=2))).written
    assert pod_writes(api) == [first]
    assert costs.counts == {"patched": 5}


async def test_a_pod_gone_before_its_patch_is_counted_and_the_scale_down_applies(
        kube: KubeTestEnv, wall_clock: ManualClock) -> None:
    controller = controller_for(kube)
    await kube.create_deployment("gone", replicas=2)
    doomed, kept = await ready_pods(kube, "gone", 2, controller)
    pods_path = cluster_reader.pods_path(kube.namespace)

    @dataclass(slots=True)
    class DeletingApi(client.KubeApi):
        """Right after the pod list, another actor deletes a pod at once (grace 0)."""

        async def get(self, path: str, *, query: dict[str, str] | None = None) -> client.Obj:
            read = await client.KubeApi.get(self, path, query=query)
            if path == pods_path:
                await self.request("DELETE", f"{pods_path}/{doomed}",
                                   body={"gracePeriodSeconds": 0})
            return read

    api = DeletingApi(kube.api.api_client, timeout_s=kube.api.timeout_s, retry=kube.api.retry)
    act, costs = actuator(kube, wall_clock, api, {doomed: Work(in_flight=4),
                                                  kept: Work(in_flight=1)})
    policy = make_policy(kube.namespace, "gone")

    outcome = await act.apply(policy, make_decision(policy.key, current=2, desired=1))

    assert outcome.outcome is base.Outcome.APPLIED
    assert await scale_of(kube, "gone") == 1
    assert costs.counts == {"patched": 1, "failed": 1}
    assert outcome.reason.endswith("deletion costs: 1 pods annotated, 1 failed")


@pytest.mark.emulator_only
async def test_refused_or_slow_pod_patches_never_stop_the_scale_down(
        kube: KubeTestEnv, wall_clock: ManualClock) -> None:
    """Patching pods forbidden (RBAC without `patch` on pods), then an API server too slow
    to answer within the step's time limit: counted, and the replicas are set all the same."""
    assert kube.emulator is not None
    controller = controller_for(kube)
    await kube.create_deployment("refused", replicas=4)
    names = await ready_pods(kube, "refused", 4, controller)
    work = {name: Work(in_flight=i + 1) for i, name in enumerate(names)}
    pods = f"^{cluster_reader.pods_path(kube.namespace)}/"
    kube.emulator.inject(Fault(verb="patch", path=pods, status=403, times=4,
                               message="pods is forbidden: cannot patch resource \"pods\""))
    policy = make_policy(kube.namespace, "refused")
    act, costs = actuator(kube, wall_clock, kube.api, work)
    assert (await act.apply(policy, make_decision(policy.key, current=4, desired=3))).written
    assert costs.counts == {"failed": 4}
    assert await scale_of(kube, "refused") == 3

    await ready_pods(kube, "refused", 3, controller)
    kube.emulator.inject(Fault(verb="patch", path=pods, delay_s=0.5, times=3))
    slow = kube_settings.KubeSettings(request_timeout_s=0.05)
    act, costs = actuator(kube, wall_clock, kube.api, work, settings=slow)
    started = asyncio.get_running_loop().time()
    assert (await act.apply(policy, make_decision(policy.key, current=3, desired=2))).written
    assert asyncio.get_running_loop().time() - started < 0.5  # the scale patch did not wait
    assert costs.counts == {"failed": 3}  # the three pods left, all given up on
    assert await scale_of(kube, "refused") == 2
    await asyncio.sleep(0.5)  # the emulator's delayed answers end before the test does


@pytest.mark.emulator_only
async def test_at_most_max_pods_are_written_biggest_change_first(
        kube: KubeTestEnv, wall_clock: ManualClock) -> None:
    assert kube.emulator is not None
    await kube.create_deployment("many", replicas=5)
    names = await ready_pods(kube, "many", 5, controller_for(kube))
    work = {name: Work(in_flight=10 * (i + 1)) for i, name in enumerate(names)}
    bounded = kube_settings.KubeSettings(
        deletion_cost=kube_settings.DeletionCostSettings(max_pods=2))
    act, costs = actuator(kube, wall_clock, kube.api, work, settings=bounded)
    policy = make_policy(kube.namespace, "many")
    outcome = await act.apply(policy, make_decision(policy.key, current=5, desired=4))
    assert outcome.written and outcome.reason.endswith("2 pods annotated, 3 deferred")
    annotated = {name: cost_of(pod) for name, pod in (await active_pods(kube, "many")).items()
                 if cost_of(pod) is not None}
    assert annotated == {names[4]: "50", names[3]: "40"}
    assert costs.counts == {"patched": 2}


async def test_targets_that_ignore_deletion_costs_are_left_alone(
        kube: KubeTestEnv, wall_clock: ManualClock) -> None:
    await kube.create("apps/v1", "statefulsets", {
        "metadata": {"name": "sts"},
        "spec": {"replicas": 2, "serviceName": "sts", "selector": {"matchLabels": {"app": "sts"}},
                 "template": {"metadata": {"labels": {"app": "sts"}}, "spec": {"containers": [
                     {"name": "main", "image": "registry.k8s.io/pause:3.10"}]}}}})
    api = recording(kube)
    act, costs = actuator(kube, wall_clock, api, {"sts-0": Work(in_flight=3)})
    policy = make_policy(kube.namespace, "sts", kind="StatefulSet")
    outcome = await act.apply(policy, make_decision(policy.key, current=2, desired=1))
    assert outcome.written
    assert outcome.reason.endswith("StatefulSet does not remove pods by deletion cost")
    assert not any("/pods" in path for _, path in api.calls)
    assert costs.counts == {}


@pytest.mark.emulator_only
async def test_every_request_is_granted_and_pods_patch_only_when_enabled(
        kube: KubeTestEnv, wall_clock: ManualClock) -> None:
    assert kube.emulator is not None
    await kube.create_deployment("granted", replicas=2)
    names = await ready_pods(kube, "granted", 2, controller_for(kube))
    settings = kube_settings.KubeSettings(watch_namespaces=(kube.namespace,))
    setup = len(kube.emulator.requests)
    act, costs = actuator(kube, wall_clock, kube.api, {names[0]: Work(in_flight=1)},
                          settings=settings)
    policy = make_policy(kube.namespace, "granted")
    assert (await act.apply(policy, make_decision(policy.key, current=2, desired=1))).written
    assert costs.counts == {"patched": 2}  # the reporting pod, and the silent one (median)
    plan = rbac.plan(settings, name="scaler", namespace="scaler-system")
    granted = rbac.grants(rbac.manifests(plan), plan.subject)
    for record in kube.emulator.requests[setup:]:
        attributes = rbac.request_attributes(record.method, record.path)
        assert attributes is not None and rbac.allowed(granted, attributes), record.path
    off = settings.model_copy(update={
        "deletion_cost": kube_settings.DeletionCostSettings(enabled=False)})
    off_plan = rbac.plan(off, name="scaler", namespace="scaler-system")
    assert not rbac.allowed(rbac.grants(rbac.manifests(off_plan), off_plan.subject),
                            rbac.Attributes(kube.namespace, "", "pods", "patch"))


def batch_policy(namespace: str, target: str) -> model.ScalePolicy:
    online = make_policy(namespace, target)
    return online.model_copy(update={"spec": online.spec.model_copy(
        update={"tier": vocabulary.Tier.BATCH})})


class StaticReader:
    """A cluster reader at the seam: the same state for every policy."""

    async def read(self, policy: model.ScalePolicy) -> types.ClusterState:
        return types.ClusterState(current=5, ready=5)


async def test_batch_tiers_get_the_busy_count_and_other_tiers_none() -> None:
    work = {"a": Work(in_flight=2), "b": Work(queue_depth=1), "c": Work()}
    reader = deletion_cost.BusyReader(StaticReader(), work=lambda _: work)
    online, batch = make_policy("ns", "m"), batch_policy("ns", "m")
    assert (await reader.read(online)).busy_replicas is None
    assert (await reader.read(batch)) == types.ClusterState(current=5, ready=5,
                                                            busy_replicas=2)


async def test_a_silent_pod_of_a_batch_tier_is_possibly_busy_and_goes_after_the_idle_one(
        kube: KubeTestEnv, wall_clock: ManualClock) -> None:
    controller = controller_for(kube)
    await kube.create_deployment("jobs", replicas=3)
    await ready_pods(kube, "jobs", 3, controller)
    # At equal cost the ReplicaSet would remove the silent pod first, then the idle one.
    silent, idle, busy = [p["metadata"]["name"] for p in sorted(
        (await active_pods(kube, "jobs")).values(), key=emulator_controller.deletion_rank)]
    work = {idle: Work(), busy: Work(in_flight=5), "gateway": Work(queue_depth=0)}
    policy = batch_policy(kube.namespace, "jobs")
    settings = kube.settings.model_copy(update={"watch_namespaces": (kube.namespace,)})
    reader = cluster_reader.KubeClusterReader(kube.api, settings=settings,
                                              wall_clock=wall_clock)
    await reader.start()
    try:
        busy_reader = deletion_cost.BusyReader(reader, work=lambda _: work)
        # The busy pod and the silent one may hold work: the floor keeps 2 of the 3.
        state = await busy_reader.read(policy)
        assert (state.ready, state.busy_replicas, spare.busy_floor(state)) == (3, 2, 2)

        api = recording(kube)
        act, _ = actuator(kube, wall_clock, api, work)
        assert (await act.apply(policy, make_decision(policy.key, current=3,
                                                      desired=2))).written
        # Ranked as the busy one (5), above the idle one's 0 (absent: not written).
        pods = await active_pods(kube, "jobs")
        assert {name: cost_of(pod) for name, pod in pods.items()} == {
            silent: "5", idle: None, busy: "5"}
        if controller is not None:
            controller.reconcile()
        async with asyncio.timeout(60):
            while len(remaining := await active_pods(kube, "jobs")) != 2:
                await asyncio.sleep(0.01 if controller is not None else 0.5)
        assert sorted(remaining) == sorted((silent, busy))  # the idle one went

        async with asyncio.timeout(60):
            while (state := await busy_reader.read(policy)).ready != 2:
                await asyncio.sleep(0.01 if controller is not None else 0.5)
        assert spare.busy_floor(state) == 2  # a scale-down to 1 is held: nothing idle left
    finally:
        await reader.stop()


@pytest.mark.parametrize(("tier", "reported", "cost"), [
    (vocabulary.Tier.ONLINE, [], 0), (vocabulary.Tier.BATCH, [], 0),  # nobody reports
    (vocabulary.Tier.ONLINE, [0, 40], 1),  # the median 0 would tie with the idle pod
    (vocabulary.Tier.ONLINE, [0, 3, 40], 3), (vocabulary.Tier.ONLINE, [0, 0], 1),
    (vocabulary.Tier.DEV, [7, 9], 7),
    (vocabulary.Tier.BATCH, [0, 5], 5), (vocabulary.Tier.BATCH, [0, 0, 0, 40], 40),
    (vocabulary.Tier.BATCH, [0, 0], 1), (vocabulary.Tier.BATCH, [2, 9, 30], 9)])
def test_a_silent_pod_never_goes_before_an_idle_one_and_ranks_busy_in_a_batch_tier(
        tier: vocabulary.Tier, reported: list[int], cost: int) -> None:
    assert spare.silent_cost(reported, tier=tier) == cost


def test_silent_ready_pods_count_as_busy_only_beside_reporting_ones() -> None:
    pods = frozenset({"a", "b", "c", "d"})
    ready = frozenset({"a", "b", "c"})  # d is starting
    work = {"a": Work(), "b": Work(in_flight=5)}
    assert spare.possibly_busy(work, pods=pods, ready=ready) == 2  # b, and silent c
    # No pod of the target reports (a gateway's queue only): no pod's work is known.
    gateway = {"gateway": Work(queue_depth=3)}
    assert spare.possibly_busy(gateway, pods=pods, ready=ready) == 1
    assert spare.possibly_busy(work, pods=None, ready=None) == 1  # pods unnamed


@pytest.mark.parametrize(("value", "cost"), [
    ("0", 0), ("42", 42), ("-7", -7), ("2147483647", 2**31 - 1), ("-2147483648", -(2**31)),
    ("+10", None), ("008", None), ("2147483648", None), ("", None), ("1.0", None),
    (" 1", None)])
def test_the_annotation_is_read_as_the_replicaset_controller_reads_it(
        value: str, cost: int | None) -> None:
    assert deletion_cost.parse_cost(value) == cost
    pod = {"metadata": {"annotations": {deletion_cost.ANNOTATION: value}}}
    assert deletion_cost.effective_cost(pod) == (cost or 0)


def test_the_service_reads_each_replicas_fresh_work_from_the_store() -> None:
    """Per pod (the `source` of its messages, over NATS or HTTP), in flight and queued,
    only reports within the policy's staleAfterSeconds (30 s): a pod whose report is older
    has no known work, and sources that are no replica are left out."""
    now = 1_764_400_000.0
    service = runner.Service(service_settings.Settings(), wall_clock=lambda: now)
    policy = make_policy("ns", "llama")
    running, waiting = vocabulary.Signal.IN_FLIGHT, vocabulary.Signal.QUEUE_DEPTH

    def sample(signal: vocabulary.Signal, source: str, age_s: float, value: float,
               model_key: str = policy.key) -> samples.Sample:
        return samples.Sample(model_key, signal, source, now - age_s, value)

    service.store.put([
        sample(running, "nats/pod-a", 1, 30.0), sample(waiting, "nats/pod-a", 1, 2.0),
        sample(running, "http/pod-a", 2, 28.0),  # the same pod over HTTP: counted once
        sample(waiting, "http/pod-b", 2, 4.0),
        sample(running, "nats/pod-old", 31, 9.0),  # stale
        sample(running, "nats/anonymous", 1, 5.0),  # a message that named no source
        sample(waiting, "jetstream/REQUESTS/llama", 1, 70.0),  # the stream, no replica
        sample(running, "prometheus", 1, 40.0),
        sample(running, "nats/pod-x", 0, 1.0, model_key="ns/other")])
    assert service.pod_work(policy) == {"pod-a": Work(in_flight=30, queue_depth=2),
                                        "pod-b": Work(queue_depth=4)}


def test_a_shared_queues_source_is_no_replicas_work() -> None:
    """A gateway the policy names in `sharedQueueSources` holds requests for every
    replica: removing a pod loses none of them, so its queue ranks no pod."""
    now = 1_764_400_000.0
    service = runner.Service(service_settings.Settings(), wall_clock=lambda: now)
    plain = make_policy("ns", "llama")
    shared = plain.model_copy(update={"spec": plain.spec.model_copy(update={
        "sources": model.Sources(shared_queue_sources=("gateway",))})})
    waiting = vocabulary.Signal.QUEUE_DEPTH
    service.store.put([samples.Sample(plain.key, waiting, source, now - 1, value)
                       for source, value in (("nats/pod-a", 2.0), ("nats/gateway", 80.0),
                                             ("http/gateway", 80.0))])
    assert service.pod_work(shared) == {"pod-a": Work(queue_depth=2)}
    assert service.pod_work(plain) == {"pod-a": Work(queue_depth=2),
                                       "gateway": Work(queue_depth=80)}
