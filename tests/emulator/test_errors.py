"""Error answers worded as the kube-apiserver words them: Status bodies with details and
causes, the Go mux's plain-text 404, and 415 for a body it cannot read."""

from __future__ import annotations

from scaler.emulator import KubeEmulator
from tests.emulator.conftest import DEPLOYMENTS, NS, Http, deployment

MERGE = "application/merge-patch+json"


def status(message: str, reason: str, code: int, details: object = None) -> dict[str, object]:
    body: dict[str, object] = {"kind": "Status", "apiVersion": "v1", "metadata": {},
                               "status": "Failure", "message": message, "reason": reason}
    if details is not None:
        body["details"] = details
    return {**body, "code": code}


async def test_not_found_names_the_resource_and_the_scale_subresource(http: Http) -> None:
    missing = await http.call("GET", f"{DEPLOYMENTS}/x")
    assert (missing.status, missing.body) == (404, status(
        'deployments.apps "x" not found', "NotFound", 404,
        {"name": "x", "group": "apps", "kind": "deployments"}))
    scale = await http.call("GET", f"{DEPLOYMENTS}/x/scale")
    assert (scale.status, scale.body) == (404, status(
        'deployments/scale.apps "x" not found', "NotFound", 404,
        {"name": "x", "group": "apps", "kind": "deployments/scale"}))
    pod = await http.call("GET", f"/api/v1/namespaces/{NS}/pods/p")
    assert pod.body["message"] == 'pods "p" not found'
    assert pod.body["details"] == {"name": "p", "kind": "pods"}  # no group for core


async def test_already_exists_is_a_409_with_details(http: Http) -> None:
    await http.ok("POST", DEPLOYMENTS, deployment("web"))
    again = await http.call("POST", DEPLOYMENTS, deployment("web"))
    assert (again.status, again.body) == (409, status(
        'deployments.apps "web" already exists', "AlreadyExists", 409,
        {"name": "web", "group": "apps", "kind": "deployments"}))


async def test_invalid_replicas_carry_causes(http: Http) -> None:
    await http.ok("POST", DEPLOYMENTS, deployment("web"))
    negative = await http.call("PATCH", f"{DEPLOYMENTS}/web", {"spec": {"replicas": -1}},
                               content_type=MERGE)
    cause = {"reason": "FieldValueInvalid",
             "message": "Invalid value: -1: must be greater than or equal to 0",
             "field": "spec.replicas"}
    assert (negative.status, negative.body) == (422, status(
        'Deployment.apps "web" is invalid: spec.replicas: Invalid value: -1: must be greater '
        "than or equal to 0", "Invalid", 422,
        {"name": "web", "group": "apps", "kind": "Deployment", "causes": [cause]}))
    scale = await http.call("PATCH", f"{DEPLOYMENTS}/web/scale", {"spec": {"replicas": -1}},
                            content_type=MERGE)
    assert scale.status == 422
    assert scale.body["message"] == ('Scale.autoscaling "web" is invalid: spec.replicas: '
                                     "Invalid value: -1: must be greater than or equal to 0")
    assert scale.body["details"]["causes"] == [cause]


async def test_a_failed_json_patch_test_is_the_generic_422(http: Http) -> None:
    await http.ok("POST", DEPLOYMENTS, deployment("web", replicas=2))
    refused = await http.call("PATCH", f"{DEPLOYMENTS}/web/scale", [
        {"op": "test", "path": "/spec/replicas", "value": 3},
        {"op": "replace", "path": "/spec/replicas", "value": 4}],
        content_type="application/json-patch+json")
    assert (refused.status, refused.body) == (422, status(
        "the server rejected our request due to an error in our request", "Invalid", 422, {}))
    kept = await http.ok("GET", f"{DEPLOYMENTS}/web/scale")
    assert kept["spec"] == {"replicas": 2}


async def test_unknown_group_is_the_plain_text_404(http: Http) -> None:
    unknown = await http.call("GET", "/apis/nope.example.com/v1/namespaces/ns/things")
    assert (unknown.status, unknown.text) == (404, "404 page not found\n")
    assert unknown.content_type.startswith("text/plain")
    # A served group version without the resource is a Status 404 instead.
    resource = await http.call("GET", "/apis/apps/v1/namespaces/ns/things")
    assert (resource.status, resource.body) == (404, status(
        "the server could not find the requested resource", "NotFound", 404))


async def test_415_lists_the_accepted_media_types(emulator: KubeEmulator, http: Http) -> None:
    lws = f"/apis/leaderworkerset.x-k8s.io/v1/namespaces/{NS}/leaderworkersets"
    await http.ok("POST", lws, {"metadata": {"name": "lws"}, "spec": {"replicas": 1}})
    strategic = await http.call("PATCH", f"{lws}/lws", {"spec": {"replicas": 2}},
                                content_type="application/strategic-merge-patch+json")
    assert (strategic.status, strategic.body) == (415, status(
        "the body of the request was in an unknown format - accepted media types include: "
        "application/json-patch+json, application/merge-patch+json, "
        "application/apply-patch+yaml", "UnsupportedMediaType", 415))
    text = await http.call("POST", DEPLOYMENTS, "name: web", content_type="text/plain")
    assert (text.status, text.body["reason"]) == (415, "UnsupportedMediaType")
    assert text.body["message"].endswith("application/json, application/yaml, "
                                         "application/vnd.kubernetes.protobuf")
    builtin = await http.call("PATCH", f"{DEPLOYMENTS}/web", {}, content_type="text/plain")
    assert "application/strategic-merge-patch+json" in builtin.body["message"]


async def test_version_and_health_are_served(http: Http) -> None:
    assert (await http.ok("GET", "/version"))["major"] == "1"
    health = await http.call("GET", "/readyz")
    assert (health.status, health.text) == (200, "ok")
    assert (await http.ok("GET", "/api"))["versions"] == ["v1"]
