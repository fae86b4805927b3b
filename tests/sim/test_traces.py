"""Trace loaders: published statistics, formats, errors with line and column, rate scaling."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from scaler.sim import traces

from .conftest import BUNDLED


def _stats(trace: traces.Trace) -> dict[str, float]:
    per_minute = trace.per_minute()
    return {
        "requests": trace.requests,
        "duration_s": round(trace.duration_s),
        "peak_per_min": int(per_minute.max()),
        "empty_minutes": int((per_minute == 0).sum()),
        "in_mean": round(float(trace.input_tokens.mean())),
        "in_median": round(float(np.median(trace.input_tokens))),
        "in_p99": round(float(np.percentile(trace.input_tokens, 99))),
        "out_mean": round(float(trace.output_tokens.mean())),
        "out_median": round(float(np.median(trace.output_tokens))),
        "out_p99": round(float(np.percentile(trace.output_tokens, 99))),
    }


@pytest.mark.parametrize(("name", "expected"), [
    ("code", {"requests": 8819, "duration_s": 3436, "peak_per_min": 632, "empty_minutes": 12,
              "in_mean": 2048, "in_median": 1469, "in_p99": 7436,
              "out_mean": 28, "out_median": 13, "out_p99": 251}),
    ("conv", {"requests": 19366, "duration_s": 3502, "peak_per_min": 507, "empty_minutes": 0,
              "in_mean": 1155, "in_median": 1020, "in_p99": 4142,
              "out_mean": 211, "out_median": 129, "out_p99": 601}),
])
def test_azure_statistics_match_the_published_table(
    shared_traces: Path, name: str, expected: dict[str, float]
) -> None:
    # shared/traces/README.md: code 8,819 requests over 3,436 s, peak 632 req/min, 12
    # empty minutes, input mean 2,048 / median 1,469 / p99 7,436, output 28 / 13 / 252
    # (p99 251.46 with numpy's linear interpolation, which the README rounds up).
    trace = traces.load_trace(shared_traces / "azure_llm_2023" /
                              f"AzureLLMInferenceTrace_{name}.csv")
    stats = _stats(trace)
    assert stats == expected
    assert stats["requests"] / trace.duration_s == pytest.approx(
        {"code": 2.57, "conv": 5.53}[name], abs=0.005)


def test_servegen_summed_rate_matches_the_published_mean(shared_traces: Path) -> None:
    # README: 162 clients, summed mean 11,751 req/min. Drawn at 1 % of the rate (23.5k
    # requests a day) for the first day only, the count is 1 % of 11,751 x 1,440 minutes
    # times the first day's share; compare against the windows' own expected count.
    folder = shared_traces / "servegen_m_large"
    expected = 0.0
    for file in traces.servegen_files(folder):
        for window in traces.iter_servegen_windows(file):
            if window.start_s < 86400:
                expected += window.rate * traces.SERVEGEN_WINDOW_S * 0.01
    files = traces.servegen_files(folder)
    assert len(files) == 162
    trace = traces.load_servegen(folder, rate_scale=0.01, seed=3, max_duration_s=86400)
    assert trace.requests == pytest.approx(expected, rel=0.03)
    assert trace.duration_s == pytest.approx(86400, rel=0.01)
    # Token lengths come from the ShareGPT stats beside the folder (input mean 2,340).
    assert float(trace.input_tokens.mean()) == pytest.approx(2340, rel=0.05)


def test_bundled_slice_is_the_first_twenty_minutes_of_azure_code() -> None:
    trace = traces.load_trace(BUNDLED / "AzureLLMInferenceTrace_code_20min.csv")
    assert trace.requests == 3628
    assert trace.duration_s < 1200
    assert trace.start_s > 1.7e9  # 2023-11-16, read as UTC epoch seconds
    assert (BUNDLED / "LICENSE-AzurePublicDataset-CC-BY-4.0").is_file()


def test_plain_csv_and_mooncake_load_the_same_requests(tmp_path: Path) -> None:
    plain = tmp_path / "t.csv"
    plain.write_text("timestamp_s,input_tokens,output_tokens\n10.5,100,20\n10.0,50,5\n\n12,7,1\n")
    mooncake = tmp_path / "t.jsonl"
    mooncake.write_text("\n".join(json.dumps(r) for r in [
        {"timestamp": 10500, "input_length": 100, "output_length": 20, "hash_ids": [1, 2]},
        {"timestamp": 10000, "input_length": 50, "output_length": 5},
        {"timestamp": 12000, "input_length": 7, "output_length": 1},
    ]) + "\n")
    assert traces.sniff(plain) == "csv"
    assert traces.sniff(mooncake) == "mooncake"
    for path in (plain, mooncake):
        trace = traces.load_trace(path)
        assert trace.arrival_s.tolist() == [0.0, 0.5, 2.0]
        assert trace.input_tokens.tolist() == [50, 100, 7]
        assert trace.output_tokens.tolist() == [5, 20, 1]
        assert trace.start_s == 10.0


def test_sniff_recognises_each_format() -> None:
    assert traces.sniff(BUNDLED / "AzureLLMInferenceTrace_conv_20min.csv") == "azure"
    assert traces.sniff(BUNDLED / "servegen_m_large_sample") == "servegen"
    assert traces.sniff(BUNDLED / "servegen_m_large_sample" / "chunk-0-trace.csv") == "servegen"


@pytest.mark.parametrize(("name", "text", "line", "column"), [
    ("azure.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                  "2023-11-16 18:17:03.97,10,1\n2023-11-16 18:17:04.0,ten,1\n",
     3, "ContextTokens"),
    ("azure.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16T18:17,1,1\n",
     2, "TIMESTAMP"),
    ("plain.csv", "timestamp_s,input_tokens,output_tokens\n1,2,3\n2,-4,3\n", 3, "input_tokens"),
    ("plain.csv", "timestamp_s,input_tokens,output_tokens\n1,2,3\nnan,4,3\n", 3, "timestamp_s"),
    ("plain.csv", "timestamp_s,input_tokens,output_tokens\n1,2.5,3\n", 2, "input_tokens"),
    ("m.jsonl", '{"timestamp": 1, "input_length": 2, "output_length": 3}\n{"timestamp": 2,\n',
     2, "char 17"),
    ("m.jsonl", '{"timestamp": 1, "input_length": 2}\n', 1, "output_length"),
    ("m.jsonl", '{"timestamp": "x", "input_length": 2, "output_length": 3}\n', 1, "timestamp"),
])
def test_malformed_rows_name_line_and_column(
    tmp_path: Path, name: str, text: str, line: int, column: str
) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(traces.TraceError) as caught:
        traces.load_trace(path)
    assert caught.value.line == line
    assert caught.value.column == column
    assert f"{path}:{line}" in str(caught.value)


def test_unknown_format_and_missing_header_are_clear(tmp_path: Path) -> None:
    odd = tmp_path / "odd.csv"
    odd.write_text("a,b\n1,2\n")
    with pytest.raises(traces.TraceError, match="unknown trace format"):
        traces.load_trace(odd)
    with pytest.raises(traces.TraceError, match="header lacks TIMESTAMP, ContextTokens"):
        traces.load_trace(odd, "azure")
    with pytest.raises(traces.TraceError, match="no such file"):
        traces.load_trace(tmp_path / "absent.csv")


def test_rate_scaling_superposes_shifted_copies_without_compressing_time() -> None:
    trace = traces.load_trace(BUNDLED / "AzureLLMInferenceTrace_code_20min.csv")
    scaled = traces.scale_rate(trace, 3.0, seed=7)
    assert scaled.requests == 3 * trace.requests
    # Time is not compressed: same span; every original request is still there.
    assert scaled.duration_s <= trace.duration_s
    assert scaled.duration_s == pytest.approx(trace.duration_s, rel=0.01)
    assert np.isin(trace.arrival_s, scaled.arrival_s).all()
    # Per-minute counts triple on average but keep bursts (max/mean stays high, unlike
    # a 3x time compression which would triple the duration's burst rate per minute).
    assert scaled.per_minute().sum() == 3 * trace.per_minute().sum()
    assert sorted(scaled.input_tokens.tolist()) == sorted(trace.input_tokens.tolist() * 3)
    # Deterministic per seed, different across seeds.
    again = traces.scale_rate(trace, 3.0, seed=7)
    other = traces.scale_rate(trace, 3.0, seed=8)
    assert np.array_equal(again.arrival_s, scaled.arrival_s)
    assert not np.array_equal(other.arrival_s, scaled.arrival_s)
    assert scaled.rate_scale == 3.0


def test_rate_scaling_thins_below_one_and_mixes_fractions() -> None:
    trace = traces.load_trace(BUNDLED / "AzureLLMInferenceTrace_conv_20min.csv")
    thin = traces.scale_rate(trace, 0.25, seed=1)
    assert thin.requests == pytest.approx(0.25 * trace.requests, rel=0.06)
    assert np.isin(thin.arrival_s + thin.start_s,
                   trace.arrival_s + trace.start_s).all()
    mixed = traces.scale_rate(trace, 2.5, seed=1)
    assert mixed.requests == pytest.approx(2.5 * trace.requests, rel=0.03)
    with pytest.raises(ValueError, match="positive"):
        traces.scale_rate(trace, 0.0)


def test_servegen_draws_match_rate_and_cv_per_family(tmp_path: Path) -> None:
    # One client, 10 windows of 600 s at 5 req/s: Gamma CV 2 in half, Weibull CV 2 in
    # the other. The drawn gaps' mean and CV follow the window's numbers.
    rows = [f"{i * 600},5.0,2.0,{'Gamma' if i < 5 else 'Weibull'},0,0" for i in range(10)]
    (tmp_path / "chunk-0-trace.csv").write_text("\n".join(rows) + "\n")
    lengths = BUNDLED / "sharegpt_8k_lengths_sample.csv"
    trace = traces.load_servegen(tmp_path, seed=11, lengths=lengths)
    assert trace.requests == pytest.approx(5.0 * 6000, rel=0.05)
    for lo, hi in ((0, 3000), (3000, 6000)):
        inside = trace.arrival_s[(trace.arrival_s >= lo) & (trace.arrival_s < hi)]
        gaps = np.diff(inside)
        assert gaps.mean() == pytest.approx(0.2, rel=0.06)
        assert gaps.std() / gaps.mean() == pytest.approx(2.0, rel=0.15)


def test_weibull_shape_solver() -> None:
    assert traces._weibull_shape_for_cv(1.0) == pytest.approx(1.0, rel=1e-3)
    assert traces._weibull_shape_for_cv(0.5) == pytest.approx(2.1, rel=0.02)


def test_servegen_bad_rows_are_reported(tmp_path: Path) -> None:
    (tmp_path / "chunk-0-trace.csv").write_text("0,1.0,1.0,Gamma,1,1\n600,1.0,1.0,Pareto,1,1\n")
    with pytest.raises(traces.TraceError) as caught:
        traces.load_servegen(tmp_path, lengths=BUNDLED / "sharegpt_8k_lengths_sample.csv")
    assert (caught.value.line, caught.value.column) == (2, "pattern")


def test_duration_keeps_only_the_first_seconds() -> None:
    trace = traces.load_trace(BUNDLED / "AzureLLMInferenceTrace_code_20min.csv",
                              max_duration_s=300.0, rate_scale=2.0, seed=1)
    full = traces.load_trace(BUNDLED / "AzureLLMInferenceTrace_code_20min.csv")
    assert trace.duration_s < 300.0
    assert trace.requests == 2 * int((full.arrival_s < 300.0).sum())
    sample = traces.load_trace(BUNDLED / "servegen_m_large_sample", max_duration_s=1200.0,
                               seed=2)
    assert sample.requests > 0 and sample.duration_s < 1200.0


def _servegen_client(folder: Path, client: int, *, rate: float = 2.0, windows: int = 4,
                     dataset: dict[str, dict[str, str]] | None = None) -> None:
    rows = [f"{i * 600},{rate},1.0,Gamma,1,1" for i in range(windows)]
    (folder / f"chunk-{client}-trace.csv").write_text("\n".join(rows) + "\n")
    if dataset is not None:
        (folder / f"chunk-{client}-dataset.json").write_text(json.dumps(dataset, indent=2))


# ServeGen's published form (data/language/m-large/chunk-0-dataset.json): window start ->
# field -> a string holding a Python dict of token count -> probability.
LANGUAGE_DATASET = {
    "0": {"input_tokens": "{1000: 1.0}", "output_tokens": "{20: 0.5, 40: 0.5}"},
    "600": {"input_tokens": "{}", "output_tokens": "{}"},  # empty: the entry before holds
    "1200": {"input_tokens": "{3000: 0.25, 5000: 0.75}", "output_tokens": "{1500: 1.0}"},
}


def test_servegen_reads_per_client_dataset_json_by_window(tmp_path: Path) -> None:
    _servegen_client(tmp_path, 0, dataset=LANGUAGE_DATASET)
    trace = traces.load_trace(tmp_path, seed=4, start_s=0.0)
    assert trace.requests == pytest.approx(2.0 * 2400, rel=0.1)
    early = trace.arrival_s < 1200
    assert set(trace.input_tokens[early].tolist()) == {1000}
    assert set(trace.output_tokens[early].tolist()) == {20, 40}
    late_inputs = trace.input_tokens[~early]
    assert set(late_inputs.tolist()) == {3000, 5000}
    assert float(np.mean(late_inputs == 5000)) == pytest.approx(0.75, abs=0.05)
    assert set(trace.output_tokens[~early].tolist()) == {1500}
    assert trace.length_source == "token lengths: dataset.json of 1 of 1 clients"


def test_servegen_multimodal_items_count_as_prefill(tmp_path: Path) -> None:
    # mm-image layout: text tokens, and per modality items per request x tokens per item.
    _servegen_client(tmp_path, 0, windows=1, dataset={"0": {
        "text_tokens": "{50: 1.0}", "output_tokens": "{30: 1.0}",
        "image_count": "{2: 1.0}", "image_tokens": "{100: 0.5, 300: 0.5}",
        "video_count": "{0: 1.0}", "video_tokens": "{0: 1.0}",
        "audio_count": "{0: 1.0}", "audio_tokens": "{0: 1.0}"}})
    trace = traces.load_trace(tmp_path, seed=2)
    # 50 text + two images of 100 or 300 tokens each: 250, 450 or 650.
    assert set(trace.input_tokens.tolist()) == {250, 450, 650}
    assert float(trace.input_tokens.mean()) == pytest.approx(450, rel=0.05)


def test_servegen_mixes_dataset_and_sharegpt_and_says_so(tmp_path: Path) -> None:
    _servegen_client(tmp_path, 0, dataset={"0": {"input_tokens": "{777777: 1.0}",
                                                 "output_tokens": "{5: 1.0}"}})
    _servegen_client(tmp_path, 1)
    lengths = BUNDLED / "sharegpt_8k_lengths_sample.csv"
    trace = traces.load_trace(tmp_path, lengths="auto", seed=1)
    from_dataset = trace.input_tokens == 777777
    assert 0.4 < float(from_dataset.mean()) < 0.6  # two clients at the same rate
    assert trace.input_tokens[~from_dataset].max() < 777777
    assert "dataset.json of 1 of 2 clients" in trace.length_source
    assert "ShareGPT stats" in trace.length_source
    # An explicit stats file replaces every client's lengths.
    forced = traces.load_trace(tmp_path, lengths=lengths, seed=1)
    assert not (forced.input_tokens == 777777).any()
    assert str(lengths) in forced.length_source


def test_servegen_length_source_errors_name_what_is_missing(tmp_path: Path) -> None:
    _servegen_client(tmp_path, 0, dataset=LANGUAGE_DATASET)
    _servegen_client(tmp_path, 1)
    with pytest.raises(traces.TraceError, match="--lengths dataset: no such file") as caught:
        traces.load_trace(tmp_path, lengths="dataset")
    assert caught.value.path == str(tmp_path / "chunk-1-dataset.json")
    with pytest.raises(traces.TraceError, match="no such token-length file"):
        traces.load_trace(tmp_path, lengths=tmp_path / "absent.csv")


@pytest.mark.parametrize(("entry", "column", "message"), [
    ({"input_tokens": "{10: 0.5, x: 0.5}", "output_tokens": "{1: 1.0}"}, "600.input_tokens",
     "numbers"),
    ({"input_tokens": "{10: -1}", "output_tokens": "{1: 1.0}"}, "600.input_tokens",
     "non-negative"),
    ({"input_tokens": "{10: 1.0}"}, "600", "needs output_tokens"),
    ({"input_tokens": [1, 2], "output_tokens": "{1: 1.0}"}, "600.input_tokens", "expected"),
])
def test_servegen_bad_dataset_entries_name_file_line_and_field(
    tmp_path: Path, entry: dict[str, object], column: str, message: str
) -> None:
    _servegen_client(tmp_path, 0, dataset={"0": LANGUAGE_DATASET["0"], "600": entry})  # type: ignore[dict-item]
    with pytest.raises(traces.TraceError, match=message) as caught:
        traces.load_trace(tmp_path)
    assert caught.value.path == str(tmp_path / "chunk-0-dataset.json")
    assert caught.value.column == column
    assert caught.value.line == 6  # where "600" opens in the indented file


def test_start_cuts_any_slice_rebased_to_its_start() -> None:
    path = BUNDLED / "AzureLLMInferenceTrace_code_20min.csv"
    full = traces.load_trace(path)
    part = traces.load_trace(path, start_s=300.0, max_duration_s=240.0)
    inside = (full.arrival_s >= 300.0) & (full.arrival_s < 540.0)
    assert part.requests == int(inside.sum()) > 0
    assert np.allclose(part.arrival_s, full.arrival_s[inside] - 300.0)
    assert part.input_tokens.tolist() == full.input_tokens[inside].tolist()
    assert part.start_s == pytest.approx(full.start_s + 300.0)
    assert 0.0 <= part.arrival_s[0] and part.duration_s < 240.0
    # Rate scaling applies to the slice; the open-ended slice runs to the end.
    doubled = traces.load_trace(path, start_s=300.0, max_duration_s=240.0, rate_scale=2.0)
    assert doubled.requests == 2 * part.requests
    tail = traces.load_trace(path, start_s=1000.0)
    assert tail.requests == int((full.arrival_s >= 1000.0).sum())
    with pytest.raises(ValueError, match="non-negative"):
        traces.load_trace(path, start_s=-5.0)


def test_start_slices_servegen_windows_on_the_day_clock(tmp_path: Path) -> None:
    sample = BUNDLED / "servegen_m_large_sample"
    hour = traces.load_trace(sample, seed=5, start_s=3600.0, max_duration_s=1800.0)
    assert hour.requests > 0
    assert hour.start_s == 3600.0
    assert 0.0 <= float(hour.arrival_s.min()) and hour.duration_s < 1800.0
    # Windows at 1, 2, 4 and 8 req/s: the slice [900, 2100) is half of window 1, all of
    # window 2 and half of window 3: 300 x 2 + 600 x 4 + 300 x 8 = 5,400 requests.
    rows = [f"{i * 600},{rate},1.0,Gamma,1,1" for i, rate in enumerate((1, 2, 4, 8))]
    (tmp_path / "chunk-0-trace.csv").write_text("\n".join(rows) + "\n")
    lengths = BUNDLED / "sharegpt_8k_lengths_sample.csv"
    cut = traces.load_trace(tmp_path, lengths=lengths, seed=3, start_s=900.0,
                            max_duration_s=1200.0)
    assert cut.requests == pytest.approx(5400, rel=0.05)
    first_half = cut.arrival_s < 300.0  # 900..1200 s: window 1 at 2 req/s
    assert int(first_half.sum()) == pytest.approx(600, rel=0.15)
