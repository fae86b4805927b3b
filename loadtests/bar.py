"""The engine's quality bar (issue 11), judged line by line from a suite run's summary.json.

    .venv/bin/python -m loadtests.bar /tmp/suite/summary.json [/tmp/holdout/summary.json ...]

The suite prints the same table at the end of every run (`loadtests.suite`). Each trace
(each trace and seed, with `--seeds`) is judged on the three lines of the bar that a
replay's figures decide:

1. **Cost**: the scaler's GPU-hours at most COST_BAR (1.25) times the oracle's of the same
   replay, as every table of the suite compares them: the oracle's replayed plan, the
   cheapest schedule that meets every feasible window, whose bound `B` (its
   `gpu_hours_lower_bound`, tested: docs/simulation.md) is lower where carry-over from
   window to window needed repairs (`--bound` judges against `B`). Needs the oracle.
2. **Baselines**: no baseline (every strategy but the scaler and the oracles: `hpa`,
   `keda`, `kpa`, `static-peak`) meets as many feasible windows for fewer GPU-hours.
   Needs at least one baseline. `static-peak` holds the oracle's peak count from the
   start: the count a user without an autoscaler would need to know exactly, so the
   closing line also counts the reactive baselines alone.
3. **Windows**: the windows the scaler misses are those within one cold start of a rise
   of the load (the replay's `rise_windows`: a reactive scaler has no new replica ready
   there; a pod start, after a node boot when the rise needs a node), or at most 1 % of
   the others. A window the oracle misses too is no
   provisioning's to meet (a node boot longer than the rise, say) and is left out when the
   oracle ran. With headroom set (`--strategy scaler+1`, a `--headroom` variant of the
   suite) the rises are not excused: the issue asks for none missed there.

The fourth line (no model pinned at `max` while every capacity signal reads under half of
it) is a property of every decision, not of a replay's totals: it is held by
`tests/engine/test_properties.py`. A trace meets the bar when every seed meets every line
that could be judged; the closing line counts traces per line. The suite judges the
scaler and each of its `--headroom` variants.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The lines: GPU-hours over the oracle, and the share of windows outside rises met.
COST_BAR = 1.25
WINDOWS_BAR = 0.99
# The scaler's name; its `--headroom` variants are named after it (`scaler+1`).
SCALER = "scaler"
# Reference points, not baselines: the oracle's plan and the rate oracle before it.
ORACLES = ("oracle", "oracle-rate")
# The baseline that holds the oracle's peak: it knows the peak, the others only react.
PEAK = "static-peak"


@dataclass(frozen=True, slots=True)
class Verdict:
    """One replay of one trace against the bar. None: the line could not be judged (the
    oracle or every baseline did not run)."""

    trace: str
    seed: str | None
    strategy: str
    over_oracle: float | None
    cheaper: tuple[str, ...] | None  # baselines meeting as many windows for fewer GPU-h
    outside: tuple[int, ...]  # missed windows outside the rise windows (oracle's left out)
    judged_windows: int  # windows outside the rise windows, less those the oracle missed
    against: str = "the oracle"  # what `over_oracle` is over: the replay or its bound

    @property
    def cost_met(self) -> bool | None:
        return None if self.over_oracle is None else self.over_oracle <= COST_BAR

    @property
    def baselines_met(self) -> bool | None:
        return None if self.cheaper is None else not self.cheaper

    @property
    def reactive_baselines_met(self) -> bool | None:
        """The baselines line with the reactive baselines alone (not PEAK)."""
        if self.cheaper is None:
            return None
        return not [name for name in self.cheaper if name != PEAK]

    @property
    def windows_met(self) -> bool:
        if self.judged_windows <= 0:
            return True
        return 1 - len(self.outside) / self.judged_windows >= WINDOWS_BAR

    @property
    def met(self) -> bool:
        return all(line is not False for line in (self.cost_met, self.baselines_met,
                                                  self.windows_met))


def _replays(document: dict[str, Any]) -> list[tuple[str, str | None, dict[str, Any]]]:
    """(trace, seed, replay) for every replay in a suite document, one seed or several."""
    rows: list[tuple[str, str | None, dict[str, Any]]] = []
    for name, entry in document["scenarios"].items():
        if "seeds" in entry:
            rows += [(name, seed, replay) for seed, replay in entry["seeds"].items()]
        else:
            rows.append((name, None, entry))
    return rows


def judge(trace: str, seed: str | None, replay: dict[str, Any], *, strategy: str = SCALER,
          bound: bool = False) -> Verdict | None:
    """The bar's lines for `strategy` (the scaler or a headroom variant of it) in one
    replay; None when it did not run there. `bound`: cost over the oracle's bound `B`,
    not its replay."""
    figures = replay["strategies"]
    ours = figures.get(strategy)
    if ours is None:
        return None
    oracle = figures.get("oracle")
    # A summary from before the bound was reported has none: the cost is not judged.
    reference = None if oracle is None else oracle.get(
        "gpu_hours_lower_bound" if bound else "gpu_hours")
    over = (float(ours["gpu_hours"]) / float(reference)
            if reference is not None and float(reference) > 0 else None)
    # Not the scaler's own headroom variants (`scaler+1`) nor the oracles.
    baselines = {name: numbers for name, numbers in figures.items()
                 if not name.startswith(SCALER) and name not in ORACLES}
    cheaper = None if not baselines else tuple(
        name for name, numbers in baselines.items()
        if float(numbers["p95_windows_met"]) >= float(ours["p95_windows_met"])
        and float(numbers["gpu_hours"]) < float(ours["gpu_hours"]))
    missed = replay["missed"]
    unmeetable = set(missed.get("oracle", []))  # none when the oracle did not run
    rises = set(replay["rise_windows"]) if strategy == SCALER else set()
    outside = tuple(sorted(set(missed.get(strategy, [])) - rises - unmeetable))
    judged = int(replay["windows"]) - len(rises | unmeetable)
    return Verdict(trace=trace, seed=seed, strategy=strategy, over_oracle=over,
                   cheaper=cheaper,
                   outside=outside, judged_windows=judged,
                   against="the oracle's bound" if bound else "the oracle")


def quality_bar(document: dict[str, Any], *, strategy: str = SCALER, bound: bool = False
                ) -> list[Verdict]:
    """Every replay of `strategy` in a suite document (summary.json), judged (`judge`)."""
    verdicts = (judge(trace, seed, replay, strategy=strategy, bound=bound)
                for trace, seed, replay in _replays(document))
    return [v for v in verdicts if v is not None]


def _mark(met: bool | None) -> str:
    return "-" if met is None else "ok" if met else "FAIL"


def _every(verdicts: Sequence[Verdict], line: str) -> bool | None:
    """A line over a trace's seeds: None if it could not be judged on one of them."""
    marks = [getattr(v, line) for v in verdicts]
    return None if None in marks else all(marks)


def markdown(verdicts: Sequence[Verdict]) -> str:
    """A row per trace (its seeds' figures side by side, in seed order), each line met
    when it is on every seed; then the count of traces meeting each line."""
    against = verdicts[0].against if verdicts else "the oracle"
    excused = not verdicts or verdicts[0].strategy == SCALER
    lines = [f"| trace | seeds | GPU-h over {against} | baselines as good for less | "
             f"{'misses outside rises' if excused else 'misses'} | bar |",
             "| --- | --- | ---: | --- | ---: | --- |"]
    for trace in dict.fromkeys(v.trace for v in verdicts):
        mine = [v for v in verdicts if v.trace == trace]
        seeds = ", ".join(v.seed or "-" for v in mine)
        cost = ("-" if _every(mine, "cost_met") is None else
                ", ".join(f"{v.over_oracle:.3f}x" for v in mine)
                + f" {_mark(_every(mine, 'cost_met'))}")
        named = sorted({name for v in mine for name in v.cheaper or ()})
        cheaper = ("-" if _every(mine, "baselines_met") is None else
                   f"{', '.join(named)} FAIL" if named else "none ok")
        outside = ", ".join(f"{len(v.outside)}" + (f" ({' '.join(map(str, v.outside))})"
                                                    if v.outside else "") for v in mine)
        judged = "/".join(dict.fromkeys(str(v.judged_windows) for v in mine))
        met = sum(v.met for v in mine)
        verdict = ("met" if met == len(mine) else "not met" if not met
                   else f"met on {met} of {len(mine)} seeds")
        lines.append(f"| {trace} | {seeds} | {cost} | {cheaper} | {outside} of {judged} "
                     f"{_mark(_every(mine, 'windows_met'))} | {verdict} |")
    lines += ["", summary(verdicts)]
    return "\n".join(lines)


def summary(verdicts: Sequence[Verdict]) -> str:
    """Traces meeting each line on every seed, of the traces it could be judged on."""
    traces = list(dict.fromkeys(v.trace for v in verdicts))
    against = verdicts[0].against if verdicts else "the oracle"
    strategy = verdicts[0].strategy if verdicts else SCALER

    def count(line: str) -> str:
        marks = [_every([v for v in verdicts if v.trace == t], line) for t in traces]
        return f"{marks.count(True)} of {len(marks) - marks.count(None)}"

    return (f"The bar ({strategy}, traces meeting a line on every seed): cost at most "
            f"{COST_BAR}x {against} {count('cost_met')}; no baseline as good for less "
            f"{count('baselines_met')} (no reactive one, {PEAK} aside, "
            f"{count('reactive_baselines_met')}); "
            f"{'misses only at rises' if strategy == SCALER else 'no misses (headroom set)'} "
            f"{count('windows_met')}; all lines {count('met')}.")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("summaries", nargs="+", type=Path,
                        help="summary.json of `python -m loadtests.suite` runs")
    parser.add_argument("--bound", action="store_true",
                        help="cost over the oracle's proven bound B, not its replay")
    parser.add_argument("--strategy", default=SCALER,
                        help=f"the strategy judged: {SCALER} (the default) or a headroom "
                        f"variant of it (`{SCALER}+1`), whose rises are not excused")
    args = parser.parse_args(argv)
    if not args.strategy.startswith(SCALER):
        parser.error(f"--strategy: {SCALER} or a headroom variant of it ({SCALER}+1), "
                     f"not {args.strategy}")
    for path in args.summaries:
        try:
            document = json.loads(path.read_text())
            verdicts = quality_bar(document, strategy=args.strategy, bound=args.bound)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"loadtests.bar: {path}: not a suite summary ({exc})", file=sys.stderr)
            return 2
        if len(args.summaries) > 1:
            print(f"{path}:")
        print(markdown(verdicts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
