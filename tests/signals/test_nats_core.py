"""NATS core source against a real nats-server: routing, drops, auth, restart and reconnect."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client

from scaler.core import backoff as core_backoff
from scaler.policy import model as policy_model
from scaler.signals import connection, messages, nats_core, store
from scaler.testing import nats_server

from .conftest import Eventually, ListSink, Start

SUBJECT = "scaler.signals.inference.llama-70b"
KEY = "inference/llama-70b"


def policy(name: str, namespace: str = "inference", **sources: object) -> policy_model.ScalePolicy:
    return policy_model.ScalePolicy.model_validate(
        {
            "apiVersion": "scaler.io/v1alpha1",
            "kind": "ScalePolicy",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "target": {"name": name},
                "replicas": {"max": 4},
                "signals": {"concurrency": {"targetPerReplica": 8}},
                "sources": sources,
            },
        }
    )


@pytest.fixture
async def publisher(nats: nats_server.NatsServer) -> AsyncIterator[Client]:
    """A plain client that publishes, as a model server would."""
    client = await nats_connect(nats.url)
    yield client
    await client.close()


async def nats_connect(url: str) -> Client:
    client: Client = await nats.connect(url, allow_reconnect=False)
    return client


def message(model: str = "llama-70b", **fields: object) -> bytes:
    body: dict[str, object] = {"v": 1, "model": model, "namespace": "inference",
                               "ts": time.time()}
    body.update(fields)
    return json.dumps(body).encode()


def test_config_from_policies_uses_default_and_custom_subjects() -> None:
    config = nats_core.config_from_policies(
        [
            policy("llama-70b"),
            policy("mistral", nats={"subject": "teams.search.mistral"}),
            policy("quiet", nats=None),
        ]
    )
    assert dict(config.routes) == {
        SUBJECT: KEY,
        "teams.search.mistral": "inference/mistral",
    }
    assert config.subjects() == {SUBJECT, "teams.search.mistral"}
    wildcard = nats_core.config_from_policies([policy("llama-70b")], wildcard=True)
    assert wildcard.subjects() == {"scaler.signals.>"}


@pytest.mark.parametrize(
    ("subject", "expected"),
    [
        (SUBJECT, KEY),
        ("scaler.signals.other.model", "other/model"),
        # The subject names the model exactly: extra or missing tokens reach no model.
        ("scaler.signals.inference.llama-70b.extra", None),
        ("scaler.signals.too.many.parts", None),
        ("scaler.signals.onlyone", None),
        ("elsewhere.x", None),
    ],
)
def test_route_for_subject(subject: str, expected: str | None) -> None:
    config = nats_core.NatsCoreConfig(routes={SUBJECT: KEY}, wildcard=True)
    route = nats_core.route_for(subject, config)
    if expected is None:
        assert isinstance(route, messages.Drop) and route.reason == "subject_mismatch"
        return
    assert isinstance(route, messages.Route)
    assert route.expected == expected
    assert route.models == {KEY: 30.0}


async def test_published_messages_reach_the_store(
    nats_settings: connection.NatsSettings,
    publisher: Client,
    start: Start,
    eventually: Eventually,
) -> None:
    signal_store = store.SignalStore()
    arrived = asyncio.Event()
    signal_store.add_listener(lambda key: arrived.set())
    source = nats_core.NatsCoreSource(
        nats_settings, nats_core.config_from_policies([policy("llama-70b")])
    )
    start(source.run(signal_store))
    await asyncio.wait_for(source.wait_ready(), 10)

    await publisher.publish(SUBJECT, message(source="pod-a", queue_depth=3, in_flight=8))
    await publisher.publish(SUBJECT, message(source="pod-b", queue_depth=4, in_flight=2))
    await connection.barrier(publisher)
    await eventually(lambda: source.stats.accepted == 2)
    assert arrived.is_set()
    snapshot = signal_store.snapshot(KEY, now=time.time(), stale_after_s=30)
    assert snapshot.queue_depth is not None and snapshot.queue_depth.value == 7
    assert snapshot.in_flight is not None and snapshot.in_flight.value == 10
    assert snapshot.queue_depth.sources == 2


async def test_bad_messages_are_dropped_and_counted_over_the_wire(
    nats_settings: connection.NatsSettings,
    publisher: Client,
    start: Start,
    sink: ListSink,
    eventually: Eventually,
) -> None:
    source = nats_core.NatsCoreSource(
        nats_settings, nats_core.config_from_policies([policy("llama-70b")])
    )
    start(source.run(sink))
    await asyncio.wait_for(source.wait_ready(), 10)
    bad = [
        b"not json",
        json.dumps({"v": 1, "model": "llama-70b"}).encode(),
        message(ts=time.time() + 3600),
        message(ts=time.time() - 3600),
        message(pad="x" * (70 * 1024)),
        message(model="mistral"),
    ]
    for data in bad:
        await publisher.publish(SUBJECT, data)
    await publisher.publish(SUBJECT, message(queue_depth=1))
    await connection.barrier(publisher)
    await eventually(lambda: source.stats.accepted + source.stats.dropped_total == len(bad) + 1)
    assert source.stats.dropped == {
        "malformed_json": 1, "schema": 1, "future_dated": 1, "stale": 1, "oversized": 1,
        "subject_mismatch": 1,
    }
    assert [s.value for s in sink.samples] == [1.0]


async def test_wildcard_subscription_routes_by_subject(
    nats_settings: connection.NatsSettings,
    publisher: Client,
    start: Start,
    sink: ListSink,
    eventually: Eventually,
) -> None:
    config = nats_core.config_from_policies(
        [policy("llama-70b"), policy("mistral", namespace="search")], wildcard=True
    )
    source = nats_core.NatsCoreSource(nats_settings, config)
    start(source.run(sink))
    await asyncio.wait_for(source.wait_ready(), 10)
    await publisher.publish(SUBJECT, message(queue_depth=1))
    await publisher.publish("scaler.signals.search.mistral",
                            json.dumps({"v": 1, "model": "mistral", "ts": time.time(),
                                        "queue_depth": 2}).encode())
    await publisher.publish("scaler.signals.other.unknown",
                            json.dumps({"v": 1, "model": "unknown", "ts": time.time(),
                                        "queue_depth": 3}).encode())
    await connection.barrier(publisher)
    await eventually(lambda: source.stats.accepted + source.stats.dropped_total == 3)
    assert {(s.model, s.value) for s in sink.samples} == {(KEY, 1.0), ("search/mistral", 2.0)}
    assert source.stats.dropped == {"unknown_model": 1}


async def test_update_changes_subscriptions(
    nats_settings: connection.NatsSettings,
    publisher: Client,
    start: Start,
    sink: ListSink,
    eventually: Eventually,
) -> None:
    source = nats_core.NatsCoreSource(nats_settings, nats_core.NatsCoreConfig())
    start(source.run(sink))
    await asyncio.wait_for(source.wait_ready(), 10)
    await source.configure(nats_core.config_from_policies([policy("llama-70b")]))
    await publisher.publish(SUBJECT, message(queue_depth=5))
    await connection.barrier(publisher)
    await eventually(lambda: len(sink.samples) == 1)
    # update() returns once the server has processed the UNSUB, and the publisher's
    # barrier once it has processed the PUB: this message has no subscriber; the next
    # one, after subscribing again, does.
    await source.configure(nats_core.NatsCoreConfig())
    await publisher.publish(SUBJECT, message(queue_depth=6))
    await connection.barrier(publisher)
    await source.configure(nats_core.config_from_policies([policy("llama-70b")]))
    await publisher.publish(SUBJECT, message(queue_depth=7))
    await connection.barrier(publisher)
    await eventually(lambda: len(sink.samples) == 2)
    assert [s.value for s in sink.samples] == [5.0, 7.0]


async def test_restart_of_the_server_loses_no_subscription(
    nats: nats_server.NatsServer,
    nats_settings: connection.NatsSettings,
    start: Start,
    sink: ListSink,
    eventually: Eventually,
) -> None:
    config = nats_core.config_from_policies(
        [policy("llama-70b"), policy("mistral")], wildcard=False
    )
    source = nats_core.NatsCoreSource(nats_settings, config)
    start(source.run(sink))
    await asyncio.wait_for(source.wait_ready(), 10)

    for restart in range(2):
        nats.kill()  # a crash, not a clean shutdown
        await asyncio.sleep(0.2)
        nats.start()
        await eventually(lambda r=restart: source.stats.reconnects == r + 1, timeout_s=20)
        publisher = await nats_connect(nats.url)
        try:
            for model in ("llama-70b", "mistral"):
                await publisher.publish(
                    f"scaler.signals.inference.{model}", message(model, queue_depth=restart)
                )
            await connection.barrier(publisher)
        finally:
            await publisher.close()
        await eventually(lambda r=restart: len(sink.samples) == 2 * (r + 1))
    assert {(s.model, s.value) for s in sink.samples[-2:]} == {
        (KEY, 1.0), ("inference/mistral", 1.0)
    }
    assert source.stats.errors  # the lost connection was counted


async def test_first_connection_waits_for_the_server(
    start: Start, sink: ListSink, eventually: Eventually
) -> None:
    server = nats_server.NatsServer(jetstream=False)
    try:
        settings = connection.NatsSettings(
            servers=(server.url,), reconnect=core_backoff.Backoff(base_delay_s=0.05))
        source = nats_core.NatsCoreSource(
            settings, nats_core.config_from_policies([policy("llama-70b")])
        )
        start(source.run(sink))
        await asyncio.sleep(0.3)
        assert not source.connected
        server.start()
        await asyncio.wait_for(source.wait_ready(), 15)
        publisher = await nats_connect(server.url)
        await publisher.publish(SUBJECT, message(queue_depth=2))
        await connection.barrier(publisher)
        await publisher.close()
        await eventually(lambda: len(sink.samples) == 1)
    finally:
        server.close()


@pytest.mark.parametrize(
    ("server_auth", "client_auth"),
    [
        ({"token": "s3cret"}, {"token": "s3cret"}),
        ({"user": "scaler", "password": "pw"}, {"user": "scaler", "password": "pw"}),
    ],
)
async def test_authenticated_connections(
    server_auth: dict[str, str],
    client_auth: dict[str, str],
    start: Start,
    sink: ListSink,
    eventually: Eventually,
) -> None:
    with nats_server.NatsServer(jetstream=False, **server_auth) as server:
        settings = connection.NatsSettings.model_validate(
            {"servers": (server.url,), **client_auth}
        )
        source = nats_core.NatsCoreSource(
            settings, nats_core.config_from_policies([policy("llama-70b")])
        )
        start(source.run(sink))
        await asyncio.wait_for(source.wait_ready(), 10)
        url = server.url.replace("nats://", "nats://" + _userinfo(server_auth))
        publisher = await nats_connect(url)
        await publisher.publish(SUBJECT, message(queue_depth=4))
        await connection.barrier(publisher)
        await publisher.close()
        await eventually(lambda: len(sink.samples) == 1)


def _userinfo(auth: dict[str, str]) -> str:
    if "token" in auth:
        return f"{auth['token']}@"
    return f"{auth['user']}:{auth['password']}@"


async def test_wrong_credentials_are_retried_not_raised(
    start: Start, sink: ListSink, eventually: Eventually
) -> None:
    with nats_server.NatsServer(jetstream=False, token="right") as server:
        settings = connection.NatsSettings(servers=(server.url,), token="wrong")
        source = nats_core.NatsCoreSource(settings, nats_core.NatsCoreConfig())
        task = start(source.run(sink))
        await eventually(lambda: bool(source.stats.errors))
        assert not task.done()
        assert not source.connected


def test_settings_reject_two_auth_methods() -> None:
    with pytest.raises(ValueError, match="one NATS auth method"):
        connection.NatsSettings(token="t", user="u", password="p")
    with pytest.raises(ValueError, match="go together"):
        connection.NatsSettings(user="u")


async def test_nkey_authentication(
    tmp_path: Path, start: Start, sink: ListSink, eventually: Eventually
) -> None:
    nkeys = pytest.importorskip("nkeys", reason="NKey auth needs the nkeys package")
    seed = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)
    public = nkeys.from_seed(bytearray(seed)).public_key.decode()
    (tmp_path / "user.nk").write_bytes(seed)
    users = f'authorization {{ users = [ {{ nkey: "{public}" }} ] }}\n'
    (tmp_path / "server.conf").write_text(users)
    server = nats_server.NatsServer(jetstream=False,
                                    extra_args=("-c", str(tmp_path / "server.conf")))
    with server:
        settings = connection.NatsSettings(servers=(server.url,),
                                           nkey_seed_file=tmp_path / "user.nk")
        source = nats_core.NatsCoreSource(
            settings, nats_core.config_from_policies([policy("llama-70b")])
        )
        start(source.run(sink))
        await asyncio.wait_for(source.wait_ready(), 10)
        publisher = await nats.connect(server.url, nkeys_seed=str(tmp_path / "user.nk"),
                                       allow_reconnect=False)
        await publisher.publish(SUBJECT, message(queue_depth=6))
        await connection.barrier(publisher)
        await publisher.close()
        await eventually(lambda: len(sink.samples) == 1)
