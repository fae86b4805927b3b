"""Sources that speak: NATS outages logged once, failed polls logged at WARNING, rate-limited."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator

import pytest

from scaler.core import vocabulary
from scaler.signals import connection, jetstream, nats_core, prometheus
from scaler.testing import free_port, nats_server, prometheus_server

from .conftest import Eventually, ListSink

KEY = "inference/llama"
CONNECTION_LOG = "scaler.signals.connection"


def lines(caplog: pytest.LogCaptureFixture, logger: str) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.name == logger]


async def test_a_nats_outage_is_one_warning_and_one_info_for_both_clients(
    nats: nats_server.NatsServer, nats_settings: connection.NatsSettings, sink: ListSink,
    eventually: Eventually, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=CONNECTION_LOG)
    link = connection.LinkLog()
    core = nats_core.NatsCoreSource(nats_settings, link=link)
    lag = jetstream.JetStreamLagSource(nats_settings, link=link)
    assert core.stats.connected is None and core.stats.up  # not run: holds no connection
    tasks = [asyncio.create_task(core.run(sink)), asyncio.create_task(lag.run(sink))]
    try:
        await eventually(lambda: bool(core.stats.connected and lag.stats.connected))
        assert lines(caplog, CONNECTION_LOG) == [(logging.INFO, f"nats connected to {nats.url}")]
        caplog.clear()

        nats.kill()  # a crash: both clients lose their connection
        await eventually(lambda: core.stats.connected is False and not lag.stats.connected)
        assert not core.stats.up and not lag.stats.up
        await asyncio.sleep(0.3)  # reconnect attempts fail meanwhile: no more lines
        (warning,) = lines(caplog, CONNECTION_LOG)
        assert warning[0] == logging.WARNING
        assert warning[1].startswith(f"nats connection to {nats.url} lost")
        caplog.clear()

        nats.start()
        await eventually(lambda: bool(core.stats.connected and lag.stats.connected),
                         timeout_s=20)
        await eventually(lambda: bool(lines(caplog, CONNECTION_LOG)))
        (info,) = lines(caplog, CONNECTION_LOG)
        assert info[0] == logging.INFO and info[1].startswith(f"nats connected to {nats.url} again")
        assert core.stats.up and core.stats.reconnects == 1 and lag.stats.reconnects == 1
        caplog.clear()
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
    # A clean close (SIGTERM) is not an outage: nothing logged.
    assert lines(caplog, CONNECTION_LOG) == []
    assert core.stats.connected is False


async def test_first_connection_failure_is_one_warning(
    sink: ListSink, eventually: Eventually, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=CONNECTION_LOG)
    server = nats_server.NatsServer(jetstream=False)
    settings = connection.NatsSettings(servers=(server.url,))
    source = nats_core.NatsCoreSource(settings)
    task = asyncio.create_task(source.run(sink))
    try:
        await eventually(lambda: bool(source.stats.errors))
        await asyncio.sleep(1.2)  # another attempt (1 s apart on a first connection)
        (warning,) = lines(caplog, CONNECTION_LOG)
        assert warning[0] == logging.WARNING and "cannot connect to" in warning[1]
        assert not source.stats.up
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        server.close()


def test_server_urls_in_log_lines_carry_no_credentials() -> None:
    shown = connection.display_servers(["nats://scaler:s3cret@nats.messaging:4222",
                                        "tls://nats-2:4222"])
    assert shown == "nats://nats.messaging:4222, tls://nats-2:4222"


class ManualClock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def prom() -> Iterator[prometheus_server.PrometheusServer]:
    """A real Prometheus with nothing to scrape: constant queries need no exporter."""
    if prometheus_server.prometheus_binary() is None:
        pytest.skip("no `prometheus` binary: install Debian's package (apt-get install "
                    "prometheus) to run the Prometheus tests")
    server = prometheus_server.PrometheusServer(targets=[])
    server.start()
    try:
        yield server
    finally:
        server.close()


async def test_prometheus_failures_are_warnings_once_a_minute_per_model(
    prom: prometheus_server.PrometheusServer, sink: ListSink,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=prometheus.log.name)
    clock = ManualClock(1_764_400_000.0)
    source = prometheus.PrometheusSource(prometheus.PrometheusSettings(url=prom.url),
                                         clock=clock)
    broken = prometheus.PromTarget(model=KEY, queries=(
        (vocabulary.Signal.QUEUE_DEPTH, "sum(("), (vocabulary.Signal.IN_FLIGHT, "max((")))
    healthy = prometheus.PromTarget(model="inference/other", queries=(
        (vocabulary.Signal.QUEUE_DEPTH, "vector(3)"),))
    source.configure(prometheus.PrometheusConfig(targets=(broken, healthy)))
    limit = asyncio.Semaphore(4)
    try:
        for step_s in (0.0, 10.0, 20.0, 31.0, 5.0):  # polls at 0, 10, 30, 61, 66 s
            clock.now += step_s
            await source.poll(broken, sink, limit=limit)
            await source.poll(healthy, sink, limit=limit)
        failed = lines(caplog, prometheus.log.name)
        assert [level for level, _ in failed] == [logging.WARNING, logging.WARNING]
        first, second = (text for _, text in failed)
        assert first.startswith(f"prometheus queries for {KEY} failed: ")
        assert "bad_data" in first or "parse error" in first
        assert "since the previous line" not in first
        # Polls at 10, 30 and 61 s, two failed queries each, since the line at 0 s.
        assert second.endswith("; 6 failed since the previous line")
        assert source.stats.errors == {"PrometheusApiClientException": 10}
        assert source.stats.failing == {KEY} and not source.stats.up
        caplog.clear()

        # The model's query is fixed: one INFO line, the source is up again.
        fixed = prometheus.PromTarget(model=KEY, queries=(
            (vocabulary.Signal.QUEUE_DEPTH, "vector(1)"),))
        source.configure(prometheus.PrometheusConfig(targets=(fixed, healthy)))
        await source.poll(fixed, sink, limit=limit)
        assert lines(caplog, prometheus.log.name) == [
            (logging.INFO, f"prometheus queries for {KEY} succeed again, after 10 failures")]
        assert source.stats.up and not source.stats.failing
    finally:
        await source.close()


async def test_a_wrong_prometheus_url_is_heard_and_a_removed_model_is_forgotten(
    sink: ListSink, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=prometheus.log.name)
    source = prometheus.PrometheusSource(
        prometheus.PrometheusSettings(url=f"http://127.0.0.1:{free_port()}"))
    target = prometheus.PromTarget(model=KEY, queries=(
        (vocabulary.Signal.QUEUE_DEPTH, "vector(1)"),))
    source.configure(prometheus.PrometheusConfig(targets=(target,)))
    try:
        for _ in range(3):
            await source.poll(target, sink, limit=asyncio.Semaphore(1))
    finally:
        await source.close()
    (warning,) = lines(caplog, prometheus.log.name)
    assert warning[0] == logging.WARNING and f"for {KEY} failed: ConnectionError" in warning[1]
    assert not source.stats.up
    source.configure(prometheus.PrometheusConfig())  # the policy was removed
    assert source.stats.up and not source.stats.failing
