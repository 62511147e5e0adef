"""How long the code under test holds the event loop, measured so that only its own work counts.

A test that bounds a stall (a 100 MB answer read within 50 ms at a time) must not count what
is not the code's:

- **The machine.** The suite runs six workers on two cores, on loaded laptops too: a worker
  waiting for a core runs its timers late by as long as it waited, though nothing held its
  loop (55-80 ms, seen beside two busy loops, where the loop was held for 5-14 ms). So a
  watch counts how late each tick of a timer ran *less the time its thread waited for a
  core* since the tick before (the kernel's run-queue delay, `/proc/thread-self/schedstat`):
  `held_s`, the longest the code held the loop, computing or blocked. How late the ticks
  ran (`late_s`, what `bot.loop_lag` reports in production) is printed beside it. Where the
  kernel keeps no such count, `held_s` is the lateness itself.
- **The test process's heap.** `lastword run` freezes its heap once it is up (`bot.service.app`:
  `gc.freeze()`), so the collector never walks the libraries and clients again; a pytest
  worker has no such moment, and by its few hundredth test a full collection of what it holds
  takes 200-700 ms of a loaded runner. So a watch starts as a replica does: everything made so
  far collected and frozen, thawed again when the watch ends.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator
from contextlib import contextmanager

from bot.loop_lag import LoopWatch

# Per thread: the time it ran, the time it waited for a core (ns), and its time slices.
SCHEDSTAT = "/proc/thread-self/schedstat"


def waited_s() -> float:
    """How long this thread has waited for a core (runnable, not running), 0 where the
    kernel does not say."""
    try:
        with open(SCHEDSTAT, "rb") as stat:
            return int(stat.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


class Held:
    """The longest a timer ticking every `interval_s` on the running loop ran late for the
    loop's own work, not for a wait for a core (see the module), from `start()` to `stop()`."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self.worst_s = 0.0
        self._due: float | None = None
        self._waited = 0.0

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._due = loop.time() + self.interval_s
        self._waited = waited_s()
        loop.call_later(self.interval_s, self._tick)

    def stop(self) -> None:
        self._due = None

    def _tick(self) -> None:
        if self._due is None:
            return
        loop = asyncio.get_running_loop()
        now, waited = loop.time(), waited_s()
        self.worst_s = max(self.worst_s, now - self._due - (waited - self._waited))
        self._due, self._waited = now + self.interval_s, waited
        loop.call_later(self.interval_s, self._tick)


class Watch:
    """What a `watched` block held the loop for (`held_s`) and how late its timers ran
    (`late_s`)."""

    def __init__(self, interval_s: float) -> None:
        self.late = LoopWatch(interval_s=interval_s)
        self.held = Held(interval_s)

    @property
    def held_s(self) -> float:
        return self.held.worst_s

    @property
    def late_s(self) -> float:
        return self.late.worst_s


@contextmanager
def watched(interval_s: float = 0.005) -> Iterator[Watch]:
    """A `Watch` of the running loop while the block runs, the heap made before it frozen
    (see the module)."""
    gc.collect()
    gc.freeze()
    watch = Watch(interval_s)
    watch.late.start()
    watch.held.start()
    try:
        yield watch
    finally:
        watch.late.stop()
        watch.held.stop()
        gc.unfreeze()
