"""Pure parts as tables: selectors, plurals, backoff, pod timelines, node capacity, patches."""

from __future__ import annotations

from typing import Any

import pytest

from scaler.actuators import resources, selectors, timeline
from scaler.emulator import patch
from scaler.engine import types


@pytest.mark.parametrize(
    ("selector", "labels", "matches"),
    [
        ("app=web", {"app": "web"}, True),
        ("app==web", {"app": "api"}, False),
        ("app!=web", {}, True),
        ("app in (web, api),tier", {"app": "api", "tier": "x"}, True),
        ("app in (web,api),tier", {"app": "api"}, False),
        ("app notin (web)", {"app": "api"}, True),
        ("!canary", {"canary": "1"}, False),
        ("", {"anything": "x"}, True),
    ],
)
def test_label_selectors(selector: str, labels: dict[str, str], matches: bool) -> None:
    assert selectors.parse_selector(selector).matches(labels) is matches


def test_label_selector_round_trip_and_errors() -> None:
    parsed = selectors.from_label_selector({
        "matchLabels": {"app": "web"},
        "matchExpressions": [{"key": "tier", "operator": "In", "values": ["a", "b"]}]})
    assert str(parsed) == "app=web,tier in (a,b)"
    assert selectors.parse_selector(str(parsed)) == parsed
    with pytest.raises(ValueError):
        selectors.parse_selector("app in web")


def test_field_selectors() -> None:
    pod = {"metadata": {"name": "p"}, "spec": {"nodeName": "n1"}, "status": {"phase": "Running"}}
    assert selectors.fields_match(selectors.parse_selector("spec.nodeName=n1"), pod)
    assert selectors.fields_match(selectors.parse_selector("status.phase!=Pending"), pod)
    assert not selectors.fields_match(selectors.parse_selector("spec.nodeName="), pod)


@pytest.mark.parametrize(
    ("kind", "plural"),
    [("Deployment", "deployments"), ("StatefulSet", "statefulsets"),
     ("LeaderWorkerSet", "leaderworkersets"), ("Policy", "policies"), ("Gateway", "gateways"),
     ("Ingress", "ingresses"), ("MachineDeployment", "machinedeployments")],
)
def test_plural_of(kind: str, plural: str) -> None:
    assert resources.plural_of(kind) == plural


def _pod(**status: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u1", "labels": {"app": "x"},
                     "creationTimestamp": "2025-11-29T10:00:00Z"},
        "spec": {"nodeName": "n1", "containers": [
            {"name": "a", "resources": {"limits": {"nvidia.com/gpu": "2", "cpu": "1"}}},
            {"name": "b", "resources": {"requests": {"nvidia.com/gpu": 1}}}]},
        "status": status,
    }


T0 = 1764410400.0  # 2025-11-29T10:00:00Z


def test_pod_timeline_reads_every_step() -> None:
    pod = _pod(phase="Running", conditions=[
        {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2025-11-29T10:04:10Z"},
        {"type": "Ready", "status": "True", "lastTransitionTime": "2025-11-29T10:06:10Z"}],
        containerStatuses=[
            {"name": "a", "state": {"running": {"startedAt": "2025-11-29T10:05:00Z"}}},
            {"name": "b", "state": {"running": {"startedAt": "2025-11-29T10:05:30Z"}}}])
    line = timeline.pod_timeline(pod)
    assert (line.created_at, line.scheduled_at, line.started_at, line.ready_at) == (
        T0, T0 + 250, T0 + 330, T0 + 370)
    assert line.requests == {"nvidia.com/gpu": 3}
    assert line.live and not line.placeholder
    # The node was created 40 s after the pod: it was booted for it.
    assert timeline.cold_start(line, node_created_at=T0 + 40) == types.ColdStartObservation(
        created_at=T0, ready_at=T0 + 370, node_boot_s=250)
    # On an older node the whole wait is pod start.
    assert timeline.cold_start(line, node_created_at=T0 - 3600) == types.ColdStartObservation(
        created_at=T0, ready_at=T0 + 370, node_boot_s=0)


def test_not_ready_pod_gives_no_observation() -> None:
    line = timeline.pod_timeline(_pod(phase="Pending", conditions=[
        {"type": "Ready", "status": "False", "lastTransitionTime": "2025-11-29T10:00:01Z"}]))
    assert line.ready_at is None
    assert timeline.cold_start(line, node_created_at=None) is None


def _node(name: str, *, gpus: int, ready: str = "True", cordoned: bool = False,
          labels: dict[str, str] | None = None) -> timeline.NodeInfo:
    return timeline.node_info({
        "metadata": {"name": name, "labels": labels if labels is not None else {"pool": "a"}},
        "spec": {"unschedulable": cordoned},
        "status": {"allocatable": {"nvidia.com/gpu": str(gpus)},
                   "conditions": [{"type": "Ready", "status": ready}]}})


def _running(node: str, gpus: int, *, placeholder: bool = False) -> timeline.PodTimeline:
    return timeline.PodTimeline(
        uid=f"{node}-{gpus}", namespace="ns", name="p", node_name=node,
        labels={timeline.PLACEHOLDER_LABEL: "true"} if placeholder else {},
        created_at=0, scheduled_at=0, started_at=0, ready_at=0, ready=True, terminating=False,
        finished=False, requests={"nvidia.com/gpu": gpus})


def test_pool_capacity_counts_only_healthy_nodes_and_whole_replicas() -> None:
    nodes = [_node("n1", gpus=8), _node("n2", gpus=8), _node("sick", gpus=8, ready="Unknown"),
             _node("cordoned", gpus=8, cordoned=True), _node("b", gpus=8, labels={"pool": "b"})]
    pods = [_running("n1", 5), _running("n2", 1), _running("n2", 4, placeholder=True),
            _running("sick", 0)]
    capacity = timeline.pool_capacity(nodes=nodes, pods=pods, node_selector={"pool": "a"},
                                      resource_name="nvidia.com/gpu", gpus_per_replica=4)
    assert capacity.unhealthy == ("cordoned", "sick")
    assert (capacity.nodes, capacity.healthy_nodes) == (4, 2)
    # n1 has 3 free (0 replicas of 4); n2 has 7 free, the placeholder being preemptible (1).
    assert (capacity.allocatable_gpus, capacity.used_gpus, capacity.free_replica_slots) == (
        16, 6, 1)


@pytest.mark.parametrize(
    ("target", "body", "expected"),
    [
        ({"a": 1, "b": {"c": 2}}, {"b": {"c": None, "d": 3}}, {"a": 1, "b": {"d": 3}}),
        ({"l": [1, 2]}, {"l": [3]}, {"l": [3]}),
        ({"a": 1}, {"a": None, "z": {"y": 1}}, {"z": {"y": 1}}),
    ],
)
def test_merge_patch(target: Any, body: Any, expected: Any) -> None:
    assert patch.merge_patch(target, body) == expected


def test_strategic_merge_patch_merges_lists_by_key() -> None:
    target = {"containers": [{"name": "a", "image": "1"}, {"name": "b", "image": "1"}],
              "tolerations": [{"key": "x"}]}
    body = {"containers": [{"name": "b", "image": "2"}, {"name": "c", "image": "3"},
                           {"name": "a", "$patch": "delete"}],
            "tolerations": [{"key": "y"}]}
    assert patch.strategic_merge_patch(target, body) == {
        "containers": [{"name": "b", "image": "2"}, {"name": "c", "image": "3"}],
        "tolerations": [{"key": "y"}]}  # no merge key: replaced
    assert patch.strategic_merge_patch({"m": {"a": 1}}, {"m": {"$patch": "replace", "b": 2}}) == {
        "m": {"b": 2}}


def test_json_patch_is_all_or_nothing() -> None:
    doc = {"spec": {"replicas": 1, "list": [1, 2]}}
    ops = [{"op": "test", "path": "/spec/replicas", "value": 1},
           {"op": "replace", "path": "/spec/replicas", "value": 4},
           {"op": "add", "path": "/spec/list/-", "value": 3},
           {"op": "copy", "from": "/spec/replicas", "path": "/spec/copy"},
           {"op": "remove", "path": "/spec/list/0"}]
    assert patch.json_patch(doc, ops) == {"spec": {"replicas": 4, "list": [2, 3], "copy": 4}}
    with pytest.raises(patch.PatchError):
        patch.json_patch(doc, [{"op": "replace", "path": "/spec/replicas", "value": 9},
                               {"op": "test", "path": "/spec/replicas", "value": 1}])
    assert doc == {"spec": {"replicas": 1, "list": [1, 2]}}
