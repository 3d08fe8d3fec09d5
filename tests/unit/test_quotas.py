"""The arithmetic behind the quotas' Retry-After: what the trailing day holds, when enough of
it ages out, and when a queued job may have started."""

from __future__ import annotations

import pytest

from core.quotas import DAY_S, QUEUE_WAIT_GUESS_S, Span, hours_wait_s, queue_wait_s, trained_s

H = 3600.0


def test_the_trailing_day_holds_only_what_is_inside_it() -> None:
    spans = [
        Span(start=-2 * H, end=-1 * H, running=False),
        Span(start=-30 * H, end=-23 * H, running=False),  # one hour of it inside
        Span(start=-50 * H, end=-40 * H, running=False),
        Span(start=-0.5 * H, end=0.0, running=True),
    ]
    assert trained_s(spans) == pytest.approx(2.5 * H)
    assert trained_s(spans, day_ends_in_s=0.5 * H) == pytest.approx(2.0 * H)
    assert trained_s(spans, day_ends_in_s=DAY_S) == 0


def test_the_wait_is_until_enough_has_aged_out() -> None:
    spans = [
        Span(start=-2 * H, end=-1 * H, running=False),
        Span(start=-30 * H, end=-23 * H, running=False),
    ]
    # 2 h now; under 1.5 h once half of the older hour is out of the day: in 30 minutes.
    assert hours_wait_s(spans, 1.5 * H) == pytest.approx(0.5 * H, abs=1)
    # Under 1 h: all of the older hour, then nothing until the newer one starts ageing out.
    assert hours_wait_s(spans, 1 * H) == pytest.approx(22 * H, abs=1)
    assert hours_wait_s(spans, 0.25 * H) == pytest.approx(22.75 * H, abs=1)


def test_the_queue_wait_is_a_mean_run_over_the_jobs_running() -> None:
    ended = [Span(start=-300.0, end=-200.0, running=False), Span(-500.0, -200.0, False)]
    running = [Span(start=-10.0, end=0.0, running=True)] * 2
    assert queue_wait_s([*ended, *running]) == 100  # (100 + 300) / 2 s a run, 2 running
    assert queue_wait_s(ended) == QUEUE_WAIT_GUESS_S  # none running: nothing to judge by
    assert queue_wait_s(running) == QUEUE_WAIT_GUESS_S  # no run ended yet
