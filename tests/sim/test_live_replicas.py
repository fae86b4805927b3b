"""Replica timelines of live runs: a Deployment on the Kubernetes API emulator (or a real
cluster with SCALER_TEST_KUBECONFIG), and the service's real decision API on loopback."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator

import prometheus_client
import pytest

from scaler.actuators import deployment_replicas
from scaler.emulator import env as kube_env
from scaler.service import http_api, web
from scaler.sim import live_replicas, profiles
from tests.service import factories

REAL_CLUSTER = os.environ.get("SCALER_TEST_KUBECONFIG")


@pytest.fixture
async def kube() -> AsyncIterator[kube_env.KubeTestEnv]:
    async with kube_env.kube_test_env(kubeconfig=REAL_CLUSTER,
                                      wall_clock=kube_env.ManualClock()) as env:
        yield env


async def _until(predicate: object, *, timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():  # type: ignore[operator]
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.02)


async def test_a_deployments_scaling_is_followed_by_its_watch(
        kube: kube_env.KubeTestEnv) -> None:
    await kube.create_deployment("llm", replicas=1)
    path = f"{kube.collection('apps/v1', 'deployments')}/llm"
    source = deployment_replicas.DeploymentSource(namespace=kube.namespace, deployment="llm",
                                            settings=kube.settings, api=kube.api)
    loop = asyncio.get_running_loop()
    async with live_replicas.recording(source) as timeline:
        origin = loop.time()
        for replicas in (3, 2):
            await kube.api.merge_patch(path, {"spec": {"replicas": replicas}})
            # The controller's status write follows the spec change (ready = desired
            # once its pods run; the emulator without pods counts them ready at once).
            await _until(lambda r=replicas: timeline.samples[-1].desired == r
                         and timeline.samples[-1].ready == r, timeout_s=30.0)
        end = loop.time() - origin
    desired = [s.desired for s in timeline.samples]
    assert desired[0] == 1 and desired[-1] == 2 and 3 in desired
    keys = live_replicas.summary(timeline, origin=origin, until_s=end, end_s=end,
                                 gpus_per_replica=2, gpu_hourly=3.6, useful_gpu_s=0.0,
                                 completed=10)
    assert keys["max_replicas"] == 3
    assert keys["scale_events"] == 2
    # Between 1 and 3 replicas of 2 GPUs for `end` seconds.
    assert 2 * end / 3600 <= keys["gpu_hours"] <= 6 * end / 3600 + 1e-4
    assert keys["cost"] == pytest.approx(keys["gpu_hours"] * 3.6, abs=1e-3)
    assert keys["idle_cost"] == pytest.approx(keys["cost"], abs=1e-3)


async def test_a_missing_deployment_is_named(kube: kube_env.KubeTestEnv) -> None:
    source = deployment_replicas.DeploymentSource(namespace=kube.namespace, deployment="nope",
                                            settings=kube.settings, api=kube.api)
    with pytest.raises(live_replicas.LiveReplicasError, match=r"nope.*404"):
        async with live_replicas.recording(source):
            pass


async def test_the_services_decision_api_is_polled() -> None:
    state = factories.loaded_state(factories.policy("llama-8b"))
    state.record("inference/llama-8b", factories.observation(
        current=1, desired=2, ready=1, model_name="inference/llama-8b"))
    api = http_api.HttpApi(state, registry=prometheus_client.CollectorRegistry())
    running = await web.serve(api.app(), host="127.0.0.1", port=0)
    try:
        source = live_replicas.ScalerSource(url=running.url, model="inference/llama-8b",
                                            interval_s=0.02)
        async with live_replicas.recording(source) as timeline:
            assert timeline.samples[0].desired == 2 and timeline.samples[0].ready == 1
            state.record("inference/llama-8b", factories.observation(
                current=2, desired=4, ready=2, starting=(1.0, 2.0),
                model_name="inference/llama-8b"))
            await _until(lambda: timeline.samples[-1].desired == 4)
        last = timeline.samples[-1]
        assert (last.desired, last.allocated, last.ready) == (4, 4, 2)
        unknown = live_replicas.ScalerSource(url=running.url, model="inference/other",
                                             interval_s=0.02)
        with pytest.raises(live_replicas.LiveReplicasError, match="HTTP 404"):
            async with live_replicas.recording(unknown, first_reading_timeout_s=0.3):
                pass
    finally:
        await running.close()


def _timeline(*points: tuple[float, int, int]) -> live_replicas.Timeline:
    timeline = live_replicas.Timeline(source="test")
    for at, desired, allocated in points:
        timeline.record(at=at, desired=desired, allocated=allocated, ready=allocated)
    return timeline


def test_gpu_time_is_billed_from_the_start_to_the_traces_end() -> None:
    # Origin at loop time 100: 2 replicas read before the start hold from 0; 3 asked
    # for at 600 s (allocated at once here); the run drains to 2,000 s, the trace ends
    # at 1,800 s: 2 x 600 + 3 x 1,200 = 4,800 GPU-seconds.
    timeline = _timeline((90.0, 2, 2), (700.0, 3, 3), (1950.0, 1, 1))
    assert live_replicas.allocated_gpu_seconds(
        timeline, origin=100.0, until_s=1800.0, gpus_per_replica=1) == pytest.approx(4800.0)
    keys = live_replicas.summary(timeline, origin=100.0, until_s=1800.0, end_s=2000.0,
                                 gpus_per_replica=1, gpu_hourly=2.5, useful_gpu_s=1200.0,
                                 completed=500)
    assert keys["gpu_hours"] == pytest.approx(4800 / 3600, abs=1e-4)
    assert keys["cost"] == pytest.approx(4800 / 3600 * 2.5, abs=1e-4)
    assert keys["idle_cost"] == pytest.approx(3600 / 3600 * 2.5, abs=1e-4)
    assert keys["cost_per_1k_requests"] == pytest.approx(keys["cost"] / 500 * 1000, abs=1e-3)
    assert (keys["scale_events"], keys["max_replicas"]) == (2, 3)
    plot = live_replicas.series(timeline, origin=100.0, end_s=2000.0)
    assert plot["replicas_t"] == [0.0, 600.0, 1850.0, 2000.0]
    assert plot["desired"] == [2.0, 3.0, 1.0, 1.0]
    # A count that does not change is not a sample.
    timeline.record(at=2500.0, desired=1, allocated=1, ready=1)
    assert len(timeline.samples) == 3 and timeline.reads == 4


def test_useful_gpu_time_is_the_simulators() -> None:
    profile = profiles.load_profile("llama-3.1-8b-h100")
    step = profile.decode_step
    per_token = step.base_seconds / profile.max_batch + step.per_sequence_seconds
    useful = live_replicas.useful_gpu_seconds(profile, prompt_tokens=1e6,
                                              generated_tokens=2e5, gpus_per_replica=2)
    assert useful == pytest.approx(2 * (1e6 / profile.prefill_tokens_per_second
                                        + 2e5 * per_token))


@pytest.mark.parametrize(("document", "counts"), [
    ({"spec": {"replicas": 3}}, (3, 3, 0)),
    ({"spec": {"replicas": 3}, "status": {"observedGeneration": 2, "replicas": 2,
                                          "readyReplicas": 1}}, (3, 2, 1)),
    ({"spec": {}, "status": {"observedGeneration": 1}}, (1, 0, 0)),
])
def test_deployment_counts(document: dict[str, object], counts: tuple[int, int, int]) -> None:
    assert deployment_replicas.deployment_counts(document) == counts


def test_targets_and_decision_documents_are_checked() -> None:
    assert live_replicas.parse_target("inference/llm") == ("inference", "llm")
    for bad in ("llm", "/llm", "a/b/c"):
        with pytest.raises(live_replicas.LiveReplicasError, match="--target"):
            live_replicas.parse_target(bad)
    with pytest.raises(live_replicas.LiveReplicasError, match="decision.desired"):
        live_replicas.decision_counts({"decision": {}})
    with pytest.raises(live_replicas.LiveReplicasError, match="whole numbers"):
        live_replicas.decision_counts({"decision": {"desired": True},
                                       "cluster": {"ready": 1, "starting": 0}})
