"""`describe`: a held decision and a decision without look-ahead, in words."""

from __future__ import annotations

import dataclasses
import json

from scaler.engine import decide as engine_decide
from scaler.engine import types
from scaler.service import explain

from . import factories


def document(**kwargs: object) -> dict[str, object]:
    registry = factories.loaded_state(factories.policy())
    obs = factories.observation(**kwargs)  # type: ignore[arg-type]
    registry.record("inference/llama-70b", obs)
    status = registry.status("inference/llama-70b")
    assert status is not None and status.last is not None
    # Through JSON and back, as `scaler explain` receives it.
    return dict(json.loads(json.dumps(explain.decision_document(status, status.last))))


def test_held_decision_says_missing_data_never_scales_down() -> None:
    text = explain.describe(document(current=4, desired=4, held=True))
    assert "Holding 4 replicas: no fresh signal to decide on" in text
    assert "hold 4->4 (no fresh signal)" in text
    assert "No limit changed the recommendation." in text


def test_stale_signal_and_note_without_forecast() -> None:
    registry = factories.loaded_state(factories.policy())
    obs = factories.observation(current=3, desired=2)
    decision = dataclasses.replace(
        obs.decision, forecast=None, notes=("scale-down limited by in-flight work",),
        signals=(dataclasses.replace(obs.decision.signals[0], fresh=False, age_s=None,
                                     value=None, recommendation=None),))
    registry.record("inference/llama-70b", dataclasses.replace(obs, decision=decision))
    status = registry.status("inference/llama-70b")
    assert status is not None and status.last is not None
    text = explain.describe(explain.decision_document(status, status.last))
    assert "Scaling down from 3 to 2: demand says 2 (running and waiting requests)." in text
    assert "concurrency: missing (age unknown, stale or missing, ignored) -> " \
           "no recommendation" in text
    assert "Look-ahead" not in text
    assert "Note: scale-down limited by in-flight work" in text
    assert "Warning:" not in text


def test_a_scale_down_that_cuts_answers_is_a_warning_line() -> None:
    registry = factories.loaded_state(factories.policy())
    obs = factories.observation(current=3, desired=2)
    why = "answers run 100 s at a replica on average"
    registry.record("inference/llama-70b", dataclasses.replace(
        obs, decision=dataclasses.replace(obs.decision, cut_warning=why)))
    status = registry.status("inference/llama-70b")
    assert status is not None and status.last is not None
    document = json.loads(json.dumps(explain.decision_document(status, status.last)))
    assert f"Warning: {why}." in explain.describe(document).splitlines()
    del document["decision"]["cut_warning"]  # an older server's document still reads
    assert "Warning:" not in explain.describe(document)


def test_non_finite_numbers_become_null() -> None:
    body = document(queue_depth=float("nan"))
    assert body["snapshot"]["queue_depth"]["value"] is None  # type: ignore[index]


def test_every_pipeline_step_is_explained() -> None:
    # A real decision from the engine: each step of the pipeline says what it made of it.
    registry = factories.loaded_state(factories.policy())
    obs = factories.observation(current=2, desired=2)
    status = registry.status("inference/llama-70b")
    assert status is not None
    decision, _ = engine_decide.decide(status.policy, snapshot=obs.snapshot,
                                       cluster=obs.cluster, state=types.EngineState(),
                                       now=obs.at)
    registry.record("inference/llama-70b", dataclasses.replace(obs, decision=decision))
    status = registry.status("inference/llama-70b")
    assert status is not None and status.last is not None
    document = json.loads(json.dumps(explain.decision_document(status, status.last)))
    text = explain.describe(document)
    assert [step["name"] for step in document["decision"]["steps"]] == [
        name.value for name, _ in engine_decide.PIPELINE]
    for name, _ in engine_decide.PIPELINE:
        assert f"\n  {name.value:<11} " in text


def test_what_the_engine_learned_is_said_only_once_it_has_learned_it() -> None:
    registry = factories.loaded_state(factories.policy())
    obs = factories.observation(current=5, desired=5)
    registry.record("inference/llama-70b", dataclasses.replace(obs, engine=types.EngineState()))
    status = registry.status("inference/llama-70b")
    assert status is not None and status.last is not None
    assert "Learned" not in explain.describe(explain.decision_document(status, status.last))

    learned = types.EngineState(served_share=0.868, served_samples=41,
                                replicas_per_request_rate=0.0913, load_samples=310,
                                learned_pod_start_s=104.2, return_gap_s=402.0, returns=3,
                                return_jitter_s=12.4,
                                horizon_scale=0.5, level_leaves=(factories.NOW - 900,
                                                                 factories.NOW - 300),
                                level_returns=(types.LevelReturn(factories.NOW - 700, 95.4),),
                                last_drop_at=factories.NOW - 40, drop_cycle_s=301.4,
                                drop_cycles=5, drop_jitter_s=3.6, last_cycle_demand=(1.0, 2.5))
    registry.record("inference/llama-70b", dataclasses.replace(obs, engine=learned))
    registry.record_resumed("inference/llama-70b", factories.NOW - 600)
    status = registry.status("inference/llama-70b")
    assert status is not None and status.last is not None
    document = json.loads(json.dumps(explain.decision_document(status, status.last)))
    assert document["learned"]["served_share"] == 0.868
    assert document["learned"]["drop_cycle_s"] == 301.4
    assert "last_cycle_demand" not in document["learned"]  # working memory, not for reading
    line = next(x for x in explain.describe(document).splitlines() if x.startswith("Learned"))
    assert line == (
        "Learned (resumed from a record written 2025-11-29T09:43:20Z): saturated replicas "
        "serve 87% of the tokens/s capacity model (41 samples); one request/s is 0.0913 "
        "replicas (310 samples); a pod starts in 104 s; load came back 402 s after a drop "
        "(3 times in a row, within 12 s of that); levels of the load left 2 times and came "
        "back within 95 s; the load fell away every 301 s (5 times in a row, within 4 s "
        "of that); 50% of the trend is trusted.")


def test_an_audit_line_from_before_the_learned_hold_was_kept_still_explains() -> None:
    # `scaler explain --audit` reads lines older versions wrote: their learned state has
    # no returns or leaves of levels.
    document = {"served_share": 1.0, "served_samples": 0, "replicas_per_request_rate": None,
                "load_samples": 0, "pod_start_s": 104.2, "node_boot_s": None,
                "return_gap_s": None, "returns": 0, "horizon_scale": 1.0}
    assert explain._learned_line(document) == "Learned: a pod starts in 104 s."
    # One interval between drops is no cycle yet: not said.
    one = {**document, "drop_cycle_s": 350.0, "drop_cycles": 1, "drop_jitter_s": None}
    assert explain._learned_line(one) == "Learned: a pod starts in 104 s."


def test_a_look_ahead_ended_at_the_next_drop_says_so() -> None:
    registry = factories.loaded_state(factories.policy())
    obs = factories.observation(current=4, desired=5)
    forecast = types.Forecast(time_to_ready_s=105.0, needs_node=False, demand_now=4.2,
                              slope_per_s=0.02, demand_at_ready=4.5, replicas_at_ready=5,
                              replicas_at_node_ready=5, drop_in_s=15.0)
    registry.record("inference/llama-70b", dataclasses.replace(
        obs, decision=dataclasses.replace(obs.decision, forecast=forecast)))
    status = registry.status("inference/llama-70b")
    assert status is not None and status.last is not None
    document = json.loads(json.dumps(explain.decision_document(status, status.last)))
    text = explain.describe(document)
    assert "The load falls away in 15 s, as it has every cycle" in text
    del document["decision"]["forecast"]["drop_in_s"]  # an older server's document
    assert "falls away" not in explain.describe(document)
