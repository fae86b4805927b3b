"""A model's variants written as one change: all checked before any is written, scale-ups
first, a refusal after a write reported as a half-applied mix, dry-run writing nothing."""

from __future__ import annotations

import pytest

from scaler.actuators import base
from scaler.emulator import Fault
from scaler.emulator.env import KubeTestEnv, ManualClock
from scaler.service import variants as service_variants

from .factories import make_decision, make_policy
from .test_replicas import actuator, spec_replicas

pytestmark = pytest.mark.kube


async def _two(kube: KubeTestEnv, *, up: tuple[int, int], down: tuple[int, int]
               ) -> list[service_variants.Part]:
    """Deployment `up` scaled up, `down` scaled down: (current, desired) each."""
    parts = []
    for name, (current, desired) in (("mix-down", down), ("mix-up", up)):
        await kube.create_deployment(name, replicas=current)
        policy = make_policy(kube.namespace, name)
        parts.append((policy, make_decision(policy.key, current=current, desired=desired)))
    return parts


async def test_every_variant_is_written_scale_ups_first(kube: KubeTestEnv,
                                                        wall_clock: ManualClock) -> None:
    parts = await _two(kube, up=(1, 3), down=(2, 1))
    act = actuator(kube, wall_clock)
    assert isinstance(act, base.MixActuator)

    outcomes = await act.apply_all(parts)

    assert [o.outcome for o in outcomes] == [base.Outcome.APPLIED] * 2  # in parts' order
    assert (await spec_replicas(kube, "mix-down"), await spec_replicas(kube, "mix-up")) == (1, 3)
    if kube.emulator is not None:
        patched = [r.path for r in kube.emulator.requests
                   if r.method == "PATCH" and r.path.endswith("/scale")]
        assert [p.split("/")[-2] for p in patched] == ["mix-up", "mix-down"]
    applied = service_variants.combined(outcomes)
    assert applied.outcome is base.Outcome.APPLIED and not applied.partial


async def test_a_variant_moved_since_the_read_writes_none(kube: KubeTestEnv,
                                                          wall_clock: ManualClock) -> None:
    parts = await _two(kube, up=(1, 3), down=(2, 1))
    policy, decision = parts[0]
    parts[0] = (policy, make_decision(policy.key, current=4, desired=1))  # it holds 2

    outcomes = await actuator(kube, wall_clock).apply_all(parts)

    assert [o.outcome for o in outcomes] == [base.Outcome.CONFLICT] * 2
    assert "not written" in outcomes[1].reason
    assert (await spec_replicas(kube, "mix-down"), await spec_replicas(kube, "mix-up")) == (2, 1)
    applied = service_variants.combined(outcomes)
    assert applied.outcome is base.Outcome.CONFLICT and not applied.partial


@pytest.mark.emulator_only
async def test_a_write_refused_after_another_landed_is_a_half_applied_mix(
        kube: KubeTestEnv, wall_clock: ManualClock) -> None:
    assert kube.emulator is not None
    parts = await _two(kube, up=(1, 3), down=(2, 1))
    # 422 with spec.replicas unmoved: refused for good (an invalid write), no retry.
    kube.emulator.inject(Fault(verb="patch", path="/mix-down/scale$", status=422))

    outcomes = await actuator(kube, wall_clock).apply_all(parts)

    assert [o.outcome for o in outcomes] == [base.Outcome.FAILED, base.Outcome.APPLIED]
    assert (await spec_replicas(kube, "mix-down"), await spec_replicas(kube, "mix-up")) == (2, 3)
    applied = service_variants.combined(outcomes)
    assert applied.outcome is base.Outcome.FAILED and applied.partial
    assert applied.reason.startswith("mix half-applied, decided again: ")
    assert "mix-down: failed 2->1" in applied.reason


async def test_dry_run_writes_no_variant(kube: KubeTestEnv, wall_clock: ManualClock) -> None:
    parts = await _two(kube, up=(1, 3), down=(2, 1))

    outcomes = await actuator(kube, wall_clock, dry_run=True).apply_all(parts)

    assert [o.outcome for o in outcomes] == [base.Outcome.DRY_RUN] * 2
    assert (await spec_replicas(kube, "mix-down"), await spec_replicas(kube, "mix-up")) == (2, 1)
    assert service_variants.combined(outcomes).outcome is base.Outcome.DRY_RUN

