"""Variants: tables of (variants, demand) -> replicas per variant, the fleet's two passes,
and Hypothesis properties against a brute-force search."""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scaler.core import vocabulary
from scaler.engine import decide as engine_decide
from scaler.engine import fleet, types, variants
from scaler.policy import fleet as policy_fleet
from scaler.policy import model
from tests.engine.helpers import policy, snap

# An H100 replica serves 40 requests at 10.0/h (0.25 per unit), an A100 one 24 at 4.0/h
# (0.167), an L40S one 12 at 2.2/h (0.183).
H100 = variants.Option(name="h100", capacity=40, price=10.0, time_to_ready_s=105)
A100 = variants.Option(name="a100", capacity=24, price=4.0, time_to_ready_s=120)
L40S = variants.Option(name="l40s", capacity=12, price=2.2, time_to_ready_s=150)


def opt(base: variants.Option, *, ready: int = 0, starting: int = 0,
        room: int | None = None) -> variants.Option:
    return variants.Option(name=base.name, capacity=base.capacity, price=base.price,
                           ready=ready, starting=starting, room=room,
                           time_to_ready_s=base.time_to_ready_s, pool=base.name)


TABLE = [
    pytest.param([H100, A100, L40S], 100.0, {"h100": 0, "a100": 4, "l40s": 1},
                 id="cold-cheapest-cover"),  # 18.2/h: 5 x a100 would be 20.0, 9 x l40s 19.8
    pytest.param([H100, A100, L40S], 60.0, {"h100": 0, "a100": 2, "l40s": 1},
                 id="a-mix-beats-every-single-variant"),  # 10.2/h; 3 x a100 12.0, 5 x l40s 11.0
    pytest.param([H100, opt(A100, room=2), L40S], 100.0, {"h100": 0, "a100": 2, "l40s": 5},
                 id="capped-cheapest-spills-to-next"),  # 8.0 + 11.0; 3 x h100 would be 30.0
    pytest.param([opt(H100, ready=3), A100, L40S], 100.0, {"h100": 3, "a100": 0, "l40s": 0},
                 id="warm-kept-no-swap-to-cheaper-cold"),
    pytest.param([opt(H100, ready=2), A100, L40S], 100.0, {"h100": 2, "a100": 1, "l40s": 0},
                 id="warm-kept-shortfall-on-cheapest"),
    pytest.param([opt(H100, ready=2), opt(A100, ready=3), L40S], 60.0,
                 {"h100": 0, "a100": 3, "l40s": 0}, id="remove-the-dearest-per-unit-first"),
    pytest.param([opt(H100, ready=1), opt(A100, starting=2), L40S], 80.0,
                 {"h100": 1, "a100": 2, "l40s": 0}, id="starting-replicas-count-as-held"),
    pytest.param([opt(H100, ready=4, room=2), A100, L40S], 70.0,
                 {"h100": 2, "a100": 0, "l40s": 0}, id="a-grant-below-held-cuts-it"),
    pytest.param([opt(H100, room=1), opt(A100, room=1), opt(L40S, room=1)], 100.0,
                 {"h100": 1, "a100": 1, "l40s": 1}, id="short-fills-every-room"),
    pytest.param([H100, A100, L40S], 0.0, {"h100": 0, "a100": 0, "l40s": 0}, id="no-demand"),
]


@pytest.mark.parametrize(("options", "demand", "expected"), TABLE)
def test_mix_table(options: list[variants.Option], demand: float,
                   expected: dict[str, int]) -> None:
    assert dict(variants.mix(options, demand=demand, lookahead_s=600).replicas) == expected


def test_a_variant_slower_than_the_lookahead_grows_only_when_the_rest_cannot_cover() -> None:
    slow_cheap = variants.Option(name="slow", capacity=24, price=1.0, time_to_ready_s=900)
    fast = variants.Option(name="fast", capacity=24, price=4.0, time_to_ready_s=60, room=2)
    assert dict(variants.mix([slow_cheap, fast], demand=40, lookahead_s=120).replicas) == {
        "slow": 0, "fast": 2}
    # 2 fast replicas serve 48 < 60: late capacity is better than none.
    assert dict(variants.mix([slow_cheap, fast], demand=60, lookahead_s=120).replicas) == {
        "slow": 3, "fast": 0}


def test_bad_input_is_named() -> None:
    with pytest.raises(ValueError, match="named twice"):
        variants.mix([H100, H100], demand=1, lookahead_s=0)
    with pytest.raises(ValueError, match="demand"):
        variants.mix([H100], demand=math.nan, lookahead_s=0)


def _brute(options: list[variants.Option], demand: float, *, lookahead_s: float
           ) -> float | None:
    """The least price of any counts the rule allows (never adding and removing at once;
    growth in time first), by enumeration; None when no counts cover the demand."""
    held = [o.held for o in options]
    tops = [o.room if o.room is not None else h + math.ceil(demand / o.capacity) + 1
            for o, h in zip(options, held, strict=True)]
    best: dict[bool, float] = {}
    for counts in itertools.product(*(range(t + 1) for t in tops)):
        adds = any(n > h for n, h in zip(counts, held, strict=True))
        removes = any(n < h for n, h in zip(counts, held, strict=True))
        if adds and removes:
            continue
        if sum(n * o.capacity for n, o in zip(counts, options, strict=True)) < demand - 1e-9:
            continue
        late = any(n > h and o.time_to_ready_s > lookahead_s
                   for n, h, o in zip(counts, held, options, strict=True))
        cost = sum(n * o.price for n, o in zip(counts, options, strict=True))
        best[late] = min(best.get(late, math.inf), cost)
    if not best:
        return None
    return best[False] if False in best else best[True]


option_st = st.builds(
    variants.Option, name=st.just(""),
    capacity=st.integers(1, 40).map(float), price=st.integers(1, 20).map(float),
    ready=st.integers(0, 3), starting=st.integers(0, 2),
    room=st.one_of(st.none(), st.integers(0, 5)),
    time_to_ready_s=st.sampled_from([60.0, 300.0]))


@settings(max_examples=300, deadline=None)
@given(raw=st.lists(option_st, min_size=1, max_size=3), demand=st.integers(0, 120))
def test_mix_properties(raw: list[variants.Option], demand: int) -> None:
    options = [variants.Option(name=f"v{i}", capacity=o.capacity, price=o.price, ready=o.ready,
                               starting=o.starting, room=o.room,
                               time_to_ready_s=o.time_to_ready_s)
               for i, o in enumerate(raw)]
    result = variants.mix(options, demand=demand, lookahead_s=120)
    counts = [result.replicas[o.name] for o in options]
    held = [o.held for o in options]
    # Within every room.
    assert all(o.room is None or n <= o.room for n, o in zip(counts, options, strict=True))
    # Never removes a warm replica to add a cold one: no step both adds and removes.
    assert not (any(n > h for n, h in zip(counts, held, strict=True))
                and any(n < h for n, h in zip(counts, held, strict=True)))
    best = _brute(options, demand, lookahead_s=120)
    if best is None:  # the rooms cannot cover it: short, and every room is filled
        assert not result.met
        assert all(n == (o.room if o.room is not None else n)
                   for n, o in zip(counts, options, strict=True))
        return
    # Capacity covers the demand whenever the rooms allow.
    assert result.met and result.capacity >= demand
    # Exactly the cheapest the rule allows ...
    assert result.cost_hourly == pytest.approx(best)
    # ... so from nothing held, never dearer than the cheapest single variant meeting it
    # in time (a cheaper one slower than the look-ahead is grown only when those that are
    # ready in time cannot cover the demand).
    if not any(held):
        singles = [math.ceil(demand / o.capacity) * o.price for o in options
                   if (o.room is None or o.room * o.capacity >= demand)
                   and o.time_to_ready_s <= 120]
        assert result.cost_hourly <= min(singles, default=math.inf) + 1e-9


# ----- the fleet's two passes -------------------------------------------------------------


def _model(key: str, demand: float, *options: variants.Option) -> variants.VariantModel:
    return variants.VariantModel(key=key, tier=vocabulary.Tier.ONLINE, tenant=None,
                                 cost_center=None, demand=demand, lookahead_s=600,
                                 options=options)


def test_each_variant_is_an_ask_on_its_pool() -> None:
    pools = [fleet.FleetPool(name=n, gpus=16) for n in ("h100", "a100", "l40s")]
    grants, mixes = variants.settle(pools, [], asks=[],
                                    models=[_model("ns/m", 100, opt(H100), opt(A100), opt(L40S))])
    assert dict(mixes["ns/m"].replicas) == {"h100": 0, "a100": 4, "l40s": 1}
    assert grants["ns/m#a100"].replicas == 4
    assert grants["ns/m#a100"].reason.startswith("granted all 4 GPUs asked on pool a100")


def test_a_variant_capped_by_its_pool_moves_its_shortfall_to_the_next_cheapest() -> None:
    # Another online model holds 14 of the A100 pool's 16 GPUs: 2 are left for ns/m.
    pools = [fleet.FleetPool(name=n, gpus=16) for n in ("h100", "a100", "l40s")]
    other = fleet.Ask(key="ns/other", pool="a100", tier=vocabulary.Tier.ONLINE, tenant=None,
                      cost_center=None, gpus_per_replica=1, floor=14, desired=14, current=14)
    grants, mixes = variants.settle(pools, [], asks=[other],
                                    models=[_model("ns/m", 100, opt(H100), opt(A100), opt(L40S))])
    assert dict(mixes["ns/m"].replicas) == {"h100": 0, "a100": 2, "l40s": 5}
    assert mixes["ns/m"].met
    assert grants["ns/other"].replicas == 14
    assert grants["ns/m#l40s"].replicas == 5


def test_a_budget_cap_binds_each_variant_as_any_ask() -> None:
    pools = [fleet.FleetPool(name=n, gpus=16) for n in ("h100", "a100")]
    budget = fleet.BudgetRule(name="t", tenant="t", pool="a100", ceiling=3, borrow=True)
    item = variants.VariantModel(key="ns/m", tier=vocabulary.Tier.ONLINE, tenant="t",
                                 cost_center=None, demand=100, lookahead_s=600,
                                 options=(opt(H100), opt(A100)))
    grants, mixes = variants.settle(pools, [budget], asks=[], models=[item])
    assert dict(mixes["ns/m"].replicas) == {"h100": 1, "a100": 3}  # 40 + 72 >= 100
    assert grants["ns/m#a100"].cap_gpus == 3


# ----- from a policy ------------------------------------------------------------------------


def _variant_policy(**variant: object) -> model.ScalePolicy:
    document = policy().model_dump(by_alias=True)
    document["spec"]["variants"] = [
        {"name": "h100", "target": {"name": "m-h100"}, "nodePool": "h100", "capacity": 40,
         "resources": {"gpusPerReplica": 1}},
        {"name": "l40s", "target": {"name": "m-l40s"}, "nodePool": "l40s", "capacity": 12,
         "podStartSeconds": 150, "gpuHourly": 1.1, **variant}]
    return model.ScalePolicy.model_validate(document)


def test_options_price_a_variant_by_its_pool_and_start() -> None:
    pool = policy_fleet.GpuPool.model_validate({
        "apiVersion": "scaler.io/v1alpha1", "kind": "GpuPool", "metadata": {"name": "h100"},
        "spec": {"gpusPerNode": 8, "maxNodes": 2, "gpuHourly": 10.0}})
    options = variants.options_of(_variant_policy(), pools={"h100": pool},
                                  held={"l40s": (2, 1)})
    assert [(o.name, o.price, o.ready, o.starting, o.time_to_ready_s) for o in options] == [
        ("h100", 10.0, 0, 0, _variant_policy().spec.cold_start.pod_start_seconds),
        ("l40s", 1.1, 2, 1, 150)]
    assert variants.unit_capacity(_variant_policy()) == 10  # targetPerReplica


def test_policy_variants_are_checked() -> None:
    with pytest.raises(ValueError, match="h100 named more than once"):
        _variant_policy(name="h100")
    with pytest.raises(ValueError, match="Deployment m-h100 is the target of several"):
        _variant_policy(target={"name": "m-h100"})


def test_the_lookahead_is_the_decisions_time_to_ready() -> None:
    chosen = policy()
    decision, _ = engine_decide.decide(
        chosen, snapshot=snap(running=40, waiting=0),
        cluster=types.ClusterState(current=2, ready=2), state=types.EngineState(),
        now=1_700_000_000.0)
    assert decision.forecast is not None
    assert variants.lookahead_of(chosen, decision) == decision.forecast.time_to_ready_s


def test_a_variant_keeps_its_busy_replicas_unless_its_room_is_below_them() -> None:
    # Demand 60 alone removes both H100s (remove-the-dearest-per-unit-first). One of them
    # reports unfinished work (keep 1, a batch tier's busy floor): it stays, and one A100
    # covers the 20 left (4.0/h, where two would hold 48).
    busy = dataclasses.replace(opt(H100, ready=2), keep=1)
    rest = [opt(A100, ready=3), L40S]
    assert dict(variants.mix([busy, *rest], demand=60, lookahead_s=600).replicas) == {
        "h100": 1, "a100": 1, "l40s": 0}
    # A grant of no H100 (its budget or pool exceeded) still cuts it.
    assert dict(variants.mix([dataclasses.replace(busy, room=0), *rest], demand=60,
                             lookahead_s=600).replicas) == {"h100": 0, "a100": 3, "l40s": 0}
