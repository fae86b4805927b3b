"""Variants end to end on the Kubernetes API (the emulator, or a real cluster with
SCALER_TEST_KUBECONFIG), with real NATS signals from the variants' own pods: a batch
tier's mix keeps each variant's replicas that report unfinished work (the reports of that
variant's pods, not the model's whole count), and GPU-hours and cost accrue per variant at
its own GPUs per replica and GPU-hour price, summed into the model's figures."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import aiohttp
import pytest
from prometheus_client import parser

from .test_end_to_end import nats_url
from .test_fleet_resources import until
from .test_variants_kube import H100, L40S, Start, World, _ready, holds, report, start_world

FIXTURES = (nats_url, start_world)  # fixtures of the variant tests, used by name

# As in test_variants_kube: yardstick 10 requests per replica; an H100 replica serves 30
# on 2 GPUs of pool h100 at 2.0 per GPU-hour, an L40S one 10 on 1 GPU of pool l40s at 1.0.


async def pods_of(world: World, deployment: str) -> list[str]:
    """Names of the Deployment's live pods (the emulator's and a real cluster's label
    them app=<deployment>), sorted."""
    listing = await world.kube.api.get(world.kube.collection("v1", "pods"),
                                       query={"labelSelector": f"app={deployment}"})
    return sorted(p["metadata"]["name"] for p in listing.get("items") or []
                  if not (p.get("metadata") or {}).get("deletionTimestamp")
                  and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed"))


async def test_a_batch_variant_keeps_the_replicas_of_its_own_pods_with_unfinished_work(
        start_world: Start, nats_url: str) -> None:
    world = await start_world(h100_replicas=2, l40s_replicas=3, tier="batch")
    await until(lambda: _ready(world, 2, 3), what="every replica ready")
    first, second, third = await pods_of(world, L40S)
    # Two L40S pods hold 5 requests each, the third reports none: 10 in flight, a demand
    # one L40S (10) serves. Without the busy floor the mix is h100 0, l40s 1 and cuts a
    # busy pod; with the model's whole busy count on every variant (2), the idle H100
    # would be kept too (h100 2). Each variant keeps its own busy replicas: h100 0, l40s 2.
    # (The idle pod says so: a silent one would be possibly busy, kept and ranked with
    # the busy ones, `engine.spare.possibly_busy` and `silent_cost`.)
    await report(nats_url, world, {first: 5, second: 5, third: 0})
    await until(holds(world, 0, 2), what="h100 0, l40s 2: the busy L40S kept")
    await until(lambda: _pods_are(world, L40S, [first, second]),
                what="the idle L40S pod removed, the busy ones kept")
    status = world.service.state.status(world.key)
    assert status is not None and status.last is not None
    assert any("kept for unfinished work l40s: 2" in note
               for note in status.last.decision.notes)

    # The second checkpoints its work (in_flight 0): it may go now, and it is the one that
    # goes (its deletion cost is the lowest); the first still holds work and stays.
    await report(nats_url, world, {first: 5, second: 0})
    await until(holds(world, 0, 1), what="l40s 1 once the second checkpointed")
    await until(lambda: _pods_are(world, L40S, [first]), what="the checkpointed pod removed")
    assert await pods_of(world, H100) == []


async def _pods_are(world: World, deployment: str, names: list[str]) -> bool:
    return await pods_of(world, deployment) == names


async def scrape(world: World) -> dict[tuple[str, str], float]:
    """(sample name, variant or '') -> value of this model's cost series."""
    assert world.service.http is not None
    async with aiohttp.ClientSession() as http, \
            http.get(world.service.http.url + "/metrics") as response:
        text = await response.text()
    found: dict[tuple[str, str], float] = {}
    for family in parser.text_string_to_metric_families(text):
        for sample in family.samples:
            labels: dict[str, Any] = sample.labels
            if (labels.get("namespace") == world.kube.namespace
                    and labels.get("model") == "chat" and "cost_center" in labels):
                found[(sample.name, str(labels.get("variant", "")))] = sample.value
    return found


async def test_gpu_hours_and_cost_accrue_per_variant_at_its_own_gpus_and_price(
        start_world: Start, nats_url: str) -> None:
    world = await start_world(h100_replicas=2, l40s_replicas=4)
    await until(lambda: _ready(world, 2, 4), what="every replica ready")
    # 95 in flight: a demand of 100 requests, which the 2 H100 (60) and 4 L40S (40) held
    # serve exactly: the mix keeps them all.
    await report(nats_url, world, {"chat-0": 95})

    async def settled() -> bool:
        status = world.service.state.status(world.key)
        return (status is not None and status.last is not None
                and status.last.snapshot.in_flight is not None
                and [(r.ready, r.starting) for r in status.last.variants] == [(2, 0), (4, 0)]
                and await world.replicas() == (2, 4))
    await until(settled, what="2 H100 and 4 L40S ready, the report read")
    before = await scrape(world)
    await until(_later(world, before), what="GPU time accrued between two scrapes")
    after = await scrape(world)

    def grew(name: str, variant: str = "") -> float:
        return after[(name, variant)] - before[(name, variant)]

    h100, l40s = (grew("scaler_variant_gpu_hours_total", v) for v in ("h100", "l40s"))
    # Between the scrapes each variant held 4 GPUs (2 x 2 and 4 x 1): equal GPU-hours,
    # not the model's 10 yardstick replicas of one GPU.
    assert h100 > 0 and l40s == pytest.approx(h100, rel=1e-6)
    assert grew("scaler_gpu_hours_total") == pytest.approx(h100 + l40s, rel=1e-6)
    # Each at its pool's price: 2.0 and 1.0 per GPU-hour (spec.cost's 2.5 is no variant's).
    assert grew("scaler_variant_cost_total", "h100") == pytest.approx(2.0 * h100, rel=1e-6)
    assert grew("scaler_variant_cost_total", "l40s") == pytest.approx(1.0 * l40s, rel=1e-6)
    assert grew("scaler_cost_total") == pytest.approx(2.0 * h100 + 1.0 * l40s, rel=1e-6)
    # 95 in flight on the 100 the ready replicas serve: 5 % of each variant's GPU time idle.
    for variant in ("h100", "l40s"):
        spent = grew("scaler_variant_cost_total", variant)
        assert grew("scaler_variant_idle_cost_total", variant) == pytest.approx(
            0.05 * spent, rel=1e-6)
    assert grew("scaler_idle_cost_total") == pytest.approx(
        0.05 * grew("scaler_cost_total"), rel=1e-6)


def _later(world: World, before: Mapping[tuple[str, str], float]
           ) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        now = await scrape(world)
        key = ("scaler_variant_gpu_hours_total", "h100")
        return key in now and now[key] > before.get(key, 0.0) + 1e-7
    return check
