"""The README's worked example, read from the README and computed by the engine.

The inputs and every stated result are parsed out of the README's text, so a change to
the engine that the README does not follow (or an edit to the README that the engine
does not bear out) fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

from scaler.engine import decide as engine_decide
from scaler.engine import types
from scaler.policy import loader
from tests.engine.helpers import MONDAY_0600_UTC, value

REPO = Path(__file__).resolve().parents[2]
SATURDAY_NOON_UTC = MONDAY_0600_UTC + 5 * 86400 + 6 * 3600   # no business-hours floor


def _example() -> str:
    text = (REPO / "README.md").read_text()
    start = text.index("**Worked example**")
    return " ".join(text[start:text.index("\n## ", start)].split())


def _number(pattern: str, text: str) -> float:
    found = re.search(pattern, text)
    assert found is not None, f"README worked example no longer says {pattern!r}"
    return float(found.group(1).replace(",", ""))


def test_worked_example() -> None:
    text = _example()
    policy_file = re.search(r"`(config/[\w.-]+\.yaml)`", text)
    assert policy_file is not None
    (policy,) = loader.load_paths([REPO / policy_file.group(1)]).policies
    running = _number(r"Signals: ([\d,]+) running", text)
    waiting = _number(r"([\d,]+) waiting, [\d,]+ generated", text)
    generated = _number(r"Signals: .*?([\d,]+) generated and", text)
    prompt = _number(r"Signals: .*?generated and ([\d,]+) prompt tokens/s", text)
    kv = _number(r"(\d+) % of the KV cache used", text) / 100
    p95 = _number(r"TTFT p95 ([\d.]+) s", text)
    slope = _number(r"risen ([\d.]+) replicas/s", text)
    ready = int(_number(r"(\d+) replicas ready", text))

    now = SATURDAY_NOON_UTC
    level = _number(r"forecast `([\d.]+) \+", text)  # demand now, the trend's level
    history = tuple(types.DemandSample(at=now - s, demand=level - slope * s)
                    for s in range(120, 0, -5))
    state = types.EngineState(demand=history, last_desired=ready, recommendations=(
        types.Recommendation(at=now - 5, replicas=ready),))
    snapshot = types.SignalSnapshot(
        in_flight=value(running), queue_depth=value(waiting),
        tokens_per_second=value(generated), prompt_tokens_per_second=value(prompt),
        kv_cache_usage=value(kv), p95_latency=value(p95))
    cluster = types.ClusterState(current=ready, ready=ready, free_replica_slots=8)
    decision, state = engine_decide.decide(policy, snapshot=snapshot, cluster=cluster,
                                           state=state, now=now)
    recs = {s.name: s.recommendation for s in decision.signals}
    assert recs == {
        "concurrency": _number(r"concurrency `\([\d ,+]+\) / \d+ = (\d+)`", text),
        "queue_depth": _number(r"so `\d+ / \d+ = (\d+)`", text),
        "tokens_per_second": _number(r"= [\d.]+ -> (\d+)`; KV cache", text),
        "kv_cache": _number(r"KV cache `\d+ x [\d.]+ / [\d.]+ = [\d.]+ -> (\d+)`", text),
        "p95_latency": None,
    }
    assert "within the SLO: no opinion" in text
    forecast = decision.forecast
    assert forecast is not None
    assert forecast.time_to_ready_s == _number(r"= (\d+) s`; forecast", text)
    assert round(forecast.demand_at_ready, 2) == _number(r"x \d+ = ([\d.]+) ->", text)
    assert forecast.replicas_at_ready == _number(r"x \d+ = [\d.]+ -> (\d+)`", text)
    winner = re.search(r"recommendation `max\([\d, ]+\) = (\d+)`, won by the (\w+)", text)
    assert winner is not None
    assert (decision.recommendation, decision.winner) == (int(winner.group(1)),
                                                         winner.group(2))
    decided = re.search(r"so the decision is (\d+) -> (\d+)", text)
    assert decided is not None
    assert (decision.current, decision.desired) == tuple(int(g) for g in decided.groups())

    # The queue drains and concurrency falls: the down window, then the down policy.
    down_window = _number(r"for the (\d+) s down window", text)
    steps = re.search(r"does: ((?:\d+ -> )+\d+)", text)
    assert steps is not None
    expected = [int(n) for n in steps.group(1).split(" -> ")]
    quiet = types.SignalSnapshot(
        in_flight=value(90), queue_depth=value(0), tokens_per_second=value(2000),
        prompt_tokens_per_second=value(20000), kv_cache_usage=value(0.2),
        p95_latency=value(0.5))
    current, seen = decision.desired, [decision.desired]
    for t in range(10, 900, 10):
        decision, state = engine_decide.decide(
            policy, snapshot=quiet, cluster=types.ClusterState(current=current, ready=current),
            state=state, now=now + t)
        if decision.desired != current:
            seen.append(decision.desired)
            assert t >= down_window
        current = decision.desired
    assert seen == expected
