"""The signal message contract (DESIGN 4.2): a pure, size-limited, pydantic-validated parse."""

from __future__ import annotations

import json
from collections.abc import Container
from dataclasses import dataclass
from typing import Annotated, Final, Literal

import pydantic
from pydantic import BaseModel, ConfigDict, Field, model_validator

from scaler.signals import base

MAX_MESSAGE_BYTES: Final = 64 * 1024
"""The contract's limit: one JSON object of at most 64 KiB."""

# Drop reasons, as counted in /metrics (label `reason`).
MALFORMED_JSON: Final = "malformed_json"
SCHEMA: Final = "schema"
OVERSIZED: Final = "oversized"
FUTURE_DATED: Final = "future_dated"
STALE: Final = "stale"
UNKNOWN_MODEL: Final = "unknown_model"
SUBJECT_MISMATCH: Final = "subject_mismatch"
DROP_REASONS: Final = (
    MALFORMED_JSON, SCHEMA, OVERSIZED, FUTURE_DATED, STALE, UNKNOWN_MODEL, SUBJECT_MISMATCH,
)

_Finite = Annotated[float, Field(allow_inf_nan=False)]
_Count = Annotated[float, Field(ge=0, allow_inf_nan=False)]
_Name = Annotated[str, Field(min_length=1, max_length=253, pattern=r"^[A-Za-z0-9][-A-Za-z0-9_.]*$")]


class _Strict(BaseModel):
    # Unknown fields are ignored (publishers may add their own); values are immutable.
    model_config = ConfigDict(frozen=True, extra="ignore")


class HistogramBody(_Strict):
    le: list[_Finite] = Field(min_length=1, max_length=256)
    counts: list[_Count] = Field(min_length=1, max_length=256)

    @model_validator(mode="after")
    def _cumulative(self) -> HistogramBody:
        if len(self.le) != len(self.counts):
            raise ValueError("le and counts must have the same length")
        if any(b <= a for a, b in zip(self.le, self.le[1:], strict=False)):
            raise ValueError("le must be strictly increasing")
        if any(b < a for a, b in zip(self.counts, self.counts[1:], strict=False)):
            raise ValueError("counts must be cumulative (non-decreasing)")
        return self


class LatencyBody(_Strict):
    metric: Literal["ttft", "e2e", "itl"] = "ttft"
    p95_seconds: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = None
    histogram: HistogramBody | None = None


class SignalMessage(_Strict):
    """One message body. Every field but `v`, `model` and `ts` is optional."""

    v: Literal[1]
    model: _Name
    namespace: _Name | None = None
    source: Annotated[str, Field(min_length=1, max_length=253)] | None = None
    ts: _Finite
    queue_depth: _Count | None = None
    in_flight: _Count | None = None
    tokens_per_second: _Count | None = None
    prompt_tokens_per_second: _Count | None = None
    latency: LatencyBody | None = None
    ready: bool | None = None


@dataclass(frozen=True, slots=True)
class Limits:
    """Acceptance rules for messages.

    max_bytes: the contract's 64 KiB. max_future_s: clock skew tolerated between a
    publisher and the scaler (a `ts` 2 s ahead is skew; 5 min ahead is a bug).
    max_age_s: older messages are stale on arrival (30 s: the policies' default
    staleAfterSeconds, so they would be ignored anyway; set it to at least the largest
    staleAfterSeconds in force).
    """

    max_bytes: int = MAX_MESSAGE_BYTES
    max_future_s: float = 5.0
    max_age_s: float = 30.0


@dataclass(frozen=True, slots=True)
class Drop:
    """A refused message: the reason (counted) and a short detail (for logs, HTTP errors)."""

    reason: str
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Route:
    """What a message must match to be accepted.

    expected: the model key the subject belongs to ('inference/llama-70b'), or None for
    a wildcard subscription. default_namespace: used when the body has no `namespace`.
    known: the model keys with a policy (None = accept any).
    """

    expected: str | None = None
    default_namespace: str = "default"
    known: Container[str] | None = None


ParseResult = tuple[base.Sample, ...] | Drop

DEFAULT_LIMITS: Final = Limits()

_ANY_ROUTE: Final = Route()


def parse(
    data: bytes,
    *,
    now: float,
    limits: Limits = DEFAULT_LIMITS,
    route: Route = _ANY_ROUTE,
    transport: str = "nats",
) -> ParseResult:
    """Bytes of one message -> its samples, or a Drop with the reason. Never raises.

    `transport` prefixes the sample's source ('nats/<source>') so that one replica
    publishing over NATS and over HTTP is not mistaken for one series.
    """
    if len(data) > limits.max_bytes:
        return Drop(OVERSIZED, f"{len(data)} bytes > {limits.max_bytes}")
    try:
        message = SignalMessage.model_validate_json(data)
    except pydantic.ValidationError as exc:
        return _validation_drop(exc)
    except (ValueError, RecursionError) as exc:  # pragma: no cover - pydantic wraps these
        return Drop(MALFORMED_JSON, str(exc)[:200])
    return to_samples(message, now=now, limits=limits, route=route, transport=transport)


def parse_item(
    item: object,
    *,
    now: float,
    limits: Limits = DEFAULT_LIMITS,
    route: Route = _ANY_ROUTE,
    transport: str = "http",
) -> ParseResult:
    """An already-decoded JSON value (one element of an HTTP push) -> samples or a Drop."""
    try:
        size = len(json.dumps(item, separators=(",", ":")).encode())
    except (TypeError, ValueError, RecursionError):
        return Drop(SCHEMA, "not a JSON value")
    if size > limits.max_bytes:
        return Drop(OVERSIZED, f"{size} bytes > {limits.max_bytes}")
    try:
        message = SignalMessage.model_validate(item)
    except pydantic.ValidationError as exc:
        return _validation_drop(exc)
    return to_samples(message, now=now, limits=limits, route=route, transport=transport)


def _validation_drop(exc: pydantic.ValidationError) -> Drop:
    errors = exc.errors(include_url=False, include_input=False)
    if any(error["type"] == "json_invalid" for error in errors):
        return Drop(MALFORMED_JSON, errors[0]["msg"][:200])
    first = errors[0] if errors else None
    where = ".".join(str(part) for part in first["loc"]) if first else ""
    detail = f"{where}: {first['msg']}" if first else "invalid"
    return Drop(SCHEMA, detail[:200])


def to_samples(
    message: SignalMessage,
    *,
    now: float,
    limits: Limits,
    route: Route,
    transport: str,
) -> ParseResult:
    """Check time and routing rules, then split a valid message into samples."""
    if message.ts > now + limits.max_future_s:
        return Drop(FUTURE_DATED, f"ts {message.ts:.3f} is {message.ts - now:.1f} s ahead")
    if message.ts < now - limits.max_age_s:
        return Drop(STALE, f"ts {message.ts:.3f} is {now - message.ts:.1f} s old")
    namespace = message.namespace or route.default_namespace
    key = base.model_key(namespace, message.model)
    if route.expected is not None and key != route.expected:
        return Drop(SUBJECT_MISMATCH, f"{key} on the subject of {route.expected}")
    if route.known is not None and key not in route.known:
        return Drop(UNKNOWN_MODEL, f"no policy for {key}")
    # A ts within the skew tolerance but ahead of us counts as now: ages are never negative.
    ts = min(message.ts, now)
    source = f"{transport}/{message.source or 'anonymous'}"
    samples: list[base.Sample] = []
    for signal, value in (
        (base.QUEUE_DEPTH, message.queue_depth),
        (base.IN_FLIGHT, message.in_flight),
        (base.TOKENS_PER_SECOND, message.tokens_per_second),
        (base.PROMPT_TOKENS_PER_SECOND, message.prompt_tokens_per_second),
    ):
        if value is not None:
            samples.append(base.Sample(key, signal, source, ts, value))
    latency = message.latency
    if latency is not None and (latency.p95_seconds is not None or latency.histogram):
        histogram = None
        if latency.histogram is not None:
            histogram = base.Histogram(
                le=tuple(latency.histogram.le), counts=tuple(latency.histogram.counts)
            )
        samples.append(
            base.Sample(
                key,
                base.latency_signal(latency.metric),
                source,
                ts,
                latency.p95_seconds,
                histogram,
            )
        )
    return tuple(samples)


def encode(
    *,
    model: str,
    ts: float,
    namespace: str | None = None,
    source: str | None = None,
    queue_depth: float | None = None,
    in_flight: float | None = None,
    tokens_per_second: float | None = None,
    prompt_tokens_per_second: float | None = None,
) -> bytes:
    """A contract message as bytes, for publishers (the demo, the benchmark, tests)."""
    body: dict[str, object] = {"v": 1, "model": model, "ts": ts}
    for name, value in (
        ("namespace", namespace),
        ("source", source),
        ("queue_depth", queue_depth),
        ("in_flight", in_flight),
        ("tokens_per_second", tokens_per_second),
        ("prompt_tokens_per_second", prompt_tokens_per_second),
    ):
        if value is not None:
            body[name] = value
    return json.dumps(body, separators=(",", ":")).encode()


def tally(stats: base.SourceStats, result: ParseResult) -> tuple[base.Sample, ...]:
    """Count a parse result in `stats` (accepted samples or the drop reason) and return
    the samples to store (none for a drop)."""
    if isinstance(result, Drop):
        stats.drop(result.reason)
        return ()
    stats.accepted += 1
    return result
