"""A shared job for the role tests that records its starts and cancellations."""

from __future__ import annotations

import asyncio
import time


class Work:
    """A job that runs until told to finish (or fail), recording starts and cancellations."""

    def __init__(self) -> None:
        self.starts = 0
        self.cancels = 0
        self.cancelled_at = 0.0
        self.running = False
        self.finish = asyncio.Event()
        self.error: Exception | None = None

    async def __call__(self) -> None:
        self.starts += 1
        self.running = True
        try:
            await self.finish.wait()
            if self.error is not None:
                raise self.error
        except asyncio.CancelledError:
            self.cancels += 1
            self.cancelled_at = time.monotonic()
            raise
        finally:
            self.running = False

    async def is_running(self) -> bool:
        return self.running
