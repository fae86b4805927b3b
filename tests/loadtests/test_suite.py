"""The suite's quick mode end to end: jobs across processes, summary.json and the page."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from loadtests import scenarios, suite


def test_quick_suite_writes_a_summary_and_a_page(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert suite.main(["--out", str(tmp_path), "--quick", "--workers", "2"]) == 0
    document = json.loads((tmp_path / "summary.json").read_text())
    assert set(document["scenarios"]) == set(scenarios.QUICK)
    assert document["strategies"] == list(suite.QUICK_STRATEGIES)
    assert document["workers"] == 2 and document["wall_s"] > 0
    for name, entry in document["scenarios"].items():
        assert list(entry["strategies"]) == list(suite.QUICK_STRATEGIES), name
        for summary in entry["strategies"].values():
            assert summary["requests"] == entry["requests"] > 0
            assert 0.0 <= summary["p95_windows_met"] <= 1.0
            assert summary["gpu_hours"] > 0
    # The step rises once at 60 s: windows 1 and 2 (60-180 s) start within one pod start
    # (105 s) of it.
    assert document["scenarios"]["step"]["rise_windows"] == [1, 2]
    page = (tmp_path / "index.html").read_text()
    assert page.count('src="data:image/png;base64,') == len(scenarios.QUICK)
    printed = capsys.readouterr()
    assert "| step | 2 of 5 | " in printed.out
    for entry in document["scenarios"].values():
        assert set(entry["missed"]) == set(suite.QUICK_STRATEGIES)
    assert "[4/4]" in printed.err


def test_jobs_keep_the_oracle_plan_sharers_together() -> None:
    assert suite.jobs_for(["scaler", "oracle", "hpa", "static-peak"]) == [
        ("scaler",), ("hpa",), ("oracle", "static-peak")]


def test_absent_shared_traces_are_skipped_with_a_line(tmp_path: Path) -> None:
    lines: list[str] = []
    assert suite.shared_items(tmp_path / "nothing", say=lines.append) == []
    assert len(lines) == 3 and all("not found" in line for line in lines)


def test_bad_arguments_exit_2(tmp_path: Path) -> None:
    assert suite.main(["--out", str(tmp_path), "--quick", "--strategies", "magic"]) == 2
    assert suite.main(["--out", str(tmp_path), "--quick", "--workers", "0"]) == 2
    assert suite.main(["--out", str(tmp_path), "--quick", "--only", "nothing"]) == 2


def test_a_headroom_variant_runs_beside_the_scaler_and_costs_more(tmp_path: Path) -> None:
    assert suite.main(["--out", str(tmp_path), "--quick", "--workers", "2",
                       "--headroom", "replicas=1"]) == 0
    document = json.loads((tmp_path / "summary.json").read_text())
    assert document["strategies"] == [*suite.QUICK_STRATEGIES, "scaler+1"]
    for name, entry in document["scenarios"].items():
        spare, plain = entry["strategies"]["scaler+1"], entry["strategies"]["scaler"]
        # One replica more held whenever the scaler holds any: it costs GPU-hours.
        assert spare["gpu_hours"] > plain["gpu_hours"], name
        assert "scaler+1" in entry["missed"]


def test_headroom_variants_are_named_and_checked() -> None:
    assert suite.headroom_variant("replicas=2") == ("scaler+2", {"replicas": 2})
    assert suite.headroom_variant("fraction=0.25") == ("scaler+25%", {"fraction": 0.25})
    for bad in ("replicas=0", "replicas=1.5", "fraction=0", "fraction=x", "spare=1"):
        with pytest.raises(argparse.ArgumentTypeError, match="--headroom"):
            suite.headroom_variant(bad)
