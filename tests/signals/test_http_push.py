"""POST /v1/signals on a real aiohttp server on loopback."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
import pytest
from aiohttp import web

from scaler.core import vocabulary
from scaler.signals import http_push, store

NOW = 1_764_410_000.0
TOKEN = "push-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@dataclass
class Endpoint:
    url: str
    endpoint: http_push.HttpPushSource
    store: store.SignalStore
    session: aiohttp.ClientSession


@pytest.fixture
async def server() -> AsyncIterator[Endpoint]:
    signal_store = store.SignalStore()
    app = web.Application()
    config = http_push.HttpPushConfig(
        token=TOKEN, max_body_bytes=8 * 1024, max_items=5,
        known={"inference/llama-70b": 30.0, "default/m": 30.0},
    )
    endpoint = http_push.add_routes(app, sink=signal_store, config=config, clock=lambda: NOW)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    session = aiohttp.ClientSession()
    try:
        yield Endpoint(f"http://127.0.0.1:{port}{http_push.PATH}", endpoint, signal_store,
                       session)
    finally:
        await session.close()
        await runner.cleanup()


def item(**fields: object) -> dict[str, object]:
    body: dict[str, object] = {"v": 1, "model": "llama-70b", "namespace": "inference",
                               "ts": NOW}
    body.update(fields)
    return body


async def test_one_object_is_accepted(server: Endpoint) -> None:
    async with server.session.post(server.url, json=item(source="gw", queue_depth=4),
                                   headers=AUTH) as response:
        assert response.status == 202
        assert await response.json() == {"accepted": 1, "errors": []}
    value = server.store.value("inference/llama-70b", vocabulary.Signal.QUEUE_DEPTH, now=NOW,
                               stale_after_s=30)
    assert value is not None and value.value == 4


async def test_a_list_reports_per_item_errors(server: Endpoint) -> None:
    items = [
        item(source="a", queue_depth=1),
        item(source="b", queue_depth=-1),
        item(source="c", ts=NOW + 600),
        {"v": 1, "model": "stranger", "ts": NOW},
        item(source="d", in_flight=2),
    ]
    async with server.session.post(server.url, json=items, headers=AUTH) as response:
        assert response.status == 202
        body = await response.json()
    assert body["accepted"] == 2
    assert [(e["index"], e["reason"]) for e in body["errors"]] == [
        (1, "schema"), (2, "future_dated"), (3, "unknown_model")
    ]
    assert server.endpoint.stats.accepted == 2
    assert server.endpoint.stats.dropped == {"schema": 1, "future_dated": 1, "unknown_model": 1}
    snapshot = server.store.snapshot("inference/llama-70b", now=NOW, stale_after_s=30)
    assert snapshot.queue_depth is not None and snapshot.queue_depth.value == 1
    assert snapshot.in_flight is not None and snapshot.in_flight.value == 2


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"},
     {"Authorization": TOKEN}],
)
async def test_missing_or_wrong_token_is_401(server: Endpoint, headers: dict[str, str]) -> None:
    async with server.session.post(server.url, json=item(queue_depth=1),
                                   headers=headers) as response:
        assert response.status == 401
        assert response.headers["WWW-Authenticate"].startswith("Bearer")
    assert server.store.models() == ()


@pytest.mark.parametrize(
    ("data", "status", "error"),
    [
        (b"{not json", 400, "malformed_json"),
        (b'"a string"', 400, "schema"),
        (json.dumps([item()] * 6).encode(), 413, "too_many_items"),
        (json.dumps(item(pad="x" * 10_000)).encode(), 413, "oversized"),
    ],
)
async def test_bad_bodies(server: Endpoint, data: bytes, status: int, error: str) -> None:
    headers = {**AUTH, "Content-Type": "application/json"}
    async with server.session.post(server.url, data=data, headers=headers) as response:
        assert response.status == status
        assert (await response.json())["error"] == error


async def test_oversized_chunked_body_is_cut_off(server: Endpoint) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(20):  # 20 KiB, no Content-Length: the limit is enforced while reading
            yield b" " * 1024

    async with server.session.post(server.url, data=chunks(), headers=AUTH) as response:
        assert response.status == 413


async def test_open_endpoint_without_token() -> None:
    app = web.Application()
    signal_store = store.SignalStore()
    http_push.add_routes(app, sink=signal_store, config=http_push.HttpPushConfig(),
                         clock=lambda: NOW)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        url = f"http://127.0.0.1:{runner.addresses[0][1]}{http_push.PATH}"
        async with aiohttp.ClientSession() as session:
            async with session.post(url, json=item(queue_depth=2)) as response:
                assert response.status == 202
    finally:
        await runner.cleanup()
    assert signal_store.models() == ("inference/llama-70b",)
