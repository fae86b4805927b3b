"""Kubernetes actuation benchmark: decision -> /scale PATCH, no-op apply, watch propagation.

Usage: .venv/bin/python bench/kube_actuation.py [--applies 500] [--models 50] [--reads 2000]

Against the API emulator on loopback (one process, one event loop), through
kubernetes_asyncio's ApiClient exactly as in production:
- apply (change): KubeReplicaActuator.apply for a decision that changes replicas: the HPA
  ownership check (cached), GET /scale, PATCH /scale with the resourceVersion precondition,
  and the Event POST. Latency per apply, p50/p99, and applies/s over --models Deployments.
- apply (unchanged): the same with desired == current: one GET, no write.
- watch propagation: a pod status write in the emulator store -> the cluster reader's pod
  informer has it (the path pod timelines take).
- read: KubeClusterReader.read of the --models Deployments, round robin, --reads times,
  with the reader's Deployment informer (the default) and with its list refused (403), so
  that it GETs /scale at every read as it did before the informer: API requests the
  emulator answered per read, and the read's latency; with the informer, also how long
  after a /scale write's answer the informer holds the new spec.replicas (the window in
  which a read is stale).
- memory held: what an informer's copy of the --models Deployments (each after the apply
  phase's scale writes, so with their managed fields) holds in memory, traced, a
  Deployment: kept whole, as `watch.kept` keeps objects (no managedFields), and as the
  cluster reader's target informers keep them (`cluster_reader.workload_kept`).
The emulator's own cost is included, so a real API server (etcd, admission, network) adds
its latency on top: these numbers bound the scaler's own overhead, not a cluster's.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scaler.actuators import base, cluster_reader, events, replicas, resources, watch  # noqa: E402
from scaler.actuators import client as kube  # noqa: E402
from scaler.actuators import settings as kube_settings  # noqa: E402
from scaler.emulator import Fault  # noqa: E402
from scaler.emulator import env as kube_env  # noqa: E402
from scaler.engine import types  # noqa: E402
from scaler.policy import model  # noqa: E402


def policy(namespace: str, name: str) -> model.ScalePolicy:
    return model.ScalePolicy(
        api_version="scaler.io/v1alpha1", kind="ScalePolicy",
        metadata=model.Metadata(name=name, namespace=namespace),
        spec=model.ScalePolicySpec(
            target=model.Target(name=name), replicas=model.Replicas(min=0, max=1_000_000),
            signals=model.Signals(concurrency=model.ConcurrencySignal(target_per_replica=1))))


def decision(key: str, current: int, desired: int) -> types.Decision:
    return types.Decision(model=key, at=0.0, current=current, desired=desired,
                          recommendation=desired, winner="concurrency", signals=())


def quantiles(samples: list[float]) -> str:
    ms = sorted(s * 1000 for s in samples)
    p99 = ms[min(len(ms) - 1, int(len(ms) * 0.99))]
    return f"p50 {statistics.median(ms):.2f} ms, p99 {p99:.2f} ms"


async def reads(kube: kube_env.KubeTestEnv, settings: kube_settings.KubeSettings,
                policies: list[model.ScalePolicy], *, count: int, watched: bool) -> str:
    """`count` reads of `policies` round robin by a fresh reader; watched=False refuses
    the Deployment list (403) so every read GETs the target's /scale instead."""
    assert kube.emulator is not None
    fault = None
    if not watched:
        path = cluster_reader.workloads_path("deployments", kube.namespace)
        fault = kube.emulator.inject(Fault(verb="list", path=f"^{path}$", status=403,
                                           times=10**9))
    reader = cluster_reader.KubeClusterReader(kube.api, settings=settings, wall_clock=time.time)
    await reader.start()
    try:
        informer = reader.workload_informer(resources.target_ref(policies[0]))
        assert informer is not None
        while not informer.synced.is_set() and informer.last_error is None:
            await asyncio.sleep(0.01)
        await reader.read(policies[0])  # listed (or refused) once, before timing
        before = len(kube.emulator.requests)
        latencies = []
        for i in range(count):
            t0 = time.perf_counter()
            await reader.read(policies[i % len(policies)])
            latencies.append(time.perf_counter() - t0)
        # Only requests answered during the reads; a watch is recorded when it ends.
        answered = [r for r in kube.emulator.requests[before:] if r.verb != "watch"]
        lag = ""
        if watched:
            lags = []
            ref = resources.target_ref(policies[0])
            key = f"{ref.namespace}/{ref.name}"
            for replicas_now in range(1, 201):
                await kube.api.merge_patch(ref.scale_path, {"spec": {"replicas": replicas_now}})
                t0 = time.perf_counter()  # from the write's answer: what a read may miss
                while replicas.spec_replicas(informer.objects[key]) != replicas_now:
                    await asyncio.sleep(0)
                lags.append(time.perf_counter() - t0)
            lag = f"; a /scale write's answer -> the informer has it: {quantiles(lags)}"
    finally:
        await reader.stop()
        if fault is not None:
            fault.times = 0
    per_read = len(answered) / count
    return f"{quantiles(latencies)}, {per_read:.2f} API requests a read{lag}"


async def held_kib(kube: kube_env.KubeTestEnv, keep: Callable[[kube.Obj], kube.Obj], count: int
                   ) -> float:
    """KiB an object that an informer's copy of the namespace's Deployments holds, kept by
    `keep`: the traced memory the copy frees when dropped, over `count` objects."""
    informer = watch.Informer(kube.api, path=kube.collection("apps/v1", "deployments"),
                              settings=kube.settings, keep=keep)
    tracemalloc.start()
    task = asyncio.create_task(informer.run())
    try:
        await informer.synced.wait()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    gc.collect()
    held = tracemalloc.get_traced_memory()[0]
    informer.objects = {}
    gc.collect()
    held -= tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return held / count / 1024


async def main(applies: int, models: int, read_count: int) -> None:
    async with kube_env.kube_test_env(kubeconfig=None, wall_clock=time.time) as kube:
        settings = kube_settings.KubeSettings(
            events=kube_settings.EventSettings(burst=10**9, refill_seconds=1))
        recorder = events.EventRecorder(kube.api, settings=settings.events,
                                        wall_clock=time.time, instance="bench")
        actuator = replicas.KubeReplicaActuator(kube.api, settings=settings, recorder=recorder,
                                                leader=base.AlwaysLeader())
        policies = [policy(kube.namespace, f"m{i}") for i in range(models)]
        for p in policies:
            await kube.create_deployment(p.name, replicas=0)
        counts = [0] * models

        latencies: list[float] = []
        started = time.perf_counter()
        for i in range(applies):
            k = i % models
            t0 = time.perf_counter()
            outcome = await actuator.apply(policies[k],
                                           decision(policies[k].key, counts[k], counts[k] + 1))
            latencies.append(time.perf_counter() - t0)
            assert outcome.outcome is base.Outcome.APPLIED, outcome
            counts[k] += 1
        elapsed = time.perf_counter() - started
        print(f"apply (change):    {quantiles(latencies)}, {applies / elapsed:.0f} applies/s")

        latencies = []
        for i in range(applies):
            k = i % models
            t0 = time.perf_counter()
            outcome = await actuator.apply(policies[k],
                                           decision(policies[k].key, counts[k], counts[k]))
            latencies.append(time.perf_counter() - t0)
            assert outcome.outcome is base.Outcome.UNCHANGED
        print(f"apply (unchanged): {quantiles(latencies)}")

        assert kube.emulator is not None
        reader = cluster_reader.KubeClusterReader(kube.api, settings=settings, wall_clock=time.time)
        await reader.start()
        try:
            await reader.wait_synced(kube.namespace)
            pods = kube.emulator.resource("", "pods")
            latencies = []
            for i in range(200):
                name = f"p{i}"
                t0 = time.perf_counter()
                kube.emulator.store.create(pods, kube.namespace,
                                           {"metadata": {"name": name}, "spec": {}})
                key = f"{kube.namespace}/{name}"
                while key not in reader.pods[kube.namespace].objects:
                    await asyncio.sleep(0)
                latencies.append(time.perf_counter() - t0)
            print(f"watch propagation: {quantiles(latencies)}")
        finally:
            await reader.stop()

        watched = settings.model_copy(update={"watch_namespaces": (kube.namespace,)})
        for label, informed in (("GET /scale", False), ("informer", True)):
            result = await reads(kube, watched, policies, count=read_count, watched=informed)
            print(f"read ({label}): {result}")

        sizes = [f"{label} {await held_kib(kube, keep, models):.1f} KiB"
                 for label, keep in (("whole", lambda obj: obj), ("kept", watch.kept),
                                     ("target informer", cluster_reader.workload_kept))]
        print(f"memory held a Deployment: {', '.join(sizes)}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--applies", type=int, default=500)
    parser.add_argument("--models", type=int, default=50)
    parser.add_argument("--reads", type=int, default=2000)
    args = parser.parse_args()
    asyncio.run(main(args.applies, args.models, args.reads))
