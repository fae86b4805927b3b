"""core/v1 Events on scaled objects, rate-limited per object by a token bucket."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from scaler.actuators import client as kube
from scaler.actuators import resources, timefmt
from scaler.actuators import settings as kube_settings

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Bucket:
    tokens: float
    updated_at: float


class EventRecorder:
    """Posts Events, at most `burst` at once and one per `refill_seconds` after, per object.

    `monotonic` is the event loop clock by default (tests pass a fake); `wall_clock` stamps
    the Event's timestamps. Events are best effort: a failure is logged, never raised, so
    an Event can never turn an applied scale change into a failed one.
    """

    def __init__(self, api: kube.KubeApi, *, settings: kube_settings.EventSettings,
                 wall_clock: timefmt.WallClock, instance: str,
                 monotonic: Callable[[], float] | None = None) -> None:
        self.api = api
        self.settings = settings
        self.wall_clock = wall_clock
        self.instance = instance
        self._monotonic = monotonic
        self._buckets: dict[str, _Bucket] = {}
        self.suppressed = 0
        self.posted = 0

    def _now(self) -> float:
        return timefmt.loop_now(self._monotonic)

    def _take(self, key: str) -> bool:
        now = self._now()
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = _Bucket(float(self.settings.burst), now)
        # Refill: with refill 60 s, 30 s after the bucket emptied it holds half a token.
        refill = (now - bucket.updated_at) / self.settings.refill_seconds
        bucket.tokens = min(float(self.settings.burst), bucket.tokens + refill)
        bucket.updated_at = now
        if bucket.tokens < 1.0:
            return False
        bucket.tokens -= 1.0
        return True

    async def record(self, ref: resources.ObjectRef, *, reason: str, message: str,
                     warning: bool = False, uid: str | None = None) -> bool:
        """Post one Event about `ref` (with its `uid`, `kubectl describe` lists it); returns
        whether it was posted."""
        if not self.settings.enabled:
            return False
        if not self._take(ref.key):
            self.suppressed += 1
            log.info("event suppressed (rate limit) on %s: %s %s", ref.key, reason, message)
            return False
        now = self.wall_clock()
        body = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{ref.name}.", "namespace": ref.namespace},
            "involvedObject": ref.involved_object(uid),
            "reason": reason,
            "message": message[:1024],
            "type": "Warning" if warning else "Normal",
            "firstTimestamp": timefmt.rfc3339(now),
            "lastTimestamp": timefmt.rfc3339(now),
            "count": 1,
            "source": {"component": self.settings.component},
            "reportingComponent": self.settings.component,
            "reportingInstance": self.instance,
        }
        try:
            await self.api.request("POST", f"/api/v1/namespaces/{ref.namespace}/events",
                                   body=body)
        except kube.KubeError as error:
            log.warning("could not post event on %s: %s", ref.key, error)
            return False
        self.posted += 1
        return True
