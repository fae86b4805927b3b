"""GPU accounting in the service: useful GPU-hours from DCGM's SM-active ratio (the replicas'
busy ratio where it is absent), and GPUs excluded from a pool, in the explanation and /metrics."""

from __future__ import annotations

import dataclasses

import pytest
from prometheus_client import exposition

from scaler.engine import cost as engine_cost
from scaler.service import explain, observability
from scaler.service import state as service_state

from . import factories

DAY = 24 * 3600.0


def with_sm_active(obs: service_state.Observation, ratio: float | None
                   ) -> service_state.Observation:
    return dataclasses.replace(obs, cluster=dataclasses.replace(obs.cluster,
                                                                gpu_sm_active=ratio))


def test_sm_active_is_the_useful_share_when_dcgm_reads_it() -> None:
    # 4 one-GPU replicas for 24 h at 2.50: 96 GPU-hours, 240. The replicas report 67.2 in
    # flight of 192 (35 % busy), but DCGM says their SMs are active 20 % of the time:
    # useful 96 x 0.2 = 19.2 GPU-hours, idle 0.8 x 240 = 192.
    policy = factories.policy()
    reported = factories.observation(ready=4, current=4, in_flight=67.2)
    measured = with_sm_active(reported, 0.2)
    ratio, source = service_state.busy_reading(policy, measured)
    assert ratio == pytest.approx(0.2) and source == service_state.BUSY_DCGM
    ratio, source = service_state.busy_reading(policy, reported)
    assert ratio == pytest.approx(0.35) and source == service_state.BUSY_REPLICAS
    totals = service_state.accrue(engine_cost.Cost(), policy=policy, since=measured,
                                  until=factories.NOW + DAY)
    assert totals.useful_gpu_hours == pytest.approx(19.2)
    assert totals.idle_cost == pytest.approx(192.0)


def test_metrics_name_the_source_of_the_useful_ratio() -> None:
    policies = [factories.policy("measured", labels={"tenant": "search"}),
                factories.policy("estimated", labels={"tenant": "search"})]
    state = service_state.ServiceState()
    state.set_policies(policies, status=service_state.PolicyLoadStatus(at=0.0, policies=2))
    state.record("inference/measured", with_sm_active(
        factories.observation(ready=4, in_flight=67.2, model_name="inference/measured"), 0.2))
    state.record("inference/estimated", factories.observation(
        ready=4, in_flight=67.2, model_name="inference/estimated"))
    text = exposition.generate_latest(observability.make_registry(
        state, clock=lambda: factories.NOW + 3600, process=False)).decode()
    assert ('scaler_useful_ratio{model="measured",namespace="inference",source="dcgm"} 0.2'
            in text)
    assert ('scaler_useful_ratio{model="estimated",namespace="inference",source="replicas"} '
            '0.35' in text)
    # One hour of 4 GPUs: 0.8 useful GPU-hours measured, 1.4 estimated.
    assert ('scaler_useful_gpu_hours_total{cost_center="",model="measured",'
            'namespace="inference",tenant="search"} 0.8' in text)


def test_excluded_gpus_are_explained_and_counted() -> None:
    note = "node gpu-3: 2 of 8 GPUs excluded: XID 79 on GPU 5, 6"
    policy = factories.policy(spec={"nodePool": {"name": "h100", "gpusPerNode": 8}})
    state = factories.loaded_state(policy)
    obs = factories.observation()
    obs = dataclasses.replace(obs, cluster=dataclasses.replace(
        obs.cluster, excluded_gpus=2, capacity_notes=(note,)))
    state.record(policy.key, obs)
    status = state.status(policy.key)
    assert status is not None and status.last is not None
    document = explain.decision_document(status, status.last)
    assert document["cluster"]["capacity_notes"] == [note]
    assert f"Pool capacity: {note}." in explain.describe(document).splitlines()
    text = exposition.generate_latest(observability.make_registry(
        state, clock=lambda: factories.NOW, process=False)).decode()
    assert 'scaler_pool_excluded_gpus{model="llama-70b",namespace="inference"} 2.0' in text
