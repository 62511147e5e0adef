"""A TCP proxy in front of a Redis server that can cut the network silently.

Tests run Redis on a unix socket (`EmbeddedRedis.url` is ``unix://...``), so the proxy
listens on an OS-chosen TCP port on 127.0.0.1 and forwards every connection to the server's
socket path (or to a ``host:port``). A replica whose ``LASTWORD_REDIS_URL`` is `url` then sees
a network between itself and Redis, which the test controls:

- `partition()`: a silent black hole, as when a virtual IP moves or a switch drops a link.
  Nothing is forwarded in either direction and nothing is answered, yet no connection is
  closed or reset: a client's writes succeed (they land in socket buffers) and its reads wait.
  New connections are still accepted (the kernel completes the handshake before `accept`
  anyway) and get nothing either. A peer that closes its end meanwhile is not told to the
  other side either: the close waits behind its bytes.
- `heal()`: forwarding resumes. What happened to the bytes sent meanwhile is the one choice a
  proxy must make, and this one does what TCP does:
  - by default (a short partition) they are delivered, in order, then the closes that waited
    behind them: TCP retransmits unacknowledged segments until the kernel gives up
    (``tcp_retries2``, about 15 minutes), so after a partition shorter than that every byte
    sent does arrive, late. In particular a command a client gave up on (its socket timed out
    and it closed the connection) still reaches the server and runs there after the heal,
    its answer going nowhere. A test of a partitioned lease holder must survive exactly that.
  - with ``heal(reset=True)`` (a partition longer than the retransmission timeout) every
    connection that was open during the partition is reset on both sides and its held bytes
    are dropped; connections made after the heal work normally. Dropping bytes from the
    middle of a connection that stays open is not offered: TCP never does that, and it would
    only desynchronise the protocol.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.fakes.loopback import StartStop

CHUNK = 64 * 1024


@dataclass(eq=False)
class _Direction:
    """One direction of one proxied connection: bytes read from `source` go to `sink`."""

    source: asyncio.StreamReader
    sink: asyncio.StreamWriter
    # What was read during a partition, in order; b"" stands for the end of the stream.
    held: list[bytes] = field(default_factory=list)


@dataclass(eq=False)
class _Connection:
    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter
    outbound: _Direction  # client to server
    inbound: _Direction  # server to client
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def abort(self) -> None:
        """Reset both sides: a TCP peer gets a RST (not a FIN), as after a retransmission
        timeout or a peer that lost its state."""
        for writer in (self.client, self.upstream):
            sock = writer.get_extra_info("socket")
            if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()


class TcpProxy(StartStop):
    """Forwards TCP connections on 127.0.0.1 to `target`: a unix socket path, or a
    ``(host, port)`` pair. Use as an async context manager, or `start()` and `stop()`."""

    def __init__(self, target: Path | str | tuple[str, int]) -> None:
        self.target = target
        self._server: asyncio.Server | None = None
        self._port: int | None = None
        self._connections: set[_Connection] = set()
        self._partitioned = False
        # Connections accepted so far, over the proxy's life (a test can tell a client
        # reconnected).
        self.accepted = 0

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("TcpProxy not started")
        return self._port

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def partitioned(self) -> bool:
        return self._partitioned

    @property
    def open_connections(self) -> int:
        """Connections the proxy keeps open: it closes one only once both directions have
        ended (never during a partition), or on a reset or `stop()`."""
        return len(self._connections)

    @property
    def held_bytes(self) -> int:
        """Bytes read during the current partition and not yet delivered."""
        return sum(
            len(chunk)
            for c in self._connections
            for direction in (c.outbound, c.inbound)
            for chunk in direction.held
        )

    async def start(self) -> None:
        if self._server is not None:
            raise RuntimeError("TcpProxy already started")
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self._port = int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        """Stop listening and close every connection at once (a reset, not a clean close)."""
        if self._server is not None:
            self._server.close()
        connections, self._connections = self._connections, set()
        for connection in connections:
            connection.abort()
        # Aborted, every direction reads the end of its stream (or an error) and ends.
        tasks = [task for c in connections for task in c.tasks]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=1.0)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    def partition(self) -> None:
        """From now on, hold every byte in both directions; close nothing."""
        self._partitioned = True

    def heal(self, *, reset: bool = False) -> None:
        """Forward again. Held bytes (and closes) are delivered in order, as TCP would after a
        short partition; with `reset`, the connections open during the partition are reset
        instead and their held bytes dropped, as after the kernel's retransmission timeout."""
        if not self._partitioned:
            return
        if reset:
            for connection in list(self._connections):
                connection.abort()
        else:
            # Synchronous, with no await between flushing and lifting the partition: a
            # direction that reads again afterwards cannot overtake its held bytes.
            for connection in list(self._connections):
                for direction in (connection.outbound, connection.inbound):
                    held, direction.held = direction.held, []
                    for chunk in held:
                        self._forward(direction, chunk)
        self._partitioned = False

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        try:
            if isinstance(self.target, tuple):
                up_reader, up_writer = await asyncio.open_connection(*self.target)
            else:
                up_reader, up_writer = await asyncio.open_unix_connection(str(self.target))
        except OSError:
            # The server is down: the client sees its connection closed, as with a refusal.
            writer.transport.abort()
            return
        connection = _Connection(
            client=writer,
            upstream=up_writer,
            outbound=_Direction(reader, up_writer),
            inbound=_Direction(up_reader, writer),
        )
        self._connections.add(connection)
        connection.tasks = [
            asyncio.create_task(self._pump(connection, connection.outbound)),
            asyncio.create_task(self._pump(connection, connection.inbound)),
        ]
        try:
            # Collected here, whatever became of them: the server logs an exception (or a
            # cancellation) this handler ends with.
            await asyncio.gather(*connection.tasks, return_exceptions=True)
        finally:
            self._connections.discard(connection)
            connection.abort()

    async def _pump(self, connection: _Connection, direction: _Direction) -> None:
        try:
            while True:
                chunk = await direction.source.read(CHUNK)
                if self._partitioned:
                    direction.held.append(chunk)
                elif not self._forward(direction, chunk):
                    return
                else:
                    await direction.sink.drain()
                if not chunk:
                    # End of stream: nothing more to read. If it is held, heal() delivers it.
                    # Keep this task alive while the other direction still runs.
                    return
        except (ConnectionError, OSError):
            # A reset on either side resets the whole connection, as on a real network.
            connection.abort()

    @staticmethod
    def _forward(direction: _Direction, chunk: bytes) -> bool:
        """Write `chunk` on, or close the sink at the end of the stream (b""). False once the
        sink can take nothing more."""
        sink = direction.sink
        if sink.is_closing():
            return False
        if chunk:
            sink.write(chunk)
            return True
        if sink.can_write_eof():
            with contextlib.suppress(OSError):
                sink.write_eof()
                return True
        sink.close()
        return False
