"""A least-outstanding HTTP proxy in front of sim-server replicas that streams SSE through as is.

It is the Service (kube-proxy) plus the gateway of the simulated cluster
(`scaler.sim.cluster.SimCluster`): a request goes to the ready backend with the fewest
requests outstanding through the proxy (the simulator routes to the least-loaded ready
replica, queued + running, so round robin would be a difference of the live loop, not of
the model), and while no backend is ready it is held, as the simulator's gateway holds
it, for at most `hold_timeout_s`, then answered 503. Response bytes are relayed as they
arrive (`iter_any`), so each SSE event reaches the client when the replica wrote it.

With a NATS client it also publishes the requests it holds as the simulator's gateway
does (DESIGN 4.2, source `gateway`, `queue_depth`). Not the gateway's arrival rate: no
field of a 4.2 message carries one (only JetStream sequence numbers give it), so a
NATS-only deployment has none and the engine estimates it from completions and queues.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web
from nats.aio.client import Client as NatsClient

from scaler.core import vocabulary
from scaler.signals import messages, nats_core
from scaler.sim import feed, server

log = logging.getLogger(__name__)

# Headers that describe one hop, not the message (RFC 9110 7.6.1), plus the length and
# encoding aiohttp sets itself for the relayed body.
HOP_HEADERS = frozenset({"connection", "keep-alive", "proxy-authenticate",
                         "proxy-authorization", "te", "trailer", "transfer-encoding",
                         "upgrade", "content-length", "host"})


@dataclass(slots=True)
class Backend:
    """One replica behind the proxy: its base URL and the requests it has outstanding."""

    name: str
    url: str
    outstanding: int = 0
    served: int = 0


@dataclass(slots=True)
class Proxy:
    """Routes to the least-outstanding ready backend; `add`/`remove` change the set.

    A removed backend takes no new requests; those it has keep streaming (the drain the
    replica controller waits for, `outstanding(name) == 0`).
    """

    hold_timeout_s: float = 300.0
    backends: dict[str, Backend] = field(default_factory=dict)
    held: int = 0
    _draining: dict[str, Backend] = field(default_factory=dict)
    _changed: asyncio.Event = field(default_factory=asyncio.Event)
    _session: aiohttp.ClientSession | None = None

    def add(self, name: str, url: str) -> None:
        self.backends[name] = Backend(name, url.rstrip("/"))
        self._changed.set()

    def remove(self, name: str) -> None:
        """Stop routing to `name`; its outstanding requests go on."""
        backend = self.backends.pop(name, None)
        if backend is not None and backend.outstanding:
            self._draining[name] = backend

    def outstanding(self, name: str) -> int:
        backend = self.backends.get(name) or self._draining.get(name)
        return backend.outstanding if backend is not None else 0

    async def _pick(self) -> Backend | None:
        """The least-outstanding backend (the first added among equals), waiting while
        there is none for at most hold_timeout_s."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.hold_timeout_s
        self.held += 1
        try:
            while not self.backends:
                self._changed.clear()
                left = deadline - loop.time()
                if left <= 0:
                    return None
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), timeout=left)
        finally:
            self.held -= 1
        return min(self.backends.values(), key=lambda b: b.outstanding)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        backend = await self._pick()
        if backend is None:
            return web.json_response({"error": {
                "message": f"no replica became ready within {self.hold_timeout_s:g} s",
                "type": "ServiceUnavailable", "code": 503}}, status=503)
        backend.outstanding += 1
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        response: web.StreamResponse | None = None
        try:
            async with self._session.request(request.method, backend.url + request.path_qs,
                                             data=body, headers=headers) as upstream:
                response = web.StreamResponse(status=upstream.status, headers={
                    k: v for k, v in upstream.headers.items() if k.lower() not in HOP_HEADERS})
                await response.prepare(request)
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
                backend.served += 1
                return response
        except ConnectionResetError as exc:
            # The client went away (a streaming client may close as soon as it has read
            # `data: [DONE]`, before the chunked body's end): nothing left to relay.
            return response if response is not None else _bad_gateway(backend, exc)
        except aiohttp.ClientError as exc:
            log.warning("backend %s failed: %s", backend.name, exc)
            # Mid-answer the client sees the stream cut; before it, a 502. (Not `or`: a
            # StreamResponse is a mapping, falsy while empty.)
            return response if response is not None else _bad_gateway(backend, exc)
        finally:
            backend.outstanding -= 1
            if not backend.outstanding:
                self._draining.pop(backend.name, None)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        return app

    def gateway_message(self, *, model_key: str, epoch_s: float) -> bytes:
        """The gateway's message: the requests held while no backend is ready."""
        namespace, name = server.split_model_key(model_key)
        return messages.encode(
            model=name, namespace=namespace, source=feed.GATEWAY_SOURCE, ts=epoch_s,
            values={vocabulary.Signal.QUEUE_DEPTH: float(self.held)})

    async def publish(self, client: NatsClient, *, model_key: str,
                      interval_s: float = 1.0) -> None:
        """Publish the gateway's message every interval until cancelled."""
        namespace, name = server.split_model_key(model_key)
        subject = nats_core.default_subject(nats_core.DEFAULT_PREFIX, namespace, name)
        while True:
            body = self.gateway_message(model_key=model_key, epoch_s=time.time())
            try:
                await client.publish(subject, body)
            except Exception as exc:  # disconnected: the client reconnects by itself
                log.warning("publish to %s failed: %s", subject, exc)
            await asyncio.sleep(interval_s)


def _bad_gateway(backend: Backend, exc: Exception) -> web.Response:
    return web.json_response({"error": {"message": f"backend {backend.name}: {exc}",
                                        "type": "BadGateway", "code": 502}}, status=502)


@contextlib.asynccontextmanager
async def running(proxy: Proxy, *, host: str = "127.0.0.1", port: int = 0,
                  nats_url: str | None = None, model_key: str | None = None
                  ) -> AsyncIterator[str]:
    """Serve the proxy on host:port (0: a free one) while the block runs; yields its URL.

    With `nats_url` and `model_key` it publishes the gateway's signals too.
    """
    # No connection limit: aiohttp's default of 100 would queue request 101 in the proxy.
    proxy._session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=None),
        auto_decompress=False)
    runner = web.AppRunner(proxy.app(), handle_signals=False, shutdown_timeout=1.0)
    await runner.setup()
    client: NatsClient | None = None
    task: asyncio.Task[None] | None = None
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound = int(runner.addresses[0][1])
        if nats_url is not None and model_key is not None:
            client = NatsClient()
            await client.connect(servers=[nats_url], connect_timeout=5,
                                 max_reconnect_attempts=-1, reconnect_time_wait=1)
            task = asyncio.create_task(proxy.publish(client, model_key=model_key),
                                       name="proxy-gateway-signals")
        yield f"http://{host}:{bound}"
    finally:
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await runner.cleanup()
        await proxy._session.close()
        if client is not None:
            await client.close()
