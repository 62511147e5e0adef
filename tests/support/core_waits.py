"""How long processes waited for a core: the machine's part of a latency, for a bound on the
rest.

I3 bounds how long a message waits for its reply (`max_wait + LLM time + lease TTL + sweep
interval`). On two cores shared by the suite's workers, or beside busy loops, the replicas
that carry a reply also wait for a core, and a reply 0.4 s past the bound said only that the
machine was busy. The kernel counts that wait for each thread (the second field of
`/proc/<pid>/task/<tid>/schedstat`: time runnable but not running). `CoreWaits` samples it for
the processes a test names, so a latency can be bounded as the bound plus what those
processes waited for a core meanwhile: on an idle machine that is nothing, and the bound is
as strict as written; a protocol that waits a whole lease too long still fails it.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from bot.cancel import cancel_and_wait

# How often the counts are read: a latency is bounded to within this much of its wait.
SAMPLE_S = 0.05


def waited_s(pid: int) -> float | None:
    """How long the threads of `pid` have waited for a core so far; None once it is gone or
    where the kernel does not say."""
    total = 0
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                total += int((task / "schedstat").read_bytes().split()[1])
    except (OSError, IndexError, ValueError):
        return None
    return total / 1e9


class CoreWaits:
    """What the processes `pids()` names (re-read at each sample: replicas come and go) have
    waited for a core, summed, over time. A process gone keeps the count it last had."""

    def __init__(self, pids: Callable[[], Iterable[int]]) -> None:
        self._pids = pids
        self._last: dict[int, float] = {}
        self._times: list[float] = []  # time.time(), as the replicas' events are stamped
        self._totals: list[float] = []
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Sample now, then every SAMPLE_S until `stop`."""
        self.sample()
        self._task = asyncio.create_task(self._sampling(), name="core waits")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)

    async def _sampling(self) -> None:
        while True:
            await asyncio.sleep(SAMPLE_S)
            self.sample()

    def sample(self) -> None:
        for pid in {os.getpid(), *self._pids()}:
            seen = waited_s(pid)
            if seen is not None:
                self._last[pid] = seen
        self._times.append(time.time())
        self._totals.append(sum(self._last.values()))

    def between(self, start: float, end: float) -> float:
        """Seconds waited for a core from `start` to `end` (time.time()), at most a sample's
        worth more: counted from the last sample before `start` to the first after `end`."""
        if not self._times:
            return 0.0
        first = max(bisect.bisect_right(self._times, start) - 1, 0)
        last = min(bisect.bisect_left(self._times, end), len(self._times) - 1)
        return max(self._totals[last] - self._totals[first], 0.0)
