"""HTTP push: POST /v1/signals with the NATS message contract, one object or a list."""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Final

from aiohttp import web

from scaler.policy import model as policy_model
from scaler.signals import messages, samples

log = logging.getLogger(__name__)

PATH: Final = "/v1/signals"


@dataclass(frozen=True, slots=True)
class HttpPushConfig:
    """The endpoint's rules.

    token: the bearer token callers must send; None leaves the endpoint open (local
      development only: anyone who can reach it could then scale models).
    max_body_bytes: 1 MiB = 16 contract-sized messages, or ~5,000 typical 200-byte ones.
    max_items: messages per request.
    known: model key -> its policy's staleAfterSeconds, for the models with a policy
      (None = accept any model, stale after the limits' max_age_s).
    """

    token: str | None = field(default=None, repr=False)
    max_body_bytes: int = 1024 * 1024
    max_items: int = 1000
    limits: messages.Limits = messages.DEFAULT_LIMITS
    known: Mapping[str, float] | None = None


class HttpPushSource:
    """The POST /v1/signals handler as a signal source; counters in `stats`.

    It has no connection of its own: `mount` puts the handler on the service's HTTP app,
    and `run` hands it the sink (until then a push is answered 503).
    """

    def __init__(
        self,
        config: HttpPushConfig,
        *,
        sink: samples.SampleSink | None = None,
        clock: samples.Clock = samples.wall_clock,
    ) -> None:
        self.config = config
        self.stats = samples.SourceStats()
        self._sink = sink
        self._clock = clock

    @property
    def name(self) -> str:
        return "http"

    def mount(self, app: web.Application) -> None:
        app.router.add_post(PATH, self.handle)

    async def run(self, sink: samples.SampleSink) -> None:
        self._sink = sink
        try:
            await asyncio.Future()  # until cancelled
        finally:
            self._sink = None

    async def update(self, policies: Sequence[policy_model.ScalePolicy]) -> None:
        """Accept pushes for the policies in force, each with its own stale limit."""
        self.configure(replace(self.config, known={
            policy.key: policy.spec.stale_after_seconds for policy in policies}))

    def configure(self, config: HttpPushConfig) -> None:
        self.config = config

    async def wait_ready(self) -> None:
        """Polled (or pushed to): nothing to wait for."""

    async def close(self) -> None:
        """Nothing to release: the HTTP server belongs to the service."""

    def _authorized(self, request: web.Request) -> bool:
        token = self.config.token
        if token is None:
            return True
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        # Constant-time comparison: the token must not leak through response timing.
        return scheme.lower() == "bearer" and hmac.compare_digest(
            given.strip().encode(), token.encode()
        )

    async def _read_body(self, request: web.Request) -> bytes | None:
        """The body, or None when it is larger than max_body_bytes (read no further)."""
        limit = self.config.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            return None
        chunks: list[bytes] = []
        size = 0
        while True:
            chunk = await request.content.read(64 * 1024)
            if not chunk:
                return b"".join(chunks)
            size += len(chunk)
            if size > limit:
                return None
            chunks.append(chunk)

    async def handle(self, request: web.Request) -> web.Response:
        sink = self._sink
        if sink is None:
            return web.json_response({"error": "not_ready"}, status=503)
        if not self._authorized(request):
            self.stats.error("unauthorized")
            return web.json_response(
                {"error": "unauthorized"},
                status=401,
                headers={"WWW-Authenticate": 'Bearer realm="scaler"'},
            )
        body = await self._read_body(request)
        if body is None:
            self.stats.drop(messages.DropReason.OVERSIZED)
            return web.json_response(
                {"error": "oversized", "max_bytes": self.config.max_body_bytes}, status=413
            )
        try:
            decoded = json.loads(body)
        except (ValueError, RecursionError) as exc:  # JSONDecodeError, bad UTF-8
            self.stats.drop(messages.DropReason.MALFORMED_JSON)
            return web.json_response(
                {"error": messages.DropReason.MALFORMED_JSON, "detail": str(exc)[:200]}, status=400
            )
        items = decoded if isinstance(decoded, list) else [decoded]
        if not isinstance(decoded, list | dict):
            self.stats.drop(messages.DropReason.SCHEMA)
            return web.json_response(
                {"error": messages.DropReason.SCHEMA, "detail": "expected an object or a list"},
                status=400,
            )
        if len(items) > self.config.max_items:
            self.stats.drop(messages.DropReason.OVERSIZED)
            return web.json_response(
                {"error": "too_many_items", "max_items": self.config.max_items}, status=413
            )
        now = self._clock()
        route = messages.Route(models=self.config.known)
        accepted = 0
        errors: list[dict[str, object]] = []
        batch: list[samples.Sample] = []
        for index, item in enumerate(items):
            result = messages.parse_item(
                item, now=now, limits=self.config.limits, route=route, transport="http"
            )
            if isinstance(result, messages.Drop):
                errors.append({"index": index, "reason": result.reason, "detail": result.detail})
            else:
                accepted += 1
            batch.extend(messages.tally(self.stats, result))
        if batch:
            sink.put(batch)
        return web.json_response({"accepted": accepted, "errors": errors}, status=202)


def add_routes(
    app: web.Application,
    *,
    sink: samples.SampleSink,
    config: HttpPushConfig,
    clock: samples.Clock = samples.wall_clock,
) -> HttpPushSource:
    """Mount POST /v1/signals on `app` with a sink already given (tests, benchmarks)."""
    source = HttpPushSource(config, sink=sink, clock=clock)
    source.mount(app)
    return source
