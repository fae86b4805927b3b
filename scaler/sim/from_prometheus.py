"""Rebuild an arrival trace from a vLLM, SGLang or TGI deployment's Prometheus history."""

from __future__ import annotations

import datetime as dt
import json
import math
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from scaler.signals import prometheus as prometheus_signals
from scaler.sim import traces


@dataclass(frozen=True, slots=True)
class Preset:
    """One server's metric names for a history: a counter of finished requests, the
    per-request token histograms (bucket bounds are read from the data), and counters of
    tokens, the fallback when there are no buckets."""

    name: str
    requests: str
    prompt_histogram: str
    generation_histogram: str
    prompt_tokens: str
    generation_tokens: str


PRESETS: dict[str, Preset] = {preset.name: preset for preset in (
    # docs.vllm.ai "Production Metrics". Its token counters count tokens as they are
    # processed, not when the request finishes (hence only the fallback).
    Preset("vllm", requests="vllm:request_success_total",
           prompt_histogram="vllm:request_prompt_tokens",
           generation_histogram="vllm:request_generation_tokens",
           prompt_tokens="vllm:prompt_tokens_total",
           generation_tokens="vllm:generation_tokens_total"),
    # SGLang's TokenizerMetricsCollector (python/sglang/srt/metrics/collector.py, label
    # model_name): num_requests_total and both token counters grow when a request
    # finishes; the token histograms exist only with --collect-tokens-histogram.
    Preset("sglang", requests="sglang:num_requests_total",
           prompt_histogram="sglang:prompt_tokens_histogram",
           generation_histogram="sglang:generation_tokens_histogram",
           prompt_tokens="sglang:prompt_tokens_total",
           generation_tokens="sglang:generation_tokens_total"),
    # TGI's router (docs/source/reference/metrics.md; metrics-rs names counters without
    # `_total`): tgi_request_success counts successes (tgi_request_count counts every
    # request received); it has no token counters, so the histograms' _sum stand in.
    # Its series carry no model label: select with one the scrape adds (--model-label).
    Preset("tgi", requests="tgi_request_success",
           prompt_histogram="tgi_request_input_length",
           generation_histogram="tgi_request_generated_tokens",
           prompt_tokens="tgi_request_input_length_sum",
           generation_tokens="tgi_request_generated_tokens_sum"),
)}
DEFAULT_PRESET = "vllm"
# The label that names the model, as a policy's `sources.prometheus.modelLabel` defaults.
MODEL_LABEL = "model_name"

DEFAULT_STEP_S = 15.0
"""15 s: the usual scrape interval, so each interval holds about one new sample per series."""
QUERY_TIMEOUT_S = 30.0
MAX_POINTS = 11_000
"""Prometheus refuses a range query of more than 11,000 points per series; a day at 15 s
steps is 5,760, so longer windows need a larger --step (the error says which)."""

Series = dict[float, float]  # step timestamp (epoch s) -> sample value


class PrometheusHistoryError(ValueError):
    """Prometheus could not be read or holds no usable history; names the URL and query."""


def parse_time(value: str, *, flag: str) -> float:
    """Epoch seconds from epoch seconds ('1733050000') or RFC 3339 ('2026-12-01T10:00:00Z')."""
    try:
        return float(value)
    except ValueError:
        pass
    try:
        parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise PrometheusHistoryError(
            f"{flag} {value!r} is neither epoch seconds nor RFC 3339 "
            "(e.g. 2026-12-01T10:00:00Z)") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=dt.UTC)
    return parsed.timestamp()


def query_range(url: str, promql: str, *, start_s: float, end_s: float,
                step_s: float) -> list[tuple[dict[str, str], Series]]:
    """Each series of a range query as (labels, {timestamp: value}) (Prometheus HTTP API)."""
    params = urllib.parse.urlencode(
        {"query": promql, "start": f"{start_s:.3f}", "end": f"{end_s:.3f}", "step": f"{step_s:g}"})
    endpoint = f"{url.rstrip('/')}/api/v1/query_range?{params}"
    try:
        with urllib.request.urlopen(endpoint, timeout=QUERY_TIMEOUT_S) as response:
            body = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace")[:300]
        raise PrometheusHistoryError(
            f"{url}: query {promql!r} failed: HTTP {exc.code} {detail}") from None
    except (urllib.error.URLError, OSError, json.JSONDecodeError) as exc:
        raise PrometheusHistoryError(f"{url}: query {promql!r} failed: {exc}") from None
    if body.get("status") != "success" or body.get("data", {}).get("resultType") != "matrix":
        raise PrometheusHistoryError(f"{url}: query {promql!r} answered {str(body)[:300]}")
    return [({str(k): str(v) for k, v in item["metric"].items()},
             {float(t): float(v) for t, v in item["values"]})
            for item in body["data"]["result"]]


def increments(series: Series, steps: np.ndarray) -> np.ndarray:
    """A counter's increase in each interval (steps[i-1], steps[i]] for i >= 1 (index 0 is 0).

    A drop is a restart (the counter began again at 0), so the increase is the new value,
    as Prometheus's increase() counts it. A step with no sample adds nothing; its increase
    lands in the next step that has one. The first sample is the baseline: a pod that
    started inside the window and served 40 requests before its first sample loses them.
    """
    out = np.zeros(steps.size, dtype=np.float64)
    previous: float | None = None
    for index, step in enumerate(steps):
        value = series.get(float(step))
        if value is None:
            continue
        if previous is not None:
            out[index] = value - previous if value >= previous else value
        previous = value
    return out


def _counter(url: str, metric: str, sel: str, steps: np.ndarray, step_s: float) -> np.ndarray:
    """Per-interval increase of `metric` summed over its series (pods, finish reasons)."""
    total = np.zeros(steps.size, dtype=np.float64)
    for _, series in query_range(url, metric + sel, start_s=float(steps[0]),
                                 end_s=float(steps[-1]), step_s=step_s):
        total += increments(series, steps)
    return total


@dataclass(frozen=True)
class Histogram:
    """Per-interval bucket counts of a histogram: `counts[i, k]` requests in interval i with
    a length in (bounds[k-1], bounds[k]] (bounds[-1] is +Inf), and `sums[i]` their tokens."""

    bounds: np.ndarray
    counts: np.ndarray
    sums: np.ndarray


def _histogram(url: str, metric: str, sel: str, steps: np.ndarray,
               step_s: float) -> Histogram | None:
    """The interval histograms of `metric`, or None when Prometheus has no buckets for it."""
    by_le: dict[float, np.ndarray] = {}
    for labels, series in query_range(url, f"{metric}_bucket{sel}", start_s=float(steps[0]),
                                      end_s=float(steps[-1]), step_s=step_s):
        le = float(labels.get("le", "nan"))
        if math.isnan(le):
            continue
        by_le[le] = by_le.get(le, np.zeros(steps.size)) + increments(series, steps)
    if not by_le:
        return None
    bounds = np.asarray(sorted(by_le), dtype=np.float64)
    cumulative = np.stack([by_le[b] for b in bounds], axis=1)
    # Buckets are cumulative (le = "less or equal"): bucket k alone is le_k - le_(k-1).
    counts = np.clip(np.diff(cumulative, axis=1, prepend=0.0), 0.0, None)
    return Histogram(bounds, counts,
                     _counter(url, f"{metric}_sum", sel, steps, step_s))


def apportion(weights: np.ndarray, total: int) -> np.ndarray:
    """`total` whole items split in proportion to `weights` (largest remainder, stable ties).

    Example: weights [3, 1], total 6 -> [4.5, 1.5] -> floors [4, 1], one left, to the
    larger remainder (tie: the first) -> [5, 1].
    """
    if total <= 0 or weights.sum() <= 0:
        return np.zeros(weights.size, dtype=np.int64)
    exact = weights / weights.sum() * total
    whole: traces.IntArray = np.floor(exact).astype(np.int64)
    left = total - int(whole.sum())
    order = np.argsort(-(exact - whole), kind="stable")
    whole[order[:left]] += 1
    return whole


def _fit_to_total(low: np.ndarray, width: np.ndarray, u: np.ndarray,
                  target: float) -> np.ndarray:
    """Lengths low + width * clip(u + d, 0, 1) with the shift d (bisection) that makes their
    sum `target` where the buckets allow it, so the interval keeps its true token count."""
    def lengths(shift: float) -> np.ndarray:
        result: np.ndarray = low + width * np.clip(u + shift, 0.0, 1.0)
        return result

    lo, hi = -1.0, 1.0
    for _ in range(50):  # 2 / 2^50: far below one token
        mid = (lo + hi) / 2
        if lengths(mid).sum() < target:
            lo = mid
        else:
            hi = mid
    return lengths((lo + hi) / 2)


def draw_lengths(n: int, *, histogram: Histogram | None, interval: int, mean: float,
                 rng: np.random.Generator) -> np.ndarray:
    """`n` token lengths for one interval: bucket counts apportioned to n requests, each
    placed uniformly within its bucket and shifted so the total matches the histogram's
    `_sum` (scaled to n); the counters' mean tokens per request when there are no buckets.

    The +Inf bucket has no upper bound: its lengths lie in (last bound, 2 x last bound].
    """
    counts = histogram.counts[interval] if histogram is not None else np.zeros(0)
    if histogram is None or counts.sum() <= 0:
        return np.full(n, max(1, round(mean)), dtype=np.int64)
    per_bucket = apportion(counts, n)
    uppers = histogram.bounds.copy()
    lowers = np.concatenate([[0.0], uppers[:-1]])
    if math.isinf(uppers[-1]):
        uppers[-1] = 2.0 * max(lowers[-1], 1.0)
    low = np.repeat(lowers, per_bucket)
    width = np.repeat(uppers - lowers, per_bucket)
    target = float(histogram.sums[interval]) * n / float(counts.sum())
    values = _fit_to_total(low, width, rng.uniform(size=n), target)
    drawn: traces.IntArray = np.maximum(1, np.rint(values)).astype(np.int64)
    return drawn[rng.permutation(n)]


def load(url: str, model: str, *, start_s: float, end_s: float, step_s: float = DEFAULT_STEP_S,
         seed: int = 0, preset: str = DEFAULT_PRESET, model_label: str = MODEL_LABEL
         ) -> traces.Trace:
    """The trace of `model`'s requests between start_s and end_s (epoch seconds), from
    the metric names of `preset` (PRESETS), the series whose `model_label` is `model`.

    Per step interval (steps[i-1], steps[i]]: count = increase of the finished-request
    counter (rounded); arrivals uniform within the interval (Prometheus only knows how
    many finished in it, not when, nor when they arrived); input and output lengths from
    the interval's token histograms (see `draw_lengths`). Deterministic for `seed`.
    """
    if not (math.isfinite(step_s) and step_s > 0):
        raise PrometheusHistoryError(f"--step must be a positive number of seconds, got {step_s}")
    if not (math.isfinite(start_s) and math.isfinite(end_s) and end_s > start_s):
        raise PrometheusHistoryError(f"--end ({end_s}) must be after --start ({start_s})")
    points = math.floor((end_s - start_s) / step_s) + 1
    if points > MAX_POINTS:
        raise PrometheusHistoryError(
            f"{points} steps of {step_s:g} s exceed Prometheus's {MAX_POINTS} points per "
            f"query: use --step {math.ceil((end_s - start_s) / (MAX_POINTS - 1))} or more")
    names = PRESETS.get(preset)
    if names is None:
        raise PrometheusHistoryError(f"--preset {preset!r}: choose from {', '.join(PRESETS)}")
    steps = start_s + step_s * np.arange(points, dtype=np.float64)
    sel = prometheus_signals.selector({model_label: model})
    requests = np.rint(_counter(url, names.requests, sel, steps, step_s)).astype(np.int64)
    if requests.sum() == 0:
        hint = (" (TGI's series have no model label: pass --model-label with one your "
                "scrape adds, e.g. job or service)" if preset == "tgi" else "")
        raise PrometheusHistoryError(
            f"{url}: no increase of {names.requests}{sel} between {start_s:.0f} and "
            f"{end_s:.0f} (check --preset, --model against the {model_label} label, and "
            f"the time range){hint}")
    lengths = _lengths_per_interval(url, sel, steps, step_s, requests=requests, names=names)
    rng = np.random.default_rng(seed)
    arrivals: list[np.ndarray] = []
    inputs: list[np.ndarray] = []
    outputs: list[np.ndarray] = []
    for index in np.flatnonzero(requests):
        n = int(requests[index])
        arrivals.append(np.sort(rng.uniform(steps[index - 1], steps[index], size=n)) - start_s)
        for out, (histogram, means) in zip((inputs, outputs), lengths, strict=True):
            out.append(draw_lengths(n, histogram=histogram, interval=int(index),
                                    mean=float(means[index]), rng=rng))
    source = ("lengths from the token histograms' buckets" if lengths[0][0] is not None
              else "lengths: mean tokens per request from the token counters")
    return traces.Trace(f"{url} {preset} model {model}", np.concatenate(arrivals),
                        np.concatenate(inputs), np.concatenate(outputs), start_s=start_s,
                        length_source=f"rebuilt from Prometheus at {step_s:g} s steps; {source}")


def _lengths_per_interval(
    url: str, sel: str, steps: np.ndarray, step_s: float, *, requests: np.ndarray,
    names: Preset,
) -> tuple[tuple[Histogram | None, np.ndarray], tuple[Histogram | None, np.ndarray]]:
    """(histogram or None, mean tokens per request per interval) for prompts and outputs.

    The means come from the token counters, which (vLLM's) count tokens when processed
    rather than when the request finished, so they are the fallback only when there
    are no buckets.
    """
    result: list[tuple[Histogram | None, np.ndarray]] = []
    pairs: Mapping[str, str] = {names.prompt_histogram: names.prompt_tokens,
                                names.generation_histogram: names.generation_tokens}
    for histogram_name, counter_name in pairs.items():
        histogram = _histogram(url, histogram_name, sel, steps, step_s)
        means = np.zeros(steps.size)
        if histogram is None:
            tokens = _counter(url, counter_name, sel, steps, step_s)
            if tokens.sum() <= 0:
                raise PrometheusHistoryError(
                    f"{url}: neither {histogram_name}_bucket{sel} nor {counter_name}{sel} "
                    "has history: no token lengths to rebuild")
            # An interval with requests but no tokens counted borrows the window's mean.
            overall = tokens.sum() / max(requests.sum(), 1.0)
            means = np.where(requests > 0, tokens / np.maximum(requests, 1.0), overall)
            means = np.where(means > 0, means, overall)
        result.append((histogram, means))
    return result[0], result[1]
