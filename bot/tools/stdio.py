"""A stdio transport for MCP servers, in place of the SDK's `stdio_client`: the same shape (an
async context manager yielding the read and write memory streams of `SessionMessage` that
`mcp.client.Client` takes as a transport), with the bounds the SDK's lacks.

- **A message has a size limit** (`max_message_bytes`, one line of JSON). The server's stdout
  is read in chunks and cut into lines without ever rescanning, so reading takes time linear
  in what the server writes, in short steps of the loop. (The SDK's reader joins strings chunk
  by chunk, on the loop and without limit: a server writing 100 MB stalls the replica for
  every user.) A line over the limit stops the server at once (SIGTERM to its process group,
  SIGKILL to what outlives `TERM_GRACE_S`) and ends the session. When the line's first bytes
  say which request it answers, that request gets the error `TOO_LONG` first: the tool did
  answer, too much, so its call is not left with an unknown outcome.
- **Its stderr is read, not inherited.** Each line goes to lastword's log, tagged with the
  server's name, its credentials masked, cut to `LOG_CHARS` characters, at most
  `CHATTER_PER_S` lines a second (then one line of how many were dropped). It is read to its
  end whatever is dropped, so a chatty server never blocks on a full pipe. Its last lines are
  kept too (`LastWords`), unmasked and never logged as such, for the owner to say why a server
  that would not start failed: its own words (`No module named …`), not only `Connection
  closed`.
- **A minimal environment**: the child gets `INHERITED` from lastword's environment and its
  entry's `env` over it, never lastword's own settings (`LASTWORD_*`) nor any other credential
  the replica holds (`OPENAI_API_KEY`).

As the SDK's: the child runs in a session (and so a process group) of its own, in `cwd`, and
its messages are read and written in the given encoding. At the end its stdin is closed and
it has `CLOSE_GRACE_S` to exit; then its group is sent SIGTERM and, after `TERM_GRACE_S`,
SIGKILL; every wait is bounded and shielded from the caller's cancellation. POSIX only, as
lastword is.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import re
import signal
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import asynccontextmanager, suppress
from typing import TYPE_CHECKING

import anyio

from bot.masking import Scrub, secret_args, secret_env
from bot.tools import LOG_CHARS

if TYPE_CHECKING:
    from anyio.abc import TaskGroup
    from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
    from mcp.client.stdio import StdioServerParameters
    from mcp.shared.message import SessionMessage

# The logger of everything about MCP servers, whichever module says it, so that one name
# filters all of it.
log = logging.getLogger("bot.tools.mcp")

# One message (a line of JSON) from a server, at most, unless configured otherwise
# (`LASTWORD_TOOLS__MAX_MESSAGE_BYTES`).
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
# What a server inherits of lastword's environment: enough to find programs, a home and the
# locale (and the time zone, which a clock tool reads), nothing that configures or
# authenticates lastword.
INHERITED = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ")
# Stopping a server, as the SDK does: after its stdin closes, after SIGTERM, after SIGKILL.
CLOSE_GRACE_S = 2.0
TERM_GRACE_S = 2.0
REAP_S = 2.0
# For the messages already accepted to be written before stdin closes; for the last lines
# of stderr (a crash's traceback) to be read once the server has exited.
FLUSH_S = 0.5
POLL_S = 0.01
# Read at once, at most: one step of the loop.
CHUNK_BYTES = 256 * 1024
# Lines of a server's stderr (and stray stdout) logged per second, at most.
CHATTER_PER_S = 20
# Of a stderr line, what is kept to be logged: more than `LOG_CHARS` characters can take in
# UTF-8, so that a secret that starts in the part shown is masked whole.
KEPT_BYTES = 4096
# Of a server's stderr, what a failure to start is told with (`LastWords`): its last lines, at
# most this many characters in all. A crash's cause is its last line, after a traceback.
LAST_LINES = 5
LAST_CHARS = 500
# Of a message over the limit, what is looked at to find which request it answers.
HEAD_BYTES = 1024
# The JSON-RPC error a request gets when its answer was over the limit: one of the codes
# JSON-RPC leaves to implementations (-32000 to -32099) that the SDK does not use.
TOO_LONG = -32090
# The head of a JSON-RPC answer as servers write it (`jsonrpc` before or after `id`), up to
# its `result` or `error`: the request it answers, as a JSON number or string.
_ANSWER = re.compile(
    rb'\s*\{\s*(?:"jsonrpc"\s*:\s*"2\.0"\s*,\s*)?"id"\s*:\s*(-?\d+|"[^"\\]{0,256}")\s*,'
    rb'\s*(?:"jsonrpc"\s*:\s*"2\.0"\s*,\s*)?"(?:result|error)"\s*:'
)

Streams = tuple[
    "MemoryObjectReceiveStream[SessionMessage | Exception]",
    "MemoryObjectSendStream[SessionMessage]",
]


def environment(extra: Mapping[str, str] | None) -> dict[str, str]:
    """A server's environment: `INHERITED` from lastword's, where set, and `extra` over it."""
    inherited = {name: os.environ[name] for name in INHERITED if name in os.environ}
    return inherited | dict(extra or {})


def answered(head: bytes) -> int | str | None:
    """The id of the request a message answers, from its first bytes; None when they do not
    say (a notification, a request, or an answer written in another order)."""
    found = _ANSWER.match(head)
    if found is None:
        return None
    request: int | str = json.loads(found.group(1))
    return request


class Lines:
    """Cuts a byte stream into lines as its chunks come, never looking at a byte twice: each
    line's first `keep` bytes and its whole size, without its newline."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        # The line so far: its first bytes, and its size.
        self.head = bytearray()
        self.size = 0

    def feed(self, chunk: bytes) -> Iterator[tuple[bytes, int]]:
        """The lines `chunk` ends; what it starts stays in `head` and `size`."""
        start = 0
        while (end := chunk.find(b"\n", start)) != -1:
            self._take(chunk, start, end)
            yield bytes(self.head), self.size
            self.head.clear()
            self.size = 0
            start = end + 1
        self._take(chunk, start, len(chunk))

    def _take(self, chunk: bytes, start: int, end: int) -> None:
        room = self.keep - len(self.head)
        if room > 0:
            self.head += chunk[start : min(end, start + room)]
        self.size += end - start


class LastWords:
    """The last `LAST_LINES` lines a server wrote on its stderr, unmasked (each the first
    `KEPT_BYTES` bytes `Lines` keeps, and its size): what the owner of a session that failed
    tells of why, masked then (`told`)."""

    def __init__(self) -> None:
        self.lines: deque[tuple[str, int | None]] = deque(maxlen=LAST_LINES)

    def hear(self, line: str, cut_at: int | None = None) -> None:
        """One line; `cut_at` its size in bytes when only its start was kept."""
        if line.strip():
            self.lines.append((line.strip(), cut_at))

    def told(self, scrub: Callable[[str], str]) -> str:
        """The lines on one line, " | " between them, each masked by `scrub` before any cut
        (a cut first could leave part of a secret that no longer matches): a line whose
        start only was kept shows its first `LOG_CHARS` characters, as the log does, and of
        all of them the last `LAST_CHARS` characters are told. '' when the server said
        nothing."""
        texts = []
        for line, cut_at in self.lines:
            text = scrub(line)
            texts.append(text if cut_at is None else f"{text[:LOG_CHARS]}… [{cut_at} bytes]")
        text = " | ".join(texts)
        return text if len(text) <= LAST_CHARS else "…" + text[-LAST_CHARS:]


class Chatter:
    """What a server says besides its messages (its stderr, a stray line on its stdout), as
    log lines: tagged with its name, its credentials masked, cut, at most `CHATTER_PER_S` a
    second, and then, when the second is over, one line of how many were dropped."""

    def __init__(self, name: str, scrub: Scrub, encoding: str) -> None:
        self.name = name
        self.scrub = scrub
        self.encoding = encoding
        self._since = -math.inf
        self._said = 0
        self._dropped = 0
        self._timer: asyncio.TimerHandle | None = None

    def say(self, level: int, where: str, line: bytes, size: int) -> None:
        """Log `line`, the first bytes of one of `size` bytes, unless this second's are spent."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        if now - self._since >= 1.0:
            self.flush()
            self._since, self._said = now, 0
        if self._said >= CHATTER_PER_S:
            self._dropped += 1
            if self._timer is None:
                self._timer = loop.call_at(self._since + 1.0, self.flush)
            return
        self._said += 1
        text = self.scrub(line.decode(self.encoding, errors="replace").rstrip("\r"))
        if size > len(line) or len(text) > LOG_CHARS:
            text = f"{text[:LOG_CHARS]}… [{size} bytes]"
        log.log(level, "MCP server %s %s: %s", self.name, where, text)

    def flush(self) -> None:
        """Say how many lines were dropped, if any were."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._dropped:
            log.info(
                "MCP server %s: %d more lines not logged (at most %d a second are)",
                self.name,
                self._dropped,
                CHATTER_PER_S,
            )
            self._dropped = 0


class Child:
    """One server process and the tasks that read and write its pipes."""

    def __init__(
        self,
        process: asyncio.subprocess.Process,
        server: StdioServerParameters,
        name: str,
        limit: int,
        on_overlong: Callable[[], None] | None,
        last_words: LastWords | None,
    ) -> None:
        self.process = process
        self.name = name
        self.limit = limit
        self.on_overlong = on_overlong
        self.encoding = server.encoding
        self.errors = server.encoding_error_handler
        secrets = [*secret_env(server.env or {}), *secret_args(server.args)]
        self.chatter = Chatter(name, Scrub(secrets), server.encoding)
        self.last_words = last_words
        self.group: TaskGroup | None = None
        self.overlong = False
        self._written = anyio.Event()
        self._heard = anyio.Event()

    async def read(self, sink: MemoryObjectSendStream[SessionMessage | Exception]) -> None:
        """The server's messages, one a line, into `sink`, which is closed at the end of its
        output or at a message over the limit: the session sees its end."""
        assert self.process.stdout is not None
        stdout = self.process.stdout
        lines = Lines(self.limit)
        try:
            async with sink:
                while chunk := await stdout.read(CHUNK_BYTES):
                    for line, size in lines.feed(chunk):
                        if size > self.limit:
                            await self._overlong(line[:HEAD_BYTES], sink)
                            return
                        if line and not line.isspace():
                            await sink.send(self._message(line))
                    if lines.size > self.limit:
                        await self._overlong(bytes(lines.head[:HEAD_BYTES]), sink)
                        return
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            # The session is gone. Read on and throw away, so that a server flushing its
            # output is not blocked on a full pipe and can exit; the stop closes the pipe.
            with anyio.CancelScope(shield=True), suppress(OSError):
                while await stdout.read(CHUNK_BYTES):
                    pass

    def _message(self, line: bytes) -> SessionMessage | Exception:
        """One line as a message; what does not parse as one goes to the session as the
        exception it raised, as the SDK's transport does, and to the log."""
        from mcp.shared.message import SessionMessage
        from mcp.types import jsonrpc_message_adapter

        try:
            text = line.decode(self.encoding, self.errors)
            return SessionMessage(jsonrpc_message_adapter.validate_json(text, by_name=False))
        except ValueError as exc:  # not text in the encoding, not JSON, not JSON-RPC
            where = "wrote on stdout what is not an MCP message"
            self.chatter.say(logging.WARNING, where, line[:KEPT_BYTES], len(line))
            return exc

    async def _overlong(
        self, head: bytes, sink: MemoryObjectSendStream[SessionMessage | Exception]
    ) -> None:
        """Stop the server, which wrote a message over the limit, and fail the request that
        message answered, when its head says which."""
        from mcp.shared.message import SessionMessage
        from mcp.types import ErrorData, JSONRPCError

        log.warning(
            "MCP server %s wrote a message over %d bytes (LASTWORD_TOOLS__MAX_MESSAGE_BYTES): "
            "stopping it",
            self.name,
            self.limit,
        )
        self.overlong = True
        if self.on_overlong is not None:
            self.on_overlong()
        assert self.group is not None
        # Now, not when the session has ended: it may be writing more on a full pipe.
        self.group.start_soon(self._terminate)
        request = answered(head)
        if request is None:
            return
        error = ErrorData(code=TOO_LONG, message=f"the answer was over {self.limit} bytes")
        with suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
            await sink.send(SessionMessage(JSONRPCError(jsonrpc="2.0", id=request, error=error)))

    async def write(
        self,
        source: MemoryObjectReceiveStream[SessionMessage],
        sink: MemoryObjectSendStream[SessionMessage | Exception],
    ) -> None:
        """The session's messages to the server's stdin, one a line. When it cannot be
        written to, the session is ended (`sink` closed), rather than left waiting for
        answers to requests the server never got."""
        assert self.process.stdin is not None
        stdin = self.process.stdin
        try:
            async with source:
                async for message in source:
                    text = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                    stdin.write((text + "\n").encode(self.encoding, self.errors))
                    await stdin.drain()
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            await sink.aclose()
        finally:
            self._written.set()

    async def read_stderr(self) -> None:
        """The server's stderr into the log, line by line, to its end."""
        assert self.process.stderr is not None
        stderr = self.process.stderr
        lines = Lines(KEPT_BYTES)
        try:
            with suppress(OSError):
                while chunk := await stderr.read(CHUNK_BYTES):
                    for line, size in lines.feed(chunk):
                        self._heard_line(line, size)
            if lines.size:
                self._heard_line(bytes(lines.head), lines.size)
            self.chatter.flush()
        finally:
            self._heard.set()

    def _heard_line(self, line: bytes, size: int) -> None:
        """One line of stderr, its first bytes of `size`: to the log and the last words."""
        if self.last_words is not None:
            text = line.decode(self.encoding, errors="replace")
            self.last_words.hear(text, size if size > len(line) else None)
        self.chatter.say(logging.INFO, "stderr", line, size)

    async def shutdown(
        self,
        read_stream: MemoryObjectReceiveStream[SessionMessage | Exception],
        write_stream: MemoryObjectSendStream[SessionMessage],
    ) -> None:
        """Stop the traffic, give the writer `FLUSH_S` to write what it accepted, and stop
        the server."""
        # The reader goes on to throw the output away: a server stuck writing its stdout
        # cannot read the end of its stdin.
        read_stream.close()
        write_stream.close()
        with anyio.move_on_after(FLUSH_S):
            await self._written.wait()
        await self.stop()

    async def stop(self) -> None:
        """Close stdin and give the server `CLOSE_GRACE_S` to exit (none, after a message
        over the limit), then end its process group; then hear its last words on stderr and
        close the pipes."""
        process = self.process
        if process.stdin is not None:
            process.stdin.close()
        if self.overlong:
            # Its whole group, as at once on the message: what the background task did not
            # finish when the transport ends is done here.
            await self._terminate()
        if not await self._exited(CLOSE_GRACE_S):
            await self._terminate()
            if not await self._exited(REAP_S):
                log.warning(
                    "MCP server %s (pid %d) is still alive after SIGKILL; leaving it",
                    self.name,
                    process.pid,
                )
        # Bounded: a process it started may hold stderr open after it exited.
        with anyio.move_on_after(FLUSH_S):
            await self._heard.wait()
        # Not public, as in the SDK: else the pipes stay open while anything holds their other
        # end. Closing ends the reads that wait on them.
        transport = getattr(process, "_transport", None)
        if transport is not None:
            transport.close()

    async def _exited(self, within_s: float) -> bool:
        """Whether the server has exited within `within_s`. Polled: `wait()` would also wait
        for its pipes to close, which a process it started may hold open."""
        with anyio.move_on_after(within_s):
            while self.process.returncode is None:  # noqa: ASYNC110 (see above)
                await anyio.sleep(POLL_S)
        return self.process.returncode is not None

    async def _terminate(self) -> None:
        """SIGTERM to the server's process group, and SIGKILL to what is left of it after
        `TERM_GRACE_S`. The group is the server's pid: it leads a session of its own."""
        group = self.process.pid
        if not _signal(group, signal.SIGTERM):
            return
        with anyio.move_on_after(TERM_GRACE_S):
            # Nothing says when a group has gone: only a signal 0 that finds no one.
            while _signal(group, 0):  # noqa: ASYNC110
                await anyio.sleep(POLL_S)
            return
        _signal(group, signal.SIGKILL)


def _signal(group: int, number: int) -> bool:
    """Send signal `number` to a process group: False once the group has gone."""
    try:
        os.killpg(group, number)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # a member it may not signal (a zombie, on some systems): the group is still there
    return True


@asynccontextmanager
async def stdio_client(
    server: StdioServerParameters,
    *,
    name: str = "",
    max_message_bytes: int = MAX_MESSAGE_BYTES,
    on_overlong: Callable[[], None] | None = None,
    last_words: LastWords | None = None,
) -> AsyncIterator[Streams]:
    """Start the server and talk to it over its stdin and stdout, for as long as the context
    lasts; stop it at the end. `name` tags its log lines; `on_overlong` is called when it
    writes a message over `max_message_bytes`, before the session sees the error and its end;
    `last_words` keeps the last lines of its stderr, complete once the context has exited.
    Raises OSError when it cannot be started (no such command, no such `cwd`)."""
    from mcp.shared.message import SessionMessage

    process = await asyncio.create_subprocess_exec(
        server.command,
        *server.args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=environment(server.env),
        cwd=server.cwd,
        start_new_session=True,
        limit=CHUNK_BYTES,
    )
    # Started: no await until the task group is entered, or a cancellation delivered in
    # between would leave the process running.
    child = Child(
        process, server, name or server.command, max_message_bytes, on_overlong, last_words
    )
    read_sink, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, write_source = anyio.create_memory_object_stream[SessionMessage](0)
    async with anyio.create_task_group() as group:
        child.group = group
        group.start_soon(child.read, read_sink)
        group.start_soon(child.write, write_source, read_sink)
        group.start_soon(child.read_stderr)
        try:
            yield read_stream, write_stream
        finally:
            # Whatever cancels the caller, the server must be stopped; every wait is bounded.
            with anyio.CancelScope(shield=True):
                await child.shutdown(read_stream, write_stream)
                for stream in (read_stream, write_stream, read_sink, write_source):
                    await stream.aclose()
            # What a process the server started may still block on.
            group.cancel_scope.cancel()
