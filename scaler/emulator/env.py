"""A test environment: the emulator on loopback, or a real cluster from a kubeconfig."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

from scaler.actuators import client as kube
from scaler.actuators import settings as kube_settings
from scaler.actuators import timefmt
from scaler.emulator.server import EmulatorOptions, KubeEmulator


@dataclass(slots=True)
class ManualClock:
    """A clock tests move by hand: epoch seconds (wall) or loop-like seconds (monotonic)."""

    now: float = 1_764_400_000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass(slots=True)
class KubeTestEnv:
    """What a test gets: one shared ApiClient, a fresh namespace, and the emulator when the
    test does not run against a real cluster (`emulator is None` then)."""

    api: kube.KubeApi
    namespace: str
    settings: kube_settings.KubeSettings
    emulator: KubeEmulator | None = None

    def with_api(self, *, sleep: kube.Sleep | None = None, timeout_s: float | None = None,
                 retry: kube_settings.RetrySettings | None = None) -> kube.KubeApi:
        """Another KubeApi over the same client, e.g. with a fake sleep or other retries."""
        return kube.KubeApi(self.api.api_client, timeout_s=timeout_s or self.api.timeout_s,
                            retry=retry or self.api.retry, sleep=sleep or self.api.sleep)

    def collection(self, api_version: str, plural: str) -> str:
        root = f"/apis/{api_version}" if "/" in api_version else f"/api/{api_version}"
        return f"{root}/namespaces/{self.namespace}/{plural}"

    async def create(self, api_version: str, plural: str, body: kube.Obj) -> kube.Obj:
        return await self.api.request("POST", self.collection(api_version, plural), body=body)

    async def create_deployment(self, name: str, *, replicas: int, gpus: int = 0,
                                resource_name: str = "nvidia.com/gpu") -> kube.Obj:
        """A Deployment of pause containers labelled app=<name> (GPUs requested if > 0)."""
        resources: kube.Obj = {}
        if gpus:
            resources = {"requests": {resource_name: str(gpus)},
                         "limits": {resource_name: str(gpus)}}
        return await self.create("apps/v1", "deployments", {
            "metadata": {"name": name, "labels": {"app": name}},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": {"app": name}},
                "template": {
                    "metadata": {"labels": {"app": name}},
                    "spec": {"containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                                             "resources": resources}]},
                },
            },
        })


@contextlib.asynccontextmanager
async def kube_test_env(*, kubeconfig: str | None, wall_clock: timefmt.WallClock,
                        options: EmulatorOptions | None = None,
                        timeout_s: float = 5.0) -> AsyncIterator[KubeTestEnv]:
    """Start the emulator (or use `kubeconfig`), create a namespace; remove both after.

    Without `options` the emulator runs with the deployment controller's status writes on
    (`EmulatorOptions(status_writer=True)`), so tests meet a second writer, as in a real
    cluster.
    """
    emulator: KubeEmulator | None = None
    if kubeconfig:
        settings = kube_settings.KubeSettings(kubeconfig=kubeconfig, request_timeout_s=timeout_s)
    else:
        emulator = KubeEmulator(clock=wall_clock,
                                options=options or EmulatorOptions(status_writer=True))
        settings = kube_settings.KubeSettings(host=await emulator.start(),
                                              request_timeout_s=timeout_s)
    api_client = await kube.make_api_client(settings)
    namespace = f"scaler-test-{uuid.uuid4().hex[:8]}"
    api = kube.KubeApi(api_client, timeout_s=timeout_s)
    try:
        await api.request("POST", "/api/v1/namespaces",
                          body={"metadata": {"name": namespace}})
        yield KubeTestEnv(api=api, namespace=namespace, settings=settings, emulator=emulator)
    finally:
        with contextlib.suppress(kube.KubeError):
            await api.request("DELETE", f"/api/v1/namespaces/{namespace}")
        await api_client.close()
        if emulator is not None:
            await emulator.stop()
