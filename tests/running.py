"""A `lastword run` process started by an async test, with its log collected, so the test
can tell what the replica is doing (which one polls, which one holds the gateway) and stop or
kill it the way systemd or a crash would."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path


def clean_environ() -> dict[str, str]:
    """This process's environment minus anything that configures lastword: the developer's own
    LASTWORD_* settings must not reach a bot under test."""
    return {k: v for k, v in os.environ.items() if not k.startswith("LASTWORD_")}


def run_env(platform: str, redis_url: str, data_dir: Path) -> dict[str, str]:
    """The environment of a `lastword run` on `platform` with the echo model and short timings,
    over the server at `redis_url`; the platform's own settings go on top."""
    return clean_environ() | {
        "LASTWORD_PLATFORM": platform,
        "LASTWORD_REDIS_URL": redis_url,
        "LASTWORD_DATA_DIR": str(data_dir),
        "LASTWORD_DEBOUNCE__QUIET_MS": "300",
        "LASTWORD_DEBOUNCE__MAX_WAIT_MS": "1500",
        "LASTWORD_LEASE__TTL_MS": "1500",
        "LASTWORD_SWEEP_INTERVAL_MS": "200",
        "LASTWORD_LLM__PROVIDER": "echo",
    }


class Running:
    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.log: list[str] = []
        assert process.stderr is not None
        self._reader = asyncio.create_task(self._read(process.stderr))

    @classmethod
    async def start(cls, env: dict[str, str], cwd: Path | None = None) -> Running:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bot",
            "run",
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            cwd=cwd,
        )
        return cls(process)

    async def _read(self, stream: asyncio.StreamReader) -> None:
        async for line in stream:
            self.log.append(line.decode(errors="replace"))

    def said(self, text: str) -> int:
        """How many log lines contain `text`."""
        return sum(text in line for line in self.log)

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
