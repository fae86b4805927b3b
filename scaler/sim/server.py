"""A simulated OpenAI-compatible model server: a replica profile's continuous batching, live."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import random
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal, NamedTuple

from aiohttp import web
from nats.aio.client import Client as NatsClient
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric

from scaler.core import histogram as core_histogram
from scaler.core import vocabulary
from scaler.signals import messages, nats_core
from scaler.sim import profiles

log = logging.getLogger(__name__)

# The tokenizer estimate: English text is ~4 characters per token for Llama-class BPE
# vocabularies (a 2,000-character prompt counts as 500 tokens).
CHARS_PER_TOKEN: Final = 4
# Chat templates wrap each message in role markers: ~4 tokens a message in Llama 3's
# (<|start_header_id|>role<|end_header_id|>\n\n ... <|eot_id|>).
TOKENS_PER_MESSAGE: Final = 4
# OpenAI's (and vLLM's) default max_tokens for /v1/completions; chat defaults to the rest
# of the context (maxModelLen - prompt), as vLLM does.
COMPLETIONS_DEFAULT_MAX_TOKENS: Final = 16
# The text of each generated token: 4 characters, so generated text re-counts at ~1 token
# each under CHARS_PER_TOKEN.
WORDS: Final = (" the", " sim", " ran", " one", " new", " way", " and", " out")
# Buckets of both latency histograms: vLLM's TTFT bounds (its e2e bounds differ, from
# 0.3 s to 7,680 s; the TTFT ones cover that range too, down to 1 ms).
BUCKETS: Final = core_histogram.VLLM_TTFT_BUCKETS

OutputPolicy = Literal["sample", "max"]


class BadRequest(ValueError):
    """A request the server refuses with HTTP 400 (or `status`); the message says why."""

    def __init__(self, message: str, *, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.param = param
        self.status = status


# ----- the continuous-batching model, one iteration at a time ---------------------------


@dataclass(frozen=True, slots=True)
class StepPlan:
    """One engine iteration: how long it takes and which prompt tokens it prefills."""

    seconds: float
    decoding: int
    chunks: tuple[float, ...]


def plan_step(profile: profiles.ReplicaProfile, *, decoding: int,
              prompt_left: Sequence[float]) -> StepPlan:
    """The next iteration of a vLLM-style chunked-prefill scheduler (a pure function).

    Every decoding sequence gets one token; the rest of the token budget
    (maxBatchedTokens - decoding, at least 1) prefills pending prompts in admission order.
    The iteration takes base + perSequence x decoding + prefilled / prefillTokensPerSecond,
    the step model of `scaler.sim.cluster`. 8B profile, 100 decoding and one 20,000-token
    prompt: chunk 8,092, 8 + 10 + 324 ms = 0.342 s.
    """
    budget = max(float(profile.max_batched_tokens - decoding), 1.0)
    chunks: list[float] = []
    for left in prompt_left:
        take = min(left, budget)
        chunks.append(take)
        budget -= take
    step = profile.decode_step
    seconds = (step.base_seconds + step.per_sequence_seconds * decoding
               + sum(chunks) / profile.prefill_tokens_per_second)
    return StepPlan(seconds=seconds, decoding=decoding, chunks=tuple(chunks))


@dataclass(eq=False, slots=True)
class Request:
    """One sequence in the replica: its lengths, progress and the tokens it streams.

    `tokens` carries the count of new tokens after each iteration that made some, then
    None when the sequence is finished.
    """

    prompt_tokens: int
    output_tokens: int
    arrived_at: float
    prompt_left: float = field(init=False)
    generated: int = 0
    first_token_at: float | None = None
    tokens: asyncio.Queue[int | None] = field(default_factory=asyncio.Queue)

    def __post_init__(self) -> None:
        self.prompt_left = float(self.prompt_tokens)

    @property
    def kv_tokens(self) -> int:
        # KV reserved at admission, prompt plus every output token (as the simulator does).
        return self.prompt_tokens + self.output_tokens


@dataclass(slots=True)
class LatencyCounts:
    """A cumulative histogram being filled: counts per finite bucket, +Inf count, sum."""

    buckets: list[int] = field(default_factory=lambda: [0] * len(BUCKETS))
    count: int = 0
    total: float = 0.0

    def observe(self, seconds: float) -> None:
        for index, bound in enumerate(BUCKETS):
            if seconds <= bound:
                self.buckets[index] += 1
        self.count += 1
        self.total += seconds

    def histogram(self) -> core_histogram.Histogram:
        return core_histogram.Histogram(le=BUCKETS, counts=tuple(float(c) for c in self.buckets))


@dataclass(slots=True)
class Counters:
    """What the replica has done since it started (Prometheus counters)."""

    generation_tokens: int = 0
    prompt_tokens: float = 0.0
    successes: int = 0
    ttft: LatencyCounts = field(default_factory=LatencyCounts)
    e2e: LatencyCounts = field(default_factory=LatencyCounts)


class Replica:
    """One simulated vLLM replica serving in real time (or `speed` times faster).

    `run` is the engine loop: admit waiting requests, plan an iteration (`plan_step`),
    sleep its duration / speed, then hand out the tokens it produced. Admission is
    vLLM's: FIFO, while the batch has room (maxBatch), the KV cache holds the request's
    prompt + output tokens, and the iteration's token budget has prefill room left, so
    `waiting` is what vLLM reports as num_requests_waiting. Latencies are wall-clock
    seconds (what a client sees): at speed 10, a 2 s model TTFT reads 0.2 s.
    """

    def __init__(self, profile: profiles.ReplicaProfile, *, speed: float = 1.0) -> None:
        if not speed > 0:
            raise ValueError(f"speed must be > 0, not {speed}")
        self.profile = profile
        self.speed = speed
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.kv_used = 0
        self.counters = Counters()
        self._wake = asyncio.Event()

    def now(self) -> float:
        """The event loop's clock (seconds): what request and token times are taken on."""
        return asyncio.get_running_loop().time()

    def submit(self, *, prompt_tokens: int, output_tokens: int) -> Request:
        request = Request(prompt_tokens=max(prompt_tokens, 1), output_tokens=max(output_tokens, 1),
                          arrived_at=self.now())
        self.waiting.append(request)
        self._wake.set()
        return request

    def cancel(self, request: Request) -> None:
        """Drop a request whose client went away (a no-op once it is finished)."""
        if request in self.waiting:
            self.waiting.remove(request)
        elif request in self.running:
            self.running.remove(request)
            self.kv_used -= request.kv_tokens

    @property
    def kv_usage(self) -> float:
        """Share of the KV cache reserved (vLLM's kv_cache_usage_perc, 0..1)."""
        return self.kv_used / self.profile.kv_cache_tokens

    def _admit(self) -> None:
        profile = self.profile
        decoding = sum(1 for r in self.running if r.prompt_left <= 0)
        pending = sum(r.prompt_left for r in self.running)
        while (self.waiting and len(self.running) < profile.max_batch
               and pending < profile.max_batched_tokens - decoding
               and self.kv_used + self.waiting[0].kv_tokens <= profile.kv_cache_tokens):
            request = self.waiting.popleft()
            self.running.append(request)
            self.kv_used += request.kv_tokens
            pending += request.prompt_left

    async def run(self) -> None:
        """The engine loop; runs until cancelled.

        Back-to-back iterations are timed against deadlines, not slept one after another,
        so the loop's own work (handing out tokens, serving HTTP) does not stretch the
        model: at batch 128 that work is ~3 ms a step, 15 % of the 8B profile's 20.8 ms.
        """
        deadline: float | None = None
        while True:
            self._admit()
            if not self.running:
                deadline = None
                self._wake.clear()
                await self._wake.wait()
                continue
            decoders = [r for r in self.running if r.prompt_left <= 0]
            prefilling = [r for r in self.running if r.prompt_left > 0]
            plan = plan_step(self.profile, decoding=len(decoders),
                             prompt_left=[r.prompt_left for r in prefilling])
            now = self.now()
            # A loop more than one step late starts afresh rather than racing to catch up.
            start = now if deadline is None or deadline < now - plan.seconds / self.speed \
                else deadline
            deadline = start + plan.seconds / self.speed
            await asyncio.sleep(max(0.0, deadline - now))
            self._finish_step(decoders, prefilling, plan)

    def _finish_step(self, decoders: list[Request], prefilling: list[Request],
                     plan: StepPlan) -> None:
        """Hand out the iteration's tokens: one per decoder, the first token of each prompt
        whose last chunk was prefilled. Requests cancelled meanwhile are skipped."""
        now = self.now()
        live = set(self.running)
        emitted: list[Request] = [r for r in decoders if r in live]
        for request, chunk in zip(prefilling, plan.chunks, strict=True):
            if request not in live:
                continue
            request.prompt_left -= chunk
            self.counters.prompt_tokens += chunk
            if request.prompt_left <= 1e-9 < chunk:
                request.prompt_left = 0.0
                request.first_token_at = now
                self.counters.ttft.observe(now - request.arrived_at)
                emitted.append(request)
        for request in emitted:
            request.generated += 1
            self.counters.generation_tokens += 1
            request.tokens.put_nowait(1)
            if request.generated >= request.output_tokens:
                self.running.remove(request)
                self.kv_used -= request.kv_tokens
                self.counters.successes += 1
                self.counters.e2e.observe(now - request.arrived_at)
                request.tokens.put_nowait(None)


# ----- OpenAI request parsing ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Lengths:
    """How a server picks output lengths: `max` always generates max_tokens (as vLLM with
    ignore_eos); `sample` stops at an end-of-sequence drawn geometrically with mean
    `mean_tokens` (EOS equally likely at each token), capped at max_tokens."""

    policy: OutputPolicy = "sample"
    mean_tokens: float = 200.0

    def __post_init__(self) -> None:
        if not self.mean_tokens >= 1:
            raise ValueError(f"mean output tokens must be >= 1, not {self.mean_tokens}")

    def draw(self, *, max_tokens: int, ignore_eos: bool, rng: random.Random) -> int:
        if ignore_eos or self.policy == "max":
            return max_tokens
        # Geometric on 1, 2, ... with P(stop at each token) = 1/mean: mean `mean_tokens`.
        p = 1.0 / self.mean_tokens
        drawn = 1 if p >= 1 else 1 + int(math.log(1.0 - rng.random()) / math.log(1.0 - p))
        return min(drawn, max_tokens)


def text_tokens(text: str) -> int:
    """Estimated tokens of a text: ceil(characters / 4), at least 1 for non-empty text."""
    return math.ceil(len(text) / CHARS_PER_TOKEN)


def prompt_tokens(prompt: object) -> int:
    """Tokens of a /v1/completions prompt: a string, a token-id list, or one of either in
    a list (batched prompts are not served)."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return text_tokens(prompt)
    if isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool)
                                        for t in prompt):
        return len(prompt)
    raise BadRequest("prompt must be a string or a list of token ids (one prompt per "
                     "request)", param="prompt")


def chat_tokens(chat: object) -> int:
    """Tokens of a chat: each message's text plus its template markers."""
    if not isinstance(chat, list) or not chat:
        raise BadRequest("messages must be a non-empty list", param="messages")
    total = 0
    for index, message in enumerate(chat):
        if not isinstance(message, dict) or "role" not in message:
            raise BadRequest(f"messages[{index}] must be an object with a role",
                             param="messages")
        content = message.get("content") or ""
        if isinstance(content, list):  # content parts: [{"type": "text", "text": ...}]
            content = "".join(str(part.get("text", "")) for part in content
                              if isinstance(part, dict))
        if not isinstance(content, str):
            raise BadRequest(f"messages[{index}].content must be a string or a list of "
                             "parts", param="messages")
        total += text_tokens(content) + TOKENS_PER_MESSAGE
    return total


def _int_field(body: dict[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise BadRequest(f"{name} must be an integer >= 1, not {value!r}", param=name)
    return value


@dataclass(frozen=True, slots=True)
class Job:
    """A parsed request: its lengths and how to answer."""

    prompt_tokens: int
    max_tokens: int
    ignore_eos: bool
    stream: bool
    include_usage: bool


def parse_job(body: object, *, chat: bool, served_model: str,
              profile: profiles.ReplicaProfile) -> Job:
    """An OpenAI request body -> a Job, or BadRequest naming the field (vLLM's checks:
    the model name, n = 1, prompt + max_tokens within maxModelLen)."""
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    if body.get("model") != served_model:
        raise BadRequest(f"The model `{body.get('model')}` does not exist.", param="model",
                         status=404)
    if body.get("n", 1) != 1:
        raise BadRequest("only n = 1 is served", param="n")
    tokens = chat_tokens(body.get("messages")) if chat else prompt_tokens(body.get("prompt"))
    limit = _int_field(body, "max_completion_tokens") if chat else None
    limit = limit or _int_field(body, "max_tokens")
    if limit is None:
        limit = max(profile.max_model_len - tokens, 1) if chat else COMPLETIONS_DEFAULT_MAX_TOKENS
    if not profile.accepts(input_tokens=tokens, output_tokens=limit):
        raise BadRequest(
            f"This model's maximum context length is {profile.max_model_len} tokens. However, "
            f"you requested {tokens + limit} tokens ({tokens} in the messages, {limit} in "
            "the completion). Please reduce the length of the messages or completion.",
            param="max_tokens")
    options = body.get("stream_options") or {}
    return Job(prompt_tokens=tokens, max_tokens=limit,
               ignore_eos=bool(body.get("ignore_eos", False)),
               stream=bool(body.get("stream", False)),
               include_usage=isinstance(options, dict) and bool(options.get("include_usage")))


# ----- the HTTP server ---------------------------------------------------------------


@dataclass(slots=True)
class Server:
    """The OpenAI-compatible endpoints over one Replica, and its vLLM-style /metrics."""

    replica: Replica
    served_model: str
    lengths: Lengths = field(default_factory=Lengths)
    seed: int = 0
    rng: random.Random = field(init=False)
    registry: CollectorRegistry = field(init=False)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_VllmCollector(self))

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics)
        return app

    async def health(self, request: web.Request) -> web.Response:
        return web.Response()

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{
            "id": self.served_model, "object": "model", "created": _epoch(),
            "owned_by": "scaler-sim", "root": self.served_model,
            "max_model_len": self.replica.profile.max_model_len}]})

    async def metrics(self, request: web.Request) -> web.Response:
        response = web.Response(body=generate_latest(self.registry))
        response.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return response

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=True)

    async def _serve(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        try:
            body = await request.json()
        except ValueError:
            return _error(BadRequest("the request body is not valid JSON"))
        try:
            job = parse_job(body, chat=chat, served_model=self.served_model,
                            profile=self.replica.profile)
        except BadRequest as exc:
            return _error(exc)
        output = self.lengths.draw(max_tokens=job.max_tokens, ignore_eos=job.ignore_eos,
                                   rng=self.rng)
        sequence = self.replica.submit(prompt_tokens=job.prompt_tokens, output_tokens=output)
        shape = _Shape(chat=chat, model=self.served_model, job=job, output_tokens=output)
        try:
            if job.stream:
                return await self._stream(request, sequence, shape)
            async for _ in _token_counts(sequence):
                pass
            return web.json_response(shape.whole())
        finally:
            # Finished: a no-op. A client gone mid-stream: its batch slot and KV are freed.
            self.replica.cancel(sequence)

    async def _stream(self, request: web.Request, sequence: Request, shape: _Shape
                      ) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                               "Cache-Control": "no-cache"})
        await response.prepare(request)
        try:
            if shape.chat:
                await _send(response, shape.chunk(role=True))
            sent = 0
            async for count in _token_counts(sequence):
                for _ in range(count):
                    await _send(response, shape.chunk(text=WORDS[sent % len(WORDS)]))
                    sent += 1
            await _send(response, shape.chunk(finish=True))
            if shape.job.include_usage:
                await _send(response, shape.usage_chunk())
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
        except ConnectionResetError:  # the client went away: nothing left to answer
            pass
        return response


@dataclass(frozen=True, slots=True)
class _Shape:
    """The OpenAI response objects of one request (completion or chat, whole or chunks)."""

    chat: bool
    model: str
    job: Job
    output_tokens: int
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: int = field(default_factory=lambda: _epoch())

    @property
    def finish_reason(self) -> str:
        # "length" when max_tokens cut the output, "stop" when it ended by itself.
        return "length" if self.output_tokens >= self.job.max_tokens else "stop"

    def usage(self) -> dict[str, int]:
        return {"prompt_tokens": self.job.prompt_tokens, "completion_tokens": self.output_tokens,
                "total_tokens": self.job.prompt_tokens + self.output_tokens}

    def _head(self, *, chunk: bool) -> dict[str, Any]:
        if self.chat:
            kind = "chat.completion.chunk" if chunk else "chat.completion"
            return {"id": f"chatcmpl-{self.id}", "object": kind, "created": self.created,
                    "model": self.model}
        return {"id": f"cmpl-{self.id}", "object": "text_completion",
                "created": self.created, "model": self.model}

    def whole(self) -> dict[str, Any]:
        text = "".join(WORDS[i % len(WORDS)] for i in range(self.output_tokens))
        choice: dict[str, Any] = {"index": 0, "finish_reason": self.finish_reason,
                                  "logprobs": None}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        return {**self._head(chunk=False), "choices": [choice], "usage": self.usage()}

    def chunk(self, *, text: str = "", role: bool = False, finish: bool = False
              ) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "logprobs": None,
                                  "finish_reason": self.finish_reason if finish else None}
        if self.chat:
            delta: dict[str, str] = {"role": "assistant", "content": ""} if role else {}
            if text:
                delta["content"] = text
            choice["delta"] = delta
        else:
            choice["text"] = text
        out = {**self._head(chunk=True), "choices": [choice]}
        if self.job.include_usage:
            out["usage"] = None  # every chunk but the last carries a null usage
        return out

    def usage_chunk(self) -> dict[str, Any]:
        return {**self._head(chunk=True), "choices": [], "usage": self.usage()}


async def _token_counts(sequence: Request) -> AsyncIterator[int]:
    while (count := await sequence.tokens.get()) is not None:
        yield count


async def _send(response: web.StreamResponse, payload: dict[str, Any]) -> None:
    await response.write(b"data: " + json.dumps(payload, separators=(",", ":")).encode()
                         + b"\n\n")


def _error(exc: BadRequest) -> web.Response:
    kind = "NotFoundError" if exc.status == 404 else "BadRequestError"
    return web.json_response({"error": {"message": str(exc), "type": kind, "param": exc.param,
                                        "code": exc.status}}, status=exc.status)


def _epoch() -> int:
    return int(time.time())


class _VllmCollector:
    """vLLM's metric names, read from the replica at scrape time, labelled model_name."""

    def __init__(self, server: Server) -> None:
        self.server = server

    def collect(self) -> Iterable[Metric]:
        replica = self.server.replica
        counters = replica.counters
        labels = ["model_name"]
        value = [self.server.served_model]

        def gauge(name: str, doc: str, number: float) -> Metric:
            family = GaugeMetricFamily(name, doc, labels=labels)
            family.add_metric(value, number)
            return family

        def counter(name: str, doc: str, number: float) -> Metric:
            family = CounterMetricFamily(name, doc, labels=labels)
            family.add_metric(value, number)
            return family

        def histogram(name: str, doc: str, counts: LatencyCounts) -> Metric:
            family = HistogramMetricFamily(name, doc, labels=labels)
            buckets = [(repr(b), float(c)) for b, c in zip(BUCKETS, counts.buckets,
                                                           strict=True)]
            family.add_metric(value, [*buckets, ("+Inf", float(counts.count))],
                              sum_value=counts.total)
            return family

        yield gauge("vllm:num_requests_running", "Requests in the running batch.",
                    len(replica.running))
        yield gauge("vllm:num_requests_waiting", "Requests waiting to be scheduled.",
                    len(replica.waiting))
        yield gauge("vllm:kv_cache_usage_perc", "KV cache usage (1 = full).", replica.kv_usage)
        yield counter("vllm:generation_tokens", "Generated tokens.", counters.generation_tokens)
        yield counter("vllm:prompt_tokens", "Prefilled prompt tokens.", counters.prompt_tokens)
        yield counter("vllm:request_success", "Finished requests.", counters.successes)
        yield histogram("vllm:time_to_first_token_seconds", "Time to first token (s).",
                        counters.ttft)
        yield histogram("vllm:e2e_request_latency_seconds", "End-to-end latency (s).",
                        counters.e2e)


# ----- signal messages over NATS (DESIGN 4.2) ----------------------------------------


class _Tally(NamedTuple):
    """The replica's counters at one publish (replica clock), for rates over a window."""

    at: float
    generated: float
    prompt: float
    successes: float
    ttft: tuple[int, ...]


@dataclass(slots=True)
class SignalPublisher:
    """What a replica publishes each `interval_s`: its queue, batch, token and completion
    rates over `rate_window_s`, and its TTFT histogram over `latency_window_s` (the
    windows of the simulator's `SignalFeed`)."""

    replica: Replica
    model_key: str
    source: str
    interval_s: float = 1.0
    rate_window_s: float = 10.0
    latency_window_s: float = 30.0
    history: deque[_Tally] = field(default_factory=deque)

    def message(self, *, now: float, epoch_s: float) -> bytes:
        """The message at `now` (replica clock); `epoch_s` is its `ts`."""
        counters = self.replica.counters
        latest = _Tally(now, float(counters.generation_tokens), counters.prompt_tokens,
                        float(counters.successes), tuple(counters.ttft.buckets))
        self.history.append(latest)
        window = max(self.rate_window_s, self.latency_window_s)
        while len(self.history) > 1 and self.history[1].at <= now - window:
            self.history.popleft()
        then = next(h for h in self.history if h.at >= now - self.rate_window_s - 1e-9)
        span = now - then.at

        def rate(current: float, before: float) -> float:
            return (current - before) / span if span > 0 else 0.0

        namespace, name = split_model_key(self.model_key)
        signal = vocabulary.Signal
        values = {signal.QUEUE_DEPTH: float(len(self.replica.waiting)),
                  signal.IN_FLIGHT: float(len(self.replica.running)),
                  signal.TOKENS_PER_SECOND: rate(latest.generated, then.generated),
                  signal.PROMPT_TOKENS_PER_SECOND: rate(latest.prompt, then.prompt),
                  signal.COMPLETION_RATE: rate(latest.successes, then.successes)}
        counts = tuple(float(a - b) for a, b in zip(latest.ttft, self.history[0].ttft,
                                                    strict=True))
        recent = core_histogram.Histogram(le=BUCKETS, counts=counts)
        return messages.encode(
            model=name, namespace=namespace, source=self.source, ts=epoch_s, values=values,
            latency_metric=vocabulary.LatencyMetric.TTFT,
            latency_histogram=recent if recent.total > 0 else None)

    async def run(self, client: NatsClient, *, subject: str) -> None:
        """Publish every interval until cancelled; a failed publish is logged, not fatal."""
        while True:
            body = self.message(now=self.replica.now(), epoch_s=time.time())
            try:
                await client.publish(subject, body)
            except Exception as exc:  # disconnected: the client reconnects by itself
                log.warning("publish to %s failed: %s", subject, exc)
            await asyncio.sleep(self.interval_s)


def split_model_key(model_key: str) -> tuple[str, str]:
    """'namespace/name' -> (namespace, name), or ValueError naming the flag."""
    namespace, slash, name = model_key.partition("/")
    if not slash or not namespace or not name or "/" in name:
        raise ValueError(f"--model-key must be namespace/name, not {model_key!r}")
    return namespace, name


@contextlib.asynccontextmanager
async def running(server: Server, *, host: str, port: int,
                  nats_url: str | None = None, model_key: str | None = None,
                  source: str | None = None, publish_interval_s: float = 1.0
                  ) -> AsyncIterator[str]:
    """Serve on host:port (0 = a free port) while the block runs; yields the base URL.

    With `nats_url` and `model_key`, publishes the replica's signal messages to
    `scaler.signals.<namespace>.<name>` too.
    """
    # On exit, requests in flight get 1 s to finish, then are cut (as a killed replica
    # cuts them); aiohttp's default of 60 s would hold a Ctrl-C for a minute.
    runner = web.AppRunner(server.app(), handle_signals=False, shutdown_timeout=1.0)
    await runner.setup()
    tasks: list[asyncio.Task[None]] = []
    client: NatsClient | None = None
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound = int(runner.addresses[0][1])
        tasks.append(asyncio.create_task(server.replica.run(), name="sim-server-engine"))
        if nats_url is not None and model_key is not None:
            namespace, name = split_model_key(model_key)
            client = NatsClient()
            await client.connect(servers=[nats_url], connect_timeout=5,
                                 max_reconnect_attempts=-1, reconnect_time_wait=1)
            publisher = SignalPublisher(server.replica, model_key,
                                        source=source or f"sim-server-{bound}",
                                        interval_s=publish_interval_s)
            subject = nats_core.default_subject(nats_core.DEFAULT_PREFIX, namespace, name)
            tasks.append(asyncio.create_task(publisher.run(client, subject=subject),
                                             name="sim-server-signals"))
        yield f"http://{host}:{bound}"
    finally:
        await runner.cleanup()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if client is not None:
            await client.close()
