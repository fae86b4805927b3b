"""ScalePolicy, GpuPool and GpuBudget resources: list/watch them as a source beside the
files, and write their `/status` (leader only, rate-limited)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from scaler.actuators import base, events, resources, watch
from scaler.actuators import client as kube
from scaler.actuators import settings as kube_settings
from scaler.policy import crd, loader

log = logging.getLogger(__name__)

Clock = Callable[[], float]
Note = tuple[str, str, bool]
"""An Event to post on the ScalePolicy with its status: (reason, message, warning)."""


def collection(namespace: str | None) -> str:
    """The ScalePolicy collection: in one namespace, or in all (None)."""
    return crd.SCALE_POLICY.collection(namespace)


class Resources:
    """Every resource of one kind in `scopes` (namespaces; None: all of them, or the
    cluster for a cluster-scoped kind), kept current by informers.

    `optional`: the kind may not be served (its CRD not installed yet: Helm installs the
    chart's crds/ only on a first install) or not granted; `start` then does not wait for
    it, and its informers keep listing (with backoff) until it is.
    """

    def __init__(self, api: kube.KubeApi, *, kind: crd.Kind, scopes: tuple[str | None, ...],
                 settings: kube_settings.KubeSettings, optional: bool = False) -> None:
        self.kind = kind
        self.optional = optional
        self.informers = [watch.Informer(api, path=kind.collection(namespace),
                                         settings=settings) for namespace in scopes]

    def objects(self) -> dict[str, kube.Obj]:
        """resource path (`Kind.resource_path`) -> the object as last seen."""
        found = {}
        for informer in self.informers:
            for obj in informer.objects.values():
                meta = obj.get("metadata") or {}
                namespace = str(meta.get("namespace")) if self.kind.namespaced else None
                found[self.kind.resource_path(namespace, str(meta.get("name")))] = obj
        return found

    def fingerprint(self) -> tuple[tuple[str, str], ...]:
        """(resource path, what the document is read from) of every resource: changes when
        a spec or labels do, not when only status does (our own writes must not reload)."""
        prints = []
        for path, obj in self.objects().items():
            meta = obj.get("metadata") or {}
            prints.append((path, json.dumps([meta.get("labels"), obj.get("spec")],
                                            sort_keys=True)))
        return tuple(sorted(prints))

    def load(self) -> loader.LoadResult:
        """Every resource parsed, in path order (the order collisions between resources
        are resolved in, as files load in path order)."""
        result = loader.LoadResult()
        for _, obj in sorted(self.objects().items()):
            result.extend(crd.parse_resource(obj, self.kind))
        return result

    def unavailable(self) -> kube.KubeError | None:
        """Why the kind cannot be listed (404: not served, 403: not granted), None when it
        was listed or the failure is another (retried)."""
        for informer in self.informers:
            error = informer.last_error
            if not informer.synced.is_set() and error is not None and error.status in (
                    403, 404):
                return error
        return None

    async def ready(self) -> None:
        """Until every informer has listed once, or (optional) the kind is unavailable."""
        while not all(each.synced.is_set() for each in self.informers):
            error = self.unavailable() if self.optional else None
            if error is not None:
                log.warning("%s resources cannot be read (%s): they are read once they can "
                            "be; until then, only files define them (install %s and the "
                            "chart's RBAC)", self.kind.kind, error, self.kind.chart_file)
                return
            await asyncio.sleep(_SYNC_POLL_S)


_SYNC_POLL_S = 0.02
"""How often `Resources.ready` looks at its informers, seconds: a list takes a few ms."""


class PolicyResources:
    """Every ScalePolicy resource in the watched namespaces (all when `namespaces` is
    empty), and every GpuPool and GpuBudget (cluster-scoped), kept current by informers.
    `fingerprint()` changes with any spec, so the policy watcher knows when to load again;
    `load()` parses them (pure, from the local copy)."""

    def __init__(self, api: kube.KubeApi, *, settings: kube_settings.KubeSettings) -> None:
        # The namespaces RBAC grants (`scaler kube rbac`: the targets' Roles), else all
        # (cluster-wide; also a bare `scaler run`, whose policy namespaces are not known
        # before the resources are read).
        scopes: tuple[str | None, ...] = (
            (None,) if settings.cluster_wide or not settings.watch_namespaces
            else settings.watch_namespaces)
        self.policies = Resources(api, kind=crd.SCALE_POLICY, scopes=scopes, settings=settings)
        # Optional: a cluster upgraded from a chart without their CRDs still runs.
        self.fleet = tuple(Resources(api, kind=kind, scopes=(None,), settings=settings,
                                     optional=True) for kind in crd.FLEET_KINDS)
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def _all(self) -> tuple[Resources, ...]:
        return (self.policies, *self.fleet)

    def fingerprint(self) -> tuple[tuple[tuple[str, str], ...], ...]:
        """Changes when a spec or labels of any of the resources do, not on status writes."""
        return tuple(each.fingerprint() for each in self._all)

    async def start(self, *, timeout_s: float = 10.0) -> None:
        """Start the informers and wait for their first lists (policies before leading)."""
        self._tasks = [asyncio.create_task(informer.run(), name=f"{each.kind.plural}:"
                                           f"{informer.path}")
                       for each in self._all for informer in each.informers]
        async with asyncio.timeout(timeout_s):
            for each in self._all:
                await each.ready()

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []

    def objects(self) -> dict[str, kube.Obj]:
        """ScalePolicy resource path (crd.resource_path) -> the object as last seen."""
        return self.policies.objects()

    def fleet_objects(self) -> dict[str, tuple[crd.Kind, kube.Obj]]:
        """GpuPool and GpuBudget resource path (gpupools/<name>) -> its kind and object."""
        return {path: (each.kind, obj) for each in self.fleet
                for path, obj in each.objects().items()}

    def load(self) -> loader.LoadResult:
        """Every resource parsed: policies, then pools, then budgets, each in path order."""
        result = loader.LoadResult()
        for each in self._all:
            result.extend(each.load())
        return result


@dataclass(slots=True)
class _Written:
    status: Mapping[str, Any]
    at: float


class StatusWriter:
    """Writes a ScalePolicy's (or a GpuPool's, a GpuBudget's) `/status` by merge patch,
    leader only.

    At most once per `min_interval_s` per policy (10 s: a decision every 200 ms would
    otherwise mean 5 writes a second per model, each a watch event to every client);
    a change of a condition's status or reason is written at once. An unchanged status is
    never written. `transitions(old, new)` says what counts as such a change.
    """

    def __init__(self, api: kube.KubeApi, *, leader: base.LeaderElector, clock: Clock,
                 min_interval_s: float,
                 transitions: Callable[[Mapping[str, Any] | None, Mapping[str, Any]], bool],
                 recorder: events.EventRecorder | None = None) -> None:
        self.api = api
        self.recorder = recorder
        self.leader = leader
        self.clock = clock
        self.min_interval_s = min_interval_s
        self.transitions = transitions
        self.writes = 0
        self._written: dict[str, _Written] = {}

    def due(self, path: str, status: Mapping[str, Any]) -> bool:
        last = self._written.get(path)
        if last is None:
            return True
        if last.status == status:
            return False
        return (self.transitions(last.status, status)
                or self.clock() - last.at >= self.min_interval_s)

    async def write(self, *, namespace: str | None, name: str, status: Mapping[str, Any],
                    uid: str | None = None, notes: tuple[Note, ...] = (),
                    kind: crd.Kind = crd.SCALE_POLICY) -> bool:
        """Write `status` if due, then post `notes` as Events on the resource (`kubectl
        describe` shows both); True when written. Errors are logged, not raised."""
        path = kind.resource_path(namespace, name)
        if not self.leader.is_leader or not self.due(path, status):
            return False
        url = f"{kind.collection(namespace)}/{name}/status"
        body = dict(status)
        last = self._written.get(path)
        for gone in (last.status if last is not None else {}):
            body.setdefault(gone, None)  # a merge patch removes a field only when told to
        try:
            await self.api.merge_patch(url, {"status": body})
        except kube.KubeError as error:
            if error.not_found:  # deleted meanwhile: nothing to report on
                self._written.pop(path, None)
                return False
            log.warning("%s %s: status not written: %s", kind.kind, path, error)
            return False
        self._written[path] = _Written(status=status, at=self.clock())
        self.writes += 1
        if self.recorder is not None and namespace is not None:
            ref = resources.ObjectRef(api_version=crd.API_VERSION, kind=kind.kind,
                                      plural=kind.plural, namespace=namespace, name=name)
            for reason, message, warning in notes:
                await self.recorder.record(ref, reason=reason, message=message,
                                           warning=warning, uid=uid)
        return True

    def last(self, path: str) -> Mapping[str, Any] | None:
        """The status last written for `path` by this instance (None: none yet)."""
        written = self._written.get(path)
        return None if written is None else written.status
