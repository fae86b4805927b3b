"""`scaler run --local`: the seed it plans from policies, and the mode end to end as run."""

from __future__ import annotations

import asyncio
import json
import os
import queue
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

import aiohttp
import nats
import pytest
from nats.aio.msg import Msg

from scaler.actuators import client as kube
from scaler.actuators import nodepool
from scaler.actuators import settings as kube_settings
from scaler.core import vocabulary
from scaler.demo import local, local_cli
from scaler.policy import loader
from scaler.policy import model as policy_model
from scaler.signals import messages, nats_core
from scaler.testing import nats_server

# 2023-11-14T22:13:20Z, a Tuesday night in Berlin: no business-hours warm floor.
NIGHT = 1_700_000_000.0
# 2023-11-14T10:00:00Z, 11:00 on a Tuesday in Berlin: the 8B floor of 4 is in force.
MORNING = 1_699_956_000.0
# Bounds on waits, far above what each step needs (a second or two); never measurements.
START_TIMEOUT_S = 60.0
STEP_TIMEOUT_S = 30.0


def shipped() -> dict[str, policy_model.ScalePolicy]:
    result = loader.load_paths([local.DEFAULT_POLICIES])
    assert result.ok, result.errors
    return {policy.key: policy for policy in result.policies}


def policy_text(name: str, *, pool: str, max_replicas: int, gpus: int = 1,
                max_nodes: int | None = None, target_kind: str = "Deployment") -> str:
    cap = "" if max_nodes is None else f", maxNodes: {max_nodes}"
    return f"""\
apiVersion: scaler.io/v1alpha1
kind: ScalePolicy
metadata: {{name: {name}, namespace: team-{name}}}
spec:
  target: {{kind: {target_kind}, name: {name}}}
  replicas: {{min: 1, max: {max_replicas}}}
  signals:
    concurrency: {{targetPerReplica: 10}}
  resources: {{gpusPerReplica: {gpus}}}
  nodePool: {{name: {pool}, gpusPerNode: 8{cap}}}
"""


def loaded(tmp_path: Path, *texts: str) -> list[policy_model.ScalePolicy]:
    path = tmp_path / "policies.yaml"
    path.write_text("---\n".join(texts))
    result = loader.load_paths([path])
    assert result.ok, result.errors
    return list(result.policies)


# -- the seed (pure) ----------------------------------------------------------------------


def test_shipped_examples_seed_their_namespaces_targets_and_pools() -> None:
    policies = list(shipped().values())
    seed = local.plan_seed(policies, now=NIGHT, lease_namespace="default")
    # The Lease's first (it is created), then each policy's namespace once, sorted.
    namespaces = sorted({p.metadata.namespace for p in policies} - {"default"})
    assert seed.namespaces == ("default", *namespaces)
    assert "inference" in namespaces
    targets = {t.name: t for t in seed.targets}
    assert set(targets) == {p.spec.target.name for p in policies}
    # Each at its floor: 70B keeps a warm floor of 2, 8B its min of 1 at night.
    assert (targets["llama-70b"].replicas, targets["llama-8b"].replicas) == (2, 1)
    assert targets["llama-70b"].gpus_per_replica == 8
    assert targets["phi-mini"].resource_name == "nvidia.com/mig-1g.10gb"
    pools = {p.name: p for p in seed.pools}
    # 70B: max 16 replicas of a whole 8-GPU node each; 8B's 32 and the batch summaries'
    # 16 single-GPU replicas share h100-pool: 48 on 8-GPU nodes = 6; phi: 24 MIG slices
    # fit one 56-slice node.
    assert {name: p.nodes for name, p in pools.items()} == {
        "h100-tp8": 16, "h100-pool": 6, "a100-mig": 1}
    assert pools["a100-mig"].resource_names == ("nvidia.com/mig-1g.10gb",)
    assert seed.skipped == ()


def test_the_warm_floor_in_force_sets_the_initial_replicas() -> None:
    llama_8b = shipped()["inference/llama-8b"]
    assert local.initial_replicas(llama_8b, now=NIGHT) == 1
    assert local.initial_replicas(llama_8b, now=MORNING) == 4


def test_a_shared_pool_sums_its_models_within_the_smallest_max_nodes(tmp_path: Path) -> None:
    policies = loaded(
        tmp_path,
        policy_text("a", pool="shared", max_replicas=16),              # 2 nodes
        policy_text("b", pool="shared", max_replicas=9, gpus=4),       # 5 nodes
        policy_text("c", pool="alone", max_replicas=20, max_nodes=2),  # 3 nodes, capped
    )
    seed = local.plan_seed(policies, now=NIGHT, lease_namespace="scaler")
    assert {p.name: p.nodes for p in seed.pools} == {"shared": 7, "alone": 2}
    assert seed.namespaces == ("scaler", "team-a", "team-b", "team-c")
    policies = loaded(tmp_path, policy_text("a", pool="shared", max_replicas=16, max_nodes=1),
                      policy_text("b", pool="shared", max_replicas=9, gpus=4))
    assert [p.nodes for p in local.plan_seed(policies, now=NIGHT,
                                             lease_namespace="scaler").pools] == [1]


def test_a_target_the_emulator_cannot_serve_is_named_not_seeded(tmp_path: Path) -> None:
    policies = loaded(tmp_path, policy_text("a", pool="p", max_replicas=2,
                                            target_kind="StatefulSet"))
    seed = local.plan_seed(policies, now=NIGHT, lease_namespace="default")
    assert seed.targets == ()
    assert len(seed.skipped) == 1 and "team-a/a" in seed.skipped[0]
    assert [p.nodes for p in seed.pools] == [1]  # its pool is still there


def test_a_node_is_a_ready_gpu_server_of_its_pool() -> None:
    pool = local.PoolSeed(name="h100", nodes=2, gpus_per_node=8,
                          resource_names=("nvidia.com/gpu",),
                          labels={nodepool.POOL_LABEL: "h100", "gpu": "h100"})
    assert pool.node_names() == ["h100-0", "h100-1"]
    node = local.node_manifest(pool, "h100-1")
    assert node["metadata"]["labels"][nodepool.POOL_LABEL] == "h100"
    assert node["metadata"]["labels"]["gpu"] == "h100"
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    assert node["status"]["conditions"][0]["status"] == "True"


@pytest.mark.parametrize(("text", "seconds"), [
    ("20", 20.0), ("20s", 20.0), ("1.5m", 90.0), ("500ms", 0.5), (" 2S ", 2.0), ("0", 0.0)])
def test_durations_parse(text: str, seconds: float) -> None:
    assert local_cli.parse_seconds(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "s", "-1s", "ten", "nan", "inf"])
def test_bad_durations_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="duration"):
        local_cli.parse_seconds(text)


def test_the_load_wave_goes_from_the_floor_to_four_above_and_back() -> None:
    period = local.LOAD_PERIOD_S
    wave = [local.wave_replicas(floor=1, ceiling=32, elapsed_s=t)
            for t in (0, period / 4, period / 2, period)]
    assert wave == pytest.approx([1, 3, 5, 1])
    assert local.wave_replicas(floor=3, ceiling=4, elapsed_s=period / 2) == pytest.approx(4)


def test_load_asks_for_replicas_in_the_policy_s_own_units() -> None:
    policies = shipped()
    llama_8b = policies["inference/llama-8b"]
    values = local.load_values(llama_8b, 2.5)
    assert llama_8b.spec.signals.concurrency is not None
    assert values == {vocabulary.Signal.IN_FLIGHT:
                      2.5 * llama_8b.spec.signals.concurrency.target_per_replica}
    streams = local.load_streams(list(policies.values()), prefix="scaler.signals")
    assert {s.subject for s in streams} == {
        f"scaler.signals.{key.replace('/', '.')}" for key in policies}


async def test_load_publishes_contract_messages_for_every_model() -> None:
    policies = list(shipped().values())
    streams = local.load_streams(policies, prefix="scaler.signals")
    config = nats_core.config_from_policies(policies, wildcard=True)
    with nats_server.NatsServer(jetstream=False) as server:
        client = await nats.connect(server.url)
        received: list[tuple[str, bytes]] = []

        async def keep(message: Msg) -> None:
            received.append((message.subject, message.data))

        await client.subscribe("scaler.signals.>", cb=keep)
        await client.flush()
        load = asyncio.create_task(local.publish_load(server.url, streams), name="test-load")
        try:
            async with asyncio.timeout(STEP_TIMEOUT_S):
                while {subject for subject, _ in received} != {s.subject for s in streams}:
                    await asyncio.sleep(0.05)
        finally:
            load.cancel()
            await asyncio.gather(load, return_exceptions=True)
            await client.close()
    for subject, body in received:
        route = nats_core.route_for(subject, config)
        assert isinstance(route, messages.Route) and route.expected is not None
        parsed = messages.parse(body, now=time.time(), route=route)
        assert not isinstance(parsed, messages.Drop), parsed
        # The first second of the wave: each model's floor, in its own units.
        policy = shipped()[route.expected]
        floor = local.initial_replicas(policy, now=time.time())
        assert {s.signal: s.value for s in parsed} == pytest.approx(
            local.load_values(policy, floor), abs=0.5)


# -- end to end, as a user runs it ---------------------------------------------------------


class Lines:
    """A child's stdout read by a thread, so every wait for a line has a bound."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        self.thread = threading.Thread(target=self._pump, daemon=True)
        self.thread.start()

    def _pump(self) -> None:
        for line in self.stream:
            self.lines.put(line)
        self.lines.put(None)

    def close(self) -> None:
        """After the child exited: the reader has seen the end, the pipe is closed."""
        self.thread.join(timeout=STEP_TIMEOUT_S)
        self.stream.close()

    def banner(self, *, timeout_s: float, log: Path) -> dict[str, str]:
        """The banner's `  label  value` lines, up to its last one, as {label: value}."""
        deadline = time.monotonic() + timeout_s
        fields: dict[str, str] = {}
        while True:
            line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            assert line is not None, "the local mode exited before its banner: " + "".join(
                self.seen) + log.read_text()[-3000:]
            self.seen.append(line)
            if line.startswith("Ctrl-C"):
                return fields
            if line.startswith("  "):
                label, _, value = line.strip().partition(" ")
                fields[label] = value.strip()


def printed_signal(command: str) -> tuple[str, str, bytes]:
    """(server, subject, body) of the banner's `nats pub` line, its `ts` filled in now as
    the shell would."""
    words = shlex.split(command.replace("'$(date +%s)'", str(int(time.time()))))
    assert words[:2] == ["nats", "pub"] and words[2] == "-s", words
    return words[3], words[4], words[5].encode()


def children(pid: int) -> list[int]:
    """Direct children of `pid` (every thread's), from /proc."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(child) for child in (task / "children").read_text().split()]
    return found


def alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in status


async def eventually_get(api: kube.KubeApi, path: str,
                         check: Callable[[kube.Obj], bool]) -> kube.Obj:
    """The object at `path` once `check` holds for it (polled every 100 ms, bounded)."""
    async with asyncio.timeout(STEP_TIMEOUT_S):
        while True:
            obj = await api.get(path)
            if check(obj):
                return obj
            await asyncio.sleep(0.1)


async def test_local_mode_scales_the_seeded_deployment_and_stops_cleanly(
        tmp_path: Path) -> None:
    log_path = tmp_path / "stderr.log"
    stderr = log_path.open("w")
    process = subprocess.Popen(
        [sys.executable, "-m", "scaler", "run", "--local", "--cold-start", "0.5s"],
        stdout=subprocess.PIPE, stderr=stderr, text=True, cwd=tmp_path,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert process.stdout is not None
    output = Lines(process.stdout)
    try:
        fields = output.banner(timeout_s=START_TIMEOUT_S, log=log_path)
        nats_url, http_url = fields["nats"].split()[0], fields["http"].split()[0]
        kubeconfig = Path(fields["kubeconfig"])
        metrics_url = fields["metrics-api"].split()[0]
        assert kubeconfig.is_file()
        spawned = children(process.pid)
        assert spawned, "the embedded nats-server is a child process"

        # The banner's own commands, as a person would paste them.
        server, subject, body = printed_signal(fields["signal"])
        assert server == nats_url
        route = nats_core.route_for(
            subject, nats_core.config_from_policies(shipped().values(), wildcard=True))
        assert isinstance(route, messages.Route), route  # a subject the service listens on
        sent = messages.parse(body, now=time.time(), route=route)
        assert not isinstance(sent, messages.Drop), sent  # a contract message for its model
        key = json.loads(body)["namespace"] + "/" + json.loads(body)["model"]
        assert [s.signal for s in sent] == [vocabulary.Signal.IN_FLIGHT]
        policy = shipped()[key]
        path = (f"/apis/apps/v1/namespaces/{policy.metadata.namespace}/deployments/"
                f"{policy.spec.target.name}")
        settings = kube_settings.KubeSettings(kubeconfig=str(kubeconfig))
        api_client = await kube.make_api_client(settings)
        api = kube.KubeApi(api_client, timeout_s=5.0)
        publisher = await nats.connect(nats_url)
        try:
            lease = await api.get("/apis/coordination.k8s.io/v1/namespaces/default/leases/"
                                  "scaler-leader")
            assert lease["spec"]["holderIdentity"]  # elected on the emulator's Lease
            before = (await api.get(path))["spec"]["replicas"]
            # The printed message asks for two more replicas than the model started with.
            wanted = local.initial_replicas(policy, now=time.time()) + 2
            assert wanted > before

            async def publish() -> None:
                while True:  # repeated: one message could land before the subscription
                    await publisher.publish(subject, body)
                    await asyncio.sleep(0.5)

            publishing = asyncio.create_task(publish(), name="test-publisher")
            try:
                # The service scaled the emulator's Deployment, and the emulator's
                # controller brought every replica to Ready after the short cold start.
                scaled = await eventually_get(api, path, lambda d: (
                    d["spec"]["replicas"] >= wanted
                    and (d.get("status") or {}).get("readyReplicas") == d["spec"]["replicas"]))
            finally:
                publishing.cancel()
                await asyncio.gather(publishing, return_exceptions=True)
            desired = scaled["spec"]["replicas"]

            explain = shlex.split(fields["explain"])
            assert explain == ["scaler", "explain", key, "--url", http_url]
            explained = await asyncio.to_thread(
                subprocess.run, [sys.executable, "-m", "scaler", *explain[1:], "--json"],
                capture_output=True, text=True, timeout=30)
            assert explained.returncode == 0, explained.stderr
            document = json.loads(explained.stdout)
            assert document["decision"]["desired"] == desired
            assert document["decision"]["winner"] == "concurrency"

            curl = shlex.split(fields["curl"])
            query, authorization = curl[-1], curl[curl.index("-H") + 1]
            assert authorization == f"Authorization: Bearer {fields['token']}"
            assert query.startswith(f"{metrics_url}/namespaces/{policy.metadata.namespace}/")
            async with aiohttp.ClientSession() as session:
                async with session.get(query, ssl=False) as anonymous:
                    assert anonymous.status == 401  # the token is what lets one in
                async with session.get(query, ssl=False, headers={
                        "Authorization": authorization.partition(": ")[2]}) as answer:
                    assert answer.status == 200, await answer.text()
                    metric = await answer.json()
            assert metric["kind"] == "ExternalMetricValueList"
            assert [item["value"] for item in metric["items"]] == [str(desired)]
        finally:
            await publisher.close()
            await api_client.close()

        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=STEP_TIMEOUT_S) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        output.close()
        stderr.close()
    log = log_path.read_text()
    assert "scaler stopped" in log, log[-3000:]
    assert [pid for pid in spawned if alive(pid)] == []
    assert not kubeconfig.parent.exists()  # the state dir went with the process


def test_local_options_without_local_are_a_usage_error() -> None:
    done = subprocess.run([sys.executable, "-m", "scaler", "run", "--load"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert "--load and --cold-start go with --local" in done.stderr


def test_invalid_policies_are_refused_before_anything_starts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(policy_text("a", pool="p", max_replicas=2).replace("max: 2", "max: 0"))
    assert local.main(local.LocalOptions(policies=(bad,))) == 2
    error = capsys.readouterr().err
    assert str(bad) in error and "replicas" in error
    assert local.main(local.LocalOptions(policies=(tmp_path / "absent",))) == 2
