"""Every request the adapters make is covered by the documented RBAC rules, and every rule
is needed: one pass through reader, replica and pool actuators, leader election and events."""

from __future__ import annotations

import dataclasses

import pytest

from scaler.actuators import base, events, leader, nodepool, rbac, replicas, state
from scaler.actuators import settings as kube_settings
from scaler.engine import types
from scaler.policy import model
from scaler.testing.kube_emulator.env import KubeTestEnv, ManualClock

from .factories import make_decision, make_policy

pytestmark = [pytest.mark.kube, pytest.mark.emulator_only]


async def test_requests_match_rbac_rules(kube: KubeTestEnv, wall_clock: ManualClock) -> None:
    assert kube.emulator is not None
    settings = kube_settings.KubeSettings(
        lease=kube_settings.LeaseSettings(namespace=kube.namespace),
        placeholder=kube_settings.PlaceholderSettings(namespace=kube.namespace),
        clusterapi_namespace=kube.namespace)
    await kube.create_deployment("llama", replicas=1)
    await kube.create("apps/v1", "statefulsets", {
        "metadata": {"name": "sts"}, "spec": {"replicas": 1, "selector": {}}})
    await kube.create("leaderworkerset.x-k8s.io/v1", "leaderworkersets", {
        "metadata": {"name": "lws"}, "spec": {"replicas": 1}})
    await kube.create("cluster.x-k8s.io/v1beta1", "machinedeployments", {
        "metadata": {"name": "md"}, "spec": {"replicas": 1}})
    setup = len(kube.emulator.requests)

    elector = leader.LeaseElector(kube.api, settings=settings.lease, identity="me",
                                  wall_clock=wall_clock)
    assert await elector.try_acquire_or_renew()
    assert await elector.try_acquire_or_renew()
    recorder = events.EventRecorder(kube.api, settings=settings.events, wall_clock=wall_clock,
                                    instance="me")
    actuator = replicas.KubeReplicaActuator(kube.api, settings=settings, recorder=recorder,
                                            leader=elector)
    reader = state.KubeClusterReader(kube.api, settings=settings, wall_clock=wall_clock)
    await reader.start()
    try:
        for kind, api_version, name in (("Deployment", "apps/v1", "llama"),
                                        ("StatefulSet", "apps/v1", "sts"),
                                        ("LeaderWorkerSet", "leaderworkerset.x-k8s.io/v1",
                                         "lws")):
            policy = make_policy(kube.namespace, name, kind=kind, api_version=api_version)
            cluster = await reader.read(policy)
            outcome = await actuator.apply(policy, make_decision(
                policy.key, current=cluster.current, desired=cluster.current + 1))
            assert outcome.outcome is base.Outcome.APPLIED
    finally:
        await reader.stop()
    plan = types.NodePlan(pool="p", resource_name="nvidia.com/gpu", gpus_per_node=8,
                          nodes_for_replicas=1, headroom_nodes=1, nodes_wanted=2,
                          placeholder_pods=1, placeholder_gpus=8)
    placeholder = nodepool.PlaceholderActuator(kube.api, settings=settings, leader=elector)
    pool = model.NodePool(name="p")
    assert (await placeholder.apply(pool, plan)).written
    assert (await placeholder.apply(pool, dataclasses.replace(plan, placeholder_pods=2))).written
    capi = nodepool.ClusterApiActuator(kube.api, settings=settings, leader=elector)
    capi_pool = model.NodePool(name="p", actuator="clusterapi", machine_deployment="md")
    assert (await capi.apply(capi_pool, plan)).written
    await elector.release()

    used = set()
    for record in kube.emulator.requests[setup:]:
        attributes = rbac.request_attributes(record.method, record.path,
                                             watch=record.verb == "watch")
        assert attributes is not None, record.path
        assert rbac.allowed(*attributes), f"not in RBAC: {attributes} ({record.path})"
        used.add(attributes)
    granted = {(r.api_group, resource, verb) for r in rbac.RULES
               for resource in r.resources for verb in r.verbs}
    assert granted == used  # and nothing wider than needed
