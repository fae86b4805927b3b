"""Variants in the service: every variant's target read, decided on as one, the mix written.

A policy with spec.variants is one model (one signal key, one decision, one engine state)
served by several targets, one per hardware variant. Each evaluation reads every
variant's target as the policy would be read if that variant were its target (`views`),
sums the reads capacity-equivalent for `decide` (`engine.variants.equivalent_state`),
records the decision with the arbiter as the model's demand (`Arbiter.record_variants`),
and writes the last arbitration's mix to every variant's target as one change (`parts`,
`apply`). spec.target itself is neither read nor patched while variants are set.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping, Sequence

from scaler.actuators import base as actuators
from scaler.engine import types
from scaler.engine import variants as engine_variants
from scaler.policy import fleet as policy_fleet
from scaler.policy import model

Part = tuple[model.ScalePolicy, types.Decision]
"""One variant's write: the policy as that variant (`views`) and its decision."""

# Worst first: the outcome of a mix is its worst part's. A mix partly written and then
# refused (FAILED, CONFLICT) is reported as the refusal, so the reactor decides it again.
_WORST_FIRST = (actuators.Outcome.FAILED, actuators.Outcome.CONFLICT,
                actuators.Outcome.NOT_LEADER, actuators.Outcome.SKIPPED_HPA_OWNED,
                actuators.Outcome.DRY_RUN, actuators.Outcome.APPLIED,
                actuators.Outcome.UNCHANGED)
_GO_ON = frozenset({actuators.Outcome.APPLIED, actuators.Outcome.UNCHANGED,
                    actuators.Outcome.DRY_RUN})


def views(policy: model.ScalePolicy, *, pools: Mapping[str, policy_fleet.GpuPool]
          ) -> tuple[model.ScalePolicy, ...]:
    """Per variant, in spec.variants order, the policy as the cluster reader and the
    replica actuator see that variant: its target and resources, its GpuPool as the node
    pool (its nodes give the variant's free GPUs; no actuator plans it), no variants."""
    out = []
    for variant in policy.spec.variants:
        gpu_pool = pools.get(variant.node_pool)
        node_pool = None if gpu_pool is None else model.NodePool(
            name=gpu_pool.name, gpus_per_node=gpu_pool.spec.gpus_per_node,
            max_nodes=gpu_pool.spec.max_nodes, node_selector=dict(gpu_pool.spec.node_selector),
            actuator="none")
        spec = policy.spec.model_copy(update={"target": variant.target,
                                              "resources": variant.resources,
                                              "node_pool": node_pool, "variants": ()})
        out.append(policy.model_copy(update={"spec": spec}))
    return tuple(out)


@dataclasses.dataclass(frozen=True, slots=True)
class Reading:
    """Every variant's cluster state, in spec.variants order, and their capacity-equivalent
    sum, the cluster state `decide` reads."""

    policy: model.ScalePolicy
    states: tuple[types.ClusterState, ...]
    equivalent: types.ClusterState

    @property
    def held(self) -> dict[str, tuple[int, int]]:
        """(ready, starting) per variant name, as `Arbiter.record_variants` takes them."""
        return {v.name: (s.ready, len(s.starting))
                for v, s in zip(self.policy.spec.variants, self.states, strict=True)}

    @property
    def excluded_gpus(self) -> dict[str, int]:
        """GPUs each variant's pool excluded (DCGM health errors), by pool name."""
        return {v.node_pool: s.excluded_gpus
                for v, s in zip(self.policy.spec.variants, self.states, strict=True)}


async def read(reader: actuators.ClusterReader, policy: model.ScalePolicy,
               targets: Sequence[model.ScalePolicy]) -> Reading:
    """Read every variant's target (`targets`: the policy's `views`) at once."""
    states = await asyncio.gather(*(reader.read(view) for view in targets))
    return Reading(policy=policy, states=tuple(states),
                   equivalent=engine_variants.equivalent_state(
                       states, weights=engine_variants.weights_of(policy)))


def parts(reading: Reading, targets: Sequence[model.ScalePolicy], *,
          mix: engine_variants.Mix, decision: types.Decision, note: str) -> list[Part]:
    """One decision per variant: current is its spec.replicas as read (the actuator's
    precondition), desired its count in the mix, the reason `note` (the mix in words).
    The model's clamps and steps are in the model's yardstick replicas, so left out."""
    return [(view, dataclasses.replace(decision, current=state.current,
                                       desired=mix.replicas[variant.name], clamps=(),
                                       steps=(), notes=(note,)))
            for variant, view, state in zip(reading.policy.spec.variants, targets,
                                            reading.states, strict=True)]


def pending(items: Sequence[Part]) -> bool:
    """Whether any variant's target is not at its count in the mix."""
    return any(decision.changed for _, decision in items)


async def apply(actuator: actuators.ReplicaActuator, items: Sequence[Part]
                ) -> list[actuators.ApplyOutcome]:
    """Write a mix: every variant checked before any is written when the actuator can
    (`base.MixActuator`); otherwise one variant after another, stopping at the first not
    written as asked (the rest keep their replicas, and the caller decides again)."""
    if isinstance(actuator, actuators.MixActuator):
        return await actuator.apply_all(items)
    out = []
    for view, decision in items:
        out.append(await actuator.apply(view, decision))
        if out[-1].outcome not in _GO_ON:
            break
    return out


@dataclasses.dataclass(frozen=True, slots=True)
class Applied:
    """A mix's write as one outcome: the worst part's, the parts' reasons, and whether it
    was left half-applied (some variants written, then one refused)."""

    outcome: actuators.Outcome
    reason: str
    partial: bool


def combined(outcomes: Sequence[actuators.ApplyOutcome]) -> Applied:
    """The outcome of a mix from its parts' (see `Applied`)."""
    if not outcomes:
        return Applied(actuators.Outcome.UNCHANGED, "no variant to write", partial=False)
    worst = min((o.outcome for o in outcomes), key=_WORST_FIRST.index)
    said = [f"{o.target}: {o.outcome} {o.previous}->{o.desired}"
            + (f" ({o.reason})" if o.reason else "")
            for o in outcomes if o.outcome is not actuators.Outcome.UNCHANGED]
    partial = worst not in _GO_ON and any(o.written for o in outcomes)
    reason = "; ".join(said) or "every variant already at the mix"
    if partial:
        reason = "mix half-applied, decided again: " + reason
    return Applied(worst, reason, partial=partial)
