"""The fleet in the service: two models on one pool under one budget, from real NATS signals
through the service to the Kubernetes API emulator, capped, explained, and given back."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import nats
import pytest

from scaler import cli
from scaler import emulator as kube_emulator
from scaler.engine import types
from scaler.policy import fleet as policy_fleet
from scaler.policy import loader
from scaler.service import arbiter as fleet_arbiter
from scaler.service import runner

from . import factories
from .test_end_to_end import ConfigMapDir, eventually, nats_url

FIXTURES = (nats_url,)  # the real nats-server of the end-to-end tests, used by name

NAMESPACE = "inference"
CHAT, EMBED = "chat", "embed"

POLICY = """\
apiVersion: scaler.io/v1alpha1
kind: ScalePolicy
metadata: {{name: {name}, namespace: inference, labels: {{tenant: search}}}}
spec:
  target: {{name: {name}}}
  tier: {tier}
  replicas: {{min: 1, max: 20}}
  signals:
    concurrency: {{targetPerReplica: 10}}
  behavior:
    scaleUp: {{stabilizationSeconds: 0, policies: [{{type: Pods, value: 100, periodSeconds: 1}}]}}
    scaleDown: {{stabilizationSeconds: 0, policies: [{{type: Pods, value: 100, periodSeconds: 1}}]}}
  coldStart: {{imagePullSeconds: 1, modelLoadSeconds: 1, readinessSeconds: 1}}
  nodePool: {{name: h100, gpusPerNode: 8, actuator: none}}
"""

# 2 nodes x 8 GPUs, 4 held for training: 12 for the models. Tenant search is guaranteed
# 8 of them and may hold 10 in all.
FLEET = """\
apiVersion: scaler.io/v1alpha1
kind: GpuPool
metadata: {name: h100}
spec:
  gpusPerNode: 8
  maxNodes: 2
  reservations: [{name: training, gpus: 4}]
---
apiVersion: scaler.io/v1alpha1
kind: GpuBudget
metadata: {name: search}
spec: {tenant: search, pool: h100, guaranteedGpus: 8, maxGpus: 10, borrow: true}
"""


@pytest.fixture
async def emulator() -> AsyncIterator[kube_emulator.KubeEmulator]:
    async with factories.cluster({CHAT: 1, EMBED: 1}, namespace=NAMESPACE) as emu:
        yield emu


@pytest.fixture
async def service(nats_url: str, emulator: kube_emulator.KubeEmulator, tmp_path: Path
                  ) -> AsyncIterator[runner.Service]:
    folder = ConfigMapDir(tmp_path / "policies")
    folder.publish({"chat.yaml": POLICY.format(name=CHAT, tier="online"),
                    "embed.yaml": POLICY.format(name=EMBED, tier="batch"),
                    "fleet.yaml": FLEET})
    config = factories.loopback_settings(nats_url=nats_url, kube_url=emulator.url,
                                         policies=folder.root, audit=tmp_path / "audit.jsonl")
    running = runner.Service(config)
    await running.start()
    try:
        await eventually(lambda: running.state.ready and bool(running.state.leader),
                         what="service ready and leading")
        await asyncio.wait_for(running.wait_sources_ready(), timeout=10)
        yield running
    finally:
        await running.stop()


def replicas(emu: kube_emulator.KubeEmulator, name: str) -> int:
    deployment = emu.store.get(emu.resource("apps", "deployments"), NAMESPACE, name)
    return int(deployment["spec"]["replicas"])


async def publish(nats_url: str, in_flight: dict[str, float]) -> None:
    client = await nats.connect(nats_url)
    try:
        for name, value in in_flight.items():
            body = {"v": 1, "model": name, "namespace": NAMESPACE, "source": f"{name}-0",
                    "ts": time.time(), "in_flight": value}
            await client.publish(f"scaler.signals.{NAMESPACE}.{name}", json.dumps(body).encode())
        await client.flush()
    finally:
        await client.close()


async def test_two_models_on_one_budget_are_capped_explained_and_given_back(
    service: runner.Service, emulator: kube_emulator.KubeEmulator, nats_url: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # chat (online) wants 156 / 10 = 15.6 replicas (15 hold that within the tolerance),
    # embed (batch) 100 / 10 = 10; one GPU
    # each. Floors first (1 + 1), the guarantee of 8 to online first (chat 7), then the
    # ceiling of 10 leaves chat 2 more to borrow: chat 9, embed 1.
    await publish(nats_url, {CHAT: 156.0, EMBED: 100.0})
    await eventually(lambda: (replicas(emulator, CHAT), replicas(emulator, EMBED)) == (9, 1),
                     what="chat 9 and embed 1")
    await service.reactor.idle()  # the patch lands before the decision is recorded
    status = service.state.status(f"{NAMESPACE}/{CHAT}")
    assert status is not None and status.last is not None
    clamps = [c for c in status.last.decision.clamps if c.name == "external_budget"]
    assert clamps and clamps[0].after == 9
    assert "capped by tenant search: 10 of 10 GPUs; granted 9 of 15 GPUs asked" in \
        clamps[0].detail
    assert service.http is not None
    code = await asyncio.to_thread(cli.main, ["explain", f"{NAMESPACE}/{CHAT}",
                                              "--url", service.http.url])
    assert code == 0
    out = capsys.readouterr().out
    assert "the pool or tenant budget allows 9" in out
    assert "capped by tenant search: 10 of 10 GPUs" in out

    # chat's demand falls to 3 replicas: what it gives back goes to embed, up to the
    # ceiling (10 - 3 = 7), in the same arbitration.
    await publish(nats_url, {CHAT: 30.0, EMBED: 100.0})
    await eventually(lambda: (replicas(emulator, CHAT), replicas(emulator, EMBED)) == (3, 7),
                     what="chat 3 and embed 7")
    embed = service.reactor.arbiter.grant(f"{NAMESPACE}/{EMBED}")
    assert embed is not None and embed.reason.startswith("capped by tenant search: 10 of 10")

    # chat asks again: embed is cut at once, lowest tier first, and the decision that
    # scales chat up says who gave.
    await eventually(lambda: _currents(service) == (3, 7), what="both decided at 3 and 7")
    await publish(nats_url, {CHAT: 156.0, EMBED: 100.0})
    await eventually(lambda: (replicas(emulator, CHAT), replicas(emulator, EMBED)) == (9, 1),
                     what="embed gives back to chat")
    await service.reactor.idle()
    audit = service.settings.audit.path
    assert audit is not None
    documents = [json.loads(line) for line in audit.read_text().splitlines()]
    details = [clamp["detail"] for d in documents if d["model"] == f"{NAMESPACE}/{CHAT}"
               and (d["decision"]["current"], d["decision"]["desired"]) == (3, 9)
               for clamp in d["decision"]["clamps"] if clamp["name"] == "external_budget"]
    assert details and "batch model inference/embed gave 6" in details[-1]


def _currents(service: runner.Service) -> tuple[int | None, ...]:
    """The current replicas each model's latest recorded decision saw (chat, embed)."""
    found = []
    for name in (CHAT, EMBED):
        status = service.state.status(f"{NAMESPACE}/{name}")
        last = None if status is None else status.last
        found.append(None if last is None else last.decision.current)
    return tuple(found)


# -- the arbiter alone ----------------------------------------------------------------------


def _fleet(text: str = FLEET) -> policy_fleet.Fleet:
    result = loader.parse_documents(text, "fleet.yaml")
    assert not result.errors
    return policy_fleet.fleet_of(result)


def _decision(key: str, *, current: int, desired: int) -> types.Decision:
    return types.Decision(model=key, at=factories.NOW, current=current, desired=desired,
                          recommendation=desired, winner=None, signals=())


def test_the_arbiter_holds_until_the_first_arbitration_then_caps_never_below_a_floor(
) -> None:
    chat = factories.policy(CHAT, labels={"tenant": "search"},
                            spec={"replicas": {"min": 3, "max": 20},
                                  "nodePool": {"name": "h100", "gpusPerNode": 8}})
    arbiter = fleet_arbiter.Arbiter()
    cluster = types.ClusterState(current=5, ready=5)
    assert arbiter.capped(chat, cluster, now=factories.NOW) is cluster  # no fleet files
    arbiter.set_fleet(_fleet(), keys={chat.key})
    held = arbiter.capped(chat, cluster, now=factories.NOW)
    assert (held.budget_gpus, held.budget_reason) == (5, fleet_arbiter.AWAITING)
    assert arbiter.record(chat, _decision(chat.key, current=5, desired=14), cluster,
                          now=factories.NOW)
    assert not arbiter.record(chat, _decision(chat.key, current=5, desired=14), cluster,
                              now=factories.NOW)  # the same ask: nothing to re-arbitrate
    assert arbiter.arbitrate() == [chat.key]
    capped = arbiter.capped(chat, cluster, now=factories.NOW)
    assert capped.budget_gpus == 10  # the tenant's ceiling
    assert capped.budget_reason is not None and "capped by tenant search" in capped.budget_reason
    assert arbiter.arbitrate() == []  # nothing moved
    # A warm floor above the last grant is not cut while the fleet catches up.
    floored = factories.policy(CHAT, labels={"tenant": "search"},
                               spec={"replicas": {"min": 12, "max": 20},
                                     "nodePool": {"name": "h100", "gpusPerNode": 8}})
    assert arbiter.capped(floored, cluster, now=factories.NOW).budget_gpus == 12
    # A model on no pool and under no budget passes through.
    other = factories.policy("other")
    assert arbiter.capped(other, cluster, now=factories.NOW) is cluster
