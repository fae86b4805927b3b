"""`explain.in_words`: a decision as a person says it (the demo's status line, `scaler explain`)."""

from __future__ import annotations

import dataclasses

import pytest

from scaler.engine import types
from scaler.service import explain

NOW = 1_764_410_000.0


def decision(*, current: int, desired: int, recommendation: int | None,
             winner: types.Rule | None, clamps: tuple[types.Clamp, ...] = (),
             held: bool = False) -> types.Decision:
    return types.Decision(model="inference/llama-8b", at=NOW, current=current,
                          desired=desired, recommendation=recommendation, winner=winner,
                          signals=(), clamps=clamps, held=held)


def clamp(name: types.ClampName, before: int, after: int) -> types.Clamp:
    return types.Clamp(name, before, after, detail="")


@pytest.mark.parametrize(("made", "words"), [
    # The engine's summary "hold 6->6 (tokens_per_second); stabilization_down: 5->6".
    (decision(current=6, desired=6, recommendation=5, winner=types.Rule.TOKENS_PER_SECOND,
              clamps=(clamp(types.ClampName.STABILIZATION_DOWN, 5, 6),)),
     "Keeping 6 replicas: demand says 5 (tokens per second), the down window holds 6."),
    (decision(current=4, desired=6, recommendation=6, winner=types.Rule.FORECAST),
     "Scaling up from 4 to 6: demand says 6 (the cold-start look-ahead)."),
    (decision(current=4, desired=7, recommendation=9, winner=types.Rule.QUEUE_DEPTH,
              clamps=(clamp(types.ClampName.RATE_LIMIT_UP, 9, 8),
                      clamp(types.ClampName.MAX, 8, 7))),
     "Scaling up from 4 to 7: demand says 9 (the waiting queue), the scale-up rate limit "
     "allows 8, the maximum is 7."),
    (decision(current=6, desired=4, recommendation=3, winner=types.Rule.CONCURRENCY,
              clamps=(clamp(types.ClampName.WARM_FLOOR, 3, 4),)),
     "Scaling down from 6 to 4: demand says 3 (running and waiting requests), the warm "
     "floor is 4."),
    # One replica, one word.
    (decision(current=1, desired=1, recommendation=1, winner=types.Rule.CONCURRENCY),
     "Keeping 1 replica: demand says 1 (running and waiting requests)."),
    (decision(current=3, desired=3, recommendation=3, winner=None, held=True),
     "Holding 3 replicas: no fresh signal to decide on, and missing data never scales down."),
    (decision(current=3, desired=3, recommendation=3, winner=None),
     "Keeping 3 replicas: no signal has an opinion, so the count stays."),
])
def test_decisions_in_words(made: types.Decision, words: str) -> None:
    assert explain.in_words(dataclasses.asdict(made)) == words


def test_every_clamp_has_words() -> None:
    for name in types.ClampName:
        made = decision(current=2, desired=3, recommendation=2, winner=types.Rule.CONCURRENCY,
                        clamps=(clamp(name, 2, 3),))
        said = explain.in_words(dataclasses.asdict(made))
        # Its own phrase, not the fallback that names the clamp's identifier.
        assert " gives " not in said and said.endswith(" 3."), said
