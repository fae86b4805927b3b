"""/metrics, health, the /v1 decision API and `scaler explain`, over real loopback HTTP."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from scaler import cli
from scaler.engine import types
from scaler.policy import loader
from scaler.service import http_api, observability, web
from scaler.service import state as service_state

from . import factories
from .conftest import FakeClock


@pytest.fixture
def registry() -> service_state.ServiceState:
    registry = factories.loaded_state(
        factories.policy("llama-70b", labels={"tenant": "search", "cost-center": "ai"}),
        factories.policy("llama-8b", labels={"tenant": "search", "cost-center": "ai"}),
        factories.policy("shared"),
        factories.policy("shared", namespace="staging"),
    )
    clamp = types.Clamp(name="rate_limit_up", before=9, after=6, detail="4 pods per 15 s")
    registry.record("inference/llama-70b", factories.observation(
        ready=2, current=2, desired=6, in_flight=48.0, arrival_rate=2.0, clamps=(clamp,)))
    registry.record("inference/llama-8b", factories.observation(
        ready=1, current=1, desired=1, in_flight=None, tokens_per_second=None,
        arrival_rate=1.0, model_name="inference/llama-8b"))
    registry.record("inference/shared", factories.observation(model_name="inference/shared"))
    registry.record_patch("inference/llama-70b", "applied")
    registry.record_patch("inference/llama-70b", "conflict")
    registry.add_drop_counter("nats", lambda: {"malformed": 3})
    registry.set_leader(True)
    registry.record_pool(types.NodePlan(
        pool="h100", resource_name="nvidia.com/gpu", gpus_per_node=8, nodes_for_replicas=3,
        headroom_nodes=2, nodes_wanted=5, placeholder_pods=2, placeholder_gpus=8),
        outcome="applied", reason="", at=factories.NOW)
    return registry


@pytest.fixture
async def server(
    registry: service_state.ServiceState, clock: FakeClock
) -> AsyncIterator[web.RunningServer]:
    api = http_api.HttpApi(registry, registry=observability.make_registry(registry, clock=clock))
    running = await web.serve(api.app(), host="127.0.0.1", port=0)
    yield running
    await running.close()


async def scrape(http: aiohttp.ClientSession, server: web.RunningServer) -> dict[
        tuple[str, tuple[tuple[str, str], ...]], float]:
    async with http.get(server.url + "/metrics") as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain; version=")
        text = await response.text()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def model(name: str, **extra: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted({"namespace": "inference", "model": name, **extra}.items()))


def cost(name: str) -> tuple[tuple[str, str], ...]:
    return model(name, tenant="search", cost_center="ai")


async def test_metrics_per_model(
    server: web.RunningServer, http: aiohttp.ClientSession, clock: FakeClock
) -> None:
    clock.now = factories.NOW + 10.0
    samples = await scrape(http, server)
    assert samples[("scaler_desired_replicas", model("llama-70b"))] == 6
    assert samples[("scaler_current_replicas", model("llama-70b"))] == 2
    assert samples[("scaler_ready_replicas", model("llama-70b"))] == 2
    assert samples[("scaler_starting_replicas", model("llama-70b"))] == 0
    assert samples[("scaler_signal_value", model("llama-70b", signal="queue_depth"))] == 12
    # 0.5 s old at the snapshot, scraped 10 s later.
    assert samples[("scaler_signal_age_seconds",
                    model("llama-70b", signal="queue_depth"))] == pytest.approx(10.5)
    assert samples[("scaler_signal_recommendation_replicas",
                    model("llama-70b", signal="concurrency"))] == 6
    assert samples[("scaler_signal_fresh", model("llama-70b", signal="queue_depth"))] == 1
    assert samples[("scaler_time_to_ready_seconds", model("llama-70b"))] == 150
    assert samples[("scaler_forecast_demand_replicas",
                    model("llama-70b", horizon="ready"))] == pytest.approx(1.05)
    assert samples[("scaler_clamps_total", model("llama-70b", clamp="rate_limit_up"))] == 1
    assert samples[("scaler_decisions_total", model("llama-70b", outcome="up"))] == 1
    assert samples[("scaler_patches_total", model("llama-70b", outcome="conflict"))] == 1
    assert samples[("scaler_dropped_messages_total",
                    (("reason", "malformed"), ("source", "nats")))] == 3
    assert samples[("scaler_leader", (("shard", "0"),))] == 1
    assert samples[("scaler_ready", ())] == 1
    assert samples[("scaler_policies_loaded", ())] == 4
    assert samples[("scaler_pool_nodes_wanted", (("pool", "h100"),))] == 5
    assert samples[("scaler_pool_headroom_nodes", (("pool", "h100"),))] == 2
    assert samples[("scaler_pool_applies_total", (("outcome", "applied"), ("pool", "h100")))] == 1


async def test_cost_metrics_by_model_tenant_and_cost_centre(
    server: web.RunningServer, http: aiohttp.ClientSession, clock: FakeClock
) -> None:
    # One hour after the evaluations: llama-70b held 2 GPUs, 50 % busy (48 in flight on
    # 2 x 48), 2 requests/s; llama-8b held 1 GPU (busy unknown -> counted busy), 1 req/s.
    clock.now = factories.NOW + 3600.0
    samples = await scrape(http, server)
    assert samples[("scaler_gpu_hours_total", cost("llama-70b"))] == pytest.approx(2.0)
    assert samples[("scaler_cost_total", cost("llama-70b"))] == pytest.approx(5.0)
    assert samples[("scaler_idle_cost_total", cost("llama-70b"))] == pytest.approx(2.5)
    assert samples[("scaler_requests_total", cost("llama-70b"))] == pytest.approx(7200.0)
    assert samples[("scaler_cost_per_1k_requests", cost("llama-70b"))] == pytest.approx(
        5.0 / 7200 * 1000)
    assert samples[("scaler_idle_cost_total", cost("llama-8b"))] == pytest.approx(0.0)
    # search: 7.50 over 10,800 requests.
    assert samples[("scaler_tenant_cost_per_1k_requests", (("tenant", "search"),))] == (
        pytest.approx(7.5 / 10800 * 1000))
    assert samples[("scaler_cost_center_cost_per_1k_requests", (("cost_center", "ai"),))] == (
        pytest.approx(7.5 / 10800 * 1000))
    # A model without labels is reported with empty tenant and cost centre.
    assert samples[("scaler_gpu_hours_total",
                    model("shared", tenant="", cost_center=""))] == pytest.approx(2.0)


async def test_policy_problems_are_in_metrics(
    registry: service_state.ServiceState, server: web.RunningServer,
    http: aiohttp.ClientSession,
) -> None:
    keep = [p for key in registry.keys() if (p := registry.policy(key)) is not None]
    error = loader.PolicyError(path="/etc/scaler/policies/a.yaml", document=0,
                               field="spec.replicas.max", message="Field required")
    registry.set_policies(keep, status=service_state.PolicyLoadStatus(
        at=factories.NOW, policies=len(keep), errors=(error,), kept=("inference/llama-8b",)))
    samples = await scrape(http, server)
    assert samples[("scaler_policy_invalid", (("path", "/etc/scaler/policies/a.yaml"),
                    ("reason", "invalid_field")))] == 1
    assert samples[("scaler_policy_kept_last_good", model("llama-8b"))] == 1
    assert samples[("scaler_policy_loads_total", (("result", "invalid"),))] == 1


async def test_health_and_readiness(
    registry: service_state.ServiceState, server: web.RunningServer,
    http: aiohttp.ClientSession,
) -> None:
    async with http.get(server.url + "/healthz") as response:
        assert response.status == 200
    async with http.get(server.url + "/readyz") as response:
        assert response.status == 200
    fresh = service_state.ServiceState()
    api = http_api.HttpApi(fresh, registry=observability.make_registry(
        fresh, clock=FakeClock(), process=False))
    other = await web.serve(api.app(), host="127.0.0.1", port=0)
    try:
        async with http.get(other.url + "/readyz") as response:
            assert response.status == 503
            assert "policies not loaded yet" in await response.text()
    finally:
        await other.close()


@pytest.mark.parametrize(
    ("path", "code", "fragment"),
    [
        ("/v1/models/inference/llama-70b/decision", 200, "inference/llama-70b"),
        ("/v1/models/llama-70b/decision", 200, "inference/llama-70b"),
        ("/v1/models/shared/decision", 409, "inference/shared, staging/shared"),
        ("/v1/models/staging/shared/decision", 404, "no decision yet"),
        ("/v1/models/inference/gpt-5/decision", 404, "no policy"),
        ("/v1/models/gpt-5/decision", 404, "any namespace"),
    ],
)
async def test_decision_api(
    server: web.RunningServer, http: aiohttp.ClientSession, path: str, code: int,
    fragment: str,
) -> None:
    async with http.get(server.url + path) as response:
        assert response.status == code
        body = await response.json()
    assert fragment in (body["model"] if code == 200 else body["error"])
    if code == 200:
        assert body["decision"]["desired"] == 6
        assert body["outcome"] == "up"
        assert body["decision"]["clamps"][0]["name"] == "rate_limit_up"
        assert body["snapshot"]["queue_depth"] == {"value": 12.0, "age_s": 0.5, "fresh": True,
                                                   "sources": 1, "histogram": None}
        assert body["counters"]["patches"] == {"applied": 1, "conflict": 1}


async def test_models_listing(server: web.RunningServer, http: aiohttp.ClientSession) -> None:
    async with http.get(server.url + "/v1/models") as response:
        body = await response.json()
    summaries = {m["model"]: m["summary"] for m in body["models"]}
    assert summaries["inference/llama-70b"] == "scale up 2->6 (concurrency); rate_limit_up: 9->6"
    assert summaries["staging/shared"] is None


async def test_explain_prints_the_decision_in_words(
    server: web.RunningServer, capsys: pytest.CaptureFixture[str]
) -> None:
    code = await asyncio.to_thread(cli.main, ["explain", "llama-70b", "--url", server.url])
    out = capsys.readouterr().out
    assert code == 0
    assert out.startswith("inference/llama-70b at 2025-11-29T09:53:20Z: scale up 2->6")
    assert "Scaling up from 2 to 6: demand says" in out
    assert "concurrency: 42 (0.5 s old, fresh) -> 6 replicas  <- decides" in out
    assert "queue_depth: 12 (0.5 s old, fresh) -> 2 replicas" in out
    assert "a new replica needs 150 s to be ready (a free GPU is available)" in out
    assert "rate_limit_up: 9 -> 6 (4 pods per 15 s)" in out


async def test_explain_json_and_namespace(
    server: web.RunningServer, capsys: pytest.CaptureFixture[str]
) -> None:
    code = await asyncio.to_thread(
        cli.main, ["explain", "inference/shared", "--url", server.url, "--json"])
    assert code == 0
    assert '"model": "inference/shared"' in capsys.readouterr().out


async def test_explain_reports_errors(
    server: web.RunningServer, capsys: pytest.CaptureFixture[str]
) -> None:
    code = await asyncio.to_thread(cli.main, ["explain", "shared", "--url", server.url])
    assert code == 1
    assert "several namespaces" in capsys.readouterr().err
    # A closed port on loopback: connection refused, reported, exit 2.
    url = server.url
    await server.close()
    code = await asyncio.to_thread(cli.main, ["explain", "shared", "--url", url,
                                              "--timeout", "2"])
    assert code == 2
    assert "cannot reach the service" in capsys.readouterr().err


def test_decision_urls() -> None:
    assert http_api.decision_url("http://h:1/", "m", None) == "http://h:1/v1/models/m/decision"
    assert http_api.decision_url("http://h:1", "ns/m", None) == (
        "http://h:1/v1/models/ns/m/decision")
    assert http_api.decision_url("http://h:1", "m", "ns") == "http://h:1/v1/models/ns/m/decision"
