"""The DESIGN 4.2 message contract: parse tables and fuzzing (never raises, always counts)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scaler.core import histogram, vocabulary
from scaler.signals import messages, samples

Signal = vocabulary.Signal

NOW = 1_764_410_000.0

DESIGN_EXAMPLE = {
    "v": 1, "model": "llama-70b", "namespace": "inference", "source": "llama-70b-7d9f-abc12",
    "ts": NOW - 0.75, "queue_depth": 12, "in_flight": 30, "tokens_per_second": 2400.5,
    "latency": {"metric": "ttft", "p95_seconds": 1.8,
                "histogram": {"le": [0.1, 0.25, 0.5, 1, 2.5, 5, 10],
                              "counts": [3, 10, 40, 80, 95, 99, 100]}},
    "ready": True,
}


def body(**fields: object) -> bytes:
    message: dict[str, object] = {"v": 1, "model": "m", "ts": NOW}
    message.update(fields)
    return json.dumps(message).encode()


def test_prompt_tokens_per_second_is_an_optional_extension() -> None:
    result = messages.parse(body(prompt_tokens_per_second=51200.0, source="pod-a"), now=NOW)
    assert isinstance(result, tuple)
    (sample,) = result
    assert (sample.signal, sample.value) == ("prompt_tokens_per_second", 51200.0)
    assert messages.parse(body(prompt_tokens_per_second=-1), now=NOW).reason == "schema"
    encoded = messages.encode(model="m", ts=NOW,
                              values={Signal.PROMPT_TOKENS_PER_SECOND: 3.5})
    assert json.loads(encoded)["prompt_tokens_per_second"] == 3.5


def test_kv_cache_usage_is_an_optional_fraction() -> None:
    result = messages.parse(body(kv_cache_usage=0.85, source="pod-a"), now=NOW)
    assert isinstance(result, tuple)
    (sample,) = result
    assert (sample.signal, sample.value) == ("kv_cache_usage", 0.85)
    # A share above the whole cache is no reading: dropped as implausible, and counted.
    dropped = messages.parse(body(kv_cache_usage=3.0), now=NOW)
    assert isinstance(dropped, messages.Drop) and dropped.reason == "implausible"
    assert messages.parse(body(kv_cache_usage=-0.1), now=NOW).reason == "schema"
    encoded = messages.encode(model="m", ts=NOW, values={Signal.KV_CACHE_USAGE: 0.5})
    assert json.loads(encoded)["kv_cache_usage"] == 0.5


def test_design_example_becomes_four_samples() -> None:
    result = messages.parse(json.dumps(DESIGN_EXAMPLE).encode(), now=NOW)
    assert isinstance(result, tuple)
    by_signal = {s.signal: s for s in result}
    assert set(by_signal) == {"queue_depth", "in_flight", "tokens_per_second", "p95_latency"}
    assert {s.model for s in result} == {"inference/llama-70b"}
    assert {s.source for s in result} == {"nats/llama-70b-7d9f-abc12"}
    assert by_signal["queue_depth"].value == 12
    assert by_signal["tokens_per_second"].value == 2400.5
    assert by_signal["queue_depth"].ts == NOW - 0.75
    latency = by_signal["p95_latency"]
    assert latency.value == 1.8 and latency.metric is vocabulary.LatencyMetric.TTFT
    assert latency.histogram == histogram.Histogram(
        le=(0.1, 0.25, 0.5, 1, 2.5, 5, 10), counts=(3, 10, 40, 80, 95, 99, 100)
    )


def test_minimal_message_is_accepted_with_no_samples() -> None:
    assert messages.parse(body(), now=NOW) == ()


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "malformed_json"),
        (b"{", "malformed_json"),
        (b"\xff\xfe", "malformed_json"),
        (b"[]", "schema"),
        (b"42", "schema"),
        (b'{"v": 1, "model": "m"}', "schema"),  # no ts
        (body(v=2), "schema"),
        (body(model=""), "schema"),
        (body(model="a b"), "schema"),
        (body(queue_depth=-1), "schema"),
        (body(queue_depth="many"), "schema"),
        (body(ts="yesterday"), "schema"),
        (b'{"v": 1, "model": "m", "ts": 1e999}', "schema"),  # Infinity
        (body(latency={"metric": "ttfb"}), "schema"),
        (body(latency={"histogram": {"le": [1, 2], "counts": [1]}}), "schema"),
        (body(latency={"histogram": {"le": [2, 1], "counts": [1, 2]}}), "schema"),
        (body(latency={"histogram": {"le": [1, 2], "counts": [5, 2]}}), "schema"),
        (body(ts=NOW + 60), "future_dated"),
        (body(ts=NOW - 3600), "stale"),
        (body(pad="x" * 70_000), "oversized"),
    ],
)
def test_drops_have_reasons(data: bytes, reason: str) -> None:
    result = messages.parse(data, now=NOW)
    assert isinstance(result, messages.Drop)
    assert result.reason == reason


def test_small_clock_skew_is_accepted_and_clamped_to_now() -> None:
    result = messages.parse(body(ts=NOW + 2, queue_depth=1), now=NOW)
    assert isinstance(result, tuple)
    assert result[0].ts == NOW


def test_limits_are_configurable() -> None:
    limits = messages.Limits(max_bytes=100, max_future_s=0.0, max_age_s=1.0)
    data = body(pad="x" * 100)
    assert messages.parse(data, now=NOW, limits=limits) == messages.Drop(
        "oversized", f"{len(data)} bytes > 100"
    )
    result = messages.parse(body(ts=NOW - 2), now=NOW, limits=limits)
    assert isinstance(result, messages.Drop) and result.reason == "stale"


@pytest.mark.parametrize(
    ("fields", "route", "outcome"),
    [
        ({}, messages.Route(expected="default/m"), "default/m"),
        ({"namespace": "inf"}, messages.Route(expected="inf/m"), "inf/m"),
        ({}, messages.Route(expected="inf/m", default_namespace="inf"), "inf/m"),
        ({"namespace": "other"}, messages.Route(expected="inf/m"), "subject_mismatch"),
        ({"model": "n"}, messages.Route(expected="default/m"), "subject_mismatch"),
        ({}, messages.Route(models={"default/m": 30.0}), "default/m"),
        ({}, messages.Route(models={"inf/m": 30.0}), "unknown_model"),
    ],
)
def test_routing(fields: dict[str, object], route: messages.Route, outcome: str) -> None:
    result = messages.parse(body(queue_depth=1, **fields), now=NOW, route=route)
    if isinstance(result, messages.Drop):
        assert result.reason == outcome
    else:
        assert [s.model for s in result] == [outcome]


def test_parse_item_checks_the_same_rules() -> None:
    item = dict(DESIGN_EXAMPLE)
    result = messages.parse_item(item, now=NOW)
    assert isinstance(result, tuple) and len(result) == 4
    assert result[0].source == "http/llama-70b-7d9f-abc12"
    assert messages.parse_item({"v": 1}, now=NOW) == messages.Drop(
        "schema", "model: Field required"
    )
    oversized = messages.parse_item({"v": 1, "model": "m", "ts": NOW, "p": "x" * 70_000}, now=NOW)
    assert isinstance(oversized, messages.Drop) and oversized.reason == "oversized"


def test_tally_counts_every_outcome_once() -> None:
    stats = samples.SourceStats()
    assert messages.tally(stats, messages.parse(body(queue_depth=3), now=NOW))
    assert messages.tally(stats, messages.parse(b"nope", now=NOW)) == ()
    assert stats.accepted == 1
    assert stats.dropped == {"malformed_json": 1}


def test_a_policys_stale_limit_decides_the_max_age_not_a_fixed_30_s() -> None:
    # staleAfterSeconds 120: a message 60 s old is still evidence; 30 s limit: stale.
    old = body(queue_depth=1, ts=NOW - 60)
    patient = messages.parse(old, now=NOW, route=messages.Route(models={"default/m": 120.0}))
    assert isinstance(patient, tuple) and len(patient) == 1
    strict = messages.parse(old, now=NOW, route=messages.Route(models={"default/m": 30.0}))
    assert isinstance(strict, messages.Drop) and strict.reason == "stale"


def test_encode_round_trips() -> None:
    data = messages.encode(model="m", ts=NOW, namespace="inf", source="p",
                           values={Signal.QUEUE_DEPTH: 2})
    result = messages.parse(data, now=NOW)
    assert result == (samples.Sample("inf/m", Signal.QUEUE_DEPTH, "nats/p", NOW, 2.0),)
    latency = histogram.Histogram(le=(0.5, 1.0), counts=(3, 4))
    data = messages.encode(model="m", ts=NOW, latency_metric=vocabulary.LatencyMetric.E2E,
                           p95_seconds=0.9, latency_histogram=latency)
    result = messages.parse(data, now=NOW)
    assert result == (samples.Sample("default/m", Signal.P95_LATENCY, "nats/anonymous", NOW,
                                     0.9, latency, metric=vocabulary.LatencyMetric.E2E),)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: st.lists(children, max_size=5)
    | st.dictionaries(st.text(max_size=12), children, max_size=6),
    max_leaves=30,
)
# Messages that are close to valid: right keys, values of any JSON type.
near_valid = st.fixed_dictionaries(
    {"v": st.sampled_from([1, 2, "1"]), "model": st.text(max_size=20) | st.just("m"),
     "ts": st.floats() | st.just(NOW) | st.text(max_size=5)},
    optional={
        "namespace": st.text(max_size=10) | json_values,
        "queue_depth": st.floats() | st.integers() | json_values,
        "in_flight": st.floats() | json_values,
        "tokens_per_second": st.floats() | json_values,
        "latency": st.fixed_dictionaries(
            {},
            optional={
                "metric": st.sampled_from(["ttft", "e2e", "itl", "x"]),
                "p95_seconds": st.floats(),
                "histogram": st.fixed_dictionaries(
                    {"le": st.lists(st.floats(), max_size=6),
                     "counts": st.lists(st.floats(), max_size=6)}
                ),
            },
        ) | json_values,
    },
)


def _check_counted(data: bytes) -> None:
    stats = samples.SourceStats()
    result = messages.parse(data, now=NOW)
    accepted = messages.tally(stats, result)
    assert stats.accepted + stats.dropped_total == 1
    if isinstance(result, messages.Drop):
        assert result.reason in set(messages.DropReason)
        assert accepted == ()
    for sample in accepted:
        assert sample.value is None or sample.value >= 0
        assert sample.ts <= NOW


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2048))
def test_fuzz_random_bytes(data: bytes) -> None:
    _check_counted(data)


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_fuzz_random_json(value: object) -> None:
    _check_counted(json.dumps(value).encode())


@settings(max_examples=500, deadline=None)
@given(near_valid)
def test_fuzz_near_valid_messages(value: dict[str, object]) -> None:
    _check_counted(json.dumps(value).encode())
    # The same item through the HTTP path: never raises, same reasons.
    result = messages.parse_item(value, now=NOW)
    assert isinstance(result, tuple) or result.reason in set(messages.DropReason)
