"""One replica competing for a role, as its own OS process, for the multi-process role test.

Run as ``python -m tests.support.role_worker <redis url> <role name> <ttl ms>``. It runs the real
`bot.core.roles.run_exclusively` against the server, with work that prints ``working <pid>`` to
stdout every `BEAT_S` for as long as it runs (after one ``ready <pid>`` line at start). It
exits when its stdin closes, so an orphaned worker never outlives its test.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys

from redis.asyncio import Redis

from bot.cancel import cancel_and_wait
from bot.core.roles import run_exclusively
from bot.store import Store, StoreSettings

# How often the work says it is running.
BEAT_S = 0.05


async def beat() -> None:
    while True:
        sys.stdout.write(f"working {os.getpid()}\n")
        sys.stdout.flush()
        await asyncio.sleep(BEAT_S)


async def stdin_closed() -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while await reader.readline():
        pass


async def main(url: str, name: str, ttl_ms: int) -> None:
    redis = Redis.from_url(url)
    # Only the role calls are used; the other settings do not matter here.
    settings = StoreSettings(
        quiet_ms=100, max_wait_ms=1000, ttl_ms=ttl_ms, history_cap=10, starvation_limit=3
    )
    store = Store(redis, settings)
    sys.stdout.write(f"ready {os.getpid()}\n")
    sys.stdout.flush()
    runner = asyncio.create_task(run_exclusively(store, name, beat, ttl_ms))
    watcher = asyncio.create_task(stdin_closed())
    try:
        await asyncio.wait({runner, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        await cancel_and_wait(runner)
        await cancel_and_wait(watcher)
        await redis.aclose()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
