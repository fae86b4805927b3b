"""The Prometheus text format written directly, byte for byte as prometheus-client writes it."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator, Sequence

from prometheus_client import utils

# prometheus-client passes legacy-valid names through `escape_metric_name` and
# `escape_label_name` unchanged; the families here are the service's own constants, so
# a name outside these sets is a programming error, refused when the family is made.
_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"
PART_LINES = 5000
"""Sample lines a part of the body holds: about 0.4 MiB, joined and encoded in about
1 ms (`TextFamilies.parts`)."""

go_float: Callable[[float], str] = utils.floatToGoString
"""A sample's value as prometheus-client writes it (Go's formatting: +Inf, NaN, 1e+06),
the library's own function, so the two cannot differ."""


def escape_label_value(value: str) -> str:
    """Backslash, newline and double quote escaped, in that order, as `generate_latest`
    escapes label values (everything else, unicode included, is written as it is)."""
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def escape_help(text: str) -> str:
    """A HELP line's text: backslash and newline escaped (quotes are not, in HELP)."""
    return text.replace("\\", r"\\").replace("\n", r"\n")


def header(name: str, documentation: str, kind: str) -> str:
    """The HELP and TYPE lines of a family whose samples are called `name`."""
    if not _METRIC_NAME.fullmatch(name):
        raise ValueError(f"metric name {name!r} is not a legacy Prometheus name")
    return f"# HELP {name} {escape_help(documentation)}\n# TYPE {name} {kind}\n"


class Cache:
    """What one scrape has already written: each label's `name="value"` text and each
    sample value's text, shared by its families. A model's name recurs in about 39 of
    them, and at 1,000 bench models the 39,000 samples have about 420 distinct values."""

    __slots__ = ("floats", "pairs", "zeros")

    def __init__(self) -> None:
        self.pairs: dict[str, dict[str, str]] = {}  # label name -> value -> 'name="value"'
        self.floats: dict[float, str] = {}
        # 0.0 and -0.0 are one key of `floats` but are written apart ("0.0", "-0.0"):
        # zeros are kept by their sign instead (a fifth of the samples are zeros).
        self.zeros: dict[float, str] = {}

    def value(self, value: float) -> str:
        if not value:
            sign = math.copysign(1.0, value)
            written = self.zeros.get(sign)
            if written is None:
                written = self.zeros[sign] = go_float(value)
            return written
        written = self.floats.get(value)
        if written is None:
            written = self.floats[value] = go_float(value)
        return written


class TextFamily:
    """One gauge or counter family, its sample lines written as series are added.

    prometheus-client sorts each sample's labels by name and checks and escapes every
    name and value anew (about 10 us a sample, two thirds of a scrape); here the order is
    worked out once per family and each label and value is written once per scrape
    (`Cache`).
    """

    __slots__ = ("_cache", "_floats", "_name", "_order", "header", "lines")

    def __init__(self, name: str, documentation: str, kind: str, labels: Sequence[str], *,
                 cache: Cache) -> None:
        for label in labels:
            if not _LABEL_NAME.fullmatch(label):
                raise ValueError(f"{name}: label name {label!r} is not a legacy Prometheus name")
        # prometheus-client appends `_total` to a counter's samples and names the family so.
        self._name = f"{name}_total" if kind == COUNTER else name
        self.header = header(self._name, documentation, kind)
        # (index into the values, label name, its pairs written) in the names' sorted order
        self._order = tuple((index, labels[index], cache.pairs.setdefault(labels[index], {}))
                            for index in sorted(range(len(labels)), key=labels.__getitem__))
        self._cache = cache
        self._floats = cache.floats
        self.lines: list[str] = []

    def add_metric(self, labels: Sequence[str], value: float) -> None:
        parts = []
        for index, label, pairs in self._order:
            text = labels[index]
            pair = pairs.get(text)
            if pair is None:
                pair = pairs[text] = f'{label}="{escape_label_value(text)}"'
            parts.append(pair)
        written = self._floats.get(value)
        if written is None or not value:  # a first value, or a zero (`Cache.value`)
            written = self._cache.value(value)
        if parts:
            self.lines.append(f"{self._name}{{{','.join(parts)}}} {written}\n")
        else:
            self.lines.append(f"{self._name} {written}\n")


def histogram(name: str, documentation: str, *, buckets: Sequence[tuple[str, float]],
              sum_value: float) -> str:
    """An unlabelled histogram family as `generate_latest` writes a HistogramMetricFamily:
    its buckets (`le` as given), then `_count` (the +Inf bucket's) and `_sum` (both only
    when the first bound is not negative, as prometheus-client does)."""
    lines = [header(name, documentation, HISTOGRAM)]
    lines.extend(f'{name}_bucket{{le="{escape_label_value(bound)}"}} {go_float(count)}\n'
                 for bound, count in buckets)
    if float(buckets[0][0]) >= 0:
        lines.append(f"{name}_count {go_float(buckets[-1][1])}\n")
        lines.append(f"{name}_sum {go_float(sum_value)}\n")
    return "".join(lines)


class TextFamilies:
    """The families of one scrape in the order they are made, which is the order written."""

    def __init__(self) -> None:
        self._parts: list[TextFamily | str] = []
        self._cache = Cache()

    def _family(self, name: str, documentation: str, kind: str,
                labels: Sequence[str]) -> TextFamily:
        family = TextFamily(name, documentation, kind, labels, cache=self._cache)
        self._parts.append(family)
        return family

    def gauge(self, name: str, documentation: str, labels: Sequence[str]) -> TextFamily:
        return self._family(name, documentation, GAUGE, labels)

    def counter(self, name: str, documentation: str, labels: Sequence[str]) -> TextFamily:
        return self._family(name, documentation, COUNTER, labels)

    def histogram(self, name: str, documentation: str, *,
                  buckets: Sequence[tuple[str, float]], sum_value: float) -> None:
        self._parts.append(histogram(name, documentation, buckets=buckets,
                                     sum_value=sum_value))

    def parts(self) -> Iterator[bytes]:
        """The text in UTF-8, at most `PART_LINES` samples a part, in order. The whole
        (32.3 MiB at 10,000 bench models) is never joined: joining and encoding it at once
        would hold the loop some 70 ms, and a per-signal family alone has 40,000 lines."""
        for part in self._parts:
            if isinstance(part, str):
                yield part.encode("utf-8")
                continue
            lines = part.lines
            yield (part.header + "".join(lines[:PART_LINES])).encode("utf-8")
            for first in range(PART_LINES, len(lines), PART_LINES):
                yield "".join(lines[first:first + PART_LINES]).encode("utf-8")
