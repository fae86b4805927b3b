"""End to end with ScalePolicy resources: a real nats-server -> the service -> the API
emulator (status-writing controller on), the policy read from a custom resource and its
status conditions following the cluster (DESIGN 4.7)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import nats
import pytest

from scaler import emulator as kube_emulator
from scaler.actuators import rbac
from scaler.policy import crd
from scaler.service import runner, settings

# The end-to-end module's cluster (namespaces, the Deployment at 2 replicas, a controller
# writing status) and nats-server: the same world, plus the CRD.
from .test_end_to_end import MODEL, NAMESPACE, ConfigMapDir, eventually, replicas
from .test_end_to_end import emulator as emulator  # noqa: F401 (a fixture)
from .test_end_to_end import nats_url as nats_url  # noqa: F401 (a fixture)
from .test_end_to_end import service_settings as service_settings  # noqa: F401 (a fixture)

KEY = f"{NAMESPACE}/{MODEL}"
RESOURCE = crd.resource_path(NAMESPACE, MODEL)
POLICIES = f"/apis/{crd.API_VERSION}/namespaces/{NAMESPACE}/{crd.PLURAL}"
STATUS = f"{POLICIES}/{MODEL}/status"
MAX = 4


def resource(*, max_replicas: int = MAX, min_replicas: int = 1) -> dict[str, Any]:
    return {"apiVersion": crd.API_VERSION, "kind": "ScalePolicy",
            "metadata": {"name": MODEL, "namespace": NAMESPACE},
            "spec": {"target": {"name": MODEL},
                     "replicas": {"min": min_replicas, "max": max_replicas},
                     "signals": {"concurrency": {"targetPerReplica": 10}},
                     # 1 s: the test watches the signal go stale without waiting 30 s.
                     "staleAfterSeconds": 1,
                     "coldStart": {"imagePullSeconds": 1, "modelLoadSeconds": 1,
                                   "readinessSeconds": 1}}}


FILE_POLICY = f"""\
apiVersion: scaler.io/v1alpha1
kind: ScalePolicy
metadata: {{name: {MODEL}, namespace: {NAMESPACE}}}
spec:
  target: {{name: {MODEL}}}
  replicas: {{min: 1, max: 2}}
  signals:
    concurrency: {{targetPerReplica: 10}}
"""


@pytest.fixture
def policy_dir(tmp_path: Path, request: pytest.FixtureRequest) -> ConfigMapDir:
    """The policy files beside the resource: none, unless a test names some."""
    folder = ConfigMapDir(tmp_path / "policies")
    folder.publish(getattr(request, "param", {}))
    return folder


@pytest.fixture
async def service(service_settings: settings.Settings, emulator: kube_emulator.KubeEmulator,
                  ) -> AsyncIterator[runner.Service]:
    emulator.store.create(emulator.resource("apiextensions.k8s.io", "customresourcedefinitions"),
                          None, crd.definition())
    emulator.store.create(emulator.resource(crd.GROUP, crd.PLURAL), NAMESPACE, resource())
    # The default 10 s status rate limit: condition changes are written at once anyway.
    policies = service_settings.policies.model_copy(update={"resources": True})
    # The namespace RBAC grants in: the resources are watched there, not cluster-wide.
    kube = service_settings.kube.model_copy(update={"watch_namespaces": (NAMESPACE,)})
    started = runner.Service(service_settings.model_copy(update={"policies": policies,
                                                                 "kube": kube}))
    await started.start()
    try:
        await eventually(lambda: started.state.ready and bool(started.state.leader),
                         what="service ready and leading")
        await asyncio.wait_for(started.wait_sources_ready(), timeout=10)
        yield started
    finally:
        await started.stop()


def condition(emu: kube_emulator.KubeEmulator, kind: str) -> dict[str, Any]:
    found = emu.store.get(emu.resource(crd.GROUP, crd.PLURAL), NAMESPACE, MODEL)
    for item in (found.get("status") or {}).get("conditions") or []:
        if item["type"] == kind:
            return dict(item)
    return {}


def holds(emu: kube_emulator.KubeEmulator, kind: str, status: str, reason: str
          ) -> Callable[[], bool]:
    def check() -> bool:
        found = condition(emu, kind)
        return found.get("status") == status and found.get("reason") == reason
    return check


async def publish(nats_url: str, *, sources: int, in_flight: float) -> None:
    client = await nats.connect(nats_url)
    try:
        for index in range(sources):
            body = {"v": 1, "model": MODEL, "namespace": NAMESPACE, "source": f"pod-{index}",
                    "ts": time.time(), "in_flight": in_flight}
            await client.publish(f"scaler.signals.{NAMESPACE}.{MODEL}", json.dumps(body).encode())
        await client.flush()
    finally:
        await client.close()


async def test_a_resource_policy_scales_and_its_conditions_follow_the_cluster(
    service: runner.Service, emulator: kube_emulator.KubeEmulator, nats_url: str,
) -> None:
    assert service.state.policy(KEY) is not None
    await eventually(holds(emulator, "PolicyValid", "True", "ValidPolicy"),
                     what="first status written")
    valid_since = condition(emulator, "PolicyValid")["lastTransitionTime"]

    # 30 replicas x 5 in flight = 150 -> 15 replicas wanted, capped at max 4.
    await publish(nats_url, sources=30, in_flight=5.0)
    await eventually(lambda: replicas(emulator) == MAX, what=f"scaled to {MAX}")
    await eventually(holds(emulator, "ScalingLimited", "True", "TooManyReplicas"),
                     what="ScalingLimited True at max")
    assert condition(emulator, "SignalsFresh")["status"] == "True"
    assert condition(emulator, "ScalingActive")["reason"] == "ValidMetricFound"
    stored = emulator.store.get(emulator.resource(crd.GROUP, crd.PLURAL), NAMESPACE, MODEL)
    assert stored["status"]["desiredReplicas"] == MAX
    assert stored["status"]["winner"]["signal"] == "concurrency"
    assert stored["status"]["observedGeneration"] == 1
    assert "lastScaleTime" in stored["status"]

    # No more reports: after staleAfterSeconds (1 s) the signal is stale; replicas hold.
    await eventually(holds(emulator, "SignalsFresh", "False", "SignalsStale"),
                     what="SignalsFresh False once the signal is stale")
    assert replicas(emulator) == MAX
    assert "concurrency" in condition(emulator, "SignalsFresh")["message"]
    # PolicyValid did not change: its lastTransitionTime did not move.
    assert condition(emulator, "PolicyValid")["lastTransitionTime"] == valid_since
    # Only changes were written (10 s rate limit otherwise): a handful, not one a tick.
    writes = emulator.count(method="PATCH", path=STATUS)
    assert 2 <= writes <= 6, writes

    # `kubectl describe` lists the changes as Events on the resource (its uid matches).
    posted = [event for event in emulator.store.list(emulator.resource("", "events"),
                                                     NAMESPACE)
              if event["involvedObject"].get("kind") == "ScalePolicy"]
    assert {event["involvedObject"]["uid"] for event in posted} == {stored["metadata"]["uid"]}
    warnings = {event["reason"] for event in posted if event["type"] == "Warning"}
    assert {"TooManyReplicas", "SignalsStale"} <= warnings

    # Every ScalePolicy request was one `scaler kube rbac --policy-resources` grants, and
    # each of its ScalePolicy grants was used.
    grants = rbac.plan(service.settings.kube, name="scaler", namespace="scaler",
                       policy_resources=True)
    granted = {grant for grant in rbac.grants(rbac.manifests(grants), grants.subject)
               if grant[1] == crd.GROUP and grant[2].partition("/")[0] == crd.PLURAL}
    used = {attributes for record in emulator.requests if crd.PLURAL in record.path
            and (attributes := rbac.request_attributes(
                record.method, record.path, watch=record.verb == "watch")) is not None}
    assert used and all(rbac.allowed(granted, each) for each in used)
    assert all(any(rbac.authorizes(grant, each) for each in used) for grant in granted)


async def test_an_invalid_resource_keeps_the_last_good_version(
    service: runner.Service, emulator: kube_emulator.KubeEmulator, nats_url: str,
) -> None:
    rtype = emulator.resource(crd.GROUP, crd.PLURAL)
    current = emulator.store.get(rtype, NAMESPACE, MODEL)
    # min above max: the API server's CEL rule would refuse it; the service refuses it too.
    current["spec"] = resource(min_replicas=9)["spec"]
    emulator.store.update(rtype, NAMESPACE, MODEL, current)
    await eventually(holds(emulator, "PolicyValid", "False", "InvalidSpec"),
                     what="PolicyValid False")
    assert "min (9) is greater than max (4)" in condition(emulator, "PolicyValid")["message"]
    load = service.state.policy_load
    assert load is not None and load.kept == (KEY,)
    await publish(nats_url, sources=30, in_flight=5.0)
    await eventually(lambda: replicas(emulator) == MAX, what="scaled with the last good")


@pytest.mark.parametrize("policy_dir", [{"llama.yaml": FILE_POLICY}], indirect=True)
async def test_a_file_and_a_resource_with_one_name_collide(
    service: runner.Service, emulator: kube_emulator.KubeEmulator,
) -> None:
    # Files load first: the file's policy is in force, the resource is refused.
    in_force = service.watcher.current.policies[KEY]
    assert in_force.path.endswith("llama.yaml")
    load = service.state.policy_load
    assert load is not None
    errors = [error for error in load.errors if error.path == RESOURCE]
    assert len(errors) == 1 and errors[0].reason == "duplicate"
    assert "llama.yaml" in errors[0].message
    await eventually(holds(emulator, "PolicyValid", "False", "NameCollision"),
                     what="the collision on the resource's status")
    assert "llama.yaml" in condition(emulator, "PolicyValid")["message"]
    assert condition(emulator, "ScalingActive")["status"] == "Unknown"
