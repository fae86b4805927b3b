"""An aiohttp server that speaks the Kubernetes API wire protocol on loopback, for tests."""

from __future__ import annotations

import asyncio
import copy
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from scaler.actuators import selectors
from scaler.emulator import patch as patching
from scaler.emulator import reviews
from scaler.emulator.store import (
    DEFAULT_TYPES,
    Obj,
    ResourceType,
    Store,
    StoreError,
    get_path,
    set_path,
)

Verb = str  # get, list, watch, create, update, patch, delete


@dataclass(slots=True)
class Fault:
    """Make the next `times` requests matching `verb` and `path` (a regex searched in the
    URL path) misbehave: wait `delay_s`, then answer `status` (with `Retry-After` when set),
    or, for watches with `drop_watch`, cut the connection after the initial events.
    """

    verb: Verb = "*"
    path: str = ""
    status: int | None = None
    retry_after: int | None = None
    delay_s: float = 0.0
    drop_watch: bool = False
    times: int = 1
    message: str = "injected fault"

    def matches(self, verb: Verb, path: str) -> bool:
        return (self.times > 0 and self.verb in ("*", verb)
                and re.search(self.path, path) is not None)


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One request the emulator answered, for assertions (`PATCH .../scale` counts)."""

    method: str
    path: str
    verb: Verb
    query: dict[str, str]
    content_type: str
    status: int
    body: Any = None


@dataclass(slots=True)
class _Route:
    rtype: ResourceType
    namespace: str | None
    name: str | None
    subresource: str | None


def _flag(value: str | None) -> bool:
    """A boolean query parameter as Go's strconv.ParseBool reads it (1, t, true, True...)."""
    return value in ("1", "t", "T", "true", "TRUE", "True")


def _status(code: int, reason: str, message: str, *, details: Obj | None = None) -> Obj:
    return {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "details": details or {}, "code": code,
    }


def _json(body: Obj, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(text=json.dumps(body), status=status, headers=headers,
                        content_type="application/json")


@dataclass(slots=True)
class EmulatorOptions:
    """bookmark_interval_s: how often a watch that allowed bookmarks gets one (a real API
    server sends one about every minute; tests want them sooner)."""

    bookmark_interval_s: float = 1.0
    history: int = 10_000
    types: tuple[ResourceType, ...] = DEFAULT_TYPES
    extra: dict[str, Any] = field(default_factory=dict)


class KubeEmulator:
    """Start with `async with KubeEmulator(clock=...) as emu`, point a client at `emu.url`.

    `clock` is the wall clock (epoch seconds) used for creationTimestamp and the
    controller; tests inject a fake one to make pod timelines exact.
    """

    def __init__(self, *, clock: Callable[[], float], options: EmulatorOptions | None = None
                 ) -> None:
        self.options = options or EmulatorOptions()
        self.store = Store(types=(*self.options.types, *reviews.TYPES), clock=clock,
                           history=self.options.history)
        self.reviews = reviews.Reviews()
        """TokenReview and SubjectAccessReview answers: tests fill its tables."""
        self.faults: list[Fault] = []
        self.requests: list[RequestRecord] = []
        self._runner: web.AppRunner | None = None
        self._streams: set[web.StreamResponse] = set()
        self.url = ""

    # -- lifecycle ------------------------------------------------------------------------
    async def start(self, *, port: int = 0) -> str:
        """Listen on 127.0.0.1:`port` (0: a free port) and return the base URL."""
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", port)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"
        return self.url

    async def stop(self) -> None:
        self.store.close_watchers()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> KubeEmulator:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- test helpers ---------------------------------------------------------------------
    def inject(self, fault: Fault) -> Fault:
        self.faults.append(fault)
        return fault

    def resource(self, group: str, plural: str) -> ResourceType:
        return self.store.type_for(group, plural)

    def count(self, *, method: str, path: str) -> int:
        """Requests answered with `method` whose path matches the regex `path`."""
        return sum(1 for r in self.requests if r.method == method and re.search(path, r.path))

    # -- routing --------------------------------------------------------------------------
    def _route(self, path: str) -> _Route:
        parts = [p for p in path.split("/") if p]
        if len(parts) >= 2 and parts[0] == "api":
            group, rest = "", parts[2:]
        elif len(parts) >= 3 and parts[0] == "apis":
            group, rest = parts[1], parts[3:]
        else:
            raise StoreError(404, "NotFound", f"the server could not find {path}")
        namespace = None
        if len(rest) >= 3 and rest[0] == "namespaces":
            namespace, rest = rest[1], rest[2:]
        if not rest or len(rest) > 3:
            raise StoreError(404, "NotFound", f"the server could not find {path}")
        rtype = self.store.type_for(group, rest[0])
        if namespace is not None and not rtype.namespaced:
            raise StoreError(404, "NotFound", f"{rtype.plural} are not namespaced")
        name = rest[1] if len(rest) > 1 else None
        sub = rest[2] if len(rest) > 2 else None
        if sub not in (None, "status", "scale") or (sub == "scale" and not rtype.scale_spec) or (
                sub == "status" and not rtype.has_status):
            raise StoreError(404, "NotFound", f"{rtype.plural} has no subresource {sub}")
        if name is not None and rtype.namespaced and namespace is None:
            raise StoreError(404, "NotFound", "namespace required")
        return _Route(rtype, namespace, name, sub)

    @staticmethod
    def _verb(request: web.Request, route: _Route | None) -> Verb:
        method = request.method
        if method == "GET":
            if route is not None and route.name is None:
                return "watch" if _flag(request.query.get("watch")) else "list"
            return "get"
        return {"POST": "create", "PUT": "update", "PATCH": "patch",
                "DELETE": "delete"}.get(method, method.lower())

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body: Any = None
        route: _Route | None = None
        try:
            route = self._route(request.path)
        except StoreError:
            route = None
        verb = self._verb(request, route)
        if request.can_read_body:
            raw = await request.read()
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                return self._record(request, verb, body,
                                    _json(_status(400, "BadRequest", "invalid JSON"), 400))
        fault = next((f for f in self.faults if f.matches(verb, request.path)), None)
        if fault is not None:
            fault.times -= 1
            if fault.delay_s:
                await asyncio.sleep(fault.delay_s)
            if fault.status is not None:
                headers = {"Retry-After": str(fault.retry_after)} if fault.retry_after else None
                reason = {409: "Conflict", 429: "TooManyRequests", 410: "Expired",
                          504: "Timeout"}.get(fault.status, "InternalError")
                response = _json(_status(fault.status, reason, fault.message), fault.status,
                                 headers)
                return self._record(request, verb, body, response)
        try:
            if route is None:
                self._route(request.path)  # raises the 404
                raise AssertionError("unreachable")
            if verb == "watch":
                drop = fault is not None and fault.drop_watch
                return await self._watch(request, route, drop=drop)
            response = self._dispatch(request, route, verb, body)
        except StoreError as error:
            response = _json(_status(error.code, error.reason, error.message,
                                     details=self._details(route)), error.code)
        return self._record(request, verb, body, response)

    @staticmethod
    def _details(route: _Route | None) -> Obj:
        if route is None:
            return {}
        details: Obj = {"kind": route.rtype.plural}
        if route.rtype.group:
            details["group"] = route.rtype.group
        if route.name:
            details["name"] = route.name
        return details

    def _record(self, request: web.Request, verb: Verb, body: Any,
                response: web.StreamResponse) -> web.StreamResponse:
        self.requests.append(RequestRecord(
            method=request.method, path=request.path, verb=verb, query=dict(request.query),
            content_type=request.headers.get("Content-Type", ""), status=response.status,
            body=body,
        ))
        return response

    # -- verbs ----------------------------------------------------------------------------
    def _dispatch(self, request: web.Request, route: _Route, verb: Verb, body: Any
                  ) -> web.Response:
        store, rtype = self.store, route.rtype
        if rtype in reviews.TYPES:
            if verb != "create" or route.name is not None or not isinstance(body, dict):
                raise StoreError(405, "MethodNotAllowed", f"{rtype.plural} can only be created")
            return _json(self.reviews.review(rtype, body), 201)
        if verb == "list":
            return _json(self._list(request, route))
        if verb == "create":
            if route.name is not None or not isinstance(body, dict):
                raise StoreError(405, "MethodNotAllowed", "create needs a collection and a body")
            return _json(store.create(rtype, route.namespace, body), 201)
        if route.name is None:
            raise StoreError(405, "MethodNotAllowed", f"{verb} needs an object name")
        if verb == "get":
            obj = store.get(rtype, route.namespace, route.name)
            return _json(self._scale(rtype, obj) if route.subresource == "scale" else obj)
        if verb == "delete":
            return _json(store.delete(rtype, route.namespace, route.name))
        if verb not in ("update", "patch"):
            raise StoreError(405, "MethodNotAllowed", f"{request.method} is not supported")
        current = store.get(rtype, route.namespace, route.name)
        view = self._scale(rtype, current) if route.subresource == "scale" else current
        if verb == "update":
            if not isinstance(body, dict):
                raise StoreError(400, "BadRequest", "update needs an object")
            new = body
        else:
            new = self._patched(rtype, view, body, request.headers.get("Content-Type", ""))
        if route.subresource == "scale":
            return _json(self._write_scale(rtype, route, current, new))
        return _json(store.update(rtype, route.namespace, route.name, new,
                                  subresource=route.subresource))

    @staticmethod
    def _patched(rtype: ResourceType, view: Obj, body: Any, content_type: str) -> Obj:
        if content_type.startswith(patching.STRATEGIC_MERGE_PATCH) and not rtype.builtin:
            raise StoreError(415, "UnsupportedMediaType",
                             "strategic merge patch is not supported for custom resources")
        try:
            result = patching.apply_patch(view, body, content_type=content_type)
        except LookupError:
            raise StoreError(415, "UnsupportedMediaType",
                             f"the body of the request was in an unknown format - accepted "
                             f"media types include: {patching.JSON_PATCH}, "
                             f"{patching.MERGE_PATCH}, {patching.STRATEGIC_MERGE_PATCH}"
                             ) from None
        except patching.PatchError as error:
            raise StoreError(422, "Invalid", str(error)) from None
        if not isinstance(result, dict):
            raise StoreError(422, "Invalid", "the patch must produce an object")
        return result

    def _scale(self, rtype: ResourceType, obj: Obj) -> Obj:
        """The autoscaling/v1 Scale view of an object, through its declared paths."""
        assert rtype.scale_spec is not None
        meta = obj["metadata"]
        status: Obj = {"replicas": int(get_path(obj, rtype.scale_status or "") or 0)}
        selector = get_path(obj, rtype.scale_selector or "")
        if rtype.key in (("apps", "deployments"), ("apps", "statefulsets")):
            # Built-in types publish their spec.selector as the string form.
            selector = str(selectors.from_label_selector(get_path(obj, "spec.selector") or {}))
        if selector:
            status["selector"] = selector
        return {
            "kind": "Scale", "apiVersion": "autoscaling/v1",
            "metadata": {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion",
                                                "creationTimestamp") if k in meta},
            "spec": {"replicas": int(get_path(obj, rtype.scale_spec) or 0)},
            "status": status,
        }

    def _write_scale(self, rtype: ResourceType, route: _Route, current: Obj, scale: Obj
                     ) -> Obj:
        assert rtype.scale_spec is not None and route.name is not None
        replicas = (scale.get("spec") or {}).get("replicas")
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
            raise StoreError(422, "Invalid", "spec.replicas: must be a non-negative integer")
        updated = copy.deepcopy(current)
        set_path(updated, rtype.scale_spec, replicas)
        # The Scale's resourceVersion is the object's: a stale one is a 409, as on a real
        # API server, which is what makes read-decide-patch safe against other writers.
        expected = (scale.get("metadata") or {}).get("resourceVersion")
        updated["metadata"]["resourceVersion"] = expected or current["metadata"][
            "resourceVersion"]
        written = self.store.update(rtype, route.namespace, route.name, updated)
        return self._scale(rtype, written)

    def _matcher(self, request: web.Request, route: _Route) -> Callable[[Obj], bool]:
        try:
            labels = selectors.parse_selector(request.query.get("labelSelector"))
            fields = selectors.parse_selector(request.query.get("fieldSelector"))
        except ValueError as error:
            raise StoreError(400, "BadRequest", str(error)) from None
        namespace = route.namespace

        def accepts(obj: Obj) -> bool:
            meta = obj.get("metadata") or {}
            return (
                (namespace is None or meta.get("namespace") == namespace)
                and labels.matches(meta.get("labels") or {})
                and selectors.fields_match(fields, obj)
            )

        return accepts

    def _list(self, request: web.Request, route: _Route) -> Obj:
        accepts = self._matcher(request, route)
        items = []
        for obj in self.store.list(route.rtype, route.namespace):
            if accepts(obj):
                obj.pop("kind", None)
                obj.pop("apiVersion", None)
                items.append(obj)
        return {
            "kind": f"{route.rtype.kind}List", "apiVersion": route.rtype.api_version,
            "metadata": {"resourceVersion": str(self.store.revision)}, "items": items,
        }

    async def _watch(self, request: web.Request, route: _Route, *, drop: bool
                     ) -> web.StreamResponse:
        """A watch stream: one JSON event per line, as the API server sends with chunking.

        resourceVersion unset or "0": synthetic ADDED events for what exists, then changes.
        resourceVersion N: every change after N, or one ERROR 410 Expired event when N is
        older than the history kept (the client must list again).
        """
        store, rtype = self.store, route.rtype
        accepts = self._matcher(request, route)
        since = request.query.get("resourceVersion", "")
        bookmarks = _flag(request.query.get("allowWatchBookmarks"))
        timeout = float(request.query.get("timeoutSeconds", "1800"))
        response = web.StreamResponse(status=200, headers={
            "Content-Type": "application/json", "Transfer-Encoding": "chunked"})
        # Snapshot and subscribe with no await in between, so no write falls in the gap.
        initial: list[tuple[str, Obj]] = []
        expired = False
        if since in ("", "0"):
            initial = [("ADDED", o) for o in store.list(rtype, route.namespace) if accepts(o)]
        elif not since.isdigit():
            raise StoreError(400, "BadRequest", f"invalid resourceVersion {since!r}")
        elif int(since) < store.oldest_replayable:
            expired = True
        else:
            initial = [(e.type, copy.deepcopy(e.obj)) for e in store.events
                       if e.resource == rtype.key and e.resource_version > int(since)
                       and accepts(e.obj)]
        watcher = store.subscribe(rtype, accepts)
        self._record(request, "watch", None, response)
        try:
            await response.prepare(request)
            self._streams.add(response)
            if expired:
                await self._send(response, "ERROR", _status(
                    410, "Expired", f"too old resource version: {since} "
                    f"({store.oldest_replayable})"))
                return response
            for kind, obj in initial:
                await self._send(response, kind, obj)
            if drop:
                # Cut the TCP connection mid-stream, as a failing load balancer does.
                if request.transport is not None:
                    request.transport.close()
                return response
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout
            next_bookmark = loop.time() + self.options.bookmark_interval_s
            while True:
                now = loop.time()
                if now >= deadline:
                    break
                wait = min(deadline, next_bookmark if bookmarks else deadline) - now
                try:
                    event = await asyncio.wait_for(watcher.queue.get(), timeout=wait)
                except TimeoutError:
                    if bookmarks and watcher.queue.empty() and loop.time() >= next_bookmark:
                        await self._send(response, "BOOKMARK", {
                            "kind": rtype.kind, "apiVersion": rtype.api_version,
                            "metadata": {"resourceVersion": str(store.revision)}})
                        next_bookmark = loop.time() + self.options.bookmark_interval_s
                    continue
                if event is None:
                    break
                await self._send(response, event.type, event.obj)
            await response.write_eof()
        except (ConnectionResetError, ConnectionError):
            pass
        finally:
            store.unsubscribe(watcher)
            self._streams.discard(response)
        return response

    @staticmethod
    async def _send(response: web.StreamResponse, kind: str, obj: Obj) -> None:
        line = json.dumps({"type": kind, "object": obj}) + "\n"
        await response.write(line.encode())
