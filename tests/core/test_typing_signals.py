"""Which typing signals a replica passes on to the store (`bot.core.typing_signals`): one a second
per person, the first after each of their messages, and a bounded memory under a flood."""

from __future__ import annotations

import time

from bot.core.typing_signals import TypingSignals


def test_a_flood_is_one_signal_a_second_per_person() -> None:
    signals = TypingSignals(every_s=0.2)
    passed = 0
    until = time.monotonic() + 0.5
    while time.monotonic() < until:
        passed += signals.due("a")
        time.sleep(0.001)
    # At 0, 0.2 and 0.4 s; a loaded machine may leave out one, never add one.
    assert 2 <= passed <= 3
    assert signals.due("b"), "another person's signal is theirs"


def test_the_first_signal_after_a_message_always_passes() -> None:
    signals = TypingSignals(every_s=60)
    assert signals.due("a")
    assert not signals.due("a")
    signals.message("a")
    assert signals.due("a"), "typing the next line must count at once"


def test_the_memory_is_bounded_and_sheds_new_people_while_full() -> None:
    signals = TypingSignals(every_s=60, remembered=3)
    assert all(signals.due(person) for person in "abc")
    assert not signals.due("d"), "a fourth person while three are remembered is shed"
    fresh = TypingSignals(every_s=0.5, remembered=3)
    assert all(fresh.due(person) for person in "abc")
    time.sleep(0.55)
    assert fresh.due("d"), "those older than the interval are forgotten to make room"
    # All three were: room for two more beside "d", and none after them.
    assert fresh.due("e") and fresh.due("f")
    assert not fresh.due("g")
