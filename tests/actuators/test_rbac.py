"""Every request the adapters make is allowed by the objects `scaler kube rbac` prints, and
every grant is used: one pass through reader, replica and pool actuators, leader election
and events, namespaced (the default) and cluster-wide."""

from __future__ import annotations

import dataclasses
import uuid
from pathlib import Path

import pytest

from scaler.actuators import (
    base,
    cluster_reader,
    deletion_cost,
    events,
    leader,
    nodepool,
    rbac,
    replicas,
    wiring,
)
from scaler.actuators import settings as kube_settings
from scaler.emulator.env import KubeTestEnv, ManualClock
from scaler.engine import spare, types
from scaler.policy import model

from .factories import make_decision, make_policy

pytestmark = [pytest.mark.kube, pytest.mark.emulator_only]


async def _namespace(kube: KubeTestEnv, role: str) -> str:
    name = f"{role}-{uuid.uuid4().hex[:6]}"
    await kube.api.request("POST", "/api/v1/namespaces", body={"metadata": {"name": name}})
    return name


@pytest.mark.parametrize("cluster_wide", [False, True], ids=["namespaced", "cluster-wide"])
async def test_requests_match_the_printed_rbac(kube: KubeTestEnv, wall_clock: ManualClock,
                                               cluster_wide: bool) -> None:
    assert kube.emulator is not None
    # The Lease, the placeholders and the MachineDeployments each in a namespace of their
    # own, so a request in the wrong one is not allowed by accident.
    lease_ns, headroom_ns, capi_ns = [await _namespace(kube, role)
                                      for role in ("lease", "headroom", "capi")]
    settings = kube_settings.KubeSettings(
        watch_namespaces=() if cluster_wide else (kube.namespace,), cluster_wide=cluster_wide,
        lease=kube_settings.LeaseSettings(namespace=lease_ns),
        placeholder=kube_settings.PlaceholderSettings(enabled=True, namespace=headroom_ns),
        clusterapi_namespace=capi_ns)
    await kube.create_deployment("llama", replicas=1)
    await kube.create("v1", "pods", {"metadata": {"name": "busy", "labels": {"app": "llama"}},
                                     "spec": {"containers": [{"name": "c", "image": "i"}]}})
    await kube.create("apps/v1", "statefulsets", {
        "metadata": {"name": "sts"}, "spec": {"replicas": 1, "selector": {}}})
    await kube.create("leaderworkerset.x-k8s.io/v1", "leaderworkersets", {
        "metadata": {"name": "lws"}, "spec": {"replicas": 1}})
    await kube.api.request(
        "POST", f"/apis/cluster.x-k8s.io/v1beta1/namespaces/{capi_ns}/machinedeployments",
        body={"metadata": {"name": "md"}, "spec": {"replicas": 1}})
    setup = len(kube.emulator.requests)

    elector = leader.LeaseElector(kube.api, settings=settings.lease, identity="me",
                                  wall_clock=wall_clock)
    assert await elector.try_acquire_or_renew()
    assert await elector.try_acquire_or_renew()
    recorder = events.EventRecorder(kube.api, settings=settings.events, wall_clock=wall_clock,
                                    instance="me")
    costs = deletion_cost.DeletionCoster(kube.api, settings=settings, work=lambda _: {
        "busy": spare.PodWork(in_flight=3)})
    actuator = replicas.KubeReplicaActuator(kube.api, settings=settings, recorder=recorder,
                                            leader=elector, deletion_costs=costs)
    reader = cluster_reader.KubeClusterReader(kube.api, settings=settings, wall_clock=wall_clock)
    await reader.start()
    try:
        # A DRA policy: ResourceSlices and DeviceClasses (cluster), ResourceClaims listed and
        # watched; read first, so the watches are made before the reader stops.
        dra_policy = make_policy(kube.namespace, "llama")
        await reader.read(dra_policy.model_copy(update={"spec": dra_policy.spec.model_copy(
            update={"resources": model.Resources(device_class_name="gpu.nvidia.com")})}))
        for kind, api_version, name in (("Deployment", "apps/v1", "llama"),
                                        ("StatefulSet", "apps/v1", "sts"),
                                        ("LeaderWorkerSet", "leaderworkerset.x-k8s.io/v1",
                                         "lws")):
            policy = make_policy(kube.namespace, name, kind=kind, api_version=api_version)
            cluster = await reader.read(policy)
            outcome = await actuator.apply(policy, make_decision(
                policy.key, current=cluster.current, desired=cluster.current + 1))
            assert outcome.outcome is base.Outcome.APPLIED
        # A scale-down annotates the pods first (pods patch, kube.deletion_cost).
        policy = make_policy(kube.namespace, "llama")
        current = (await reader.read(policy)).current
        assert (await actuator.apply(policy, make_decision(
            policy.key, current=current, desired=current - 1))).written
        assert costs.counts["patched"] == 1
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
    # The learned state's ConfigMap, beside the Lease: read, created, replaced.
    learned = wiring.learned_store(kube.api, settings)
    assert learned is not None and learned.namespace == lease_ns
    assert await learned.read() == {}
    await learned.write({"ns.model": "{}"})
    await learned.write({"ns.model": "[]"})
    assert await learned.read() == {"ns.model": "[]"}
    await elector.release()

    grants = rbac.plan(settings, name="scaler", namespace="scaler-system", clusterapi=True)
    granted = rbac.grants(rbac.manifests(grants), grants.subject)
    used: set[rbac.Attributes] = set()
    for record in kube.emulator.requests[setup:]:
        attributes = rbac.request_attributes(record.method, record.path,
                                             watch=record.verb == "watch")
        assert attributes is not None, record.path
        assert rbac.allowed(granted, attributes), f"not granted: {attributes} ({record.path})"
        used.add(attributes)
    # ... and nothing wider than needed: every grant allowed some request.
    assert {g for g in granted if not any(rbac.authorizes(g, u) for u in used)} == set()
    pods_scope = None if cluster_wide else kube.namespace
    assert rbac.Attributes(pods_scope, "", "pods", "watch") in used
    assert {rbac.Attributes(pods_scope, "apps", kind, "watch")
            for kind in ("deployments", "statefulsets")} <= used  # targets' replicas
    wide = {g for g in granted if g[0] == "*"}
    assert {g[2] for g in wide} == ({"nodes", "resourceslices", "deviceclasses"} | (
        {"pods", "deployments/scale", "events", "resourceclaims", "statefulsets/scale",
         "deployments", "statefulsets",
         "leaderworkersets/scale", "horizontalpodautoscalers", "scaledobjects"}
        if cluster_wide else set()))


def test_no_deployment_create_unless_the_placeholder_actuator_is_on() -> None:
    off = kube_settings.KubeSettings(watch_namespaces=("inference",))
    on = off.model_copy(update={"placeholder": kube_settings.PlaceholderSettings(
        enabled=True, namespace="headroom")})

    def creates_deployments(settings: kube_settings.KubeSettings) -> set[str]:
        grants = rbac.plan(settings, name="scaler", namespace="scaler-system")
        return {where for where, group, resource, verb
                in rbac.grants(rbac.manifests(grants), grants.subject)
                if (group, resource, verb) == ("apps", "deployments", "create")}

    assert creates_deployments(off) == set()
    assert creates_deployments(on) == {"headroom"}


async def test_wiring_has_no_placeholder_actuator_unless_on(kube: KubeTestEnv,
                                                            wall_clock: ManualClock) -> None:
    for enabled in (False, True):
        settings = kube.settings.model_copy(update={
            "placeholder": kube_settings.PlaceholderSettings(enabled=enabled)})
        adapters = await wiring.connect(settings, identity="me", wall_clock=wall_clock)
        try:
            assert ("placeholder" in adapters.pools) is enabled
        finally:
            await adapters.close()


def test_target_namespaces_follow_the_settings_then_the_policies() -> None:
    default = kube_settings.KubeSettings()
    assert rbac.plan(default, name="s", namespace="ops", policy_namespaces=[
        "b", "a", "b"]).target_namespaces == ("a", "b")
    listed = kube_settings.KubeSettings(watch_namespaces=("x",))
    assert rbac.plan(listed, name="s", namespace="ops",
                     policy_namespaces=["a"]).target_namespaces == ("x",)
    with pytest.raises(ValueError, match="no namespace to grant"):
        rbac.plan(default, name="s", namespace="ops")
    with pytest.raises(ValueError, match="exclude each other"):
        kube_settings.KubeSettings(watch_namespaces=("x",), cluster_wide=True)


def test_a_bad_settings_file_names_the_file_and_field(tmp_path: Path) -> None:
    path = tmp_path / "settings.yaml"
    path.write_text("kube:\n  watch_namespace: [a]\n")
    with pytest.raises(ValueError, match=rf"{path}.*kube\.watch_namespace.*unknown setting"):
        rbac.kube_settings_file(path)
    path.write_text("kube:\n  watch_namespaces: [a]\n  placeholder: {enabled: true}\n")
    loaded = rbac.kube_settings_file(path)
    assert (loaded.watch_namespaces, loaded.placeholder.enabled) == (("a",), True)
