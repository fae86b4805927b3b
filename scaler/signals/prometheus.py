"""Prometheus instant queries: vLLM, SGLang, TGI and DCGM presets or custom PromQL per signal."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from prometheus_api_client.prometheus_connect import PrometheusConnect
from pydantic import Field, SecretStr
from urllib3.util.retry import Retry

from scaler.core import settings as core_settings
from scaler.core import vocabulary
from scaler.core.vocabulary import Signal
from scaler.policy import model as policy_model
from scaler.signals import failures, messages, polling, samples

log = logging.getLogger(__name__)

RATE_WINDOW: Final = "1m"
"""Default window of rate(): 1 m covers 4 scrapes at the usual 15 s interval (rate needs
2). Use at least 4 x the scrape interval: 2m for 30 s scrapes."""


class PrometheusSettings(core_settings.Group):
    """How to reach Prometheus. For a private CA set REQUESTS_CA_BUNDLE (requests reads it)."""

    url: str = Field(
        default="http://127.0.0.1:9090",
        description="Base URL of the Prometheus HTTP API (or Thanos / Mimir querier). "
        "Default: a local Prometheus on its standard port 9090.")
    timeout_s: float = Field(
        default=3.0, gt=0,
        description="Timeout of one query, seconds; a query that takes longer marks its "
        "signal stale. 3 s: well inside the 5 s default poll interval, so polls never pile up.")
    bearer_token: SecretStr | None = Field(
        default=None, description="Sent as `Authorization: Bearer ...`; never printed. "
        "None: no token (an in-cluster Prometheus without auth).")
    basic_auth_user: str | None = Field(
        default=None, description="User for HTTP basic auth; goes with basic_auth_password. "
        "None: no basic auth.")
    basic_auth_password: SecretStr | None = Field(
        default=None, description="Password for HTTP basic auth; never printed.")
    verify_tls: bool = Field(
        default=True, description="Verify the server's certificate for an https URL. "
        "Turning it off lets anyone on the path feed the scaler false load.")
    max_concurrent_queries: int = Field(
        default=4, ge=1,
        description="Queries in flight at once, each on a worker thread. 4: every model "
        "polls every 5 s and a query takes milliseconds, so 4 threads serve hundreds of "
        "models without loading Prometheus with bursts.")


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
    preset: str,
    *,
    sel: str,
    latency_metric: vocabulary.LatencyMetric,
    rate_window: str = RATE_WINDOW,
) -> dict[Signal, str]:
    """The PromQL of a preset, per signal (a pure function).

    `sel` is the label selector that picks the model, e.g. {model_name="llama-70b"}.
    Latency queries exist only for the metrics the engine exports: vLLM has TTFT and
    end-to-end histograms, SGLang TTFT, TGI end-to-end (tgi_request_duration); any other
    combination needs a custom query.
    """
    Latency = vocabulary.LatencyMetric
    queries: dict[Signal, str]
    buckets: dict[vocabulary.LatencyMetric, str]
    if preset == "vllm":
        queries = {
            Signal.QUEUE_DEPTH: f"sum(vllm:num_requests_waiting{sel})",
            Signal.IN_FLIGHT: f"sum(vllm:num_requests_running{sel})",
            Signal.TOKENS_PER_SECOND:
                f"sum(rate(vllm:generation_tokens_total{sel}[{rate_window}]))",
            Signal.PROMPT_TOKENS_PER_SECOND:
                f"sum(rate(vllm:prompt_tokens_total{sel}[{rate_window}]))",
            Signal.KV_CACHE_USAGE: f"avg(vllm:kv_cache_usage_perc{sel})",
            Signal.COMPLETION_RATE: f"sum(rate(vllm:request_success_total{sel}[{rate_window}]))",
        }
        buckets = {
            Latency.TTFT: "vllm:time_to_first_token_seconds_bucket",
            Latency.E2E: "vllm:e2e_request_latency_seconds_bucket",
        }
    elif preset == "sglang":
        queries = {
            Signal.QUEUE_DEPTH: f"sum(sglang:num_queue_reqs{sel})",
            Signal.IN_FLIGHT: f"sum(sglang:num_running_reqs{sel})",
            Signal.TOKENS_PER_SECOND: f"sum(sglang:gen_throughput{sel})",
            Signal.PROMPT_TOKENS_PER_SECOND:
                f"sum(rate(sglang:prompt_tokens_total{sel}[{rate_window}]))",
            Signal.COMPLETION_RATE: f"sum(rate(sglang:num_requests_total{sel}[{rate_window}]))",
        }
        buckets = {Latency.TTFT: "sglang:time_to_first_token_seconds_bucket"}
    elif preset == "tgi":
        queries = {
            Signal.QUEUE_DEPTH: f"sum(tgi_queue_size{sel})",
            Signal.IN_FLIGHT: f"sum(tgi_batch_current_size{sel})",
            Signal.COMPLETION_RATE: f"sum(rate(tgi_request_success{sel}[{rate_window}]))",
        }
        buckets = {Latency.E2E: "tgi_request_duration_bucket"}
    elif preset == "custom":
        return {}
    else:
        raise ValueError(f"unknown Prometheus preset {preset!r}")
    if latency_metric in buckets:
        queries[Signal.P95_LATENCY] = _quantile(buckets[latency_metric], sel,
                                                           rate_window)
    return queries


def dcgm_queries(sel: str) -> dict[Signal, str]:
    """GPU utilisation from dcgm-exporter: for cost reports and /metrics, never for scaling.

    GR_ENGINE_ACTIVE and SM_ACTIVE are ratios 0..1 (averaged over the model's GPUs);
    FB_USED is MiB (summed).
    """
    return {
        Signal.GPU_ENGINE_ACTIVE: f"avg(DCGM_FI_PROF_GR_ENGINE_ACTIVE{sel})",
        Signal.GPU_SM_ACTIVE: f"avg(DCGM_FI_PROF_SM_ACTIVE{sel})",
        Signal.GPU_FB_USED_MIB: f"sum(DCGM_FI_DEV_FB_USED{sel})",
    }


@dataclass(frozen=True, slots=True)
class PromTarget:
    """One model's queries, polled every `interval_s` seconds; the latency query (if any)
    measures `latency_metric`."""

    model: str
    queries: tuple[tuple[Signal, str], ...]
    interval_s: float = 5.0
    latency_metric: vocabulary.LatencyMetric = vocabulary.DEFAULT_LATENCY_METRIC

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
    metric = policy.spec.latency_metric
    sel = selector({source.model_label: source.model_name or policy.metadata.name})
    queries = preset_queries(
        source.preset, sel=sel, latency_metric=metric, rate_window=rate_window
    )
    queries.update(source.queries)
    if dcgm_selector is not None:
        queries.update(dcgm_queries(dcgm_selector))
    return PromTarget(
        model=policy.key,
        queries=tuple(sorted(queries.items())),
        interval_s=source.interval_seconds,
        latency_metric=metric,
    )


def config_from_policies(
    policies: Iterable[policy_model.ScalePolicy], *, rate_window: str = RATE_WINDOW
) -> PrometheusConfig:
    targets = tuple(
        t for p in policies if (t := target_from_policy(p, rate_window=rate_window)) is not None
    )
    return PrometheusConfig(targets=targets)


def value_of(signal: Signal, result: object) -> float | None:
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
    rule = signal.combine
    if rule is vocabulary.Combine.SUM:
        return math.fsum(values)
    if rule is vocabulary.Combine.QUANTILE:
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
        config: PrometheusConfig | None = None,
        *,
        clock: samples.Clock = samples.wall_clock,
    ) -> None:
        self.settings = settings
        self.config = config or PrometheusConfig()
        self.stats = samples.SourceStats()
        self._clock = clock
        self._poller: polling.Poller[PromTarget] = polling.Poller()
        self._client: PrometheusConnect | None = None
        # A wrong URL must be heard: WARNING per model, at most once a minute.
        self._failures = failures.PollFailures(self.stats, what="prometheus queries",
                                               logger=log)

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

    async def update(self, policies: Sequence[policy_model.ScalePolicy]) -> None:
        """Poll the queries the policies in force need (policy reload)."""
        self.configure(config_from_policies(policies))

    def configure(self, config: PrometheusConfig) -> None:
        """Replace the targets; new ones are polled at once."""
        self.config = config
        self._failures.keep(target.model for target in config.targets)
        self._poller.wake()

    async def wait_ready(self) -> None:
        """Polled (or pushed to): nothing to wait for."""

    async def close(self) -> None:
        """Release the HTTP connections; a later poll opens new ones (a restarted task)."""
        self.release()

    def release(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            client.close()

    async def run(self, sink: samples.SampleSink) -> None:
        limit = asyncio.Semaphore(self.settings.max_concurrent_queries)

        async def poll_due(due: list[PromTarget]) -> None:
            await asyncio.gather(*(self.poll(t, sink, limit=limit) for t in due))

        try:
            await self._poller.run(
                lambda: [(t, t.interval_s) for t in self.config.targets], poll_due
            )
        finally:
            self.release()

    async def poll(
        self, target: PromTarget, sink: samples.SampleSink, *, limit: asyncio.Semaphore
    ) -> None:
        """Run a target's queries; put what answered. Never raises."""
        ts = self._clock()
        results = await asyncio.gather(
            *(self._query(promql, limit) for _, promql in target.queries)
        )
        out: list[samples.Sample] = []
        failed: list[tuple[Exception, str]] = []
        for (signal, promql), result in zip(target.queries, results, strict=True):
            if isinstance(result, Exception):
                self.stats.error(type(result).__name__)
                failed.append((result, promql))
                continue
            value = value_of(signal, result)
            if value is not None and value > signal.plausible_max:
                # A broken exporter or query: believed by nothing, counted, left to go stale.
                self.stats.drop(messages.DropReason.IMPLAUSIBLE)
                continue
            metric = target.latency_metric if signal is Signal.P95_LATENCY else None
            out.append(samples.Sample(target.model, signal, target.source, ts, value,
                                      metric=metric))
        if failed:
            error, promql = failed[0]
            self._failures.failed(target.model, error, now=ts, detail=f"query {promql}",
                                  count=len(failed))
        else:
            self._failures.succeeded(target.model)
        if out:
            self.stats.accepted += 1
            sink.put(out)

    async def _query(self, promql: str, limit: asyncio.Semaphore) -> object:
        if self._client is None:
            self._client = self._make_client(self.settings)
        client = self._client
        async with limit:
            try:
                return await asyncio.to_thread(client.custom_query, promql)
            except Exception as exc:  # HTTP errors, timeouts, refused connections, bad JSON
                return exc  # counted and logged (rate-limited) by `poll`, per model
