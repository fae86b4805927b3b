"""The signal store: sums over fresh sources, TTL, merged histograms, source caps, listeners."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scaler.core import histogram as hist
from scaler.core import vocabulary
from scaler.engine import types
from scaler.signals import messages, samples, store

T0 = 1_764_410_000.0
KEY = "inference/llama-70b"


Signal = vocabulary.Signal
TTFT = vocabulary.LatencyMetric.TTFT


def sample(
    signal: str,
    value: float | None,
    *,
    source: str = "pod-a",
    ts: float = T0,
    histogram: hist.Histogram | None = None,
    model: str = KEY,
) -> samples.Sample:
    """'queue_depth', or 'latency.<metric>' for the p95 of a latency metric."""
    name, _, metric = signal.partition("latency.")
    if metric:
        return samples.Sample(model, Signal.P95_LATENCY, source, ts, value, histogram,
                              metric=vocabulary.LatencyMetric(metric))
    return samples.Sample(model, Signal(name), source, ts, value, histogram)


def fresh(value: float, age_s: float, sources: int = 1) -> types.SignalValue:
    return types.SignalValue(value=value, age_s=age_s, fresh=True, sources=sources)


# --- histograms -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("le", "counts", "q", "expected"),
    [
        # rank 95 of 100 lies in (1, 2.5] holding 20, 15 of them below: 1 + 1.5 * 15/20.
        ((0.5, 1, 2.5), (40, 80, 100), 0.95, 2.125),
        # rank 50 is past the first bucket's 40: (0.5, 1] holds 40, 10 of them below
        # the rank: 0.5 + 0.5 * 10/40.
        ((0.5, 1, 2.5), (40, 80, 100), 0.5, 0.625),
        ((0.5, 1, 2.5), (40, 80, 100), 0.2, 0.25),  # first bucket starts at 0
        ((1, 2), (0, 10), 0.95, 1.95),  # empty first bucket
        ((1, 2), (10, 10), 0.99, 0.99),  # nothing above 1
        ((0.1, 0.25, 0.5, 1, 2.5, 5, 10), (3, 10, 40, 80, 95, 99, 100), 0.95, 2.5),
    ],
)
def test_quantile_interpolates_like_histogram_quantile(
    le: tuple[float, ...], counts: tuple[float, ...], q: float, expected: float
) -> None:
    quantile = hist.Histogram(le=le, counts=counts).quantile(q)
    assert quantile == pytest.approx(expected)


def test_empty_histogram_has_no_quantile() -> None:
    assert hist.Histogram(le=(1, 2), counts=(0, 0)).quantile(0.95) is None


def test_merge_with_identical_bounds_sums_counts() -> None:
    a = hist.Histogram(le=(1, 2, 4), counts=(10, 20, 30))
    b = hist.Histogram(le=(1, 2, 4), counts=(0, 5, 10))
    assert hist.merge_histograms([a, b]) == hist.Histogram(le=(1, 2, 4), counts=(10, 25, 40))


def test_merge_with_different_bounds_uses_the_union() -> None:
    a = hist.Histogram(le=(1, 2), counts=(10, 20))
    b = hist.Histogram(le=(2, 4), counts=(4, 8))
    # b at 1 s: 4 * (1 - 0)/(2 - 0) = 2; a above its last bound stays at 20.
    assert hist.merge_histograms([a, b]) == hist.Histogram(le=(1, 2, 4), counts=(12, 24, 28))


def test_merged_p95_is_not_the_average_of_p95s() -> None:
    # A fast replica with 900 requests under 0.1 s and a slow one with 100 around 4 s.
    fast = hist.Histogram(le=(0.1, 1, 5), counts=(900, 900, 900))
    slow = hist.Histogram(le=(0.1, 1, 5), counts=(0, 0, 100))
    merged = hist.merge_histograms([fast, slow])
    assert merged is not None
    # rank 950 of 1000 lies in (1, 5] holding 100, 50 of them below: 1 + 4 * 50/100 = 3.
    assert merged.quantile(0.95) == pytest.approx(3.0)
    average_of_p95s = ((fast.quantile(0.95) or 0) + (slow.quantile(0.95) or 0)) / 2
    # (0.095 + 4.8) / 2: averaging says 2.45 s where the true p95 is 3 s.
    assert average_of_p95s == pytest.approx(2.4475)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.lists(st.integers(min_value=0, max_value=50), min_size=3, max_size=3),
        min_size=1,
        max_size=4,
    ),
    st.floats(min_value=0.01, max_value=0.99),
)
def test_merge_preserves_totals_and_orders_quantiles(
    increments: list[list[int]], q: float
) -> None:
    # Each replica: non-negative per-bucket increments made cumulative, shared bounds.
    histograms = []
    for steps in increments:
        cumulative = [float(sum(steps[: i + 1])) for i in range(3)]
        histograms.append(hist.Histogram(le=(0.5, 1.0, 2.0), counts=tuple(cumulative)))
    merged = hist.merge_histograms(histograms)
    assert merged is not None
    assert merged.total == sum(h.total for h in histograms)
    value = merged.quantile(q)
    if merged.total == 0:
        assert value is None
    else:
        assert value is not None and 0 <= value <= 2.0
        # The merged quantile lies between the replicas' quantiles.
        own = [h.quantile(q) for h in histograms if h.total > 0]
        assert min(v for v in own if v is not None) - 1e-9 <= value
        assert value <= max(v for v in own if v is not None) + 1e-9


# --- combining ------------------------------------------------------------------------


def test_counts_are_summed_over_fresh_sources() -> None:
    signal_store = store.SignalStore()
    signal_store.put(
        [
            sample("queue_depth", 4, source="pod-a", ts=T0),
            sample("queue_depth", 6, source="pod-b", ts=T0 - 10),
            sample("queue_depth", 100, source="pod-c", ts=T0 - 45),  # stale at 30 s
        ]
    )
    value = signal_store.value(KEY, Signal("queue_depth"), now=T0 + 1, stale_after_s=30)
    assert value == fresh(10.0, 1.0, sources=2)


def test_a_source_reporting_again_replaces_its_value() -> None:
    signal_store = store.SignalStore()
    signal_store.put([sample("in_flight", 4, ts=T0)])
    signal_store.put([sample("in_flight", 7, ts=T0 + 1)])
    signal_store.put([sample("in_flight", 1, ts=T0 + 0.5)])  # late, out of order: ignored
    value = signal_store.value(KEY, Signal("in_flight"), now=T0 + 1, stale_after_s=30)
    assert value is not None and value.value == 7


def test_all_stale_reports_the_last_value_with_its_age() -> None:
    signal_store = store.SignalStore()
    signal_store.put([sample("queue_depth", 4, ts=T0), sample("queue_depth", 2, source="b",
                                                             ts=T0 - 5)])
    value = signal_store.value(KEY, Signal("queue_depth"), now=T0 + 40, stale_after_s=30)
    # Nothing is fresh; the engine sees 6 aged 40 s (> 30: stale, hold), not "missing".
    assert value == types.SignalValue(value=6.0, age_s=40.0, fresh=False, sources=2)


def test_values_expire_after_the_ttl() -> None:
    signal_store = store.SignalStore(limits=store.StoreLimits(ttl_s=60))
    signal_store.put([sample("queue_depth", 4, ts=T0)])
    assert signal_store.value(KEY, Signal("queue_depth"), now=T0 + 59, stale_after_s=30) is not None
    assert signal_store.value(KEY, Signal("queue_depth"), now=T0 + 61, stale_after_s=30) is None
    signal_store.expire(T0 + 700)
    assert signal_store.models() == ()


def test_missing_sample_forgets_the_sources_value() -> None:
    signal_store = store.SignalStore()
    signal_store.put([sample("queue_depth", 9, source="prometheus")])
    signal_store.put([sample("queue_depth", None, source="prometheus", ts=T0 + 1)])
    assert signal_store.value(KEY, Signal("queue_depth"), now=T0 + 1, stale_after_s=30) is None


def test_latency_merges_histograms_and_guards_with_p95_only_sources() -> None:
    signal_store = store.SignalStore()
    fast = hist.Histogram(le=(0.1, 1, 5), counts=(900, 900, 900))
    slow = hist.Histogram(le=(0.1, 1, 5), counts=(0, 0, 100))
    signal_store.put(
        [
            sample("latency.ttft", 0.09, source="a", histogram=fast),
            sample("latency.ttft", 4.2, source="b", histogram=slow),
        ]
    )
    value = signal_store.value(KEY, Signal.P95_LATENCY, metric=TTFT, now=T0, stale_after_s=30)
    assert value is not None and value.value == pytest.approx(3.0) and value.sources == 2
    # A source that sends only a p95 counts by max: 3.5 > 3.0.
    signal_store.put([sample("latency.ttft", 3.5, source="c")])
    value = signal_store.value(KEY, Signal.P95_LATENCY, metric=TTFT, now=T0, stale_after_s=30)
    assert value is not None and value.value == pytest.approx(3.5) and value.sources == 3


def test_gauges_are_averaged() -> None:
    combined = store.combine(
        Signal.KV_CACHE_USAGE,
        [sample("kv_cache_usage", 0.2), sample("kv_cache_usage", 0.6, source="b")],
        now=T0, stale_after_s=30,
    )
    assert combined is not None and combined.value == pytest.approx(0.4)


def test_snapshot_maps_signals_for_the_engine() -> None:
    signal_store = store.SignalStore()
    histogram = hist.Histogram(le=(0.5, 1, 2.5), counts=(40, 80, 100))
    signal_store.put(
        [
            sample("queue_depth", 3, ts=T0 - 2),
            sample("in_flight", 5, ts=T0 - 1),
            sample("tokens_per_second", 1200.0),
            sample("prompt_tokens_per_second", 9000.0),
            sample("prompt_tokens_per_second", 1000.0, source="nats/pod-b"),
            sample("latency.e2e", None, histogram=histogram),
            sample("latency.ttft", 9.0),
            sample("arrival_rate", 7.5, source="jetstream/S/c"),
        ]
    )
    snapshot = signal_store.snapshot(KEY, now=T0, stale_after_s=30,
                                     latency_metric=vocabulary.LatencyMetric.E2E)
    assert snapshot == types.SignalSnapshot(
        queue_depth=fresh(3.0, 2.0),
        in_flight=fresh(5.0, 1.0),
        tokens_per_second=fresh(1200.0, 0.0),
        prompt_tokens_per_second=fresh(10000.0, 0.0, sources=2),
        p95_latency=types.SignalValue(2.125, 0.0, fresh=True, histogram=histogram),
        arrival_rate=fresh(7.5, 0.0),
    )
    assert store.SignalStore().snapshot("x/y", now=T0, stale_after_s=30) == (
        types.SignalSnapshot()
    )


def test_the_snapshot_keeps_a_shared_queue_apart_from_the_replicas_own() -> None:
    # A JetStream consumer's pending messages are one queue every replica takes from; a
    # replica's own waiting requests are not, and a message naming itself 'jetstream/...'
    # is still a NATS source. Stale sources count in neither.
    signal_store = store.SignalStore()
    signal_store.put([
        sample("queue_depth", 3, source="nats/pod-a"),
        sample("queue_depth", 40, source="jetstream/REQUESTS/workers", ts=T0 - 2),
        sample("queue_depth", 7, source="nats/jetstream/REQUESTS/workers"),
        sample("queue_depth", 500, source="jetstream/OLD/workers", ts=T0 - 45),
    ])
    snapshot = signal_store.snapshot(KEY, now=T0, stale_after_s=30)
    assert snapshot.queue_depth == fresh(50.0, 0.0, sources=3)
    assert snapshot.shared_waiting == fresh(40.0, 2.0)
    signal_store.put([sample("queue_depth", None, source="jetstream/REQUESTS/workers")])
    assert signal_store.snapshot(KEY, now=T0, stale_after_s=30).shared_waiting is None


def test_a_policy_names_the_message_sources_whose_queue_is_shared() -> None:
    # A gateway that holds requests until a replica is free publishes one queue every
    # replica takes from; named in `sharedQueueSources`, over NATS or HTTP alike, it is
    # the shared part of queue_depth. Not named, it is one more replica's own queue.
    signal_store = store.SignalStore()
    signal_store.put([
        sample("queue_depth", 3, source="nats/pod-a"),
        sample("queue_depth", 120, source="nats/gateway", ts=T0 - 1),
        sample("queue_depth", 30, source="http/gateway-b"),
    ])
    declared = messages.shared_queue_keys(("gateway", "gateway-b"))
    assert declared == {"nats/gateway", "http/gateway", "nats/gateway-b", "http/gateway-b"}
    snapshot = signal_store.snapshot(KEY, now=T0, stale_after_s=30, shared_sources=declared)
    assert snapshot.queue_depth == fresh(153.0, 0.0, sources=3)
    assert snapshot.shared_waiting == fresh(150.0, 0.0, sources=2)
    assert signal_store.snapshot(KEY, now=T0, stale_after_s=30).shared_waiting is None
    only_a = messages.shared_queue_keys(("gateway",))
    assert signal_store.snapshot(KEY, now=T0, stale_after_s=30,
                                 shared_sources=only_a).shared_waiting == fresh(120.0, 1.0)


def test_a_full_series_refuses_new_sources_and_keeps_the_known_ones() -> None:
    # A flood of invented `source` ids must not evict the replicas already reporting.
    signal_store = store.SignalStore(limits=store.StoreLimits(max_sources=3, ttl_s=60))
    signal_store.put([sample("queue_depth", 1, source=f"p{i}", ts=T0) for i in range(3)])
    signal_store.put([sample("queue_depth", 100, source=f"flood-{i}", ts=T0 + 1)
                      for i in range(50)])
    value = signal_store.value(KEY, Signal.QUEUE_DEPTH, now=T0 + 1, stale_after_s=30)
    assert value is not None and value.sources == 3 and value.value == 3
    assert signal_store.refused == {store.SOURCES_FULL: 50}
    # Known sources keep reporting; a source past its TTL makes room for a new one.
    signal_store.put([sample("queue_depth", 2, source="p0", ts=T0 + 2)])
    signal_store.put([sample("queue_depth", 1, source=f"p{i}", ts=T0 + 70) for i in (1, 2)])
    signal_store.put([sample("queue_depth", 5, source="p9", ts=T0 + 70)])
    value = signal_store.value(KEY, Signal.QUEUE_DEPTH, now=T0 + 70, stale_after_s=30)
    assert value is not None and value.value == 7 and value.sources == 3


def test_freshness_is_decided_in_the_snapshot_against_the_stale_limit() -> None:
    signal_store = store.SignalStore()
    signal_store.put([sample("queue_depth", 4, ts=T0)])
    at_40 = signal_store.snapshot(KEY, now=T0 + 40, stale_after_s=30).queue_depth
    assert at_40 is not None and not at_40.fresh and at_40.value == 4
    at_40_long_limit = signal_store.snapshot(KEY, now=T0 + 40, stale_after_s=120).queue_depth
    assert at_40_long_limit is not None and at_40_long_limit.fresh


def test_listeners_hear_each_model_once_per_put() -> None:
    signal_store = store.SignalStore()
    heard: list[str] = []
    remove = signal_store.add_listener(heard.append)
    signal_store.put(
        [sample("queue_depth", 1), sample("in_flight", 2), sample("queue_depth", 1, model="a/b")]
    )
    assert heard == [KEY, "a/b"]
    remove()
    signal_store.put([sample("queue_depth", 1, ts=T0 + 1)])
    assert heard == [KEY, "a/b"]


def test_a_failing_listener_does_not_stop_ingestion() -> None:
    signal_store = store.SignalStore()
    heard: list[str] = []

    def broken(key: str) -> None:
        raise RuntimeError("bug in a listener")

    signal_store.add_listener(broken)
    signal_store.add_listener(heard.append)
    signal_store.put([sample("queue_depth", 1)])
    assert heard == [KEY]
    assert signal_store.value(KEY, Signal("queue_depth"), now=T0, stale_after_s=30) is not None


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["a", "b", "c"]),
            st.floats(min_value=0, max_value=60),
            st.floats(min_value=0, max_value=1e6),
        ),
        max_size=30,
    )
)
def test_sum_equals_the_newest_fresh_value_per_source(
    events: list[tuple[str, float, float]],
) -> None:
    signal_store = store.SignalStore()
    for source, offset, value in events:
        signal_store.put([sample("queue_depth", value, source=source, ts=T0 + offset)])
    now = T0 + 60
    # The model: per source, the value with the newest timestamp (the last one on a tie).
    # Compare the timestamps the store sees: T0 + 59.99999999999999 == T0 + 60.
    newest: dict[str, tuple[float, float]] = {}
    for source, offset, value in events:
        if source not in newest or newest[source][0] <= T0 + offset:
            newest[source] = (T0 + offset, value)
    fresh = [v for ts, v in newest.values() if now - ts <= 30]
    got = signal_store.value(KEY, Signal("queue_depth"), now=now, stale_after_s=30)
    if fresh:
        assert got is not None and math.isclose(got.value, math.fsum(fresh), rel_tol=1e-9)
        assert got.sources == len(fresh)
    elif not newest:
        assert got is None
    else:
        assert got is not None and got.age_s > 30
