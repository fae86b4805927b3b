"""The external.metrics.k8s.io/v1beta1 API (DESIGN 4.3), served from the service state.

The HPA's external metrics client calls
`GET /apis/external.metrics.k8s.io/v1beta1/namespaces/{ns}/{metric}?labelSelector=...`
with the selector from the HPA's `metric.selector`, and sums (Value target) or divides by
pods (AverageValue target) the `value` of every item returned.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from scaler.actuators import authn as delegated
from scaler.actuators import selectors, timefmt
from scaler.core import vocabulary
from scaler.engine import types
from scaler.service import authn
from scaler.service import state as service_state

log = logging.getLogger(__name__)

GROUP = "external.metrics.k8s.io"
VERSION = "v1beta1"
GROUP_VERSION = f"{GROUP}/{VERSION}"
BASE = f"/apis/{GROUP_VERSION}"

DESIRED_REPLICAS = "scaler_desired_replicas"
# The signals served (DESIGN 4.3), each under its vocabulary metric name.
SERVED_SIGNALS = {
    signal.metric_name: signal
    for signal in (vocabulary.Signal.QUEUE_DEPTH, vocabulary.Signal.TOKENS_PER_SECOND,
                   vocabulary.Signal.P95_LATENCY)
}
METRIC_NAMES = (DESIRED_REPLICAS, *SERVED_SIGNALS)
# Probes stay open on this port, as the API server's AlwaysAllowPaths do for a delegating
# authorizer: kubelets call them without credentials.
OPEN_PATHS = frozenset({"/healthz", "/livez", "/readyz"})


def quantity(value: float) -> str:
    """A Kubernetes quantity string: whole numbers plain, others in milli-units.

    1500.0 -> "1500", 1.5 -> "1500m", 0.0004 -> "0" (rounded to the nearest milli-unit:
    the HPA reads external metrics with MilliValue(), so finer digits are lost anyway).
    """
    if not math.isfinite(value):
        raise ValueError(f"{value} is not a quantity")
    milli = round(value * 1000)
    if milli % 1000 == 0:
        return str(milli // 1000)
    return f"{milli}m"


@dataclass(frozen=True, slots=True)
class MetricPoint:
    """A value the API can serve, and when it was produced (epoch seconds)."""

    value: float
    produced_at: float


@dataclass(frozen=True, slots=True)
class Served:
    """What the API serves of one model: its latest decision's desired replicas and the
    signals it read, with when each was produced. Built from this instance's state
    (`served_of`) or, with several shards, relayed from the shard that owns the model
    (`service.relay`)."""

    key: str
    namespace: str
    labels: Mapping[str, str]
    stale_after_s: float
    desired: int | None = None  # None: no decision yet
    decided_at: float = 0.0
    points: Mapping[str, MetricPoint] = field(default_factory=dict)  # by signal metric name


def served_of(status: service_state.ModelStatus) -> Served:
    """The model's served values from its latest decision. A signal's sample was `age_s`
    old when the snapshot was taken at `last.at`: it was produced at `last.at - age_s`."""
    policy, last = status.policy, status.last
    points = {}
    if last is not None:
        for metric, signal in SERVED_SIGNALS.items():
            value: types.SignalValue | None = last.snapshot.get(signal)
            if value is not None and math.isfinite(value.value):
                points[metric] = MetricPoint(value.value, last.at - value.age_s)
    return Served(key=status.key, namespace=policy.metadata.namespace, labels=status.labels,
                  stale_after_s=policy.spec.stale_after_seconds,
                  desired=None if last is None else last.decision.desired,
                  decided_at=0.0 if last is None else last.decision.at, points=points)


def metric_point(metric: str, served: Served, now: float) -> MetricPoint | str:
    """The model's current value of `metric`, or why there is none.

    Signals older than the policy's staleAfterSeconds are not served: an HPA fed a stale
    queue depth would act on it, and stale data must never scale (DESIGN 3.5). A 404
    makes the HPA keep the current replicas instead.
    """
    if served.desired is None:
        return "no decision yet"
    if metric == DESIRED_REPLICAS:
        return MetricPoint(float(served.desired), served.decided_at)
    point = served.points.get(metric)
    if point is None:
        return "no value"
    age = now - point.produced_at
    if age > served.stale_after_s:
        return f"stale ({age:.0f} s old, staleAfterSeconds {served.stale_after_s:g})"
    return point


def status_object(*, code: int, reason: str, message: str,
                  details: dict[str, Any] | None = None) -> dict[str, Any]:
    """A metav1.Status, as the API server returns for errors."""
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        body["details"] = details
    return body


def api_resource_list() -> dict[str, Any]:
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": GROUP_VERSION,
        "resources": [
            {
                "name": name,
                "singularName": "",
                "namespaced": True,
                "kind": "ExternalMetricValueList",
                "verbs": ["get"],
            }
            for name in METRIC_NAMES
        ],
    }


def api_group() -> dict[str, Any]:
    version = {"groupVersion": GROUP_VERSION, "version": VERSION}
    return {
        "kind": "APIGroup",
        "apiVersion": "v1",
        "name": GROUP,
        "versions": [version],
        "preferredVersion": version,
    }


def external_metric_value_list(
    *, state: service_state.ServiceState, namespace: str, metric: str, label_selector: str,
    now: float, relayed: Mapping[str, Served] | None = None,
) -> tuple[int, dict[str, Any]]:
    """(HTTP status, body) for one HPA request: a list, or a Status saying why not.

    `relayed`: with several shards, the models other shards own, by key (this instance's
    own models come from `state`, and win where both have a key)."""
    metric_name = metric.lower()
    if metric_name not in METRIC_NAMES:
        return 404, status_object(
            code=404, reason="NotFound",
            message=f"external metric {metric!r} is not served; known: "
                    + ", ".join(METRIC_NAMES),
            details={"name": metric, "group": GROUP, "kind": metric},
        )
    try:
        selector = selectors.parse_selector(label_selector)
    except ValueError as exc:
        return 400, status_object(code=400, reason="BadRequest", message=str(exc))
    served = {key: each for key, each in (relayed or {}).items()
              if each.namespace == namespace and selector.matches(each.labels)}
    for status in state.statuses():
        if status.policy.metadata.namespace == namespace and selector.matches(status.labels):
            served[status.key] = served_of(status)
    matched = list(served.values())
    if not matched:
        return 404, status_object(
            code=404, reason="NotFound",
            message=f"no model in namespace {namespace!r} matches labelSelector "
                    f"{label_selector!r} for metric {metric_name!r}",
            details={"name": metric_name, "group": GROUP, "kind": metric_name},
        )
    items = []
    missing = []
    for each in sorted(matched, key=lambda s: s.key):
        point = metric_point(metric_name, each, now)
        if isinstance(point, str):
            missing.append(f"{each.key}: {point}")
            continue
        items.append({
            "metricName": metric_name,
            "metricLabels": dict(each.labels),
            "timestamp": timefmt.rfc3339(point.produced_at),
            "value": quantity(point.value),
        })
    if missing:
        # All or nothing: a partial sum would under-report demand to the HPA.
        return 404, status_object(
            code=404, reason="NotFound",
            message=f"metric {metric_name!r} has no current value for "
                    + "; ".join(missing),
            details={"name": metric_name, "group": GROUP, "kind": metric_name},
        )
    return 200, {
        "kind": "ExternalMetricValueList",
        "apiVersion": GROUP_VERSION,
        "metadata": {},
        "items": items,
    }


def access_request(path: str, match_info: dict[str, str]) -> delegated.AccessRequest:
    """What a request asks to do, in SubjectAccessReview terms.

    `GET .../namespaces/{ns}/{metric}` is a list of the resource named by the metric in
    that namespace (the HPA's ClusterRole grants get and list on external.metrics.k8s.io);
    discovery and anything else is a non-resource `get` of the path, as the API server
    asks for `/apis/...` (granted to every authenticated user by `system:discovery`).
    """
    if "metric" in match_info and "namespace" in match_info:
        return delegated.AccessRequest(verb="list", group=GROUP, version=VERSION,
                                       resource=match_info["metric"],
                                       namespace=match_info["namespace"])
    return delegated.AccessRequest(verb="get", path=path)


def _forbidden_message(user: delegated.UserInfo, request: delegated.AccessRequest,
                       reason: str) -> str:
    # The API server's wording, so `kubectl get --raw` users recognise it.
    if request.resource:
        what = (f'cannot {request.verb} resource "{request.resource}" in API group '
                f'"{request.group}" in the namespace "{request.namespace}"')
    else:
        what = f'cannot {request.verb} path "{request.path}"'
    return f'User "{user.username}" {what}' + (f": {reason}" if reason else "")


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class MetricsApi:
    """The aiohttp app; `clock` gives wall-clock epoch seconds (injected for tests).

    `gate` authenticates and authorises every caller but the probes; None serves anyone
    who reaches the port (local development only: `metrics_api.authentication: false`).
    """

    def __init__(self, state: service_state.ServiceState, *, clock: Callable[[], float],
                 gate: authn.Gate | None = None,
                 relayed: Callable[[], Mapping[str, Served]] | None = None) -> None:
        self._state = state
        self._clock = clock
        self._gate = gate
        self._relayed = relayed

    @web.middleware
    async def _counted(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            response = await self._guarded(request, handler)
        except web.HTTPException as error:
            self._state.record_metrics_api_request(error.status)
            raise
        self._state.record_metrics_api_request(response.status)
        return response

    async def _guarded(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        gate = self._gate
        if gate is None or request.path in OPEN_PATHS:
            return await handler(request)
        ssl_object = (request.transport.get_extra_info("ssl_object")
                      if request.transport is not None else None)
        try:
            user = await gate.authenticate(ssl_object=ssl_object, headers=request.headers)
        except delegated.DelegationError as error:
            # The API server answers 401 when its token webhook fails; nothing is cached.
            log.warning("external metrics API: token review failed: %s", error)
            user = None
        if user is None:
            return web.json_response(status_object(
                code=401, reason="Unauthorized", message="Unauthorized"), status=401)
        access = access_request(request.path, dict(request.match_info))
        try:
            decision = await gate.authorize(user, access)
        except delegated.DelegationError as error:
            log.warning("external metrics API: access review failed: %s", error)
            return web.json_response(status_object(
                code=500, reason="InternalError",
                message="authorization could not be checked"), status=500)
        if not decision.allowed:
            return web.json_response(status_object(
                code=403, reason="Forbidden",
                message=_forbidden_message(user, access, decision.reason),
                details={"name": access.resource or access.path, "group": access.group,
                         "kind": access.resource}), status=403)
        return await handler(request)

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._counted])
        app.router.add_get("/apis", self._groups)
        app.router.add_get(f"/apis/{GROUP}", self._group)
        app.router.add_get(BASE, self._resources)
        app.router.add_get(BASE + "/namespaces/{namespace}/{metric}", self._list)
        app.router.add_get("/healthz", self._ok)
        app.router.add_get("/livez", self._ok)
        app.router.add_get("/readyz", self._ready)
        return app

    async def _groups(self, request: web.Request) -> web.Response:
        return web.json_response({"kind": "APIGroupList", "apiVersion": "v1",
                                  "groups": [api_group()]})

    async def _group(self, request: web.Request) -> web.Response:
        return web.json_response(api_group())

    async def _resources(self, request: web.Request) -> web.Response:
        return web.json_response(api_resource_list())

    async def _list(self, request: web.Request) -> web.Response:
        code, body = external_metric_value_list(
            state=self._state,
            namespace=request.match_info["namespace"],
            metric=request.match_info["metric"],
            label_selector=request.query.get("labelSelector", ""),
            now=self._clock(),
            relayed=self._relayed() if self._relayed is not None else None,
        )
        return web.json_response(body, status=code)

    async def _ok(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _ready(self, request: web.Request) -> web.Response:
        if self._state.ready:
            return web.Response(text="ok")
        return web.Response(status=503, text="; ".join(self._state.not_ready_reasons()))
