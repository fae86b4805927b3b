"""Recent decisions and scale events per model, bounded, and the audit log read back into them.

What is kept, and why (the view is `kubectl describe hpa`'s Events, so an operator in an
incident can ask "what did it do in the last hour, and why"):
- scale events (decisions that changed the count, applied or not): every one within the
  last `SCALE_WINDOW_S` (one hour), at most `MAX_SCALE_EVENTS`. One hour covers the
  longest default window a scale-down waits out (300 s) many times over; the cap bounds a
  flapping model: one change every 15 s is 240 an hour, within 256.
- every other decision (holds): the last `MAX_DECISIONS` distinct ones. A steady model
  decides the same thing every backstop tick (2,400 times in 10 h at 15 s): consecutive
  equal decisions merge into one entry with a count and first/last times, as Kubernetes
  aggregates repeated Events ("x40 over 10m"), so 100 entries reach back to the last 100
  changes of mind, not the last 100 ticks.
Holds live apart from scale events so that a burst of noisy holds cannot push the hour's
scale events out. Memory: an entry with two clamps and a reason is about 440 bytes
(tracemalloc: 5,000 adds leave 356 entries in 156 KB, see docs/service.md), so at most
(100 + 256) x 440 B, about 156 KB, for a model that flaps all hour; a steady model keeps a
handful of entries.
"""

from __future__ import annotations

import collections
import enum
import heapq
import json
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scaler.actuators import base as actuators
from scaler.engine import types

SCALE_WINDOW_S = 3600.0
MAX_SCALE_EVENTS = 256
MAX_DECISIONS = 100
# An actuator's reason is free text (an API error can be long): kept to this many
# characters, enough for "replicas changed under us: 4 -> 5 (resourceVersion 812)".
MAX_APPLY_REASON = 200


class EventType(enum.StrEnum):
    """Kubernetes Event types: Warning where an operator may have to act."""

    NORMAL = "Normal"
    WARNING = "Warning"


class EventReason(enum.StrEnum):
    """Why an entry is in the history, in the Events vocabulary (CamelCase, one word)."""

    SCALED_UP = "ScaledUp"  # the count went (or, in dry run / as follower, would go) up
    SCALED_DOWN = "ScaledDown"
    HELD = "Held"  # the count stays, signals are fresh (demand matches, or a limit holds it)
    SIGNALS_STALE = "SignalsStale"  # the count stays because signals are stale or missing
    FAILED_SCALE = "FailedScale"  # a change was decided and its patch failed or conflicted
    SCALER_SKIPPED = "ScalerSkipped"  # an HPA or KEDA owns the target (the actuator's reason)

    @property
    def type(self) -> EventType:
        if self in (EventReason.SIGNALS_STALE, EventReason.FAILED_SCALE,
                    EventReason.SCALER_SKIPPED):
            return EventType.WARNING
        return EventType.NORMAL


_FAILED = frozenset({actuators.Outcome.CONFLICT, actuators.Outcome.FAILED})


def classify(*, current: int, desired: int, held: bool, outcome: str | None) -> EventReason:
    """The reason of one decision and its apply outcome ('applied', 'conflict', ... or None
    when unknown). Example: 3 -> 5 with outcome 'conflict' is FailedScale; 6 -> 6 held is
    SignalsStale."""
    if outcome in _FAILED:
        return EventReason.FAILED_SCALE
    if outcome == actuators.Outcome.SKIPPED_HPA_OWNED:
        return EventReason.SCALER_SKIPPED
    if desired > current:
        return EventReason.SCALED_UP
    if desired < current:
        return EventReason.SCALED_DOWN
    return EventReason.SIGNALS_STALE if held else EventReason.HELD


@types.fast_init  # built every evaluation
@dataclass(frozen=True, slots=True)
class ClampChange:
    """A clamp as the history keeps it (its detail text stays in the decision document)."""

    name: str
    before: int
    after: int


@types.fast_init  # built every evaluation
@dataclass(frozen=True, slots=True)
class Event:
    """What one decision did, in the fields `explain.in_words` reads (same names as in
    `types.Decision`), plus the apply outcome and its reason."""

    reason: EventReason
    current: int
    desired: int
    recommendation: int | None
    winner: str | None
    held: bool
    clamps: tuple[ClampChange, ...]
    outcome: str | None
    apply_reason: str = ""

    @property
    def type(self) -> EventType:
        return self.reason.type

    @property
    def scale(self) -> bool:
        """A scale event: the decision changed the count (whatever became of the patch)."""
        return self.desired != self.current


def event_of(decision: types.Decision, *, outcome: str | None, apply_reason: str = ""
             ) -> Event:
    """The history event of an engine decision and what the actuator did with it."""
    return Event(
        reason=classify(current=decision.current, desired=decision.desired,
                        held=decision.held, outcome=outcome),
        current=decision.current, desired=decision.desired,
        recommendation=decision.recommendation,
        winner=None if decision.winner is None else str(decision.winner),
        held=decision.held,
        clamps=tuple([ClampChange(name=str(c.name), before=c.before, after=c.after)
                      for c in decision.clamps]),
        outcome=outcome, apply_reason=apply_reason[:MAX_APPLY_REASON])


@types.fast_init  # built every evaluation
@dataclass(frozen=True, slots=True)
class Entry:
    """An event seen `count` times in a row, first at `first_at`, last at `last_at`
    (epoch seconds)."""

    event: Event
    first_at: float
    last_at: float
    count: int = 1


class History:
    """One model's bounded history (the bounds and why: the module docstring)."""

    def __init__(self) -> None:
        self._scales: collections.deque[Entry] = collections.deque(maxlen=MAX_SCALE_EVENTS)
        self._decisions: collections.deque[Entry] = collections.deque(maxlen=MAX_DECISIONS)

    def add(self, event: Event, *, at: float) -> None:
        """Record `event` at `at`; equal to the newest entry, it only bumps that one's count."""
        ring = self._scales if event.scale else self._decisions
        tail = ring[-1] if ring else None
        if tail is not None and tail is self._newest() and tail.event == event:
            # Built directly: dataclasses.replace costs twice a constructor, once an
            # evaluation of every model.
            ring[-1] = Entry(event=tail.event, first_at=tail.first_at,
                             last_at=max(tail.last_at, at), count=tail.count + 1)
        else:
            ring.append(Entry(event=event, first_at=at, last_at=at))
        # Time comes from the events themselves, so a replayed audit log keeps the same
        # hour as the service did.
        while self._scales and self._scales[0].last_at < at - SCALE_WINDOW_S:
            self._scales.popleft()

    def _newest(self) -> Entry | None:
        """The later of the two rings' tails (the scale event's on a tie)."""
        scales, decisions = self._scales, self._decisions
        if not decisions:
            return scales[-1] if scales else None
        if not scales or decisions[-1].last_at > scales[-1].last_at:
            return decisions[-1]
        return scales[-1]

    def entries(self, limit: int | None = None) -> list[Entry]:
        """The newest `limit` entries (all kept when None), oldest first."""
        merged = list(heapq.merge(self._scales, self._decisions,
                                  key=lambda entry: entry.last_at))
        return merged if limit is None else merged[-limit:] if limit > 0 else []

    def __len__(self) -> int:
        return len(self._scales) + len(self._decisions)


# -- the audit log read back ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SkippedLine:
    """A line of an audit file that could not be read back, and why."""

    path: Path
    line: int
    why: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.why}"


@dataclass(frozen=True, slots=True)
class Replay:
    """Audit files read back: each model's history, and the lines that were skipped."""

    histories: Mapping[str, History]
    lines: int
    skipped: tuple[SkippedLine, ...]


class _BadRecord(ValueError):
    pass


def _field(mapping: Mapping[str, Any], name: str, kind: type | tuple[type, ...], *,
           where: str, optional: bool = False) -> Any:
    value = mapping.get(name)
    if value is None and optional:
        return None
    # A bool is an int to Python, never to the audit log.
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        raise _BadRecord(f"{where}{name}: expected {getattr(kind, '__name__', kind)}, "
                         f"got {type(value).__name__}")
    return value


def _record(document: Any) -> tuple[str, float, Event]:
    """(model key, wall time, event) of one audit document; _BadRecord names the field."""
    if not isinstance(document, dict):
        raise _BadRecord(f"not a JSON object but {type(document).__name__}")
    key = _field(document, "model", str, where="")
    at = float(_field(document, "at", (int, float), where=""))
    if not math.isfinite(at) or isinstance(document["at"], bool):
        raise _BadRecord("at: not a finite time")
    decision = _field(document, "decision", dict, where="")
    apply = _field(document, "apply", dict, where="", optional=True) or {}
    clamps = []
    for index, clamp in enumerate(_field(decision, "clamps", list, where="decision.")):
        where = f"decision.clamps[{index}]."
        if not isinstance(clamp, dict):
            raise _BadRecord(f"{where[:-1]}: not an object")
        clamps.append(ClampChange(name=_field(clamp, "name", str, where=where),
                                  before=_field(clamp, "before", int, where=where),
                                  after=_field(clamp, "after", int, where=where)))
    current = _field(decision, "current", int, where="decision.")
    desired = _field(decision, "desired", int, where="decision.")
    held = _field(decision, "held", bool, where="decision.")
    outcome = _field(apply, "outcome", str, where="apply.", optional=True)
    event = Event(
        reason=classify(current=current, desired=desired, held=held, outcome=outcome),
        current=current, desired=desired,
        recommendation=_field(decision, "recommendation", int, where="decision.",
                              optional=True),
        winner=_field(decision, "winner", str, where="decision.", optional=True),
        held=held, clamps=tuple(clamps), outcome=outcome,
        apply_reason=str(_field(apply, "reason", str, where="apply.", optional=True)
                         or "")[:MAX_APPLY_REASON])
    return key, at, event


def _lines(paths: Iterable[Path]) -> Iterator[tuple[Path, int, str]]:
    for path in paths:
        # errors="replace": a torn multi-byte character spoils its line, not the file.
        with path.open(encoding="utf-8", errors="replace") as handle:
            for number, line in enumerate(handle, start=1):
                yield path, number, line


def replay(paths: Iterable[Path]) -> Replay:
    """Read audit files (oldest first: decisions.jsonl.2, .1, then decisions.jsonl) into
    histories with the service's bounds. A truncated or corrupt line (a crash mid-write,
    a disk full) is skipped and named; blank lines are ignored. OSError for an unreadable
    file."""
    histories: dict[str, History] = {}
    skipped: list[SkippedLine] = []
    count = 0
    for path, number, line in _lines(paths):
        if not line.strip():
            continue
        count += 1
        try:
            key, at, event = _record(json.loads(line))
        except ValueError as error:  # JSONDecodeError and _BadRecord alike
            why = str(error) if isinstance(error, _BadRecord) else f"not JSON ({error})"
            skipped.append(SkippedLine(path=path, line=number, why=why))
            continue
        histories.setdefault(key, History()).add(event, at=at)
    return Replay(histories=histories, lines=count, skipped=tuple(skipped))
