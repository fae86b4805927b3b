"""The signal message contract (DESIGN 4.2): a pure, size-limited, pydantic-validated parse."""

from __future__ import annotations

import enum
import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Final

import pydantic
from pydantic import BaseModel, ConfigDict, Field, model_validator

from scaler.core import histogram, vocabulary
from scaler.signals import samples

MAX_MESSAGE_BYTES: Final = 64 * 1024
"""The contract's limit: one JSON object of at most 64 KiB."""



class DropReason(enum.StrEnum):
    """Why a message was refused, as counted in /metrics (label `reason`)."""

    MALFORMED_JSON = "malformed_json"
    SCHEMA = "schema"
    OVERSIZED = "oversized"
    FUTURE_DATED = "future_dated"
    STALE = "stale"
    UNKNOWN_MODEL = "unknown_model"
    SUBJECT_MISMATCH = "subject_mismatch"
    IMPLAUSIBLE = "implausible"


_Finite = Annotated[float, Field(allow_inf_nan=False)]
_Count = Annotated[float, Field(ge=0, allow_inf_nan=False)]
_Name = Annotated[str, Field(min_length=1, max_length=253, pattern=r"^[A-Za-z0-9][-A-Za-z0-9_.]*$")]


class _Strict(BaseModel):
    # Unknown fields are ignored (publishers may add their own); values are immutable.
    # Strict types: a boolean is not a count, a string is not a number ("in_flight": true
    # would otherwise read as 1).
    model_config = ConfigDict(frozen=True, extra="ignore", strict=True)


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
    # Strict elsewhere, but an enum's value is a string in a decoded HTTP body too.
    metric: Annotated[vocabulary.LatencyMetric, Field(strict=False)] = (
        vocabulary.DEFAULT_LATENCY_METRIC)
    p95_seconds: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = None
    histogram: HistogramBody | None = None


class SignalMessage(_Strict):
    """One message body. Every field but `v`, `model` and `ts` is optional."""

    v: int
    model: _Name
    namespace: _Name | None = None
    source: Annotated[str, Field(min_length=1, max_length=253)] | None = None
    ts: _Finite
    queue_depth: _Count | None = None
    in_flight: _Count | None = None
    tokens_per_second: _Count | None = None
    prompt_tokens_per_second: _Count | None = None
    completion_rate: _Count | None = None
    kv_cache_usage: _Count | None = None  # a fraction: above 1 is implausible (dropped)
    latency: LatencyBody | None = None

    @model_validator(mode="after")
    def _version(self) -> SignalMessage:
        if self.v != 1:
            raise ValueError(f"v must be 1, not {self.v}")
        return self

    # `ready` (DESIGN 4.2) is accepted and ignored like any unknown field: readiness is
    # read from the cluster (the pods' Ready condition), which a publisher cannot fake.


@dataclass(frozen=True, slots=True)
class Limits:
    """Acceptance rules for messages.

    max_bytes: the contract's 64 KiB. max_future_s: clock skew tolerated between a
    publisher and the scaler (a `ts` 2 s ahead is skew; 5 min ahead is a bug).
    max_age_s: for a model the route does not know, older messages are stale on arrival
    (30 s, the policies' default staleAfterSeconds). A known model's own
    staleAfterSeconds applies instead (`Route.models`): a policy with 120 s accepts a
    message 60 s old.
    """

    max_bytes: int = MAX_MESSAGE_BYTES
    max_future_s: float = 5.0
    max_age_s: float = 30.0


@dataclass(frozen=True, slots=True)
class Drop:
    """A refused message: the reason (counted) and a short detail (for logs, HTTP errors)."""

    reason: DropReason
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Route:
    """What a message must match to be accepted.

    expected: the model key the subject belongs to ('inference/llama-70b'), or None for
    a wildcard subscription. default_namespace: used when the body has no `namespace`.
    models: model key -> its policy's staleAfterSeconds, for the models with a policy
    (a message about another is refused); None = accept any model.
    """

    expected: str | None = None
    default_namespace: str = "default"
    models: Mapping[str, float] | None = None


ParseResult = tuple[samples.Sample, ...] | Drop

DEFAULT_LIMITS: Final = Limits()

_ANY_ROUTE: Final = Route()



TRANSPORTS: Final = ("nats", "http")
"""The transports that carry signal messages, each a prefix of its samples' source."""
ANONYMOUS: Final = "anonymous"
"""The source of a message that names none: no replica's own report."""


@functools.lru_cache(maxsize=1024)
def shared_queue_keys(names: tuple[str, ...]) -> frozenset[str]:
    """The samples' sources of the messages a policy names in
    `spec.sources.sharedQueueSources`, over every transport: ('gateway',) ->
    {'nats/gateway', 'http/gateway'}. Cached (policies mostly name none, or the same few):
    no new set an evaluation."""
    return frozenset(f"{transport}/{name}" for transport in TRANSPORTS for name in names)


def replica_of(source: str) -> str | None:
    """The replica a message sample came from: the message's `source`, the pod's name
    (DESIGN 4.2), behind the transport prefix: 'nats/llama-7d9f-abc12' ->
    'llama-7d9f-abc12'. None for a message that named no source and for sources that are
    no replica ('prometheus', 'jetstream/<stream>/<consumer>')."""
    transport, _, name = source.partition("/")
    return name if transport in TRANSPORTS and name and name != ANONYMOUS else None

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
        return Drop(DropReason.OVERSIZED, f"{len(data)} bytes > {limits.max_bytes}")
    try:
        message = SignalMessage.model_validate_json(data)
    except pydantic.ValidationError as exc:
        return _validation_drop(exc)
    except (ValueError, RecursionError) as exc:  # pragma: no cover - pydantic wraps these
        return Drop(DropReason.MALFORMED_JSON, str(exc)[:200])
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
        return Drop(DropReason.SCHEMA, "not a JSON value")
    if size > limits.max_bytes:
        return Drop(DropReason.OVERSIZED, f"{size} bytes > {limits.max_bytes}")
    try:
        message = SignalMessage.model_validate(item)
    except pydantic.ValidationError as exc:
        return _validation_drop(exc)
    return to_samples(message, now=now, limits=limits, route=route, transport=transport)


def _validation_drop(exc: pydantic.ValidationError) -> Drop:
    errors = exc.errors(include_url=False, include_input=False)
    if any(error["type"] == "json_invalid" for error in errors):
        return Drop(DropReason.MALFORMED_JSON, errors[0]["msg"][:200])
    first = errors[0] if errors else None
    where = ".".join(str(part) for part in first["loc"]) if first else ""
    detail = f"{where}: {first['msg']}" if first else "invalid"
    return Drop(DropReason.SCHEMA, detail[:200])


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
        return Drop(DropReason.FUTURE_DATED,
                    f"ts {message.ts:.3f} is {message.ts - now:.1f} s ahead")
    namespace = message.namespace or route.default_namespace
    key = vocabulary.model_key(namespace, message.model)
    if route.expected is not None and key != route.expected:
        return Drop(DropReason.SUBJECT_MISMATCH, f"{key} on the subject of {route.expected}")
    max_age_s = limits.max_age_s
    if route.models is not None:
        stale_after_s = route.models.get(key)
        if stale_after_s is None:
            return Drop(DropReason.UNKNOWN_MODEL, f"no policy for {key}")
        max_age_s = stale_after_s
    if message.ts < now - max_age_s:
        return Drop(DropReason.STALE, f"ts {message.ts:.3f} is {now - message.ts:.1f} s old "
                    f"(stale after {max_age_s:g} s)")
    # A ts within the skew tolerance but ahead of us counts as now: ages are never negative.
    ts = min(message.ts, now)
    source = f"{transport}/{message.source or ANONYMOUS}"
    out: list[samples.Sample] = []
    for signal in vocabulary.MESSAGE_SIGNALS:
        value: float | None = getattr(message, signal.value)
        if value is None:
            continue
        if value > signal.plausible_max:
            return Drop(DropReason.IMPLAUSIBLE,
                        f"{signal} {value:g} > {signal.plausible_max:g} from one source")
        out.append(samples.Sample(key, signal, source, ts, value))
    latency = message.latency
    if latency is not None and latency.p95_seconds is not None and (
            latency.p95_seconds > vocabulary.Signal.P95_LATENCY.plausible_max):
        return Drop(DropReason.IMPLAUSIBLE, f"p95 {latency.p95_seconds:g} s")
    if latency is not None and (latency.p95_seconds is not None or latency.histogram):
        body = latency.histogram
        out.append(samples.Sample(
            key, vocabulary.Signal.P95_LATENCY, source, ts, latency.p95_seconds,
            None if body is None else histogram.Histogram(le=tuple(body.le),
                                                          counts=tuple(body.counts)),
            metric=latency.metric))
    return tuple(out)


def encode(
    *,
    model: str,
    ts: float,
    namespace: str | None = None,
    source: str | None = None,
    values: Mapping[vocabulary.Signal, float] | None = None,
    latency_metric: vocabulary.LatencyMetric | None = None,
    p95_seconds: float | None = None,
    latency_histogram: histogram.Histogram | None = None,
) -> bytes:
    """A contract message (DESIGN 4.2) as bytes, for publishers (the demo, benchmarks,
    tests). `values` are the numeric fields (`vocabulary.MESSAGE_SIGNALS`); a latency
    body is written when a p95 or a histogram is given."""
    body: dict[str, object] = {"v": 1, "model": model, "ts": ts}
    if namespace is not None:
        body["namespace"] = namespace
    if source is not None:
        body["source"] = source
    for signal, value in (values or {}).items():
        if signal not in vocabulary.MESSAGE_SIGNALS:
            raise ValueError(f"{signal} is not a field of a signal message")
        body[signal.value] = value
    if p95_seconds is not None or latency_histogram is not None:
        latency: dict[str, object] = {
            "metric": latency_metric or vocabulary.DEFAULT_LATENCY_METRIC}
        if p95_seconds is not None:
            latency["p95_seconds"] = p95_seconds
        if latency_histogram is not None:
            latency["histogram"] = {"le": list(latency_histogram.le),
                                    "counts": list(latency_histogram.counts)}
        body["latency"] = latency
    return json.dumps(body, separators=(",", ":")).encode()


def tally(stats: samples.SourceStats, result: ParseResult) -> tuple[samples.Sample, ...]:
    """Count a parse result in `stats` (accepted samples or the drop reason) and return
    the samples to store (none for a drop)."""
    if isinstance(result, Drop):
        stats.drop(result.reason)
        return ()
    stats.accepted += 1
    return result
