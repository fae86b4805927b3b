"""The suite's quick mode end to end: jobs across processes, summary.json and the page."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import statistics
from pathlib import Path
from typing import Any

import pytest

from loadtests import scenarios, suite
from scaler.engine import types
from scaler.policy import loader
from scaler.sim import profiles, run, strategies
from scaler.sim.strategies import scaler as scaler_strategy

# The keys of a default (one-seed) run's summary.json, which docs and other tools read.
DOCUMENT_KEYS = ["policy", "strategies", "workers", "quick", "warm", "dispatch", "scenarios",
                 "skipped", "wall_s"]
ENTRY_KEYS = ["description", "source", "path", "requests", "duration_s", "windows",
              "rise_windows", "job_seconds", "strategies", "missed"]


@dataclasses.dataclass(frozen=True)
class Run:
    out: Path
    printed: str
    said: str

    def document(self) -> dict[str, Any]:
        loaded: dict[str, Any] = json.loads((self.out / "summary.json").read_text())
        return loaded


def run_suite(out: Path, *arguments: str) -> Run:
    printed, said = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(said):
        assert suite.main(["--out", str(out), "--quick", "--workers", "2", *arguments]) == 0
    return Run(out, printed.getvalue(), said.getvalue())


@pytest.fixture(scope="module")
def default_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    return run_suite(tmp_path_factory.mktemp("default"))


def test_quick_suite_writes_a_summary_and_a_page(default_run: Run) -> None:
    tmp_path = default_run.out
    document = default_run.document()
    assert list(document) == DOCUMENT_KEYS
    assert all(list(entry) == ENTRY_KEYS for entry in document["scenarios"].values())
    assert sorted(p.name for p in (tmp_path / "traces").iterdir()) == sorted(
        f"{name}.csv" for name in scenarios.QUICK)
    assert set(document["scenarios"]) == set(scenarios.QUICK)
    assert document["strategies"] == list(suite.QUICK_STRATEGIES)
    assert document["workers"] == 2 and document["wall_s"] > 0
    assert document["warm"] is False and document["dispatch"] == "push"
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
    assert "| step | 2 of 5 | " in default_run.printed
    assert "worst seed" not in default_run.printed
    # The run ends with the engine's quality bar, a row per trace (loadtests.bar).
    assert "| trace | seeds | GPU-h over the oracle |" in default_run.printed
    assert "| step | - | " in default_run.printed
    assert "The bar (scaler, traces meeting a line on every seed)" in default_run.printed
    for entry in document["scenarios"].values():
        assert set(entry["missed"]) == set(suite.QUICK_STRATEGIES)
    assert "[4/4]" in default_run.said


def test_several_seeds_give_a_cell_per_seed_and_their_mean_and_worst(
        tmp_path: Path, default_run: Run) -> None:
    run = run_suite(tmp_path, "--seeds", "2", "--only", "step")
    document = run.document()
    first, second = suite.SCENARIO_SEED, suite.SCENARIO_SEED + 1
    assert document["seeds"] == {"scenario": [first, second],
                                 "shared": [suite.SHARED_SEED, suite.SHARED_SEED + 1]}
    entry = document["scenarios"]["step"]
    assert list(entry) == [*ENTRY_KEYS, "seeds", "over_seeds"]
    assert list(entry["seeds"]) == [str(first), str(second)]
    # Each seed its own file, drawn differently: the cells are of different traces.
    paths = [Path(replay["path"]) for replay in entry["seeds"].values()]
    assert [p.name for p in paths] == [f"step-seed{first}.csv", f"step-seed{second}.csv"]
    assert paths[0].read_text() != paths[1].read_text()
    # The first seed is the default run's trace: the same numbers, also in the entry's
    # own keys, which a reader of a one-seed summary finds where it looks.
    alone = default_run.document()["scenarios"]["step"]
    assert entry["seeds"][str(first)]["strategies"] == alone["strategies"]
    assert entry["strategies"] == alone["strategies"]
    assert list(entry["over_seeds"]) == list(suite.QUICK_STRATEGIES)
    for strategy, stats in entry["over_seeds"].items():
        cells = [entry["seeds"][seed]["strategies"][strategy] for seed in entry["seeds"]]
        oracles = [entry["seeds"][seed]["strategies"]["oracle"] for seed in entry["seeds"]]
        assert len(stats["cells"]) == 2
        met = [float(c["p95_windows_met"]) for c in cells]
        hours = [float(c["gpu_hours"]) for c in cells]
        ratios = [h / float(o["gpu_hours"]) for h, o in zip(hours, oracles, strict=True)]
        assert [c["gpu_hours"] for c in stats["cells"].values()] == hours
        assert stats["p95_windows_met_mean"] == pytest.approx(statistics.fmean(met))
        assert stats["p95_windows_met_min"] == min(met)
        assert stats["gpu_hours_mean"] == pytest.approx(statistics.fmean(hours))
        assert stats["gpu_over_oracle_mean"] == pytest.approx(statistics.fmean(ratios),
                                                              abs=1e-4)
        assert stats["gpu_over_oracle_max"] == pytest.approx(max(ratios), abs=1e-4)
        assert stats["cells"][str(stats["worst_seed"])]["p95_windows_met"] == min(met)
    assert entry["over_seeds"]["oracle"]["gpu_over_oracle_max"] == 1.0
    # Printed: a row per seed, then the spread table.
    assert f"| step seed {first} | 2 of 5 | " in run.printed
    assert f"| step seed {second} | 2 of 5 | " in run.printed
    scaler = entry["over_seeds"]["scaler"]
    assert (f"| step | {first}, {second} | {scaler['p95_windows_met_mean']:.3f} / "
            f"{scaler['p95_windows_met_min']:.3f} / {scaler['gpu_over_oracle_mean']:.2f}x"
            in run.printed)
    page = (tmp_path / "index.html").read_text()
    assert f"<th>seed {second}</th>" in page and "worst win met" in page


def test_the_spread_is_the_mean_and_the_worst_of_the_cells() -> None:
    def replay(scaler: tuple[float, float], oracle: float) -> dict[str, Any]:
        return {"strategies": {"scaler": {"gpu_hours": scaler[0], "p95_windows_met": scaler[1]},
                               "oracle": {"gpu_hours": oracle, "p95_windows_met": 1.0}}}

    spread = suite.over_seeds({"3": replay((2.0, 0.9), 1.0), "4": replay((3.0, 0.8), 2.0),
                               "5": replay((1.0, 0.8), 0.5)}, ["scaler", "hpa", "oracle"])
    assert list(spread) == ["scaler", "oracle"]  # hpa did not run
    scaler = spread["scaler"]
    assert scaler["p95_windows_met_mean"] == pytest.approx(2.5 / 3)
    assert scaler["p95_windows_met_min"] == 0.8 and scaler["p95_windows_met_max"] == 0.9
    assert scaler["gpu_hours_mean"] == 2.0 and scaler["gpu_hours_max"] == 3.0
    # 2.0 / 1.0, 3.0 / 2.0, 1.0 / 0.5: each seed against its own oracle.
    assert [c["gpu_over_oracle"] for c in scaler["cells"].values()] == [2.0, 1.5, 2.0]
    assert scaler["gpu_over_oracle_mean"] == pytest.approx(5.5 / 3)
    assert scaler["gpu_over_oracle_max"] == 2.0
    # Seeds 4 and 5 both met 0.8: the worst is the costlier against its oracle.
    assert scaler["worst_seed"] == 5
    alone = suite.over_seeds({"1": {"strategies": {"hpa": {"gpu_hours": 1.0,
                                                           "p95_windows_met": 1.0}}}},
                             ["hpa"])["hpa"]
    assert "gpu_over_oracle_mean" not in alone and alone["worst_seed"] == 1


def test_a_shared_trace_takes_a_seed_only_where_its_loading_draws(tmp_path: Path) -> None:
    plain = tmp_path / "plain.csv"
    scenarios.scenario("bimodal", rate=1.0, duration=30.0).write(plain, seed=1)
    at_own_rate = suite.Item("plain", "a plain CSV", plain, "shared")
    assert not at_own_rate.seeded()
    assert at_own_rate.load().arrival_s.tolist() == suite.Item(
        "plain", "a plain CSV", plain, "shared", seed=2).load().arrival_s.tolist()
    scaled = suite.Item("plain-x2", "a plain CSV at twice its rate", plain, "shared",
                        rate_scale=2.0)
    assert scaled.seeded()
    assert scaled.load().arrival_s.tolist() != dataclasses.replace(
        scaled, seed=2).load().arrival_s.tolist()


def test_the_holdout_set_is_its_own_shapes_with_their_grace_periods(tmp_path: Path) -> None:
    items = suite.holdout_items(tmp_path)
    assert [i.name for i in items] == list(suite.HOLDOUT)
    assert not set(suite.HOLDOUT) & set(suite.FULL)
    for item in items:
        assert item.path.exists() and item.seed == suite.HOLDOUT_SEED
        assert item.load().requests > 0
        shape = suite.HOLDOUT[item.name][0]
        assert item.rises == scenarios.scenario(
            shape, **suite.HOLDOUT[item.name][1]).replay_rises()
    grace = {i.name: i.grace_s for i in items}
    assert grace["lo-huge"] == 600.0 and grace["step-big"] == 30.0
    # The fast square wave opens off (its first 90 s): replayed from its first request,
    # its first rise is at 0 s of the replay, not at 90 s of the shape.
    square_fast = next(i for i in items if i.name == "square-fast")
    assert square_fast.rises[0] == 0.0
    assert scenarios.scenario("square", **suite.HOLDOUT["square-fast"][1]).rises[0] == 90.0


def test_the_mixes_set_draws_each_shape_with_its_length_mix(tmp_path: Path) -> None:
    items = suite.mixes_items(tmp_path)
    assert [i.name for i in items] == list(suite.MIXES)
    assert not set(suite.MIXES) & (set(suite.FULL) | set(suite.HOLDOUT))
    for item in items:
        shape, params, mix = suite.MIXES[item.name]
        assert item.seed == suite.MIXES_SEED and mix in item.description
        # The shape's rises, the mix's lengths: a square wave of bimodal prompts has the
        # square wave's rises, and its mean prompt is the bimodal mix's, not chat's.
        assert item.rises == scenarios.scenario(shape, **params).replay_rises()
        trace = item.load()
        mean_prompt = float(trace.input_tokens.mean())
        modes = scenarios.SHAPES[mix]().lengths
        expected = sum(m.input_mean * m.weight for m in modes) / sum(m.weight for m in modes)
        assert mean_prompt == pytest.approx(expected, rel=0.15), item.name
    square = next(i for i in items if i.name == "square-bimodal")
    assert square.rises and square.load().input_tokens.mean() > 2 * scenarios.CHAT[0].input_mean
    with pytest.raises(ValueError, match="unknown length mix"):
        scenarios.with_lengths(scenarios.scenario("step"), "chat")


def test_the_mixes_run_from_the_command_line_with_their_own_seeds(tmp_path: Path) -> None:
    run = run_suite(tmp_path, "--mixes", "--only", "ramp-lo", "--seeds", "2",
                    "--strategies", "scaler")
    document = run.document()
    first = suite.MIXES_SEED
    assert document["seeds"]["scenario"] == [first, first + 1]
    assert list(document["scenarios"]) == ["ramp-lo"]  # no shared traces with a set
    entry = document["scenarios"]["ramp-lo"]
    assert "long-output lengths" in entry["description"]
    assert list(entry["seeds"]) == [str(first), str(first + 1)]
    said = io.StringIO()
    with contextlib.redirect_stderr(said), contextlib.redirect_stdout(io.StringIO()):
        assert suite.main(["--out", str(tmp_path / "both"), "--holdout", "--mixes"]) == 2
    assert "one at a time" in said.getvalue()


def test_a_climbs_rise_windows_reach_one_pod_start_past_its_end(tmp_path: Path) -> None:
    # A flash crowd climbing from 300 to 330 s: the load is at its peak only at 330 s, so
    # a scaler that reacts cannot have its replicas before 330 + 105 s (pod start): the
    # windows starting at 300, 360 and 420 s. A step at 300 s leaves out the third.
    flash = scenarios.scenario("flash", at=300.0, rise=30.0, duration=900.0)
    step = scenarios.scenario("step", at=300.0, hold=300.0, after=300.0)
    profile = profiles.load_profile("llama-3.1-8b-h100")
    assert profile.cold_start.pod_start_seconds == 105.0

    def windows(shape: scenarios.Scenario) -> set[int]:
        path = tmp_path / f"{shape.name}.csv"
        shape.write(path, seed=1)
        item = suite.Item(shape.name, shape.description, path, "scenario",
                          rises=shape.replay_rises())
        return suite.rise_windows(item, item.load(), profile)

    assert windows(flash) == {5, 6, 7}
    assert windows(step) == {5, 6}
    # A square wave off for its first 150 s: the replay starts at its first request, so
    # its rises at 150, 750 and 1,350 s of the shape are at 0, 600 and 1,200 s of the
    # replay.
    square = scenarios.scenario("square", low=0.0, high=15.0, period=600.0, cycles=3.0)
    assert square.rises == (150.0, 750.0, 1350.0)
    assert windows(square) == {0, 1, 10, 11, 20, 21}


def test_a_rise_past_a_node_has_a_node_boot_in_its_cold_start(tmp_path: Path) -> None:
    # A step past the node the load before it needed (5 -> 120 req/s: 1 -> 9 replicas at
    # saturation, 8 a node): its cold start is a node boot (300 s) and a pod start (105
    # s), so the windows starting before 300 + 405 s. One that fits the node (5 -> 60
    # req/s, 5 replicas) is a pod start's.
    profile = profiles.load_profile("llama-3.1-8b-h100")
    assert profile.node.gpus_per_node == 8 and profile.cold_start.node_boot_seconds == 300.0

    def windows(high: float) -> set[int]:
        shape = scenarios.scenario("step", low=5.0, high=high, at=300.0, hold=600.0,
                                   after=300.0)
        path = tmp_path / f"step-{high:g}.csv"
        shape.write(path, seed=1)
        item = suite.Item(shape.name, shape.description, path, "scenario",
                          rises=shape.replay_rises())
        return suite.rise_windows(item, item.load(), profile)

    assert windows(120.0) == set(range(5, 12))
    assert windows(60.0) == {5, 6}


def test_a_shared_traces_rise_in_its_first_minutes_is_read_against_the_warm_up(
        tmp_path: Path) -> None:
    # A trace without a shape: 5 req/s for a minute, then 40 for four. The warm-up before
    # t=0 is its first minutes at their times played backwards, so the pod start before
    # the second minute carried 5 req/s too: that minute is a rise, and its pod start
    # (105 s) covers it and the next. Without the warm-up for history a trace's first
    # two minutes could never be a rise.
    profile = profiles.load_profile("llama-3.1-8b-h100")
    scenarios.scenario("step", low=5.0, high=40.0, at=60.0, hold=240.0, after=0.0).write(
        tmp_path / "t.csv", seed=2)
    item = suite.Item("t", "a trace", tmp_path / "t.csv", "shared")
    assert suite.rise_windows(item, item.load(), profile) == {1, 2}


def test_jobs_keep_the_oracle_plan_sharers_together() -> None:
    assert suite.jobs_for(["scaler", "oracle", "hpa", "static-peak"]) == [
        ("scaler",), ("hpa",), ("oracle", "static-peak")]


def test_absent_shared_traces_are_skipped_with_a_line(tmp_path: Path) -> None:
    lines: list[str] = []
    assert suite.shared_items(tmp_path / "nothing", say=lines.append) == []
    assert len(lines) == 3 and all("not found" in line for line in lines)


def test_a_shared_trace_is_replayed_once_per_seed(tmp_path: Path) -> None:
    folder = tmp_path / "azure_llm_2023"
    folder.mkdir()
    (folder / "AzureLLMInferenceTrace_code.csv").write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,4808,10\n"
        "2023-11-16 18:17:04.0319600,3180,8\n")
    lines: list[str] = []
    items = suite.shared_items(tmp_path, say=lines.append, seeds=3)
    # At 16x the recorded rate its copies' offsets are drawn: one replay per seed.
    assert [(i.name, i.seed) for i in items] == [
        ("azure-code-x16", seed) for seed in range(suite.SHARED_SEED, suite.SHARED_SEED + 3)]
    assert len(lines) == 2  # conv and ServeGen are absent


def test_a_work_queue_run_replays_every_strategy_from_one_shared_queue(
        tmp_path: Path, default_run: Run) -> None:
    queued = run_suite(tmp_path, "--dispatch", "queue")
    document = queued.document()
    assert document["dispatch"] == "queue"
    # The same traces and strategies on another cluster model: the oracle's plan and the
    # scaler's runs are replayed with nothing waiting at a replica.
    pushed = default_run.document()["scenarios"]
    assert set(document["scenarios"]) == set(pushed)
    assert any(entry["strategies"] != pushed[name]["strategies"]
               for name, entry in document["scenarios"].items())


def test_bad_arguments_exit_2(tmp_path: Path) -> None:
    assert suite.main(["--out", str(tmp_path), "--quick", "--strategies", "magic"]) == 2
    assert suite.main(["--out", str(tmp_path), "--quick", "--workers", "0"]) == 2
    assert suite.main(["--out", str(tmp_path), "--quick", "--seeds", "0"]) == 2
    assert suite.main(["--out", str(tmp_path), "--quick", "--only", "nothing"]) == 2


def test_a_headroom_variant_runs_beside_the_scaler_and_costs_more(tmp_path: Path) -> None:
    ran = run_suite(tmp_path, "--headroom", "replicas=1")
    document = ran.document()
    # The bar is judged for the variant too, its rises not excused.
    assert "The bar (scaler, " in ran.printed
    assert "The bar (scaler+1, " in ran.printed and "no misses (headroom set)" in ran.printed
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


def test_a_warm_run_starts_the_scaler_from_what_it_learned_on_the_load_before(
        tmp_path: Path) -> None:
    # The quick step (2 -> 12 req/s) drawn with another seed is the load "before": the
    # scaler learns the load of a request there, and the measured run starts from it.
    item = suite.scenario_items(tmp_path, quick=True, warm=True)[0]
    assert item.name == "step" and item.warm_path == tmp_path / "traces" / "step-before.csv"
    before, now = item.load_before(), item.load()
    assert before.requests != now.requests or not (before.arrival_s == now.arrival_s).all()
    policy = loader.load_paths([suite.DEFAULT_POLICY]).policies[0]
    profile = profiles.load_profile(policy.spec.profile or "llama-3.1-8b-h100")
    learned = run.learned_on(before, policy=policy, profile=profile,
                             next_start_s=now.start_s)
    assert learned.load_samples > 0 and learned.replicas_per_request_rate is not None
    assert learned.observed_until == float("-inf")  # its pod starts are long past
    context = run.context_for(policy=policy, profile=profile, trace=now,
                              pool=run.pool_for(policy, profile), learned=learned)
    scaler = strategies.make("scaler", context)
    assert isinstance(scaler, scaler_strategy.ScalerStrategy)
    assert types.Learned.of(scaler.state) == learned
    assert strategies.make("scaler", dataclasses.replace(context, learned=None)).state == (
        types.EngineState())
    # The suite says so, and writes the load before beside each trace.
    warm = run_suite(tmp_path / "suite", "--warm", "--strategies", "scaler")
    assert warm.document()["warm"] is True
    assert sorted(p.name for p in (tmp_path / "suite" / "traces").iterdir()) == sorted(
        f"{name}{suffix}.csv" for name in scenarios.QUICK for suffix in ("", "-before"))
