"""The console: a terminal chat with the bot, and a scriptable one over pipes.

Each line on stdin is one message; each reply goes to stdout. Typing several lines while the
bot is "thinking" shows the burst handling: one reply covers all of them. At end of input
the replies still owed are delivered first, then `run` returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import sys
import threading
import uuid
from collections.abc import Callable

from adapters import Platform
from adapters.base import Sink, until_stored
from bot.cancel import cancel_and_wait
from bot.check import Check
from bot.message import InboundMessage, NoFiles, Unavailable
from bot.settings import Settings

log = logging.getLogger(__name__)

CONVERSATION_CHAT = "local"


class ConsoleAdapter(NoFiles):
    platform = "console"
    max_message_chars = 100_000
    typing_interval_s = 1.0

    def __init__(self) -> None:
        self.interactive = _isatty(sys.stdin) and _isatty(sys.stdout)
        # Message ids must never repeat across runs, or the persistent dedupe would drop them.
        self.run_id = uuid.uuid4().hex[:12]
        self.conversation = f"{self.platform}:{CONVERSATION_CHAT}"
        # Set when stdout is gone (the reader closed the pipe): nothing more can be shown.
        self._output_gone = asyncio.Event()

    def connected(self) -> bool:
        return not self._output_gone.is_set()

    async def run(self, sink: Sink) -> None:
        if self.interactive:
            print("lastword console: type messages, Ctrl-D to finish.", file=sys.stderr)
        chatting = asyncio.create_task(self._chat(sink))
        gone = asyncio.create_task(self._output_gone.wait())
        try:
            await asyncio.wait({chatting, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            await cancel_and_wait(chatting, retry_s=0.1)
        if chatting.done() and not chatting.cancelled() and chatting.exception() is not None:
            raise chatting.exception()  # type: ignore[misc]
        if self._output_gone.is_set():
            log.warning(
                "stdout was closed: stopping; replies still owed are delivered by the next run"
            )

    async def _chat(self, sink: Sink) -> None:
        lines: asyncio.Queue[bytes] = asyncio.Queue()
        loop = asyncio.get_running_loop()

        def put(line: bytes) -> None:
            # After shutdown the loop is closed; input that arrives then is simply not read.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(lines.put_nowait, line)

        # A daemon thread: a blocked read must never keep the process from exiting.
        threading.Thread(target=_read_lines, args=(put,), name="stdin", daemon=True).start()
        for number in itertools.count(1):
            raw = await lines.get()
            if raw == b"":
                break
            # Invalid UTF-8 becomes U+FFFD here: the core only ever sees valid text.
            text = raw.decode("utf-8", "replace").rstrip("\r\n")
            if text.strip():
                await self._ingest_until_stored(sink, text, number)
        await sink.settled(self.conversation)

    async def _ingest_until_stored(self, sink: Sink, text: str, number: int) -> None:
        message = InboundMessage(
            platform=self.platform,
            chat_id=CONVERSATION_CHAT,
            user_id=CONVERSATION_CHAT,
            display_name="you",
            message_id=f"{self.run_id}:{number}",
            text=text,
        )
        # stdin cannot redeliver, so the line is held here until the store is back.
        await until_stored(lambda: sink.ingest(message), f"line {number}", first_s=0.1, cap_s=2.0)

    async def send(self, conversation: str, text: str, idempotency_key: str) -> None:
        if self._output_gone.is_set():
            # stdout now points at /dev/null: "sending" there would lose the reply.
            raise Unavailable("stdout is closed")
        if self.interactive:
            sys.stderr.write("\r\033[K")
            text = f"bot> {text}"
        try:
            _write_line(text)
        except OSError as exc:
            # A closed pipe (`lastword run | head -1`): retrying can never succeed. The reply
            # stays in the outbox, so the next run delivers it; this run ends.
            _silence_stdout()
            self._output_gone.set()
            raise Unavailable(f"stdout is closed: {exc}") from None

    async def typing(self, conversation: str) -> None:
        if self.interactive:
            sys.stderr.write("\r\033[Kbot is typing…")
            sys.stderr.flush()


def _isatty(stream: object) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def _read_lines(put: Callable[[bytes], None]) -> None:
    """Hand each line of stdin to `put`, then b"" at end of input.

    Reads the file descriptor directly rather than `sys.stdin.buffer`: a daemon thread
    blocked inside the buffered reader holds its lock, and the interpreter aborts
    ("could not acquire lock ... at interpreter shutdown") when the process exits on SIGTERM
    while waiting for input.
    """
    try:
        fd = sys.stdin.fileno()
    except (AttributeError, ValueError, OSError):
        fd = -1  # no stdin at all: same as empty input
    partial: list[bytes] = []
    while fd >= 0:
        try:
            chunk = os.read(fd, 65536)
        except InterruptedError:
            continue
        except OSError:
            break
        if not chunk:
            break
        *complete, rest = chunk.split(b"\n")
        for piece in complete:
            partial.append(piece)
            put(b"".join(partial) + b"\n")
            partial = []
        if rest:
            partial.append(rest)
    if partial:
        put(b"".join(partial))
    put(b"")


def _write_line(text: str) -> None:
    """Print one reply; characters the terminal's encoding cannot show are replaced rather
    than failing the send (which would retry the same reply forever)."""
    stream = sys.stdout
    encoding = getattr(stream, "encoding", None) or "utf-8"
    safe = text.encode(encoding, "replace").decode(encoding)
    stream.write(safe + "\n")
    stream.flush()


def _silence_stdout() -> None:
    # Point stdout at /dev/null so the interpreter's final flush does not raise again.
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


async def check(settings: Settings, timeout_s: float) -> Check:
    """The console needs no token and no network: there is nothing to ask."""
    return Check("platform", True, "console: no token needed")


PLUGIN = Platform(create=lambda settings: ConsoleAdapter(), check=check)
