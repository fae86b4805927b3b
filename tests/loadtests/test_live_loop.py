"""The closed loop on real sockets, on a short slice: sim-server processes behind the proxy,
the emulator's Deployment, the real `scaler run`, a nats-server and the load generator.

Real time (no compression): a profile whose replicas start in 3 s (node boot 4 s), a
policy with windows of seconds, 10 s of the bundled Azure conversation trace (about 5
requests/s, which one slow replica cannot serve). The assertions are behaviour, not
numbers: the service scaled the Deployment up, every request completed, both reports are
valid 4.4 summaries and the comparison holds both sides. About 45 s on 2 busy cores.
"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from loadtests import live_loop
from scaler.sim import report

TRACE = Path(live_loop.REPO) / "loadtests" / "traces" / "AzureLLMInferenceTrace_conv_20min.csv"

PROFILE = """\
name: live-loop-test
model: test/slow-model
gpu: test-gpu
gpusPerReplica: 1
# A slow replica: 5,000 prompt tokens/s and 10 ms + 1 ms per sequence a step, batch 16,
# so one replica serves about 2 requests/s of the conversation trace (1.2k in, 0.2k out).
prefillTokensPerSecond: 5000
decodeStep: {baseSeconds: 0.01, perSequenceSeconds: 0.001}
kvCacheTokens: 60000
maxModelLen: 16384
maxBatch: 16
maxBatchedTokens: 2048
coldStart: {nodeBootSeconds: 4, imagePullSeconds: 1, modelLoadSeconds: 1, readinessSeconds: 1}
node: {gpusPerNode: 2}
sources:
  - {what: a made-up slow replica for the closed-loop test, url: "https://example.invalid/"}
"""

POLICY = """\
apiVersion: scaler.io/v1alpha1
kind: ScalePolicy
metadata: {{name: slow-model, namespace: inference}}
spec:
  target: {{apiVersion: apps/v1, kind: Deployment, name: slow-model}}
  replicas: {{min: 1, max: 6}}
  signals:
    concurrency: {{targetPerReplica: 8}}
    queueDepth: {{targetWaitingPerReplica: 2}}
    p95Latency: {{metric: ttft, sloSeconds: 2.5}}
  sources:
    nats: {{}}
  behavior:
    scaleUp: {{stabilizationSeconds: 0, policies: [{{type: Pods, value: 4, periodSeconds: 5}}]}}
    scaleDown:
      stabilizationSeconds: 20
      policies: [{{type: Percent, value: 50, periodSeconds: 10}}]
  coldStart: {{nodeBootSeconds: 4, imagePullSeconds: 1, modelLoadSeconds: 1, readinessSeconds: 1}}
  forecast: {{windowSeconds: 20}}
  resources: {{gpusPerReplica: 1}}
  nodePool: {{name: test-pool, gpusPerNode: 2, maxNodes: 3, actuator: none}}
  staleAfterSeconds: 10
  cost: {{gpuHourly: 2.5}}
  profile: {profile}
"""


def test_the_service_scales_sim_servers_under_a_trace_and_both_reports_are_written(
        tmp_path: Path) -> None:
    profile = tmp_path / "profile.yaml"
    profile.write_text(PROFILE)
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY.format(profile=profile))
    out = tmp_path / "out"
    code = live_loop.main(["--trace", str(TRACE), "--policy", str(policy), "--start", "30",
                           "--duration", "10", "--warmup", "2", "--initial", "1",
                           "--out", str(out)])
    assert code == 0

    live = json.loads((out / "live.json").read_text())
    summary = live["strategies"]["live"]
    jsonschema.validate(summary, report.STRATEGY_SCHEMA)
    assert summary["requests"] == live["trace"]["requests"] > 25
    assert summary["completed"] == summary["requests"]
    timeline = live["live_loop"]["replicas"]
    # Scaled up by the service (nothing else writes spec.replicas), on sim-server
    # processes that became Ready and served.
    assert max(timeline["desired"]) > 1
    assert max(timeline["ready"]) > 1
    assert summary["max_replicas"] > 1 and summary["gpu_hours"] > 0

    simulated = json.loads((out / "simulated.json").read_text())
    jsonschema.validate(simulated, report.SCHEMA)
    assert simulated["trace"]["requests"] == live["trace"]["requests"]

    comparison = json.loads((out / "comparison.json").read_text())
    for key, _ in live_loop.COMPARED:
        row = comparison["rows"][key]
        assert row["live"] == summary[key]
        assert row["simulated"] == simulated["strategies"]["scaler"][key]


def test_time_compression_and_placeholder_pools_are_refused_with_a_reason(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    policy = Path(live_loop.REPO) / "config" / "llama-8b.yaml"  # actuator: placeholder
    common = ["--trace", str(TRACE), "--duration", "10", "--out", str(tmp_path),
              "--policy", str(policy)]
    assert live_loop.main([*common, "--speed", "10"]) == 2
    assert "only real time" in capsys.readouterr().err
    assert live_loop.main(common) == 2
    assert "spec.nodePool.actuator is 'placeholder'" in capsys.readouterr().err
