"""Keeping a long-running loop alive: restarted after it ends with an error, and reported as
down meanwhile, so that `/healthz` (and through it systemd or a load balancer) can see it.

The loops catch what they expect themselves and go on; this is the net under them, for what
nobody expected. An error that no restart can fix (a `ConfigError`) still ends the process.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from bot.backoff import Backoff
from bot.config.settings import ConfigError

log = logging.getLogger(__name__)

# After an unexpected end, the loop starts again after this long, doubling per failure in a
# row up to the cap. A loop that ran this long before failing counts as having recovered.
RESTART_AFTER_S = 1.0
RESTART_CAP_S = 60.0
RECOVERED_AFTER_S = 60.0


class Supervisor:
    def __init__(self) -> None:
        self._down: set[str] = set()

    @property
    def down(self) -> frozenset[str]:
        """The loops that ended with an error and wait to be started again."""
        return frozenset(self._down)

    async def keep(self, name: str, start: Callable[[], Awaitable[None]]) -> None:
        """Run `start()` until it returns (its input ended); restart it after any error but a
        `ConfigError`, which propagates."""
        backoff = Backoff(RESTART_AFTER_S, RESTART_CAP_S)
        while True:
            began = time.monotonic()
            try:
                await start()
                return
            except ConfigError:
                raise
            except Exception:
                if time.monotonic() - began > RECOVERED_AFTER_S:
                    backoff.reset()
                delay = backoff.next_delay()
                log.exception(
                    "%s stopped with an error (%d in a row); restarting it in %.0fs",
                    name,
                    backoff.failures,
                    delay,
                )
            self._down.add(name)
            try:
                await asyncio.sleep(delay)
            finally:
                self._down.discard(name)
