"""HTTP push: POST /v1/signals with the NATS message contract, one object or a list."""

from __future__ import annotations

import hmac
import json
import logging
from dataclasses import dataclass, field
from typing import Final

from aiohttp import web

from scaler.signals import base, messages

log = logging.getLogger(__name__)

PATH: Final = "/v1/signals"


@dataclass(frozen=True, slots=True)
class HttpPushConfig:
    """The endpoint's rules.

    token: the bearer token callers must send; None leaves the endpoint open (local
      development only: anyone who can reach it could then scale models).
    max_body_bytes: 1 MiB = 16 contract-sized messages, or ~5,000 typical 200-byte ones.
    max_items: messages per request.
    known: model keys with a policy (None = accept any model).
    """

    token: str | None = field(default=None, repr=False)
    max_body_bytes: int = 1024 * 1024
    max_items: int = 1000
    limits: messages.Limits = messages.DEFAULT_LIMITS
    known: frozenset[str] | None = None


class HttpPushEndpoint:
    """The POST /v1/signals handler; counters in `stats`, config replaced by `update`."""

    def __init__(
        self,
        config: HttpPushConfig,
        *,
        sink: base.SampleSink,
        clock: base.Clock = base.wall_clock,
    ) -> None:
        self.config = config
        self.stats = base.SourceStats()
        self._sink = sink
        self._clock = clock

    @property
    def name(self) -> str:
        return "http"

    def update(self, config: HttpPushConfig) -> None:
        self.config = config

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
        if not self._authorized(request):
            self.stats.error("unauthorized")
            return web.json_response(
                {"error": "unauthorized"},
                status=401,
                headers={"WWW-Authenticate": 'Bearer realm="scaler"'},
            )
        body = await self._read_body(request)
        if body is None:
            self.stats.drop(messages.OVERSIZED)
            return web.json_response(
                {"error": "oversized", "max_bytes": self.config.max_body_bytes}, status=413
            )
        try:
            decoded = json.loads(body)
        except (ValueError, RecursionError) as exc:  # JSONDecodeError, bad UTF-8
            self.stats.drop(messages.MALFORMED_JSON)
            return web.json_response(
                {"error": messages.MALFORMED_JSON, "detail": str(exc)[:200]}, status=400
            )
        items = decoded if isinstance(decoded, list) else [decoded]
        if not isinstance(decoded, list | dict):
            self.stats.drop(messages.SCHEMA)
            return web.json_response(
                {"error": messages.SCHEMA, "detail": "expected an object or a list"}, status=400
            )
        if len(items) > self.config.max_items:
            self.stats.drop(messages.OVERSIZED)
            return web.json_response(
                {"error": "too_many_items", "max_items": self.config.max_items}, status=413
            )
        now = self._clock()
        route = messages.Route(known=self.config.known)
        accepted = 0
        errors: list[dict[str, object]] = []
        samples: list[base.Sample] = []
        for index, item in enumerate(items):
            result = messages.parse_item(
                item, now=now, limits=self.config.limits, route=route, transport="http"
            )
            if isinstance(result, messages.Drop):
                errors.append({"index": index, "reason": result.reason, "detail": result.detail})
            else:
                accepted += 1
            samples.extend(messages.tally(self.stats, result))
        if samples:
            self._sink.put(samples)
        return web.json_response({"accepted": accepted, "errors": errors}, status=202)


def add_routes(
    app: web.Application,
    *,
    sink: base.SampleSink,
    config: HttpPushConfig,
    clock: base.Clock = base.wall_clock,
) -> HttpPushEndpoint:
    """Mount POST /v1/signals on `app` (the service's aiohttp app); returns the endpoint."""
    endpoint = HttpPushEndpoint(config, sink=sink, clock=clock)
    app.router.add_post(PATH, endpoint.handle)
    return endpoint
