"""What the API server refuses before storing: missing namespaces, Deployments without a
(matching) selector, Events about another namespace, invalid Leases."""

from __future__ import annotations

from typing import Any

import pytest

from tests.emulator.conftest import DEPLOYMENTS, NS, Http, deployment

LEASES = f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases"
EVENTS = f"/api/v1/namespaces/{NS}/events"
NOW_MICRO = "2025-11-29T07:06:40.000000Z"


async def test_creating_in_a_missing_namespace_is_404(http: Http) -> None:
    missing = await http.call("POST", "/apis/apps/v1/namespaces/nowhere/deployments",
                              deployment("web"))
    assert missing.status == 404
    assert (missing.body["message"], missing.body["details"]) == (
        'namespaces "nowhere" not found', {"name": "nowhere", "kind": "namespaces"})


async def test_a_deployment_needs_a_selector_that_matches_its_template(http: Http) -> None:
    body = deployment("web")
    del body["spec"]["selector"]
    missing = await http.call("POST", DEPLOYMENTS, body)
    assert missing.status == 422
    # No selector matches nothing, so the template labels fail too, as on a real server.
    assert [(c["field"], c["reason"]) for c in missing.body["details"]["causes"]] == [
        ("spec.selector", "FieldValueRequired"),
        ("spec.template.metadata.labels", "FieldValueInvalid")]
    assert missing.body["message"] == (
        'Deployment.apps "web" is invalid: [spec.selector: Required value, '
        'spec.template.metadata.labels: Invalid value: map[string]string{"app":"web"}: '
        "`selector` does not match template `labels`]")
    other = deployment("web")
    other["spec"]["selector"] = {"matchLabels": {"app": "db"}}
    mismatch = await http.call("POST", DEPLOYMENTS, other)
    assert mismatch.status == 422
    assert [c["field"] for c in mismatch.body["details"]["causes"]] == [
        "spec.template.metadata.labels"]


def event(namespace: str, *, generate_name: str = "web.") -> dict[str, Any]:
    return {"metadata": {"generateName": generate_name},
            "involvedObject": {"kind": "Deployment", "namespace": namespace, "name": "web"},
            "reason": "Scaled", "message": "1 -> 3", "type": "Normal",
            "source": {"component": "scaler"}, "count": 1}


async def test_a_core_event_must_be_about_its_own_namespace(http: Http) -> None:
    elsewhere = await http.call("POST", EVENTS, event("other"))
    assert elsewhere.status == 422
    assert elsewhere.body["message"].endswith(
        'is invalid: involvedObject.namespace: Invalid value: "other": does not match '
        "event.namespace")
    assert elsewhere.body["details"]["kind"] == "Event" and "group" not in elsewhere.body[
        "details"]
    # core/v1 keeps the legacy rules: a generateName ending in "." is fine there.
    posted = await http.ok("POST", EVENTS, event(NS))
    assert posted["metadata"]["name"].startswith("web.")


async def test_lease_put_without_resource_version_is_422(http: Http) -> None:
    created = await http.ok("POST", LEASES, {"metadata": {"name": "leader"},
                                             "spec": {"holderIdentity": "a"}})
    assert "generation" not in created["metadata"]  # Leases have none on a real server
    body = {"metadata": {"name": "leader"}, "spec": {"holderIdentity": "b"}}
    unconditional = await http.call("PUT", f"{LEASES}/leader", body)
    assert unconditional.status == 422
    assert unconditional.body["message"] == (
        'leases.coordination.k8s.io "leader" is invalid: metadata.resourceVersion: Invalid '
        "value: 0x0: must be specified for an update")
    assert unconditional.body["details"]["kind"] == "leases"
    body["metadata"]["resourceVersion"] = created["metadata"]["resourceVersion"]
    assert (await http.ok("PUT", f"{LEASES}/leader", body))["spec"]["holderIdentity"] == "b"


async def test_lease_micro_times_need_six_fractional_digits(http: Http) -> None:
    for stamp in ("2025-11-29T07:06:40Z", "2025-11-29T07:06:40.123Z"):
        seconds = await http.call("POST", LEASES, {"metadata": {"name": "l"},
                                                   "spec": {"renewTime": stamp}})
        assert (seconds.status, seconds.body["reason"]) == (400, "BadRequest"), stamp
        assert "2006-01-02T15:04:05.000000Z07:00" in seconds.body["message"]
    await http.ok("POST", LEASES, {"metadata": {"name": "l"},
                                   "spec": {"renewTime": NOW_MICRO, "acquireTime": NOW_MICRO}})
    patched = await http.call("PATCH", f"{LEASES}/l", {"spec": {"acquireTime": "2025-11-29"}},
                              content_type="application/merge-patch+json")
    assert patched.status == 400


async def test_lease_duration_must_be_positive(http: Http) -> None:
    zero = await http.call("POST", LEASES, {"metadata": {"name": "l"},
                                            "spec": {"leaseDurationSeconds": 0}})
    assert zero.status == 422
    assert zero.body["message"] == ('Lease.coordination.k8s.io "l" is invalid: '
                                    "spec.leaseDurationSeconds: Invalid value: 0: must be "
                                    "greater than 0")
    assert zero.body["details"]["causes"][0]["field"] == "spec.leaseDurationSeconds"


CONFIGMAPS = f"/api/v1/namespaces/{NS}/configmaps"


# A body over 1 MB is what this test sends on purpose (aiohttp warns of its size).
@pytest.mark.filterwarnings("ignore:Sending a large body:ResourceWarning")
async def test_a_configmap_needs_config_keys_and_at_most_a_mebibyte(http: Http) -> None:
    bad_key = await http.call("POST", CONFIGMAPS, {
        "metadata": {"name": "keys"}, "data": {"inference/llama": "{}", "..x": "{}"}})
    assert bad_key.status == 422
    assert sorted(c["field"] for c in bad_key.body["details"]["causes"]) == [
        "data[..x]", "data[inference/llama]"]
    assert "a valid config key must consist of alphanumeric characters, '-', '_' or '.'" in (
        bad_key.body["message"])
    # The limit counts the values: 1 MiB of them in all, whatever the keys.
    half = "x" * (512 * 1024)
    too_long = await http.call("POST", CONFIGMAPS, {
        "metadata": {"name": "big"}, "data": {"a": half, "b": half, "c": "x"}})
    assert too_long.status == 422
    assert too_long.body["message"] == (
        'ConfigMap "big" is invalid: []: Too long: may not be more than 1048576 bytes')
    assert too_long.body["details"]["causes"] == [{
        "reason": "FieldValueTooLong", "message": "Too long: may not be more than 1048576 bytes",
        "field": "[]"}]
    stored = await http.ok("POST", CONFIGMAPS, {
        "metadata": {"name": "big"}, "data": {"a": half, "b": half, "inference.llama": ""}})
    assert stored["metadata"]["name"] == "big"
    # Past kube-apiserver's request body limit (3 MiB) nothing is decoded: 413, a Status.
    huge = await http.call("POST", CONFIGMAPS, {
        "metadata": {"name": "huge"}, "data": {"a": "x" * (3 * 1024 * 1024)}})
    assert huge.status == 413
    assert (huge.body["reason"], huge.body["message"]) == (
        "RequestEntityTooLarge", "Request entity too large: limit is 3145728")
