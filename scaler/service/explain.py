"""A decision as a JSON document (HTTP API, audit log) and in plain words (`scaler explain`)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from scaler.actuators import timefmt
from scaler.service import state as service_state

SNAPSHOT_FIELDS = ("queue_depth", "in_flight", "tokens_per_second", "prompt_tokens_per_second",
                   "p95_latency_s", "arrival_rate")


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
        name: None if value is None else dataclasses.asdict(value)
        for name in SNAPSHOT_FIELDS
        for value in (getattr(observation.snapshot, name),)
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
        },
        "counters": {"decisions": dict(status.decisions), "patches": dict(status.patches)},
    }
    return dict(_json_safe(document))


def _number(value: float | None, unit: str = "") -> str:
    if value is None:
        return "missing"
    text = f"{value:.0f}" if float(value).is_integer() else f"{value:.3g}"
    return f"{text}{unit}"


def _replicas(count: int | None) -> str:
    if count is None:
        return "no recommendation"
    return f"{count} replica" + ("" if count == 1 else "s")


def describe(document: dict[str, Any]) -> str:
    """The decision document in plain words, one fact per line."""
    decision = document["decision"]
    cluster = document["cluster"]
    lines = [f"{document['model']} at {document['time']}: {document['summary']}"]
    verb = {
        "up": f"Scaling up from {decision['current']} to {decision['desired']}.",
        "down": f"Scaling down from {decision['current']} to {decision['desired']}.",
        "hold": f"Keeping {decision['desired']} replicas.",
        "held": f"Holding {decision['desired']} replicas: no fresh signal to decide on, "
                "and missing data never scales down.",
    }[document["outcome"]]
    lines.append(verb)
    lines.append(
        f"Cluster: {cluster['current']} asked for, {cluster['ready']} ready, "
        f"{cluster['starting']} starting."
    )
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
    return "\n".join(lines)
