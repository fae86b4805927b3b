"""The arbiter with a model with variants: its demand mixed over its variants' pools."""

from __future__ import annotations

from scaler.engine import types
from scaler.policy import fleet as policy_fleet
from scaler.policy import loader
from scaler.service import arbiter as fleet_arbiter

from . import factories

POOLS = """\
apiVersion: scaler.io/v1alpha1
kind: GpuPool
metadata: {name: h100}
spec: {gpusPerNode: 8, maxNodes: 1, gpuHourly: 2.5}
---
apiVersion: scaler.io/v1alpha1
kind: GpuPool
metadata: {name: l40s}
spec: {gpusPerNode: 4, maxNodes: 4, gpuHourly: 0.86}
"""

VARIANTS = [
    {"name": "h100", "target": {"name": "chat-h100"}, "nodePool": "h100", "capacity": 96},
    {"name": "l40s", "target": {"name": "chat-l40s"}, "nodePool": "l40s", "capacity": 34},
]


def _fleet() -> policy_fleet.Fleet:
    result = loader.parse_documents(POOLS, "pools.yaml")
    assert not result.errors
    return policy_fleet.fleet_of(result)


def _decision(key: str, *, desired: int) -> types.Decision:
    return types.Decision(model=key, at=factories.NOW, current=desired, desired=desired,
                          recommendation=desired, winner=None, signals=())


def test_a_model_with_variants_is_mixed_and_its_shortfall_moves_when_a_pool_is_full(
) -> None:
    # Yardstick: targetPerReplica 34 (an L40S), so 12 replicas are a demand of 408.
    chat = factories.policy("chat", spec={"signals": {"concurrency": {"targetPerReplica": 34}},
                                          "variants": VARIANTS})
    other = factories.policy("other", spec={"nodePool": {"name": "h100", "gpusPerNode": 8}})
    arbiter = fleet_arbiter.Arbiter()
    arbiter.set_fleet(_fleet(), keys={chat.key, other.key})
    assert arbiter.record_variants(chat, _decision(chat.key, desired=12),
                                   held={"h100": (4, 0)})
    assert not arbiter.record_variants(chat, _decision(chat.key, desired=12),
                                       held={"h100": (4, 0)})  # the same: nothing new
    assert arbiter.arbitrate() == [chat.key]
    mixed = arbiter.mix(chat.key)
    assert mixed is not None and dict(mixed.replicas) == {"h100": 4, "l40s": 1}  # 384 + 34
    # Another online model asks 6 of the 8 H100s: the pool is shared between the two asks
    # (water-filling), and chat's H100 shortfall moves to L40S in the same arbitration.
    arbiter.record(other, _decision(other.key, desired=6),
                   types.ClusterState(current=6, ready=6), now=factories.NOW)
    assert arbiter.arbitrate() == [chat.key, other.key]
    mixed = arbiter.mix(chat.key)
    h100 = arbiter.grant(f"{chat.key}#h100")
    assert mixed is not None and mixed.met and h100 is not None
    assert mixed.replicas["h100"] == h100.replicas < 4
    assert mixed.replicas["l40s"] > 1 and mixed.capacity >= 408
    assert arbiter.grant(f"{chat.key}#l40s") is not None
    # Forgotten with its policy.
    arbiter.set_fleet(_fleet(), keys={other.key})
    assert arbiter.mix(chat.key) is None


def test_the_mix_is_described_with_what_bound_it() -> None:
    # Tenant search may hold 2 L40S GPUs: the demand of 408 (12 yardstick replicas, 12
    # L40S alone) is mixed again as 4 H100 (384) + 1 L40S (34), cheaper than 4 + 2, and
    # the words say which budget cut the L40S variant, though its final ask of 1 fits.
    budget = """\
---
apiVersion: scaler.io/v1alpha1
kind: GpuBudget
metadata: {name: search}
spec: {tenant: search, pool: l40s, maxGpus: 2, borrow: true}
"""
    result = loader.parse_documents(POOLS + budget, "fleet.yaml")
    assert not result.errors
    chat = factories.policy("chat", labels={"tenant": "search"},
                            spec={"signals": {"concurrency": {"targetPerReplica": 34}},
                                  "variants": VARIANTS})
    arbiter = fleet_arbiter.Arbiter()
    assert arbiter.describe_mix(chat) is None  # before any arbitration
    arbiter.set_fleet(policy_fleet.fleet_of(result), keys={chat.key})
    arbiter.record_variants(chat, _decision(chat.key, desired=12), held={})
    arbiter.arbitrate()
    words = arbiter.describe_mix(chat)
    assert words is not None
    assert words.startswith("variant h100: 4, l40s: 1; cheapest mix meeting the demand of "
                            "408 requests (serves 418 at 10.86/h")
    assert "held h100: 0, l40s: 0" in words
    assert words.endswith("l40s capped by tenant search: 2 of 2 GPUs; granted 2 of 12 GPUs "
                          "asked")
