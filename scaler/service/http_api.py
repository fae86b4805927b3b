"""The plain HTTP app: /metrics, /healthz, /readyz and the /v1 decision API."""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Callable, Iterable
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from scaler.service import explain, observability
from scaler.service import history as decision_history
from scaler.service import state as service_state
from scaler.signals import samples

# GET .../history?limit=N: at most every entry one model can hold, so no request makes
# the service render more than the ring keeps (356 entries, about 200 KB of JSON).
HISTORY_LIMIT_MAX = decision_history.MAX_SCALE_EVENTS + decision_history.MAX_DECISIONS
HISTORY_LIMIT_DEFAULT = 20
# /metrics compressed for a scraper that asks (Prometheus sends `Accept-Encoding: gzip`):
# level 1, not zlib's default 6, since the text is repetitive enough that the fastest
# level already divides it by about 18 (the bench's 3.1 MiB at 1,000 models: 184 KB in
# 7 ms of CPU; level 6 gives 148 KB in 26 ms).
GZIP_LEVEL = 1
GZIP_WBITS = 16 + zlib.MAX_WBITS  # zlib's gzip container (Content-Encoding: gzip)


def _error(status: int, message: str, **extra: Any) -> web.Response:
    return web.json_response({"error": message, **extra}, status=status)


class HttpApi:
    """Routes over the service state; `extra_routes` lets other parts (signal push) join."""

    def __init__(
        self,
        state: service_state.ServiceState,
        *,
        registry: CollectorRegistry,
        extra_routes: Iterable[web.RouteDef] = (),
        clock: Callable[[], float] = samples.wall_clock,
    ) -> None:
        """`clock`: wall time in epoch seconds, against which signal silence is judged."""
        self._state = state
        self._registry = registry
        self._clock = clock
        self._extra = list(extra_routes)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/v1/models/{namespace}/{model}/decision", self._decision)
        app.router.add_get("/v1/models/{model}/decision", self._decision_by_name)
        app.router.add_get("/v1/models/{namespace}/{model}/history", self._history)
        app.router.add_get("/v1/models/{model}/history", self._history_by_name)
        app.router.add_routes(self._extra)
        return app

    async def _metrics(self, request: web.Request) -> web.StreamResponse:
        registry = self._registry
        if isinstance(registry, observability.ServiceRegistry):
            parts = await registry.exposition()  # lets the loop run while it writes
        else:
            parts = [generate_latest(registry)]
        response = web.StreamResponse(headers={"Vary": "Accept-Encoding"})
        # CONTENT_TYPE_LATEST carries a charset parameter, which aiohttp wants separately.
        content_type, _, charset = CONTENT_TYPE_LATEST.partition("; charset=")
        response.content_type = content_type
        response.charset = charset or None
        compressor = None
        if accepts_gzip(request.headers.get("Accept-Encoding", "")):
            response.headers["Content-Encoding"] = "gzip"  # sent chunked
            compressor = gzip_compressor()
        else:
            response.content_length = sum(len(part) for part in parts)
        await response.prepare(request)
        loop = asyncio.get_running_loop()
        for part in parts:
            if compressor is not None:
                # In a worker thread, one part at a time: zlib lets go of the GIL while
                # it compresses (86 ms of CPU for 10,000 bench models' 32.3 MiB).
                part = await loop.run_in_executor(None, compressor.compress, part)
            await response.write(part)
        if compressor is not None:
            await response.write(compressor.flush())
        await response.write_eof()
        return response

    async def _healthz(self, request: web.Request) -> web.Response:
        # Alive means the event loop answers; readiness is the stricter check.
        return web.Response(text="ok")

    async def _readyz(self, request: web.Request) -> web.Response:
        if not self._state.ready:
            return web.Response(status=503, text="not ready: "
                                + "; ".join(self._state.not_ready_reasons()))
        # Degraded is still ready (200): silent publishers are outside this pod, every
        # replica sees the same silence, and taking the pods out of their Service would
        # also cut off HTTP push and the metrics API through which signals come back.
        silent = self._state.silent_models(self._clock())
        if silent:
            return web.Response(text="degraded: " + "; ".join(str(each) for each in silent))
        return web.Response(text="ok")

    async def _models(self, request: web.Request) -> web.Response:
        models = []
        for status in self._state.statuses():
            last = status.last
            models.append({
                "model": status.key,
                "summary": None if last is None else last.decision.summary,
                "at": None if last is None else last.at,
            })
        return web.json_response({"models": models})

    def _answer(self, status: service_state.ModelStatus) -> web.Response:
        if status.last is None:
            return _error(404, f"{status.key} has no decision yet", model=status.key)
        return web.json_response(explain.decision_document(status, status.last))

    def _by_key(self, request: web.Request) -> service_state.ModelStatus | web.Response:
        key = f"{request.match_info['namespace']}/{request.match_info['model']}"
        status = self._state.status(key)
        if status is None:
            return self._elsewhere([key]) or _error(404, f"no policy for model {key}")
        return status

    def _by_name(self, request: web.Request) -> service_state.ModelStatus | web.Response:
        name = request.match_info["model"]
        found = self._state.find_by_name(name)
        if not found:
            return self._elsewhere([key for key in self._state.shard_of
                                    if key.partition("/")[2] == name]) or _error(
                404, f"no policy for model {name!r} in any namespace")
        if len(found) > 1:
            keys = sorted(status.key for status in found)
            return _error(409, f"model {name!r} is in several namespaces; ask for one of "
                          + ", ".join(keys), candidates=keys)
        return found[0]

    def _elsewhere(self, keys: list[str]) -> web.Response | None:
        """With several shards: a 404 that says which shard evaluates the model asked for
        (`scaler explain` then names the pods to ask); None when no other shard does."""
        shard_of = self._state.shard_of
        elsewhere = sorted((key, shard_of[key]) for key in keys if key in shard_of)
        if not elsewhere:
            return None
        where = ", ".join(f"{key} by shard {shard}" for key, shard in elsewhere)
        return _error(404, f"evaluated by another shard: {where} (this is shard "
                      f"{self._state.shard}); ask a pod of that shard",
                      shards={key: shard for key, shard in elsewhere})

    async def _decision(self, request: web.Request) -> web.Response:
        found = self._by_key(request)
        return found if isinstance(found, web.Response) else self._answer(found)

    async def _decision_by_name(self, request: web.Request) -> web.Response:
        found = self._by_name(request)
        return found if isinstance(found, web.Response) else self._answer(found)

    def _history_answer(self, request: web.Request,
                        found: service_state.ModelStatus | web.Response) -> web.Response:
        if isinstance(found, web.Response):
            return found
        text = request.query.get("limit", str(HISTORY_LIMIT_DEFAULT))
        limit = int(text) if text.isdigit() else 0
        if not 1 <= limit <= HISTORY_LIMIT_MAX:
            return _error(400, f"limit: expected a whole number from 1 to "
                          f"{HISTORY_LIMIT_MAX}, got {text[:20]!r}")
        entries = self._state.history(found.key) or []
        return web.json_response(explain.history_document(
            found.key, entries[-limit:], now=self._clock(), kept=len(entries)))

    async def _history(self, request: web.Request) -> web.Response:
        return self._history_answer(request, self._by_key(request))

    async def _history_by_name(self, request: web.Request) -> web.Response:
        return self._history_answer(request, self._by_name(request))


def accepts_gzip(accept_encoding: str) -> bool:
    """Whether an Accept-Encoding header takes gzip (RFC 9110 12.5.3): by name, else by
    `*`, with a weight above 0 (absent: 1; malformed: 0, so the answer is uncompressed,
    which is always allowed)."""
    weights: dict[str, float] = {}
    for item in accept_encoding.split(","):
        coding, *parameters = (part.strip() for part in item.split(";"))
        weight = 1.0
        for parameter in parameters:
            name, _, text = parameter.partition("=")
            if name.strip().lower() == "q":
                try:
                    weight = float(text)
                except ValueError:
                    weight = 0.0
        weights.setdefault(coding.lower(), weight)
    return weights.get("gzip", weights.get("*", 0.0)) > 0


def gzip_compressor() -> zlib._Compress:
    """The gzip stream /metrics sends to a scraper that accepts it, a part at a time."""
    return zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, GZIP_WBITS)


def decision_url(base_url: str, model: str, namespace: str | None, *,
                 endpoint: str = "decision") -> str:
    """The /v1 URL for `model` ('name' or 'namespace/name') on the service at base_url;
    `endpoint` 'history' for its history (add `?limit=N`)."""
    if "/" in model and namespace is None:
        namespace, _, model = model.partition("/")
    base = base_url.rstrip("/")
    if namespace:
        return f"{base}/v1/models/{namespace}/{model}/{endpoint}"
    return f"{base}/v1/models/{model}/{endpoint}"

