"""Request trace loaders (Azure LLM 2023, Mooncake, ServeGen, plain CSV) and rate scaling."""

from __future__ import annotations

import bisect
import csv
import dataclasses
import datetime as dt
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import numpy.typing as npt

from scaler import data

TraceFormat = Literal["auto", "azure", "mooncake", "servegen", "csv"]
FORMATS: tuple[TraceFormat, ...] = ("auto", "azure", "mooncake", "servegen", "csv")

# ServeGen's aggregate traces use 600 s windows (one row per client per window).
SERVEGEN_WINDOW_S = 600.0

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


class TraceError(ValueError):
    """A malformed trace: names the file, the 1-based line and column, and what is wrong."""

    def __init__(self, path: str | Path, *, line: int, column: str | None, message: str) -> None:
        self.path = str(path)
        self.line = line
        self.column = column
        self.message = message
        where = f"{self.path}:{line}" + (f" column {column!r}" if column else "")
        super().__init__(f"{where}: {message}")


@dataclass(frozen=True, slots=True)
class Row:
    """One request as a loader streams it: absolute timestamp in seconds and token counts."""

    timestamp_s: float
    input_tokens: int
    output_tokens: int


@dataclass(frozen=True)
class Trace:
    """Requests sorted by arrival; `arrival_s` is relative to the first arrival (0.0), or
    to the slice start when a slice was cut with `start_s` (see `load_trace`).

    `duration_s` is the last arrival's time (Azure code: 3,436 s for 8,819 requests).
    `start_s` is the absolute time of `arrival_s == 0` in seconds (epoch seconds for
    Azure's naive wall clock read as UTC; seconds from local midnight of day 0 for
    ServeGen). `length_source` says where token lengths came from when the trace itself
    has none (ServeGen), for the user to see.
    """

    path: str
    arrival_s: FloatArray
    input_tokens: IntArray
    output_tokens: IntArray
    rate_scale: float = 1.0
    start_s: float = 0.0
    length_source: str = ""

    @property
    def requests(self) -> int:
        return int(self.arrival_s.size)

    @property
    def duration_s(self) -> float:
        return float(self.arrival_s[-1]) if self.arrival_s.size else 0.0

    def per_minute(self) -> IntArray:
        """Requests in each 60 s bin from the first arrival (the last bin may be partial)."""
        if not self.arrival_s.size:
            return np.zeros(0, dtype=np.int64)
        bins = (self.arrival_s // 60.0).astype(np.int64)
        return np.bincount(bins).astype(np.int64)


def warmup(arrival_s: FloatArray, seconds: float) -> tuple[FloatArray, IntArray]:
    """The traffic sent before t=0 so that the replicas are busy at t=0 as they would be
    in the load's first seconds, not empty: the trace's requests of its first `seconds`,
    in their order, at its first `seconds`' arrival times played backwards (a request
    arrived `a` s in means one is sent `a` s before t=0), so the rate runs into t=0 as it
    runs out of it. Returns (send times in [0, seconds), counted from the warm-up's start,
    and the index of the trace's request each one repeats), in time order. The request
    at 0 is the trace's own at t=0 and is not sent twice.

    Until the twenty-sixth session the first `seconds` were replayed forwards, so the
    warm-up ended where the trace is at `seconds`:
    - a load that climbs from its start then fell at t=0, a fall no load had (the
      hold-out's steep ramp: 11 req/s at the warm-up's end, 2 at t=0; the look-ahead read
      the run's first 20 s as demand falling from 1.1 replicas to 0.24, and its first
      trend bought a replica only 82 s in);
    - and every strategy started from the state that load two minutes on leaves: Azure
      code's burst at 100-120 s (x16, seed 3) was on the replicas at t=0, so when it came
      the replicas bought for it were there.
    Tried too: the requests themselves played backwards put each of the first seconds'
    requests twice within seconds of t=0 (a long prompt at 5 s and its copy at -5 s: the
    suite's long-context load lost windows 2 and 6 on seed 3), and the first 30 s
    repeated four times kept the rate but sampled a long-prompt mix from a handful of
    requests (long-context lost a window on seeds 3 and 4).
    """
    sent = np.flatnonzero((arrival_s > 0.0) & (arrival_s < seconds))
    return np.sort(seconds - arrival_s[sent]), sent.astype(np.int64)


def _int_field(value: str, *, path: str | Path, line: int, column: str) -> int:
    try:
        number = int(value)
    except ValueError:
        try:
            as_float = float(value)
        except ValueError:
            raise TraceError(path, line=line, column=column,
                             message=f"{value!r} is not a number") from None
        if not as_float.is_integer():
            raise TraceError(path, line=line, column=column,
                             message=f"{value!r} is not a whole number of tokens") from None
        number = int(as_float)
    if number < 0:
        raise TraceError(path, line=line, column=column, message=f"{number} is negative")
    return number


def _float_field(value: str, *, path: str | Path, line: int, column: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise TraceError(path, line=line, column=column,
                         message=f"{value!r} is not a number") from None
    if not math.isfinite(number):
        raise TraceError(path, line=line, column=column, message=f"{value!r} is not finite")
    return number


_EPOCH = dt.datetime(1970, 1, 1)


def _azure_timestamp(value: str, *, path: str | Path, line: int, days: dict[str, float]) -> float:
    """'2023-11-16 18:17:03.9799600' -> seconds since the epoch (naive; the trace has no zone).

    Parsed by hand because the trace has 7 fractional digits (100 ns), which
    `datetime.fromisoformat` does not accept on every Python 3.11 patch release, and
    because it is about 5x faster: the date part is cached per day.
    """
    date_part, _, time_part = value.strip().partition(" ")
    try:
        day = days.get(date_part)
        if day is None:
            day = (dt.datetime.strptime(date_part, "%Y-%m-%d") - _EPOCH).total_seconds()
            days[date_part] = day
        hours, minutes, seconds = time_part.split(":")
        return day + int(hours) * 3600 + int(minutes) * 60 + float(seconds)
    except ValueError:
        raise TraceError(path, line=line, column="TIMESTAMP",
                         message=f"{value!r} is not 'YYYY-MM-DD HH:MM:SS.fffffff'") from None


def _csv_rows(path: Path, *, columns: tuple[str, str, str]) -> Iterator[tuple[int, list[str]]]:
    """Rows of a CSV with a header containing `columns`, as (line number, [ts, in, out])."""
    with path.open(newline="") as handle:
        reader = csv.reader(handle)
        header = next(reader, None)
        if header is None:
            raise TraceError(path, line=1, column=None, message="empty file")
        names = [name.strip() for name in header]
        missing = [c for c in columns if c not in names]
        if missing:
            raise TraceError(path, line=1, column=None,
                             message=f"header lacks {', '.join(missing)} (found {names})")
        index = [names.index(c) for c in columns]
        width = max(index) + 1
        for record in reader:
            if not record or all(not cell.strip() for cell in record):
                continue
            if len(record) < width:
                raise TraceError(path, line=reader.line_num, column=columns[len(record) - 1]
                                 if len(record) and len(record) <= len(columns) else None,
                                 message=f"expected {len(names)} fields, found {len(record)}")
            yield reader.line_num, [record[i] for i in index]


def iter_azure(path: Path) -> Iterator[Row]:
    """Azure LLM inference trace 2023: `TIMESTAMP,ContextTokens,GeneratedTokens`."""
    days: dict[str, float] = {}
    for line, (stamp, context, generated) in _csv_rows(
        path, columns=("TIMESTAMP", "ContextTokens", "GeneratedTokens")
    ):
        yield Row(
            _azure_timestamp(stamp, path=path, line=line, days=days),
            _int_field(context, path=path, line=line, column="ContextTokens"),
            _int_field(generated, path=path, line=line, column="GeneratedTokens"),
        )


def iter_plain_csv(path: Path) -> Iterator[Row]:
    """Plain CSV: `timestamp_s,input_tokens,output_tokens` (seconds, any origin)."""
    for line, (stamp, inp, out) in _csv_rows(
        path, columns=("timestamp_s", "input_tokens", "output_tokens")
    ):
        yield Row(
            _float_field(stamp, path=path, line=line, column="timestamp_s"),
            _int_field(inp, path=path, line=line, column="input_tokens"),
            _int_field(out, path=path, line=line, column="output_tokens"),
        )


def iter_mooncake(path: Path) -> Iterator[Row]:
    """Mooncake JSONL: one object a line; `timestamp` (ms), `input_length`, `output_length`."""
    with path.open() as handle:
        for line, text in enumerate(handle, start=1):
            if not text.strip():
                continue
            try:
                obj = json.loads(text.strip())
            except json.JSONDecodeError as exc:
                raise TraceError(path, line=line, column=f"char {exc.colno}",
                                 message=f"invalid JSON: {exc.msg}") from None
            if not isinstance(obj, dict):
                raise TraceError(path, line=line, column=None, message="not a JSON object")
            values: list[float] = []
            for key in ("timestamp", "input_length", "output_length"):
                if key not in obj:
                    raise TraceError(path, line=line, column=key, message="missing")
                raw = obj[key]
                if isinstance(raw, bool) or not isinstance(raw, int | float):
                    raise TraceError(path, line=line, column=key,
                                     message=f"{raw!r} is not a number")
                if not math.isfinite(raw) or raw < 0:
                    raise TraceError(path, line=line, column=key,
                                     message=f"{raw!r} is not a finite, non-negative number")
                values.append(float(raw))
            yield Row(values[0] / 1000.0, int(values[1]), int(values[2]))


@dataclass(frozen=True, slots=True)
class ServeGenWindow:
    """One client's 600 s window: arrival rate (req/s), inter-arrival CV and distribution."""

    start_s: float
    rate: float
    cv: float
    pattern: str


def iter_servegen_windows(path: Path) -> Iterator[ServeGenWindow]:
    """Rows of one ServeGen client file (no header): start, rate, cv, pattern, shape, scale."""
    with path.open(newline="") as handle:
        for line, record in enumerate(csv.reader(handle), start=1):
            if not record:
                continue
            if len(record) != 6:
                raise TraceError(path, line=line, column=None,
                                 message=f"expected 6 fields, found {len(record)}")
            start = _float_field(record[0], path=path, line=line, column="window_start_s")
            rate = _float_field(record[1], path=path, line=line, column="rate_req_per_s")
            cv = _float_field(record[2], path=path, line=line, column="cv")
            pattern = record[3].strip()
            if rate < 0 or cv < 0:
                raise TraceError(path, line=line, column="rate_req_per_s" if rate < 0 else "cv",
                                 message="is negative")
            if rate > 0 and pattern not in ("Gamma", "Weibull"):
                raise TraceError(path, line=line, column="pattern",
                                 message=f"{pattern!r} is not Gamma or Weibull")
            yield ServeGenWindow(start, rate, cv, pattern)


def _weibull_shape_for_cv(cv: float) -> float:
    """Weibull shape k whose CV is `cv`: CV^2 = G(1+2/k)/G(1+1/k)^2 - 1, decreasing in k.

    Bisection on log k; e.g. CV 1 -> k = 1 (exponential), CV 2 -> k ~ 0.54.
    """
    def cv_of(k: float) -> float:
        log_ratio = math.lgamma(1 + 2 / k) - 2 * math.lgamma(1 + 1 / k)
        return math.sqrt(max(0.0, math.expm1(min(log_ratio, 700.0))))

    low, high = math.log(0.05), math.log(50.0)
    for _ in range(60):
        mid = (low + high) / 2
        if cv_of(math.exp(mid)) > cv:
            low = mid
        else:
            high = mid
    return math.exp((low + high) / 2)


def _draw_window(
    window: ServeGenWindow, *, rate_scale: float, window_s: float, rng: np.random.Generator
) -> FloatArray:
    """Arrival times within one window, from the fitted inter-arrival distribution.

    Gaps have mean 1/rate and the window's CV: Gamma with shape 1/CV^2 (CV 2 -> shape
    0.25), or Weibull with the shape solved from the CV. The rate is scaled here rather
    than thinned afterwards, so a 0.01 scale of 14 days costs 1 % of the draws.
    """
    rate = window.rate * rate_scale
    if rate <= 0:
        return np.zeros(0)
    mean_gap = 1.0 / rate
    cv = window.cv if window.cv > 0 else 1.0
    expected = rate * window_s
    batch = int(expected * 1.5 + 10 * cv + 10)

    def gaps(count: int) -> FloatArray:
        if window.pattern == "Weibull":
            shape = _weibull_shape_for_cv(round(cv, 3))
            return rng.weibull(shape, count) * (mean_gap / math.gamma(1 + 1 / shape))
        shape = 1.0 / (cv * cv)
        return rng.gamma(shape, mean_gap / shape, count)

    # Start in equilibrium: the window opens inside a gap picked in proportion to its
    # length (the inspection paradox), at a uniform point of it. Starting at an arrival
    # instead adds (CV^2 - 1)/2 arrivals per window: +31 at CV 8, which inflated a day
    # of ServeGen at 1 % of the rate by 6 %.
    if window.pattern == "Weibull":
        sample = gaps(4096)
        total = float(sample.sum())
        picked = sample[rng.choice(sample.size, p=sample / total)] if total > 0 else mean_gap
    else:
        # Length-biased Gamma(k, theta) is exactly Gamma(k + 1, theta).
        shape = 1.0 / (cv * cv)
        picked = rng.gamma(shape + 1.0, mean_gap / shape)
    draws: list[FloatArray] = []
    clock = window.start_s + rng.uniform() * float(picked)
    draws.append(np.array([clock]))
    end = window.start_s + window_s
    while clock < end:
        times = clock + np.cumsum(gaps(batch))
        clock = float(times[-1])
        draws.append(times)
    times = np.concatenate(draws)
    return times[(times >= window.start_s) & (times < end)]


def servegen_files(path: Path) -> list[Path]:
    if path.is_dir():
        files = sorted(path.glob("chunk-*-trace.csv"))
        if not files:
            raise TraceError(path, line=0, column=None,
                             message="folder has no ServeGen chunk-*-trace.csv files")
        return files
    return [path]


def load_lengths(path: Path) -> tuple[IntArray, IntArray]:
    """Token lengths (input, output) from a ShareGPT-style stats CSV or any supported trace."""
    with path.open() as handle:
        first = handle.readline()
    if "num_prefill_tokens" in first:
        inputs: list[int] = []
        outputs: list[int] = []
        for line, (inp, out) in _csv_length_rows(path):
            inputs.append(_int_field(inp, path=path, line=line, column="num_prefill_tokens"))
            outputs.append(_int_field(out, path=path, line=line, column="num_decode_tokens"))
        return np.asarray(inputs, dtype=np.int64), np.asarray(outputs, dtype=np.int64)
    trace = load_trace(path, "auto")
    return trace.input_tokens, trace.output_tokens


def _csv_length_rows(path: Path) -> Iterator[tuple[int, list[str]]]:
    with path.open(newline="") as handle:
        reader = csv.reader(handle)
        names = [n.strip() for n in next(reader)]
        i_in, i_out = names.index("num_prefill_tokens"), names.index("num_decode_tokens")
        for record in reader:
            if record:
                if len(record) <= max(i_in, i_out):
                    raise TraceError(path, line=reader.line_num, column=None,
                                     message=f"expected {len(names)} fields")
                yield reader.line_num, [record[i_in], record[i_out]]


def default_lengths_path(servegen_path: Path) -> Path | None:
    """ShareGPT lengths beside a ServeGen folder (shared/traces layout), else the bundled one."""
    base = servegen_path if servegen_path.is_dir() else servegen_path.parent
    for folder in (base.parent / "sharegpt_lengths", _bundled_traces()):
        found = sorted(folder.glob("sharegpt*.csv")) if folder.is_dir() else []
        if found:
            return found[0]
    return None


def _bundled_traces() -> Path:
    return data.path("traces")  # package data: loadtests/traces in the repository


# ----- ServeGen per-client length distributions (chunk-N-dataset.json) ----------------

# What a ServeGen `dataset.json` entry may hold. Language and reasoning clients publish
# `input_tokens` and `output_tokens` (reasoning tokens are part of the output; its
# `reason_ratio` only splits them). Multimodal clients publish `text_tokens`, and per
# modality a `<m>_count` (items per request) and `<m>_tokens` (tokens per item); all of
# them are prompt tokens the replica prefills before the first token.
PROMPT_FIELDS = ("input_tokens", "text_tokens")
MODALITIES = ("image", "audio", "video")

# `lengths` for `load_servegen`/`load_trace`: "auto" (each client's dataset.json where it
# has one, else ShareGPT stats), "dataset" (dataset.json required for every client), or
# the path of a ShareGPT-style stats CSV (or any trace) to draw from.
LengthChoice = Literal["auto", "dataset"] | Path


@dataclass(frozen=True, slots=True)
class Pmf:
    """A discrete distribution over token counts, ready to sample by inverse CDF."""

    values: FloatArray
    cdf: FloatArray

    def draw(self, count: int, rng: np.random.Generator) -> IntArray:
        index = np.searchsorted(self.cdf, rng.random(count) * self.cdf[-1], side="right")
        drawn: IntArray = self.values[np.minimum(index, self.values.size - 1)].astype(np.int64)
        return drawn


def parse_pmf(text: object, *, path: Path, line: int, column: str) -> Pmf | None:
    """ServeGen's `"{224: 0.0003, 225: 0.0008, ...}"` (a string holding a dict of token
    count -> probability) as a Pmf; None for an empty `{}` (ServeGen skips those).

    A JSON object (`{"224": 0.0003}`) is accepted too. Probabilities are normalised
    (the published ones sum to 1 within rounding).
    """
    if isinstance(text, dict):
        pairs = [f"{k}:{v}" for k, v in text.items()]
    elif isinstance(text, str) and text.strip().startswith("{") and text.strip().endswith("}"):
        body = text.strip()[1:-1].strip()
        pairs = [part for part in body.split(",") if part.strip()] if body else []
    else:
        raise TraceError(path, line=line, column=column,
                         message=f"expected a '{{tokens: probability, ...}}' map, found "
                         f"{str(text)[:40]!r}")
    if not pairs:
        return None
    try:
        numbers = np.array([half for pair in pairs for half in pair.split(":")],
                           dtype=np.float64).reshape(-1, 2)
    except ValueError:
        raise TraceError(path, line=line, column=column,
                         message="entries must be 'tokens: probability' numbers") from None
    values, probs = numbers[:, 0], numbers[:, 1]
    if not (np.isfinite(numbers).all() and (values >= 0).all() and (probs >= 0).all()
            and np.equal(np.mod(values, 1), 0).all()):
        raise TraceError(path, line=line, column=column,
                         message="token counts must be whole and non-negative, "
                         "probabilities finite and non-negative")
    total = float(probs.sum())
    if total <= 0:
        raise TraceError(path, line=line, column=column, message="probabilities sum to 0")
    return Pmf(values, np.cumsum(probs / total))


@dataclass(frozen=True, slots=True)
class LengthMix:
    """One dataset.json entry: how a client's prompts and outputs are distributed."""

    prompt: Pmf
    output: Pmf
    items: tuple[tuple[Pmf, Pmf | None], ...] = ()  # per modality: tokens, count

    def draw(self, count: int, rng: np.random.Generator) -> tuple[IntArray, IntArray]:
        """(prefill tokens, output tokens) for `count` requests."""
        prompt = self.prompt.draw(count, rng)
        for tokens, per_request in self.items:
            if per_request is None:
                prompt += tokens.draw(count, rng)
                continue
            items = per_request.draw(count, rng)
            owner = np.repeat(np.arange(count), items)
            prompt += np.bincount(owner, weights=tokens.draw(int(items.sum()), rng),
                                  minlength=count).astype(np.int64)
        return prompt, self.output.draw(count, rng)


def dataset_path(trace_file: Path) -> Path:
    """`chunk-7-trace.csv` -> `chunk-7-dataset.json` beside it (ServeGen's layout)."""
    return trace_file.with_name(trace_file.name.replace("-trace.csv", "-dataset.json"))


def load_dataset(path: Path) -> dict[float, LengthMix]:
    """A client's dataset.json: window start (s) -> LengthMix; entries with an empty
    distribution are skipped, as ServeGen's ClientPool does."""
    text = path.read_text()
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceError(path, line=exc.lineno, column=f"char {exc.colno}",
                         message=f"invalid JSON: {exc.msg}") from None
    if not isinstance(document, dict):
        raise TraceError(path, line=1, column=None,
                         message="expected an object of window start -> distributions")
    mixes: dict[float, LengthMix] = {}
    for key, fields in document.items():
        line = text.count("\n", 0, max(text.find(f'"{key}"'), 0)) + 1
        try:
            start = float(key)
        except ValueError:
            raise TraceError(path, line=line, column=key,
                             message="window start is not a number of seconds") from None
        if not isinstance(fields, dict):
            raise TraceError(path, line=line, column=key, message="expected an object")
        mix = _length_mix(fields, path=path, line=line, key=key)
        if mix is not None:
            mixes[start] = mix
    if not mixes:
        raise TraceError(path, line=1, column=None, message="no non-empty length distribution")
    return dict(sorted(mixes.items()))


def _length_mix(fields: dict[str, object], *, path: Path, line: int, key: str
                ) -> LengthMix | None:
    def pmf(name: str) -> Pmf | None:
        return parse_pmf(fields[name], path=path, line=line, column=f"{key}.{name}")

    prompt_field = next((f for f in PROMPT_FIELDS if f in fields), None)
    if prompt_field is None or "output_tokens" not in fields:
        raise TraceError(path, line=line, column=key,
                         message="needs output_tokens and input_tokens (or text_tokens), "
                         f"found {sorted(fields)}")
    prompt, output = pmf(prompt_field), pmf("output_tokens")
    if prompt is None or output is None:
        return None
    items: list[tuple[Pmf, Pmf | None]] = []
    for modality in MODALITIES:
        if f"{modality}_tokens" not in fields:
            continue
        tokens = pmf(f"{modality}_tokens")
        count = pmf(f"{modality}_count") if f"{modality}_count" in fields else None
        if tokens is not None:
            items.append((tokens, count))
    return LengthMix(prompt, output, tuple(items))


def _mix_at(mixes: dict[float, LengthMix], start_s: float) -> LengthMix:
    """The entry in force at a window: the latest one starting at or before it (ServeGen's
    rule), else the earliest (a client whose first entry starts later). `mixes` is sorted."""
    starts = list(mixes)
    index = bisect.bisect_right(starts, start_s + 1e-9) - 1
    return mixes[starts[max(index, 0)]]


def _sharegpt_lengths(path: Path, lengths: LengthChoice) -> Path:
    """The ShareGPT-style stats file to draw from: given, beside the folder, or bundled."""
    if isinstance(lengths, Path):
        if not lengths.is_file():
            raise TraceError(lengths, line=0, column=None,
                             message="no such token-length file (give a ShareGPT stats CSV "
                             "or a trace with lengths)")
        return lengths
    found = default_lengths_path(path)
    if found is None:
        raise TraceError(path, line=0, column=None,
                         message="no token-length source found: no chunk-*-dataset.json "
                         "beside the trace files and no ShareGPT stats; pass --lengths")
    return found


def load_servegen(
    path: Path,
    *,
    rate_scale: float = 1.0,
    seed: int = 0,
    lengths: LengthChoice = "auto",
    start_s: float | None = None,
    max_duration_s: float | None = None,
) -> Trace:
    """Per-request arrivals drawn from ServeGen aggregate windows (one file per client).

    Token lengths: each client's `chunk-N-dataset.json` when present ("auto") or required
    ("dataset"); otherwise drawn with replacement from a ShareGPT stats file (`lengths`,
    or the one beside the folder). `length_source` on the result says which was used.
    `start_s`/`max_duration_s` keep the windows of [start, start + duration) only, e.g.
    start 36000 and duration 3600 for 10:00 to 11:00 of day 0; without `start_s` times
    are re-based to the first arrival, with it to the slice start.
    """
    rng = np.random.default_rng(seed)
    # Lengths from dataset.json use their own stream, so adding a dataset to a folder
    # does not change the arrival times drawn for the same seed.
    length_rng = np.random.default_rng([seed, 1])
    begin = start_s or 0.0
    end = begin + max_duration_s if max_duration_s is not None else math.inf
    files = servegen_files(path)
    with_dataset = ([] if isinstance(lengths, Path)
                    else [f for f in files if dataset_path(f).is_file()])
    if lengths == "dataset" and len(with_dataset) < len(files):
        missing = next(f for f in files if f not in with_dataset)
        raise TraceError(dataset_path(missing), line=0, column=None,
                         message="--lengths dataset: no such file (ServeGen publishes "
                         "chunk-N-dataset.json beside chunk-N-trace.csv)")
    times: list[FloatArray] = []
    drawn_in: list[IntArray] = []
    drawn_out: list[IntArray] = []
    for file in files:
        mixes = load_dataset(dataset_path(file)) if file in with_dataset else None
        for window in iter_servegen_windows(file):
            if window.start_s >= end:
                break
            if window.start_s + SERVEGEN_WINDOW_S <= begin:
                continue
            drawn = _draw_window(window, rate_scale=rate_scale, window_s=SERVEGEN_WINDOW_S,
                                 rng=rng)
            drawn = drawn[(drawn >= begin) & (drawn < end)]
            if not drawn.size:
                continue
            times.append(drawn)
            if mixes is None:
                # -1 marks "draw from ShareGPT below".
                drawn_in.append(np.full(drawn.size, -1, dtype=np.int64))
                drawn_out.append(np.full(drawn.size, -1, dtype=np.int64))
            else:
                prompt, output = _mix_at(mixes, window.start_s).draw(drawn.size, length_rng)
                drawn_in.append(prompt)
                drawn_out.append(output)
    arrival = np.concatenate(times) if times else np.zeros(0)
    order = np.argsort(arrival, kind="stable")
    arrival = arrival[order]
    inputs = np.concatenate(drawn_in)[order] if times else np.zeros(0, dtype=np.int64)
    outputs = np.concatenate(drawn_out)[order] if times else np.zeros(0, dtype=np.int64)
    source = f"dataset.json of {len(with_dataset)} of {len(files)} clients"
    share = inputs < 0
    if share.any() or not with_dataset:
        stats = _sharegpt_lengths(path, lengths)
        pool_in, pool_out = load_lengths(stats)
        pick = rng.integers(0, pool_in.size, int(share.sum()))
        inputs[share], outputs[share] = pool_in[pick], pool_out[pick]
        if with_dataset:
            source = f"{source}, ShareGPT stats {stats} for the rest"
        elif isinstance(lengths, Path):
            source = f"{stats} (--lengths)"
        else:
            source = f"ShareGPT stats {stats} (no dataset.json beside the trace files)"
    base = begin if start_s is not None else (float(arrival[0]) if arrival.size else 0.0)
    return Trace(str(path), arrival - base, inputs, np.maximum(outputs, 1),
                 rate_scale=rate_scale, start_s=begin if start_s is not None else 0.0,
                 length_source=f"token lengths: {source}")


def sniff(path: Path) -> TraceFormat:
    """Guess the format from a folder's files or a file's first non-empty line."""
    if path.is_dir():
        servegen_files(path)
        return "servegen"
    with path.open() as handle:
        first = ""
        for text in handle:
            if text.strip():
                first = text.strip()
                break
    if not first:
        raise TraceError(path, line=1, column=None, message="empty file")
    if first.startswith("{"):
        return "mooncake"
    names = [name.strip() for name in first.split(",")]
    if "TIMESTAMP" in names and "ContextTokens" in names:
        return "azure"
    if "timestamp_s" in names:
        return "csv"
    if len(names) == 6 and names[3] in ("Gamma", "Weibull", ""):
        return "servegen"
    raise TraceError(path, line=1, column=None,
                     message="unknown trace format (expected an Azure or plain CSV header, "
                     "Mooncake JSON lines or ServeGen windows); pass --trace-format")


def load_trace(
    path: str | Path,
    fmt: TraceFormat = "auto",
    *,
    rate_scale: float = 1.0,
    seed: int = 0,
    lengths: LengthChoice = "auto",
    start_s: float | None = None,
    max_duration_s: float | None = None,
) -> Trace:
    """Load any supported trace, cut the slice [start_s, start_s + max_duration_s) of its
    clock if given (times re-based to the slice start), and apply the rate scale (see
    `scale_rate`). `lengths` applies to ServeGen only (see `load_servegen`).

    The clock is the trace's own: seconds from the first request for per-request traces,
    from window 0 for ServeGen. Example: `start_s=1800, max_duration_s=600` keeps the
    requests of minutes 30 to 40 and puts the one at 1,805 s at 5 s.
    """
    path = Path(path)
    if not path.exists():
        raise TraceError(path, line=0, column=None, message="no such file or folder")
    if start_s is not None and (start_s < 0 or not math.isfinite(start_s)):
        raise ValueError(f"slice start must be a non-negative number of seconds, got {start_s}")
    if fmt == "auto":
        fmt = sniff(path)
    if fmt == "servegen":
        return load_servegen(path, rate_scale=rate_scale, seed=seed, lengths=lengths,
                             start_s=start_s, max_duration_s=max_duration_s)
    rows = {"azure": iter_azure, "mooncake": iter_mooncake, "csv": iter_plain_csv}[fmt](path)
    stamps: list[float] = []
    inputs: list[int] = []
    outputs: list[int] = []
    for row in rows:
        stamps.append(row.timestamp_s)
        inputs.append(row.input_tokens)
        outputs.append(row.output_tokens)
    if not stamps:
        raise TraceError(path, line=1, column=None, message="no requests in trace")
    arrival = np.asarray(stamps, dtype=np.float64)
    order = np.argsort(arrival, kind="stable")
    start = float(arrival[order[0]])
    trace = Trace(str(path), arrival[order] - start, np.asarray(inputs, dtype=np.int64)[order],
                  np.asarray(outputs, dtype=np.int64)[order], start_s=start)
    return scale_rate(cut(trace, start_s=start_s, duration_s=max_duration_s), rate_scale,
                      seed=seed)


def cut(trace: Trace, *, start_s: float | None, duration_s: float | None) -> Trace:
    """The requests arriving in [start_s, start_s + duration_s) (None: from 0, to the end),
    re-based to the slice start: `start_s` moves by the cut so wall clocks stay right."""
    begin = start_s or 0.0
    end = begin + duration_s if duration_s is not None else math.inf
    keep = (trace.arrival_s >= begin) & (trace.arrival_s < end)
    return dataclasses.replace(
        trace, arrival_s=trace.arrival_s[keep] - begin, input_tokens=trace.input_tokens[keep],
        output_tokens=trace.output_tokens[keep], start_s=trace.start_s + begin)


def scale_rate(trace: Trace, factor: float, *, seed: int = 0) -> Trace:
    """Scale the request rate by `factor` without compressing time.

    factor = k + f (k whole, 0 <= f < 1): k copies of the trace superposed, copy 0 as is
    and copy j circularly shifted by a seeded offset in [0, duration), plus one more
    shifted copy thinned to a fraction f of its requests. Bursts keep their shape and
    length (compressing time by 3 would make a 60 s burst a 20 s one); the mean rate is
    multiplied by `factor`. Azure code x 2.5: 2 full copies + half of a third = ~22,048.
    """
    if factor <= 0 or not math.isfinite(factor):
        raise ValueError(f"rate scale must be a positive number, got {factor}")
    if factor == 1.0:
        return trace
    rng = np.random.default_rng(seed)
    duration = max(trace.duration_s, 1e-9)
    whole = int(math.floor(factor))
    fraction = factor - whole
    parts: list[tuple[FloatArray, IntArray, IntArray]] = []
    copies = whole + (1 if fraction > 1e-12 else 0)
    for copy in range(copies):
        offset = 0.0 if copy == 0 else float(rng.uniform(0.0, duration))
        arrival = np.mod(trace.arrival_s + offset, duration) if copy else trace.arrival_s
        inputs, outputs = trace.input_tokens, trace.output_tokens
        if copy == copies - 1 and fraction > 1e-12:
            keep = rng.uniform(size=arrival.size) < fraction
            arrival, inputs, outputs = arrival[keep], inputs[keep], outputs[keep]
        parts.append((arrival, inputs, outputs))
    arrival = np.concatenate([p[0] for p in parts])
    order = np.argsort(arrival, kind="stable")
    return Trace(
        trace.path,
        # Not re-based: times stay on the original clock even when thinning drops the
        # first request, so `start_s + arrival_s` is still the original wall clock.
        arrival[order],
        np.concatenate([p[1] for p in parts])[order],
        np.concatenate([p[2] for p in parts])[order],
        rate_scale=trace.rate_scale * factor,
        start_s=trace.start_s,
        length_source=trace.length_source,
    )
