"""A `lastword run` process started by an async test, with its log collected, so the test
can tell what the replica is doing (which one polls, which one holds the gateway) and stop or
kill it the way systemd or a crash would."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import TypeVar

from bot.config.settings import ToolsSettings
from tests.support.forked import Forked, spawn

T = TypeVar("T")

# Lines of the process's log an `until` failure shows: enough to see how far start-up got.
LOG_TAIL = 30
# A `lastword run` from exec to its platform's first call: ~1.7 s of CPU, measured at 5-16 s
# on 2 cores at a load of 7 to 13 (busy loops and other test runs beside it), and past 15 s
# at a load of 15 (three more replicas and a benchmark beside the suite): twice the slowest
# start seen. A bot that dies on the way fails at once (`Running.until`), not at this bound.
START_S = 30.0


def clean_environ() -> dict[str, str]:
    """This process's environment minus anything that configures lastword: the developer's own
    LASTWORD_* settings must not reach a bot under test."""
    return {k: v for k, v in os.environ.items() if not k.startswith("LASTWORD_")}


def run_env(platform: str, redis_url: str, data_dir: Path) -> dict[str, str]:
    """The environment of a `lastword run` on `platform` with the echo model and short timings,
    over the server at `redis_url`; the platform's own settings go on top."""
    return (
        clean_environ()
        | {
            "LASTWORD_PLATFORM": platform,
            "LASTWORD_REDIS_URL": redis_url,
            "LASTWORD_DATA_DIR": str(data_dir),
            "LASTWORD_DEBOUNCE__QUIET_MS": "300",
            "LASTWORD_DEBOUNCE__MAX_WAIT_MS": "1500",
            "LASTWORD_LEASE__TTL_MS": "1500",
            "LASTWORD_SWEEP_INTERVAL_MS": "200",
            "LASTWORD_LLM__PROVIDER": "echo",
        }
        | FAKES_LIMITS.get(platform, {})
    )


# The fakes enforce no limits unless a test asks them to (tests/e2e/test_outbound_budget.py does,
# with the platforms' own): a test of something else need not wait a second between two
# replies in one chat. Only the platform's own: a variable of another platform's loads that
# plug-in, and its library, to check the name (0.26 s of CPU for a replica's start).
FAKES_LIMITS = {
    "telegram": {"LASTWORD_TELEGRAM__CHAT_MESSAGES_PER_SECOND": "20"},
    "discord": {"LASTWORD_DISCORD__CHANNEL_MESSAGES_PER_5S": "100"},
}


def start_within_s(env: dict[str, str]) -> float:
    """How long a `lastword run` with `env` may take to reach its platform: a plain start, and,
    with MCP servers, the time the bot itself gives them before its adapter starts
    (LASTWORD_TOOLS__START_TIMEOUT_S). Starting one doubles the CPU of a start (~3.3 s, for
    the `mcp` SDK imported by both processes), measured at 8-16 s at a load of 7 to 9."""
    if "LASTWORD_TOOLS__MCP_SERVERS" not in env:
        return START_S
    default = ToolsSettings.model_fields["start_timeout_s"].default
    return START_S + float(env.get("LASTWORD_TOOLS__START_TIMEOUT_S", default))


class Running:
    def __init__(self, process: asyncio.subprocess.Process | Forked) -> None:
        self.process = process
        self.log: list[str] = []
        assert process.stderr is not None
        self._reader = asyncio.create_task(self._read(process.stderr))

    @classmethod
    async def start(
        cls, env: dict[str, str], cwd: Path | None = None, *, fresh: bool = False
    ) -> Running:
        """`lastword run`: forked from the test process's zygote (`tests.support.forked`), or,
        `fresh`, `python -m bot run` itself, as an operator starts it."""
        process = await spawn(
            "run", env=env, cwd=cwd, stderr=asyncio.subprocess.PIPE, fork=not fresh
        )
        return cls(process)

    async def _read(self, stream: asyncio.StreamReader) -> None:
        async for line in stream:
            self.log.append(line.decode(errors="replace"))

    def said(self, text: str) -> int:
        """How many log lines contain `text`."""
        return sum(text in line for line in self.log)

    async def until(self, waited: Awaitable[T], what: str) -> T:
        """What `waited` returns (it bounds its own wait), unless the process ends first. Either
        failure is an AssertionError naming `what`, with the tail of the log: a bot that died
        says why at once, one still starting shows how far it got."""
        waiting = asyncio.ensure_future(waited)
        ending = asyncio.ensure_future(self.process.wait())
        try:
            await asyncio.wait({waiting, ending}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            ending.cancel()
        if waiting.done():
            try:
                return waiting.result()
            except TimeoutError:
                why = "it did not come in time"
        else:
            waiting.cancel()
            # Its last words are what the failure is for: read to the end, within a bound.
            await asyncio.wait({waiting, self._reader}, timeout=5)
            why = f"the bot exited with {self.process.returncode}"
        tail = "".join(self.log[-LOG_TAIL:])
        raise AssertionError(f"gave up waiting for {what}: {why}; the bot's log ends:\n{tail}")

    async def exited(self, timeout: float) -> int:  # noqa: ASYNC109
        """The exit status once the process ends on its own, and its whole log read."""
        code = await asyncio.wait_for(self.process.wait(), timeout)
        await self._reader
        return code

    async def terminate(self, timeout: float = 15) -> tuple[int, float]:  # noqa: ASYNC109
        """SIGTERM, as systemd stops a unit: (exit status, seconds it took)."""
        began = time.monotonic()
        self.process.send_signal(signal.SIGTERM)
        code = await self.exited(timeout)
        return code, time.monotonic() - began

    async def kill(self) -> None:
        self.process.kill()
        await self.process.wait()
        await self._reader

    async def stop(self) -> None:
        """Clean-up: SIGTERM, then SIGKILL if it does not exit within 10 s."""
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.process.wait(), 10)
            except TimeoutError:
                self.process.kill()
                await self.process.wait()
        await self._reader
