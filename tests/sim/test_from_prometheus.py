"""`simulate --from-prometheus`: a trace rebuilt from a real Prometheus with a known history."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from scaler import cli
from scaler.sim import from_prometheus, traces
from scaler.testing import prometheus_server

from .conftest import REPO

STEP_S = 15.0
INTERVALS = 40  # 10 minutes of 15 s scrapes
BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)  # vLLM's 1-2-5 series
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
COUNTERS_ONLY = "counters-only"
SGLANG_MODEL = "qwen-sglang"
SGLANG_COUNTERS = "qwen-sglang-counters"
TGI_SERVICE = "tgi-mistral"


@dataclass(frozen=True)
class Names:
    """A server's metric names as it exports them (checked against each project's source,
    not taken from the module under test, so a wrong name in a preset fails here)."""

    requests: str
    prompt_tokens: str | None
    generation_tokens: str | None
    prompt_histogram: str
    generation_histogram: str
    buckets: tuple[float, ...]
    counter_type: str = "counter"


VLLM = Names("vllm:request_success_total", "vllm:prompt_tokens_total",
             "vllm:generation_tokens_total", "vllm:request_prompt_tokens",
             "vllm:request_generation_tokens", BUCKETS)
# SGLang's default token buckets (collector.py), from 100 tokens.
SGLANG = Names("sglang:num_requests_total", "sglang:prompt_tokens_total",
               "sglang:generation_tokens_total", "sglang:prompt_tokens_histogram",
               "sglang:generation_tokens_histogram",
               (100, 300, 500, 700, 1000, 1500, 2000, 3000, 4000, 5000))
# TGI: no token counters; linear buckets of max_total_tokens / 100 (4,096 here); its
# counter has no `_total` (metrics-rs), which OpenMetrics requires of a counter family.
TGI = Names("tgi_request_success", None, None, "tgi_request_input_length",
            "tgi_request_generated_tokens",
            tuple(round(4096 / 100 * (k + 1), 2) for k in range(100)), counter_type="unknown")


@dataclass
class Pod:
    """One server replica's cumulative metrics, advanced one scrape interval at a time."""

    model: str
    instance: str
    names: Names = VLLM
    # The label that carries the model: TGI has none; the scrape adds `service`.
    model_label: str = "model_name"
    requests: int = 0
    tokens: dict[str, int] = field(default_factory=lambda: {"prompt": 0, "generation": 0})
    buckets: dict[str, list[int]] = field(default_factory=dict)
    lines: dict[str, list[str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.buckets = {kind: [0] * (len(self.names.buckets) + 1)
                        for kind in ("prompt", "generation")}

    def finish(self, kind: str, lengths: list[int]) -> None:
        self.tokens[kind] += sum(lengths)
        for length in lengths:
            for k, bound in enumerate((*self.names.buckets, float("inf"))):
                if length <= bound:  # per bucket here; `sample` writes them cumulative
                    self.buckets[kind][k] += 1
                    break

    def restart(self) -> None:
        fresh = Pod(self.model, self.instance, self.names, self.model_label)
        self.requests, self.tokens, self.buckets = fresh.requests, fresh.tokens, fresh.buckets

    def sample(self, t: float, *, histograms: bool) -> None:
        labels = f'{self.model_label}="{self.model}",instance="{self.instance}"'
        names = self.names

        def add(name: str, value: float, extra: str = "") -> None:
            self.lines.setdefault(name, []).append(f"{{{extra}{labels}}} {value} {t:.3f}")

        add(names.requests, self.requests)
        for kind, counter in (("prompt", names.prompt_tokens),
                              ("generation", names.generation_tokens)):
            if counter is not None:
                add(counter, self.tokens[kind])
        if not histograms:
            return
        for kind, name in (("prompt", names.prompt_histogram),
                           ("generation", names.generation_histogram)):
            cumulative = 0
            for k, bound in enumerate((*names.buckets, "+Inf")):
                cumulative += self.buckets[kind][k]
                add(f"{name}_bucket", cumulative, f'le="{bound}",')
            add(f"{name}_count", cumulative)
            add(f"{name}_sum", self.tokens[kind])


@dataclass
class History:
    """The known truth: per interval, requests and their total prompt/output tokens."""

    start_s: float
    requests: np.ndarray
    prompt: np.ndarray
    generation: np.ndarray


def _write_history(path: Path, *, start_s: float) -> dict[str, History]:
    """OpenMetrics for two vLLM pods of MODEL (one restarts halfway), one pod of a model
    exporting counters only, two SGLang pods, an SGLang pod of a model exporting counters
    only (as SGLang does without --collect-tokens-histogram) and a TGI pod; returns the
    truth per model."""
    rng = np.random.default_rng(7)
    pods = [Pod(MODEL, "pod-a:8000"), Pod(MODEL, "pod-b:8000"),
            Pod(COUNTERS_ONLY, "pod-c:8000"),
            Pod(SGLANG_MODEL, "pod-s:30000", SGLANG), Pod(SGLANG_MODEL, "pod-r:30000", SGLANG),
            Pod(SGLANG_COUNTERS, "pod-q:30000", SGLANG),
            Pod(TGI_SERVICE, "pod-t:80", TGI, model_label="service")]
    truth = {m: History(start_s, np.zeros(INTERVALS + 1, np.int64),
                        np.zeros(INTERVALS + 1, np.int64), np.zeros(INTERVALS + 1, np.int64))
             for m in (MODEL, COUNTERS_ONLY, SGLANG_MODEL, SGLANG_COUNTERS, TGI_SERVICE)}
    for i in range(INTERVALS + 1):
        t = start_s + i * STEP_S
        for p, pod in enumerate(pods):
            if i > 0:
                if p == 1 and i == INTERVALS // 2:
                    pod.restart()  # its counters start again from 0 at this scrape
                # A load ramp: 2 to 14 requests per pod per 15 s, lengths long-tailed.
                n = int(2 + (i * (p + 1)) % 13)
                prompt = [int(x) for x in rng.lognormal(6.0, 0.8, n).clip(1, 4000)]
                output = [int(x) for x in rng.lognormal(5.0, 0.6, n).clip(1, 1500)]
                pod.requests += n
                pod.finish("prompt", prompt)
                pod.finish("generation", output)
                history = truth[pod.model]
                history.requests[i] += n
                history.prompt[i] += sum(prompt)
                history.generation[i] += sum(output)
            pod.sample(t, histograms=pod.model not in (COUNTERS_ONLY, SGLANG_COUNTERS))
    families: dict[str, str] = {}
    for names in (VLLM, SGLANG, TGI):
        families[names.requests] = names.counter_type
        families.update({counter: "counter" for counter in
                         (names.prompt_tokens, names.generation_tokens) if counter})
        families.update({names.prompt_histogram: "histogram",
                         names.generation_histogram: "histogram"})
    text: list[str] = []
    for family, kind in families.items():
        # OpenMetrics names a counter family without `_total`; its samples keep it.
        text.append(f"# TYPE {family.removesuffix('_total')} {kind}")
        names = [family] if kind != "histogram" else [
            f"{family}_{suffix}" for suffix in ("bucket", "count", "sum")]
        for name in names:
            for pod in pods:  # each series' samples in time order, series after series
                text.extend(name + line for line in pod.lines.get(name, []))
    path.write_text("\n".join([*text, "# EOF", ""]))
    return truth


@pytest.fixture(scope="module")
def backfilled(tmp_path_factory: pytest.TempPathFactory
               ) -> Iterator[tuple[prometheus_server.PrometheusServer, dict[str, History]]]:
    """A real Prometheus whose TSDB holds 10 minutes of known vLLM history from 2 h ago."""
    promtool = shutil.which("promtool")
    if promtool is None or prometheus_server.prometheus_binary() is None:
        pytest.skip("needs `promtool` and `prometheus` (apt-get install prometheus)")
    start_s = (time.time() // 3600 - 2) * 3600.0  # a whole hour, 2 to 3 h ago
    metrics = tmp_path_factory.mktemp("history") / "history.om"
    truth = _write_history(metrics, start_s=start_s)
    server = prometheus_server.PrometheusServer(targets=[])
    subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(metrics),
                    str(server.dir / "data")], check=True, capture_output=True, timeout=60)
    server.start()
    try:
        yield server, truth
    finally:
        server.close()


def _rebuild(prom: prometheus_server.PrometheusServer, model: str, history: History,
             seed: int = 0, **preset: str) -> traces.Trace:
    return from_prometheus.load(prom.url, model, start_s=history.start_s,
                                end_s=history.start_s + INTERVALS * STEP_S, step_s=STEP_S,
                                seed=seed, **preset)


def _per_interval(trace: traces.Trace, values: np.ndarray) -> np.ndarray:
    """Sum of `values` over the requests of each interval (arrivals in (t_(i-1), t_i])."""
    index = np.floor(trace.arrival_s / STEP_S).astype(np.int64) + 1
    return np.bincount(index, weights=values, minlength=INTERVALS + 1)


def _assert_matches(trace: traces.Trace, history: History) -> None:
    """Requests per interval exactly; each interval's mean lengths within rounding (half a
    token per request)."""
    counts = _per_interval(trace, np.ones(trace.requests))
    np.testing.assert_array_equal(counts, history.requests)
    busy = history.requests > 0
    for drawn, true in ((trace.input_tokens, history.prompt),
                        (trace.output_tokens, history.generation)):
        means = _per_interval(trace, drawn.astype(np.float64))[busy] / counts[busy]
        np.testing.assert_allclose(means, true[busy] / history.requests[busy], atol=0.5)


def test_counts_per_interval_and_mean_lengths_match_the_history(
    backfilled: tuple[prometheus_server.PrometheusServer, dict[str, History]],
) -> None:
    prom, truth = backfilled
    history = truth[MODEL]
    trace = _rebuild(prom, MODEL, history)
    # Counts across both pods and through pod-b's counter reset; lengths drawn within the
    # buckets and shifted to the histogram's _sum.
    _assert_matches(trace, history)
    assert trace.start_s == history.start_s
    assert np.all(np.diff(trace.arrival_s) >= 0)
    # Not all one value: the buckets' spread survives (true prompts span 50 to 2,000+).
    assert np.percentile(trace.input_tokens, 90) > 3 * np.percentile(trace.input_tokens, 10)
    assert "histograms' buckets" in trace.length_source
    again = _rebuild(prom, MODEL, history)
    np.testing.assert_array_equal(again.arrival_s, trace.arrival_s)
    np.testing.assert_array_equal(again.input_tokens, trace.input_tokens)
    other = _rebuild(prom, MODEL, history, seed=1)
    assert not np.array_equal(other.arrival_s, trace.arrival_s)


def test_without_histograms_lengths_are_the_counters_mean_per_interval(
    backfilled: tuple[prometheus_server.PrometheusServer, dict[str, History]],
) -> None:
    prom, truth = backfilled
    history = truth[COUNTERS_ONLY]
    trace = _rebuild(prom, COUNTERS_ONLY, history)
    # Exact here because this history counts tokens when requests finish.
    _assert_matches(trace, history)
    assert "token counters" in trace.length_source


def test_sglang_history_from_its_histograms_or_its_counters(
    backfilled: tuple[prometheus_server.PrometheusServer, dict[str, History]],
) -> None:
    prom, truth = backfilled
    history = truth[SGLANG_MODEL]
    trace = _rebuild(prom, SGLANG_MODEL, history, preset="sglang")
    _assert_matches(trace, history)
    assert "histograms' buckets" in trace.length_source
    assert "sglang" in trace.path
    # SGLang counts tokens when a request finishes, so the counters' means are exact.
    counters = _rebuild(prom, SGLANG_COUNTERS, truth[SGLANG_COUNTERS], preset="sglang")
    _assert_matches(counters, truth[SGLANG_COUNTERS])
    assert "token counters" in counters.length_source
    # The vLLM names find nothing for this model, and say where to look.
    with pytest.raises(from_prometheus.PrometheusHistoryError, match="--preset"):
        _rebuild(prom, SGLANG_MODEL, history)


def test_tgi_history_is_selected_by_a_label_the_scrape_adds(
    backfilled: tuple[prometheus_server.PrometheusServer, dict[str, History]],
) -> None:
    prom, truth = backfilled
    history = truth[TGI_SERVICE]
    trace = _rebuild(prom, TGI_SERVICE, history, preset="tgi", model_label="service")
    # Exact means: the histograms' _sum stand in for the token counters TGI lacks.
    _assert_matches(trace, history)
    assert "histograms' buckets" in trace.length_source
    with pytest.raises(from_prometheus.PrometheusHistoryError, match="--model-label"):
        _rebuild(prom, TGI_SERVICE, history, preset="tgi")


def test_cli_replays_the_rebuilt_trace_under_the_strategies(
    backfilled: tuple[prometheus_server.PrometheusServer, dict[str, History]],
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    prom, truth = backfilled
    history = truth[MODEL]
    out = tmp_path / "out.json"
    end = history.start_s + INTERVALS * STEP_S
    code = cli.main([
        "simulate", "--from-prometheus", prom.url, "--model", MODEL,
        "--start", str(history.start_s), "--end", str(end),
        "--policy", str(REPO / "config" / "llama-8b.yaml"),
        "--strategies", "scaler,hpa", "--json", str(out),
    ])
    assert code == 0, capsys.readouterr().err
    document = json.loads(out.read_text())
    assert list(document["strategies"]) == ["scaler", "hpa"]
    assert f"{int(history.requests.sum())} requests" in capsys.readouterr().out


def test_cli_rejects_bad_prometheus_input_with_exit_code_2(
    backfilled: tuple[prometheus_server.PrometheusServer, dict[str, History]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    prom, truth = backfilled
    start = truth[MODEL].start_s
    base = ["simulate", "--from-prometheus", prom.url,
            "--policy", str(REPO / "config" / "llama-8b.yaml")]
    assert cli.main([*base, "--model", "no-such-model", "--start", str(start),
                     "--end", str(start + 600)]) == 2
    assert 'model_name="no-such-model"' in capsys.readouterr().err
    # --preset and --model-label reach the loader: the SGLang names under `service`.
    assert cli.main([*base, "--model", MODEL, "--start", str(start), "--end",
                     str(start + 600), "--preset", "sglang", "--model-label", "service"]) == 2
    assert f'sglang:num_requests_total{{service="{MODEL}"}}' in capsys.readouterr().err
    assert cli.main([*base, "--model", MODEL, "--start", "yesterday",
                     "--end", str(start)]) == 2
    assert "--start 'yesterday'" in capsys.readouterr().err
    assert cli.main([*base, "--model", MODEL, "--start", str(start)]) == 2
    assert "needs --model, --start and --end" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exits:
        cli.main([*base, "--trace", "x.csv", "--model", MODEL])
    assert exits.value.code == 2
