"""The engine's quality bar (issue 11), each line judged from a suite document's figures."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import pytest

from loadtests import bar


def figures(gpu_hours: float, windows_met: float = 1.0) -> dict[str, float]:
    return {"gpu_hours": gpu_hours, "p95_windows_met": windows_met}


def replay(*, windows: int = 30, rises: tuple[int, ...] = (5, 6),
           missed: dict[str, list[int]] | None = None,
           **by_strategy: dict[str, float]) -> dict[str, Any]:
    """A one-seed entry of summary.json: strategies' figures, misses, rise windows."""
    return {"windows": windows, "rise_windows": list(rises),
            "strategies": {name.replace("_", "-"): numbers
                           for name, numbers in by_strategy.items()},
            "missed": {name: list(m) for name, m in (missed or {}).items()}}


def judged(entry: dict[str, Any]) -> bar.Verdict:
    verdicts = bar.quality_bar({"scenarios": {"step": entry}})
    assert len(verdicts) == 1
    return verdicts[0]


def test_a_replay_within_every_line_meets_the_bar() -> None:
    verdict = judged(replay(scaler=figures(1.2, 0.933), oracle=figures(1.0),
                            hpa=figures(3.0, 1.0), kpa=figures(1.1, 0.5),
                            missed={"scaler": [5, 6], "oracle": []}))
    assert verdict.over_oracle == 1.2 and verdict.cost_met
    # KPA costs less but meets fewer windows; HPA meets more but costs more.
    assert verdict.cheaper == () and verdict.baselines_met
    assert verdict.outside == () and verdict.judged_windows == 28 and verdict.windows_met
    assert verdict.met


def test_cost_past_a_quarter_over_the_oracle_fails_its_line_alone() -> None:
    verdict = judged(replay(scaler=figures(1.26), oracle=figures(1.0), hpa=figures(3.0)))
    assert verdict.cost_met is False and verdict.baselines_met and verdict.windows_met
    assert not verdict.met


def test_a_baseline_as_good_for_less_fails_the_baselines_line() -> None:
    verdict = judged(replay(scaler=figures(2.0, 0.9), oracle=figures(1.9),
                            static_peak=figures(1.95, 0.9), hpa=figures(1.5, 0.8),
                            missed={"scaler": [5, 6, 7]}))
    # static-peak meets as many windows for fewer GPU-hours; HPA is cheaper but misses more.
    assert verdict.cheaper == ("static-peak",) and verdict.baselines_met is False
    # It holds the oracle's peak from the start: the reactive baselines alone pass.
    assert verdict.reactive_baselines_met
    verdict = judged(replay(scaler=figures(2.0, 0.9), keda=figures(1.9, 0.95)))
    assert verdict.cheaper == ("keda",) and verdict.reactive_baselines_met is False
    # A headroom variant of the scaler and the oracles are no baselines.
    entry = replay(scaler=figures(2.0), oracle=figures(1.9), oracle_rate=figures(1.0))
    entry["strategies"]["scaler+1"] = figures(1.0)
    verdict = judged(entry)
    assert verdict.cheaper is None and verdict.baselines_met is None and verdict.met


def test_misses_count_outside_the_rises_and_where_the_oracle_met_the_window() -> None:
    # Window 12 is a miss after the step's cold start: the line fails.
    verdict = judged(replay(scaler=figures(1.0), missed={"scaler": [5, 12]}))
    assert verdict.outside == (12,) and verdict.windows_met is False
    # A window the oracle misses too is no provisioning's to meet.
    verdict = judged(replay(scaler=figures(1.0), oracle=figures(1.0),
                            missed={"scaler": [5, 12], "oracle": [12]}))
    assert verdict.outside == () and verdict.judged_windows == 27 and verdict.windows_met
    # One miss in 120 windows with no rise is 0.992 of them met: within the line.
    verdict = judged(replay(windows=120, rises=(), scaler=figures(1.0),
                            missed={"scaler": [40]}))
    assert verdict.outside == (40,) and verdict.windows_met
    verdict = judged(replay(windows=120, rises=(), scaler=figures(1.0),
                            missed={"scaler": [40, 41]}))
    assert verdict.windows_met is False


def test_with_headroom_set_no_window_is_excused() -> None:
    entry = replay(scaler=figures(1.0, 0.9), oracle=figures(1.0), hpa=figures(3.0, 1.0),
                   missed={"scaler": [5, 6, 9], "scaler+1": [5], "oracle": [9]})
    entry["strategies"]["scaler+1"] = figures(1.2, 0.967)
    plain = bar.judge("step", None, entry)
    spare = bar.judge("step", None, entry, strategy="scaler+1")
    assert plain is not None and spare is not None
    # The scaler's misses at the rise are excused (9 the oracle misses too); the
    # variant's one at the rise is not.
    assert plain.outside == () and plain.windows_met
    assert spare.outside == (5,) and spare.judged_windows == 29 and not spare.windows_met
    # Its baselines are the others (not the scaler it is a variant of).
    assert spare.cheaper == () and spare.over_oracle == 1.2
    text = bar.markdown([spare])
    assert "| misses | bar |" in text and "| step | - | 1.200x ok | none ok | 1 (5) of 29 " \
        "FAIL | not met |" in text
    assert "The bar (scaler+1, " in text and "no misses (headroom set) 0 of 1" in text


def test_a_trace_meets_a_line_only_on_every_seed() -> None:
    good = replay(scaler=figures(1.1), oracle=figures(1.0), hpa=figures(2.0))
    costly = replay(scaler=figures(1.4), oracle=figures(1.0), hpa=figures(2.0))
    document = {"scenarios": {
        "step": {"seeds": {"3": good, "4": costly}},
        "square": {"seeds": {"3": good, "4": good}},
        "daily": {"seeds": {"3": replay(scaler=figures(1.0)), "4": replay(hpa=figures(1.0))}},
    }}
    verdicts = bar.quality_bar(document)
    # daily seed 4 has no scaler run: nothing to judge there.
    assert [(v.trace, v.seed) for v in verdicts] == [
        ("step", "3"), ("step", "4"), ("square", "3"), ("square", "4"), ("daily", "3")]
    text = bar.markdown(verdicts)
    # A row per trace, its seeds side by side.
    assert "| step | 3, 4 | 1.100x, 1.400x FAIL | none ok | 0, 0 of 28 ok | " \
        "met on 1 of 2 seeds |" in text
    assert "| square | 3, 4 | 1.100x, 1.100x ok | none ok | 0, 0 of 28 ok | met |" in text
    assert "| daily | 3 | - | - | 0 of 28 ok | met |" in text
    # Cost and baselines are judged on the two traces that ran the oracle and a baseline.
    assert text.endswith("cost at most 1.25x the oracle 1 of 2; no baseline as good for "
                         "less 2 of 2 (no reactive one, static-peak aside, 2 of 2); misses "
                         "only at rises 3 of 3; all lines 2 of 3.")


def test_the_command_reads_summaries_and_refuses_what_is_not_one(tmp_path: Path) -> None:
    path = tmp_path / "summary.json"
    oracle = figures(1.0) | {"gpu_hours_lower_bound": 0.8}
    path.write_text(json.dumps({"scenarios": {"step": replay(
        scaler=figures(1.3, 0.9), oracle=oracle, missed={"scaler": [5, 6, 9]})}}))
    printed, said = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(said):
        assert bar.main([str(path)]) == 0
        # --bound: over the oracle's proven bound B, below its replay.
        assert bar.main(["--bound", str(path)]) == 0
        assert bar.main([str(tmp_path / "absent.json")]) == 2
        with pytest.raises(SystemExit):  # only the scaler and its headroom variants
            bar.main(["--strategy", "hpa", str(path)])
        (tmp_path / "other.json").write_text('{"items": []}')
        assert bar.main([str(tmp_path / "other.json")]) == 2
    assert "| step | - | 1.300x FAIL | - | 1 (9) of 28 FAIL | not met |" in printed.getvalue()
    assert "| trace | seeds | GPU-h over the oracle's bound |" in printed.getvalue()
    assert "| step | - | 1.625x FAIL | - |" in printed.getvalue()
    assert "cost at most 1.25x the oracle's bound 0 of 1;" in printed.getvalue()
    # A summary from before the oracle reported its bound: the cost is not judged.
    verdict = bar.judge("step", None, replay(scaler=figures(1.3), oracle=figures(1.0)),
                        bound=True)
    assert verdict is not None and verdict.over_oracle is None and verdict.cost_met is None
    assert f"loadtests.bar: {tmp_path / 'absent.json'}: not a suite summary" in said.getvalue()
    assert "other.json: not a suite summary ('scenarios')" in said.getvalue()
