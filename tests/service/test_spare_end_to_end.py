"""End to end, scale-down that spares work: per-pod reports on a real nats-server -> the
service -> pod deletion costs, then the replicas patch -> the emulator's ReplicaSet-like
controller removes the idlest pod; a batch tier keeps its busy replicas until one reports
its work checkpointed (in_flight 0)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from scaler import emulator as kube_emulator
from scaler.actuators import deletion_cost
from scaler.emulator import controller as emulator_controller
from scaler.engine import types

from . import test_end_to_end as e2e

# The end-to-end fixtures (a real nats-server, the emulator with its controller running,
# the service started on demand), shared by name; `policy_dir` is this module's own.
nats_url = e2e.nats_url
emulator = e2e.emulator
service_settings = e2e.service_settings
start_service = e2e.start_service
KEY, MODEL, NAMESPACE = e2e.KEY, e2e.MODEL, e2e.NAMESPACE
ConfigMapDir, Start, eventually = e2e.ConfigMapDir, e2e.Start, e2e.eventually
publish, replicas = e2e.publish, e2e.replicas

POLICY = """\
apiVersion: scaler.io/v1alpha1
kind: ScalePolicy
metadata: {{name: {model}, namespace: {namespace}}}
spec:
  target: {{name: {model}}}
  tier: {tier}
  replicas: {{min: 1, max: 4}}
  signals:
    concurrency: {{targetPerReplica: 10}}
  behavior:
    scaleUp: {{stabilizationSeconds: 0}}
    scaleDown: {{stabilizationSeconds: 0, policies: [{{type: Pods, value: 4, periodSeconds: 15}}]}}
  coldStart: {{imagePullSeconds: 1, modelLoadSeconds: 1, readinessSeconds: 1}}
"""


@pytest.fixture(params=["online"])
def tier(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def policy_dir(tmp_path: Path, tier: str) -> ConfigMapDir:
    folder = ConfigMapDir(tmp_path / "policies")
    folder.publish({"llama.yaml": POLICY.format(model=MODEL, namespace=NAMESPACE, tier=tier)})
    return folder


def pods(emu: kube_emulator.KubeEmulator) -> dict[str, dict[str, Any]]:
    return {p["metadata"]["name"]: p for p in emu.store.list(emu.resource("", "pods"), NAMESPACE)
            if deletion_cost.is_active(p)}


def ready(emu: kube_emulator.KubeEmulator) -> list[str]:
    return sorted(name for name, pod in pods(emu).items()
                  if any(c.get("type") == "Ready" and c.get("status") == "True"
                         for c in (pod.get("status") or {}).get("conditions") or []))


def report(work: dict[str, float]) -> list[dict[str, Any]]:
    now = time.time()
    return [{"v": 1, "model": MODEL, "namespace": NAMESPACE, "source": pod, "ts": now,
             "in_flight": in_flight, "queue_depth": 0} for pod, in_flight in work.items()]


async def test_the_idlest_pod_goes_on_scale_down(
        start_service: Start, emulator: kube_emulator.KubeEmulator, nats_url: str,
        tmp_path: Path, http: aiohttp.ClientSession) -> None:
    await eventually(lambda: len(ready(emulator)) == 2, what="two pods ready")
    # The pod the ReplicaSet would remove without costs is the busy one here, so only the
    # costs can save it.
    busy, idle = sorted(pods(emulator).values(), key=emulator_controller.deletion_rank)
    busy_name, idle_name = busy["metadata"]["name"], idle["metadata"]["name"]
    service = await start_service()
    # 9 running on one pod, none on the other: one replica's worth (10 per replica).
    await publish(nats_url, report({busy_name: 9, idle_name: 0}))
    await eventually(lambda: replicas(emulator) == 1, what="scaled down to 1")
    await eventually(lambda: list(pods(emulator)) == [busy_name], what="the idle pod removed")
    assert (pods(emulator)[busy_name]["metadata"].get("annotations") or {}).get(
        deletion_cost.ANNOTATION) == "9"
    await service.reactor.idle()
    applied = [json.loads(line)["apply"] for line in (tmp_path / "audit.jsonl").read_text(
    ).splitlines() if json.loads(line)["decision"]["desired"] == 1]
    assert applied[0] == {"outcome": "applied", "reason": applied[0]["reason"]}
    assert applied[0]["reason"].endswith("; deletion costs: 1 pods annotated")
    assert service.http is not None
    async with http.get(service.http.url + "/metrics") as response:
        text = await response.text()
    assert 'scaler_pod_annotations_total{outcome="patched"} 1.0' in text


@pytest.mark.parametrize("tier", ["batch"], indirect=True)
async def test_a_batch_tier_keeps_busy_replicas_until_they_checkpoint(
        start_service: Start, emulator: kube_emulator.KubeEmulator, nats_url: str) -> None:
    await eventually(lambda: len(ready(emulator)) == 2, what="two pods ready")
    first, second = sorted(pods(emulator))
    service = await start_service()
    # 3 + 2 running: half a replica's worth, but both replicas hold unfinished work.
    await publish(nats_url, report({first: 3, second: 2}))
    await eventually(lambda: (status := service.state.status(KEY)) is not None
                     and status.last is not None and any(
                         c.name is types.ClampName.UNFINISHED_WORK
                         for c in status.last.decision.clamps), what="held by the busy rule")
    assert replicas(emulator) == 2
    # The second checkpoints its work and says so (in_flight 0): it may go now, and does.
    await publish(nats_url, report({first: 3, second: 0}))
    await eventually(lambda: replicas(emulator) == 1, what="scaled down to 1")
    await eventually(lambda: list(pods(emulator)) == [first], what="the checkpointed pod removed")
