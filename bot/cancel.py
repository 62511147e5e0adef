"""Cancelling a task for sure, which shutdown and lease loss depend on."""

from __future__ import annotations

import asyncio
from typing import Any


async def cancel_and_wait(task: asyncio.Future[Any], retry_s: float = 0.5) -> None:
    """Cancel `task` and wait until it has really ended, cancelling again if need be.

    One `cancel()` is not always enough on Python 3.11: `asyncio.wait_for`, which redis-py
    uses for every socket write, swallows a cancellation that lands just as the write
    completes (CPython gh-86296, fixed in 3.12), and the task then carries on as if nothing
    happened. Shutdown must not hang on that, so the cancellation is repeated.

    A task already being cancelled is given `retry_s` to finish first: a second cancellation
    landing in its clean-up (closing a provider's stream, say) would cut that short.
    """
    if isinstance(task, asyncio.Task) and task.cancelling():
        await asyncio.wait({task}, timeout=retry_s)
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=retry_s)
