"""Builders of policies and evaluations for the service tests."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

from scaler import emulator as kube_emulator
from scaler.actuators import settings as kube_settings
from scaler.core import backoff as core_backoff
from scaler.engine import types
from scaler.policy import model
from scaler.service import settings
from scaler.service import state as service_state

NOW = 1_764_410_000.0  # 2025-11-29T09:53:20Z, a fixed wall-clock instant


def policy(
    name: str = "llama-70b",
    *,
    namespace: str = "inference",
    labels: dict[str, str] | None = None,
    spec: dict[str, Any] | None = None,
) -> model.ScalePolicy:
    body: dict[str, Any] = {
        "target": {"name": name},
        "replicas": {"min": 1, "max": 16},
        "signals": {
            "concurrency": {"targetPerReplica": 48},
            "queueDepth": {"targetWaitingPerReplica": 4},
            "tokensPerSecond": {"capacityPerReplica": 2400},
            "p95Latency": {"sloSeconds": 2.0},
        },
        "staleAfterSeconds": 30,
        "cost": {"gpuHourly": 2.5},
    }
    body.update(spec or {})
    return model.ScalePolicy.model_validate({
        "apiVersion": "scaler.io/v1alpha1",
        "kind": "ScalePolicy",
        "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
        "spec": body,
    })


def observation(
    *,
    at: float = NOW,
    current: int = 2,
    desired: int = 3,
    ready: int = 2,
    starting: tuple[float, ...] = (),
    queue_depth: float | None = 12.0,
    in_flight: float | None = 30.0,
    tokens_per_second: float | None = 2400.5,
    p95_latency_s: float | None = 1.8,
    arrival_rate: float | None = None,
    age_s: float = 0.5,
    held: bool = False,
    clamps: tuple[types.Clamp, ...] = (),
    model_name: str = "inference/llama-70b",
) -> service_state.Observation:
    def value(v: float | None) -> types.SignalValue | None:
        return None if v is None else types.SignalValue.assess(v, age_s=age_s, stale_after_s=30.0)

    snapshot = types.SignalSnapshot(
        queue_depth=value(queue_depth),
        in_flight=value(in_flight),
        tokens_per_second=value(tokens_per_second),
        p95_latency=value(p95_latency_s),
        arrival_rate=value(arrival_rate),
    )
    decision = types.Decision(
        model=model_name,
        at=at,
        current=current,
        desired=desired,
        recommendation=desired,
        winner="concurrency" if not held else None,
        signals=(
            types.SignalReason(name="concurrency", value=42.0, age_s=age_s, fresh=True,
                               recommendation=desired, detail="ceil(42 / 48) = 1"),
            types.SignalReason(name="queue_depth", value=queue_depth, age_s=age_s, fresh=True,
                               recommendation=2, detail="12 waiting on 2 ready"),
        ),
        clamps=clamps,
        forecast=types.Forecast(time_to_ready_s=150.0, needs_node=False, demand_now=0.9,
                                slope_per_s=0.001, demand_at_ready=1.05,
                                replicas_at_ready=desired, replicas_at_node_ready=desired),
        held=held,
    )
    cluster = types.ClusterState(current=current, ready=ready, starting=starting)
    return service_state.Observation(decision=decision, snapshot=snapshot, cluster=cluster,
                                     at=at)


def loaded_state(*policies: model.ScalePolicy) -> service_state.ServiceState:
    registry = service_state.ServiceState()
    registry.set_policies(
        policies, status=service_state.PolicyLoadStatus(at=NOW, policies=len(policies))
    )
    return registry


def resource_settings(*, nats_url: str, kube: kube_settings.KubeSettings, namespace: str,
                      **kube_updates: Any) -> settings.Settings:
    """A service on loopback over a test cluster (`kube`: an emulator's or a real one's)
    for end-to-end tests: ScalePolicy, GpuPool and GpuBudget resources as the only policy
    source, watched in `namespace` (the Lease there too), fast ticks and status writes, an
    ephemeral HTTP port, no metrics API; `kube_updates` change more kube settings."""
    return settings.load_settings(environ={}).model_copy(update={
        "nats": settings.NatsSettings(
            servers=(nats_url,), reconnect=core_backoff.Backoff(base_delay_s=0.05)),
        "kube": kube.model_copy(update={
            "watch_namespaces": (namespace,),
            "lease": kube_settings.LeaseSettings(namespace=namespace, retry_period_s=0.2,
                                                 renew_deadline_s=5.0), **kube_updates}),
        "http": settings.HttpSettings(host="127.0.0.1", port=0),
        "metrics_api": settings.MetricsApiSettings(enabled=False),
        "engine": settings.EngineSettings(backstop_tick_seconds=0.2, coalesce_seconds=0.05),
        "policies": settings.PolicySettings(paths=[], resources=True, reload_poll_seconds=0.1,
                                            status_min_interval_seconds=0.1),
    })


def loopback_settings(*, nats_url: str, kube_url: str, policies: Path, audit: Path,
                      dry_run: bool = False) -> settings.Settings:
    """A service on loopback for end-to-end tests: NATS and the API at the given URLs,
    policies polled from `policies`, fast ticks, an ephemeral HTTP port, no metrics API."""
    return settings.load_settings(environ={}).model_copy(update={
        "nats": settings.NatsSettings(
            servers=(nats_url,), reconnect=core_backoff.Backoff(base_delay_s=0.05)),
        "kube": kube_settings.KubeSettings(
            host=kube_url, dry_run=dry_run,
            lease=kube_settings.LeaseSettings(namespace="scaler", retry_period_s=0.2,
                                              renew_deadline_s=5.0)),
        "http": settings.HttpSettings(host="127.0.0.1", port=0),
        "metrics_api": settings.MetricsApiSettings(enabled=False),
        "engine": settings.EngineSettings(backstop_tick_seconds=0.5, coalesce_seconds=0.05),
        "policies": settings.PolicySettings(paths=[policies], reload_poll_seconds=0.1),
        "audit": settings.AuditSettings(path=audit),
    })


def deployment(name: str, replicas: int) -> dict[str, Any]:
    """A minimal vLLM Deployment body for the emulator's store, its pods labelled app=name."""
    labels = {"app": name}
    return {"metadata": {"name": name},
            "spec": {"replicas": replicas, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels},
                                  "spec": {"containers": [{"name": "vllm", "image": "x"}]}}}}


@contextlib.asynccontextmanager
async def cluster(deployments: Mapping[str, int], *, namespace: str = "inference",
                  pods: bool = False) -> AsyncIterator[kube_emulator.KubeEmulator]:
    """The emulator as a cluster the service tests run against: a controller writes
    Deployment status (as in every real cluster), the namespaces exist (a real API server
    refuses missing ones), `deployments` by name and replicas; `pods`: a pod controller
    makes their pods and marks them Ready at once."""
    async with kube_emulator.KubeEmulator(
            clock=time.time, options=kube_emulator.EmulatorOptions(status_writer=True)) as emu:
        for each in (namespace, "scaler"):
            emu.ensure_namespace(each)
        for name, replicas in deployments.items():
            emu.store.create(emu.resource("apps", "deployments"), namespace,
                             deployment(name, replicas))
        task = None if not pods else asyncio.create_task(kube_emulator.EmulatorController(
            emu, kube_emulator.ControllerSettings(interval_s=0.02)).run(),
            name="emulator-controller")
        try:
            yield emu
        finally:
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
