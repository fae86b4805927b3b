"""JetStream lag and arrival rate, read through the JetStream API of a real nats-server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import nats
import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext

from scaler.core import vocabulary
from scaler.policy import model as policy_model
from scaler.signals import connection, jetstream, samples, store
from scaler.testing import nats_server

from .conftest import Eventually, ListSink, Start

KEY = "inference/llama-70b"


@pytest.fixture
async def js_client(nats: nats_server.NatsServer) -> AsyncIterator[tuple[Client, JetStreamContext]]:
    """A stream REQUESTS (subjects requests.>) with a durable pull consumer `workers`."""
    client = await _connect(nats.url)
    js = client.jetstream()
    await js.add_stream(name="REQUESTS", subjects=["requests.>"])
    await js.pull_subscribe("requests.>", durable="workers", stream="REQUESTS")
    yield client, js
    await client.close()


async def _connect(url: str) -> Client:
    client: Client = await nats.connect(url, allow_reconnect=False)
    return client


def target(interval_s: float = 3600.0) -> jetstream.LagTarget:
    # A long interval: the tests call poll() themselves, so time does not matter.
    return jetstream.LagTarget(model=KEY, stream="REQUESTS", consumer="workers",
                               interval_s=interval_s)


@pytest.mark.parametrize(
    ("previous", "current", "rate"),
    [
        (None, jetstream.SequencePoint(10, 1.0), None),
        (jetstream.SequencePoint(1000, 10.0), jetstream.SequencePoint(1600, 12.0), 300.0),
        (jetstream.SequencePoint(1000, 10.0), jetstream.SequencePoint(1000, 11.0), 0.0),
        (jetstream.SequencePoint(1000, 10.0), jetstream.SequencePoint(5, 12.0), None),
        (jetstream.SequencePoint(1000, 10.0), jetstream.SequencePoint(1001, 10.0), None),
    ],
)
def test_arrival_rate(
    previous: jetstream.SequencePoint | None, current: jetstream.SequencePoint, rate: float | None
) -> None:
    assert jetstream.arrival_rate(previous, current) == rate


def test_config_from_policies() -> None:
    policy = policy_model.ScalePolicy.model_validate(
        {
            "apiVersion": "scaler.io/v1alpha1", "kind": "ScalePolicy",
            "metadata": {"name": "llama-70b", "namespace": "inference"},
            "spec": {
                "target": {"name": "llama-70b"}, "replicas": {"max": 4},
                "signals": {"concurrency": {"targetPerReplica": 8}},
                "sources": {"jetstream": {"stream": "REQUESTS", "consumer": "workers",
                                          "intervalSeconds": 0.5}},
            },
        }
    )
    config = jetstream.config_from_policies([policy])
    assert config.targets == (
        jetstream.LagTarget(model=KEY, stream="REQUESTS", consumer="workers", interval_s=0.5),
    )


async def test_lag_is_pending_plus_ack_pending_and_rate_follows_the_stream(
    js_client: tuple[Client, JetStreamContext],
    nats_settings: connection.NatsSettings,
    sink: ListSink,
) -> None:
    client, js = js_client
    source = jetstream.JetStreamLagSource(nats_settings, jetstream.JetStreamConfig())
    for i in range(10):
        await js.publish(f"requests.{i}", b"work")
    # A worker takes 3 messages and acknowledges 1: 7 pending, 2 awaiting ack.
    worker = await js.pull_subscribe("requests.>", durable="workers", stream="REQUESTS")
    taken = await worker.fetch(3, timeout=5)
    await taken[0].ack()
    await client.flush()

    async def lag_settles_at(pending: float, ack_pending: float) -> dict[str, float | None]:
        # The server updates a consumer's counts just after the stream stores a message,
        # so a poll right after a publish may see the previous count: poll until the
        # expected one shows (bounded: 100 polls, 10 ms apart).
        for _ in range(100):
            await source.poll(js, target(), sink)
            signals = sink.signals(KEY)
            if (signals["queue_depth"], signals["in_flight"]) == (pending, ack_pending):
                return signals
            await asyncio.sleep(0.01)
        raise AssertionError(f"lag did not reach {pending} + {ack_pending}: {signals}")

    await lag_settles_at(7.0, 2.0)
    assert {s.source for s in sink.samples} == {"jetstream/REQUESTS/workers"}
    # In the store, the consumer's pending messages are a queue every worker takes from,
    # kept apart from a replica's own waiting requests (which a pod reports over NATS).
    signal_store = store.SignalStore()
    signal_store.put(sink.samples)
    latest = max(s.ts for s in sink.samples)
    signal_store.put([samples.Sample(KEY, vocabulary.Signal.QUEUE_DEPTH, "nats/pod-a",
                                     latest, 3.0)])
    snapshot = signal_store.snapshot(KEY, now=latest, stale_after_s=30)
    assert snapshot.queue_depth is not None and snapshot.queue_depth.value == 10.0
    assert snapshot.shared_waiting is not None and snapshot.shared_waiting.value == 7.0
    polls = source.stats.accepted

    for i in range(20):
        await js.publish(f"requests.{i}", b"work")
    await lag_settles_at(27.0, 2.0)  # 30 published, 1 acked, 2 awaiting ack
    # The first poll after the publishes saw last_seq move by 20 since the poll before.
    rates = [s.value for s in sink.samples if s.signal == "arrival_rate"]
    assert any(rate is not None and rate > 0 for rate in rates)
    assert source.stats.accepted > polls
    assert not source.stats.errors


async def test_missing_consumer_is_counted_not_raised(
    js_client: tuple[Client, JetStreamContext],
    nats_settings: connection.NatsSettings,
    sink: ListSink,
) -> None:
    _, js = js_client
    source = jetstream.JetStreamLagSource(nats_settings, jetstream.JetStreamConfig())
    missing = jetstream.LagTarget(model=KEY, stream="REQUESTS", consumer="nobody")
    await source.poll(js, missing, sink)
    assert sink.samples == []
    assert source.stats.errors == {"NotFoundError": 1}


async def test_run_polls_at_the_interval_until_cancelled(
    js_client: tuple[Client, JetStreamContext],
    nats_settings: connection.NatsSettings,
    sink: ListSink,
    start: Start,
    eventually: Eventually,
) -> None:
    _, js = js_client
    await js.publish("requests.a", b"work")
    config = jetstream.JetStreamConfig(targets=(target(interval_s=0.05),))
    source = jetstream.JetStreamLagSource(nats_settings, config)
    start(source.run(sink))
    # Three polls: the second and third carry an arrival rate.
    await eventually(lambda: source.stats.accepted >= 3)
    assert sink.signals(KEY)["queue_depth"] == 1.0
    assert any(s.signal == "arrival_rate" for s in sink.samples)
    source.configure(jetstream.JetStreamConfig())  # no targets: polling stops
    await asyncio.sleep(0.1)  # a poll already under way may still finish
    polls = source.stats.accepted
    await asyncio.sleep(0.2)  # bounded: four intervals in which nothing may be polled
    assert source.stats.accepted == polls


async def test_polling_resumes_after_a_server_restart(
    nats: nats_server.NatsServer,
    js_client: tuple[Client, JetStreamContext],
    nats_settings: connection.NatsSettings,
    sink: ListSink,
    start: Start,
    eventually: Eventually,
) -> None:
    _, js = js_client
    await js.publish("requests.a", b"work")
    config = jetstream.JetStreamConfig(targets=(target(interval_s=0.05),), timeout_s=0.5)
    source = jetstream.JetStreamLagSource(nats_settings, config)
    start(source.run(sink))
    await eventually(lambda: source.stats.accepted >= 1)
    nats.kill()
    await eventually(lambda: bool(source.stats.errors))  # polls fail while it is down
    nats.start()  # same port and JetStream store: the stream and consumer survive
    await eventually(lambda: source.stats.reconnects == 1, timeout_s=20)
    polls = source.stats.accepted
    await eventually(lambda: source.stats.accepted > polls)
    assert sink.signals(KEY)["queue_depth"] == 1.0
