"""Prometheus instant queries: vLLM, SGLang, TGI and DCGM presets or custom PromQL per signal."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from prometheus_api_client.prometheus_connect import PrometheusConnect
from pydantic import Field, SecretStr
from urllib3.util.retry import Retry

from scaler.core import gpus, vocabulary
from scaler.core import settings as core_settings
from scaler.core.vocabulary import Signal
from scaler.policy import model as policy_model
from scaler.signals import failures, messages, polling, samples

log = logging.getLogger(__name__)

RATE_WINDOW: Final = "1m"
"""Default window of rate(): 1 m covers 4 scrapes at the usual 15 s interval (rate needs
2). Use at least 4 x the scrape interval: 2m for 30 s scrapes."""


class DcgmSettings(core_settings.Group):
    """GPU health and SM activity from dcgm-exporter, through the same Prometheus."""

    enabled: bool = Field(
        default=False, description="Poll dcgm-exporter's series: GPUs with XID or "
        "double-bit ECC errors leave pool capacity, and SM activity measures useful "
        "GPU-hours. Off by default: without dcgm-exporter every query would be empty.")
    interval_s: float = Field(
        default=30.0, gt=0, description="Seconds between polls. 30 s: dcgm-exporter "
        "collects every 30 s by default, so polling faster reads the same values.")
    health_window: str = Field(
        default="10m", pattern=r"^[0-9]+[smh]$", description="PromQL range in which an XID "
        "or a double-bit ECC increase marks a GPU faulty. 10m: 20 dcgm-exporter samples, "
        "long enough that a fault seen once is not forgotten by the next poll.")
    max_age_s: float = Field(
        default=120.0, gt=0, description="A reading older than this is not believed (the "
        "GPUs count again as the nodes report them). 120 s: four missed 30 s polls.")


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
    dcgm: DcgmSettings = Field(
        default_factory=DcgmSettings,
        description="GPU health and SM activity from dcgm-exporter (off by default).")


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
            # The share of the KV token pool in use, 0..1, per server (as vLLM's).
            Signal.KV_CACHE_USAGE: f"avg(sglang:token_usage{sel})",
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


# dcgm-exporter's labels (its default collectors): `Hostname` names the node (the GPU
# Operator sets it to the node name), `gpu` the index and `UUID` the device; with the
# Kubernetes mapping on, `namespace`/`pod`/`container` name the pod using the GPU.
DCGM_NODE_LABEL: Final = "Hostname"
DCGM_GPU_LABELS: Final = (DCGM_NODE_LABEL, "gpu", "UUID")


@dataclass(frozen=True, slots=True)
class DcgmTelemetryQueries:
    """The three queries of one GPU telemetry reading (a pure value).

    xid: the XID gauge's samples over the window (a range vector), so every code seen is
      known, not only the largest; every GPU exports it (0 without error), so its series
      also count the GPUs per node.
    dbe: the double-bit ECC counter's increase over the window, per GPU (`increase`
      survives the counter's reset at a driver reload).
    sm_active: mean SM activity of each pod's GPUs, for useful GPU-hours.
    """

    xid: str
    dbe: str
    sm_active: str


def dcgm_telemetry_queries(window: str) -> DcgmTelemetryQueries:
    by_gpu = ", ".join(DCGM_GPU_LABELS)
    return DcgmTelemetryQueries(
        xid=f"DCGM_FI_DEV_XID_ERRORS[{window}]",
        dbe=f"max by ({by_gpu}) (increase(DCGM_FI_DEV_ECC_DBE_VOL_TOTAL[{window}]))",
        sm_active='avg by (namespace, pod) (DCGM_FI_PROF_SM_ACTIVE{pod!=""})',
    )


def _series(result: object) -> list[tuple[dict[str, str], list[float]]]:
    """(labels, finite values) of each series of a vector or matrix result."""
    out: list[tuple[dict[str, str], list[float]]] = []
    if not isinstance(result, list):
        return out
    for item in result:
        if not isinstance(item, dict):
            continue
        labels = {str(k): str(v) for k, v in (item.get("metric") or {}).items()}
        pairs = item.get("values") or ([item["value"]] if "value" in item else [])
        values = []
        for pair in pairs:
            try:
                number = float(pair[1])
            except (TypeError, ValueError, IndexError):
                continue
            if math.isfinite(number):
                values.append(number)
        out.append((labels, values))
    return out


def gpu_telemetry(*, at: float, xid: object, dbe: object, sm_active: object
                  ) -> gpus.GpuTelemetry:
    """Three query results -> one reading (a pure function).

    A GPU is faulty with an XID code other than the application's own (`APPLICATION_XIDS`)
    in the window, or with double-bit ECC errors added in it. Series without a `Hostname`
    cannot be placed on a node and are skipped. Example: XID samples 0, 79, 79 on GPU 5 of
    gpu-3 -> GpuFault(node="gpu-3", gpu="5", xids=(79,)).
    """
    found: dict[tuple[str, str], gpus.GpuFault] = {}
    per_node: dict[str, set[str]] = {}
    for labels, values in _series(xid):
        node, index = labels.get(DCGM_NODE_LABEL, ""), labels.get("gpu", "")
        if not node:
            continue
        per_node.setdefault(node, set()).add(labels.get("UUID") or index)
        codes = tuple(sorted({int(v) for v in values if v > 0} - gpus.APPLICATION_XIDS))
        if codes:
            found[(node, index)] = gpus.GpuFault(node=node, gpu=index,
                                                 uuid=labels.get("UUID", ""), xids=codes)
    for labels, values in _series(dbe):
        node, index = labels.get(DCGM_NODE_LABEL, ""), labels.get("gpu", "")
        added = max(values, default=0.0)
        if not node or added <= 0:
            continue
        before = found.get((node, index)) or gpus.GpuFault(node=node, gpu=index,
                                                           uuid=labels.get("UUID", ""))
        found[(node, index)] = dataclasses.replace(before, dbe_errors=added)
    activity: dict[tuple[str, str], float] = {}
    for labels, values in _series(sm_active):
        if values and labels.get("pod"):
            activity[(labels.get("namespace", ""), labels["pod"])] = min(1.0, max(0.0, values[-1]))

    def order(fault: gpus.GpuFault) -> tuple[str, int, str]:
        return (fault.node, int(fault.gpu) if fault.gpu.isdigit() else -1, fault.gpu)

    return gpus.GpuTelemetry(
        at=at, faults=tuple(sorted(found.values(), key=order)),
        gpus_per_node={node: len(ids) for node, ids in sorted(per_node.items())},
        sm_active=activity)


class GpuTelemetryPoller:
    """Reads GPU health and SM activity every `dcgm.interval_s`; `latest()` is the newest
    reading younger than `dcgm.max_age_s`, None otherwise (never read, or Prometheus down).

    A failed poll keeps the previous reading until it is too old: a Prometheus restart does
    not put faulty GPUs back into the pool, an outage longer than max_age_s does, as the
    nodes' own allocatable is then the only evidence left.
    """

    def __init__(self, settings: PrometheusSettings, *,
                 clock: samples.Clock = samples.wall_clock) -> None:
        self.settings = settings
        self.queries = dcgm_telemetry_queries(settings.dcgm.health_window)
        self.stats = samples.SourceStats()
        self._clock = clock
        self._reading: gpus.GpuTelemetry | None = None
        self._client: PrometheusConnect | None = None
        self._failures = failures.PollFailures(self.stats, what="DCGM queries", logger=log)

    def latest(self) -> gpus.GpuTelemetry | None:
        reading = self._reading
        if reading is None or self._clock() - reading.at > self.settings.dcgm.max_age_s:
            return None
        return reading

    async def poll(self) -> gpus.GpuTelemetry | None:
        """One reading (kept for `latest`), or None when a query failed (counted, logged)."""
        if self._client is None:
            self._client = PrometheusSource._make_client(self.settings)
        client = self._client
        at = self._clock()
        queries = (self.queries.xid, self.queries.dbe, self.queries.sm_active)
        try:
            xid, dbe, sm_active = await asyncio.gather(
                *(asyncio.to_thread(client.custom_query, q) for q in queries))
        except Exception as error:  # HTTP errors, timeouts, refused connections, bad JSON
            self.stats.error(type(error).__name__)
            self._failures.failed("dcgm", error, now=at, detail="GPU telemetry")
            return None
        self._failures.succeeded("dcgm")
        self.stats.accepted += 1
        self._reading = gpu_telemetry(at=at, xid=xid, dbe=dbe, sm_active=sm_active)
        return self._reading

    def close(self) -> None:
        """Release the HTTP connections; a later poll opens new ones."""
        client, self._client = self._client, None
        if client is not None:
            client.close()

    async def run(self) -> None:
        try:
            while True:
                await self.poll()
                await asyncio.sleep(self.settings.dcgm.interval_s)
        finally:
            self.close()


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
