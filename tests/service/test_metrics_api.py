"""The external metrics API over real TLS on loopback, called the way the HPA calls it."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from scaler.service import metrics_api, tls, web
from scaler.service import state as service_state

from . import factories, k8s_schema
from .conftest import FakeClock

LIST = k8s_schema.EXTERNAL + "ExternalMetricValueList"
STATUS = k8s_schema.META + "Status"


@pytest.fixture
def registry() -> service_state.ServiceState:
    registry = factories.loaded_state(
        factories.policy("llama-70b", labels={"tenant": "search", "cost-center": "ai"}),
        factories.policy("llama-8b", labels={"tenant": "search"}),
        factories.policy("llama-70b", namespace="staging"),
        factories.policy("mistral-7b", labels={"tenant": "ads"}),
    )
    registry.record("inference/llama-70b", factories.observation(desired=3))
    registry.record("inference/llama-8b", factories.observation(
        desired=2, queue_depth=1.5, model_name="inference/llama-8b"))
    registry.record("staging/llama-70b", factories.observation(
        desired=7, model_name="staging/llama-70b"))
    # mistral-7b has a policy but no decision yet.
    return registry


@pytest.fixture
async def server(
    registry: service_state.ServiceState, clock: FakeClock, certificate: tls.CertificatePair
) -> AsyncIterator[web.RunningServer]:
    api = metrics_api.MetricsApi(registry, clock=clock)
    running = await web.serve(api.app(), host="127.0.0.1", port=0,
                              ssl_context=tls.server_context(certificate))
    yield running
    await running.close()


async def get(
    http: aiohttp.ClientSession, server: web.RunningServer, client_ssl: ssl.SSLContext,
    path: str, params: dict[str, str] | None = None,
) -> tuple[int, Any]:
    async with http.get(server.url + path, params=params, ssl=client_ssl) as response:
        return response.status, await response.json()


async def hpa_get(
    http: aiohttp.ClientSession, server: web.RunningServer, client_ssl: ssl.SSLContext, *,
    namespace: str, metric: str, selector: str,
) -> tuple[int, Any]:
    # The HPA's client: GET .../namespaces/{ns}/{metric}?labelSelector=<selector.String()>
    return await get(http, server, client_ssl, f"{metrics_api.BASE}/namespaces/{namespace}/"
                     f"{metric}", params={"labelSelector": selector})


@pytest.mark.parametrize(
    ("value", "expected"),
    [(0.0, "0"), (3.0, "3"), (1.5, "1500m"), (2400.5, "2400500m"), (0.0004, "0"),
     (0.0005, "0"), (0.0015, "2m"), (-0.25, "-250m"), (1e6, "1000000")],
)
def test_quantity_strings(value: float, expected: str) -> None:
    assert metrics_api.quantity(value) == expected
    assert k8s_schema.QUANTITY.match(expected)


def test_quantity_rejects_non_finite() -> None:
    with pytest.raises(ValueError, match="not a quantity"):
        metrics_api.quantity(float("nan"))


async def test_discovery_documents_match_kubernetes_schemas(
    server: web.RunningServer, http: aiohttp.ClientSession, client_ssl: ssl.SSLContext
) -> None:
    code, resources = await get(http, server, client_ssl, metrics_api.BASE)
    assert code == 200
    k8s_schema.validate(resources, k8s_schema.META + "APIResourceList")
    assert [r["name"] for r in resources["resources"]] == list(metrics_api.METRIC_NAMES)
    assert all(r["namespaced"] for r in resources["resources"])
    code, group = await get(http, server, client_ssl, "/apis/external.metrics.k8s.io")
    assert code == 200
    k8s_schema.validate(group, k8s_schema.META + "APIGroup")
    code, groups = await get(http, server, client_ssl, "/apis")
    assert code == 200
    k8s_schema.validate(groups, k8s_schema.META + "APIGroupList")


async def test_hpa_request_for_desired_replicas(
    server: web.RunningServer, http: aiohttp.ClientSession, client_ssl: ssl.SSLContext
) -> None:
    code, body = await hpa_get(http, server, client_ssl, namespace="inference",
                               metric="scaler_desired_replicas", selector="model=llama-70b")
    assert code == 200
    k8s_schema.validate(body, LIST)
    [item] = body["items"]
    assert item["value"] == "3"
    assert item["metricName"] == "scaler_desired_replicas"
    assert item["metricLabels"] == {"model": "llama-70b", "namespace": "inference",
                                    "target": "llama-70b", "tenant": "search",
                                    "cost-center": "ai"}
    assert item["timestamp"] == "2025-11-29T09:53:20Z"


@pytest.mark.parametrize(
    ("metric", "expected"),
    [("scaler_queue_depth", "12"), ("scaler_tokens_per_second", "2400500m"),
     ("scaler_p95_latency_seconds", "1800m")],
)
async def test_signal_metrics_as_quantities(
    server: web.RunningServer, http: aiohttp.ClientSession, client_ssl: ssl.SSLContext,
    metric: str, expected: str,
) -> None:
    code, body = await hpa_get(http, server, client_ssl, namespace="inference", metric=metric,
                               selector="model=llama-70b")
    assert code == 200
    k8s_schema.validate(body, LIST)
    assert [item["value"] for item in body["items"]] == [expected]
    # Produced when the sample was taken: 0.5 s before the snapshot, truncated to seconds.
    assert body["items"][0]["timestamp"] == "2025-11-29T09:53:19Z"


async def test_namespace_scopes_the_selection(
    server: web.RunningServer, http: aiohttp.ClientSession, client_ssl: ssl.SSLContext
) -> None:
    code, body = await hpa_get(http, server, client_ssl, namespace="staging",
                               metric="scaler_desired_replicas", selector="model=llama-70b")
    assert code == 200
    assert [item["value"] for item in body["items"]] == ["7"]
    assert body["items"][0]["metricLabels"]["namespace"] == "staging"
    code, body = await hpa_get(http, server, client_ssl, namespace="other",
                               metric="scaler_desired_replicas", selector="model=llama-70b")
    assert code == 404
    k8s_schema.validate(body, STATUS)
    assert body["reason"] == "NotFound"


async def test_set_based_selectors_select_several_models(
    server: web.RunningServer, http: aiohttp.ClientSession, client_ssl: ssl.SSLContext
) -> None:
    # An HPA metric.selector {matchLabels: {tenant: search}, matchExpressions:
    # [{key: model, operator: In, values: [llama-70b, llama-8b]}]} arrives as this string.
    code, body = await hpa_get(http, server, client_ssl, namespace="inference",
                               metric="scaler_desired_replicas",
                               selector="model in (llama-70b,llama-8b),tenant=search")
    assert code == 200
    k8s_schema.validate(body, LIST)
    assert sorted((i["metricLabels"]["model"], i["value"]) for i in body["items"]) == [
        ("llama-70b", "3"), ("llama-8b", "2")]
    code, body = await hpa_get(http, server, client_ssl, namespace="inference",
                               metric="scaler_queue_depth", selector="!cost-center,tenant=search")
    assert code == 200
    assert [(i["metricLabels"]["model"], i["value"]) for i in body["items"]] == [
        ("llama-8b", "1500m")]


@pytest.mark.parametrize(
    ("metric", "selector", "fragment"),
    [
        ("scaler_gpu_temperature", "model=llama-70b", "is not served"),
        ("scaler_desired_replicas", "model=gpt-5", "no model in namespace"),
        ("scaler_desired_replicas", "model=mistral-7b", "no decision yet"),
        # An empty selector selects every model in the namespace; one has no decision, so
        # the answer is none rather than a partial sum.
        ("scaler_desired_replicas", "", "inference/mistral-7b: no decision yet"),
    ],
)
async def test_unknown_metric_or_model_is_a_404_status(
    server: web.RunningServer, http: aiohttp.ClientSession, client_ssl: ssl.SSLContext,
    metric: str, selector: str, fragment: str,
) -> None:
    code, body = await hpa_get(http, server, client_ssl, namespace="inference",
                               metric=metric, selector=selector)
    assert code == 404
    k8s_schema.validate(body, STATUS)
    assert body["code"] == 404 and body["status"] == "Failure"
    assert fragment in body["message"]


async def test_bad_selector_is_a_400_status(
    server: web.RunningServer, http: aiohttp.ClientSession, client_ssl: ssl.SSLContext
) -> None:
    code, body = await hpa_get(http, server, client_ssl, namespace="inference",
                               metric="scaler_desired_replicas", selector="model in (a")
    assert code == 400
    k8s_schema.validate(body, STATUS)
    assert body["reason"] == "BadRequest" and "model in (a" in body["message"]


async def test_stale_signal_is_not_served(
    server: web.RunningServer, http: aiohttp.ClientSession, client_ssl: ssl.SSLContext,
    clock: FakeClock,
) -> None:
    # The sample was 0.5 s old at the snapshot; staleAfterSeconds is 30.
    clock.now = factories.NOW + 29.0
    code, _ = await hpa_get(http, server, client_ssl, namespace="inference",
                            metric="scaler_queue_depth", selector="model=llama-70b")
    assert code == 200
    clock.now = factories.NOW + 30.0
    code, body = await hpa_get(http, server, client_ssl, namespace="inference",
                               metric="scaler_queue_depth", selector="model=llama-70b")
    assert code == 404
    assert "stale (30 s old" in body["message"]
    # The decision itself stays servable: it already holds replicas on stale data.
    code, body = await hpa_get(http, server, client_ssl, namespace="inference",
                               metric="scaler_desired_replicas", selector="model=llama-70b")
    assert code == 200


async def test_missing_signal_is_a_404(
    registry: service_state.ServiceState, server: web.RunningServer,
    http: aiohttp.ClientSession, client_ssl: ssl.SSLContext,
) -> None:
    registry.record("inference/llama-70b", factories.observation(tokens_per_second=None))
    code, body = await hpa_get(http, server, client_ssl, namespace="inference",
                               metric="scaler_tokens_per_second", selector="model=llama-70b")
    assert code == 404
    assert "inference/llama-70b: no value" in body["message"]


async def test_certificate_verifies_for_loopback(
    server: web.RunningServer, http: aiohttp.ClientSession, client_ssl: ssl.SSLContext
) -> None:
    async with http.get(server.url + "/healthz", ssl=client_ssl) as response:
        assert response.status == 200
    # Without trusting the self-signed pair the handshake fails: it is really TLS.
    with pytest.raises(aiohttp.ClientConnectorCertificateError):
        async with http.get(server.url + "/healthz", ssl=ssl.create_default_context()):
            pass


async def test_readyz_follows_state(
    registry: service_state.ServiceState, server: web.RunningServer,
    http: aiohttp.ClientSession, client_ssl: ssl.SSLContext,
) -> None:
    async with http.get(server.url + "/readyz", ssl=client_ssl) as response:
        assert response.status == 503
        assert "leader state unknown" in await response.text()
    registry.set_leader(False)
    async with http.get(server.url + "/readyz", ssl=client_ssl) as response:
        assert response.status == 200
