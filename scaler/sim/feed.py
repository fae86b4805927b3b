"""Simulated replicas reporting to the real signal store, as vLLM pods would over NATS."""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from scaler.core import histogram as signal_histogram
from scaler.core import vocabulary
from scaler.engine import spare as engine_spare
from scaler.engine import types as engine_types
from scaler.signals import samples as signal_samples
from scaler.signals import store as signal_store
from scaler.sim import cluster as sim_cluster

# vLLM's bucket bounds for vllm:time_to_first_token_seconds (and close to its e2e ones):
# the p95 the engine sees is interpolated inside these, as histogram_quantile does.
VLLM_LATENCY_BUCKETS = signal_histogram.VLLM_TTFT_BUCKETS
GATEWAY_SOURCE = "gateway"
# The source of a queue-dispatch model's shared queue (`cluster.Dispatch`), as the
# service's JetStream source reports a consumer's lag ('jetstream/<stream>/<consumer>'):
# the model's reading, no replica's, so it is in the queue depth the engine sums but not
# in any replica's work (`replica_work`).
WORK_QUEUE_SOURCE = f"{vocabulary.SHARED_QUEUE_SOURCE_PREFIX}requests/workers"


@dataclass(slots=True)
class SignalFeed:
    """Every `interval_s`, each serving replica publishes what a vLLM pod reports.

    Per pod (source `pod-<slot>`): queue_depth (its waiting requests), in_flight (its
    running batch), tokens_per_second and prompt_tokens_per_second (its generated and
    prefilled tokens over the last `rate_window_s`), and a latency histogram (vLLM
    buckets) of its requests over the last `latency_window_s`. The gateway (source
    `gateway`) publishes the requests held while no replica is ready and the arrival
    rate; with queue dispatch the shared queue (its depth and the arrival rate, as a
    JetStream consumer's lag and stream rate) is published under `WORK_QUEUE_SOURCE`
    instead, and each pod's queue_depth is 0: nothing waits at a replica. Samples reach
    the real SignalStore `delay_s` after they were measured (publish
    + NATS + ingestion), and the engine reads
    `SignalStore.snapshot`, so merging, freshness and staleness are the service's own.
    """

    model_key: str
    start_epoch_s: float
    latency_metric: vocabulary.LatencyMetric = vocabulary.DEFAULT_LATENCY_METRIC
    delay_s: float = 1.0
    interval_s: float = 1.0
    rate_window_s: float = 10.0
    latency_window_s: float = 30.0
    gateway_arrival_rate: bool = True
    store: signal_store.SignalStore = field(default_factory=signal_store.SignalStore)
    pending: deque[tuple[float, list[signal_samples.Sample]]] = field(default_factory=deque)
    counters: deque[tuple[float, npt.NDArray[np.float64]]] = field(default_factory=deque)
    next_publish: float = float("-inf")

    def advance(self, cluster: sim_cluster.SimCluster, *, now: float) -> None:
        """Publish if due, then deliver every batch whose delay has passed."""
        if now >= self.next_publish - 1e-9:
            self.publish(cluster, now=now)
            self.next_publish = now + self.interval_s
        while self.pending and self.pending[0][0] <= now + 1e-9:
            self.store.put(self.pending.popleft()[1])

    def publish(self, cluster: sim_cluster.SimCluster, *, now: float) -> None:
        """Measure now; the samples reach the store `delay_s` later (see `advance`)."""
        self.pending.append((now + self.delay_s, self.measure(cluster, now=now)))

    def measure(self, cluster: sim_cluster.SimCluster, *, now: float
                ) -> list[signal_samples.Sample]:
        """What every serving pod and the gateway report at `now` (trace seconds): the
        samples `publish` delivers, for a caller that sends them itself (the demo)."""
        ts = self.start_epoch_s + now
        key = self.model_key
        samples: list[signal_samples.Sample] = []
        # Generated and prompt token counters side by side (row 0, row 1), as a pod's
        # generation_tokens_total and prompt_tokens_total; rates over `rate_window_s`.
        tokens = np.vstack((cluster.tokens_by_slot, cluster.prompt_tokens_by_slot))
        self.counters.append((now, tokens))
        while len(self.counters) > 1 and self.counters[1][0] <= now - self.rate_window_s:
            self.counters.popleft()
        then, before = self.counters[0]
        if before.shape != tokens.shape:  # the counters grew with new pods
            padded = np.zeros_like(tokens)
            padded[:, : before.shape[1]] = before
            before = padded
        span = now - then
        slots = sorted(cluster.serving_slots)
        histograms = self._histograms(cluster, slots=slots, now=now)
        completed = self._completions(cluster, now=now)
        signal = vocabulary.Signal
        # KV-cache usage as vLLM's kv_cache_usage_perc: the tokens admitted requests hold
        # (the simulator reserves a request's prompt and answer when it admits it, which is
        # also what bounds admission) over the cache.
        kv_tokens = float(cluster.profile.kv_cache_tokens)
        for slot, histogram in zip(slots, histograms, strict=True):
            source = f"pod-{slot}"
            rate, prompt_rate = ((tokens[:, slot] - before[:, slot]) / span).tolist() if (
                span > 0) else (0.0, 0.0)
            done = float(completed[slot]) / self.rate_window_s if slot < completed.size else 0.0
            samples.extend((
                signal_samples.Sample(key, signal.QUEUE_DEPTH, source, ts,
                                      float(len(cluster.queues[slot]))),
                signal_samples.Sample(key, signal.IN_FLIGHT, source, ts,
                                      float(cluster.running[slot])),
                signal_samples.Sample(key, signal.TOKENS_PER_SECOND, source, ts, rate),
                signal_samples.Sample(key, signal.PROMPT_TOKENS_PER_SECOND, source, ts,
                                      prompt_rate),
                signal_samples.Sample(key, signal.COMPLETION_RATE, source, ts, done),
                signal_samples.Sample(key, signal.KV_CACHE_USAGE, source, ts,
                                      min(1.0, cluster.kv_used[slot] / kv_tokens)),
            ))
            if histogram is not None:
                samples.append(signal_samples.Sample(
                    key, vocabulary.Signal.P95_LATENCY, source, ts, histogram=histogram,
                    metric=self.latency_metric))
        arrivals = cluster.window(cluster.history.arrivals, start=now - self.rate_window_s,
                                  end=now)
        front = WORK_QUEUE_SOURCE if cluster.dispatch == "queue" else GATEWAY_SOURCE
        samples.append(signal_samples.Sample(key, signal.QUEUE_DEPTH, front, ts,
                                             float(len(cluster.gateway))))
        if self.gateway_arrival_rate:
            samples.append(signal_samples.Sample(
                key, signal.ARRIVAL_RATE, front, ts,
                float(arrivals.sum()) / max(arrivals.size * cluster.dt, cluster.dt)))
        return samples

    def _completions(self, cluster: sim_cluster.SimCluster, *, now: float
                     ) -> npt.NDArray[np.int64]:
        """Requests each slot finished over the last `rate_window_s` (indexed by slot), as
        a pod's request_success_total counter would show."""
        lo = cluster.index(now - self.rate_window_s)
        chunks = [c for c in cluster.done_ids_by_step[lo:cluster.step] if c.size]
        if not chunks:
            return np.zeros(0, dtype=np.int64)
        return np.bincount(cluster.replica[np.concatenate(chunks)])

    def _histograms(
        self, cluster: sim_cluster.SimCluster, *, slots: list[int], now: float
    ) -> list[signal_histogram.Histogram | None]:
        """Per-slot cumulative histograms of the latency metric over the latency window."""
        lo = cluster.index(now - self.latency_window_s)
        by_first_token = self.latency_metric is vocabulary.LatencyMetric.TTFT
        steps = (cluster.first_ids_by_step if by_first_token
                 else cluster.done_ids_by_step)[lo:cluster.step]
        chunks = [c for c in steps if c.size]
        if not chunks or not slots:
            return [None] * len(slots)
        ids = np.concatenate(chunks)
        if self.latency_metric is vocabulary.LatencyMetric.E2E:
            values = cluster.done[ids] - cluster.arrival[ids]
        elif self.latency_metric is vocabulary.LatencyMetric.ITL:
            values = (cluster.done[ids] - cluster.first_token[ids]) / np.maximum(
                cluster.output_tokens[ids] - 1, 1)
        else:
            values = cluster.first_token[ids] - cluster.arrival[ids]
        owner = cluster.replica[ids]
        bounds = np.asarray(VLLM_LATENCY_BUCKETS)
        bucket = np.minimum(np.searchsorted(bounds, values, side="left"), bounds.size - 1)
        table = np.full(len(cluster.pods), -1, dtype=np.int64)
        table[np.asarray(slots, dtype=np.int64)] = np.arange(len(slots))
        row = table[owner]
        keep = row >= 0
        grid = np.zeros((len(slots), bounds.size))
        np.add.at(grid, (row[keep], bucket[keep]), 1.0)
        cumulative = np.cumsum(grid, axis=1)
        return [signal_histogram.Histogram(le=VLLM_LATENCY_BUCKETS, counts=tuple(r.tolist()))
                if r[-1] > 0 else None for r in cumulative]

    def snapshot(self, *, now: float, stale_after_s: float) -> engine_types.SignalSnapshot:
        return self.store.snapshot(self.model_key, now=self.start_epoch_s + now,
                                   stale_after_s=stale_after_s,
                                   latency_metric=self.latency_metric)


def replica_work(work: Mapping[str, engine_spare.PodWork]) -> dict[str, engine_spare.PodWork]:
    """The work of the sources that are replicas (or a gateway holding requests for
    them): without a work queue's reading (`WORK_QUEUE_SOURCE`, also as a variant's
    '<variant>/jetstream/...'), as the service's `pod_work` keeps only replicas' sources.
    A request waiting in the shared queue is lost with no replica's removal, so it makes
    no replica busy."""
    return {source: each for source, each in work.items()
            if not source.endswith(WORK_QUEUE_SOURCE)}


def cluster_state(cluster: sim_cluster.SimCluster, *, start_epoch_s: float, now: float
                  ) -> engine_types.ClusterState:
    """What the service's cluster reader would see of the simulated pods at `now` (trace
    seconds): spec.replicas, ready, starting (creation epochs), free GPU slots on ready
    nodes, the last 20 observed cold starts (epoch times, as a pod's timeline has) and
    the pods' grace period."""
    pods = cluster.replicas()
    starting = tuple(start_epoch_s + p.created_at for p in pods if p.phase != "ready")
    observations = tuple(
        dataclasses.replace(o, created_at=start_epoch_s + o.created_at,
                            ready_at=start_epoch_s + o.ready_at)
        for o in cluster.observations[-20:]
    )
    return engine_types.ClusterState(
        current=cluster.spec_replicas,
        ready=len(cluster.ready_slots),
        starting=starting,
        free_replica_slots=cluster.free_replica_slots(now=now),
        observations=observations,
        grace_period_s=cluster.grace_s,
    )
