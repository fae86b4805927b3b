"""Publish-to-patch latency of the service: NATS message -> decision -> PATCH /scale.

Usage: .venv/bin/python bench/service_latency.py [--models 1 100 1000] [--probes 200]
                                                   [--interval 5] [--json OUT]

Per model count N: a real nats-server, the Kubernetes API emulator (in this process,
standing in for the API server) with N Deployments, and the real service (`Service`,
policies from a temp folder, AlwaysLeader, no external metrics API). Every model gets a
background report every --interval seconds from its own source (steady demand: no
patches); each probe then publishes a report for one random model that changes its
replicas (5 <-> 10) and waits for the emulator to store the new spec.replicas. Latency
= time from just before `publish` to the moment the emulator stores the patch; probes
run one after another with a short random gap. Everything shares one machine: the
emulator and the publisher also run on the service's event loop, so figures are upper
bounds for the service alone.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import nats  # noqa: E402

from scaler import emulator as kube_emulator
from scaler.actuators import settings as kube_settings  # noqa: E402
from scaler.service import runner, settings  # noqa: E402
from scaler.testing import nats_server  # noqa: E402

NAMESPACE = "bench"
BASE_IN_FLIGHT = 50.0  # -> 5 replicas at 10 per replica
PROBE_IN_FLIGHT = 50.0  # + base -> 10 replicas

POLICY = """\
apiVersion: scaler.io/v1alpha1
kind: ScalePolicy
metadata: {{name: {name}, namespace: bench}}
spec:
  target: {{name: {name}}}
  replicas: {{min: 1, max: 100}}
  signals: {{concurrency: {{targetPerReplica: 10}}}}
  behavior:
    scaleUp: {{stabilizationSeconds: 0, policies: [{{type: Pods, value: 100, periodSeconds: 1}}]}}
    scaleDown:
      stabilizationSeconds: 0
      policies: [{{type: Percent, value: 100, periodSeconds: 1}}]
  forecast: {{enabled: false}}
---
"""


def name(index: int) -> str:
    return f"model-{index}"


def body(index: int, *, source: str, in_flight: float) -> bytes:
    return json.dumps({"v": 1, "model": name(index), "namespace": NAMESPACE, "source": source,
                       "ts": time.time(), "in_flight": in_flight}).encode()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


async def run_one(models: int, *, probes: int, interval: float, nats_url: str) -> dict[str, Any]:
    emulator = kube_emulator.KubeEmulator(clock=time.time)
    await emulator.start()
    deployments = emulator.resource("apps", "deployments")
    emulator.ensure_namespace(NAMESPACE)  # Events go there; a missing namespace is a 404
    for index in range(models):
        emulator.store.create(deployments, NAMESPACE, {
            "metadata": {"name": name(index)},
            "spec": {"replicas": 5, "selector": {"matchLabels": {"app": name(index)}},
                     "template": {"metadata": {"labels": {"app": name(index)}}}}})
    # Patches as the emulator stores them: (name, replicas) -> waiting future.
    waiting: dict[tuple[str, int], asyncio.Future[float]] = {}
    watcher = emulator.store.subscribe(deployments, lambda obj: True)

    async def watch_patches() -> None:
        while (event := await watcher.queue.get()) is not None:
            key = (event.obj["metadata"]["name"], int(event.obj["spec"]["replicas"]))
            future = waiting.pop(key, None)
            if future is not None and not future.done():
                future.set_result(time.perf_counter())

    watch_task = asyncio.create_task(watch_patches(), name="bench-watch")
    folder = Path(tempfile.mkdtemp(prefix="scaler-bench-"))
    (folder / "policies.yaml").write_text("".join(POLICY.format(name=name(i))
                                                  for i in range(models)))
    config = settings.load_settings(environ={}).model_copy(update={
        "nats": settings.NatsSettings(servers=(nats_url,)),
        "kube": kube_settings.KubeSettings(host=emulator.url,
                                           lease=kube_settings.LeaseSettings(enabled=False),
                                           events=kube_settings.EventSettings(enabled=False)),
        "http": settings.HttpSettings(host="127.0.0.1", port=0),
        "metrics_api": settings.MetricsApiSettings(enabled=False),
        "policies": settings.PolicySettings(paths=[folder], reload_poll_seconds=30),
    })
    service = runner.Service(config)
    await service.start()
    await service.nats.wait_ready()
    client = await nats.connect(nats_url, pending_size=64 * 1024 * 1024)

    async def background() -> None:
        # Every model reports steady demand every `interval` s, spread evenly.
        pause = interval / models
        while True:
            for index in range(models):
                await client.publish(f"scaler.signals.{NAMESPACE}.{name(index)}",
                                     body(index, source="pod-0", in_flight=BASE_IN_FLIGHT))
                await asyncio.sleep(pause)

    load = asyncio.create_task(background(), name="bench-background")
    await asyncio.sleep(min(interval, 5.0) + 1.0)  # one full round of background reports
    await service.reactor.idle()
    rng = random.Random(7)
    probe_in_flight = {index: 0.0 for index in range(models)}
    latencies: list[float] = []
    evaluations_before = service.reactor.evaluations
    try:
        for _ in range(probes):
            index = rng.randrange(models)
            probe_in_flight[index] = PROBE_IN_FLIGHT - probe_in_flight[index]
            replicas = 10 if probe_in_flight[index] else 5
            future: asyncio.Future[float] = asyncio.get_running_loop().create_future()
            waiting[(name(index), replicas)] = future
            started = time.perf_counter()
            await client.publish(f"scaler.signals.{NAMESPACE}.{name(index)}",
                                 body(index, source="probe", in_flight=probe_in_flight[index]))
            await client.flush()
            done = await asyncio.wait_for(future, timeout=10.0)
            latencies.append((done - started) * 1000.0)
            await asyncio.sleep(rng.uniform(0.01, 0.05))
    finally:
        load.cancel()
        await asyncio.gather(load, return_exceptions=True)
        await client.close()
        await service.stop()
        emulator.store.unsubscribe(watcher)
        watcher.queue.put_nowait(None)
        await watch_task
        await emulator.stop()
    return {
        "models": models, "probes": len(latencies),
        "background_msgs_per_s": round(models / interval, 1),
        "evaluations": service.reactor.evaluations - evaluations_before,
        "p50_ms": round(statistics.median(latencies), 2),
        "p99_ms": round(percentile(latencies, 0.99), 2),
        "max_ms": round(max(latencies), 2),
    }


async def main(args: argparse.Namespace) -> list[dict[str, Any]]:
    server = nats_server.NatsServer(jetstream=False)
    server.start()
    try:
        results = []
        for models in args.models:
            result = await run_one(models, probes=args.probes, interval=args.interval,
                                   nats_url=server.url)
            print(json.dumps(result), flush=True)
            results.append(result)
        return results
    finally:
        server.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, nargs="+", default=[1, 100, 1000])
    parser.add_argument("--probes", type=int, default=200)
    parser.add_argument("--interval", type=float, default=5.0,
                        help="seconds between background reports of each model")
    parser.add_argument("--json", type=Path, help="write the results here")
    arguments = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    output = asyncio.run(main(arguments))
    if arguments.json:
        arguments.json.write_text(json.dumps(output, indent=2))
