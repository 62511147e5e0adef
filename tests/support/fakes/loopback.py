"""The lifecycle every loopback fake shares: an aiohttp app on 127.0.0.1 with an OS-chosen
port, started and stopped around a test, whose handlers can be cancelled on the way out; and
a free loopback port for a server the test does not start itself.

A port found free must stay free until its server binds it, which under load can be many
seconds later (a `lastword run` starting): in that time any other process on the machine
that asks for any free port (a fake of another pytest worker, a client's connection) could
be handed it, and the server would fail to start. So a port handed out here is left in
TIME_WAIT (`reserve`): for a minute the kernel gives it to no socket that asks for any port,
while a server that sets SO_REUSEADDR (aiohttp's, redis-server: every server here) binds it."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from typing import Any, Self

from aiohttp import web


def reserve(port: int = 0) -> int:
    """Bind `port` on 127.0.0.1 (0: one the kernel picks) and leave it in TIME_WAIT, by a
    connection to it whose accepted end closes first; the port. OSError if it is taken."""
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", port))
        listener.listen(1)
        address = listener.getsockname()
        with socket.socket() as client:
            client.connect(address)
            accepted, _ = listener.accept()
            accepted.close()
    return int(address[1])


def free_port() -> int:
    """A loopback port nothing listens on, kept from other processes for a minute (see the
    module's docstring): for a server a test starts later."""
    return reserve()


class StartStop:
    """`async with` starts it and stops it, whatever happened inside."""

    async def start(self) -> None:
        raise NotImplementedError

    async def stop(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()


class LoopbackServer(StartStop):
    def __init__(self) -> None:
        # Handlers register themselves here so stop() can cancel the ones still running.
        self._handler_tasks: set[asyncio.Task[Any]] = set()
        self._runner: web.AppRunner | None = None
        self._port: int | None = None

    def _add_routes(self, app: web.Application) -> None:
        raise NotImplementedError

    def _before_stop(self) -> None:
        """Unblock whatever a handler may be waiting on (a held request, say)."""

    async def start(self) -> None:
        if self._runner is not None:
            raise RuntimeError(f"{type(self).__name__} already started")
        app = web.Application()
        self._add_routes(app)
        # aiohttp 3.x leaves handler_cancellation off by default, which would let a handler
        # keep waiting after its client hung up (or was killed); the fakes must notice that.
        # The short shutdown timeout keeps stop() from waiting on handlers it cancelled.
        runner = web.AppRunner(
            app, handler_cancellation=True, shutdown_timeout=1.0, access_log=None
        )
        await runner.setup()
        # Started again after a stop, on the same port: a service back after an outage.
        await web.TCPSite(runner, "127.0.0.1", self._port or 0).start()
        self._runner = runner
        self._port = int(runner.addresses[0][1])

    async def stop(self) -> None:
        runner = self._runner
        if runner is None:
            return
        self._runner = None
        self._before_stop()
        tasks = [task for task in self._handler_tasks if not task.done()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=1.0)
        await runner.cleanup()
        # Kept for a start again (a service back after an outage): reserved, as `free_port`.
        with contextlib.suppress(OSError):
            reserve(self._port or 0)

    @property
    def origin(self) -> str:
        """``http://127.0.0.1:PORT``."""
        if self._port is None:
            raise RuntimeError(f"{type(self).__name__} not started")
        return f"http://127.0.0.1:{self._port}"
