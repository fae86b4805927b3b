"""An aiohttp server that speaks the Kubernetes API wire protocol on loopback, for tests."""

from __future__ import annotations

import asyncio
import copy
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import yaml
from aiohttp import web

from scaler.actuators import selectors
from scaler.emulator import (
    apierrors,
    crds,
    deployments,
    discovery,
    events,
    fields,
    reviews,
    validation,
)
from scaler.emulator import patch as patching
from scaler.emulator.store import (
    DEFAULT_TYPES,
    Obj,
    ResourceType,
    Store,
    StoreError,
    Watcher,
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
    """A resource request: `rtype` as the client named it, `storage` where it lives
    (events.k8s.io Events are core Events underneath)."""

    rtype: ResourceType
    namespace: str | None
    name: str | None
    subresource: str | None

    @property
    def storage_key(self) -> tuple[str, str]:
        return events.CORE_KEY if self.rtype == events.EVENTS_V1 else self.rtype.key


class _PageNotFound(Exception):
    """A path outside every served group version: the plain-text 404 of the Go mux."""


def _flag(value: str | None) -> bool:
    """A boolean query parameter as Go's strconv.ParseBool reads it (1, t, true, True...)."""
    return value in ("1", "t", "T", "true", "TRUE", "True")


def _json(body: Obj, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(text=json.dumps(body), status=status, headers=headers,
                        content_type="application/json")


def _page_not_found() -> web.Response:
    return web.Response(text="404 page not found\n", status=404, content_type="text/plain")


SYSTEM_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
APISERVER = "kube-apiserver"
# What a POST or PUT body may be; a PATCH names one of the patch types instead.
BODY_MEDIA = ("application/json", "application/yaml")
BODY_MEDIA_ACCEPTED = ("application/json", "application/yaml",
                       "application/vnd.kubernetes.protobuf")
APPLY_PATCH = "application/apply-patch+yaml"
HEALTH_PATHS = ("/healthz", "/livez", "/readyz")
# kube-apiserver's --max-request-body-bytes default (3 MiB): a ConfigMap of 1 MiB of values
# reaches validation, and is refused there with its own 422.
MAX_REQUEST_BODY_BYTES = 3 * 1024 * 1024
LEASE_TIMES = ("acquireTime", "renewTime")


def _unsupported_media(accepted: tuple[str, ...]) -> StoreError:
    return StoreError(415, "UnsupportedMediaType", "the body of the request was in an unknown "
                      "format - accepted media types include: " + ", ".join(accepted))


def _patch_types(rtype: ResourceType) -> tuple[str, ...]:
    """The patch types the API server lists: strategic merge for built-in types only."""
    strategic = (patching.STRATEGIC_MERGE_PATCH,) if rtype.builtin else ()
    return (patching.JSON_PATCH, patching.MERGE_PATCH, *strategic, APPLY_PATCH)


def _media(request: web.Request) -> str:
    return request.headers.get("Content-Type", "").split(";")[0].strip().lower()


@dataclass(slots=True)
class EmulatorOptions:
    """How faithful and how fast the emulator is.

    bookmark_interval_s: how often a watch that allowed bookmarks gets one; a real API
      server sends one about every 60 s, plus one `bookmark_before_timeout_s` (2 s) before
      the watch's `timeoutSeconds` ends, so a watch of 300 s gets bookmarks at 60, 120,
      180, 240 and 298 s.
    status_writer: answer each Deployment spec change with the deployment controller's
      status write `status_delay_s` later (5 ms: a real controller takes a few ms), which
      moves the object's resourceVersion, as in a real cluster.
    namespaces: the namespaces that exist at start (a real cluster's four).
    namespace_finalize_s: how long a deleted namespace stays Terminating while its
      contents are removed (the namespace controller's work), 5 ms.
    """

    bookmark_interval_s: float = 60.0
    bookmark_before_timeout_s: float = 2.0
    history: int = 10_000
    types: tuple[ResourceType, ...] = DEFAULT_TYPES
    extra: dict[str, Any] = field(default_factory=dict)
    status_writer: bool = False
    status_delay_s: float = 0.005
    namespaces: tuple[str, ...] = SYSTEM_NAMESPACES
    namespace_finalize_s: float = 0.005


class KubeEmulator:
    """Start with `async with KubeEmulator(clock=...) as emu`, point a client at `emu.url`.

    `clock` is the wall clock (epoch seconds) used for creationTimestamp and the
    controller; tests inject a fake one to make pod timelines exact.
    """

    def __init__(self, *, clock: Callable[[], float], options: EmulatorOptions | None = None
                 ) -> None:
        self.options = options or EmulatorOptions()
        self.store = Store(types=(*self.options.types, *reviews.TYPES, events.EVENTS_V1,
                                  crds.CRD_TYPE),
                           clock=clock, history=self.options.history)
        self.custom_resources = crds.CustomResources(self.store)
        self.reviews = reviews.Reviews()
        """TokenReview and SubjectAccessReview answers: tests fill its tables."""
        self.faults: list[Fault] = []
        self.requests: list[RequestRecord] = []
        self._runner: web.AppRunner | None = None
        self._streams: set[web.StreamResponse] = set()
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self.url = ""
        self.pods_run = False
        """True once an EmulatorController walks pods: status counts ready pods then."""
        self.status_writer: deployments.StatusWriter | None = None
        if self.options.status_writer:
            self.status_writer = deployments.StatusWriter(
                self.store, delay_s=self.options.status_delay_s,
                pods=self.store.type_for("", "pods"), pods_counted=lambda: self.pods_run)
            self.status_writer.start()
        for namespace in self.options.namespaces:
            self.ensure_namespace(namespace)

    # -- lifecycle ------------------------------------------------------------------------
    async def start(self, *, port: int = 0) -> str:
        """Listen on 127.0.0.1:`port` (0: a free port) and return the base URL."""
        app = web.Application(client_max_size=MAX_REQUEST_BODY_BYTES)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", port)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"
        return self.url

    async def stop(self) -> None:
        if self.status_writer is not None:
            self.status_writer.stop()
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
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

    def ensure_namespace(self, name: str) -> Obj:
        """The namespace `name`, created first when missing (for seeding in-process)."""
        namespaces = self.store.type_for("", "namespaces")
        found = self.store.find(namespaces, None, name)
        if found is not None:
            return found
        return self.store.create(namespaces, None, {"metadata": {"name": name}},
                                 manager=APISERVER)

    # -- routing --------------------------------------------------------------------------
    def _types(self) -> list[ResourceType]:
        return list(self.store.types.values())

    def _discovery(self, path: str) -> Obj | None:
        """The discovery document at `path`, None for a resource path (404 if unknown)."""
        parts = [p for p in path.split("/") if p]
        served = discovery.group_versions(self._types())
        if parts == ["api"]:
            return discovery.api_versions()
        if parts == ["apis"]:
            return discovery.api_group_list(self._types())
        if len(parts) == 2 and parts[0] == "apis" and parts[1] in served and parts[1]:
            return discovery.api_group(parts[1], served[parts[1]])
        if len(parts) >= 2 and parts[0] == "api" and parts[1] in served.get("", []):
            group, version, rest = "", parts[1], parts[2:]
        elif len(parts) >= 3 and parts[0] == "apis" and parts[2] in served.get(parts[1], []):
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            raise _PageNotFound(path)
        if not rest:
            return discovery.resource_list(group, version, self._types(),
                                           create_only=reviews.TYPES)
        return None

    def _route(self, path: str) -> _Route:
        parts = [p for p in path.split("/") if p]
        group, rest = ("", parts[2:]) if parts[0] == "api" else (parts[1], parts[3:])
        namespace = None
        # /api/v1/namespaces/x/status is the Namespace's own subresource, not a collection.
        own_subresource = group == "" and len(rest) == 3 and rest[2] in ("status", "finalize")
        if len(rest) >= 3 and rest[0] == "namespaces" and not own_subresource:
            namespace, rest = rest[1], rest[2:]
        missing = StoreError(404, "NotFound", "the server could not find the requested resource")
        if not rest or len(rest) > 3:
            raise missing
        rtype = self.store.type_for(group, rest[0])
        if namespace is not None and not rtype.namespaced:
            raise missing
        name = rest[1] if len(rest) > 1 else None
        sub = rest[2] if len(rest) > 2 else None
        if sub not in (None, "status", "scale") or (sub == "scale" and not rtype.scale_spec) or (
                sub == "status" and not rtype.has_status):
            raise missing
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
        if request.path in HEALTH_PATHS:
            return self._record(request, "get", None,
                                web.Response(text="ok", content_type="text/plain"))
        if request.path == "/version":
            return self._record(request, "get", None, _json(discovery.version()))
        try:
            document = self._discovery(request.path)
        except _PageNotFound:
            return self._record(request, "get", None, _page_not_found())
        if document is not None:
            return self._record(request, "get", None, _json(document))
        try:
            route = self._route(request.path)
        except StoreError as error:
            return self._record(request, self._verb(request, None), None,
                                _json(error.status(), error.code))
        verb = self._verb(request, route)
        if request.can_read_body:
            try:
                raw = await request.read()
            except web.HTTPRequestEntityTooLarge:
                too_large = StoreError(413, "RequestEntityTooLarge", "Request entity too "
                                       f"large: limit is {MAX_REQUEST_BODY_BYTES}")
                return self._record(request, verb, None,
                                    _json(too_large.status(), too_large.code))
            try:
                body = self._decode(request, route, verb, raw)
            except StoreError as error:
                return self._record(request, verb, None, _json(error.status(), error.code))
        fault = next((f for f in self.faults if f.matches(verb, request.path)), None)
        if fault is not None:
            fault.times -= 1
            if fault.delay_s:
                await asyncio.sleep(fault.delay_s)
            if fault.status is not None:
                headers = {"Retry-After": str(fault.retry_after)} if fault.retry_after else None
                reason = {409: "Conflict", 429: "TooManyRequests", 410: "Expired",
                          504: "Timeout"}.get(fault.status, "InternalError")
                injected = StoreError(fault.status, reason, fault.message)
                return self._record(request, verb, body,
                                    _json(injected.status(), fault.status, headers))
        try:
            if verb == "watch":
                drop = fault is not None and fault.drop_watch
                return await self._watch(request, route, drop=drop)
            response = self._dispatch(request, route, verb, body)
        except StoreError as error:
            response = _json(error.status(), error.code)
        return self._record(request, verb, body, response)

    @staticmethod
    def _decode(request: web.Request, route: _Route, verb: Verb, raw: bytes) -> Any:
        """The request body, or the API server's 415/400 for what it cannot read."""
        if not raw:
            return None
        media = _media(request)
        if verb == "patch":
            if media not in _patch_types(route.rtype) or media == APPLY_PATCH:
                raise _unsupported_media(_patch_types(route.rtype))
        elif media not in BODY_MEDIA:
            raise _unsupported_media(BODY_MEDIA_ACCEPTED)
        try:
            return yaml.safe_load(raw) if media == "application/yaml" else json.loads(raw)
        except (ValueError, yaml.YAMLError) as error:
            raise apierrors.bad_request(f"the body of the request could not be decoded: "
                                        f"{error}") from None

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
        storage = store.types[route.storage_key]
        manager = fields.manager_name(field_manager=request.query.get("fieldManager"),
                                      user_agent=request.headers.get("User-Agent", ""))
        if rtype in reviews.TYPES:
            if verb != "create" or route.name is not None or not isinstance(body, dict):
                raise StoreError(405, "MethodNotAllowed", f"{rtype.plural} can only be created")
            return _json(self.reviews.review(rtype, body), 201)
        if verb == "list":
            return _json(self._list(request, route))
        if verb == "create":
            if route.name is not None or not isinstance(body, dict):
                raise StoreError(405, "MethodNotAllowed", "create needs a collection and a body")
            self._admit_create(route, storage, name=str((body.get("metadata") or {}).get(
                "name", "")))
            new = self._inbound(route, body)
            created = store.create(storage, route.namespace, new, manager=manager,
                                   check=self._checker(route))
            return _json(self._outbound(route, created), 201)
        if route.name is None:
            raise StoreError(405, "MethodNotAllowed", f"{verb} needs an object name")
        if verb == "get":
            if route.subresource == "scale":
                found = store.find(storage, route.namespace, route.name)
                if found is None:  # ScaleREST.Get names the subresource
                    raise apierrors.not_found(resource=f"{rtype.plural}/scale",
                                              group=rtype.group, name=route.name)
                return _json(self._scale(rtype, found))
            return _json(self._outbound(route, store.get(storage, route.namespace, route.name)))
        if verb == "delete":
            return _json(self._delete(route, storage))
        if verb not in ("update", "patch"):
            raise StoreError(405, "MethodNotAllowed", f"{request.method} is not supported")
        current = store.get(storage, route.namespace, route.name)
        if route.subresource == "scale":
            view = self._scale(rtype, current)
        else:
            view = self._outbound(route, current)
        if verb == "update":
            if not isinstance(body, dict):
                raise apierrors.bad_request("update needs an object")
            if not rtype.unconditional_update and not (body.get("metadata") or {}).get(
                    "resourceVersion"):
                # store.Update's check, worded with the resource as the kind.
                raise apierrors.invalid(kind=rtype.plural, group=rtype.group, name=route.name,
                                        errors=[apierrors.FieldError(
                                            "FieldValueInvalid", "metadata.resourceVersion",
                                            "Invalid value: 0x0: must be specified for an "
                                            "update")])
            new = body
        else:
            new = self._patched(view, body, _media(request))
        if route.subresource == "scale":
            return _json(self._write_scale(rtype, route, current, new, manager=manager))
        written = store.update(storage, route.namespace, route.name, self._inbound(route, new),
                               subresource=route.subresource, manager=manager,
                               check=self._checker(route))
        return _json(self._outbound(route, written))

    # -- admission, conversion, validation ------------------------------------------------
    def _admit_create(self, route: _Route, storage: ResourceType, *, name: str) -> None:
        """NamespaceLifecycle: no new content in a namespace that is missing or going."""
        if not storage.namespaced or route.namespace is None:
            return
        namespace = self.store.find(self.store.type_for("", "namespaces"), None,
                                    route.namespace)
        if namespace is None:
            raise apierrors.not_found(resource="namespaces", group="", name=route.namespace)
        if namespace["metadata"].get("deletionTimestamp"):
            rtype = route.rtype
            raise StoreError(403, "Forbidden", f'{apierrors.qualified(rtype.plural, rtype.group)} '
                             f'"{name}" is forbidden: unable to create new content in namespace '
                             f"{route.namespace} because it is being terminated",
                             details={"name": name, "kind": rtype.plural})

    def _decodable(self, route: _Route, obj: Any) -> None:
        """What fails decoding into the typed object (400), before any validation."""
        if route.rtype.key == ("coordination.k8s.io", "leases") and isinstance(obj, dict):
            validation.micro_times(obj, kind="Lease", version="v1", fields=LEASE_TIMES)

    def _inbound(self, route: _Route, obj: Obj) -> Obj:
        self._decodable(route, obj)
        return events.to_core(obj) if route.rtype == events.EVENTS_V1 else obj

    @staticmethod
    def _outbound(route: _Route, obj: Obj) -> Obj:
        return events.from_core(obj) if route.rtype == events.EVENTS_V1 else obj

    def _checker(self, route: _Route) -> Callable[[Obj], None]:
        """Validate an object about to be stored (defaults applied, name generated)."""
        rtype = route.rtype

        def check(obj: Obj) -> None:
            schema_errors = self.custom_resources.check(
                rtype.key, obj, status=route.subresource == "status")
            if schema_errors:
                raise apierrors.invalid(kind=rtype.kind, group=rtype.group,
                                        name=str(obj["metadata"].get("name", "")),
                                        errors=schema_errors)
            if route.subresource == "status":
                return
            if rtype == events.EVENTS_V1:
                errors = events.validate_v1(obj)
            else:
                errors = validation.for_type(rtype.key, obj)
            if errors:
                raise apierrors.invalid(kind=rtype.kind, group=rtype.group,
                                        name=str(obj["metadata"].get("name", "")), errors=errors)

        return check

    @staticmethod
    def _patched(view: Obj, body: Any, media: str) -> Obj:
        """The patch applied; a JSON patch that fails (a `test` that does not hold, a
        missing path) is the generic 422 the API server sends, with empty details."""
        try:
            result = patching.apply_patch(view, body, content_type=media)
        except patching.PatchFormatError as error:
            raise apierrors.bad_request(str(error)) from None
        except patching.PatchError as error:
            if media == patching.JSON_PATCH:
                raise StoreError(422, "Invalid", "the server rejected our request due to an "
                                 "error in our request", details={}) from None
            raise StoreError(422, "Invalid", str(error)) from None
        if not isinstance(result, dict):
            raise StoreError(422, "Invalid", "the patch must produce an object")
        return result

    # -- delete and namespace lifecycle ---------------------------------------------------
    def _delete(self, route: _Route, storage: ResourceType) -> Obj:
        """Most deletes answer a Success Status; pods and namespaces answer the object. A
        namespace is Terminating (deletionTimestamp set) until its contents are gone."""
        assert route.name is not None
        store = self.store
        if storage.key == ("", "namespaces"):
            current = store.get(storage, None, route.name)
            if not current["metadata"].get("deletionTimestamp"):
                current = store.mark_deleting(storage, None, route.name, status={
                    **(current.get("status") or {}), "phase": "Terminating"})
                loop = asyncio.get_running_loop()
                self._timers[route.name] = loop.call_later(
                    self.options.namespace_finalize_s, self._finalize_namespace, route.name)
            return current
        deleted = store.delete(storage, route.namespace, route.name)
        if storage.key == ("", "pods"):
            return deleted
        details: Obj = {"name": route.name}
        if route.rtype.group:
            details["group"] = route.rtype.group
        details.update({"kind": route.rtype.plural, "uid": deleted["metadata"]["uid"]})
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                "details": details}

    def _finalize_namespace(self, name: str) -> None:
        """The namespace controller: delete everything in `name`, then `name` itself."""
        self._timers.pop(name, None)
        store = self.store
        for rtype in list(store.types.values()):
            if rtype.namespaced and rtype.key != events.EVENTS_V1.key:
                for obj in store.list(rtype, name):
                    store.delete(rtype, name, obj["metadata"]["name"])
        namespaces = store.type_for("", "namespaces")
        if store.find(namespaces, None, name) is not None:
            store.delete(namespaces, None, name)

    # -- scale ----------------------------------------------------------------------------
    def _scale(self, rtype: ResourceType, obj: Obj) -> Obj:
        """The autoscaling/v1 Scale view of an object, through its declared paths.

        Serialized as the API server does: `spec.replicas` is omitted at 0 (`spec: {}`),
        `status.replicas` is always there, `status.selector` is the string form.
        """
        assert rtype.scale_spec is not None
        meta = obj["metadata"]
        status: Obj = {"replicas": int(get_path(obj, rtype.scale_status or "") or 0)}
        selector = get_path(obj, rtype.scale_selector or "")
        if rtype.key in (("apps", "deployments"), ("apps", "statefulsets")):
            # Built-in types publish their spec.selector as the string form.
            selector = str(selectors.from_label_selector(get_path(obj, "spec.selector") or {}))
        if selector:
            status["selector"] = selector
        replicas = int(get_path(obj, rtype.scale_spec) or 0)
        return {
            "kind": "Scale", "apiVersion": "autoscaling/v1",
            "metadata": {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion",
                                                "creationTimestamp") if k in meta},
            "spec": {"replicas": replicas} if replicas else {},
            "status": status,
        }

    def _write_scale(self, rtype: ResourceType, route: _Route, current: Obj, scale: Obj, *,
                     manager: str) -> Obj:
        assert rtype.scale_spec is not None and route.name is not None
        replicas = (scale.get("spec") or {}).get("replicas", 0)
        errors = validation.replicas(replicas, "spec.replicas")
        if errors:
            raise apierrors.invalid(kind="Scale", group="autoscaling", name=route.name,
                                    errors=errors)
        updated = copy.deepcopy(current)
        set_path(updated, rtype.scale_spec, replicas)
        # The Scale's resourceVersion is the object's: a stale one is a 409, as on a real
        # API server, which is what makes read-decide-patch safe against other writers.
        expected = (scale.get("metadata") or {}).get("resourceVersion")
        updated["metadata"]["resourceVersion"] = expected or current["metadata"][
            "resourceVersion"]
        written = self.store.update(rtype, route.namespace, route.name, updated,
                                    subresource="scale", manager=manager)
        return self._scale(rtype, written)

    def _matcher(self, request: web.Request, route: _Route) -> Callable[[Obj], bool]:
        try:
            labels = selectors.parse_selector(request.query.get("labelSelector"))
            fields_selector = selectors.parse_selector(request.query.get("fieldSelector"))
        except ValueError as error:
            raise apierrors.bad_request(str(error)) from None
        namespace = route.namespace

        def accepts(obj: Obj) -> bool:
            meta = obj.get("metadata") or {}
            return (
                (namespace is None or meta.get("namespace") == namespace)
                and labels.matches(meta.get("labels") or {})
                and selectors.fields_match(fields_selector, obj)
            )

        return accepts

    def _list(self, request: web.Request, route: _Route) -> Obj:
        accepts = self._matcher(request, route)
        items = []
        for obj in self.store.list(self.store.types[route.storage_key], route.namespace):
            if accepts(obj):
                obj = self._outbound(route, obj)
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
        older than the history kept (the client must list again). Bookmarks (when allowed)
        come every `bookmark_interval_s` and once `bookmark_before_timeout_s` before the
        watch's timeout, as the watch cache schedules them.
        """
        store = self.store
        storage = store.types[route.storage_key]
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
            initial = [("ADDED", o) for o in store.list(storage, route.namespace) if accepts(o)]
        elif not since.isdigit():
            raise apierrors.bad_request(f"invalid resourceVersion {since!r}")
        elif int(since) < store.oldest_replayable:
            expired = True
        else:
            initial = [(e.type, copy.deepcopy(e.obj)) for e in store.events
                       if e.resource == storage.key and e.resource_version > int(since)
                       and accepts(e.obj)]
        watcher = store.subscribe(storage, accepts)
        self._record(request, "watch", None, response)
        try:
            await response.prepare(request)
            self._streams.add(response)
            if expired:
                gone = StoreError(410, "Expired", f"too old resource version: {since} "
                                  f"({store.oldest_replayable})")
                await self._send(response, "ERROR", gone.status())
                return response
            for kind, obj in initial:
                await self._send(response, kind, self._outbound(route, obj))
            if drop:
                # Cut the TCP connection mid-stream, as a failing load balancer does.
                if request.transport is not None:
                    request.transport.close()
                return response
            await self._stream(response, route, watcher=watcher, timeout=timeout,
                               bookmarks=bookmarks)
            await response.write_eof()
        except (ConnectionResetError, ConnectionError):
            pass
        finally:
            store.unsubscribe(watcher)
            self._streams.discard(response)
        return response

    def _next_bookmark(self, now: float, deadline: float) -> float | None:
        """When the next bookmark is due: in `bookmark_interval_s`, or just before the
        deadline if that comes first; None when even that has passed."""
        due = min(now + self.options.bookmark_interval_s,
                  deadline - self.options.bookmark_before_timeout_s)
        return due if due > now else None

    async def _stream(self, response: web.StreamResponse, route: _Route, *,
                      watcher: Watcher, timeout: float, bookmarks: bool) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        bookmark = self._next_bookmark(loop.time(), deadline) if bookmarks else None
        while (now := loop.time()) < deadline:
            wait = min(deadline, bookmark if bookmark is not None else deadline) - now
            try:
                event = await asyncio.wait_for(watcher.queue.get(), timeout=wait)
            except TimeoutError:
                if bookmark is not None and loop.time() >= bookmark:
                    await self._send(response, "BOOKMARK", {
                        "kind": route.rtype.kind, "apiVersion": route.rtype.api_version,
                        "metadata": {"resourceVersion": str(self.store.revision)}})
                    bookmark = self._next_bookmark(loop.time(), deadline)
                continue
            if event is None:
                break
            await self._send(response, event.type, self._outbound(route, event.obj))

    @staticmethod
    async def _send(response: web.StreamResponse, kind: str, obj: Obj) -> None:
        line = json.dumps({"type": kind, "object": obj}) + "\n"
        await response.write(line.encode())
