"""The ScalePolicy, GpuPool and GpuBudget CRDs: generated from the models, structural,
committed as generated, installed on the API emulator, and every shipped example
round-trips through them."""

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


@pytest.mark.parametrize("kind", crd.KINDS, ids=lambda kind: kind.kind)
def test_the_committed_crd_is_the_generated_one(kind: crd.Kind) -> None:
    committed = (ROOT / kind.chart_file).read_text(encoding="utf-8")
    assert committed == crd.render(kind), "run scripts/gen-crd and commit the result"
    assert {path.name for path in (ROOT / crd.CHART_DIR).glob("*.yaml")} == {
        each.chart_file.name for each in crd.KINDS}


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


@pytest.mark.parametrize("kind", crd.KINDS, ids=lambda kind: kind.kind)
@pytest.mark.parametrize("kube_version", ["1.30.0", "1.37.0"])
def test_the_crd_is_a_valid_apiextensions_object(kube_version: str, kind: crd.Kind) -> None:
    kubernetes_validate.validate(crd.definition(kind), kube_version, strict=True)


# -- GpuPool and GpuBudget: cluster-scoped ---------------------------------------------------


def test_pools_and_budgets_are_cluster_scoped_with_a_valid_condition() -> None:
    for kind in crd.FLEET_KINDS:
        definition = crd.definition(kind)
        assert definition["spec"]["scope"] == "Cluster"
        (version,) = definition["spec"]["versions"]
        schema = version["schema"]["openAPIV3Schema"]
        assert crd.structural_problems(schema) == []
        assert "x-kubernetes-preserve-unknown-fields" not in yaml.safe_dump(schema)
        condition = schema["properties"]["status"]["properties"]["conditions"]["items"]
        assert condition["properties"]["type"]["enum"] == [crd.VALID]
        assert version["additionalPrinterColumns"][-2]["name"] == "Valid"
    pool = crd.spec_schema(crd.GPU_POOL)
    assert pool["required"] == ["gpusPerNode", "maxNodes"]
    reservation = pool["properties"]["reservations"]["items"]["properties"]
    assert reservation["gpus"]["minimum"] == 1 and reservation["name"]["maxLength"] == 63
    budget = crd.spec_schema(crd.GPU_BUDGET)
    assert budget["properties"]["tenant"]["nullable"] is True
    assert [rule["message"] for rule in budget["x-kubernetes-validations"]] == [
        "set exactly one of tenant and costCenter: the policies the budget covers",
        "guaranteedGpus is above maxGpus"]
    assert crd.GPU_POOL.collection("ignored") == "/apis/scaler.io/v1alpha1/gpupools"
    assert crd.GPU_BUDGET.resource_path(None, "search") == "gpubudgets/search"


@pytest.fixture
async def fleet_api() -> AsyncIterator[tuple[kube_emulator.KubeEmulator, aiohttp.ClientSession]]:
    async with kube_emulator.KubeEmulator(clock=time.time) as emu, \
            aiohttp.ClientSession() as session:
        for kind in crd.FLEET_KINDS:
            async with session.post(emu.url + CRDS, json=crd.definition(kind)) as answer:
                assert answer.status == 201, await answer.text()
        yield emu, session


async def test_every_shipped_pool_and_budget_round_trips_through_the_api(
        fleet_api: tuple[kube_emulator.KubeEmulator, aiohttp.ClientSession]) -> None:
    emu, session = fleet_api
    shipped = loader.load_paths([ROOT / "config"])
    assert shipped.ok and shipped.pools and shipped.budgets
    for kind, items in ((crd.GPU_POOL, shipped.pools), (crd.GPU_BUDGET, shipped.budgets)):
        for item in items:
            async with session.post(emu.url + kind.collection(),
                                    json=crd.manifest(item.value)) as answer:
                assert answer.status == 201, await answer.text()
        async with session.get(emu.url + kind.collection()) as answer:
            listed = await answer.json()
        assert listed["kind"] == f"{kind.kind}List"
        parsed = loader.LoadResult()
        for obj in listed["items"]:
            assert "namespace" not in obj["metadata"]
            parsed.extend(crd.parse_resource(obj, kind))
        assert parsed.ok, parsed.errors
        found = parsed.pools if kind is crd.GPU_POOL else parsed.budgets
        assert sorted((each.value.name, each.value) for each in found) == sorted(
            (each.value.name, each.value) for each in items)
        assert {each.path for each in found} == {f"{kind.plural}/{each.value.name}"
                                                 for each in items}
    # No namespaced URL serves a cluster-scoped kind.
    async with session.get(emu.url + "/apis/scaler.io/v1alpha1/namespaces/default/gpupools"
                           ) as answer:
        assert answer.status == 404


async def test_the_server_refuses_a_budget_the_schema_forbids(
        fleet_api: tuple[kube_emulator.KubeEmulator, aiohttp.ClientSession]) -> None:
    emu, session = fleet_api
    body = {"apiVersion": crd.API_VERSION, "kind": "GpuBudget",
            "metadata": {"name": "b", "namespace": "ignored"},
            "spec": {"tenant": "not a label", "pool": "H100", "maxGpus": 0}}
    async with session.post(emu.url + crd.GPU_BUDGET.collection(), json=body) as answer:
        assert answer.status == 422
        status = await answer.json()
    assert {cause["field"] for cause in status["details"]["causes"]} == {
        "spec.tenant", "spec.pool", "spec.maxGpus"}
    body["spec"] = {"tenant": "search", "maxGpus": 4, "typo": 1}
    async with session.post(emu.url + crd.GPU_BUDGET.collection(), json=body) as answer:
        assert answer.status == 201
        stored = await answer.json()
    assert "typo" not in stored["spec"] and "namespace" not in stored["metadata"]


def test_a_resource_that_breaks_the_model_is_an_error_naming_it_and_the_field() -> None:
    pool = {"apiVersion": crd.API_VERSION, "kind": "GpuPool", "metadata": {"name": "h100"},
            "spec": {"gpusPerNode": 8, "maxNodes": 2,
                     "reservations": [{"name": "training", "gpus": 40}]}}
    (error,) = crd.parse_resource(pool, crd.GPU_POOL).errors
    assert error.path == "gpupools/h100" and error.field == "spec"
    assert "reservations hold 40 GPUs, more than the pool's 16" in error.message
    # A list's items carry no kind: the collection says it.
    budget = {"metadata": {"name": "search"}, "spec": {"costCenter": "ads", "maxGpus": 8}}
    (loaded,) = crd.parse_resource(budget, crd.GPU_BUDGET).budgets
    assert loaded.value.spec.owner == ("cost-center", "ads")
