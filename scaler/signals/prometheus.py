"""Prometheus instant queries: vLLM, SGLang, TGI and DCGM presets or custom PromQL per signal."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from prometheus_api_client.prometheus_connect import PrometheusConnect
from pydantic import BaseModel, ConfigDict, Field, SecretStr
from urllib3.util.retry import Retry

from scaler.policy import model as policy_model
from scaler.signals import base

log = logging.getLogger(__name__)

RATE_WINDOW: Final = "1m"
"""Default window of rate(): 1 m covers 4 scrapes at the usual 15 s interval (rate needs
2). Use at least 4 x the scrape interval: 2m for 30 s scrapes."""


class PrometheusSettings(BaseModel):
    """How to reach Prometheus. For a private CA set REQUESTS_CA_BUNDLE (requests reads it).

    timeout_s: per query; a query that takes longer marks its signal stale (3 s: well
    inside the 5 s default poll interval, so polls do not pile up).
    max_concurrent_queries: queries in flight at once, each on a worker thread.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    url: str = "http://127.0.0.1:9090"
    timeout_s: float = Field(default=3.0, gt=0)
    bearer_token: SecretStr | None = None
    basic_auth_user: str | None = None
    basic_auth_password: SecretStr | None = None
    verify_tls: bool = True
    max_concurrent_queries: int = Field(default=4, ge=1)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def selector(labels: Mapping[str, str]) -> str:
    """{label="value", ...} with values escaped for PromQL string literals."""
    inner = ",".join(f'{name}="{_escape(value)}"' for name, value in sorted(labels.items()))
    return "{" + inner + "}"


def _quantile(bucket_metric: str, sel: str, window: str, q: float = 0.95) -> str:
    # Sum the bucket rates over replicas by `le` first, then take the quantile: the
    # merged-histogram rule of the store, done by Prometheus.
    return f"histogram_quantile({q}, sum by (le) (rate({bucket_metric}{sel}[{window}])))"


def preset_queries(
    preset: str, *, sel: str, latency_metric: str, rate_window: str = RATE_WINDOW
) -> dict[str, str]:
    """The PromQL of a preset, per store signal name (a pure function).

    `sel` is the label selector that picks the model, e.g. {model_name="llama-70b"}.
    Latency queries exist only for the metrics the engine exports: vLLM has TTFT and
    end-to-end histograms, SGLang TTFT, TGI end-to-end (tgi_request_duration); any other
    combination needs a custom query.
    """
    latency = base.latency_signal(latency_metric)
    if preset == "vllm":
        queries = {
            base.QUEUE_DEPTH: f"sum(vllm:num_requests_waiting{sel})",
            base.IN_FLIGHT: f"sum(vllm:num_requests_running{sel})",
            base.TOKENS_PER_SECOND: f"sum(rate(vllm:generation_tokens_total{sel}[{rate_window}]))",
            base.PROMPT_TOKENS_PER_SECOND:
                f"sum(rate(vllm:prompt_tokens_total{sel}[{rate_window}]))",
            base.KV_CACHE_USAGE: f"avg(vllm:kv_cache_usage_perc{sel})",
        }
        buckets = {
            "ttft": "vllm:time_to_first_token_seconds_bucket",
            "e2e": "vllm:e2e_request_latency_seconds_bucket",
        }
    elif preset == "sglang":
        queries = {
            base.QUEUE_DEPTH: f"sum(sglang:num_queue_reqs{sel})",
            base.IN_FLIGHT: f"sum(sglang:num_running_reqs{sel})",
            base.TOKENS_PER_SECOND: f"sum(sglang:gen_throughput{sel})",
            base.PROMPT_TOKENS_PER_SECOND:
                f"sum(rate(sglang:prompt_tokens_total{sel}[{rate_window}]))",
        }
        buckets = {"ttft": "sglang:time_to_first_token_seconds_bucket"}
    elif preset == "tgi":
        queries = {
            base.QUEUE_DEPTH: f"sum(tgi_queue_size{sel})",
            base.IN_FLIGHT: f"sum(tgi_batch_current_size{sel})",
        }
        buckets = {"e2e": "tgi_request_duration_bucket"}
    elif preset == "custom":
        return {}
    else:
        raise ValueError(f"unknown Prometheus preset {preset!r}")
    if latency_metric in buckets:
        queries[latency] = _quantile(buckets[latency_metric], sel, rate_window)
    return queries


def dcgm_queries(sel: str) -> dict[str, str]:
    """GPU utilisation from dcgm-exporter: for cost reports and /metrics, never for scaling.

    GR_ENGINE_ACTIVE and SM_ACTIVE are ratios 0..1 (averaged over the model's GPUs);
    FB_USED is MiB (summed).
    """
    return {
        base.GPU_ENGINE_ACTIVE: f"avg(DCGM_FI_PROF_GR_ENGINE_ACTIVE{sel})",
        base.GPU_SM_ACTIVE: f"avg(DCGM_FI_PROF_SM_ACTIVE{sel})",
        base.GPU_FB_USED_MIB: f"sum(DCGM_FI_DEV_FB_USED{sel})",
    }


@dataclass(frozen=True, slots=True)
class PromTarget:
    """One model's queries, polled every `interval_s` seconds."""

    model: str
    queries: tuple[tuple[str, str], ...]
    interval_s: float = 5.0

    @property
    def source(self) -> str:
        return "prometheus"


@dataclass(frozen=True, slots=True)
class PrometheusConfig:
    targets: tuple[PromTarget, ...] = field(default=())


def target_from_policy(
    policy: policy_model.ScalePolicy,
    *,
    dcgm_selector: str | None = None,
    rate_window: str = RATE_WINDOW,
) -> PromTarget | None:
    """The queries for a policy's `spec.sources.prometheus` (None without one).

    The model label value defaults to the policy's name. Custom `queries` replace the
    preset's query for their signal; `p95_latency` maps to the policy's latency metric.
    `dcgm_selector` (e.g. {namespace="inference",pod=~"llama-70b-.*"}) adds the DCGM
    queries; dcgm-exporter labels GPUs by pod, not by model, hence a separate selector.
    """
    source = policy.spec.sources.prometheus
    if source is None:
        return None
    p95 = policy.spec.signals.p95_latency
    metric = p95.metric if p95 is not None else "ttft"
    sel = selector({source.model_label: source.model_name or policy.metadata.name})
    queries = preset_queries(
        source.preset, sel=sel, latency_metric=metric, rate_window=rate_window
    )
    for name, promql in source.queries.items():
        signal = base.latency_signal(metric) if name == "p95_latency" else name
        queries[signal] = promql
    if dcgm_selector is not None:
        queries.update(dcgm_queries(dcgm_selector))
    return PromTarget(
        model=policy.key,
        queries=tuple(sorted(queries.items())),
        interval_s=source.interval_seconds,
    )


def config_from_policies(
    policies: Iterable[policy_model.ScalePolicy], *, rate_window: str = RATE_WINDOW
) -> PrometheusConfig:
    targets = tuple(
        t for p in policies if (t := target_from_policy(p, rate_window=rate_window)) is not None
    )
    return PrometheusConfig(targets=targets)


def value_of(signal: str, result: object) -> float | None:
    """An instant-query result -> one number, or None for missing (a pure function).

    An empty vector, NaN and +-Inf are missing, never 0. Several series (a custom query
    without an aggregation) combine as the store does: summed for counts and rates,
    max for latency, mean for other gauges.
    """
    values: list[float] = []
    if isinstance(result, list) and len(result) == 2 and not isinstance(result[0], dict):
        pairs: list[Any] = [result]  # a scalar result: [ts, "value"]
    elif isinstance(result, list):
        pairs = [item.get("value") for item in result if isinstance(item, dict)]
    else:
        return None
    for pair in pairs:
        if not isinstance(pair, list | tuple) or len(pair) != 2:
            continue
        try:
            number = float(pair[1])
        except (TypeError, ValueError):
            continue
        if math.isfinite(number):
            values.append(number)
    if not values:
        return None
    if signal in base.SUMMED_SIGNALS:
        return math.fsum(values)
    if signal.startswith("latency."):
        return max(values)
    return math.fsum(values) / len(values)


class PrometheusSource:
    """Runs each target's queries at its interval (on worker threads) and emits samples.

    A query that answers with nothing (empty, NaN, Inf) emits a missing sample, so an
    earlier value is forgotten; a query that fails or times out emits nothing, so the
    earlier value ages into staleness. Neither raises.
    """

    def __init__(
        self,
        settings: PrometheusSettings,
        config: PrometheusConfig,
        *,
        clock: base.Clock = base.wall_clock,
    ) -> None:
        self.settings = settings
        self.config = config
        self.stats = base.SourceStats()
        self._clock = clock
        self._poller: base.Poller[PromTarget] = base.Poller()
        self._client: PrometheusConnect | None = None

    @staticmethod
    def _make_client(settings: PrometheusSettings) -> PrometheusConnect:
        headers: dict[str, str] = {}
        if settings.bearer_token is not None:
            headers["Authorization"] = f"Bearer {settings.bearer_token.get_secret_value()}"
        # The client's annotations say int/tuple; requests takes a float timeout and
        # auth None, so the options go untyped.
        options: dict[str, Any] = {"headers": headers, "timeout": settings.timeout_s}
        if settings.basic_auth_user is not None and settings.basic_auth_password is not None:
            password = settings.basic_auth_password.get_secret_value()
            options["auth"] = (settings.basic_auth_user, password)
        # No retries inside a poll: the next poll is the retry, and a failing poll must
        # not outlast the interval (urllib3's default would back off for seconds).
        return PrometheusConnect(
            url=settings.url,
            disable_ssl=not settings.verify_tls,
            retry=Retry(total=0),
            **options,
        )

    @property
    def name(self) -> str:
        return "prometheus"

    def update(self, config: PrometheusConfig) -> None:
        self.config = config
        self._poller.wake()

    def close(self) -> None:
        """Release the HTTP connections; a later poll opens new ones (a restarted task)."""
        client, self._client = self._client, None
        if client is not None:
            client.close()

    async def run(self, sink: base.SampleSink) -> None:
        limit = asyncio.Semaphore(self.settings.max_concurrent_queries)

        async def poll_due(due: list[PromTarget]) -> None:
            await asyncio.gather(*(self.poll(t, sink, limit=limit) for t in due))

        try:
            await self._poller.run(
                lambda: [(t, t.interval_s) for t in self.config.targets], poll_due
            )
        finally:
            self.close()

    async def poll(
        self, target: PromTarget, sink: base.SampleSink, *, limit: asyncio.Semaphore
    ) -> None:
        """Run a target's queries; put what answered. Never raises."""
        ts = self._clock()
        results = await asyncio.gather(
            *(self._query(promql, limit) for _, promql in target.queries)
        )
        samples: list[base.Sample] = []
        for (signal, _), result in zip(target.queries, results, strict=True):
            if isinstance(result, Exception):
                self.stats.error(type(result).__name__)
                continue
            value = value_of(signal, result)
            samples.append(base.Sample(target.model, signal, target.source, ts, value))
        if samples:
            self.stats.accepted += 1
            sink.put(samples)

    async def _query(self, promql: str, limit: asyncio.Semaphore) -> object:
        if self._client is None:
            self._client = self._make_client(self.settings)
        client = self._client
        async with limit:
            try:
                return await asyncio.to_thread(client.custom_query, promql)
            except Exception as exc:  # HTTP errors, timeouts, refused connections, bad JSON
                log.debug("prometheus query failed: %s: %r", promql, exc)
                return exc
