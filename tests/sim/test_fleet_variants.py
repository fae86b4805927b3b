"""Fleet replay of a model with variants: each variant its own profile, pool and price,
one router in front, costs reported per variant; and the files' cross checks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from scaler.policy import loader
from scaler.sim import fleet

from .conftest import REPO
from .factories import step_trace

POOLS = [
    # One 8-GPU H100 node of which 6 GPUs are held: 2 H100 replicas at most.
    {"apiVersion": "scaler.io/v1alpha1", "kind": "GpuPool", "metadata": {"name": "h100"},
     "spec": {"gpusPerNode": 8, "maxNodes": 1, "gpuHourly": 2.5,
              "reservations": [{"name": "training", "gpus": 6}]}},
    {"apiVersion": "scaler.io/v1alpha1", "kind": "GpuPool", "metadata": {"name": "l40s"},
     "spec": {"gpusPerNode": 4, "maxNodes": 4, "gpuHourly": 0.86}},
]


def _policy(variants: list[dict[str, Any]]) -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(
        (REPO / "loadtests" / "fleet" / "variants-config" / "models.yaml").read_text()
        .split("\n---\n")[0])
    document["spec"]["variants"] = variants
    return document


H100 = {"name": "h100", "target": {"name": "m-h100"}, "nodePool": "h100", "capacity": 96,
        "profile": "llama-3.1-8b-h100"}
L40S = {"name": "l40s", "target": {"name": "m-l40s"}, "nodePool": "l40s", "capacity": 34,
        "podStartSeconds": 110, "profile": "llama-3.1-8b-l40s"}


def _fleet(folder: Path, variants: list[dict[str, Any]]) -> Path:
    (folder / "pools.yaml").write_text(yaml.safe_dump_all(POOLS))
    (folder / "policy.yaml").write_text(yaml.safe_dump(_policy(variants)))
    trace = step_trace(segments=[(30.0, 8.0), (120.0, 40.0), (30.0, 8.0)],
                       input_tokens=800, output_tokens=150, seed=3)
    rows = "\n".join(f"{t:.3f},{i},{o}" for t, i, o in zip(
        trace.arrival_s, trace.input_tokens, trace.output_tokens, strict=True))
    (folder / "trace.csv").write_text("timestamp_s,input_tokens,output_tokens\n" + rows + "\n")
    path = folder / "fleet.yaml"
    path.write_text(yaml.safe_dump({"pools": ["pools.yaml"], "models": [
        {"policy": "policy.yaml", "trace": {"path": "trace.csv", "format": "csv"}}]}))
    return path


def test_a_variant_model_serves_every_request_once_and_costs_by_variant(
        tmp_path: Path) -> None:
    loaded = fleet.load_fleet(_fleet(tmp_path, [H100, L40S]))
    (member,) = loaded.members
    assert [p.key for p in member.parts] == ["inference/chat-mix#h100", "inference/chat-mix#l40s"]
    result = fleet.replay(loaded, strategy="scaler")
    figures = result.fleet
    variants = figures["by_variant"]
    summary = result.models[member.key].summary
    # Both carried traffic: the H100 pool holds 2 replicas, fewer than the step needs.
    assert variants["inference/chat-mix#h100"]["completed"] > 0
    assert variants["inference/chat-mix#l40s"]["completed"] > 0
    assert variants["inference/chat-mix#h100"]["max_replicas"] <= 2
    # Each request was answered by exactly one variant, and the model's cost is theirs.
    assert sum(int(v["completed"]) for v in variants.values()) == summary["completed"]
    assert summary["completed"] == summary["requests"] - summary["rejected"]
    assert summary["cost"] == pytest.approx(sum(float(v["cost"]) for v in variants.values()),
                                            abs=1e-3)
    assert figures["budget_violations"] == 0
    assert figures["peak_gpus"]["h100"] <= 2


def test_a_baseline_scales_the_first_variant_alone(tmp_path: Path) -> None:
    loaded = fleet.load_fleet(_fleet(tmp_path, [L40S, H100]))
    variants = fleet.replay(loaded, strategy="hpa").fleet["by_variant"]
    assert variants["inference/chat-mix#h100"]["gpu_hours"] == 0
    assert variants["inference/chat-mix#l40s"]["completed"] > 0


def test_a_variant_on_no_pool_of_the_fleet_is_named(tmp_path: Path) -> None:
    path = _fleet(tmp_path, [H100, {**L40S, "nodePool": "a100"}])
    with pytest.raises(fleet.FleetError, match=r"spec\.variants\[1\].*'a100' is not a pool"):
        fleet.load_fleet(path)


def test_validate_checks_each_variant_against_its_pool(tmp_path: Path) -> None:
    _fleet(tmp_path, [H100, {**L40S, "nodePool": "a100"},
                      {**L40S, "name": "big", "target": {"name": "m-big"},
                       "resources": {"gpusPerReplica": 8}}])
    result = loader.load_paths([tmp_path / "pools.yaml", tmp_path / "policy.yaml"])
    problems = {(e.field, e.message.split(",")[0]) for e in loader.reference_errors(result)}
    assert ("spec.variants[1].nodePool",
            "variant l40s names GpuPool 'a100'") in {(f, m.split(", which")[0])
                                                     for f, m in problems}
    assert any(f == "spec.variants[2].resources.gpusPerReplica" for f, _ in problems)


def test_the_shipped_variants_example_loads() -> None:
    folder = REPO / "loadtests" / "fleet"
    for name, variants in (("variants.yaml", ["h100", "l40s"]),
                           ("variants-h100.yaml", ["h100"]), ("variants-l40s.yaml", ["l40s"])):
        (member,) = fleet.load_fleet(folder / name).members
        assert [p.name for p in member.parts] == variants
        assert {p.profile.name for p in member.parts} <= {"llama-3.1-8b-h100",
                                                          "llama-3.1-8b-l40s"}


@pytest.mark.parametrize("tier", ["online", "batch"])
def test_a_batch_variant_keeps_its_replicas_with_unfinished_work(tmp_path: Path,
                                                                 tier: str) -> None:
    # 20 req/s of 1,500-token answers for a minute, then a tenth of it: the demand falls
    # while the replicas still decode (an L40S answer takes about a minute), and scale-downs
    # act at once (no window, no rate limit). A grace period of 0 cuts whatever a removed
    # replica holds, so every removal of a busy replica shows.
    document = _policy([H100, L40S])
    document["spec"].update(tier=tier, replicas={"min": 1, "max": 96}, warmFloor={"replicas": 1},
                            behavior={"scaleDown": {"stabilizationSeconds": 0, "policies": []}})
    (tmp_path / "pools.yaml").write_text(yaml.safe_dump_all(POOLS))
    (tmp_path / "policy.yaml").write_text(yaml.safe_dump(document))
    trace = step_trace(segments=[(60.0, 20.0), (60.0, 2.0)], input_tokens=200,
                       output_tokens=1500, seed=3)
    rows = "\n".join(f"{t:.3f},{i},{o}" for t, i, o in zip(
        trace.arrival_s, trace.input_tokens, trace.output_tokens, strict=True))
    (tmp_path / "trace.csv").write_text("timestamp_s,input_tokens,output_tokens\n" + rows + "\n")
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump({"pools": ["pools.yaml"], "models": [
        {"policy": "policy.yaml", "trace": {"path": "trace.csv", "format": "csv"},
         "terminationGracePeriodSeconds": 0}]}))
    result = fleet.replay(fleet.load_fleet(path), strategy="scaler")
    cut = result.fleet["interrupted_requests"]
    scaled = {key: v["scale_events"] for key, v in result.fleet["by_variant"].items()}
    assert all(events >= 1 for events in scaled.values()), scaled
    if tier == "online":
        assert cut >= 50  # the mix removes replicas mid-answer (by deletion cost, idlest first)
    else:
        # Each variant keeps the replicas whose reports show work (Option.keep). What a
        # report cannot show is cut: a request routed to a replica after its last report
        # (1 s old) and before its removal, at most a couple here.
        assert cut <= 2
