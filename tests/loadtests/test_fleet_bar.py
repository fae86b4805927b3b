"""The fleet runner's quality bar (issue 16): each line judged from the strategies' figures."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from loadtests import fleet as fleet_runner
from loadtests.fleet import __main__ as runner
from scaler.sim import fleet

QUICK = Path(fleet_runner.__file__).resolve().parent / "fleet.yaml"


def figures(*, gpu_hours: float, online: float, batch: float = 0.25,
            over: dict[str, int] | None = None) -> dict[str, Any]:
    return {"gpu_hours": gpu_hours, "budget_violations": sum((over or {}).values()),
            "violations_by": over or {},
            "by_tier": {"online": {"p95_windows_met": online, "feasible_windows": 120},
                        "batch": {"p95_windows_met": batch, "unfinished": 7}}}


def bar(**by_strategy: dict[str, Any]) -> dict[str, bool]:
    loaded = fleet.load_fleet(QUICK)
    results = {name: fleet.FleetStrategyResult(name=name, models={}, fleet=numbers,
                                               pool_series={})
               for name, numbers in by_strategy.items()}
    lines = runner.quality_bar(fleet.FleetResult(fleet=loaded, seed=0, results=results))
    return {what: met for what, _, met in lines}


def test_every_line_met_and_a_baseline_missing_the_slo_is_no_yardstick() -> None:
    lines = bar(scaler=figures(gpu_hours=12.0, online=119 / 120),
                hpa=figures(gpu_hours=15.0, online=119 / 120, batch=1.0),
                kpa=figures(gpu_hours=9.0, online=0.5, batch=1.0))
    assert all(lines.values()), lines
    assert "kpa misses the online SLO scaler meets (0.500)" in lines


@pytest.mark.parametrize(("scaler", "failing"), [
    (figures(gpu_hours=12.0, online=118 / 120), {"online feasible windows met >= 0.99"}),
    # A reservation taken is a limit exceeded: both lines.
    (figures(gpu_hours=12.0, online=1.0, over={"reservation h100/training": 3}),
     {"reservation never taken (cycles over)", "budget violations"}),
    (figures(gpu_hours=12.0, online=1.0, over={"budget ads": 1}), {"budget violations"}),
    (figures(gpu_hours=16.0, online=1.0), {"GPU-hours below hpa (online 1.000)"}),
    # Batch met more windows than online: it did not give way.
    (figures(gpu_hours=12.0, online=0.995, batch=1.0),
     {"batch absorbs the shortfall (its windows met, unfinished requests)"}),
])
def test_a_line_missed_is_a_failure(scaler: dict[str, Any], failing: set[str]) -> None:
    lines = bar(scaler=scaler, hpa=figures(gpu_hours=15.0, online=1.0, batch=1.0))
    assert {what for what, met in lines.items() if not met} == failing


def test_a_bad_fleet_file_is_refused_with_its_name(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "fleet.yaml"
    assert runner.main(["--fleet", str(missing)]) == 2
    assert str(missing) in capsys.readouterr().err


def test_the_batch_model_drains_an_answer_in_flight_the_online_ones_keep_the_default() -> None:
    # ~1,000-token batch answers take ~34 s at a full batch: 120 s lets a removed replica
    # finish them where Kubernetes' default 30 s would cut them.
    assert {m.key: m.grace_s for m in fleet.load_fleet(QUICK).members} == {
        "inference/search-chat": 30.0, "inference/ads-code": 30.0, "batch/summaries": 120.0}
