"""A fake in a child process of its own, spoken to over a pipe.

The benchmarks run the loopback fakes (the provider, the Bot API) this way so that their CPU
and their event loop are not the bot's: sharing one loop, a loaded bot stretches a fake's
latency and the fake's work shows up in the bot's. `time.monotonic()` is one clock for every
process on Linux, so the times a child records compare with its parent's.

The child's target gets its arguments and then its end of the pipe. It sends one message once
it is ready (its URL, say), then waits for "done" and sends its report.

The children are forked from a server process (multiprocessing's `forkserver`) that has
imported the fakes and the target's module once: a clean process each, without the second of
CPU a fresh interpreter spends importing them (a run starts a few; the test suite's smoke runs
some twenty).
"""

from __future__ import annotations

import asyncio
import multiprocessing
from collections.abc import Callable
from typing import Any

# How long a child may take to say it is ready, or to send its report.
ANSWER_TIMEOUT_S = 30.0
# What the fork server imports before it forks a child: the fakes every benchmark runs.
PRELOADED = ("tests.support.fakes.telegram_server", "tests.support.fakes.openai_server")


class Child:
    def __init__(self, name: str, target: Callable[..., None], *args: Any) -> None:
        context = multiprocessing.get_context("forkserver")
        # Read when the server starts (the first child of this process): later targets'
        # modules are imported by their children.
        context.set_forkserver_preload([*PRELOADED, target.__module__])
        self.name = name
        self.conn, child = context.Pipe()
        self.process = context.Process(target=target, args=(*args, child), name=name, daemon=True)

    @property
    def pid(self) -> int:
        assert self.process.pid is not None, f"{self.name} was never started"
        return self.process.pid

    async def start(self) -> object:
        """Start the process; what it says once it is ready."""
        self.process.start()
        return await self._receive(ANSWER_TIMEOUT_S)

    async def finish(self) -> object:
        """Its report, once told the run is done."""
        self.conn.send("done")
        return await self._receive(ANSWER_TIMEOUT_S)

    async def _receive(self, timeout_s: float) -> object:
        try:
            if await asyncio.to_thread(self.conn.poll, timeout_s):
                return self.conn.recv()
        except EOFError:
            raise RuntimeError(f"{self.name}'s process ended early (see above)") from None
        raise TimeoutError(f"{self.name}'s process said nothing for {timeout_s:g} s")

    async def close(self) -> None:
        self.conn.close()
        if self.process.pid is None:
            return  # never started
        await asyncio.to_thread(self.process.join, 5.0)
        if self.process.is_alive():
            self.process.kill()
            await asyncio.to_thread(self.process.join)
