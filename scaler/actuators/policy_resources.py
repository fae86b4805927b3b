"""ScalePolicy resources: list/watch them as a policy source, and write their `/status`
(leader only, rate-limited)."""

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
from scaler.policy import crd, loader, model

log = logging.getLogger(__name__)

Clock = Callable[[], float]
Note = tuple[str, str, bool]
"""An Event to post on the ScalePolicy with its status: (reason, message, warning)."""


def collection(namespace: str | None) -> str:
    """The ScalePolicy collection: in one namespace, or in all (None)."""
    root = f"/apis/{crd.API_VERSION}"
    return f"{root}/{crd.PLURAL}" if namespace is None else (
        f"{root}/namespaces/{namespace}/{crd.PLURAL}")


class PolicyResources:
    """Every ScalePolicy resource in the watched namespaces (all when `namespaces` is
    empty), kept current by informers. `fingerprint()` changes with any spec, so the policy
    watcher knows when to load again; `load()` parses them (pure, from the local copy)."""

    def __init__(self, api: kube.KubeApi, *, settings: kube_settings.KubeSettings) -> None:
        # The namespaces RBAC grants (`scaler kube rbac`: the targets' Roles), else all
        # (cluster-wide; also a bare `scaler run`, whose policy namespaces are not known
        # before the resources are read).
        scopes: tuple[str | None, ...] = (
            (None,) if settings.cluster_wide or not settings.watch_namespaces
            else settings.watch_namespaces)
        self.informers = [watch.Informer(api, path=collection(namespace), settings=settings)
                          for namespace in scopes]
        self._tasks: list[asyncio.Task[None]] = []

    def fingerprint(self) -> tuple[tuple[str, str], ...]:
        """(resource path, what the policy is read from) of every resource: changes when a
        spec or labels do, not when only status does (our own writes must not reload)."""
        prints = []
        for path, obj in self.objects().items():
            meta = obj.get("metadata") or {}
            prints.append((path, json.dumps([meta.get("labels"), obj.get("spec")],
                                            sort_keys=True)))
        return tuple(sorted(prints))

    async def start(self, *, timeout_s: float = 10.0) -> None:
        """Start the informers and wait for their first lists (policies before leading)."""
        self._tasks = [asyncio.create_task(each.run(), name=f"scalepolicies:{each.path}")
                       for each in self.informers]
        async with asyncio.timeout(timeout_s):
            for each in self.informers:
                await each.synced.wait()

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []

    def objects(self) -> dict[str, kube.Obj]:
        """resource path (crd.resource_path) -> the object as last seen."""
        found = {}
        for informer in self.informers:
            for obj in informer.objects.values():
                meta = obj.get("metadata") or {}
                found[crd.resource_path(str(meta.get("namespace")), str(meta.get("name")))] = obj
        return found

    def load(self) -> loader.LoadResult:
        """Every resource parsed, in name order (the order collisions between resources are
        resolved in, as files load in path order)."""
        result = loader.LoadResult()
        for _, obj in sorted(self.objects().items()):
            part = crd.parse_resource(obj)
            result.loaded.extend(part.loaded)
            result.errors.extend(part.errors)
        return result


@dataclass(slots=True)
class _Written:
    status: Mapping[str, Any]
    at: float


class StatusWriter:
    """Writes a ScalePolicy's `/status` by merge patch, leader only.

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

    async def write(self, *, namespace: str, name: str, status: Mapping[str, Any],
                    uid: str | None = None, notes: tuple[Note, ...] = ()) -> bool:
        """Write `status` if due, then post `notes` as Events on the resource (`kubectl
        describe` shows both); True when written. Errors are logged, not raised."""
        path = crd.resource_path(namespace, name)
        if not self.leader.is_leader or not self.due(path, status):
            return False
        url = f"{collection(namespace)}/{name}/status"
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
            log.warning("ScalePolicy %s/%s: status not written: %s", namespace, name, error)
            return False
        self._written[path] = _Written(status=status, at=self.clock())
        self.writes += 1
        if self.recorder is not None:
            ref = resources.ObjectRef(api_version=crd.API_VERSION, kind=model.KIND,
                                      plural=crd.PLURAL, namespace=namespace, name=name)
            for reason, message, warning in notes:
                await self.recorder.record(ref, reason=reason, message=message,
                                           warning=warning, uid=uid)
        return True

    def last(self, path: str) -> Mapping[str, Any] | None:
        """The status last written for `path` by this instance (None: none yet)."""
        written = self._written.get(path)
        return None if written is None else written.status
