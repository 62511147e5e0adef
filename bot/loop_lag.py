"""How late the event loop runs its timers: one watcher per loop, read by the metrics, the log
and the shedding of previews.

A loop that runs a timer late runs everything late: a webhook's acknowledgement, the read of
a stream that would notice a newer message, the send right after the pre-send check. The
watcher is a callback that reschedules itself every `TICK_S` (a callback, not a task, so
nothing is left pending when a loop closes) and notes how late it ran:

- `recent_s`, the worst recent lag, decaying by `DECAY` per tick, so that a stall counts for
  a second or so: what shedding looks at, and the gauge in /metrics;
- `worst_s`, the worst since the watcher started, logged each time it grows by a quarter past
  `LOG_FLOOR_S` (a handful of lines per replica, not one per tick);
- `lags`, every tick's lag as histogram buckets, for /metrics.

Shedding: previews (live drafts, the typing indicator) are the first work dropped while the
loop lags past `SHED_LAG_S`, so that its time goes to acknowledgements and replies. It takes
many previews at once to cost a loop that much: a few of them, as a test or a quiet replica
runs, save nothing when shed, and there a lag is the machine's, not theirs (a loaded CI
runner). So previews are shed only where at least `SHED_MIN_PREVIEWS` are in flight.
"""

from __future__ import annotations

import asyncio
import logging
import weakref

from bot.stats import Buckets

log = logging.getLogger(__name__)

TICK_S = 0.05
DECAY = 0.9
LOG_FLOOR_S = 0.05
# Bounds (seconds) of the lag histogram: from a quiet loop's millisecond to a stall.
LAG_BOUNDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
# Previews are shed above this lag: half the 100 ms a flooded replica's acknowledgement is
# allowed at p99, so they go before the acknowledgements are late, not after. A decayed
# worst, so the shedding lasts about a second past a stall.
SHED_LAG_S = 0.05
# Previews of one kind in flight (conversations typing, drafts shown) below which none is
# shed: each costs one platform call every few seconds, so a few cannot be what lags a loop.
SHED_MIN_PREVIEWS = 16


class LoopWatch:
    """How late the running loop runs a timer ticking every `interval_s`, from `start()` on."""

    def __init__(self, interval_s: float = TICK_S) -> None:
        self.interval_s = interval_s
        self.recent_s = 0.0
        self.worst_s = 0.0
        self.lags = Buckets(LAG_BOUNDS)
        self._due: float | None = None

    def start(self) -> None:
        """Start watching the running loop, once. The loop is not held: the pending timer
        holds the watcher, not the other way round."""
        if self._due is None:
            loop = asyncio.get_running_loop()
            self._due = loop.time() + self.interval_s
            loop.call_later(self.interval_s, self._tick)

    def stop(self) -> None:
        """Stop at the next tick."""
        self._due = None

    def _tick(self) -> None:
        if self._due is None:
            return
        loop = asyncio.get_running_loop()
        now = loop.time()
        late = max(now - self._due, 0.0)
        self.lags.observe(late)
        self.recent_s = max(late, self.recent_s * DECAY)
        if late > max(LOG_FLOOR_S, self.worst_s * 1.25):
            log.info("event loop stall: %.0f ms, the worst so far on this replica", late * 1e3)
        self.worst_s = max(self.worst_s, late)
        self._due = now + self.interval_s
        loop.call_later(self.interval_s, self._tick)


_watches: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopWatch] = (
    weakref.WeakKeyDictionary()
)


def watch() -> LoopWatch:
    """The running loop's one watcher, started by the first call."""
    loop = asyncio.get_running_loop()
    found = _watches.get(loop)
    if found is None:
        found = _watches[loop] = LoopWatch()
        found.start()
    return found


def shedding(previews: int) -> bool:
    """Whether previews should be skipped now, `previews` of their kind being in flight."""
    return previews >= SHED_MIN_PREVIEWS and watch().recent_s > SHED_LAG_S
