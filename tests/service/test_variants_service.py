"""Variants in the service: one model on H100 and L40S Deployments, each on its own pool,
from real NATS signals through the service to the Kubernetes API emulator (its controller
making and readying the pods): the warm variant kept, the cheapest mix written to both
targets, a full pool's shortfall taken by the other, explained; dry-run writes nothing."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import nats
import pytest

from scaler import cli
from scaler import emulator as kube_emulator
from scaler.actuators import base as actuators
from scaler.engine import types
from scaler.policy import loader, model
from scaler.service import runner
from scaler.service import variants as service_variants

from . import factories
from .test_end_to_end import ConfigMapDir, eventually, nats_url

FIXTURES = (nats_url,)  # the real nats-server of the end-to-end tests, used by name

NAMESPACE = "inference"
KEY = f"{NAMESPACE}/chat"
H100, L40S = "chat-h100", "chat-l40s"

# Yardstick: one L40S replica, 10 requests in flight. An H100 replica serves 30 at 4.0/h
# (0.133 per request), an L40S one 10 at 1.0/h (0.100): L40S is the cheaper per unit.
POLICY = """\
apiVersion: scaler.io/v1alpha1
kind: ScalePolicy
metadata: {name: chat, namespace: inference, labels: {tenant: search}}
spec:
  target: {name: chat-h100}
  replicas: {min: 1, max: 40}
  signals:
    concurrency: {targetPerReplica: 10}
  behavior:
    scaleUp: {stabilizationSeconds: 0, policies: [{type: Pods, value: 100, periodSeconds: 1}]}
    scaleDown: {stabilizationSeconds: 0, policies: [{type: Pods, value: 100, periodSeconds: 1}]}
  coldStart: {imagePullSeconds: 1, modelLoadSeconds: 1, readinessSeconds: 1}
  variants:
    - {name: h100, target: {name: chat-h100}, nodePool: h100, capacity: 30}
    - {name: l40s, target: {name: chat-l40s}, nodePool: l40s, capacity: 10}
"""

# 4 GPUs each: room for 4 replicas of either.
POOLS = """\
apiVersion: scaler.io/v1alpha1
kind: GpuPool
metadata: {name: h100}
spec: {gpusPerNode: 4, maxNodes: 1, gpuHourly: 4.0}
---
apiVersion: scaler.io/v1alpha1
kind: GpuPool
metadata: {name: l40s}
spec: {gpusPerNode: 4, maxNodes: 1, gpuHourly: 1.0}
"""


@pytest.fixture
async def emulator() -> AsyncIterator[kube_emulator.KubeEmulator]:
    # Pods made and Ready at once: the mix reads them as held.
    async with factories.cluster({H100: 2, L40S: 0}, namespace=NAMESPACE, pods=True) as emu:
        yield emu


async def _service(nats_url: str, emulator: kube_emulator.KubeEmulator, tmp_path: Path, *,
                   dry_run: bool) -> runner.Service:
    folder = ConfigMapDir(tmp_path / "policies")
    folder.publish({"chat.yaml": POLICY, "pools.yaml": POOLS})
    config = factories.loopback_settings(nats_url=nats_url, kube_url=emulator.url,
                                         policies=folder.root, audit=tmp_path / "audit.jsonl",
                                         dry_run=dry_run)
    running = runner.Service(config)
    await running.start()
    await eventually(lambda: running.state.ready and bool(running.state.leader),
                     what="service ready and leading")
    await asyncio.wait_for(running.wait_sources_ready(), timeout=10)
    return running


@pytest.fixture
async def service(nats_url: str, emulator: kube_emulator.KubeEmulator, tmp_path: Path
                  ) -> AsyncIterator[runner.Service]:
    running = await _service(nats_url, emulator, tmp_path, dry_run=False)
    try:
        yield running
    finally:
        await running.stop()


def replicas(emu: kube_emulator.KubeEmulator) -> tuple[int, int]:
    """spec.replicas of the H100 and the L40S Deployment."""
    found = [emu.store.get(emu.resource("apps", "deployments"), NAMESPACE, name)
             for name in (H100, L40S)]
    return int(found[0]["spec"]["replicas"]), int(found[1]["spec"]["replicas"])


async def publish(nats_url: str, in_flight: float) -> None:
    client = await nats.connect(nats_url)
    try:
        body = {"v": 1, "model": "chat", "namespace": NAMESPACE, "source": "chat-0",
                "ts": time.time(), "in_flight": in_flight}
        await client.publish(f"scaler.signals.{NAMESPACE}.chat", json.dumps(body).encode())
        await client.flush()
    finally:
        await client.close()


def patches(service: runner.Service, outcome: str) -> int:
    status = service.state.status(KEY)
    return 0 if status is None else status.patches.get(outcome, 0)


def notes(service: runner.Service) -> tuple[str, ...]:
    status = service.state.status(KEY)
    return () if status is None or status.last is None else status.last.decision.notes


async def test_variants_are_mixed_written_to_each_target_and_explained(
    service: runner.Service, emulator: kube_emulator.KubeEmulator, nats_url: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Warm kept: 25 in flight is 3 yardstick replicas, a demand of 30. One of the 2 warm
    # H100s serves it (4.0/h); 3 cold L40S would cost 3.0/h, but the held replicas cover
    # the demand, so the dearer surplus goes and nothing cold is started.
    await publish(nats_url, 25.0)
    await eventually(lambda: replicas(emulator) == (1, 0), what="h100 1, l40s 0")
    await eventually(lambda: any("variant h100: 1, l40s: 0; cheapest mix meeting the demand "
                                 "of 30 requests" in n for n in notes(service)),
                     what="the mix explained")

    # 100 in flight: a demand of 100, 70 short. Cheapest cover of the shortfall would be 7
    # L40S (7.0/h), but the L40S pool holds 4: it fills it (40) and one more H100 takes
    # the rest (30): both Deployments patched, 2 x 4.0 + 4 x 1.0 = 12.0/h. The first
    # L40S patch is refused (H100 already written): a half-applied mix, counted, and
    # written whole at the next evaluation.
    emulator.inject(kube_emulator.Fault(verb="patch", path=f"/{L40S}/scale$", status=422))
    await publish(nats_url, 100.0)
    await eventually(lambda: replicas(emulator) == (2, 4), what="h100 2, l40s 4")
    assert patches(service, "partial") == 1
    await eventually(lambda: any("variant h100: 2, l40s: 4; cheapest mix meeting the demand "
                                 "of 100 requests" in n for n in notes(service)),
                     what="the new mix explained")
    (note,) = [n for n in notes(service) if n.startswith("variant ")]
    assert "serves 100 at 12.00/h" in note and "l40s fills pool l40s: 4 of 4 GPUs" in note
    await service.reactor.idle()
    assert replicas(emulator) == (2, 4)  # settled: held replicas cover it, nothing moves

    assert service.http is not None
    code = await asyncio.to_thread(cli.main, ["explain", KEY, "--url", service.http.url])
    assert code == 0
    out = capsys.readouterr().out
    assert "Note: variant h100: 2, l40s: 4; cheapest mix meeting the demand" in out
    audit = service.settings.audit.path
    assert audit is not None
    documents = [json.loads(line) for line in audit.read_text().splitlines()]
    written = [d for d in documents if d["model"] == KEY and d["apply"]["outcome"] == "applied"]
    assert written and "Deployment/inference/chat-l40s: applied 0->4" in \
        written[-1]["apply"]["reason"]
    assert any("variant h100: 2, l40s: 4" in n for n in written[-1]["decision"]["notes"])


async def test_dry_run_mixes_and_writes_nothing(
    nats_url: str, emulator: kube_emulator.KubeEmulator, tmp_path: Path,
) -> None:
    running = await _service(nats_url, emulator, tmp_path, dry_run=True)
    try:
        await publish(nats_url, 100.0)
        await eventually(lambda: any("variant h100: 2, l40s: 4" in n for n in notes(running)),
                         what="the mix decided")
        await eventually(lambda: patches(running, "dry_run") > 0, what="a dry-run write")
        await running.reactor.idle()
        assert replicas(emulator) == (2, 0)
    finally:
        await running.stop()


class _ByTarget:
    """A ReplicaActuator at the seam without `apply_all`, keyed by target name; the
    targets in `refuse` answer FAILED."""

    def __init__(self, refuse: set[str]) -> None:
        self.refuse = refuse
        self.written: list[str] = []

    async def apply(self, policy: model.ScalePolicy, decision: types.Decision
                    ) -> actuators.ApplyOutcome:
        name = policy.spec.target.name
        if name in self.refuse:
            return actuators.ApplyOutcome(actuators.Outcome.FAILED, name, decision.current,
                                          decision.desired, "refused")
        self.written.append(name)
        return actuators.ApplyOutcome(actuators.Outcome.APPLIED, name, decision.current,
                                      decision.desired)


async def test_an_actuator_without_apply_all_writes_in_turn_and_stops_at_a_refusal() -> None:
    (policy,) = loader.parse_documents(POLICY, "chat.yaml").policies
    targets = service_variants.views(policy, pools={})
    assert [t.spec.target.name for t in targets] == [H100, L40S]
    decision = types.Decision(model=KEY, at=0.0, current=0, desired=0, recommendation=0,
                              winner=None, signals=())
    items = [(view, dataclasses.replace(decision, current=1, desired=2)) for view in targets]
    first = _ByTarget(refuse={H100})
    applied = service_variants.combined(await service_variants.apply(first, items))
    assert first.written == [] and applied.outcome is actuators.Outcome.FAILED
    assert not applied.partial
    second = _ByTarget(refuse={L40S})
    applied = service_variants.combined(await service_variants.apply(second, items))
    assert second.written == [H100] and applied.partial
