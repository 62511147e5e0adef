"""The one backoff every retry loop uses: doubling from the first delay up to the cap, with
jitter taken off each delay."""

from __future__ import annotations

import pytest

from bot.backoff import Backoff


def test_delays_double_up_to_the_cap_and_reset() -> None:
    backoff = Backoff(0.5, 3.0)
    assert [backoff.next_delay() for _ in range(5)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert backoff.failures == 5
    backoff.reset()
    assert (backoff.next_delay(), backoff.failures) == (0.5, 1)


def test_jitter_takes_at_most_its_share_off_each_delay() -> None:
    backoff = Backoff(1.0, 4.0, jitter=0.5)
    for nominal in (1.0, 2.0, 4.0, 4.0):
        assert nominal * 0.5 <= backoff.next_delay() <= nominal


def test_a_first_delay_above_the_cap_is_capped() -> None:
    assert Backoff(10.0, 2.0).next_delay() == 2.0


def test_jitter_is_a_share() -> None:
    with pytest.raises(ValueError, match="jitter"):
        Backoff(1.0, 2.0, jitter=1.5)
