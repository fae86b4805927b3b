"""The ScalePolicy CRD: generated from the model, structural, committed as generated,
installed on the API emulator, and every shipped example round-trips through it."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import kubernetes_validate
import pytest
import yaml

from scaler import emulator as kube_emulator
from scaler.policy import crd, loader

ROOT = Path(__file__).resolve().parents[2]
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


def _schema() -> dict[str, Any]:
    version = crd.definition()["spec"]["versions"][0]
    return dict(version["schema"]["openAPIV3Schema"])


def test_the_committed_crd_is_the_generated_one() -> None:
    committed = (ROOT / crd.CHART_FILE).read_text(encoding="utf-8")
    assert committed == crd.render(), "run scripts/gen-crd and commit the result"


def test_the_schema_is_structural_and_carries_the_model_rules() -> None:
    schema = _schema()
    assert crd.structural_problems(schema) == []
    spec = schema["properties"]["spec"]
    assert spec["required"] == ["target", "replicas", "signals"]
    replicas = spec["properties"]["replicas"]
    assert replicas["properties"]["max"] == {**replicas["properties"]["max"], "type": "integer",
                                             "minimum": 1}
    assert replicas["x-kubernetes-validations"][0]["message"] == "min is greater than max"
    target_name = spec["properties"]["target"]["properties"]["name"]
    assert target_name["maxLength"] == 63 and target_name["pattern"].startswith("^[a-z0-9]")
    utilization = spec["properties"]["signals"]["properties"]["tokensPerSecond"][
        "properties"]["targetUtilization"]
    assert utilization["minimum"] == 0 and utilization["exclusiveMinimum"] is True
    assert utilization["maximum"] == 1
    metric = spec["properties"]["signals"]["properties"]["p95Latency"]["properties"]["metric"]
    assert set(metric["enum"]) == {"ttft", "e2e", "itl"}
    # Nothing is left open: unknown fields are pruned everywhere in the spec.
    assert "x-kubernetes-preserve-unknown-fields" not in yaml.safe_dump(schema)


def test_the_crd_serves_v1alpha1_with_status_and_printer_columns() -> None:
    version = crd.definition()["spec"]["versions"][0]
    assert (version["name"], version["served"], version["storage"]) == ("v1alpha1", True, True)
    assert version["subresources"] == {"status": {}}
    names = [column["name"] for column in version["additionalPrinterColumns"]]
    assert names == ["Target", "Min", "Max", "Current", "Desired", "Winner", "Age"]


def test_structural_problems_are_found() -> None:
    text = {"type": "string"}
    assert crd.structural_problems({"type": "object", "properties": {
        "a": {"anyOf": [text]},
        "b": {"type": "object", "properties": {}, "additionalProperties": text}}}) == [
        ".a: no type", ".a: anyOf is not allowed",
        ".b: properties and additionalProperties together"]


@pytest.fixture
async def api() -> AsyncIterator[tuple[kube_emulator.KubeEmulator, aiohttp.ClientSession]]:
    async with kube_emulator.KubeEmulator(clock=time.time) as emu, \
            aiohttp.ClientSession() as session:
        emu.ensure_namespace("inference")
        async with session.post(emu.url + CRDS, json=crd.definition()) as answer:
            assert answer.status == 201, await answer.text()
        yield emu, session


def _collection(namespace: str) -> str:
    return f"/apis/{crd.API_VERSION}/namespaces/{namespace}/{crd.PLURAL}"


async def test_every_shipped_example_round_trips_through_the_api(
        api: tuple[kube_emulator.KubeEmulator, aiohttp.ClientSession]) -> None:
    emu, session = api
    shipped = loader.load_paths([ROOT / "config"])
    assert shipped.ok and len(shipped.policies) >= 3
    for policy in shipped.policies:
        emu.ensure_namespace(policy.metadata.namespace)
        async with session.post(emu.url + _collection(policy.metadata.namespace),
                                json=crd.manifest(policy)) as answer:
            assert answer.status == 201, await answer.text()
        path = f"{_collection(policy.metadata.namespace)}/{policy.metadata.name}"
        async with session.get(emu.url + path) as answer:
            stored = await answer.json()
        assert stored["metadata"]["uid"] and stored["metadata"]["generation"] == 1
        parsed = crd.parse_resource(stored)
        assert parsed.ok, parsed.errors
        assert parsed.policies == [policy]
        assert parsed.loaded[0].path == crd.resource_path(policy.metadata.namespace,
                                                          policy.metadata.name)


async def test_the_server_refuses_what_the_schema_forbids_and_prunes_unknown_fields(
        api: tuple[kube_emulator.KubeEmulator, aiohttp.ClientSession]) -> None:
    emu, session = api
    body = {"apiVersion": crd.API_VERSION, "kind": "ScalePolicy",
            "metadata": {"name": "m"},
            "spec": {"target": {"name": "Not_A_Name"}, "replicas": {"max": 0},
                     "signals": {"concurrency": {"targetPerReplica": 4}}}}
    async with session.post(emu.url + _collection("inference"), json=body) as answer:
        assert answer.status == 422
        status = await answer.json()
    fields = {cause["field"] for cause in status["details"]["causes"]}
    assert fields == {"spec.target.name", "spec.replicas.max"}
    assert "should be greater than or equal to 1" in status["message"]
    body["spec"].update(target={"name": "m"}, replicas={"max": 2}, typo=1)
    async with session.post(emu.url + _collection("inference"), json=body) as answer:
        assert answer.status == 201
        assert "typo" not in (await answer.json())["spec"]


async def test_status_is_a_subresource(
        api: tuple[kube_emulator.KubeEmulator, aiohttp.ClientSession]) -> None:
    emu, session = api
    policy = loader.load_paths([ROOT / "config" / "llama-8b.yaml"]).policies[0]
    url = emu.url + f"{_collection('inference')}/{policy.metadata.name}"
    async with session.post(emu.url + _collection("inference"),
                            json=crd.manifest(policy)) as answer:
        assert answer.status == 201
    merge = {"Content-Type": "application/merge-patch+json"}
    # The main resource ignores status; /status changes only status.
    async with session.patch(url, json={"status": {"desiredReplicas": 3}},
                             headers=merge) as answer:
        assert "status" not in await answer.json()
    async with session.patch(url + "/status", json={"status": {"desiredReplicas": "x"}},
                             headers=merge) as answer:
        assert answer.status == 422
    async with session.patch(url + "/status", json={
            "status": {"desiredReplicas": 3}, "spec": {"replicas": {"max": 1}}},
            headers=merge) as answer:
        stored = await answer.json()
    assert stored["status"] == {"desiredReplicas": 3}
    assert stored["spec"]["replicas"]["max"] == policy.spec.replicas.max


@pytest.mark.parametrize("kube_version", ["1.30.0", "1.37.0"])
def test_the_crd_is_a_valid_apiextensions_object(kube_version: str) -> None:
    kubernetes_validate.validate(crd.definition(), kube_version, strict=True)
