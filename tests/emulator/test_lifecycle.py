"""Server-side defaults, managedFields, no-op writes, and namespace deletion through
Terminating."""

from __future__ import annotations

from typing import Any

from scaler.emulator import KubeEmulator
from tests.emulator.conftest import DEPLOYMENTS, NS, Http, deployment, eventually

MERGE = "application/merge-patch+json"


async def test_deployment_defaults_on_create(http: Http) -> None:
    created = await http.ok("POST", DEPLOYMENTS, deployment("web"))
    spec = created["spec"]
    assert spec["strategy"] == {"type": "RollingUpdate",
                                "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": "25%"}}
    assert (spec["progressDeadlineSeconds"], spec["revisionHistoryLimit"]) == (600, 10)
    pod = spec["template"]["spec"]
    assert (pod["terminationGracePeriodSeconds"], pod["restartPolicy"], pod["dnsPolicy"]) == (
        30, "Always", "ClusterFirst")
    assert pod["containers"][0]["imagePullPolicy"] == "IfNotPresent"
    assert created["status"] == {}


async def test_managed_fields_record_each_writer(http: Http) -> None:
    created = await http.ok("POST", DEPLOYMENTS, deployment("web"),
                            query={"fieldManager": "deployer"})
    [entry] = created["metadata"]["managedFields"]
    assert {k: entry[k] for k in ("manager", "operation", "apiVersion", "fieldsType")} == {
        "manager": "deployer", "operation": "Update", "apiVersion": "apps/v1",
        "fieldsType": "FieldsV1"}
    assert entry["time"] == created["metadata"]["creationTimestamp"]
    assert "f:replicas" in entry["fieldsV1"]["f:spec"]

    async def controlled() -> Any:
        obj = await http.ok("GET", f"{DEPLOYMENTS}/web")
        return obj if obj["status"].get("observedGeneration") == 1 else None

    await eventually(controlled)
    # The scale comes from the User-Agent's product name; it takes spec.replicas over.
    scaled = await http.ok("PATCH", f"{DEPLOYMENTS}/web/scale", {"spec": {"replicas": 3}},
                           content_type=MERGE)
    obj = await http.ok("GET", f"{DEPLOYMENTS}/web")
    assert int(obj["metadata"]["resourceVersion"]) >= int(scaled["metadata"]["resourceVersion"])
    owned = {(m["manager"], m.get("subresource")): m["fieldsV1"]
             for m in obj["metadata"]["managedFields"]}
    assert set(owned) == {("deployer", None), ("kube-controller-manager", None),
                          ("kube-controller-manager", "status"), ("fidelity-test", "scale")}
    assert owned[("kube-controller-manager", None)] == {"f:metadata": {"f:annotations": {
        "f:deployment.kubernetes.io/revision": {}}}}
    assert owned[("fidelity-test", "scale")] == {"f:spec": {"f:replicas": {}}}
    assert "f:observedGeneration" in owned[("kube-controller-manager", "status")]["f:status"]
    # Same time on the fake clock: ordered by manager name, as the API server sorts them.
    assert [m for m, _ in owned][:2] == ["deployer", "fidelity-test"]
    assert "f:replicas" not in owned[("deployer", None)]["f:spec"]


async def test_a_write_that_changes_nothing_keeps_the_resource_version(http: Http) -> None:
    await http.ok("POST", f"/api/v1/namespaces/{NS}/configmaps",
                  {"metadata": {"name": "c"}, "data": {"a": "1"}})
    before = await http.ok("GET", f"/api/v1/namespaces/{NS}/configmaps/c")
    same = await http.ok("PATCH", f"/api/v1/namespaces/{NS}/configmaps/c",
                         {"data": {"a": "1"}}, content_type=MERGE)
    assert same["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]


async def test_namespace_delete_goes_through_terminating(emulator: KubeEmulator,
                                                         http: Http) -> None:
    created = await http.ok("POST", "/api/v1/namespaces", {"metadata": {"name": "doomed"}})
    assert (created["status"], created["spec"]) == ({"phase": "Active"},
                                                    {"finalizers": ["kubernetes"]})
    await http.ok("POST", "/api/v1/namespaces/doomed/configmaps", {"metadata": {"name": "c"}})
    events = emulator.store.subscribe(emulator.resource("", "namespaces"), lambda o: True)
    going = await http.ok("DELETE", "/api/v1/namespaces/doomed")
    assert going["status"]["phase"] == "Terminating"
    assert going["metadata"]["deletionTimestamp"]
    refused = await http.call("POST", "/api/v1/namespaces/doomed/configmaps",
                              {"metadata": {"name": "d"}})
    assert (refused.status, refused.body["reason"]) == (403, "Forbidden")
    assert refused.body["message"] == ('configmaps "d" is forbidden: unable to create new '
                                       "content in namespace doomed because it is being "
                                       "terminated")

    async def gone() -> bool:
        missing = await http.call("GET", "/api/v1/namespaces/doomed")
        return missing.status == 404

    await eventually(gone)
    seen = []
    while not events.queue.empty():
        event = events.queue.get_nowait()
        assert event is not None
        seen.append((event.type, event.obj["status"]["phase"]))
    assert seen == [("MODIFIED", "Terminating"), ("DELETED", "Terminating")]
    leftover = await http.call("GET", "/api/v1/namespaces/doomed/configmaps/c")
    assert leftover.status == 404


async def test_a_namespace_status_is_its_own_subresource(http: Http) -> None:
    patched = await http.ok("PATCH", f"/api/v1/namespaces/{NS}/status",
                            {"status": {"phase": "Active"}}, content_type=MERGE)
    assert (patched["kind"], patched["metadata"]["name"]) == ("Namespace", NS)


async def test_a_custom_resource_create_drops_the_status_it_carries(http: Http) -> None:
    # apiextensions-apiserver's customresource strategy: with a status subresource,
    # PrepareForCreate deletes .status; only a /status write sets it.
    path = f"/apis/cluster.x-k8s.io/v1beta1/namespaces/{NS}/machinedeployments"
    body = {"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "MachineDeployment",
            "metadata": {"name": "pool"}, "spec": {"replicas": 1},
            "status": {"replicas": 7}}
    created = await http.ok("POST", path, body)
    assert "status" not in created
    stored = await http.ok("GET", f"{path}/pool")
    assert "status" not in stored
