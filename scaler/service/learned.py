"""What the engine learned of each model (`types.Learned`), kept across restarts and
failovers: one record a model in a ConfigMap the leader writes, read back at start.

The ConfigMap is writable by whoever may edit ConfigMaps in the scaler's namespace, so a
record is input like a signal: parsed within a size bound, every field checked for type
and physical bounds, and refused whole (logged with the model and the field, counted by
reason) rather than half used. A record is also refused when it is older than
`max_age_s` (the load it was learned on may be gone) or was learned under another
capacity model (its policy's target, signals, resources or profile changed: a served
share is relative to `capacityPerReplica`, a load per request to the same units).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import math
import re
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from scaler.engine import decide, recommend, types
from scaler.policy import model

log = logging.getLogger(__name__)

VERSION = 1
MAX_RECORD_BYTES = 4096
"""A record is about 300 bytes (1.6 kB with the learned hold's lists full, about 2.6 kB with
a cycle's two demand profiles full too, 3.9 kB at the largest values each field admits);
a longer one is not ours."""
MAX_DATA_BYTES = 900_000
"""The records written, in bytes of keys and values: under the API server's 1 MiB
(1,048,576 bytes) for a ConfigMap's data, with room for its metadata. About 3,000 models
of 300 bytes (about 340 whose learned hold and cycle keep all they may, 2.6 kB); past
that the models least recently learned from are left out (counted, `omitted`)."""
REFRESH_S = 3600.0
"""Records are rewritten at least this often while unchanged, so a value confirmed by a
running leader never reads as older than `max_age_s` to the next one."""
FUTURE_SKEW_S = 300.0
"""How far ahead of this instance's clock a record's times may lie (another node's clock)."""
DAY_S = 86_400.0
MAX_COUNT = 1_000_000_000

# Outcomes a record is counted under (scaler_learned_state_records{outcome}).
RESUMED = "resumed"
STALE = "stale"
POLICY_CHANGED = "policy_changed"
MALFORMED = "malformed"
IMPLAUSIBLE = "implausible"
OMITTED = "omitted"
RECORD_OUTCOMES = (RESUMED, STALE, POLICY_CHANGED, MALFORMED, IMPLAUSIBLE, OMITTED)
# The leader's writes (scaler_learned_state_writes{outcome}).
WRITTEN = "written"
FAILED = "failed"
WRITE_OUTCOMES = (WRITTEN, FAILED)

_KEY = re.compile(r"[-._a-zA-Z0-9]+")


class Refused(ValueError):
    """A record that is not resumed: `reason` is its outcome, the message names the field."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def data_key(model_key: str) -> str:
    """`namespace/name` -> the ConfigMap key `namespace.name` (a namespace has no dots,
    so the first dot splits it again)."""
    return model_key.replace("/", ".", 1)


def model_key(key: str) -> str:
    return key.replace(".", "/", 1)


_FINGERPRINTS: dict[str, tuple[model.ScalePolicy, str]] = {}
"""policy key -> (the policy object, its fingerprint): a write fingerprints every model a
minute (11 us each), and a policy object changes only when its file does."""


def fingerprint(policy: model.ScalePolicy) -> str:
    """What the learned values are relative to: the target, the signals (the capacity
    model), the resources (GPUs a replica) and the replica profile."""
    cached = _FINGERPRINTS.get(policy.key)
    if cached is not None and cached[0] is policy:
        return cached[1]
    spec = policy.spec
    parts = {"target": spec.target.model_dump(mode="json", by_alias=True),
             "signals": spec.signals.model_dump(mode="json", by_alias=True),
             "resources": spec.resources.model_dump(mode="json", by_alias=True),
             "profile": spec.profile}
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    _FINGERPRINTS[policy.key] = (policy, digest)
    return digest


# Record field -> (Learned attribute, kind, low, high). Kinds: "optional" a number that
# may be absent (None: not learned), "float", "count" a non-negative integer; bounds
# inclusive (a pod start of 0 s is what second-precision timestamps can give).
_FIELDS: dict[str, tuple[str, str, float, float]] = {
    "podStartSeconds": ("pod_start_s", "optional", 0.0, DAY_S),
    "nodeBootSeconds": ("node_boot_s", "optional", 0.0, DAY_S),
    "replicasPerRequestRate": ("replicas_per_request_rate", "optional", 0.0,
                               recommend.MAX_DEMAND_REPLICAS),
    "loadSamples": ("load_samples", "count", 0, MAX_COUNT),
    "servedShare": ("served_share", "float", *decide.SERVED_BOUNDS),
    "servedSamples": ("served_samples", "count", 0, MAX_COUNT),
    "returnGapSeconds": ("return_gap_s", "optional", 0.0, 7 * DAY_S),
    "returns": ("returns", "count", 0, MAX_COUNT),
    "returnJitterSeconds": ("return_jitter_s", "optional", 0.0, 7 * DAY_S),
    "horizonScale": ("horizon_scale", "float", 0.0, 1.0),
    "dropCycleSeconds": ("drop_cycle_s", "optional", 0.0, 7 * DAY_S),
    "dropCycles": ("drop_cycles", "count", 0, MAX_COUNT),
    "dropJitterSeconds": ("drop_jitter_s", "optional", 0.0, 7 * DAY_S),
}
# Written only once not zero: an instance of a version from before them refuses a record
# that holds them (an unknown field), so a downgrade loses only the models that saw the
# load fall away, not every model's record.
_ZERO_UNWRITTEN = frozenset({"dropCycles"})


# The learned hold's evidence (`decide.learned_hold`), lists kept as the engine keeps them:
# levelReturns [[epoch, seconds], ...] oldest first, each no longer than the one before;
# levelLeaves [epoch, ...] oldest first; at most decide.HOLD_SAMPLES of each (a record of
# both full is about 1.6 kB).
RETURNS = "levelReturns"
LEAVES = "levelLeaves"
# A load's cycle (`decide.cycle_ahead`): lastDropAt the last drop's epoch time; the
# highest demand of each CYCLE_BIN_S since it (cycleDemand) and since the drop before it
# (lastCycleDemand), in replicas, -1 (`decide.UNREAD`) where nothing was read, at most
# decide.CYCLE_MAX_BINS of each (about 1.1 kB both full of demands such as 4.351).
LAST_DROP = "lastDropAt"
PROFILES = {"cycleDemand": "cycle_demand", "lastCycleDemand": "last_cycle_demand"}


def encode(learned: types.Learned, *, at: float, policy_fingerprint: str) -> str:
    """One record: compact JSON, camelCase keys, times in epoch seconds."""
    document: dict[str, Any] = {"v": VERSION, "at": round(at, 3), "policy": policy_fingerprint}
    if math.isfinite(learned.observed_until):
        document["observedUntil"] = round(learned.observed_until, 3)
    for name, (attribute, _, _, _) in _FIELDS.items():
        value = getattr(learned, attribute)
        if value is not None and not (value == 0 and name in _ZERO_UNWRITTEN):
            document[name] = value
    if learned.level_returns:
        document[RETURNS] = [[round(r.at, 3), round(r.after_s, 3)]
                             for r in learned.level_returns]
    if learned.level_leaves:
        document[LEAVES] = [round(at, 3) for at in learned.level_leaves]
    if learned.last_drop_at is not None:
        document[LAST_DROP] = round(learned.last_drop_at, 3)
    for name, attribute in PROFILES.items():
        profile = getattr(learned, attribute)
        if profile:
            document[name] = [round(demand, 3) for demand in profile]
    return json.dumps(document, separators=(",", ":"))


def _entries(name: str, value: Any) -> list[Any]:
    if not isinstance(value, list):
        raise Refused(MALFORMED, f"{name}: not a list")
    if len(value) > decide.HOLD_SAMPLES:
        raise Refused(IMPLAUSIBLE, f"{name}: {len(value)} entries, more than "
                      f"{decide.HOLD_SAMPLES}")
    return value


def _epoch(name: str, value: Any, *, now: float) -> float:
    """A time seen: not in the future (one older than the engine remembers is forgotten
    at its next decision, as it would have been)."""
    at = _number(name, value)
    if at > now + FUTURE_SKEW_S:
        raise Refused(IMPLAUSIBLE, f"{name}: {at - now:.0f} s in the future")
    return at


def _levels(document: Mapping[str, Any], *, now: float) -> dict[str, Any]:
    """The learned hold's lists, checked as the engine keeps them (`decide.learned_hold`
    reads the longest return first): anything else is refused, never reordered."""
    values: dict[str, Any] = {}
    if RETURNS in document:
        returns: list[types.LevelReturn] = []
        for entry in _entries(RETURNS, document[RETURNS]):
            if not isinstance(entry, list) or len(entry) != 2:
                raise Refused(MALFORMED, f"{RETURNS}: {entry!r} is not [time, seconds]")
            at = _epoch(RETURNS, entry[0], now=now)
            after = _number(RETURNS, entry[1])
            if not 0.0 <= after <= DAY_S:
                raise Refused(IMPLAUSIBLE, f"{RETURNS}: back after {after!r} s")
            # No longer, not shorter: two the engine kept apart may round to the same.
            if returns and (at < returns[-1].at or after > returns[-1].after_s):
                raise Refused(MALFORMED, f"{RETURNS}: not oldest first, each no longer "
                              "than the one before")
            returns.append(types.LevelReturn(at=at, after_s=after))
        values["level_returns"] = tuple(returns)
    if LEAVES in document:
        leaves: list[float] = []
        for entry in _entries(LEAVES, document[LEAVES]):
            at = _epoch(LEAVES, entry, now=now)
            if leaves and at < leaves[-1]:
                raise Refused(MALFORMED, f"{LEAVES}: not oldest first")
            leaves.append(at)
        values["level_leaves"] = tuple(leaves)
    return values


def _cycle_fields(document: Mapping[str, Any], *, now: float) -> dict[str, Any]:
    """The cycle's last drop and demand profiles, checked as the engine keeps them: a
    profile's entries are demand in replicas or exactly UNREAD, never more than
    CYCLE_MAX_BINS of them."""
    values: dict[str, Any] = {}
    if LAST_DROP in document:
        values["last_drop_at"] = _epoch(LAST_DROP, document[LAST_DROP], now=now)
    for name, attribute in PROFILES.items():
        if name not in document:
            continue
        entries = document[name]
        if not isinstance(entries, list):
            raise Refused(MALFORMED, f"{name}: not a list")
        if len(entries) > decide.CYCLE_MAX_BINS:
            raise Refused(IMPLAUSIBLE, f"{name}: {len(entries)} entries, more than "
                          f"{decide.CYCLE_MAX_BINS}")
        profile = tuple(_number(name, entry) for entry in entries)
        wrong = next((demand for demand in profile if demand != decide.UNREAD and not
                      0.0 <= demand <= recommend.MAX_DEMAND_REPLICAS), None)
        if wrong is not None:
            raise Refused(IMPLAUSIBLE, f"{name}: {wrong!r} is neither a demand in "
                          f"[0, {recommend.MAX_DEMAND_REPLICAS:g}] nor {decide.UNREAD:g}")
        values[attribute] = profile
    return values


def _number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise Refused(MALFORMED, f"{name}: not a number ({value!r})")
    try:
        number = float(value)  # an integer of 400 digits does not fit
    except OverflowError:
        raise Refused(IMPLAUSIBLE, f"{name}: too large") from None
    if not math.isfinite(number):
        raise Refused(IMPLAUSIBLE, f"{name}: not finite ({value!r})")
    return number


def decode(text: str, *, now: float, policy_fingerprint: str, max_age_s: float
           ) -> types.Learned:
    """A record back as `types.Learned`; raises Refused naming what is wrong."""
    return _decoded(text, now=now, policy_fingerprint=policy_fingerprint,
                    max_age_s=max_age_s)[0]


def _decoded(text: str, *, now: float, policy_fingerprint: str, max_age_s: float
             ) -> tuple[types.Learned, float]:
    """`decode`, and when the record was written."""
    if len(text) > MAX_RECORD_BYTES:
        raise Refused(MALFORMED, f"{len(text)} bytes, more than {MAX_RECORD_BYTES}")
    try:
        document = json.loads(text)
    except ValueError as error:
        raise Refused(MALFORMED, f"not JSON: {error}") from None
    if not isinstance(document, dict):
        raise Refused(MALFORMED, "not a JSON object")
    if document.get("v") != VERSION:
        raise Refused(MALFORMED, f"v: {document.get('v')!r}, want {VERSION}")
    at = _number("at", document.get("at"))
    if at > now + FUTURE_SKEW_S:
        raise Refused(IMPLAUSIBLE, f"at: {at:.0f} is {at - now:.0f} s in the future")
    if now - at > max_age_s:
        raise Refused(STALE, f"at: written {now - at:.0f} s ago, more than {max_age_s:.0f} s")
    if document.get("policy") != policy_fingerprint:
        raise Refused(POLICY_CHANGED, "policy: learned under another target, signals, "
                      "resources or profile")
    values: dict[str, Any] = {}
    if "observedUntil" in document:
        observed = _number("observedUntil", document["observedUntil"])
        if observed > now + FUTURE_SKEW_S:
            raise Refused(IMPLAUSIBLE, f"observedUntil: {observed - now:.0f} s in the future")
        values["observed_until"] = observed
    for name, (attribute, kind, low, high) in _FIELDS.items():
        if name not in document or (kind == "optional" and document[name] is None):
            continue
        number = _number(name, document[name])
        if kind == "count" and not number.is_integer():
            raise Refused(MALFORMED, f"{name}: not a whole number ({number!r})")
        if not low <= number <= high:
            raise Refused(IMPLAUSIBLE, f"{name}: {number!r} outside [{low:g}, {high:g}]")
        values[attribute] = int(number) if kind == "count" else number
    values.update(_levels(document, now=now))
    values.update(_cycle_fields(document, now=now))
    unknown = set(document) - {"v", "at", "policy", "observedUntil", RETURNS, LEAVES,
                               LAST_DROP, *PROFILES, *_FIELDS}
    if unknown:
        raise Refused(MALFORMED, f"unknown fields {sorted(unknown)}")
    return types.Learned(**values), at


class Resume:
    """The records read (at start, or on taking over in a queue group), taken one model at
    a time as each is next evaluated, so a record is applied once, by the evaluation that
    follows the read."""

    def __init__(self, data: Mapping[str, str], *, max_age_s: float,
                 counts: Counter[str] | None = None) -> None:
        self.max_age_s = max_age_s
        self.records: dict[str, str] = {}
        # Records by outcome (scaler_learned_state_records): the service state's counter.
        self.counts: Counter[str] = Counter() if counts is None else counts
        for key, text in data.items():
            if _KEY.fullmatch(key) and "." in key:
                self.records[model_key(key)] = text
            else:
                self.counts[MALFORMED] += 1
                log.warning("learned state: key %r is not namespace.name; ignored", key)

    def take(self, policy: model.ScalePolicy, *, now: float
             ) -> tuple[types.Learned, float] | None:
        """What `policy`'s model had learned and when that was written, or None (nothing
        kept, or refused: logged and counted)."""
        text = self.records.pop(policy.key, None)
        if text is None:
            return None
        try:
            learned, written_at = _decoded(text, now=now,
                                           policy_fingerprint=fingerprint(policy),
                                           max_age_s=self.max_age_s)
        except Refused as refused:
            self.counts[refused.reason] += 1
            log.warning("%s: learned state not resumed (%s): %s", policy.key, refused.reason,
                        refused, extra={"model": policy.key})
            return None
        self.counts[RESUMED] += 1
        log.info("%s: resumed learned state: %s", policy.key, learned,
                 extra={"model": policy.key})
        return learned, written_at


def payload(learned: Mapping[str, types.Learned], policies: Mapping[str, model.ScalePolicy],
            *, at: float, pending: Mapping[str, str]) -> tuple[dict[str, str], int]:
    """The ConfigMap's data: a record for every model in force that learned something, and
    the records read at start of models not evaluated since (carried over unchanged);
    within MAX_DATA_BYTES, the most samples first. Returns (data, records left out).
    Records are encoded in that order and only until the bound, so a write costs what the
    ConfigMap holds, not what every model learned (3,000 models whose learned holds keep
    all they may, 641 of them written: 48 ms rather than 204 ms, on the leader's event
    loop; 3,000 of 300 bytes: 24 ms)."""
    empty = types.Learned()
    # (weight, key, the record: encoded when reached, or as read at start)
    records: list[tuple[int, str, Callable[[], str]]] = []
    for key, values in learned.items():
        policy = policies.get(key)
        if policy is None or values == empty:
            continue
        weight = (values.load_samples + values.served_samples + values.returns
                  + len(values.level_returns) + len(values.level_leaves)
                  + values.drop_cycles)
        records.append((weight, data_key(key), functools.partial(
            encode, values, at=at, policy_fingerprint=fingerprint(policy))))
    for key, text in pending.items():
        if key in policies and key not in learned:
            records.append((0, data_key(key), functools.partial(str, text)))
    records.sort(key=lambda r: (-r[0], r[1]))
    data: dict[str, str] = {}
    size = 0
    for _, key, record in records:
        text = record()
        if size + len(key) + len(text) > MAX_DATA_BYTES:
            break
        data[key] = text
        size += len(key) + len(text)
    return dict(sorted(data.items())), len(records) - len(data)
