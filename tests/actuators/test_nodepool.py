"""Node pool actuators: placeholder Deployment sized from a NodePlan; Cluster API scale."""

from __future__ import annotations

import pytest

from scaler.actuators import base, client, nodepool
from scaler.actuators import settings as kube_settings
from scaler.emulator.env import KubeTestEnv
from scaler.engine import types
from scaler.policy import model

from .factories import OtherWriter, interleaved, write_status

pytestmark = pytest.mark.kube

POOL = model.NodePool(name="h100", gpus_per_node=8, node_selector={"pool": "h100"})


def plan(*, placeholders: int, nodes_wanted: int = 0) -> types.NodePlan:
    return types.NodePlan(pool="h100", resource_name="nvidia.com/gpu", gpus_per_node=8,
                          nodes_for_replicas=nodes_wanted - placeholders,
                          headroom_nodes=placeholders, nodes_wanted=nodes_wanted,
                          placeholder_pods=placeholders, placeholder_gpus=8,
                          reasons=(f"headroom {placeholders}",))


def settings_for(kube: KubeTestEnv) -> kube_settings.KubeSettings:
    return kube_settings.KubeSettings(
        placeholder=kube_settings.PlaceholderSettings(namespace=kube.namespace),
        clusterapi_namespace=kube.namespace)


async def test_placeholder_deployment_follows_the_plan(kube: KubeTestEnv) -> None:
    actuator = nodepool.PlaceholderActuator(kube.api, settings=settings_for(kube),
                                            leader=base.AlwaysLeader())
    path = f"{kube.collection('apps/v1', 'deployments')}/scaler-placeholder-h100"

    created = await actuator.apply(POOL, plan(placeholders=2))
    deployment = await kube.api.get(path)
    again = await actuator.apply(POOL, plan(placeholders=2))
    generation = (await kube.api.get(path))["metadata"]["generation"]
    grown = await actuator.apply(POOL, plan(placeholders=3))
    gone = await actuator.apply(POOL, plan(placeholders=0))

    assert [o.outcome for o in (created, again, grown, gone)] == [
        base.Outcome.APPLIED, base.Outcome.UNCHANGED, base.Outcome.APPLIED, base.Outcome.APPLIED]
    assert deployment["spec"]["replicas"] == 2
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    # Each placeholder holds a whole node's GPUs, so one node boots per placeholder pod.
    assert container["resources"]["requests"]["nvidia.com/gpu"] == "8"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert pod["priorityClassName"] == "scaler-placeholder"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in \
        pod["tolerations"]
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"] == [
        {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["h100"]}]}]
    assert (grown.previous, grown.desired) == (2, 3)
    assert (gone.previous, gone.desired) == (3, 0)
    final = await kube.api.get(path)
    assert final["spec"]["replicas"] == 0
    # Our writes move the spec's generation (status writes by the controller do not).
    assert final["metadata"]["generation"] > generation


def placeholder_path(kube: KubeTestEnv) -> str:
    return f"{kube.collection('apps/v1', 'deployments')}/scaler-placeholder-h100"


async def test_placeholder_resize_survives_a_status_write(kube: KubeTestEnv) -> None:
    """The deployment controller writes status between our read and our write: the
    resize applies anyway; another writer's spec.replicas change is a conflict."""
    path = placeholder_path(kube)
    live = nodepool.PlaceholderActuator(kube.api, settings=settings_for(kube),
                                        leader=base.AlwaysLeader())
    assert (await live.apply(POOL, plan(placeholders=1))).outcome is base.Outcome.APPLIED

    async def controller(read: client.Obj) -> None:
        await write_status(kube.api, path)

    async def other_writer(read: client.Obj) -> None:
        await kube.api.merge_patch(f"{path}/scale", {"spec": {"replicas": 5}})

    def racing(writer: OtherWriter) -> nodepool.PlaceholderActuator:
        return nodepool.PlaceholderActuator(
            interleaved(kube.api, after_read_of=path, other_writer=writer),
            settings=settings_for(kube), leader=base.AlwaysLeader())

    grown = await racing(controller).apply(POOL, plan(placeholders=2))
    fought = await racing(other_writer).apply(POOL, plan(placeholders=3))

    assert (grown.outcome, grown.previous) == (base.Outcome.APPLIED, 1)
    assert (fought.outcome, fought.previous) == (base.Outcome.CONFLICT, 5)
    assert (await kube.api.get(path))["spec"]["replicas"] == 5


async def test_placeholder_template_change_keeps_other_annotations(kube: KubeTestEnv) -> None:
    """A new template replaces the old one whole (a removed nodeSelector leaves no affinity
    behind) and sets only our hash annotation: others' annotations stay."""
    path = placeholder_path(kube)
    actuator = nodepool.PlaceholderActuator(kube.api, settings=settings_for(kube),
                                            leader=base.AlwaysLeader())
    assert (await actuator.apply(POOL, plan(placeholders=1))).outcome is base.Outcome.APPLIED
    await kube.api.merge_patch(path, {"metadata": {"annotations": {"team/owner": "gpu"}}})
    before = (await kube.api.get(path))["metadata"]["annotations"][nodepool.HASH_ANNOTATION]

    anywhere = model.NodePool(name="h100", gpus_per_node=8)
    changed = await actuator.apply(anywhere, plan(placeholders=1))

    deployment = await kube.api.get(path)
    assert changed.outcome is base.Outcome.APPLIED
    annotations = deployment["metadata"]["annotations"]
    assert annotations["team/owner"] == "gpu"
    assert annotations[nodepool.HASH_ANNOTATION] != before
    assert "affinity" not in deployment["spec"]["template"]["spec"]
    assert deployment["spec"]["replicas"] == 1


async def test_placeholder_dry_run_and_no_empty_create(kube: KubeTestEnv) -> None:
    settings = settings_for(kube).model_copy(update={"dry_run": True})
    dry = nodepool.PlaceholderActuator(kube.api, settings=settings, leader=base.AlwaysLeader())
    live = nodepool.PlaceholderActuator(kube.api, settings=settings_for(kube),
                                        leader=base.AlwaysLeader())

    assert (await dry.apply(POOL, plan(placeholders=2))).outcome is base.Outcome.DRY_RUN
    assert (await live.apply(POOL, plan(placeholders=0))).outcome is base.Outcome.UNCHANGED
    listing = await kube.api.get(kube.collection("apps/v1", "deployments"))
    assert listing["items"] == []


@pytest.mark.parametrize(
    ("wanted", "current", "scale_down", "expected"),
    [
        (7, 3, False, 5),  # capped by the MachineDeployment's max-size annotation
        (4, 3, False, 4),
        (1, 3, False, 3),  # scale-down left to the node autoscaler
        (1, 3, True, 2),  # allowed, but not below min-size 2
        (3, 3, False, 3),
    ],
)
def test_machine_count(wanted: int, current: int, scale_down: bool, expected: int) -> None:
    pool = model.NodePool(name="p", actuator="clusterapi", machine_deployment="md",
                          scale_down=scale_down, max_nodes=6)
    annotations = {nodepool.CAPI_MIN: "2", nodepool.CAPI_MAX: "5"}
    desired, _ = nodepool.machine_count(wanted=wanted, current=current, pool=pool,
                                        annotations=annotations)
    assert desired == expected


@pytest.mark.emulator_only
async def test_clusterapi_patches_machinedeployment_scale(kube: KubeTestEnv) -> None:
    await kube.create("cluster.x-k8s.io/v1beta1", "machinedeployments", {
        "metadata": {"name": "gpu-md", "annotations": {nodepool.CAPI_MIN: "1",
                                                        nodepool.CAPI_MAX: "5"}},
        "spec": {"replicas": 2, "clusterName": "c"}})
    pool = model.NodePool(name="h100", actuator="clusterapi", machine_deployment="gpu-md")
    actuator = nodepool.ClusterApiActuator(kube.api, settings=settings_for(kube),
                                           leader=base.AlwaysLeader())

    grown = await actuator.apply(pool, plan(placeholders=0, nodes_wanted=9))
    same = await actuator.apply(pool, plan(placeholders=0, nodes_wanted=9))
    held = await actuator.apply(pool, plan(placeholders=0, nodes_wanted=1))

    assert (grown.outcome, grown.previous, grown.desired) == (base.Outcome.APPLIED, 2, 5)
    assert "max 5" in grown.reason
    assert same.outcome is base.Outcome.UNCHANGED
    assert (held.outcome, held.desired) == (base.Outcome.UNCHANGED, 5)
    md = await kube.api.get(
        f"{kube.collection('cluster.x-k8s.io/v1beta1', 'machinedeployments')}/gpu-md")
    assert md["spec"]["replicas"] == 5
    assert kube.emulator is not None
    assert kube.emulator.count(method="PATCH", path="/gpu-md/scale$") == 1


def test_pool_tolerations_replace_the_default() -> None:
    from scaler.actuators import nodepool
    from scaler.actuators import settings as kube_settings
    from scaler.engine import types
    from scaler.policy import model

    pool = model.NodePool.model_validate({
        "name": "a100-mig", "gpusPerNode": 56,
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "llm",
                         "effect": "NoSchedule"}]})
    plan = types.NodePlan(pool="a100-mig", resource_name="nvidia.com/mig-1g.10gb",
                          gpus_per_node=56, nodes_for_replicas=1, headroom_nodes=1,
                          nodes_wanted=2, placeholder_pods=1, placeholder_gpus=56)
    template = nodepool.placeholder_template(
        pool, plan, settings=kube_settings.PlaceholderSettings())
    assert template["spec"]["tolerations"] == [
        {"key": "dedicated", "operator": "Equal", "value": "llm", "effect": "NoSchedule"}]
    default = nodepool.placeholder_template(
        model.NodePool(name="p"), plan, settings=kube_settings.PlaceholderSettings())
    assert default["spec"]["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
