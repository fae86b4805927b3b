"""events.k8s.io/v1: served, listed in discovery, one storage with core/v1 Events."""

from __future__ import annotations

from tests.emulator.conftest import NS, Http

V1 = f"/apis/events.k8s.io/v1/namespaces/{NS}/events"
CORE = f"/api/v1/namespaces/{NS}/events"


async def test_discovery_lists_events_k8s_io(http: Http) -> None:
    groups = await http.ok("GET", "/apis")
    assert {"name": "events.k8s.io", "versions": [{"groupVersion": "events.k8s.io/v1",
                                                   "version": "v1"}],
            "preferredVersion": {"groupVersion": "events.k8s.io/v1", "version": "v1"}
            } in groups["groups"]
    resources = await http.ok("GET", "/apis/events.k8s.io/v1")
    assert [r["name"] for r in resources["resources"]] == ["events"]


async def test_core_events_are_listed_with_events_v1_fields(http: Http) -> None:
    await http.ok("POST", CORE, {
        "metadata": {"name": "web.1"}, "reason": "Scaled", "message": "1 -> 3",
        "involvedObject": {"kind": "Deployment", "namespace": NS, "name": "web"},
        "source": {"component": "scaler"}, "reportingComponent": "scaler", "type": "Normal"})
    listing = await http.ok("GET", V1)
    assert listing["kind"] == "EventList" and listing["apiVersion"] == "events.k8s.io/v1"
    [item] = listing["items"]
    assert (item["note"], item["regarding"]["name"], item["reportingController"],
            item["deprecatedSource"]) == ("1 -> 3", "web", "scaler", {"component": "scaler"})
    assert "message" not in item and "involvedObject" not in item
    one = await http.ok("GET", f"{V1}/web.1")
    assert (one["apiVersion"], one["note"]) == ("events.k8s.io/v1", "1 -> 3")


def new_event(**meta: str) -> dict[str, object]:
    return {"metadata": meta, "eventTime": "2025-11-29T07:06:40.000000Z",
            "reportingController": "scaler.dev/scaler", "reportingInstance": "scaler-0",
            "action": "Scale", "reason": "Scaled", "note": "1 -> 3", "type": "Normal",
            "regarding": {"kind": "Deployment", "namespace": NS, "name": "web"}}


async def test_events_v1_create_applies_the_strict_rules(http: Http) -> None:
    dotted = await http.call("POST", V1, new_event(generateName="web."))
    assert dotted.status == 422
    assert [c["field"] for c in dotted.body["details"]["causes"]] == ["metadata.generateName"]
    assert dotted.body["details"]["group"] == "events.k8s.io"
    created = await http.ok("POST", V1, new_event(generateName="web-"))
    name = created["metadata"]["name"]
    core = await http.ok("GET", f"{CORE}/{name}")
    assert (core["message"], core["involvedObject"]["name"], core["reportingComponent"]) == (
        "1 -> 3", "web", "scaler.dev/scaler")
    missing = await http.call("POST", V1, {**new_event(name="bare"), "action": ""})
    assert [c["field"] for c in missing.body["details"]["causes"]] == ["action"]

