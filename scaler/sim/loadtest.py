"""`scaler loadtest`: open-loop replay of a trace against a live OpenAI-compatible endpoint."""

from __future__ import annotations

import array
import asyncio
import heapq
import itertools
import json
import math
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import aiohttp
import numpy as np
import numpy.typing as npt

from scaler.sim import scoring, traces

Api = Literal["completions", "chat"]
APIS: tuple[Api, ...] = ("completions", "chat")
# Error kinds, one counter each. `connect`: the server refused or was unreachable;
# `concurrency_limit`: not sent because --max-concurrency requests were in flight (an
# open-loop client drops rather than delays, or the delay would hide the overload).
ERROR_KINDS = ("http_4xx", "http_5xx", "timeout", "disconnect", "protocol", "connect",
               "concurrency_limit")
# Outcome codes in the per-request record (int8): 0 completed, then ERROR_KINDS + 1.
_DONE = 0
_UNFINISHED = -1  # in flight when the run was stopped (Ctrl-C)

# English text averages about 4 characters per token for Llama/GPT-style BPE tokenizers
# (OpenAI's rule of thumb); a 1,000-token prompt is about 4,000 characters. Prompts are
# words of 3 letters plus a space, each about one token, so the count is close for
# most tokenizers; it is not exact (no tokenizer is loaded).
CHARS_PER_TOKEN = 4
_WORDS = ("the", "cat", "sat", "now", "red", "mat", "and", "ran", "far", "off")
# Requests are sent this long after the run starts, so the first one is not late by the
# time it takes to open the session (a few ms).
LEAD_S = 0.05
DEFAULT_MAX_LAG_MS = 50.0
DEFAULT_TIMEOUT_S = 300.0
# A run is valid when the p99 of its schedule lag is within --max-lag-ms.
LAG_QUANTILE = 99.0

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class Request:
    """One request to send: seconds after the run starts, and its token lengths."""

    at_s: float
    input_tokens: int
    output_tokens: int


# ----- the trace, streamed -------------------------------------------------------------

_ROW_READERS: dict[str, Callable[[Path], Iterator[traces.Row]]] = {
    "azure": traces.iter_azure, "mooncake": traces.iter_mooncake, "csv": traces.iter_plain_csv}


def _sorted_rows(path: Path, fmt: str) -> Iterator[traces.Row]:
    """The rows of a per-request trace, checked to be in time order (they are streamed,
    not sorted: a day of Azure at 100 req/s is 8.6 M rows)."""
    last = -math.inf
    for number, row in enumerate(_ROW_READERS[fmt](path), start=1):
        if row.timestamp_s < last:
            raise traces.TraceError(path, line=number + (fmt != "mooncake"), column=None,
                                    message=f"request {number} is earlier than the one "
                                    "before: the load tester streams the trace and needs "
                                    "it sorted by time")
        last = row.timestamp_s
        yield row


def _slice(path: Path, fmt: str, *, start_s: float, end_s: float) -> Iterator[Request]:
    """Requests of [start_s, end_s) of the trace's clock (from its first request),
    re-based to start_s, as `traces.cut` does for a loaded trace."""
    first: float | None = None
    for row in _sorted_rows(path, fmt):
        if first is None:
            first = row.timestamp_s
        t = row.timestamp_s - first
        if t >= end_s:
            return
        if t >= start_s:
            yield Request(t - start_s, row.input_tokens, row.output_tokens)


def _shifted(rows: Callable[[], Iterator[Request]], *, offset_s: float, duration_s: float
             ) -> Iterator[Request]:
    """One circularly shifted copy, (t + offset) mod duration, in time order, from two
    passes over the file (the rows that wrap round come first)."""
    for request in rows():
        if request.at_s + offset_s >= duration_s:
            # At most the offset (the last row, t = duration, lands on it): without the
            # min, float rounding can put it 1 ulp after the first unwrapped row.
            yield Request(min(request.at_s + offset_s - duration_s, offset_s),
                          request.input_tokens, request.output_tokens)
    for request in rows():
        if request.at_s + offset_s < duration_s:
            yield Request(request.at_s + offset_s, request.input_tokens, request.output_tokens)


def stream_trace(
    path: str | Path,
    fmt: traces.TraceFormat = "auto",
    *,
    rate_scale: float = 1.0,
    seed: int = 0,
    start_s: float | None = None,
    duration_s: float | None = None,
) -> Iterator[Request]:
    """The trace's requests in time order, read lazily (memory does not grow with length).

    Same slice and rate-scale semantics as `traces.load_trace` (copies superposed with
    seeded circular shifts above 1, thinning of the last copy below a whole number),
    with its own random draws: the requests chosen differ from the simulator's at a
    fractional scale, their rate and shape do not. A rate scale above 1 reads the file
    once for its duration, once for copy 0 and twice per shifted copy. ServeGen windows
    are drawn into memory by `traces.load_servegen` (24 bytes a request), then streamed.
    """
    path = Path(path)
    if not path.exists():
        raise traces.TraceError(path, line=0, column=None, message="no such file or folder")
    if rate_scale <= 0 or not math.isfinite(rate_scale):
        raise ValueError(f"rate scale must be a positive number, got {rate_scale}")
    begin = start_s or 0.0
    end = begin + duration_s if duration_s is not None else math.inf
    if fmt == "auto":
        fmt = traces.sniff(path)
    if fmt == "servegen":
        trace = traces.load_trace(path, fmt, rate_scale=rate_scale, seed=seed,
                                  start_s=start_s, max_duration_s=duration_s)
        return (Request(float(t), int(i), int(o)) for t, i, o in
                zip(trace.arrival_s, trace.input_tokens, trace.output_tokens, strict=True))

    def rows() -> Iterator[Request]:
        return _slice(path, fmt, start_s=begin, end_s=end)

    if next(rows(), None) is None:
        raise traces.TraceError(path, line=1, column=None, message="no requests in the slice")
    if rate_scale == 1.0:
        return rows()
    rng = np.random.default_rng(seed)
    last = 0.0
    for request in rows():
        last = request.at_s
    duration = max(last, 1e-9)
    whole = int(math.floor(rate_scale))
    fraction = rate_scale - whole
    copies: list[Iterator[Request]] = [rows()]
    for _ in range(1, whole + (1 if fraction > 1e-12 else 0)):
        copies.append(_shifted(rows, offset_s=float(rng.uniform(0.0, duration)),
                               duration_s=duration))
    if fraction > 1e-12:
        thin_rng = np.random.default_rng([seed, 2])
        copies[-1] = (r for r in copies[-1] if thin_rng.uniform() < fraction)
    return heapq.merge(*copies, key=lambda r: r.at_s)


def prompt_text(*, tokens: int, index: int) -> str:
    """Synthetic English of about `tokens` tokens (4 characters each, see CHARS_PER_TOKEN).

    It starts with the request's index so no two prompts share a prefix: a server with
    prefix caching (vLLM's, SGLang's radix cache) would otherwise answer every prefill
    from its cache and the test would measure less work than the trace asks for.
    """
    head = f"{index} "
    need = max(tokens * CHARS_PER_TOKEN - len(head), 0)
    words = itertools.cycle(_WORDS)
    body = " ".join(itertools.islice(words, need // CHARS_PER_TOKEN + 1))
    return (head + body)[:max(tokens * CHARS_PER_TOKEN, len(head))]


def endpoint(url: str, api: Api) -> str:
    """The request URL from a base URL: `http://host:8000` or `.../v1` get the API's path."""
    path = "completions" if api == "completions" else "chat/completions"
    base = url.rstrip("/")
    if base.endswith("/completions"):
        return base
    return f"{base}/{path}" if base.endswith("/v1") else f"{base}/v1/{path}"


def request_body(*, model: str, api: Api, request: Request, index: int) -> dict[str, Any]:
    """The streaming request: `max_tokens` the trace's output length and vLLM's
    `ignore_eos` so the output has that length where the server honours it."""
    prompt = prompt_text(tokens=request.input_tokens, index=index)
    body: dict[str, Any] = {"model": model, "max_tokens": max(request.output_tokens, 1),
                            "stream": True, "ignore_eos": True,
                            "stream_options": {"include_usage": True}}
    if api == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    return body


# ----- measurement ---------------------------------------------------------------------


class LogHistogram:
    """Counts of positive values in buckets 1 % wide from 10 us to 1,000 s (1,842 of
    them): quantiles within 1 % at a fixed 15 KB, for the inter-token latencies of a
    day (200 per request, too many to keep)."""

    LOW_S = 1e-5
    GROWTH = 1.01

    def __init__(self) -> None:
        self._log_growth = math.log(self.GROWTH)
        self.buckets = int(math.log(1e3 / self.LOW_S) / self._log_growth) + 1
        self.counts = [0] * (self.buckets + 1)
        self.total = 0

    def add(self, value_s: float) -> None:
        index = (0 if value_s <= self.LOW_S else
                 min(int(math.log(value_s / self.LOW_S) / self._log_growth) + 1, self.buckets))
        self.counts[index] += 1
        self.total += 1

    def quantile(self, q: float) -> float:
        """The upper edge of the bucket holding quantile q (0..1); 0.0 when empty."""
        if not self.total:
            return 0.0
        rank = q * (self.total - 1)
        seen = 0
        for index, count in enumerate(self.counts):
            seen += count
            if seen > rank:
                return self.LOW_S * self.GROWTH ** index
        return self.LOW_S * self.GROWTH ** self.buckets


@dataclass
class Records:
    """Per-request results in typed arrays, 33 bytes a request (a day at 100 req/s,
    8.6 M requests, is 285 MB); times are seconds, NaN where not reached."""

    arrival_s: array.array[float] = field(default_factory=lambda: array.array("d"))
    lag_s: array.array[float] = field(default_factory=lambda: array.array("f"))
    ttft_s: array.array[float] = field(default_factory=lambda: array.array("f"))
    e2e_s: array.array[float] = field(default_factory=lambda: array.array("f"))
    itl_s: array.array[float] = field(default_factory=lambda: array.array("f"))
    input_tokens: array.array[int] = field(default_factory=lambda: array.array("i"))
    output_tokens: array.array[int] = field(default_factory=lambda: array.array("i"))
    outcome: array.array[int] = field(default_factory=lambda: array.array("b"))
    gaps: LogHistogram = field(default_factory=LogHistogram)
    tokens_received: int = 0

    def add(self, request: Request, *, lag_s: float, ttft_s: float, e2e_s: float,
            itl_s: float, outcome: int) -> None:
        self.arrival_s.append(request.at_s)
        self.lag_s.append(lag_s)
        self.ttft_s.append(ttft_s)
        self.e2e_s.append(e2e_s)
        self.itl_s.append(itl_s)
        self.input_tokens.append(request.input_tokens)
        self.output_tokens.append(request.output_tokens)
        self.outcome.append(outcome)

    def __len__(self) -> int:
        return len(self.outcome)


@dataclass
class _Stream:
    """What one response's SSE stream gave: token event times and the usage count."""

    events: int = 0
    first_s: float = math.nan
    last_s: float = math.nan
    usage_tokens: int | None = None
    done: bool = False


class ProtocolError(Exception):
    """The server answered 200 with something that is not an OpenAI SSE stream."""


def _text_of(chunk: Any, api: Api) -> str:
    if not isinstance(chunk, dict):
        raise ProtocolError("event is not a JSON object")
    choices = chunk.get("choices")
    if not isinstance(choices, list):
        raise ProtocolError("event has no choices list")
    if not choices:
        return ""  # the usage-only event of stream_options.include_usage
    choice = choices[0]
    if not isinstance(choice, dict):
        raise ProtocolError("choice is not an object")
    text = choice.get("text") if api == "completions" else (choice.get("delta") or {}).get(
        "content")
    return text if isinstance(text, str) else ""


def read_event(line: bytes, *, api: Api, stream: _Stream, now_s: float,
               gaps: LogHistogram) -> None:
    """Fold one SSE line into `stream`: `data: {...}` with text is a token event."""
    text = line.strip()
    if not text or text.startswith(b":") or not text.startswith(b"data:"):
        return  # blank separators, comments, `event:`/`id:` fields
    data = text[5:].strip()
    if data == b"[DONE]":
        stream.done = True
        return
    try:
        chunk = json.loads(data)
    except ValueError:
        raise ProtocolError(f"event data is not JSON: {data[:60]!r}") from None
    usage = chunk.get("usage") if isinstance(chunk, dict) else None
    if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
        stream.usage_tokens = usage["completion_tokens"]
    if _text_of(chunk, api):
        if stream.events:
            gaps.add(now_s - stream.last_s)
        else:
            stream.first_s = now_s
        stream.events += 1
        stream.last_s = now_s


# ----- the run -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Target:
    """Where and how to send: the endpoint, the model name and the client's limits."""

    url: str
    model: str
    api: Api = "completions"
    max_concurrency: int | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S


@dataclass
class Progress:
    """Counters the progress line shows, updated as the run goes."""

    scheduled: int = 0
    in_flight: int = 0
    finished: int = 0
    errors: int = 0
    started_at: float = field(default_factory=time.monotonic)


@dataclass
class LiveRun:
    """A finished (or interrupted) load test: its records and how it ended.

    origin: the event-loop time of the trace's t=0 (a request at trace time t was due at
    origin + t), to put readings taken on the same loop (a replica timeline) on the
    run's clock.
    """

    records: Records
    target: Target
    wall_s: float
    interrupted: bool
    errors: dict[str, int]
    origin: float = 0.0


async def _send(session: aiohttp.ClientSession, *, target: Target, request: Request,
                index: int, due_s: float, records: Records, progress: Progress) -> None:
    loop = asyncio.get_running_loop()
    began = loop.time()
    # Schedule lag: how late this request left versus its trace time (the loop's own
    # delay in starting it; connection set-up afterwards counts in the TTFT).
    lag = began - due_s
    stream = _Stream()
    outcome = _UNFINISHED
    body = request_body(model=target.model, api=target.api, request=request, index=index)
    try:
        async with asyncio.timeout(target.timeout_s):
            async with session.post(endpoint(target.url, target.api), json=body) as response:
                if response.status >= 400:
                    outcome = 1 + ERROR_KINDS.index(
                        "http_5xx" if response.status >= 500 else "http_4xx")
                else:
                    # Whatever arrived, split into lines here: one await per network read
                    # rather than two per event (the data line and the blank after it);
                    # events that arrived in one read share its time.
                    pending = b""
                    async for chunk in response.content.iter_any():
                        now = loop.time()
                        *lines, pending = (pending + chunk).split(b"\n")
                        for line in lines:
                            read_event(line, api=target.api, stream=stream, now_s=now,
                                       gaps=records.gaps)
                        if stream.done:
                            break
                    outcome = _DONE if stream.done else 1 + ERROR_KINDS.index("protocol")
    except TimeoutError:
        outcome = 1 + ERROR_KINDS.index("timeout")
    except ProtocolError:
        outcome = 1 + ERROR_KINDS.index("protocol")
    except aiohttp.ClientConnectorError:
        outcome = 1 + ERROR_KINDS.index("connect")
    except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError,
            aiohttp.ClientOSError):
        outcome = 1 + ERROR_KINDS.index("disconnect")
    except aiohttp.ClientError:
        # What is left: a malformed response (bad status line or headers, a broken
        # chunk encoding), aiohttp's ClientResponseError and its kin.
        outcome = 1 + ERROR_KINDS.index("protocol")
    finally:
        ended = loop.time()
        done = outcome == _DONE
        tokens = stream.usage_tokens if stream.usage_tokens is not None else stream.events
        itl = ((stream.last_s - stream.first_s) / max(tokens - 1, 1)
               if done and stream.events > 1 else math.nan)
        records.add(request, lag_s=lag, ttft_s=stream.first_s - began if stream.events
                    else math.nan, e2e_s=ended - began if done else math.nan, itl_s=itl,
                    outcome=outcome)
        records.tokens_received += tokens
        progress.in_flight -= 1
        progress.finished += 1
        progress.errors += outcome not in (_DONE, _UNFINISHED)


async def run(requests: Iterable[Request], target: Target, *,
              stop: asyncio.Event | None = None,
              on_tick: Callable[[Progress], None] | None = None) -> LiveRun:
    """Send each request at its time (open loop) and stream the answers.

    `stop` set (Ctrl-C in the CLI) ends the schedule; requests in flight are cancelled
    and recorded as unfinished. `on_tick` is called each second with the counters.
    """
    loop = asyncio.get_running_loop()
    stop = stop or asyncio.Event()
    records = Records()
    progress = Progress()
    in_flight: set[asyncio.Task[None]] = set()
    # No connection limit in aiohttp: its default of 100 would queue request 101 inside
    # the client, a closed loop in disguise. --max-concurrency is counted here instead.
    connector = aiohttp.TCPConnector(limit=0)
    ticker = asyncio.create_task(_tick(progress, on_tick)) if on_tick else None
    stopped = asyncio.create_task(stop.wait())
    interrupted = False
    async with aiohttp.ClientSession(connector=connector,
                                     timeout=aiohttp.ClientTimeout(total=None)) as session:
        t0 = loop.time() + LEAD_S
        for index, request in enumerate(requests):
            due = t0 + request.at_s
            delay = due - loop.time()
            if delay > 0 and not stop.is_set():
                await asyncio.wait([stopped], timeout=delay)
            if stop.is_set():
                interrupted = True
                break
            progress.scheduled += 1
            if target.max_concurrency is not None and progress.in_flight >= target.max_concurrency:
                records.add(request, lag_s=loop.time() - due, ttft_s=math.nan, e2e_s=math.nan,
                            itl_s=math.nan, outcome=1 + ERROR_KINDS.index("concurrency_limit"))
                progress.finished += 1
                progress.errors += 1
                continue
            progress.in_flight += 1
            task = asyncio.create_task(_send(session, target=target, request=request,
                                             index=index, due_s=due, records=records,
                                             progress=progress))
            in_flight.add(task)
            task.add_done_callback(in_flight.discard)
        if in_flight and not interrupted:
            waiters: list[asyncio.Future[Any]] = [stopped, asyncio.gather(*in_flight)]
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            interrupted = stop.is_set() and bool(in_flight)
        for task in list(in_flight):
            task.cancel()
        if in_flight:
            await asyncio.gather(*in_flight, return_exceptions=True)
    stopped.cancel()
    if ticker is not None:
        ticker.cancel()
    errors = {kind: 0 for kind in ERROR_KINDS}
    for code in records.outcome:
        if code > 0:
            errors[ERROR_KINDS[code - 1]] += 1
    return LiveRun(records=records, target=target, wall_s=loop.time() - t0,
                   interrupted=interrupted, errors=errors, origin=t0)


async def _tick(progress: Progress, on_tick: Callable[[Progress], None]) -> None:
    while True:
        await asyncio.sleep(1.0)
        on_tick(progress)


# ----- the summary ---------------------------------------------------------------------


def _quantiles(values: FloatArray) -> list[float]:
    finite = values[np.isfinite(values)]
    return (np.percentile(finite, [50, 95, 99]).tolist() if finite.size else [0.0, 0.0, 0.0])


def _latency(records: Records, metric: str) -> FloatArray:
    """Per-request latency of the SLO metric (seconds), NaN for a request that did not
    complete: one that got its first token and then failed is a miss, as the
    simulator counts an unfinished request, even when the metric is TTFT."""
    source = {"ttft": records.ttft_s, "e2e": records.e2e_s, "itl": records.itl_s}[metric]
    done = np.asarray(records.outcome, dtype=np.int64) == _DONE
    return np.where(done, np.asarray(source, dtype=np.float64), np.nan)


def summary(live: LiveRun, *, metric: str, threshold_s: float) -> dict[str, float | int]:
    """The keys of `scaler simulate`'s per-strategy summary that a live run measures.

    Left out: feasibility (no model of the live server) and what a replica timeline
    gives (`live_replicas.summary`: GPU-hours, cost, scale events). `rejected` counts
    HTTP 4xx answers (what a server does with a request beyond its context limit, which
    the simulator rejects).
    """
    records = live.records
    values = _latency(records, metric)
    outcome = np.asarray(records.outcome, dtype=np.int64)
    rejected = int(np.count_nonzero(outcome == 1 + ERROR_KINDS.index("http_4xx")))
    accepted = outcome != 1 + ERROR_KINDS.index("http_4xx")
    judged = np.where(np.isfinite(values), values, np.inf)[accepted]
    windows = scoring.windows_of(np.asarray(records.arrival_s, dtype=np.float64))[accepted]
    met = scoring.window_met(judged, windows, threshold_s)
    completed = int(np.count_nonzero(outcome == _DONE))
    p50, p95, p99 = _quantiles(values[outcome == _DONE])
    within = int(np.count_nonzero(judged <= threshold_s + scoring.EPSILON_S))
    met_fraction = round(sum(met.values()) / len(met), 6) if met else 1.0
    return {
        "requests": len(records),
        "completed": completed,
        "rejected": rejected,
        "unfinished": len(records) - rejected - completed,
        "slo_attainment": round(within / judged.size, 6) if judged.size else 1.0,
        # Every window with traffic is judged: feasibility needs a model of the server.
        "p95_windows_met": met_fraction,
        "p95_windows_met_all": met_fraction,
        "p50_latency_s": round(p50, 4),
        "p95_latency_s": round(p95, 4),
        "p99_latency_s": round(p99, 4),
    }


def lag_p99_ms(records: Records) -> float:
    lags = np.asarray(records.lag_s, dtype=np.float64)
    return float(np.percentile(lags, LAG_QUANTILE)) * 1e3 if lags.size else 0.0


def client_health(live: LiveRun, *, max_lag_ms: float) -> dict[str, Any]:
    """The live strategy's own keys (DESIGN 4.5): the client's schedule lag (ms), whether
    its p99 was within `max_lag_ms` for the run to count as a measurement of the server,
    and errors by kind (every kind, zeros included)."""
    lags = np.asarray(live.records.lag_s, dtype=np.float64)
    p99_lag = lag_p99_ms(live.records)
    return {
        "schedule_lag_ms": {
            # A request that left early (negative lag: the loop woke a hair before its
            # time) is on time.
            "p50": round(max(float(np.percentile(lags, 50)) * 1e3, 0.0), 3) if lags.size
            else 0.0,
            "p99": round(max(p99_lag, 0.0), 3),
            "max": round(max(float(lags.max()) * 1e3, 0.0), 3) if lags.size else 0.0,
            "threshold_p99": max_lag_ms,
        },
        "valid": p99_lag <= max_lag_ms,
        "errors": dict(live.errors),
    }


def served_tokens(records: Records) -> tuple[float, float]:
    """(prompt tokens prefilled, tokens generated): the prompts of requests that got a
    first token, and every token received."""
    first = np.isfinite(np.asarray(records.ttft_s, dtype=np.float64))
    prompts = np.asarray(records.input_tokens, dtype=np.float64)
    return float(prompts[first].sum()), float(records.tokens_received)


def details(live: LiveRun) -> dict[str, Any]:
    """What only a live run has: TTFT/ITL/e2e quantiles, the gaps between tokens, how
    the run ended."""
    records = live.records
    done = np.asarray(records.outcome, dtype=np.int64) == _DONE

    def trio(values: array.array[float]) -> dict[str, float]:
        p50, p95, p99 = _quantiles(np.asarray(values, dtype=np.float64)[done])
        return {"p50": round(p50, 4), "p95": round(p95, 4), "p99": round(p99, 4)}

    gaps = records.gaps
    return {
        "url": live.target.url,
        "model": live.target.model,
        "api": live.target.api,
        "interrupted": live.interrupted,
        "wall_s": round(live.wall_s, 3),
        "ttft_s": trio(records.ttft_s),
        "e2e_s": trio(records.e2e_s),
        "itl_s": trio(records.itl_s),
        # Every gap between token events of every request, from a 1 %-wide histogram.
        "itl_gaps_s": {"p50": round(gaps.quantile(0.5), 5), "p95": round(gaps.quantile(0.95), 5),
                       "p99": round(gaps.quantile(0.99), 5), "count": gaps.total},
        "tokens_received": records.tokens_received,
        "prompt_note": f"synthetic English prompts of about {CHARS_PER_TOKEN} characters "
                       "per token of the trace's input length (no tokenizer loaded)",
    }


def series(live: LiveRun, *, metric: str) -> dict[str, list[float]]:
    """The simulator's p95-per-60 s-window series, plus arrivals per second in each 10 s.

    A request that did not complete counts as waiting until the run's end, as the
    simulator counts an unanswered one (a failure is a miss; the plot shows it as one);
    windows whose p95 request did not complete are listed in `p95_unserved_t`.
    """
    records = live.records
    arrival = np.asarray(records.arrival_s, dtype=np.float64)
    if not arrival.size:
        return {"t": [], "arrival_rate": [], "p95_window_t": [], "p95": [],
                "p95_unserved_t": []}
    values = _latency(records, metric)
    outcome = np.asarray(records.outcome, dtype=np.int64)
    accepted = outcome != 1 + ERROR_KINDS.index("http_4xx")
    end = max(live.wall_s, float(arrival.max()))
    shown = np.where(np.isfinite(values), values, np.maximum(end - arrival, 0.0))[accepted]
    judged = np.where(np.isfinite(values), values, np.inf)[accepted]
    windows = scoring.windows_of(arrival)[accepted]
    p95_t: list[float] = []
    p95: list[float] = []
    unserved: list[float] = []
    for window in np.unique(windows):
        mask = windows == window
        p95_t.append(float(window) * scoring.SLO_WINDOW_S)
        p95.append(round(float(np.percentile(shown[mask], 95)), 3))
        if not scoring.p95_within(judged[mask], float(np.finfo(np.float64).max)):
            unserved.append(p95_t[-1])
    bins = np.bincount((arrival // 10.0).astype(np.int64))
    return {"t": [i * 10.0 for i in range(bins.size)],
            "arrival_rate": [round(float(c) / 10.0, 3) for c in bins],
            "p95_window_t": p95_t, "p95": p95, "p95_unserved_t": unserved}
