"""List-then-watch informer: a local copy of a collection, kept current by a watch stream."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable

from scaler.actuators import client as kube
from scaler.actuators import settings as kube_settings
from scaler.core import backoff as core_backoff

log = logging.getLogger(__name__)

OnChange = Callable[[str, kube.Obj], None]


def object_key(obj: kube.Obj) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace') or ''}/{meta.get('name')}"


def kept(obj: kube.Obj) -> kube.Obj:
    """An object as an informer keeps it: without `metadata.managedFields`, which nothing
    here reads (client-go's informers are commonly given the same transform). A real API
    server keeps an entry per field manager (the user's apply, the controller's status,
    the scaler's scale writes), each the set of fields it owns: often the largest part of
    a Deployment, and the copy of every target, pod and node is held for the life of the
    process."""
    meta = obj.get("metadata")
    if not isinstance(meta, dict) or "managedFields" not in meta:
        return obj
    return {**obj, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}


class Informer:
    """Lists a collection once, then watches from the list's resourceVersion; `objects`
    holds each object as `keep` returns it (by default `kept`: no `metadata.managedFields`).

    - a watch the server ends (timeoutSeconds) resumes from the last version seen, which
      bookmarks keep recent even when nothing changes, so a resume rarely needs a relist;
    - 410 Gone (as an ERROR event or an HTTP status) means that version was compacted:
      list again;
    - a dropped connection or a 5xx resumes at once, then backs off per the retry
      settings if it keeps failing (0.2, 0.4, 0.8 s ... with the defaults).
    `on_change(type, obj)` runs for every ADDED / MODIFIED / DELETED, relists included.
    """

    def __init__(self, api: kube.KubeApi, *, path: str, settings: kube_settings.KubeSettings,
                 on_change: OnChange | None = None,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                 rng: random.Random | None = None,
                 keep: Callable[[kube.Obj], kube.Obj] = kept) -> None:
        self.api = api
        self._keep = keep
        self.path = path
        self.settings = settings
        self.on_change = on_change
        self._sleep = sleep
        self._rng = rng or random.Random()
        self.objects: dict[str, kube.Obj] = {}
        self.resource_version = ""
        self.synced = asyncio.Event()
        self.lists = 0
        self.watches = 0
        self.last_error: kube.KubeError | None = None  # of the last failed list or watch

    def _notify(self, kind: str, obj: kube.Obj) -> None:
        if self.on_change is not None:
            self.on_change(kind, obj)

    async def _list(self) -> None:
        listing = await self.api.get(self.path)
        keep = self._keep
        fresh = {object_key(item): keep(item) for item in listing.get("items") or []}
        for key, old in self.objects.items():
            if key not in fresh:
                self._notify("DELETED", old)
        for key, item in fresh.items():
            self._notify("MODIFIED" if key in self.objects else "ADDED", item)
        self.objects = fresh
        self.resource_version = str(listing["metadata"]["resourceVersion"])
        self.lists += 1
        self.synced.set()

    async def _watch(self) -> bool:
        """Follow one watch stream; returns True when a relist is needed."""
        self.watches += 1
        query = {"resourceVersion": self.resource_version, "allowWatchBookmarks": "true",
                 "timeoutSeconds": str(self.settings.watch_timeout_s)}
        stream = self.api.watch(self.path, query=query)
        async with contextlib.aclosing(stream):
            async for event in stream:
                kind, obj = event.get("type"), self._keep(event.get("object") or {})
                if kind == "ERROR":
                    code = int(obj.get("code") or 0)
                    if code == 410:
                        return True
                    raise kube.KubeError(code, str(obj.get("reason")), str(obj.get("message")))
                version = (obj.get("metadata") or {}).get("resourceVersion")
                if version:
                    self.resource_version = str(version)
                if kind == "BOOKMARK":
                    continue
                if kind == "DELETED":
                    self.objects.pop(object_key(obj), None)
                else:
                    self.objects[object_key(obj)] = obj
                self._notify(str(kind), obj)
        return False

    async def run(self) -> None:
        """Keep the copy current until cancelled."""
        failures = 0
        relist = True
        while True:
            try:
                if relist:
                    await self._list()
                    relist = False
                relist = await self._watch()
                # A watch that ends at once with 410 right after a fresh list is a server
                # in trouble: count it as a failure, so the loop backs off instead of spinning.
                failures = failures + 1 if relist else 0
            except kube.KubeError as error:
                relist = relist or error.gone  # a failed list is listed again
                failures += 1
                self.last_error = error
                log.info("watch %s failed: %s", self.path, error)
            if failures > 1:
                delay = core_backoff.delay_s(
                    self.settings.retry, retry=failures - 1, jitter=self._rng.random())
                await self._sleep(delay)
