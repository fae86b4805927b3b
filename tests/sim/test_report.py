"""The HTML report and `scaler simulate`'s messages: what a person reads."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest

from scaler import cli
from scaler.policy import model as policy_model
from scaler.sim import profiles, report, run, traces

from .conftest import BUNDLED, REPO
from .factories import step_trace


@pytest.fixture(scope="module")
def step_result() -> run.SimulationResult:
    """A 10 -> 40 -> 10 req/s step of 12 minutes under two strategies (a few seconds)."""
    import yaml

    policy = policy_model.ScalePolicy.model_validate(
        yaml.safe_load((REPO / "config" / "llama-8b.yaml").read_text()))
    trace = step_trace(segments=[(180, 10.0), (360, 40.0), (180, 10.0)], input_tokens=1000,
                       output_tokens=200, seed=4)
    return run.simulate(trace, policy=policy, profile=profiles.load_profile(
        "llama-3.1-8b-h100"), names=["scaler", "kpa"])


def test_series_counts_are_whole_and_events_match_the_summary(
    step_result: run.SimulationResult,
) -> None:
    for outcome in step_result.results.values():
        s = outcome.series
        for key in ("desired", "ready", "starting", "nodes"):
            assert all(float(v).is_integer() for v in s[key]), key
        assert len(s["event_t"]) == outcome.summary["scale_events"]
        assert all(a != b for a, b in zip(s["event_from"], s["event_desired"], strict=True))
        # The desired line ends where the last event left it.
        if s["event_desired"]:
            assert s["desired"][-1] == s["event_desired"][-1]
        assert all(np.isfinite(s["p95"])) and len(s["p95"]) == len(s["p95_window_t"])


def test_page_has_the_callers_title_and_no_json_dump(step_result: run.SimulationResult) -> None:
    page = report.render_html(step_result, title="Demo")
    assert "<title>Demo</title>" in page and "<h1>Demo</h1>" in page
    assert "Simulation" not in page
    assert '"strategies"' not in page and "<pre>" not in page
    default = report.render_html(step_result)
    assert "<h1>Simulation of llama-8b</h1>" in default


def test_count_axes_have_whole_ticks_and_latency_plain_labels() -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, (counts, seconds) = plt.subplots(1, 2)
    counts.plot([0, 1, 2], [1, 1, 1])
    report._count_axis(counts, 1.0)  # a flat line at one node
    ticks = [t for t in counts.get_yticks() if 0 <= t <= counts.get_ylim()[1]]
    assert ticks and all(float(t).is_integer() for t in ticks)
    assert counts.get_ylim() == (0.0, 2.0)
    seconds.plot([0, 1], [0.3, 20.0])
    report._seconds_axis(seconds, 0.3, 20.0)
    fig.canvas.draw()
    labels = [t.get_text() for t in seconds.get_yticklabels() if t.get_text()]
    assert "2" in labels and "0.5" in labels
    assert not any("10^" in label or "times" in label for label in labels)
    plt.close(fig)


def test_capacity_warning_names_the_max_that_would_carry(
    policy_8b: policy_model.ScalePolicy, profile_8b: profiles.ReplicaProfile,
) -> None:
    trace = step_trace(segments=[(120, 100.0)], input_tokens=1000, output_tokens=200, seed=1)
    load = report.load_replicas(trace, profile_8b)
    need = float(load.max())
    # 100 req/s of 1,000 in / 200 out: one replica saturates near 15 req/s.
    assert 6.0 < need < 8.0
    small = policy_8b.model_copy(update={"spec": policy_8b.spec.model_copy(update={
        "replicas": policy_8b.spec.replicas.model_copy(update={"min": 1, "max": 3})})})
    warning = report.capacity_warning(trace, policy=small, profile=profile_8b)
    assert warning is not None
    assert "replicas.max 3" in warning and f"replicas.max {int(np.ceil(need))} would" in warning
    assert report.capacity_warning(trace, policy=policy_8b, profile=profile_8b) is None


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_progress_lines_off_a_terminal_every_interval() -> None:
    clock = _Clock()
    stream = io.StringIO()
    bar = report.ProgressBar(["scaler", "hpa"], stream=stream, clock=clock, every_s=10.0)
    clock.now = 5.0
    bar("scaler", 0.5)
    assert stream.getvalue() == ""            # within the interval
    clock.now = 11.0
    bar("hpa", 0.5)
    assert stream.getvalue() == "simulate:  75% done (hpa 50%, 2 of 2 strategies), 11 s elapsed\n"
    clock.now = 12.0
    bar("hpa", 0.6)
    assert stream.getvalue().count("\n") == 1
    # A phase that reports nothing (the oracle's search): the heartbeat repeats the state.
    clock.now = 21.5
    bar.beat()
    assert stream.getvalue().endswith("(hpa 60%, 2 of 2 strategies), 22 s elapsed\n")
    bar.close()
    assert "\r" not in stream.getvalue()


def test_cli_says_which_lengths_and_slices_with_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "out.json"
    code = cli.main(["simulate", "--trace", str(BUNDLED / "servegen_m_large_sample"),
                     "--policy", str(REPO / "config" / "llama-8b.yaml"), "--start", "1800",
                     "--duration", "600", "--strategies", "hpa", "--json", str(out)])
    assert code == 0
    err = capsys.readouterr().err
    assert "token lengths: ShareGPT stats" in err
    assert traces.load_trace(BUNDLED / "servegen_m_large_sample", start_s=1800,
                             max_duration_s=600).duration_s < 600
    code = cli.main(["simulate", "--trace", str(BUNDLED / "servegen_m_large_sample"),
                     "--policy", str(REPO / "config" / "llama-8b.yaml"),
                     "--lengths", "dataset"])
    assert code == 2
    assert "chunk-0-dataset.json" in capsys.readouterr().err


def test_cli_warns_when_max_cannot_carry_the_trace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    policy = (REPO / "config" / "llama-8b.yaml").read_text().replace(
        "replicas: {min: 1, max: 32}", "replicas: {min: 1, max: 4}").replace(
        "replicas: 4}", "replicas: 2}")
    assert "max: 4}" in policy
    path = tmp_path / "small.yaml"
    path.write_text(policy)
    code = cli.main(["simulate", "--trace", str(BUNDLED / "AzureLLMInferenceTrace_conv_20min.csv"),
                     "--policy", str(path), "--rate-scale", "24", "--duration", "120",
                     "--strategies", "hpa"])
    assert code == 0
    err = capsys.readouterr().err
    assert "warning: replicas.max 4 of policy llama-8b cannot carry this trace" in err
