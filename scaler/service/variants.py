"""Variants in the service: every variant's target read, decided on as one, the mix written.

A policy with spec.variants is one model (one signal key, one decision, one engine state)
served by several targets, one per hardware variant. Each evaluation reads every
variant's target as the policy would be read if that variant were its target (`views`),
sums the reads capacity-equivalent for `decide` (`engine.variants.equivalent_state`),
records the decision with the arbiter as the model's demand (`Arbiter.record_variants`;
for a batch tier with each variant's busy replicas, which its mix keeps: `Reading.busy`),
and writes the last arbitration's mix to every variant's target as one change (`parts`,
`apply`). spec.target itself is neither read nor patched while variants are set.

A variant whose target an HPA or KEDA ScaledObject scales is never patched: the write of
a mix finds its owner (`owners_after`), the arbiter then mixes it at what it holds, and
its part asks no change of it. A mix that changes no count is still written (every part
unchanged: its owners checked, nothing patched) once per `OWNER_RECHECK_S`, so an HPA
created since the last write is found without a count change (`pending`). Each
evaluation's variants are kept as `state.VariantObservation`s (`observed`:
status.variants, /metrics, `scaler explain`), and each variant's replicas are planned on
its own pool's nodes (`pool_members`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
from collections.abc import Collection, Iterable, Mapping, Sequence

from scaler.actuators import base as actuators
from scaler.engine import fleet as engine_fleet
from scaler.engine import nodes, types
from scaler.engine import variants as engine_variants
from scaler.policy import fleet as policy_fleet
from scaler.policy import model
from scaler.service import state as service_state

log = logging.getLogger(__name__)

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
    pool (its nodes give the variant's free GPUs; no actuator plans it), its GPU-hour's
    price as spec.cost (`engine.variants.options_of`: its own gpuHourly, else its
    GpuPool's, else spec.cost's), no variants."""
    out = []
    prices = engine_variants.options_of(policy, pools=pools, held={})
    for variant, option in zip(policy.spec.variants, prices, strict=True):
        gpu_pool = pools.get(variant.node_pool)
        node_pool = None if gpu_pool is None else model.NodePool(
            name=gpu_pool.name, gpus_per_node=gpu_pool.spec.gpus_per_node,
            max_nodes=gpu_pool.spec.max_nodes, node_selector=dict(gpu_pool.spec.node_selector),
            actuator="none")
        cost = policy.spec.cost.model_copy(
            update={"gpu_hourly": option.price / option.gpus_per_replica})
        spec = policy.spec.model_copy(update={"target": variant.target,
                                              "resources": variant.resources,
                                              "node_pool": node_pool, "cost": cost,
                                              "variants": ()})
        out.append(policy.model_copy(update={"spec": spec}))
    return tuple(out)


@dataclasses.dataclass(frozen=True, slots=True)
class Reading:
    """Every variant's view (`views`) and cluster state, in spec.variants order, and their
    capacity-equivalent sum, the cluster state `decide` reads. A state's busy_replicas is
    that variant's own (`base.VariantBusyReader`), None when not counted."""

    policy: model.ScalePolicy
    views: tuple[model.ScalePolicy, ...]
    states: tuple[types.ClusterState, ...]
    equivalent: types.ClusterState

    @property
    def held(self) -> dict[str, tuple[int, int]]:
        """(ready, starting) per variant name, as `Arbiter.record_variants` takes them."""
        return {v.name: (s.ready, len(s.starting))
                for v, s in zip(self.policy.spec.variants, self.states, strict=True)}

    @property
    def busy(self) -> dict[str, int]:
        """Replicas reporting unfinished work per variant name, for the variants whose
        count the reader gave (a batch tier's): what `Arbiter.record_variants` keeps."""
        return {v.name: s.busy_replicas
                for v, s in zip(self.policy.spec.variants, self.states, strict=True)
                if s.busy_replicas is not None}

    @property
    def excluded_gpus(self) -> dict[str, int]:
        """GPUs each variant's pool excluded (DCGM health errors), by pool name."""
        return {v.node_pool: s.excluded_gpus
                for v, s in zip(self.policy.spec.variants, self.states, strict=True)}


async def read(reader: actuators.ClusterReader, policy: model.ScalePolicy,
               targets: Sequence[model.ScalePolicy]) -> Reading:
    """Read every variant's target (`targets`: the policy's `views`) at once, each with
    its own busy replicas when the reader counts them (a batch tier's: the reports of
    the variant's own pods; the model's whole count is no variant's)."""
    states = await asyncio.gather(*(reader.read(view) for view in targets))
    if isinstance(reader, actuators.VariantBusyReader):
        states = [dataclasses.replace(state, busy_replicas=reader.variant_busy(policy, view))
                  for state, view in zip(states, targets, strict=True)]
    return Reading(policy=policy, views=tuple(targets), states=tuple(states),
                   equivalent=engine_variants.equivalent_state(
                       states, weights=engine_variants.weights_of(policy)))


def parts(reading: Reading, targets: Sequence[model.ScalePolicy], *,
          mix: engine_variants.Mix, decision: types.Decision, note: str,
          owners: Mapping[str, str] | None = None) -> list[Part]:
    """One decision per variant: current is its spec.replicas as read (the actuator's
    precondition), desired its count in the mix, the reason `note` (the mix in words);
    a variant in `owners` (its HPA scales it) is left at its spec.replicas.
    The model's clamps and steps are in the model's yardstick replicas, so left out; its
    warning that a scale-down cuts answers goes with the variants that scale down."""
    owned = owners or {}
    items: list[Part] = []
    for variant, view, state in zip(reading.policy.spec.variants, targets, reading.states,
                                    strict=True):
        desired = state.current if variant.name in owned else mix.replicas[variant.name]
        items.append((view, dataclasses.replace(
            decision, current=state.current, desired=desired, clamps=(), steps=(),
            notes=(note,),
            cut_warning=decision.cut_warning if desired < state.current else None)))
    return items


OWNER_RECHECK_S = 15.0
"""Seconds after which a mix that changes no count is written anyway, to check its
targets' owners again (`pending`). 15 s is the HPA controller's sync period
(--horizontal-pod-autoscaler-sync-period): an HPA created on a variant's target first
sets its replicas within about 15 s, so the scaler finds it within about the time the HPA
takes to act, and the two fight over the count for about one sync at most. Each re-check
reads the variant's Scale once (`KubeReplicaActuator._check`) and the namespace's HPAs
and ScaledObjects at most once per kube.ownership_ttl_s (30 s by default: the find then
takes up to 15 + 30 s); the cluster reader already reads every Scale each evaluation
(every 5 s at least), so this adds at most a third to those reads, not a call per
evaluation per variant."""


def pending(items: Sequence[Part], *, owners: Mapping[str, str] | None,
            checked_at: float | None, now: float) -> bool:
    """Whether the mix is to be written: a variant's target is not at its count in the
    mix; or the targets' owners were never checked (`owners` None); or an HPA is known to
    own one (the write checks whether it still does: a team may remove its HPA, and the
    variant is then mixed and patched as the others); or every owner was last checked
    (`checked_at`, wall seconds, `Arbiter.owners_checked_at`) `OWNER_RECHECK_S` or more
    before `now` (or never): a write that changes nothing checks them, so an HPA added
    since is found without a count change, and writes nothing (`apply_all`). Example: a
    mix held at h100 2, l40s 4, owners checked at t = 100 s: not pending at 110 s, pending
    at 115 s."""
    if owners is None or owners or any(decision.changed for _, decision in items):
        return True
    # A wall clock set back (now before the check) re-checks too, rather than waiting.
    return checked_at is None or not 0.0 <= now - checked_at < OWNER_RECHECK_S


def every_owner_checked(policy: model.ScalePolicy,
                        outcomes: Sequence[actuators.ApplyOutcome]) -> bool:
    """Whether a write of the mix checked every variant's owner: each outcome found one
    or read the Scale past the check (`owners_after`), and none stopped early."""
    return len(outcomes) == len(policy.spec.variants) and all(
        outcome.owner is not None or outcome.previous is not None for outcome in outcomes)


def owners_after(policy: model.ScalePolicy, outcomes: Sequence[actuators.ApplyOutcome], *,
                 before: Mapping[str, str] | None) -> dict[str, str]:
    """Variant name -> its target's HPA or ScaledObject, after a write of the mix.

    `outcomes` are the write's, in spec.variants order (fewer when it stopped early). An
    outcome with an owner says the variant is owned; one whose Scale was read
    (`previous` known) passed the ownership check, so it is not; any other (not the
    leader, the check failed, not reached) says nothing, and `before` stays for it."""
    found = dict(before or {})
    for variant, outcome in zip(policy.spec.variants, outcomes, strict=False):
        if outcome.owner is not None:
            found[variant.name] = outcome.owner
        elif outcome.previous is not None:
            found.pop(variant.name, None)
    return found


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
        if out[-1].outcome not in _GO_ON and not out[-1].left_to_owner(decision):
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
    """The outcome of a mix from its parts' (see `Applied`). A part its HPA owns is said
    in the reason but sets the outcome only when every part is owned (SKIPPED_HPA_OWNED,
    as for a model without variants): the rest of the mix was written as asked."""
    if not outcomes:
        return Applied(actuators.Outcome.UNCHANGED, "no variant to write", partial=False)
    scaled = [o for o in outcomes if o.owner is None] or outcomes
    worst = min((o.outcome for o in scaled), key=_WORST_FIRST.index)
    said = [f"{o.target}: {o.outcome} {o.previous}->{o.desired}"
            + (f" ({o.reason})" if o.reason else "")
            for o in outcomes if o.outcome is not actuators.Outcome.UNCHANGED]
    partial = worst not in _GO_ON and any(o.written for o in outcomes)
    reason = "; ".join(said) or "every variant already at the mix"
    if partial:
        reason = "mix half-applied, decided again: " + reason
    return Applied(worst, reason, partial=partial)


# ----- what each evaluation saw of each variant ---------------------------------------------


def observed(reading: Reading, *, mix: engine_variants.Mix | None,
             owners: Mapping[str, str] | None
             ) -> tuple[service_state.VariantObservation, ...]:
    """Each variant as this evaluation read it, with its count in `mix` (the last
    arbitration's; None before one) and its owner. A variant its HPA owns is desired at
    its spec.replicas: the scaler asks nothing else of it."""
    out = []
    for variant, view, state in zip(reading.policy.spec.variants, reading.views,
                                    reading.states, strict=True):
        owner = (owners or {}).get(variant.name)
        desired = (state.current if owner is not None
                   else None if mix is None else mix.replicas.get(variant.name))
        out.append(service_state.VariantObservation(
            name=variant.name, target=variant.target.name, pool=variant.node_pool,
            desired=desired, current=state.current, ready=state.ready,
            starting=len(state.starting), gpus_per_replica=variant.resources.gpus_per_replica,
            gpu_hourly=view.spec.cost.gpu_hourly, owner=owner,
            gpu_sm_active=state.gpu_sm_active))
    return tuple(out)


# ----- node planning: each variant on its own pool ------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class PoolMembers:
    """What a node pool is planned from: its settings, GPU resource and every demand."""

    pool: model.NodePool
    resource_name: str
    demands: tuple[types.PoolDemand, ...]


def planned_pools(policy: model.ScalePolicy, *, actuators_by_kind: Collection[str]
                  ) -> list[str]:
    """The pools whose plan a new decision of `policy` may change: its spec.nodePool when
    an actuator of that kind runs, and every variant's pool (which may take its settings
    from another policy's spec.nodePool)."""
    found = [pool.name for pool in (policy.spec.node_pool,)
             if pool is not None and pool.actuator in actuators_by_kind]
    found += [v.node_pool for v in policy.spec.variants if v.node_pool not in found]
    return found


def _variant_on(policy: model.ScalePolicy, name: str) -> model.Variant | None:
    return next((v for v in policy.spec.variants if v.node_pool == name), None)


def _derived(policy: model.ScalePolicy, gpu_pool: policy_fleet.GpuPool) -> model.NodePool | None:
    """The settings of a variant's GpuPool that no spec.nodePool names: the policy's own
    spec.nodePool's actuator, warm nodes, tolerations and scale-down, on the GpuPool's
    name, nodes and selector. Not for clusterapi: its machineDeployment is one pool's."""
    own = policy.spec.node_pool
    if own is None or own.actuator == "clusterapi":
        return None
    spec = gpu_pool.spec
    return own.model_copy(update={"name": gpu_pool.name, "gpus_per_node": spec.gpus_per_node,
                                  "max_nodes": spec.max_nodes,
                                  "node_selector": dict(spec.node_selector)})


def variant_forecasts(policy: model.ScalePolicy, decision: types.Decision,
                      rows: Sequence[service_state.VariantObservation], *,
                      pools: Mapping[str, policy_fleet.GpuPool]) -> dict[str, int]:
    """Replicas per variant one node boot ahead, for the pools' headroom: the model's
    forecast demand (its decision's replicas at node ready, within replicas.max, of the
    policy's yardstick) mixed over the variants with their counts in the mix as held, so
    the forecast adds where the mix would add next. Never below the mix; a variant its
    HPA owns stays at its count. Example: a mix of 2 H100 (30 each) and 4 L40S (10, its
    pool full) for 100 requests, forecast 120: the 20 more go to one H100 -> h100 3."""
    counts = {row.name: row.desired for row in rows if row.desired is not None}
    if len(counts) != len(policy.spec.variants) or decision.forecast is None:
        return counts
    yardstick = min(max(decision.forecast.replicas_at_node_ready,
                        engine_fleet.uncapped_desired(decision)), policy.spec.replicas.max)
    owned = {row.name for row in rows if row.owner is not None}
    options = []
    for option in engine_variants.options_of(policy, pools=pools,
                                             held={n: (c, 0) for n, c in counts.items()}):
        count, gpu_pool = counts[option.name], pools.get(option.pool or "")
        if option.name in owned:
            option = dataclasses.replace(option, keep=count, room=count)
        elif gpu_pool is not None:  # room: the pool's grantable GPUs (never under the mix)
            grantable = engine_fleet.fleet_pool(gpu_pool).grantable
            option = dataclasses.replace(
                option, room=max(count, grantable // option.gpus_per_replica))
        options.append(option)
    ahead = engine_variants.mix(options, demand=yardstick * engine_variants.unit_capacity(policy),
                                lookahead_s=math.inf)
    return {name: max(count, ahead.replicas[name]) for name, count in counts.items()}


def pool_members(statuses: Iterable[service_state.ModelStatus], name: str, *,
                 pools: Mapping[str, policy_fleet.GpuPool]) -> PoolMembers | None:
    """Every decided demand on node pool `name`, and the settings it is planned with.

    A model without variants on it (spec.nodePool) asks its decided replicas
    (`engine.nodes.pool_demand`). A model with variants asks nothing of its spec.nodePool
    itself (spec.target is not scaled): each variant asks its count in the mix, of its
    own gpusPerReplica, on its own pool (key ns/model#variant). Example: a mix of 3 H100
    replicas of 2 GPUs on 4-GPU nodes needs 2 nodes of the H100 pool, and 4 L40S of 1 GPU
    one node of the L40S pool, where the model's 13 yardstick replicas (3 x 3 + 4) of
    1 GPU would have asked 4 nodes of one pool. Settings: the first by key of the
    policies whose spec.nodePool is named `name`, else the first policy with a variant on
    it (`_derived`); None when neither exists (the cluster autoscaler alone serves it).
    """
    def names(policy: model.ScalePolicy) -> bool:
        return policy.spec.node_pool is not None and policy.spec.node_pool.name == name

    members = sorted((status for status in statuses if status.last is not None and (
                         names(status.policy) or _variant_on(status.policy, name) is not None)),
                     key=lambda status: status.key)
    settings: tuple[model.NodePool, str] | None = None
    named = next((status.policy for status in members if names(status.policy)), None)
    if named is not None and named.spec.node_pool is not None:
        settings = (named.spec.node_pool,
                    (_variant_on(named, name) or named.spec).resources.resource_name)
    demands: list[types.PoolDemand] = []
    for status in members:
        policy, last = status.policy, status.last
        assert last is not None
        variant = _variant_on(policy, name)
        if not policy.spec.variants:
            demands.append(nodes.pool_demand(policy, last.decision))
            continue
        row = next((r for r in last.variants if variant is not None and r.name == variant.name),
                   None)
        if variant is None or row is None or row.desired is None:
            continue
        if settings is None and name in pools:
            derived = _derived(policy, pools[name])
            if derived is not None:
                settings = (derived, variant.resources.resource_name)
        ahead = variant_forecasts(policy, last.decision, last.variants, pools=pools)
        demands.append(types.PoolDemand(
            model=engine_variants.variant_key(policy.key, variant.name),
            gpus_per_replica=variant.resources.gpus_per_replica, replicas=row.desired,
            forecast_replicas=ahead.get(variant.name, row.desired)))
    if settings is None:
        return None
    pool, resource_name = settings
    fits = [d for d in demands if d.gpus_per_replica <= pool.gpus_per_node]
    for each in demands:
        if each not in fits:  # `scaler validate` refuses it when the GpuPool is loaded
            log.warning("pool %s: %s needs %d GPUs per replica, more than a node's %d: not "
                        "planned", name, each.model, each.gpus_per_replica, pool.gpus_per_node)
    return PoolMembers(pool=pool, resource_name=resource_name, demands=tuple(fits))
