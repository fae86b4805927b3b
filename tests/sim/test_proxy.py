"""The live loop's proxy: least-outstanding routing, SSE relayed as it is written, requests
held while no backend is ready, and a removed backend drained, on loopback servers."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import aiohttp
from aiohttp import web

from scaler.sim import proxy


class Backend:
    """A loopback server whose /v1/completions streams two SSE events; the second waits
    for `release`, so a test controls how long each request stays outstanding."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.release = asyncio.Event()
        self.seen = 0

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.seen += 1
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                               "X-Backend": self.name})
        await response.prepare(request)
        await response.write(f"data: {self.name}-1\n\n".encode())
        await self.release.wait()
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[str]:
        app = web.Application()
        app.router.add_post("/v1/completions", self.handle)
        runner = web.AppRunner(app, shutdown_timeout=0.5)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        try:
            yield f"http://127.0.0.1:{runner.addresses[0][1]}"
        finally:
            await runner.cleanup()


async def first_event(session: aiohttp.ClientSession, url: str
                      ) -> tuple[aiohttp.ClientResponse, bytes]:
    response = await session.post(f"{url}/v1/completions", json={"prompt": "x"})
    return response, await response.content.readuntil(b"\n\n")


async def test_routes_to_the_least_outstanding_backend_and_streams_each_event_at_once(
) -> None:
    a, b = Backend("a"), Backend("b")
    balancer = proxy.Proxy()
    async with a.serving() as url_a, b.serving() as url_b, \
            proxy.running(balancer) as url, aiohttp.ClientSession() as session:
        balancer.add("a", url_a)
        balancer.add("b", url_b)
        # Each first event arrives while its backend still holds the second: relayed as
        # written, not buffered until the response ends.
        first, event_1 = await first_event(session, url)
        second, event_2 = await first_event(session, url)
        assert (event_1, event_2) == (b"data: a-1\n\n", b"data: b-1\n\n")
        assert first.headers["X-Backend"] == "a" and second.headers["X-Backend"] == "b"
        assert (balancer.outstanding("a"), balancer.outstanding("b")) == (1, 1)
        b.release.set()
        assert await second.content.read() == b"data: [DONE]\n\n"
        await asyncio.sleep(0.05)
        # a has one outstanding, b none: the next goes to b.
        third, event_3 = await first_event(session, url)
        assert event_3 == b"data: b-1\n\n"
        a.release.set()
        assert await first.content.read() == b"data: [DONE]\n\n"
        await third.content.read()
        for response in (first, second, third):
            response.release()


async def test_holds_requests_until_a_backend_is_ready_and_drains_a_removed_one() -> None:
    a = Backend("a")
    balancer = proxy.Proxy(hold_timeout_s=30.0)
    async with a.serving() as url_a, proxy.running(balancer) as url, \
            aiohttp.ClientSession() as session:
        held = asyncio.create_task(first_event(session, url))
        await asyncio.sleep(0.2)
        assert balancer.held == 1 and not held.done()
        balancer.add("a", url_a)
        response, event = await asyncio.wait_for(held, 10.0)
        assert event == b"data: a-1\n\n" and balancer.held == 0
        # Removed while a request is in flight: that one finishes, and is counted until
        # it has; a new one waits (no backend left).
        balancer.remove("a")
        assert balancer.outstanding("a") == 1
        a.release.set()
        assert await response.content.read() == b"data: [DONE]\n\n"
        response.release()
        await asyncio.sleep(0.05)
        assert balancer.outstanding("a") == 0 and a.seen == 1


async def test_answers_503_when_no_backend_comes_within_the_hold_time() -> None:
    balancer = proxy.Proxy(hold_timeout_s=0.2)
    async with proxy.running(balancer) as url, aiohttp.ClientSession() as session:
        async with session.post(f"{url}/v1/completions", json={}) as response:
            assert response.status == 503
            assert "no replica" in (await response.json())["error"]["message"]


def test_the_gateway_message_counts_the_held_requests() -> None:
    balancer = proxy.Proxy()
    balancer.held = 3
    body = balancer.gateway_message(model_key="inference/llama-8b", epoch_s=1_764_400_000.0)
    assert b'"queue_depth":3.0' in body and b'"source":"gateway"' in body
