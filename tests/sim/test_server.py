"""`scaler sim-server`: the official openai client against it, queueing, /metrics, NATS."""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator

import aiohttp
import openai
import pytest
from nats.aio.client import Client as NatsClient
from prometheus_client.parser import text_string_to_metric_families

from scaler.core import histogram, vocabulary
from scaler.signals import messages, nats_core, prometheus
from scaler.sim import profiles, server
from scaler.testing import nats_server, prometheus_server

HOST = "127.0.0.1"


def tiny(profile: profiles.ReplicaProfile, *, max_batch: int = 2,
         base_seconds: float = 0.02) -> profiles.ReplicaProfile:
    """The 8B profile cut down so queueing shows in a second: batch 2, fixed 20 ms steps,
    prefill that takes ~nothing."""
    return profile.model_copy(update={
        "max_batch": max_batch, "prefill_tokens_per_second": 1e7,
        "decode_step": profiles.DecodeStep(base_seconds=base_seconds, per_sequence_seconds=0.0),
    })


@contextlib.asynccontextmanager
async def serving(profile: profiles.ReplicaProfile, *, speed: float = 1.0, **options: object
                  ) -> AsyncIterator[tuple[server.Server, openai.AsyncOpenAI]]:
    app = server.Server(server.Replica(profile, speed=speed), served_model="sim")
    async with server.running(app, host=HOST, port=0, **options) as url:  # type: ignore[arg-type]
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        try:
            yield app, client
        finally:
            await client.close()


def test_a_step_is_base_plus_batch_plus_prefill_chunk(
        profile_8b: profiles.ReplicaProfile) -> None:
    plan = server.plan_step(profile_8b, decoding=100, prompt_left=[20_000.0, 500.0])
    chunk = profile_8b.max_batched_tokens - 100
    step = profile_8b.decode_step
    assert plan.chunks == (chunk, 0.0)  # FIFO: the first prompt takes the whole budget
    assert plan.seconds == pytest.approx(step.base_seconds + 100 * step.per_sequence_seconds
                                         + chunk / profile_8b.prefill_tokens_per_second)
    decode_only = server.plan_step(profile_8b, decoding=3, prompt_left=[])
    assert decode_only.seconds == pytest.approx(step.base_seconds + 3 * step.per_sequence_seconds)


async def test_the_openai_client_works_unchanged(profile_8b: profiles.ReplicaProfile) -> None:
    async with serving(tiny(profile_8b, base_seconds=0.002)) as (_, client):
        assert [m.id async for m in client.models.list()] == ["sim"]

        completion = await client.completions.create(
            model="sim", prompt="x" * 400, max_tokens=7, extra_body={"ignore_eos": True})
        assert completion.usage is not None
        assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (100, 7)
        assert completion.choices[0].finish_reason == "length"
        assert len(completion.choices[0].text) == 7 * server.CHARS_PER_TOKEN

        by_ids = await client.completions.create(model="sim", prompt=list(range(33)),
                                                 max_tokens=2)
        assert by_ids.usage is not None and by_ids.usage.prompt_tokens == 33

        chat = await client.chat.completions.create(
            model="sim", messages=[{"role": "user", "content": "hello"}], max_tokens=4,
            extra_body={"ignore_eos": True})
        assert chat.choices[0].message.role == "assistant"
        assert chat.usage is not None and chat.usage.completion_tokens == 4

        stream = await client.completions.create(model="sim", prompt="hi", max_tokens=5,
                                                 stream=True, extra_body={"ignore_eos": True})
        texts = [c.choices[0].text async for c in stream if c.choices]
        assert "".join(texts) == chat_free_text(5) and len([t for t in texts if t]) == 5

        chunks = [c async for c in await client.chat.completions.create(
            model="sim", messages=[{"role": "user", "content": "hello"}], max_tokens=6,
            stream=True, stream_options={"include_usage": True},
            extra_body={"ignore_eos": True})]
        content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert content == chat_free_text(6)
        assert chunks[0].choices[0].delta.role == "assistant"
        assert chunks[-2].choices[0].finish_reason == "length"
        assert chunks[-1].choices == [] and chunks[-1].usage is not None
        assert chunks[-1].usage.completion_tokens == 6
        assert all(c.usage is None for c in chunks[:-1])


def chat_free_text(tokens: int) -> str:
    return "".join(server.WORDS[i % len(server.WORDS)] for i in range(tokens))


async def test_bad_requests_get_openai_errors(profile_8b: profiles.ReplicaProfile) -> None:
    async with serving(tiny(profile_8b)) as (_, client):
        with pytest.raises(openai.NotFoundError, match="does not exist"):
            await client.completions.create(model="other", prompt="hi", max_tokens=1)
        too_long = profile_8b.max_model_len  # prompt of 1 token + maxModelLen > the context
        with pytest.raises(openai.BadRequestError, match="maximum context length"):
            await client.completions.create(model="sim", prompt="hi", max_tokens=too_long)
        with pytest.raises(openai.BadRequestError, match="prompt"):
            await client.completions.create(model="sim", prompt=[{"a": 1}],  # type: ignore[arg-type]
                                            max_tokens=1)


def test_sampled_lengths_stop_early_and_ignore_eos_does_not() -> None:
    lengths = server.Lengths(policy="sample", mean_tokens=20)
    rng = random.Random(1)
    drawn = [lengths.draw(max_tokens=1000, ignore_eos=False, rng=rng) for _ in range(2000)]
    assert 17 < sum(drawn) / len(drawn) < 23 and min(drawn) >= 1
    assert {lengths.draw(max_tokens=50, ignore_eos=True, rng=rng) for _ in range(20)} == {50}
    fixed = server.Lengths(policy="max")
    assert fixed.draw(max_tokens=9, ignore_eos=False, rng=rng) == 9


async def test_a_client_that_goes_away_frees_its_batch_slot(
        profile_8b: profiles.ReplicaProfile) -> None:
    # 1,000 tokens at 20 ms a step would hold the slot for 20 s; a closed stream frees it.
    async with serving(tiny(profile_8b, base_seconds=0.02)) as (app, client):
        stream = await client.completions.create(model="sim", prompt="hi", max_tokens=1000,
                                                 stream=True, extra_body={"ignore_eos": True})
        async for _ in stream:
            break
        assert len(app.replica.running) == 1
        await stream.close()
        for _ in range(200):  # bounded: 2 s
            if not app.replica.running:
                break
            await asyncio.sleep(0.01)
        assert not app.replica.running and app.replica.kv_used == 0
        assert app.replica.counters.generation_tokens < 1000


@pytest.mark.parametrize(("model_step", "speed"), [(0.02, 1.0), (0.2, 10.0)])
async def test_ttft_grows_with_the_queue_beyond_max_batch(
        profile_8b: profiles.ReplicaProfile, model_step: float, speed: float) -> None:
    # Batch 2, 20 ms steps (or 200 ms model steps run 10x faster), 20 tokens each: a pair
    # is served in 20 steps (0.4 s of wall time), so the 3rd and 4th requests wait one
    # pair's time, the 5th and 6th two.
    output, step = 20, model_step / speed
    profile = tiny(profile_8b, max_batch=2, base_seconds=model_step)
    async with serving(profile, speed=speed) as (app, client):

        async def ttft() -> float:
            started = time.perf_counter()
            stream = await client.completions.create(
                model="sim", prompt="p" * 40, max_tokens=output, stream=True,
                extra_body={"ignore_eos": True})
            first: float | None = None
            async for chunk in stream:
                if first is None and chunk.choices and chunk.choices[0].text:
                    first = time.perf_counter() - started
            assert first is not None
            return first

        tasks = [asyncio.create_task(ttft()) for _ in range(6)]
        try:
            replica = app.replica
            # The six arrive within a pair's time; one arriving during an iteration joins
            # the batch at the next. Bounded: 5 s.
            for _ in range(500):
                assert len(replica.running) <= 2
                if len(replica.running) == 2 and len(replica.waiting) == 4:
                    break
                await asyncio.sleep(0.01)
            assert len(replica.running) == 2 and len(replica.waiting) == 4
            ttfts = sorted(await asyncio.gather(*tasks))
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    pair = output * step
    assert max(ttfts[:2]) < pair
    assert min(ttfts[2:4]) >= 0.9 * pair
    assert min(ttfts[4:]) >= 0.9 * 2 * pair


async def test_metrics_are_what_the_vllm_preset_reads(
        profile_8b: profiles.ReplicaProfile) -> None:
    if prometheus_server.prometheus_binary() is None:
        pytest.skip("no `prometheus` binary (apt-get install prometheus)")
    async with serving(tiny(profile_8b, base_seconds=0.005)) as (_, client):
        load_stop = asyncio.Event()

        async def load() -> None:
            while not load_stop.is_set():
                await client.completions.create(model="sim", prompt="q" * 80, max_tokens=20,
                                                extra_body={"ignore_eos": True})

        loader = asyncio.create_task(load())
        try:
            url = str(client.base_url).removesuffix("/v1/")
            families = {f.name: f for f in text_string_to_metric_families(
                await _get(f"{url}/metrics"))}
            ttft = families["vllm:time_to_first_token_seconds"]
            bounds = [float(s.labels["le"]) for s in ttft.samples if s.name.endswith("_bucket")]
            assert tuple(bounds[:-1]) == histogram.VLLM_TTFT_BUCKETS
            prom = prometheus_server.PrometheusServer(
                targets=[url.removeprefix("http://")], scrape_interval_s=0.5)
            await asyncio.to_thread(prom.start)
            try:
                queries = prometheus.preset_queries(
                    "vllm", sel=prometheus.selector({"model_name": "sim"}),
                    latency_metric=vocabulary.LatencyMetric.TTFT)
                for signal, promql in sorted(queries.items()):
                    result = await asyncio.to_thread(prom.wait_for, promql, timeout_s=20)
                    assert prometheus.value_of(signal, result) is not None, signal
                tokens = queries[vocabulary.Signal.TOKENS_PER_SECOND]
                rate = prometheus.value_of(vocabulary.Signal.TOKENS_PER_SECOND,
                                           await asyncio.to_thread(prom.query, tokens))
                assert rate is not None and rate > 0
            finally:
                await asyncio.to_thread(prom.close)
        finally:
            load_stop.set()
            await loader


async def _get(url: str) -> str:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        return await response.text()


async def test_signal_messages_reach_nats_and_parse(profile_8b: profiles.ReplicaProfile) -> None:
    with nats_server.NatsServer() as nats:
        subscriber = NatsClient()
        await subscriber.connect(servers=[nats.url])
        try:
            subject = nats_core.default_subject(nats_core.DEFAULT_PREFIX, "inference", "sim")
            subscription = await subscriber.subscribe(subject)
            async with serving(tiny(profile_8b), nats_url=nats.url, model_key="inference/sim",
                               source="replica-a", publish_interval_s=0.2) as (_, client):
                await client.completions.create(model="sim", prompt="hello", max_tokens=3)
                received: list[tuple[messages.ParseResult, bytes]] = []
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline:
                    msg = await subscription.next_msg(timeout=5)
                    parsed = messages.parse(msg.data, now=time.time(),
                                            route=messages.Route(expected="inference/sim"))
                    received.append((parsed, msg.data))
                    if not isinstance(parsed, messages.Drop) and any(
                            s.histogram is not None for s in parsed):
                        break
        finally:
            await subscriber.close()
    results = [r for r, _ in received]
    assert all(not isinstance(r, messages.Drop) for r in results), results
    last = results[-1]
    assert not isinstance(last, messages.Drop)
    by_signal = {s.signal: s for s in last}
    assert {s.source for s in last} == {"nats/replica-a"}
    assert by_signal[vocabulary.Signal.P95_LATENCY].histogram is not None
    assert by_signal[vocabulary.Signal.P95_LATENCY].metric is vocabulary.LatencyMetric.TTFT
    assert by_signal[vocabulary.Signal.TOKENS_PER_SECOND].value > 0  # type: ignore[operator]


def test_the_command_serves_until_sigterm() -> None:
    command = [sys.executable, "-m", "scaler", "sim-server", "--port", "0", "--speed", "5"]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True) as process:
        try:
            assert process.stdout is not None
            line = process.stdout.readline()  # the banner, printed once listening
            url = line.strip().rsplit(" ", 1)[-1]
            assert url.startswith(f"http://{HOST}:") and url.endswith("/v1"), line
            with urllib.request.urlopen(url.removesuffix("/v1") + "/health", timeout=5) as r:
                assert r.status == 200
        finally:
            process.send_signal(signal.SIGTERM)
            code = process.wait(timeout=20)
    assert code == 0


def test_the_command_names_a_bad_flag() -> None:
    done = subprocess.run([sys.executable, "-m", "scaler", "sim-server", "--nats",
                           "nats://127.0.0.1:1", "--model-key", "no-slash"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr == ("scaler sim-server: --model-key must be namespace/name, not "
                           "'no-slash'\n")
