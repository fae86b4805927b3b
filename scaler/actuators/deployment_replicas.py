"""A Deployment's replica counts over time, watched for a live run's replica timeline."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Protocol

from scaler.actuators import client as kube
from scaler.actuators import settings as kube_settings
from scaler.actuators import watch


class ReplicaSink(Protocol):
    """Where readings go (scaler.sim.live_replicas.Timeline is one)."""

    def record(self, *, at: float, desired: int, allocated: int, ready: int) -> None: ...


class DeploymentUnreadable(Exception):
    """The Deployment cannot be read at all (not found, forbidden, no API server)."""


def _count(value: object) -> int:
    # The API omits zero counts (status.readyReplicas absent means 0).
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def deployment_counts(deployment: kube.Obj) -> tuple[int, int, int]:
    """(desired, allocated, ready) of a Deployment object.

    allocated is status.replicas (pods that exist, not yet ready ones included: they hold
    their GPUs); before the controller's first status write it is taken as spec.replicas.
    spec.replicas absent is the API's default, 1.
    """
    spec = deployment.get("spec") or {}
    status = deployment.get("status") or {}
    desired = spec.get("replicas", 1)
    desired = max(desired, 0) if isinstance(desired, int) and not isinstance(desired,
                                                                           bool) else 1
    allocated = _count(status.get("replicas")) if "observedGeneration" in status else desired
    return desired, allocated, _count(status.get("readyReplicas"))


@dataclass
class DeploymentSource:
    """A Deployment read through the project's Kubernetes client: got once (a missing or
    forbidden one fails at once), then listed and watched (watch.Informer), so each change
    is recorded when the API server sends it, at the event loop's time.

    `api` is an open client (tests pass the emulator's); without it one is made from
    `settings` (a kubeconfig) and closed when following ends.
    """

    namespace: str
    deployment: str
    settings: kube_settings.KubeSettings
    api: kube.KubeApi | None = None

    @property
    def name(self) -> str:
        return f"deployment {self.namespace}/{self.deployment}"

    async def follow(self, sink: ReplicaSink) -> None:
        """Record the counts until cancelled."""
        owned: Any = None
        api = self.api
        if api is None:
            owned = await kube.make_api_client(self.settings)
            api = kube.KubeApi(owned, timeout_s=self.settings.request_timeout_s,
                               retry=self.settings.retry)
        loop = asyncio.get_running_loop()
        collection = f"/apis/apps/v1/namespaces/{self.namespace}/deployments"

        def record(deployment: kube.Obj) -> None:
            desired, allocated, ready = deployment_counts(deployment)
            sink.record(at=loop.time(), desired=desired, allocated=allocated, ready=ready)

        def changed(kind: str, obj: kube.Obj) -> None:
            if (obj.get("metadata") or {}).get("name") != self.deployment:
                return
            if kind == "DELETED":
                sink.record(at=loop.time(), desired=0, allocated=0, ready=0)
            else:
                record(obj)

        try:
            try:
                record(await api.get(f"{collection}/{self.deployment}"))
            except kube.KubeError as error:
                raise DeploymentUnreadable(f"{self.name}: {error}") from None
            await watch.Informer(api, path=collection, settings=self.settings,
                                 on_change=changed).run()
        finally:
            if owned is not None:
                await owned.close()


def source(*, kubeconfig: str, context: str | None, namespace: str, deployment: str
           ) -> DeploymentSource:
    """A DeploymentSource through a kubeconfig file (what `scaler loadtest --kubeconfig`
    builds)."""
    settings = kube_settings.KubeSettings(kubeconfig=kubeconfig, context=context)
    return DeploymentSource(namespace=namespace, deployment=deployment, settings=settings)
