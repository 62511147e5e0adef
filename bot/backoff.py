"""Exponential backoff for retry loops: the first delay, doubling per failure in a row up to a
cap, with optional jitter. Every retry loop in the bot and its adapters uses this one.

One jitter convention: `jitter` is the share of each delay that is random, so a delay `d` is
drawn from [d * (1 - jitter), d]. 0 keeps delays exact; 0.5 is "equal jitter", which keeps
replicas that failed together from retrying in lockstep. A delay never exceeds the cap.
(Shaped like redis-py's `redis.backoff`, but stateful: a loop asks for the next delay.)
"""

from __future__ import annotations

import random


class Backoff:
    def __init__(self, first_s: float, cap_s: float, *, jitter: float = 0.0) -> None:
        if not 0.0 <= jitter <= 1.0:
            raise ValueError("jitter is a share of the delay, from 0 to 1")
        self.first_s = first_s
        self.cap_s = cap_s
        self.jitter = jitter
        # Failures in a row so far: each call to `next_delay` counts one.
        self.failures = 0
        self._nominal = min(first_s, cap_s)

    def next_delay(self) -> float:
        """Seconds to wait after one more failure in a row."""
        delay = self._nominal
        self.failures += 1
        self._nominal = min(delay * 2, self.cap_s)
        if self.jitter:
            delay *= random.uniform(1.0 - self.jitter, 1.0)
        return delay

    def reset(self) -> None:
        """After a success: the next failure waits the first delay again."""
        self.failures = 0
        self._nominal = min(self.first_s, self.cap_s)
