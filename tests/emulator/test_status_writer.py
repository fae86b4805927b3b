"""The deployment controller's status writes: after every spec change, asynchronously,
moving resourceVersion but not generation; and the Scale as a real server serializes it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from scaler.emulator import ControllerSettings, EmulatorController, EmulatorOptions, KubeEmulator
from tests.emulator.conftest import DEPLOYMENTS, Http, deployment, eventually


async def observed(http: Http, name: str) -> Any:
    """The Deployment once the controller has observed its current generation."""
    obj = await http.ok("GET", f"{DEPLOYMENTS}/{name}")
    done = obj["status"].get("observedGeneration") == obj["metadata"]["generation"]
    return obj if done else None


async def test_create_is_answered_by_a_status_write(http: Http) -> None:
    created = await http.ok("POST", DEPLOYMENTS, deployment("web", replicas=3))
    assert created["status"] == {}  # the create itself stores no status
    written = await eventually(lambda: observed(http, "web"))
    assert int(written["metadata"]["resourceVersion"]) > int(
        created["metadata"]["resourceVersion"])
    assert written["metadata"]["generation"] == 1  # status writes leave generation alone
    status = written["status"]
    # No pod controller runs: every replica counts as ready at once.
    assert {k: status.get(k) for k in ("replicas", "updatedReplicas", "readyReplicas",
                                       "availableReplicas")} == dict.fromkeys(
        ("replicas", "updatedReplicas", "readyReplicas", "availableReplicas"), 3)
    assert [(c["type"], c["status"], c["reason"]) for c in status["conditions"]] == [
        ("Available", "True", "MinimumReplicasAvailable"),
        ("Progressing", "True", "NewReplicaSetAvailable")]


async def test_a_write_with_the_resource_version_read_before_the_status_write_is_409(
        http: Http) -> None:
    created = await http.ok("POST", DEPLOYMENTS, deployment("web"))
    await eventually(lambda: observed(http, "web"))
    stale = await http.call("PATCH", f"{DEPLOYMENTS}/web/scale", {
        "metadata": {"resourceVersion": created["metadata"]["resourceVersion"]},
        "spec": {"replicas": 2}}, content_type="application/merge-patch+json")
    assert stale.status == 409
    assert stale.body == {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": 'Operation cannot be fulfilled on deployments.apps "web": the object has '
                   "been modified; please apply your changes to the latest version and try "
                   "again",
        "reason": "Conflict", "details": {"name": "web", "group": "apps", "kind": "deployments"},
        "code": 409}


async def test_scale_changes_bump_generation_and_the_controller_follows(http: Http) -> None:
    await http.ok("POST", DEPLOYMENTS, deployment("web", replicas=2))
    await eventually(lambda: observed(http, "web"))
    scale = await http.ok("PATCH", f"{DEPLOYMENTS}/web/scale", {"spec": {"replicas": 5}},
                          content_type="application/merge-patch+json")
    assert scale["spec"] == {"replicas": 5}
    written = await eventually(lambda: observed(http, "web"))
    assert (written["metadata"]["generation"], written["status"]["replicas"]) == (2, 5)
    scale = await http.ok("GET", f"{DEPLOYMENTS}/web/scale")
    assert scale["status"] == {"replicas": 5, "selector": "app=web"}
    assert scale["metadata"]["resourceVersion"] == written["metadata"]["resourceVersion"]


async def test_a_scale_of_zero_omits_spec_replicas(http: Http) -> None:
    await http.ok("POST", DEPLOYMENTS, deployment("web", replicas=0))
    await eventually(lambda: observed(http, "web"))
    scale = await http.ok("GET", f"{DEPLOYMENTS}/web/scale")
    # ScaleSpec.replicas is omitempty; ScaleStatus.replicas is not.
    assert (scale["spec"], scale["status"]) == ({}, {"replicas": 0, "selector": "app=web"})
    status = (await http.ok("GET", f"{DEPLOYMENTS}/web"))["status"]
    assert "replicas" not in status and status["observedGeneration"] == 1


@pytest.mark.parametrize("options", [EmulatorOptions(status_writer=True, status_delay_s=0.3)])
async def test_the_status_write_comes_after_the_request_not_inside_it(http: Http) -> None:
    await http.ok("POST", DEPLOYMENTS, deployment("web"))
    scaled = await http.ok("PATCH", f"{DEPLOYMENTS}/web/scale", {"spec": {"replicas": 4}},
                           content_type="application/merge-patch+json")
    right_after = await http.ok("GET", f"{DEPLOYMENTS}/web")
    assert right_after["metadata"]["resourceVersion"] == scaled["metadata"]["resourceVersion"]
    assert right_after["status"].get("observedGeneration") != 2
    await eventually(lambda: observed(http, "web"))


async def test_with_a_pod_controller_ready_replicas_follow_the_pods(
        emulator: KubeEmulator, http: Http) -> None:
    pods = EmulatorController(emulator, ControllerSettings())
    await http.ok("POST", DEPLOYMENTS, deployment("web", replicas=2))
    first = await eventually(lambda: observed(http, "web"))
    assert "readyReplicas" not in first["status"]  # no pod exists yet
    assert first["status"]["conditions"][0]["status"] == "False"
    for _ in range(4):  # create, schedule, start, ready
        pods.reconcile()
        await asyncio.sleep(0)
    status = (await http.ok("GET", f"{DEPLOYMENTS}/web"))["status"]
    assert (status["readyReplicas"], status["availableReplicas"]) == (2, 2)
    assert status["conditions"][0] == {**status["conditions"][0], "type": "Available",
                                       "status": "True"}


async def test_without_the_option_nobody_writes_status(wall_clock: Any) -> None:
    async with KubeEmulator(clock=wall_clock) as emu:
        rtype = emu.resource("apps", "deployments")
        emu.store.create(rtype, "default", deployment("web"))
        await asyncio.sleep(0.05)
        assert emu.store.get(rtype, "default", "web")["status"] == {}


async def test_the_controller_annotates_the_revision_before_writing_status(http: Http) -> None:
    created = await http.ok("POST", DEPLOYMENTS, deployment("web"))
    first = await eventually(lambda: observed(http, "web"))
    assert first["metadata"]["annotations"] == {"deployment.kubernetes.io/revision": "1"}
    # Two controller writes: the annotation (main resource), then status.
    assert int(first["metadata"]["resourceVersion"]) == int(
        created["metadata"]["resourceVersion"]) + 2
    await http.ok("PATCH", f"{DEPLOYMENTS}/web", {"spec": {"template": {"metadata": {
        "labels": {"app": "web", "track": "canary"}}}}},
        content_type="application/merge-patch+json")
    second = await eventually(lambda: observed(http, "web"))
    assert second["metadata"]["annotations"]["deployment.kubernetes.io/revision"] == "2"
    await http.ok("PATCH", f"{DEPLOYMENTS}/web/scale", {"spec": {"replicas": 2}},
                  content_type="application/merge-patch+json")
    third = await eventually(lambda: observed(http, "web"))
    assert third["metadata"]["annotations"]["deployment.kubernetes.io/revision"] == "2"
