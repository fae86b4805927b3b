"""/metrics written directly: byte for byte prometheus-client's text, the loop kept running
while it is written, and gzip for a scraper that asks for it."""

from __future__ import annotations

import asyncio
import dataclasses
import gzip
import math
import random
from collections.abc import AsyncIterator

import aiohttp
import pytest
from prometheus_client import CollectorRegistry, exposition
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from scaler.engine import types
from scaler.policy import loader
from scaler.service import exposition as text_exposition
from scaler.service import http_api, observability, web
from scaler.service import state as service_state

from . import factories

# Label values as they may reach /metrics from policy files, sources and the cluster:
# quotes, backslashes (also before a quote and an n), newlines, unicode, empty.
ODD = ['plain', 'say "hi"', "back\\slash", 'end\\', '\\"', "\\n not a newline",
       "two\nlines", "unicode é 模型 🚀", "", "\t tab", "{brace=\"x\"}", "comma,separated"]
# Values whose text differs most between Python and Go: NaN, infinities, both zeros,
# exponent forms from 1e+06 up, the smallest subnormal, the largest float.
FLOATS = [math.nan, math.inf, -math.inf, -0.0, 0.0, 1234567.0, 123456789012.5, 1e22,
          1e-7, 5e-324, 1.7976931348623157e308, -2.5e-10, 0.1 + 0.2, 999999.5, -1234567.0]
VARIANTS = [
    {"name": "h100", "target": {"name": "chat-h100"}, "nodePool": "h100", "capacity": 30,
     "resources": {"gpusPerReplica": 2}},
    {"name": "l40s", "target": {"name": "chat-l40s"}, "nodePool": "l40s", "capacity": 10},
]


def _observation(index: int, *, at: float, rng: random.Random, key: str
                 ) -> service_state.Observation:
    def pick() -> float:
        return FLOATS[rng.randrange(len(FLOATS))] if rng.random() < 0.5 else rng.uniform(
            -1e3, 1e6)

    names = list(types.ClampName)
    clamps = tuple(types.Clamp(name=names[(index + n) % len(names)], before=9, after=6,
                               detail=ODD[n]) for n in range(index % 3))
    obs = factories.observation(
        at=at, current=index % 7, desired=index % 5, ready=index % 4, queue_depth=pick(),
        in_flight=None if index % 11 == 0 else pick(), tokens_per_second=pick(),
        p95_latency_s=pick(), arrival_rate=pick(), age_s=abs(rng.uniform(0, 40)),
        held=index % 6 == 0, clamps=clamps, model_name=key)
    forecast = obs.decision.forecast
    assert forecast is not None
    decision = dataclasses.replace(obs.decision, forecast=dataclasses.replace(
        forecast, time_to_ready_s=pick(), demand_now=pick(), demand_at_ready=pick()))
    cluster = dataclasses.replace(obs.cluster, excluded_gpus=index % 3,
                                  gpu_sm_active=None if index % 2 else rng.random())
    variants: tuple[service_state.VariantObservation, ...] = ()
    if index % 4 == 0:
        variants = tuple(service_state.VariantObservation(
            name=name, target=f"chat-{name}", pool=name, desired=None if index % 8 else 2,
            current=index % 3, ready=1, starting=index % 2, gpus_per_replica=2,
            gpu_hourly=pick() if name == "l40s" else 4.0,
            owner="HorizontalPodAutoscaler/x" if index % 3 == 0 else None)
            for name in ("h100", "l40s"))
    return dataclasses.replace(obs, decision=decision, cluster=cluster, variants=variants)


def odd_state(models: int = 300, *, seed: int = 7) -> service_state.ServiceState:
    """A service state with many models and every family filled, odd strings and odd
    floats throughout: two evaluations a model (costs accrued between), clamps, patches
    by odd outcomes, odd tenants, pools, sources, drops, a policy load with problems."""
    rng = random.Random(seed)
    policies = []
    for index in range(models):
        labels = {"tenant": ODD[index % len(ODD)],
                  "cost-center": ODD[(index * 5 + 1) % len(ODD)] if index % 3 else ""}
        spec: dict[str, object] = {"cost": {"gpuHourly": rng.choice([2.5, 0.1, 1e-9])}}
        if index % 4 == 0:
            spec.update({"signals": {"concurrency": {"targetPerReplica": 10}},
                         "replicas": {"min": 1, "max": 40}, "variants": VARIANTS})
        elif index % 5 == 0:
            spec["nodePool"] = {"name": "h100", "gpusPerNode": 8}
        policies.append(factories.policy(f"m-{index}", namespace=f"ns-{index % 3}",
                                         labels=labels, spec=spec))
    problems = tuple(loader.PolicyError(path=f"policies/{odd}.yaml", document=0, field="x",
                                        message="bad", reason="invalid_field") for odd in ODD)
    state = service_state.ServiceState()
    state.set_policies(policies, status=service_state.PolicyLoadStatus(
        at=factories.NOW, policies=models, errors=problems, kept=("ns-0/m-3", "ns-1/m-4")))
    for index, policy in enumerate(policies):
        if index % 13 == 0:
            continue  # never evaluated: cost-only series
        for step in range(2):
            at = factories.NOW + step * 60.0 + index * 1e-3
            state.record(policy.key, _observation(index, at=at, rng=rng, key=policy.key))
        state.record_patch(policy.key, ODD[index % len(ODD)] or "applied")
        state.record_requests(policy.key, FLOATS[index % len(FLOATS)] if index % 2 else 10.0)
        if index % 9 == 0:
            state.record_evaluation_error(policy.key)
    for seconds in (0.001, 0.2, 3.0, 1e9):
        state.record_evaluation_seconds(seconds)
    for index, pool in enumerate(ODD[:4]):
        state.record_pool(types.NodePlan(
            pool=pool, resource_name="nvidia.com/gpu", gpus_per_node=8,
            nodes_for_replicas=index, headroom_nodes=1, nodes_wanted=index + 1,
            placeholder_pods=0, placeholder_gpus=0), outcome=ODD[index + 4] or "ok", reason="",
            at=factories.NOW)
    state.add_drop_counter(ODD[1], lambda: {ODD[2]: 3, ODD[6]: 1})
    state.add_drop_counter("nats", lambda: {ODD[2]: 2})
    state.add_source_health(ODD[7], lambda: service_state.SourceHealth(
        up=False, connected=None, errors={ODD[10]: 4}))
    state.add_source_health("nats", lambda: service_state.SourceHealth(
        up=True, connected=True, errors={}))
    state.deletion_costs = lambda: {"patched": 5, ODD[3]: 1}
    state.record_metrics_api_request(403)
    state.set_leader(True)
    return state


NOW = factories.NOW + 200.0


def reference(state: service_state.ServiceState) -> bytes:
    """What prometheus-client writes for the state: the body /metrics must equal."""
    return exposition.generate_latest(
        observability.make_registry(state, clock=lambda: NOW, process=False))


def test_the_written_text_is_prometheus_clients_byte_for_byte() -> None:
    state = odd_state()
    written = b"".join(asyncio.run(observability.render(state, now=NOW)))
    expected = reference(state)
    assert written == expected
    # ... and the state exercised what the writer must get right.
    text = expected.decode()
    for needle in (r'\"hi\"', r"back\\slash", r"two\nlines", "模型 🚀", 'tenant=""', " NaN\n",
                   " +Inf\n", " -Inf\n", " -0.0\n", " 0.0\n", "e+06\n", "e-07\n", "5e-324\n",
                   "scaler_variant_cost_total{", "scaler_pool_excluded_gpus{",
                   "scaler_signals_silent{", "scaler_evaluation_duration_seconds_bucket{",
                   'scaler_policy_invalid{path="policies/\\\\\\".yaml"'):
        assert needle in text, needle
    assert len(text.splitlines()) > 30 * 300  # many models, dozens of series each


def test_the_writer_differs_when_the_state_does() -> None:
    # The bodies are not equal because both are empty or fixed: another state, another
    # body, and the written one follows it.
    first, second = odd_state(seed=7), odd_state(seed=8)
    assert reference(first) != reference(second)
    assert b"".join(asyncio.run(observability.render(second, now=NOW))) == reference(second)


def test_the_service_registry_adds_the_process_families_as_generate_latest_does() -> None:
    state = odd_state(models=20)
    registry = observability.make_registry(state, clock=lambda: NOW, process=True)
    written = b"".join(asyncio.run(registry.exposition())).decode()
    expected = exposition.generate_latest(registry).decode()
    # Process values move between two reads (CPU seconds): the lines that name and type
    # the families, and every sample's name and labels, are the same in the same order.
    assert "# TYPE process_cpu_seconds_total counter" in expected
    assert ([line.rsplit(" ", 1)[0] for line in written.splitlines()]
            == [line.rsplit(" ", 1)[0] for line in expected.splitlines()])


def test_the_loop_runs_while_a_large_state_is_written() -> None:
    models = 5 * observability.CHUNK_MODELS
    state = odd_state(models=models)

    async def main() -> tuple[int, bytes]:
        ticks = 0
        done = asyncio.Event()

        async def ticker() -> None:
            nonlocal ticks
            while not done.is_set():
                ticks += 1
                await asyncio.sleep(0)

        task = asyncio.create_task(ticker())
        await asyncio.sleep(0)
        ticks = 0
        body = b"".join(await observability.render(state, now=NOW))
        done.set()
        await task
        return ticks, body

    ticks, body = asyncio.run(main())
    assert ticks >= models // observability.CHUNK_MODELS
    assert body == reference(state)


def test_a_policy_removed_while_written_is_left_out() -> None:
    state = odd_state(models=3 * observability.CHUNK_MODELS)
    keep = [p for p in (state.policy(k) for k in state.keys()) if p is not None][:10]

    async def main() -> bytes:
        task = asyncio.ensure_future(observability.render(state, now=NOW))
        await asyncio.sleep(0)  # the first chunk is written
        state.set_policies(keep, status=service_state.PolicyLoadStatus(at=NOW, policies=10))
        return b"".join(await task)

    body = asyncio.run(main()).decode()
    removed = f'model="m-{2 * observability.CHUNK_MODELS}"'
    assert 'model="m-0"' in body and removed not in body


class _Fixed(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> list[Metric]:
        return self._families


def test_families_longer_than_a_part_are_written_whole_and_in_order() -> None:
    # 2.5 parts of one gauge, then a counter and an unlabelled gauge: the parts' joins
    # fall inside the first family and between families.
    count = text_exposition.PART_LINES * 5 // 2
    written = text_exposition.TextFamilies()
    gauge = written.gauge("a_gauge", "Help with \\ and \n in it.", ["z", "a"])
    counter = written.counter("a_counter", 'Says "so".', ["only"])
    plain = written.gauge("plain", "No labels.", [])
    reference = GaugeMetricFamily("a_gauge", "Help with \\ and \n in it.", labels=["z", "a"])
    counted = CounterMetricFamily("a_counter", 'Says "so".', labels=["only"])
    for index in range(count):
        labels = [ODD[index % len(ODD)], f"series-{index}"]
        value = FLOATS[index % len(FLOATS)] * index
        gauge.add_metric(labels, value)
        reference.add_metric(labels, value)
    for family in (counter, counted):
        family.add_metric([ODD[1]], 3)
    plain.add_metric([], -0.0)
    unlabelled = GaugeMetricFamily("plain", "No labels.", value=-0.0)
    registry = CollectorRegistry()
    registry.register(_Fixed([reference, counted, unlabelled]))
    parts = list(written.parts())
    assert len(parts) == 3 + 2
    assert b"".join(parts) == exposition.generate_latest(registry)


@pytest.mark.parametrize(("header", "accepted"), [
    ("gzip", True), ("deflate, gzip;q=1.0, *;q=0.5", True), ("GZIP", True), ("*", True),
    ("gzip;q=0", False), ("gzip; q=0.0", False), ("identity", False), ("", False),
    ("x-gzip-like", False), ("gzip;q=bad", False), ("br, *;q=0.1", True),
    ("*;q=0.5, gzip;q=0", False), ("gzip;q=0, *", False), ("br;q=1, gzip;q=0.001", True),
])
def test_accept_encoding(header: str, accepted: bool) -> None:
    assert http_api.accepts_gzip(header) is accepted


@pytest.fixture
async def server() -> AsyncIterator[tuple[web.RunningServer, bytes]]:
    state = odd_state(models=50)
    api = http_api.HttpApi(state, registry=observability.make_registry(
        state, clock=lambda: NOW, process=False))
    running = await web.serve(api.app(), host="127.0.0.1", port=0)
    yield running, reference(state)
    await running.close()


async def test_metrics_over_http_plain_and_gzip(
        server: tuple[web.RunningServer, bytes]) -> None:
    running, expected = server
    async with aiohttp.ClientSession(auto_decompress=False) as http:
        async with http.get(running.url + "/metrics",
                            headers={"Accept-Encoding": "identity"}) as response:
            assert response.status == 200
            assert "Content-Encoding" not in response.headers
            assert response.headers["Content-Type"].startswith("text/plain;")
            assert await response.read() == expected
        async with http.get(running.url + "/metrics",
                            headers={"Accept-Encoding": "gzip"}) as response:
            assert response.headers["Content-Encoding"] == "gzip"
            assert response.headers["Vary"] == "Accept-Encoding"
            raw = await response.read()
            assert gzip.decompress(raw) == expected
            assert len(raw) * 5 < len(expected)
