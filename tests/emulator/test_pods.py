"""Pods as the real API server serves them to the deletion-cost writer: listed by label
selector, annotations merge-patched (resourceVersion moves, a no-op does not), a 404
Status for a pod that is gone, 422 for a pod-deletion-cost that is no int32; and the
ReplicaSet's order of removal on scale-down, lowest cost first among equally ready pods.

Sources (kubernetes/kubernetes, read with the search tool): pod validation
`ValidatePodSpecificAnnotations` (pkg/apis/core/validation) refuses a deletion cost that
`helper.GetDeletionCostFromPodAnnotations` cannot read ("must be a 32bit integer": plain
decimal int32, no "+", no leading zeros); `ActivePodsWithRanks.Less`
(pkg/controller/controller_utils.go) orders removals: unscheduled, Pending < Unknown <
Running, not ready, lower deletion cost, ..., the newest.
"""

from __future__ import annotations

import pytest

from scaler.emulator import ControllerSettings, EmulatorController, KubeEmulator
from scaler.emulator import controller as controller_module
from scaler.emulator.env import ManualClock
from tests.emulator.conftest import DEPLOYMENTS, NS, Http, deployment

MERGE = "application/merge-patch+json"
PODS = f"/api/v1/namespaces/{NS}/pods"
COST = "controller.kubernetes.io/pod-deletion-cost"


def pod(name: str, **labels: str) -> dict[str, object]:
    return {"metadata": {"name": name, "labels": labels},
            "spec": {"containers": [{"name": "c", "image": "i:1"}]}}


async def names(http: Http, selector: str) -> list[str]:
    listing = await http.ok("GET", PODS, query={"labelSelector": selector})
    return sorted(p["metadata"]["name"] for p in listing["items"])


async def test_pods_are_listed_by_label_selector(http: Http) -> None:
    await http.ok("POST", PODS, pod("a", app="llama", tier="online"))
    await http.ok("POST", PODS, pod("b", app="llama", tier="batch"))
    await http.ok("POST", PODS, pod("c", app="other"))
    assert await names(http, "app=llama") == ["a", "b"]
    assert await names(http, "app=llama,tier in (batch,dev)") == ["b"]
    assert await names(http, "app!=llama") == ["c"]
    bad = await http.call("GET", PODS, query={"labelSelector": "app in (x"})
    assert (bad.status, bad.body["reason"]) == (400, "BadRequest")


async def test_a_merge_patch_of_annotations_moves_the_resource_version(http: Http) -> None:
    created = await http.ok("POST", PODS, pod("a", app="llama"))
    patched = await http.ok("PATCH", f"{PODS}/a", {"metadata": {"annotations": {COST: "12"}}},
                            content_type=MERGE)
    assert patched["metadata"]["annotations"] == {COST: "12"}
    assert int(patched["metadata"]["resourceVersion"]) > int(
        created["metadata"]["resourceVersion"])
    assert patched["metadata"]["labels"] == {"app": "llama"}  # merge: the rest stays
    # The same value again changes nothing: no write, the same resourceVersion.
    again = await http.ok("PATCH", f"{PODS}/a", {"metadata": {"annotations": {COST: "12"}}},
                          content_type=MERGE)
    assert again["metadata"]["resourceVersion"] == patched["metadata"]["resourceVersion"]
    removed = await http.ok("PATCH", f"{PODS}/a", {"metadata": {"annotations": {COST: None}}},
                            content_type=MERGE)
    assert COST not in (removed["metadata"].get("annotations") or {})


async def test_patching_a_pod_that_is_gone_is_a_404_status(http: Http) -> None:
    gone = await http.call("PATCH", f"{PODS}/gone", {"metadata": {"annotations": {COST: "1"}}},
                           content_type=MERGE)
    assert (gone.status, gone.body) == (404, {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": 'pods "gone" not found', "reason": "NotFound",
        "details": {"name": "gone", "kind": "pods"}, "code": 404})


@pytest.mark.parametrize("value", ["0", "42", "-7", "2147483647", "-2147483648"])
async def test_an_int32_deletion_cost_is_accepted(http: Http, value: str) -> None:
    await http.ok("POST", PODS, pod("a"))
    await http.ok("PATCH", f"{PODS}/a", {"metadata": {"annotations": {COST: value}}},
                  content_type=MERGE)


@pytest.mark.parametrize("value", ["+10", "008", "1e3", "2147483648", "", "abc", "1.5"])
async def test_a_deletion_cost_that_is_no_int32_is_refused(http: Http, value: str) -> None:
    await http.ok("POST", PODS, pod("a"))
    refused = await http.call("PATCH", f"{PODS}/a",
                              {"metadata": {"annotations": {COST: value}}},
                              content_type=MERGE)
    field = f"metadata.annotations[{COST}]"
    assert (refused.status, refused.body["reason"]) == (422, "Invalid")
    assert refused.body["message"] == (
        f'Pod "a" is invalid: {field}: Invalid value: "{value}": must be a 32bit integer')
    assert refused.body["details"]["causes"] == [{
        "reason": "FieldValueInvalid", "field": field,
        "message": f'Invalid value: "{value}": must be a 32bit integer'}]
    created = await http.call("POST", PODS, {"metadata": {
        "name": "b", "annotations": {COST: value}}, "spec": {"containers": []}})
    assert created.status == 422


async def test_scale_down_removes_the_lowest_cost_among_ready_pods(
        emulator: KubeEmulator, http: Http, wall_clock: ManualClock) -> None:
    controller = EmulatorController(emulator, ControllerSettings())

    async def annotate(name: str, cost: str) -> None:
        await http.ok("PATCH", f"{PODS}/{name}", {"metadata": {"annotations": {COST: cost}}},
                      content_type=MERGE)

    async def scale(replicas: int) -> None:
        await http.ok("PATCH", f"{DEPLOYMENTS}/web/scale", {"spec": {"replicas": replicas}},
                      content_type=MERGE)
        controller.reconcile()

    await http.ok("POST", DEPLOYMENTS, deployment("web", replicas=4))
    for _ in range(4):  # create, schedule, start, ready
        controller.reconcile()
        wall_clock.advance(1)
    # The highest costs on the pods the ReplicaSet would remove first without them.
    by_rank = sorted(emulator.store.list(emulator.resource("", "pods"), NS),
                     key=controller_module.deletion_rank)
    costs = dict(zip([p["metadata"]["name"] for p in by_rank], ["30", "7", "0", "-1"],
                     strict=True))
    for name, cost in costs.items():
        await annotate(name, cost)
    kept = sorted(name for name, cost in costs.items() if cost in ("7", "30"))
    await scale(2)
    assert await names(http, "app=web") == kept
    # A pod that is not ready goes before any ready one, whatever its cost.
    await scale(3)  # the new pod exists, Pending
    (fresh,) = set(await names(http, "app=web")) - set(costs)
    await annotate(fresh, "100")
    await scale(2)
    assert await names(http, "app=web") == kept
