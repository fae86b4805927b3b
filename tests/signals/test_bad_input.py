"""Hostile and broken signal input, in one table: add a row for every new case.

Each row is a message body (and the subject it arrived on) with the drop reason the
parser must give. Nothing here may raise, and nothing refused may reach the store.
"""

from __future__ import annotations

import json

import pytest

from scaler.signals import messages, nats_core

NOW = 1_764_410_000.0
KEY = "inference/llama-8b"
SUBJECT = "scaler.signals.inference.llama-8b"
CONFIG = nats_core.NatsCoreConfig(routes={SUBJECT: KEY}, stale_after={KEY: 30.0},
                                  wildcard=True)


def body(**fields: object) -> bytes:
    message: dict[str, object] = {"v": 1, "model": "llama-8b", "namespace": "inference",
                                  "ts": NOW, "source": "pod-a"}
    message.update(fields)
    return json.dumps(message).encode()


# (case, subject, raw bytes, drop reason)
BAD_INPUT: list[tuple[str, str, bytes, str]] = [
    ("a boolean is not a count", SUBJECT, body(in_flight=True), "schema"),
    ("a string is not a number", SUBJECT, body(queue_depth="12"), "schema"),
    ("a boolean is not a version", SUBJECT, body(v=True), "schema"),
    ("version 2 is not understood", SUBJECT, body(v=2), "schema"),
    ("negative counts do not exist", SUBJECT, body(queue_depth=-1), "schema"),
    ("NaN is not a value", SUBJECT, b'{"v":1,"model":"llama-8b","namespace":"inference",'
     b'"ts":1764410000.0,"in_flight":NaN}', "schema"),
    ("infinity is not a value", SUBJECT, b'{"v":1,"model":"llama-8b","namespace":"inference",'
     b'"ts":1764410000.0,"tokens_per_second":Infinity}', "schema"),
    ("1e300 in flight would freeze the trend fit", SUBJECT, body(in_flight=1e300),
     "implausible"),
    ("1e12 in flight would pin the model at max", SUBJECT, body(in_flight=1e12),
     "implausible"),
    ("a p95 of 30 years", SUBJECT, body(latency={"metric": "ttft", "p95_seconds": 1e9}),
     "implausible"),
    ("histogram bounds must increase", SUBJECT,
     body(latency={"histogram": {"le": [1, 0.5], "counts": [1, 2]}}), "schema"),
    ("histogram counts must be cumulative", SUBJECT,
     body(latency={"histogram": {"le": [0.5, 1], "counts": [5, 2]}}), "schema"),
    ("an unknown latency metric", SUBJECT, body(latency={"metric": "x", "p95_seconds": 1}),
     "schema"),
    ("not JSON", SUBJECT, b"{not json", "malformed_json"),
    ("bigger than the contract's 64 KiB", SUBJECT, body(pad="x" * 70_000), "oversized"),
    ("from the future", SUBJECT, body(ts=NOW + 600), "future_dated"),
    ("older than the model's stale limit", SUBJECT, body(ts=NOW - 31), "stale"),
    ("a body naming another model than its subject", SUBJECT, body(model="llama-70b"),
     "subject_mismatch"),
    ("extra subject tokens reach no model", SUBJECT + ".extra", body(), "subject_mismatch"),
    ("a model without a policy", "scaler.signals.inference.other", body(model="other"),
     "unknown_model"),
]


def parse_on(subject: str, data: bytes) -> messages.ParseResult:
    """What the NATS source does with a message: route by subject, then parse."""
    route = nats_core.route_for(subject, CONFIG)
    if isinstance(route, messages.Drop):
        return route
    return messages.parse(data, now=NOW, limits=CONFIG.limits, route=route)


@pytest.mark.parametrize(("case", "subject", "data", "reason"), BAD_INPUT,
                         ids=[row[0] for row in BAD_INPUT])
def test_bad_input_is_dropped_with_its_reason(case: str, subject: str, data: bytes,
                                              reason: str) -> None:
    result = parse_on(subject, data)
    assert isinstance(result, messages.Drop), case
    assert result.reason == reason, (case, result.detail)


def test_the_same_body_is_accepted_when_well_formed() -> None:
    # The table's rows fail for the reason they name, not because the base body is bad.
    result = parse_on(SUBJECT, body(in_flight=3, queue_depth=1))
    assert isinstance(result, tuple) and {s.model for s in result} == {KEY}
