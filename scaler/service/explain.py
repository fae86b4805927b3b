"""A decision as a JSON document (HTTP API, audit log) and in plain words (`scaler explain`)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from scaler.actuators import base as actuators
from scaler.actuators import timefmt
from scaler.engine import cost as engine_cost
from scaler.engine import decide as engine_decide
from scaler.engine import types as engine_types
from scaler.service import conditions
from scaler.service import history as decision_history
from scaler.service import state as service_state


def _json_safe(value: Any) -> Any:
    """NaN and infinities are not JSON: they become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _json_safe(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(item) for item in value]
    return value


def decision_document(
    status: service_state.ModelStatus, observation: service_state.Observation
) -> dict[str, Any]:
    """Everything about one evaluation: decision with reasons, what it saw, counters."""
    decision = observation.decision
    snapshot = {
        signal.value: None if value is None else dataclasses.asdict(value)
        for signal, value in observation.snapshot.items()
    }
    cluster = observation.cluster
    document = {
        "model": status.key,
        "namespace": status.policy.metadata.namespace,
        "name": status.policy.metadata.name,
        "target": {
            "apiVersion": status.policy.spec.target.api_version,
            "kind": status.policy.spec.target.kind,
            "name": status.policy.spec.target.name,
        },
        "at": observation.at,
        "time": timefmt.rfc3339(observation.at),
        "outcome": service_state.decision_outcome(decision),
        "summary": decision.summary,
        "decision": dataclasses.asdict(decision),
        "snapshot": snapshot,
        "cluster": {
            "current": cluster.current,
            "ready": cluster.ready,
            "starting": len(cluster.starting),
            "free_replica_slots": cluster.free_replica_slots,
            "budget_gpus": cluster.budget_gpus,
            "budget_reason": cluster.budget_reason,
            "excluded_gpus": cluster.excluded_gpus,
            "capacity_notes": list(cluster.capacity_notes),
            "gpu_sm_active": cluster.gpu_sm_active,
        },
        "counters": {"decisions": dict(status.decisions), "patches": dict(status.patches)},
        "conditions": conditions.view(status.policy, observation),
    }
    if observation.variants:
        document["variants"] = [_variant_row(row, status.variant_costs.get(row.name))
                                for row in observation.variants]
    if observation.engine is not None:
        learned = engine_types.Learned.of(observation.engine)
        # A cycle's demand profiles (up to 180 numbers) are the engine's working memory, not
        # something to read: every audit line would carry them. The opinion they give says
        # what the last cycle needed (`cycle` in the signals).
        document["learned"] = {
            **{name: value for name, value in dataclasses.asdict(learned).items()
               if name not in ("cycle_demand", "last_cycle_demand")},
            "resumed_at": None if status.resumed_at is None else timefmt.rfc3339(
                status.resumed_at)}
    return dict(_json_safe(document))


def _learned_line(learned: Mapping[str, Any]) -> str | None:
    """What the engine has learned of the model (only what it has), and whether it was
    resumed from an earlier instance's record."""
    parts = []
    if learned["served_samples"]:
        parts.append(f"saturated replicas serve {learned['served_share']:.0%} of the tokens/s "
                     f"capacity model ({learned['served_samples']} samples)")
    if learned["replicas_per_request_rate"] is not None:
        parts.append(f"one request/s is {learned['replicas_per_request_rate']:.3g} replicas "
                     f"({learned['load_samples']} samples)")
    if learned["pod_start_s"] is not None:
        parts.append(f"a pod starts in {learned['pod_start_s']:.0f} s")
    if learned["node_boot_s"] is not None:
        parts.append(f"a node boots in {learned['node_boot_s']:.0f} s")
    if learned["return_gap_s"] is not None and learned["returns"]:
        # .get: an audit line written before the jitter was kept has none.
        jitter = learned.get("return_jitter_s")
        parts.append(f"load came back {learned['return_gap_s']:.0f} s after a drop "
                     f"({learned['returns']} times in a row"
                     + ("" if jitter is None else f", within {jitter:.0f} s of that") + ")")
    # .get: an audit line written before the learned hold was kept has neither.
    leaves, returns = learned.get("level_leaves") or (), learned.get("level_returns") or ()
    if leaves:
        longest = max((r["after_s"] for r in returns), default=None)
        parts.append(f"levels of the load left {len(leaves)} times"
                     + ("" if longest is None else f" and came back within {longest:.0f} s"))
    # .get: an audit line written before the cycle was kept has none. One interval is no
    # cycle yet (`decide.learned_cycle`): said once drops came that far apart twice in a row.
    cycle, drops = learned.get("drop_cycle_s"), learned.get("drop_cycles") or 0
    if cycle is not None and drops >= engine_decide.RETURN_PATTERN:
        jitter = learned.get("drop_jitter_s")
        parts.append(f"the load fell away every {cycle:.0f} s ({drops} times in a row"
                     + ("" if jitter is None else f", within {jitter:.0f} s of that") + ")")
    if learned["horizon_scale"] < 0.999:
        parts.append(f"{learned['horizon_scale']:.0%} of the trend is trusted")
    if not parts:
        return None
    resumed = learned.get("resumed_at")
    origin = f" (resumed from a record written {resumed})" if resumed else ""
    return "Learned" + origin + ": " + "; ".join(parts) + "."


def _variant_row(row: service_state.VariantObservation, spent: engine_cost.Cost | None
                 ) -> dict[str, Any]:
    """A variant as the evaluation read it, and what it has cost since this instance
    started, under the cost vocabulary's names (DESIGN 1, the simulator's JSON): what its
    scaler_variant_gpu_hours_total, _cost_total and _idle_cost_total counters held at the
    evaluation's time (`state.accrue_variants`; 0 before the second evaluation accrues)."""
    spent = spent or engine_cost.Cost()
    return {**dataclasses.asdict(row), "gpu_hours": spent.allocated_gpu_hours,
            "cost": spent.cost, "idle_cost": spent.idle_cost}


def _number(value: float | None, unit: str = "") -> str:
    if value is None:
        return "missing"
    text = f"{value:.0f}" if float(value).is_integer() else f"{value:.3g}"
    return f"{text}{unit}"


def _replicas(count: int | None) -> str:
    if count is None:
        return "no recommendation"
    return f"{count} replica" + ("" if count == 1 else "s")


# What each rule measures, as a person says it: "demand says 5 (tokens per second)".
_RULE_WORDS: dict[str, str] = {
    engine_types.Rule.CONCURRENCY: "running and waiting requests",
    engine_types.Rule.QUEUE_DEPTH: "the waiting queue",
    engine_types.Rule.TOKENS_PER_SECOND: "tokens per second",
    engine_types.Rule.P95_LATENCY: "the p95 latency guard",
    engine_types.Rule.ARRIVAL_RATE: "the arrival rate",
    engine_types.Rule.FORECAST: "the cold-start look-ahead",
    engine_types.Rule.RETURN: "the load's expected return",
    engine_types.Rule.CYCLE: "what the load's last cycle needed next",
}
# What a clamp did, given the count it left: "the down window holds 6".
_CLAMP_WORDS: dict[str, str] = {
    engine_types.ClampName.BACKLOG: "the backlog rule allows {after}",
    engine_types.ClampName.STABILIZATION_UP: "the up window allows {after}",
    engine_types.ClampName.STABILIZATION_DOWN: "the down window holds {after}",
    engine_types.ClampName.RATE_LIMIT_UP: "the scale-up rate limit allows {after}",
    engine_types.ClampName.RATE_LIMIT_DOWN: "the scale-down rate limit allows {after}",
    engine_types.ClampName.HOLD_STALE: "a stale or missing signal holds {after}",
    engine_types.ClampName.MIN: "the minimum is {after}",
    engine_types.ClampName.WARM_FLOOR: "the warm floor is {after}",
    engine_types.ClampName.MAX: "the maximum is {after}",
    engine_types.ClampName.BUDGET: "the GPU budget allows {after}",
    engine_types.ClampName.EXTERNAL_BUDGET: "the pool or tenant budget allows {after}",
    engine_types.ClampName.UNFINISHED_WORK: "replicas with unfinished work keep {after}",
}


def in_words(decision: Mapping[str, Any]) -> str:
    """A decision as a person says it, for `scaler explain` and the demo's status line.

    `decision` is `dataclasses.asdict(Decision)` or the `decision` of a decision
    document (its JSON form). Example: a hold at 6 whose demand fell to 5 reads
    "Keeping 6 replicas: demand says 5 (tokens per second), the down window holds 6."
    (the engine's one-line `Decision.summary`, for Events and logs, is
    "hold 6->6 (tokens_per_second); stabilization_down: 5->6").
    """
    current, desired = decision["current"], decision["desired"]
    winner, held = decision["winner"], decision["held"]
    if desired > current:
        verb = f"Scaling up from {current} to {desired}"
    elif desired < current:
        verb = f"Scaling down from {current} to {desired}"
    else:
        verb = f"{'Holding' if held and winner is None else 'Keeping'} {_replicas(desired)}"
    if winner is None:
        # No fresh opinion: the engine held the current count (see `decide`, step 3).
        reasons = ["no fresh signal to decide on, and missing data never scales down" if held
                   else "no signal has an opinion, so the count stays"]
    else:
        reasons = [f"demand says {decision['recommendation']} "
                   f"({_RULE_WORDS.get(winner, str(winner))})"]
    reasons.extend(_CLAMP_WORDS.get(clamp["name"], str(clamp["name"]) + " gives {after}")
                   .format(after=clamp["after"]) for clamp in decision["clamps"])
    return f"{verb}: {', '.join(reasons)}."


def _variant_cost(row: Mapping[str, Any]) -> str:
    """'; since start 4 GPU-hours, cost 8, idle cost 0.4' (empty from a server that
    predates the fields): in the policy's currency, as /metrics counts them."""
    if any(row.get(field) is None for field in ("gpu_hours", "cost", "idle_cost")):
        return ""
    return (f"; since start {_number(row['gpu_hours'])} GPU-hours, cost "
            f"{_number(row['cost'])}, idle cost {_number(row['idle_cost'])}")


def _variant_lines(rows: list[dict[str, Any]]) -> list[str]:
    """Each variant's replicas and cost, and a warning per variant an HPA scales instead."""
    if not rows:
        return []
    lines = ["Variants (the cluster line above is their capacity-equivalent sum):"]
    warnings = []
    for row in rows:
        wanted = ("awaiting the fleet's first mix" if row["desired"] is None
                  else f"{row['desired']} desired")
        lines.append(f"  - {row['name']} ({row['target']}, pool {row['pool']}): {wanted}, "
                     f"{row['current']} asked for, {row['ready']} ready, "
                     f"{row['starting']} starting{_variant_cost(row)}")
        if row.get("owner"):
            warnings.append(
                f"Warning: variant {row['name']} ({row['target']}) is scaled by "
                f"{row['owner']}: the scaler does not patch it, and its "
                f"{row['ready'] + row['starting']} ready and starting replicas count in the "
                "mix. Remove the HPA to let the scaler mix it, or the variant to leave it "
                "to the HPA.")
    return lines + warnings


def describe(document: dict[str, Any]) -> str:
    """The decision document in plain words, one fact per line."""
    decision = document["decision"]
    cluster = document["cluster"]
    lines = [f"{document['model']} at {document['time']}: {document['summary']}",
             in_words(decision)]
    lines.append(
        f"Cluster: {cluster['current']} asked for, {cluster['ready']} ready, "
        f"{cluster['starting']} starting."
    )
    for note in cluster.get("capacity_notes") or []:
        lines.append(f"Pool capacity: {note}.")
    learned_line = _learned_line(document["learned"]) if document.get("learned") else None
    if learned_line is not None:
        lines.append(learned_line)
    lines.extend(_variant_lines(document.get("variants") or []))
    lines.append("Signals:")
    if not decision["signals"]:
        lines.append("  (none configured)")
    for signal in decision["signals"]:
        age = "age unknown" if signal["age_s"] is None else f"{signal['age_s']:.1f} s old"
        freshness = "fresh" if signal["fresh"] else "stale or missing, ignored"
        mark = "  <- decides" if signal["name"] == decision["winner"] else ""
        lines.append(
            f"  - {signal['name']}: {_number(signal['value'])} ({age}, {freshness}) -> "
            f"{_replicas(signal['recommendation'])}{mark}"
        )
        if signal["detail"]:
            lines.append(f"      {signal['detail']}")
    forecast = decision.get("forecast")
    if forecast:
        node = ("no free GPU, so a node must boot first" if forecast["needs_node"]
                else "a free GPU is available")
        lines.append(
            f"Look-ahead: a new replica needs {forecast['time_to_ready_s']:.0f} s to be "
            f"ready ({node})."
        )
        lines.append(
            f"  Demand is {forecast['demand_now']:.2f} replicas now, changing "
            f"{forecast['slope_per_s']:+.4f}/s, so {forecast['demand_at_ready']:.2f} when a "
            f"new replica would be ready: {_replicas(forecast['replicas_at_ready'])}."
        )
        if forecast.get("drop_in_s") is not None:  # absent from an older server's document
            lines.append(
                f"  The load falls away in {forecast['drop_in_s']:.0f} s, as it has every "
                "cycle: the trend is extrapolated up to then only."
            )
    if decision["recommendation"] is not None:
        lines.append(f"Recommendation before limits: {_replicas(decision['recommendation'])}.")
    if decision["clamps"]:
        lines.append("Limits applied:")
        for clamp in decision["clamps"]:
            lines.append(
                f"  - {clamp['name']}: {clamp['before']} -> {clamp['after']} ({clamp['detail']})"
            )
    else:
        lines.append("No limit changed the recommendation.")
    for note in decision["notes"]:
        lines.append(f"Note: {note}")
    if decision.get("cut_warning"):  # absent from an older server's document
        lines.append(f"Warning: {decision['cut_warning']}.")
    steps = decision.get("steps") or []
    if steps:
        lines.append("Steps:")
        for step in steps:
            count = "-" if step["replicas"] is None else str(step["replicas"])
            lines.append(f"  {step['name']:<11} {count:>4}  {step['detail']}")
    if document.get("conditions"):
        lines.append("Conditions (as on a ScalePolicy resource's status):")
        for item in document["conditions"]:
            lines.append(f"  {item['type']:<15} {item['status']:<7} {item['reason']}: "
                         f"{item['message']}")
    return "\n".join(lines)


# -- history: `scaler explain --history N`, GET /v1/models/.../history --------------------

# What became of a decided change, after its words: only outcomes that are not "done".
_OUTCOME_WORDS: dict[str, str] = {
    actuators.Outcome.DRY_RUN: "Dry run: not patched.",
    actuators.Outcome.NOT_LEADER: "Not the leader: the leader patches.",
    actuators.Outcome.CONFLICT: "The patch conflicted: {reason}.",
    actuators.Outcome.FAILED: "The patch failed: {reason}.",
    actuators.Outcome.SKIPPED_HPA_OWNED: "Not patched: {reason}.",
}


def event_message(event: Mapping[str, Any]) -> str:
    """An event's message: the decision in words (winner, clamps, count change), then what
    became of its patch when it was not simply applied."""
    words = in_words(event)
    note = _OUTCOME_WORDS.get(event.get("outcome") or "")
    if note is None:
        return words
    return f"{words} {note.format(reason=event.get('apply_reason') or 'no reason given')}"


def history_document(key: str, entries: list[decision_history.Entry], *, now: float,
                     kept: int) -> dict[str, Any]:
    """A model's history as JSON, oldest first: `entries` shown of `kept` in memory, times
    as epoch seconds and RFC 3339, ages measured from `now`."""
    events = []
    for entry in entries:
        event = {"type": str(entry.event.type), **dataclasses.asdict(entry.event),
                 "first_at": entry.first_at, "last_at": entry.last_at,
                 "first_time": timefmt.rfc3339(entry.first_at),
                 "last_time": timefmt.rfc3339(entry.last_at), "count": entry.count}
        event["reason"] = str(entry.event.reason)
        event["message"] = event_message(event)
        events.append(event)
    document = {"model": key, "now": now, "time": timefmt.rfc3339(now), "kept": kept,
                "events": events}
    return dict(_json_safe(document))


def age(seconds: float) -> str:
    """A duration as kubectl prints ages: 45s, 4m30s, 45m, 3h20m, 30h, 3d4h, 45d, 2y.

    The unit coarsens as the age grows, since 3h20m12s says nothing 3 h 20 min does not.
    """
    total = max(0, int(seconds))
    minutes, hours, days = total // 60, total // 3600, total // 86400

    def two(big: int, unit: str, small: int, small_unit: str) -> str:
        return f"{big}{unit}" + (f"{small}{small_unit}" if small else "")

    if total < 120:
        return f"{total}s"
    if total < 600:
        return two(minutes, "m", total % 60, "s")
    if total < 3 * 3600:
        return f"{minutes}m"
    if total < 8 * 3600:
        return two(hours, "h", minutes % 60, "m")
    if total < 48 * 3600:
        return f"{hours}h"
    if total < 8 * 86400:
        return two(days, "d", hours % 24, "h")
    if total < 2 * 365 * 86400:
        return f"{days}d"
    return f"{days // 365}y"


def events_table(document: Mapping[str, Any]) -> str:
    """A history document as `kubectl describe` prints Events: Type, Reason, Age, Message.

    A repeated event reads "2m (x14 over 9m)": last seen 2 min ago, 14 times in 9 min.
    """
    events = document["events"]
    if not events:
        return "Events:  <none>"
    now = document["now"]
    rows = [("Type", "Reason", "Age", "Message"), ("----", "------", "---", "-------")]
    for event in events:
        when = age(now - event["last_at"])
        if event["count"] > 1:
            when += f" (x{event['count']} over {age(event['last_at'] - event['first_at'])})"
        rows.append((event["type"], event["reason"], when, event["message"]))
    widths = [max(len(row[column]) for row in rows) for column in range(3)]
    shown = f"{len(events)} of {document['kept']}" if document["kept"] > len(events) else "all"
    lines = [f"Events ({shown} kept, newest last, ages at {document['time']}):"]
    lines.extend("  " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths,
                                                                        strict=False))
                 + "  " + row[3] for row in rows)
    return "\n".join(lines)
