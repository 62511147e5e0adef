"""A `lastword run` process started by an async test, with its log collected, so the test
can tell what the replica is doing (which one polls, which one holds the gateway) and stop or
kill it the way systemd or a crash would."""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from pathlib import Path


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
