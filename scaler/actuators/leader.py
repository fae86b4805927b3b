"""Leader election on a coordination.k8s.io/v1 Lease: acquire, renew, release, take over."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from scaler.actuators import client as kube
from scaler.actuators import settings as kube_settings
from scaler.actuators import timefmt

log = logging.getLogger(__name__)


class LeaseElector:
    """Implements `base.LeaderElector` with client-go's algorithm.

    Expiry is judged on the local clock, not the Lease's timestamps: a follower notes when
    it last saw the Lease change (its resourceVersion) and takes over only after
    `leaseDurationSeconds` more without a change. Clock skew between nodes thus cannot
    cause two leaders. Every write carries the resourceVersion that was read, so of two
    candidates racing for an expired Lease exactly one wins and the other gets 409.

    `monotonic` defaults to the event loop clock; `wall_clock` stamps acquireTime and
    renewTime (MicroTime), which are informational for humans and `kubectl`.
    """

    def __init__(self, api: kube.KubeApi, *, settings: kube_settings.LeaseSettings,
                 identity: str, wall_clock: timefmt.WallClock,
                 monotonic: Callable[[], float] | None = None,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self.api = api
        self.settings = settings
        self._identity = identity
        self.wall_clock = wall_clock
        self._monotonic = monotonic
        self._sleep = sleep
        self._observed_version: str | None = None
        self._observed_at = 0.0
        self._renewed_at: float | None = None
        self.transitions = 0  # times this elector became leader
        # What the log last said (leading or not), so each change is one line: gained at
        # INFO, lost at WARNING with why, whether seen on a round or by the deadline.
        self._reported = False
        self._why_lost = ""

    @property
    def identity(self) -> str:
        return self._identity

    @property
    def path(self) -> str:
        return (f"/apis/coordination.k8s.io/v1/namespaces/{self.settings.namespace}"
                f"/leases/{self.settings.name}")

    def _now(self) -> float:
        return timefmt.loop_now(self._monotonic)

    @property
    def is_leader(self) -> bool:
        """True only within `renew_deadline_s` of the last successful renew: a leader that
        cannot reach the API stops acting before anyone else may take over."""
        if self._renewed_at is None:
            return False
        return self._now() - self._renewed_at < self.settings.renew_deadline_s

    def _observe(self, lease: kube.Obj, now: float) -> None:
        version = str(lease["metadata"]["resourceVersion"])
        if version != self._observed_version:
            self._observed_version = version
            self._observed_at = now

    def _became_leader(self, now: float) -> None:
        if not self.is_leader:
            self.transitions += 1
        self._renewed_at = now

    def _lost(self, why: str) -> None:
        self._why_lost = why
        self._renewed_at = None

    def _failed(self, what: str, error: kube.KubeError) -> None:
        # The lease stays ours until the renew deadline; past it, this is why we stopped.
        self._why_lost = (f"not renewed within {self.settings.renew_deadline_s:g} s "
                          f"({what}: {error})")
        log.info("%s: %s", what, error)

    def _report(self) -> bool:
        leading = self.is_leader
        if leading and not self._reported:
            log.info("%s is now the leader (lease %s/%s)", self._identity,
                     self.settings.namespace, self.settings.name)
        elif self._reported and not leading:
            log.warning("%s lost leadership of lease %s/%s: %s; it stops scaling",
                        self._identity, self.settings.namespace, self.settings.name,
                        self._why_lost or "not renewed in time")
        self._reported = leading
        return leading

    async def try_acquire_or_renew(self) -> bool:
        """One round: create, renew or take over the Lease. Returns whether we lead.

        A change of leadership is logged once: gained at INFO, lost at WARNING (also when
        it lapsed for want of renewal, noticed on the round after the deadline)."""
        await self._round()
        return self._report()

    async def _round(self) -> None:
        now = self._now()
        stamp = timefmt.micro_time(self.wall_clock())
        try:
            lease = await self.api.get(self.path)
        except kube.KubeError as error:
            if not error.not_found:
                self._failed("lease read failed", error)
                return
            await self._create(now, stamp)
            return
        self._observe(lease, now)
        spec: dict[str, Any] = dict(lease.get("spec") or {})
        holder = spec.get("holderIdentity") or ""
        duration = int(spec.get("leaseDurationSeconds") or self.settings.lease_duration_s)
        if holder and holder != self._identity and now < self._observed_at + duration:
            self._lost(f"held by {holder}")
            return
        if holder != self._identity:
            spec.update(holderIdentity=self._identity, acquireTime=stamp,
                        leaseTransitions=int(spec.get("leaseTransitions") or 0) + 1)
        spec.update(renewTime=stamp, leaseDurationSeconds=self.settings.lease_duration_s)
        try:
            updated = await self.api.request("PUT", self.path, body={**lease, "spec": spec})
        except kube.KubeError as error:
            if error.conflict:
                self._lost("another candidate wrote the lease first")
                return
            self._failed("lease update failed", error)
            return
        self._observe(updated, now)
        self._became_leader(now)

    async def _create(self, now: float, stamp: str) -> None:
        body = {
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": self.settings.name, "namespace": self.settings.namespace},
            "spec": {"holderIdentity": self._identity, "acquireTime": stamp,
                     "renewTime": stamp, "leaseTransitions": 0,
                     "leaseDurationSeconds": self.settings.lease_duration_s},
        }
        try:
            created = await self.api.request("POST", self.path.rpartition("/")[0], body=body)
        except kube.KubeError as error:
            log.info("lease create failed: %s", error)  # 409: another candidate created it
            return
        self._observe(created, now)
        self._became_leader(now)

    async def run(self) -> None:
        """Acquire, then renew every `retry_period_s`, until cancelled."""
        while True:
            await self.try_acquire_or_renew()
            await self._sleep(self.settings.retry_period_s)

    async def release(self) -> None:
        """On shutdown: clear holderIdentity so a follower takes over on its next round,
        instead of waiting `leaseDurationSeconds` for expiry."""
        if self._renewed_at is None:
            return
        self._renewed_at = None
        if self._reported:
            log.info("%s releases leadership of lease %s/%s (shutting down)", self._identity,
                     self.settings.namespace, self.settings.name)
            self._reported = False
        try:
            lease = await self.api.get(self.path)
            spec = dict(lease.get("spec") or {})
            if spec.get("holderIdentity") != self._identity:
                return
            spec.pop("holderIdentity", None)
            spec.update(leaseDurationSeconds=1, renewTime=timefmt.micro_time(self.wall_clock()))
            await self.api.request("PUT", self.path, body={**lease, "spec": spec})
        except kube.KubeError as error:
            log.warning("lease release failed (others take over after expiry): %s", error)
