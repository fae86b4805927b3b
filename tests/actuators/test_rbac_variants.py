"""The RBAC `scaler kube rbac --policies` prints grants every variant's target: the reads
and the mix's writes of a model on a Deployment and a LeaderWorkerSet are all allowed, and
a variant on a CRD kind gets its scale subresource granted."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from scaler import cli
from scaler.actuators import base, cluster_reader, events, rbac, replicas
from scaler.actuators import settings as kube_settings
from scaler.emulator.env import KubeTestEnv, ManualClock
from scaler.policy import model
from scaler.service import variants as service_variants

from .factories import make_decision

pytestmark = [pytest.mark.kube, pytest.mark.emulator_only]


def _policy(namespace: str, *, crd: bool = False) -> model.ScalePolicy:
    lws = ({"apiVersion": "example.com/v1", "kind": "Llama", "name": "chat-l40s"} if crd else
           {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
            "name": "chat-l40s"})
    return model.ScalePolicy.model_validate({
        "apiVersion": "scaler.io/v1alpha1", "kind": "ScalePolicy",
        "metadata": {"name": "chat", "namespace": namespace},
        "spec": {"target": {"name": "chat-h100"}, "replicas": {"min": 0, "max": 8},
                 "signals": {"concurrency": {"targetPerReplica": 10}},
                 "variants": [
                     {"name": "h100", "target": {"name": "chat-h100"}, "nodePool": "h100",
                      "capacity": 30},
                     {"name": "l40s", "target": lws, "nodePool": "l40s", "capacity": 10}]}})


async def test_reads_and_writes_of_every_variant_are_granted(
        kube: KubeTestEnv, wall_clock: ManualClock) -> None:
    assert kube.emulator is not None
    settings = kube_settings.KubeSettings(watch_namespaces=(kube.namespace,),
                                          lease=kube_settings.LeaseSettings(enabled=False))
    await kube.create_deployment("chat-h100", replicas=1)
    await kube.create("leaderworkerset.x-k8s.io/v1", "leaderworkersets", {
        "metadata": {"name": "chat-l40s"}, "spec": {"replicas": 0}})
    policy = _policy(kube.namespace)
    setup = len(kube.emulator.requests)
    recorder = events.EventRecorder(kube.api, settings=settings.events, wall_clock=wall_clock,
                                    instance="me")
    actuator = replicas.KubeReplicaActuator(kube.api, settings=settings, recorder=recorder,
                                            leader=base.AlwaysLeader())
    reader = cluster_reader.KubeClusterReader(kube.api, settings=settings, wall_clock=wall_clock)
    await reader.start()
    try:
        targets = service_variants.views(policy, pools={})
        reading = await service_variants.read(reader, policy, targets)
    finally:
        await reader.stop()
    assert [s.current for s in reading.states] == [1, 0]
    parts = [(view, make_decision(policy.key, current=state.current, desired=state.current + 1))
             for view, state in zip(targets, reading.states, strict=True)]
    outcomes = await actuator.apply_all(parts)
    assert [o.outcome for o in outcomes] == [base.Outcome.APPLIED] * 2

    grants = rbac.plan(settings, name="scaler", namespace="scaler-system",
                       extra_scale_targets=rbac.policy_scale_targets([policy]))
    granted = rbac.grants(rbac.manifests(grants), grants.subject)
    for record in kube.emulator.requests[setup:]:
        attributes = rbac.request_attributes(record.method, record.path,
                                             watch=record.verb == "watch")
        assert attributes is not None, record.path
        assert rbac.allowed(granted, attributes), f"not granted: {attributes} ({record.path})"


def test_a_variant_on_a_crd_kind_is_granted_from_the_policies(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    policy = _policy("inference", crd=True)
    assert rbac.policy_scale_targets([policy]) == (rbac.ScaleTarget("example.com", ("llamas",)),)
    assert rbac.policy_scale_targets([_policy("inference")]) == ()  # built-in rules cover it
    path = tmp_path / "chat.yaml"
    path.write_text(yaml.safe_dump(policy.model_dump(mode="json", by_alias=True,
                                                     exclude_none=True)))
    assert cli.main(["kube", "rbac", "--policies", str(path)]) == 0
    documents = list(yaml.safe_load_all(capsys.readouterr().out))
    subject = {"kind": "ServiceAccount", "name": "scaler", "namespace": "scaler-system"}
    granted = rbac.grants(documents, subject)
    patch = rbac.request_attributes(
        "PATCH", "/apis/example.com/v1/namespaces/inference/llamas/chat-l40s/scale")
    assert patch is not None and rbac.allowed(granted, patch)
