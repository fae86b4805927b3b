"""A ScalePolicy's status (pure): replicas, the winning signal and HPA-style conditions,
from the latest decision, the load's problems and the status written before."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from scaler.actuators import timefmt
from scaler.engine import cost as engine_cost
from scaler.engine import types
from scaler.policy import crd, loader, model
from scaler.service import state

Status = dict[str, Any]
Type = crd.ConditionType

# The rules that read a policy's configured signals (the rest are derived: arrival rate,
# forecast, return, cycle), so the ones SignalsFresh speaks for.
SIGNAL_RULES = (types.Rule.CONCURRENCY, types.Rule.QUEUE_DEPTH,
                types.Rule.TOKENS_PER_SECOND, types.Rule.P95_LATENCY)


@dataclass(frozen=True, slots=True)
class Condition:
    """One condition as computed now; lastTransitionTime is added against the previous."""

    type: crd.ConditionType
    status: bool | None  # None: Unknown
    reason: str
    message: str

    @property
    def status_text(self) -> str:
        return "Unknown" if self.status is None else str(self.status)


def _policy_valid(problems: Sequence[loader.PolicyError], in_force: bool) -> Condition:
    if not problems:
        return Condition(Type.POLICY_VALID, True, "ValidPolicy",
                         "the spec is valid and in force")
    collision = any(problem.reason == "duplicate" for problem in problems)
    stays = ("; the last good version stays in force" if in_force
             else "; this resource scales nothing")
    return Condition(Type.POLICY_VALID, False, "NameCollision" if collision else "InvalidSpec",
                     "; ".join(str(problem) for problem in problems) + stays)


def _signals_fresh(policy: model.ScalePolicy, decision: types.Decision) -> Condition:
    readings = [each for each in decision.signals if each.name in SIGNAL_RULES]
    unusable = [each for each in readings if not each.fresh]
    if readings and not unusable:
        return Condition(Type.SIGNALS_FRESH, True, "SignalsFresh",
                         "every signal is fresh: " + ", ".join(
                             f"{each.name} {each.age_s or 0:.0f} s old" for each in readings))
    limit = policy.spec.stale_after_seconds
    words = [f"{each.name} missing" if each.age_s is None
             else f"{each.name} {each.age_s:.0f} s old" for each in unusable]
    return Condition(Type.SIGNALS_FRESH, False, "SignalsStale",
                     f"{', '.join(words) or 'no signal'} (staleAfterSeconds {limit:g}): "
                     "stale signals never scale down")


def _scaling_active(decision: types.Decision) -> Condition:
    if decision.winner is not None:
        return Condition(Type.SCALING_ACTIVE, True, "ValidMetricFound",
                         f"the scaler computed a replica count from {decision.winner}")
    return Condition(Type.SCALING_ACTIVE, False, "NoFreshSignal",
                     f"no fresh signal: replicas held at {decision.desired}")


def _able_to_scale(policy: model.ScalePolicy, decision: types.Decision) -> Condition:
    behavior = policy.spec.behavior
    if behavior.scale_up.select_policy == behavior.scale_down.select_policy == "Disabled":
        return Condition(Type.ABLE_TO_SCALE, False, "BackoffBoth",
                         "scaling is disabled in both directions (selectPolicy Disabled)")
    names = {clamp.name for clamp in decision.clamps}
    if types.ClampName.STABILIZATION_DOWN in names:
        return Condition(Type.ABLE_TO_SCALE, True, "ScaleDownStabilized",
                         "recent recommendations were higher than the current one, applying "
                         "the highest recent recommendation")
    if types.ClampName.STABILIZATION_UP in names:
        return Condition(Type.ABLE_TO_SCALE, True, "ScaleUpStabilized",
                         "recent recommendations were lower than the current one, applying "
                         "the lowest recent recommendation")
    if decision.changed:
        return Condition(Type.ABLE_TO_SCALE, True, "SucceededRescale",
                         f"the scaler asked the target for {decision.desired} replicas")
    return Condition(Type.ABLE_TO_SCALE, True, "ReadyForNewScale",
                     "recommended size matches current size")


# Which clamp says the count is limited, and how, first match wins: the hard bounds before
# the rate limits, as the bounds are applied last.
_LIMITS: tuple[tuple[types.ClampName, str, str], ...] = (
    (types.ClampName.MAX, "TooManyReplicas",
     "the desired replica count is more than the maximum replica count"),
    (types.ClampName.BUDGET, "TooManyReplicas",
     "the desired replica count needs more GPUs than budget.maxGpus"),
    (types.ClampName.EXTERNAL_BUDGET, "TooManyReplicas",
     "the desired replica count needs more GPUs than the pool or tenant budget"),
    (types.ClampName.MIN, "TooFewReplicas",
     "the desired replica count is less than the minimum replica count"),
    (types.ClampName.WARM_FLOOR, "TooFewReplicas",
     "the desired replica count is less than the warm floor"),
    (types.ClampName.RATE_LIMIT_UP, "ScaleUpLimit",
     "the desired replica count is increasing faster than the maximum scale rate"),
    (types.ClampName.RATE_LIMIT_DOWN, "ScaleDownLimit",
     "the desired replica count is decreasing faster than the maximum scale rate"),
)


def _scaling_limited(decision: types.Decision) -> Condition:
    clamps = {clamp.name: clamp for clamp in decision.clamps}
    for name, reason, message in _LIMITS:
        clamp = clamps.get(name)
        if clamp is not None:
            return Condition(Type.SCALING_LIMITED, True, reason,
                             f"{message} ({clamp.before} -> {clamp.after})")
    return Condition(Type.SCALING_LIMITED, False, "DesiredWithinRange",
                     "the desired count is within the acceptable range")


def _variants_scaled(observation: state.Observation) -> Condition:
    """Whether the scaler scales every variant's target, or an HPA (or KEDA
    ScaledObject) scales one: that one is not patched, and what it holds counts in the
    mix, so the others are not sized as if it were empty."""
    owned = [row for row in observation.variants if row.owner is not None]
    if not owned:
        return Condition(Type.VARIANTS_SCALED, True, "ScaledByScaler",
                         "the scaler scales every variant's target: " + ", ".join(
                             f"{row.name} ({row.target})" for row in observation.variants))
    return Condition(Type.VARIANTS_SCALED, False, "OwnedByHPA", "; ".join(
        f"variant {row.name} ({row.target}) is scaled by {row.owner}: not patched, its "
        f"{row.ready + row.starting} ready and starting replicas count in the mix"
        for row in owned))


def evaluate(policy: model.ScalePolicy | None, observation: state.Observation | None, *,
             problems: Sequence[loader.PolicyError]) -> list[Condition]:
    """Every condition now. Without a decision yet, the scaling ones are Unknown.
    VariantsScaled only for a policy with spec.variants."""
    found = [_policy_valid(problems, in_force=policy is not None)]
    variants = policy is not None and bool(policy.spec.variants)
    if policy is None or observation is None:
        waiting = "no decision yet" if policy is not None else "the policy is not in force"
        found += [Condition(kind, None, "NotEvaluated", waiting) for kind in (
            Type.ABLE_TO_SCALE, Type.SCALING_ACTIVE, Type.SCALING_LIMITED,
            Type.SIGNALS_FRESH, *((Type.VARIANTS_SCALED,) if variants else ()))]
        return found
    decision = observation.decision
    found += [_able_to_scale(policy, decision), _scaling_active(decision),
              _scaling_limited(decision), _signals_fresh(policy, decision)]
    if variants:
        found.append(_variants_scaled(observation))
    return found


def view(policy: model.ScalePolicy, observation: state.Observation) -> list[dict[str, str]]:
    """The scaling conditions of one decision, for policies from files too (`scaler
    explain`, /v1/models/.../decision): no lastTransitionTime, since no status is kept for
    a file, and no PolicyValid, which a file's load reports (/v1/policies)."""
    return [{"type": each.type.value, "status": each.status_text, "reason": each.reason,
             "message": each.message}
            for each in evaluate(policy, observation, problems=())
            if each.type is not Type.POLICY_VALID]


def _as_list(previous: Mapping[str, Any] | None) -> dict[str, Mapping[str, Any]]:
    items = (previous or {}).get("conditions") or []
    return {str(item.get("type")): item for item in items if isinstance(item, Mapping)}


def status(policy: model.ScalePolicy | None, observation: state.Observation | None, *,
           problems: Sequence[loader.PolicyError], previous: Mapping[str, Any] | None,
           generation: int | None, now: float, last_scale_at: float | None = None,
           variant_costs: Mapping[str, engine_cost.Cost] | None = None) -> Status:
    """The status to write. lastTransitionTime moves only when a condition's status does
    (a new reason or message keeps it, as the HPA's setCondition); lastScaleTime moves when
    a decision asks for another count (`last_scale_at`, the newest such decision, else
    the observed one if it did). `variant_costs`: each variant's cost so far
    (`ModelStatus.variant_costs`), for status.variants."""
    before = _as_list(previous)
    conditions = []
    for condition in evaluate(policy, observation, problems=problems):
        old = before.get(condition.type.value)
        moved = old is None or old.get("status") != condition.status_text
        since = timefmt.rfc3339(now) if moved or old is None else old.get(
            "lastTransitionTime", timefmt.rfc3339(now))
        conditions.append({"type": condition.type.value, "status": condition.status_text,
                           "reason": condition.reason, "message": condition.message,
                           "lastTransitionTime": since})
    out: Status = {}
    if generation is not None:
        out["observedGeneration"] = generation
    if observation is not None:
        decision = observation.decision
        out["currentReplicas"] = observation.cluster.current
        out["desiredReplicas"] = decision.desired
        last_scale = (previous or {}).get("lastScaleTime")
        scaled_at = last_scale_at if last_scale_at is not None else (
            decision.at if decision.changed else None)
        if scaled_at is not None:
            last_scale = timefmt.rfc3339(scaled_at)
        if last_scale is not None:
            out["lastScaleTime"] = last_scale
        winner = next((each for each in decision.signals if each.name == decision.winner),
                      None)
        if decision.winner is not None:
            out["winner"] = {"signal": str(decision.winner)}
            if winner is not None and winner.value is not None:
                out["winner"]["value"] = round(winner.value, 6)
        if observation.variants:
            out["variants"] = variants_status(observation.variants, costs=variant_costs)
    out["conditions"] = conditions
    return out


def variants_status(rows: Sequence[state.VariantObservation], *,
                    costs: Mapping[str, engine_cost.Cost] | None = None
                    ) -> list[dict[str, Any]]:
    """status.variants: each variant's replicas as the CRD's schema names them (no
    desiredReplicas before the fleet's first mix; scaledBy when an HPA owns it), and with
    `costs` (by variant name, `ModelStatus.variant_costs`) its GPU-hours, cost and idle
    cost so far: its scaler_variant_*_total counters at the last evaluation, rounded to
    1e-6 (3.6 GPU-milliseconds) so the status does not carry float noise."""
    out = []
    for row in rows:
        item: dict[str, Any] = {"name": row.name, "target": row.target, "pool": row.pool}
        if row.desired is not None:
            item["desiredReplicas"] = row.desired
        item.update(currentReplicas=row.current, readyReplicas=row.ready,
                    startingReplicas=row.starting)
        if row.owner is not None:
            item["scaledBy"] = row.owner
        if costs is not None:
            spent = costs.get(row.name) or engine_cost.Cost()
            item.update(gpuHours=round(spent.allocated_gpu_hours, 6),
                        cost=round(spent.cost, 6), idleCost=round(spent.idle_cost, 6))
        out.append(item)
    return out


# The status each condition has when all is well: a change away from it is a Warning
# Event, a change back a Normal one.
HEALTHY: Mapping[str, str] = {Type.ABLE_TO_SCALE: "True", Type.SCALING_ACTIVE: "True",
                              Type.SCALING_LIMITED: "False", Type.SIGNALS_FRESH: "True",
                              Type.POLICY_VALID: "True", Type.VARIANTS_SCALED: "True"}


def notes(old: Mapping[str, Any] | None, new: Mapping[str, Any]
          ) -> tuple[tuple[str, str, bool], ...]:
    """Events for the conditions whose status changed: (reason, message, warning). On the
    first status, only what is not well is told (a healthy start is no news)."""
    before = _as_list(old)
    found = []
    for kind, item in _as_list(new).items():
        status = item.get("status")
        previous = before.get(kind)
        if previous is not None and previous.get("status") == status:
            continue
        if status == "Unknown" or (previous is None and status == HEALTHY.get(kind)):
            continue
        found.append((str(item.get("reason")), f"{kind} {status}: {item.get('message')}",
                      status != HEALTHY.get(kind)))
    return tuple(found)


def transitions(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> bool:
    """Whether a condition's status or reason differs: such a change is written at once,
    not at the rate limit."""
    def key(status: Mapping[str, Any] | None) -> dict[str, tuple[Any, Any]]:
        return {kind: (item.get("status"), item.get("reason"))
                for kind, item in _as_list(status).items()}
    return key(old) != key(new)


def fleet_status(problems: Sequence[loader.PolicyError], *, in_force: bool,
                 previous: Mapping[str, Any] | None, generation: int | None, now: float
                 ) -> Status:
    """A GpuPool's or GpuBudget's status: its one condition, Valid, from the load's
    problems (lastTransitionTime kept while the status holds, as above)."""
    if problems:
        collision = any(problem.reason == "duplicate" for problem in problems)
        stays = ("; the last good version stays in force" if in_force
                 else "; nothing of this resource is in force")
        condition = {"type": crd.VALID, "status": "False",
                     "reason": "NameCollision" if collision else "InvalidSpec",
                     "message": "; ".join(str(problem) for problem in problems) + stays}
    else:
        condition = {"type": crd.VALID, "status": "True", "reason": "Valid",
                     "message": "the spec is valid and in force"}
    old = _as_list(previous).get(crd.VALID) or {}
    since = old.get("lastTransitionTime") if old.get("status") == condition["status"] else None
    condition["lastTransitionTime"] = str(since or timefmt.rfc3339(now))
    out: Status = {} if generation is None else {"observedGeneration": generation}
    out["conditions"] = [condition]
    return out
