"""Health that speaks: sources up and connected in /metrics, degraded readiness, logs once.

The service runs against a real nats-server, a Prometheus URL where nothing listens (the
wrong-URL case), and a fake cluster; its wall clock is moved by hand.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import aiohttp
import nats
import pytest
from nats.aio.client import Client
from prometheus_client.parser import text_string_to_metric_families

from scaler import testing
from scaler.actuators import base as actuators
from scaler.core import backoff as core_backoff
from scaler.service import runner, settings
from scaler.signals import prometheus
from scaler.testing import nats_server

from . import factories, fakes
from .conftest import FakeClock

KEY = "inference/llama-70b"
SUBJECT = "scaler.signals.inference.llama-70b"
POLICY = """\
apiVersion: scaler.io/v1alpha1
kind: ScalePolicy
metadata: {name: llama-70b, namespace: inference}
spec:
  target: {name: llama-70b}
  replicas: {min: 1, max: 20}
  signals:
    concurrency: {targetPerReplica: 10}
  sources:
    nats: {}
    prometheus: {preset: vllm, intervalSeconds: 0.2}
  staleAfterSeconds: 30
"""
CONNECTION_LOG = "scaler.signals.connection"

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


async def eventually(check: Callable[[], bool], *, timeout_s: float = 10.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not check():
            await asyncio.sleep(0.02)


async def eventually_async(check: Callable[[], Awaitable[bool]], *,
                           timeout_s: float = 10.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not await check():
            await asyncio.sleep(0.05)


@pytest.fixture
def bus() -> Iterator[nats_server.NatsServer]:
    with nats_server.NatsServer() as server:
        yield server


async def scrape(http: aiohttp.ClientSession, url: str) -> Samples:
    async with http.get(url + "/metrics") as response:
        text = await response.text()
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


async def readyz(http: aiohttp.ClientSession, url: str) -> tuple[int, str]:
    async with http.get(url + "/readyz") as response:
        return response.status, await response.text()


def source(name: str) -> tuple[tuple[str, str], ...]:
    return (("source", name),)


async def test_health_in_metrics_readiness_and_logs(
    bus: nats_server.NatsServer, tmp_path: Path, http: aiohttp.ClientSession,
    clock: FakeClock, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    (tmp_path / "llama.yaml").write_text(POLICY)
    config = settings.load_settings(environ={}).model_copy(update={
        "nats": settings.NatsSettings(
            servers=(bus.url,),
            reconnect=core_backoff.Backoff(base_delay_s=0.05, max_delay_s=0.5)),
        "prometheus": prometheus.PrometheusSettings(
            url=f"http://127.0.0.1:{testing.free_port()}", timeout_s=0.5),
        "http": settings.HttpSettings(host="127.0.0.1", port=0),
        "metrics_api": settings.MetricsApiSettings(enabled=False),
        "engine": settings.EngineSettings(backstop_tick_seconds=0.1),
        "policies": settings.PolicySettings(paths=[tmp_path]),
    })
    cluster = fakes.FakeCluster(current=2)
    service = runner.Service(config, wall_clock=clock, backend=runner.ClusterBackend(
        reader=cluster, actuator=cluster, leader=actuators.AlwaysLeader()))
    try:
        await service.start()
        await asyncio.wait_for(service.wait_sources_ready(), timeout=10)
        assert service.http is not None
        url = service.http.url
        client = await _publisher(bus.url)
        try:
            body = {"v": 1, "model": "llama-70b", "namespace": "inference",
                    "source": "pod-a", "ts": clock.now, "in_flight": 12}
            await client.publish(SUBJECT, json.dumps(body).encode())
            await client.publish(SUBJECT, b"{not json")
            await client.flush()
        finally:
            await client.close()

        def fresh() -> bool:
            status = service.state.status(KEY)
            return bool(status and status.last and status.last.snapshot.in_flight)

        await eventually(fresh)
        assert await readyz(http, url) == (200, "ok")

        async def prometheus_down() -> bool:
            return (await scrape(http, url)).get(("scaler_source_up", source("prometheus"))) == 0

        await eventually_async(prometheus_down)
        metrics = await scrape(http, url)
        assert metrics[("scaler_source_up", source("nats"))] == 1
        assert metrics[("scaler_source_connected", source("nats"))] == 1
        assert metrics[("scaler_source_connected", source("jetstream"))] == 1
        assert ("scaler_source_connected", source("prometheus")) not in metrics
        assert metrics[("scaler_source_errors_total", (("reason", "ConnectionError"),
                                                       ("source", "prometheus")))] >= 1
        assert metrics[("scaler_signals_refused_total", (("reason", "malformed_json"),))] == 1
        assert metrics[("scaler_dropped_messages_total", (("reason", "malformed_json"),
                                                          ("source", "nats")))] == 1
        model = (("model", "llama-70b"), ("namespace", "inference"))
        assert metrics[("scaler_signals_silent", model)] == 0
        # The wrong Prometheus URL is heard, at WARNING, and not once per poll.
        warned = [r for r in caplog.records if r.name == prometheus.log.name]
        assert warned and all(r.levelno == logging.WARNING for r in warned)
        assert len(warned) == 1

        # 45 s without a word from any source, past the 30 s limit: ready, but degraded.
        clock.now += 45
        status, text = await readyz(http, url)
        assert status == 200
        assert text.startswith(f"degraded: {KEY}: no fresh signal from any source for 45 s "
                               "(staleAfterSeconds 30)")
        assert (await scrape(http, url))[("scaler_signals_silent", model)] == 1

        # NATS goes away: connection state in /metrics, one WARNING for both clients.
        caplog.clear()
        bus.kill()

        async def nats_disconnected() -> bool:
            return (await scrape(http, url)).get(
                ("scaler_source_connected", source("nats"))) == 0

        await eventually_async(nats_disconnected)
        metrics = await scrape(http, url)
        assert metrics[("scaler_source_up", source("nats"))] == 0
        await eventually(lambda: not service.source("jetstream").stats.connected)
        bus.start()
        await eventually(lambda: bool(service.source("nats").stats.connected
                                      and service.source("jetstream").stats.connected),
                         timeout_s=20)
        await eventually(lambda: len(_lines(caplog)) == 2)
        assert [level for level, _ in _lines(caplog)] == [logging.WARNING, logging.INFO]
        caplog.clear()
    finally:
        await service.stop()
    assert _lines(caplog) == []  # a clean stop is not a disconnect


def _lines(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.name == CONNECTION_LOG]


async def _publisher(url: str) -> Client:
    client: Client = await nats.connect(url, allow_reconnect=False)
    return client


@pytest.mark.parametrize(
    ("age_s", "evaluated_ago_s", "silent"),
    [
        (5.0, 0.0, None),      # fresh
        (20.0, 10.0, None),    # 30 s old now: at the limit, not past it
        (20.0, 15.0, 35.0),    # 35 s old now
        (40.0, 0.0, 40.0),     # stale at the evaluation already
    ],
)
def test_silence_is_the_newest_value_aged_to_now(
        age_s: float, evaluated_ago_s: float, silent: float | None) -> None:
    state = factories.loaded_state(factories.policy())
    state.record(KEY, factories.observation(at=factories.NOW, age_s=age_s, queue_depth=None))
    found = state.silent_models(factories.NOW + evaluated_ago_s)
    assert [each.silent_s for each in found] == ([] if silent is None else [silent])


def test_a_model_that_never_heard_anything_is_silent_once_past_its_limit() -> None:
    state = factories.loaded_state(factories.policy())  # in force since NOW
    state.record(KEY, factories.observation(
        at=factories.NOW + 10, queue_depth=None, in_flight=None, tokens_per_second=None,
        p95_latency_s=None))
    assert state.silent_models(factories.NOW + 30) == []
    (silent,) = state.silent_models(factories.NOW + 31)
    assert str(silent) == (f"{KEY}: no signal from any source for 31 s (staleAfterSeconds 30); "
                           "replicas are held")
    assert factories.loaded_state(factories.policy()).silent_models(factories.NOW + 99) == []
