"""End to end: a real nats-server -> the service -> the Kubernetes API emulator.

The service runs on the real wall clock (signal messages are checked against it); every
wait is bounded and polls state, never asserts on elapsed time.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import ssl
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import nats
import pytest
from prometheus_client.parser import text_string_to_metric_families

from scaler import cli, testing
from scaler import emulator as kube_emulator
from scaler.actuators import base as actuators
from scaler.actuators import settings as kube_settings
from scaler.core import backoff as core_backoff
from scaler.emulator import Fault
from scaler.engine import types
from scaler.service import learned as service_learned
from scaler.service import runner, settings, tls
from scaler.testing import nats_server

from . import factories, fakes

NAMESPACE = "inference"
MODEL = "llama-70b"
KEY = f"{NAMESPACE}/{MODEL}"
SCALE = f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/{MODEL}/scale"

POLICY = """\
apiVersion: scaler.io/v1alpha1
kind: ScalePolicy
metadata: {{name: {model}, namespace: {namespace}, labels: {{tenant: search}}}}
spec:
  target: {{name: {model}}}
  replicas: {{min: 1, max: {max}}}
  signals:
    concurrency: {{targetPerReplica: 10}}
  behavior:
    scaleUp: {{stabilizationSeconds: 0, policies: [{{type: Pods, value: 100, periodSeconds: 15}}]}}
  coldStart: {{imagePullSeconds: 1, modelLoadSeconds: 1, readinessSeconds: 1}}
"""


def policy_text(*, max_replicas: int = 20) -> str:
    return POLICY.format(model=MODEL, namespace=NAMESPACE, max=max_replicas)


async def eventually(check: Callable[[], bool], *, timeout_s: float = 10.0,
                     what: str = "condition") -> None:
    """Poll every 20 ms until `check()` holds; fail after `timeout_s` (a bound, not a
    measurement: it only has to be far above what the step needs)."""
    async with asyncio.timeout(timeout_s):
        while not check():
            await asyncio.sleep(0.02)
    assert check(), what


class ConfigMapDir:
    """A folder laid out like a mounted ConfigMap: files are symlinks into `..data`, which
    points at a timestamped folder; an update swaps `..data` atomically."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.version = 0
        root.mkdir(parents=True, exist_ok=True)

    def publish(self, files: dict[str, str]) -> None:
        self.version += 1
        folder = self.root / f"..{self.version:04d}"
        folder.mkdir()
        for name, text in files.items():
            (folder / name).write_text(text)
        temporary = self.root / "..data_tmp"
        temporary.symlink_to(folder.name)
        os.replace(temporary, self.root / "..data")  # the kubelet's atomic swap
        for name in files:
            link = self.root / name
            if not link.is_symlink():
                link.symlink_to(Path("..data") / name)


@pytest.fixture
def nats_url() -> Iterator[str]:
    server = nats_server.NatsServer(jetstream=False)
    server.start()
    try:
        yield server.url
    finally:
        server.close()


@pytest.fixture
async def emulator() -> AsyncIterator[kube_emulator.KubeEmulator]:
    # A controller writes status in every real cluster: so does the emulator here.
    async with factories.cluster({MODEL: 2}, namespace=NAMESPACE, pods=True) as emu:
        yield emu


@pytest.fixture
def policy_dir(tmp_path: Path) -> ConfigMapDir:
    folder = ConfigMapDir(tmp_path / "policies")
    folder.publish({"llama.yaml": policy_text()})
    return folder


@pytest.fixture
def service_settings(
    nats_url: str, emulator: kube_emulator.KubeEmulator, policy_dir: ConfigMapDir,
    tmp_path: Path, certificate: tls.CertificatePair,
) -> settings.Settings:
    return settings.load_settings(environ={}).model_copy(update={
        "nats": settings.NatsSettings(
            servers=(nats_url,),
            reconnect=core_backoff.Backoff(base_delay_s=0.05, max_delay_s=0.5)),
        "kube": kube_settings.KubeSettings(
            host=emulator.url,
            lease=kube_settings.LeaseSettings(namespace="scaler", retry_period_s=0.2,
                                              renew_deadline_s=5.0)),
        "http": settings.HttpSettings(host="127.0.0.1", port=0),
        "metrics_api": settings.MetricsApiSettings(
            host="127.0.0.1", port=0, cert_file=certificate.cert_file,
            key_file=certificate.key_file),
        # 50 ms: a burst published in one flush lands in one evaluation.
        "engine": settings.EngineSettings(backstop_tick_seconds=0.2, coalesce_seconds=0.05),
        "policies": settings.PolicySettings(paths=[policy_dir.root], reload_poll_seconds=0.1),
        "audit": settings.AuditSettings(path=tmp_path / "audit.jsonl"),
    })


Start = Callable[[], Awaitable[runner.Service]]


@pytest.fixture
async def start_service(service_settings: settings.Settings) -> AsyncIterator[Start]:
    """Starts services on demand (a restart test needs two); stops every one at the end."""
    started: list[runner.Service] = []

    async def start() -> runner.Service:
        service = runner.Service(service_settings)
        started.append(service)
        await service.start()
        await eventually(lambda: service.state.ready and bool(service.state.leader),
                         what="service ready and leading")
        await asyncio.wait_for(service.wait_sources_ready(), timeout=10)
        return service

    yield start
    for service in started:
        await service.stop()


def replicas(emu: kube_emulator.KubeEmulator) -> int:
    deployment = emu.store.get(emu.resource("apps", "deployments"), NAMESPACE, MODEL)
    return int(deployment["spec"]["replicas"])


async def publish(nats_url: str, bodies: list[dict[str, Any]]) -> None:
    client = await nats.connect(nats_url)
    try:
        for body in bodies:
            await client.publish(f"scaler.signals.{NAMESPACE}.{MODEL}", json.dumps(body).encode())
        await client.flush()
    finally:
        await client.close()


def burst(*, sources: int, in_flight: float, age_s: float = 0.0) -> list[dict[str, Any]]:
    now = time.time() - age_s
    return [{"v": 1, "model": MODEL, "namespace": NAMESPACE, "source": f"pod-{index}",
             "ts": now, "in_flight": in_flight} for index in range(sources)]


async def test_burst_scales_with_one_patch_then_stale_data_holds(
    start_service: Start, emulator: kube_emulator.KubeEmulator, nats_url: str,
) -> None:
    service = await start_service()
    await eventually(lambda: service.reactor.evaluations >= 1, what="first evaluation")
    assert replicas(emulator) == 2  # no signal yet: held at the current count
    # 30 replicas report 5.2 requests in flight each: 156 / 10 = 15.6 replicas, which 15
    # hold within the 10 % tolerance: 15 are bought (not the ceiling, 16).
    await publish(nats_url, burst(sources=30, in_flight=5.2))
    await eventually(lambda: replicas(emulator) == 15, what="scaled to 15")
    await service.reactor.idle()
    assert emulator.count(method="PATCH", path=SCALE) == 1
    status = service.state.status(KEY)
    assert status is not None and status.patches.get("applied") == 1

    # Now only stale reports arrive (60 s old): they are dropped; replicas hold at 15.
    await publish(nats_url, burst(sources=5, in_flight=1.0, age_s=60.0))
    dropped = service.source("nats").stats.dropped
    await eventually(lambda: dropped.get("stale", 0) == 5, what="stale messages dropped")
    evaluations = service.reactor.evaluations
    await eventually(lambda: service.reactor.evaluations >= evaluations + 3,
                     what="backstop ticks")
    assert replicas(emulator) == 15
    assert emulator.count(method="PATCH", path=SCALE) == 1


async def test_bad_policy_reload_keeps_the_last_good_one(
    start_service: Start, emulator: kube_emulator.KubeEmulator, nats_url: str,
    policy_dir: ConfigMapDir, http: aiohttp.ClientSession,
) -> None:
    service = await start_service()
    policy_dir.publish({"llama.yaml": policy_text().replace("max: 20", "max: -3")})
    await eventually(lambda: bool((load := service.state.policy_load) and load.kept),
                     what="invalid reload noticed")
    load = service.state.policy_load
    assert load is not None and load.kept == (KEY,)
    assert "spec.replicas.max" in str(load.errors[0])
    # The old policy still scales: 150 in flight -> 15 replicas (max 20 still in force).
    await publish(nats_url, burst(sources=30, in_flight=5.2))
    await eventually(lambda: replicas(emulator) == 15, what="scaled with the old policy")
    assert service.http is not None
    async with http.get(service.http.url + "/metrics") as response:
        text = await response.text()
    assert 'scaler_policy_kept_last_good{model="llama-70b",namespace="inference"} 1.0' in text
    assert 'reason="invalid_field"' in text
    events = emulator.store.list(emulator.resource("", "events"), NAMESPACE)
    assert any(e["reason"] == "PolicyInvalid" for e in events)

    # A valid new version (max 8) replaces it: the same demand is now capped.
    policy_dir.publish({"llama.yaml": policy_text(max_replicas=8)})
    await eventually(lambda: replicas(emulator) == 8, what="new max applied")
    load = service.state.policy_load
    assert load is not None and load.ok and load.kept == ()


async def test_restart_does_not_scale_down_and_releases_the_lease(
    start_service: Start, emulator: kube_emulator.KubeEmulator, nats_url: str,
) -> None:
    first = await start_service()
    await publish(nats_url, burst(sources=30, in_flight=5.2))
    await eventually(lambda: replicas(emulator) == 15, what="scaled to 15")
    await first.stop()
    lease = emulator.store.get(emulator.resource("coordination.k8s.io", "leases"), "scaler",
                               "scaler-leader")
    assert "holderIdentity" not in lease["spec"]  # released: a successor needs no expiry

    second = await start_service()
    patches = emulator.count(method="PATCH", path=SCALE)
    # Demand has fallen to 1 replica's worth; the new process must not drop to 1 at once.
    await publish(nats_url, burst(sources=1, in_flight=5.0))
    await eventually(lambda: (s := second.state.status(KEY)) is not None
                     and s.last is not None and s.last.snapshot.in_flight is not None,
                     what="evaluated with the new signal")
    evaluations = second.reactor.evaluations
    await eventually(lambda: second.reactor.evaluations >= evaluations + 3,
                     what="several evaluations")
    status = second.state.status(KEY)
    assert status is not None and status.last is not None
    assert status.last.decision.desired == 15
    assert any(c.name == "stabilization_down" for c in status.last.decision.clamps)
    assert replicas(emulator) == 15
    assert emulator.count(method="PATCH", path=SCALE) == patches


async def test_external_metrics_api_answers_the_hpa(
    start_service: Start, emulator: kube_emulator.KubeEmulator, nats_url: str,
    http: aiohttp.ClientSession, client_ssl: ssl.SSLContext,
) -> None:
    # Authentication is on by default: the HPA's token is reviewed by the API (emulator).
    emulator.reviews.tokens["hpa-token"] = {"username": "hpa"}
    emulator.reviews.grants.append(kube_emulator.Grant(subject="hpa", verbs=("list",)))
    hpa = {"Authorization": "Bearer hpa-token"}
    service = await start_service()
    await publish(nats_url, burst(sources=30, in_flight=5.2))
    await eventually(lambda: replicas(emulator) == 15, what="scaled to 15")
    assert service.metrics_api is not None
    url = (service.metrics_api.url + "/apis/external.metrics.k8s.io/v1beta1/namespaces/"
           f"{NAMESPACE}/scaler_desired_replicas")
    async with http.get(url, params={"labelSelector": f"model={MODEL}"},
                        ssl=client_ssl) as response:
        assert response.status == 401  # no credentials
    async with http.get(url, params={"labelSelector": f"model={MODEL}"}, headers=hpa,
                        ssl=client_ssl) as response:
        assert response.status == 200
        body = await response.json()
    assert body["kind"] == "ExternalMetricValueList"
    assert [(item["metricLabels"]["tenant"], item["value"]) for item in body["items"]] == [
        ("search", "15")]
    async with http.get(url, params={"labelSelector": "model=absent"}, headers=hpa,
                        ssl=client_ssl) as response:
        assert response.status == 404
        assert (await response.json())["kind"] == "Status"


async def test_scaler_run_process_drains_on_sigterm(
    emulator: kube_emulator.KubeEmulator, nats_url: str, policy_dir: ConfigMapDir,
    tmp_path: Path, http: aiohttp.ClientSession,
) -> None:
    port = testing.free_port()
    environment = {
        **{k: v for k, v in os.environ.items() if not k.startswith("SCALER_")},
        "SCALER_NATS__SERVERS": nats_url,
        "SCALER_KUBE__HOST": emulator.url,
        "SCALER_KUBE__LEASE__NAMESPACE": "scaler",
        "SCALER_KUBE__LEASE__RETRY_PERIOD_S": "0.2",
        "SCALER_HTTP__HOST": "127.0.0.1",
        "SCALER_HTTP__PORT": str(port),
        "SCALER_METRICS_API__HOST": "127.0.0.1",
        "SCALER_METRICS_API__PORT": "0",  # no certificate: a self-signed one is made
        "SCALER_POLICIES__PATHS": str(policy_dir.root),
    }
    log_path = tmp_path / "scaler.log"
    with log_path.open("wb") as log_file:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "scaler", "run", env=environment,
            stdin=asyncio.subprocess.DEVNULL, stdout=log_file, stderr=log_file)
    try:
        async def ready() -> bool:
            try:
                async with http.get(f"http://127.0.0.1:{port}/readyz") as response:
                    return response.status == 200
            except aiohttp.ClientError:
                return False

        async with asyncio.timeout(30):
            while not await ready():
                assert process.returncode is None, log_path.read_text()
                await asyncio.sleep(0.1)
        await publish(nats_url, burst(sources=30, in_flight=5.2))
        # 150 in flight need 15. Across processes the burst may arrive in two reads, so the
        # first evaluation may see 140 of them (14), and 15 is within the 10 % tolerance
        # of 14: either count is the process scaling on the burst.
        await eventually(lambda: replicas(emulator) in (14, 15), what="scaled by the process")
        process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(30):
            code = await process.wait()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    lines = log_path.read_text().splitlines()
    assert code == 0, "\n".join(lines[-20:])
    messages = [json.loads(line)["message"] for line in lines]  # every line is JSON
    assert "scaler stopped" in messages
    lease = emulator.store.get(emulator.resource("coordination.k8s.io", "leases"), "scaler",
                               "scaler-leader")
    assert "holderIdentity" not in lease["spec"]


async def test_service_runs_on_any_cluster_backend(
    nats_url: str, policy_dir: ConfigMapDir, http: aiohttp.ClientSession,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # No Kubernetes at all: the cluster is a fake behind the same protocols (the seam a
    # simulated cluster uses for `scaler demo`).
    cluster = fakes.FakeCluster(current=2)
    config = settings.load_settings(environ={}).model_copy(update={
        "nats": settings.NatsSettings(
            servers=(nats_url,), reconnect=core_backoff.Backoff(base_delay_s=0.05)),
        "http": settings.HttpSettings(host="127.0.0.1", port=0),
        "metrics_api": settings.MetricsApiSettings(enabled=False),
        "engine": settings.EngineSettings(coalesce_seconds=0.05),
        "policies": settings.PolicySettings(paths=[policy_dir.root]),
    })
    service = runner.Service(config, backend=runner.ClusterBackend(
        reader=cluster, actuator=cluster, leader=actuators.AlwaysLeader()))
    try:
        await service.start()
        await asyncio.wait_for(service.wait_sources_ready(), timeout=10)
        await eventually(lambda: service.state.ready, what="ready")
        await publish(nats_url, burst(sources=30, in_flight=5.2))
        await eventually(lambda: cluster.current.get(KEY) == 15, what="scaled the fake")
        assert service.http is not None
        code = await asyncio.to_thread(cli.main, ["explain", MODEL, "--url", service.http.url])
        assert code == 0
        assert "Scaling up from 2 to 15: demand says 15" in capsys.readouterr().out
    finally:
        await service.stop()


LEARNED_CONFIGMAP = ("scaler", "scaler-leader-learned")


def learned_record(emu: kube_emulator.KubeEmulator) -> dict[str, Any]:
    configmap = emu.store.get(emu.resource("", "configmaps"), *LEARNED_CONFIGMAP)
    return dict(json.loads(configmap["data"][f"{NAMESPACE}.{MODEL}"]))


def learned_record_written(emu: kube_emulator.KubeEmulator) -> bool:
    """Whether the ConfigMap holds the model's record: a write before the model learned
    anything holds none (nothing learned is nothing to keep)."""
    configmap = emu.store.find(emu.resource("", "configmaps"), *LEARNED_CONFIGMAP)
    return configmap is not None and f"{NAMESPACE}.{MODEL}" in (configmap.get("data") or {})


def edit_learned_record(emu: kube_emulator.KubeEmulator, **fields: Any) -> None:
    """As someone with edit rights on ConfigMaps in the scaler's namespace would."""
    rtype = emu.resource("", "configmaps")
    configmap = emu.store.get(rtype, *LEARNED_CONFIGMAP)
    record = {**learned_record(emu), **fields}
    configmap["data"][f"{NAMESPACE}.{MODEL}"] = json.dumps(record)
    emu.store.update(rtype, *LEARNED_CONFIGMAP, configmap)


async def learned_metrics(service: runner.Service, http: aiohttp.ClientSession
                          ) -> dict[str, float]:
    assert service.http is not None
    async with http.get(f"{service.http.url}/metrics") as response:
        text = await response.text()
    return {sample.labels["outcome"]: sample.value
            for family in text_string_to_metric_families(text)
            if family.name == "scaler_learned_state_records" for sample in family.samples}


async def test_a_new_instance_resumes_what_the_last_one_learned(
    start_service: Start, emulator: kube_emulator.KubeEmulator, nats_url: str,
    http: aiohttp.ClientSession, capsys: pytest.CaptureFixture[str],
) -> None:
    first = await start_service()
    await publish(nats_url, burst(sources=30, in_flight=5.2))
    await eventually(lambda: replicas(emulator) == 15, what="scaled to 15")
    # The new pods became ready: their start times are learned from their timelines.
    await eventually(lambda: (first.reactor.learned().get(KEY) or types.Learned()
                              ).pod_start_s is not None, what="pod starts learned")
    await first.stop()  # the leader writes what it learned before releasing the Lease
    record = learned_record(emulator)
    assert record["podStartSeconds"] == first.reactor.learned()[KEY].pod_start_s
    policy = next(item.policy for item in first.watcher.current.policies.values())
    assert record["policy"] == service_learned.fingerprint(policy)

    # As if the last instance had seen its replicas saturate at 60 % of the tokens/s
    # model: the next one starts from it (this policy has no tokens/s signal, so nothing
    # here learns or changes a served share).
    edit_learned_record(emulator, servedShare=0.6, servedSamples=7)
    second = await start_service()
    await publish(nats_url, burst(sources=30, in_flight=5.2))
    await eventually(lambda: KEY in second.reactor.learned(), what="evaluated")
    resumed = second.reactor.learned()[KEY]
    assert (resumed.served_share, resumed.served_samples) == (0.6, 7)
    assert (await learned_metrics(second, http)).get("resumed") == 1
    # `scaler explain` says what the model is decided from, and where it came from.
    assert second.http is not None
    assert await asyncio.to_thread(cli.main, ["explain", MODEL, "--url", second.http.url]) == 0
    explained = capsys.readouterr().out
    assert "Learned (resumed from a record written 20" in explained
    assert "saturated replicas serve 60% of the tokens/s capacity model (7 samples)" in (
        explained)
    await second.stop()
    assert learned_record(emulator)["servedShare"] == 0.6

    # A hostile edit is refused whole and counted; the model learns anew and still scales.
    edit_learned_record(emulator, servedShare=1e308)
    third = await start_service()
    await publish(nats_url, burst(sources=30, in_flight=5.2))
    await eventually(lambda: KEY in third.reactor.learned(), what="evaluated")
    assert third.reactor.learned()[KEY].served_share == 1.0
    assert (await learned_metrics(third, http)) == {"implausible": 1}
    status = third.state.status(KEY)
    assert status is not None and status.last is not None
    assert status.last.decision.desired == 15


async def test_the_learned_state_outlives_a_forbidden_read_and_failing_writes(
    service_settings: settings.Settings, emulator: kube_emulator.KubeEmulator,
    nats_url: str, caplog: pytest.LogCaptureFixture,
) -> None:
    # At start the ConfigMap cannot be read (RBAC not granted yet): the service starts all
    # the same, says what to grant, and every model learns anew.
    configmap = f"/configmaps/{LEARNED_CONFIGMAP[1]}$"
    emulator.inject(Fault(verb="get", path=configmap, status=403, times=1))
    # Its first writes fail past the client's retries (5 attempts of a 500 each time).
    emulator.inject(Fault(verb="create", path="/configmaps$", status=500, times=5))
    kube = service_settings.kube.model_copy(update={
        "learned_state": kube_settings.LearnedStateSettings(write_seconds=0.2)})
    service = runner.Service(service_settings.model_copy(update={"kube": kube}))
    try:
        await service.start()
        await eventually(lambda: service.state.ready and bool(service.state.leader),
                         what="ready and leading")
        await asyncio.wait_for(service.wait_sources_ready(), timeout=10)
        assert any("cannot read ConfigMap scaler/scaler-leader-learned" in r.getMessage()
                   and "grant configmaps get, create and update" in r.getMessage()
                   for r in caplog.records)
        await publish(nats_url, burst(sources=30, in_flight=5.2))
        await eventually(lambda: replicas(emulator) == 15, what="scaled to 15")
        # A failed write is counted and tried again the next period; scaling went on.
        await eventually(lambda: service.state.learned_writes["failed"] >= 1,
                         what="a failed write counted")
        await eventually(lambda: service.state.learned_writes["written"] >= 1
                         and learned_record_written(emulator),
                         what="written once the API answers")
        assert learned_record(emulator)["v"] == 1
    finally:
        await service.stop()


async def test_a_follower_in_a_queue_group_takes_over_with_the_leaders_record(
    service_settings: settings.Settings, emulator: kube_emulator.KubeEmulator,
    nats_url: str,
) -> None:
    # In a queue group each replica receives a share of the signals, so a follower's own
    # learning is partial: on taking over it resumes the leader's last record instead.
    def configured(retry_period_s: float) -> settings.Settings:
        kube = service_settings.kube.model_copy(update={
            "lease": service_settings.kube.lease.model_copy(
                update={"retry_period_s": retry_period_s}),
            "learned_state": kube_settings.LearnedStateSettings(write_seconds=0.2)})
        nats = service_settings.nats.model_copy(update={"queue_group": "scalers"})
        return service_settings.model_copy(update={"kube": kube, "nats": nats})

    leader, follower = runner.Service(configured(0.2)), runner.Service(configured(1.0))
    try:
        await leader.start()
        await eventually(lambda: bool(leader.state.leader), what="first leads")
        await follower.start()
        await eventually(lambda: follower.state.leader is False, what="second follows")
        for each in (leader, follower):
            await asyncio.wait_for(each.wait_sources_ready(), timeout=10)
        # Each instance receives a share of the 30 sources' reports: the leader scales up
        # on what it sees.
        await publish(nats_url, burst(sources=30, in_flight=5.2))
        await eventually(lambda: replicas(emulator) > 2, what="scaled up")
        await eventually(lambda: KEY in follower.reactor.learned(), what="follower evaluated")
        scaled = replicas(emulator)
        await eventually(lambda: learned_record_written(emulator),
                         what="the leader's record written")
        # The record the follower reads on taking over holds a served share neither
        # instance learned (this policy has no tokens/s signal, so nothing here learns or
        # changes one); the leader's later writes fail, so the edit is what it leaves,
        # whenever the follower's next try of the Lease comes.
        edit_learned_record(emulator, servedShare=0.6, servedSamples=7)
        written_at = learned_record(emulator)["at"]
        refused = emulator.inject(Fault(verb="update", path=f"/configmaps/{LEARNED_CONFIGMAP[1]}$",
                                        status=403, times=1_000))
        await leader.stop()  # tries to write its record (refused), releases the Lease
        assert learned_record(emulator)["servedShare"] == 0.6
        refused.times = 0
        await eventually(lambda: bool(follower.state.leader), what="follower takes over")
        await eventually(lambda: (s := follower.state.status(KEY)) is not None
                         and s.resumed_at == written_at, what="the leader's record resumed")
        assert (follower.reactor.learned()[KEY].served_share,
                follower.reactor.learned()[KEY].served_samples) == (0.6, 7)
        # Its windows held what it saw of a share of the reports (fewer sources than the
        # leader saw): taking over, its down window starts at the current count.
        evaluations = follower.reactor.evaluations
        await eventually(lambda: follower.reactor.evaluations >= evaluations + 3,
                         what="several evaluations as leader")
        assert replicas(emulator) >= scaled
    finally:
        await follower.stop()
        await leader.stop()
