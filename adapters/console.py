"""The console: a terminal chat with the bot, and a scriptable one over pipes.

Each line on stdin is one message; each reply goes to stdout. Typing several lines while the
bot is "thinking" shows the burst handling: one reply covers all of them. At end of input
the replies still owed are delivered first, then `run` returns.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import sys
import threading
import uuid

from adapters.base import Sink
from bot.message import InboundMessage, Unavailable

log = logging.getLogger(__name__)

CONVERSATION_CHAT = "local"


class ConsoleAdapter:
    platform = "console"
    max_message_chars = 100_000
    typing_interval_s = 1.0

    def __init__(self) -> None:
        self.interactive = sys.stdin.isatty() and sys.stdout.isatty()
        # Message ids must never repeat across runs, or the persistent dedupe would drop them.
        self.run_id = uuid.uuid4().hex[:12]
        self.conversation = f"{self.platform}:{CONVERSATION_CHAT}"

    async def run(self, sink: Sink) -> None:
        lines: asyncio.Queue[bytes] = asyncio.Queue()
        loop = asyncio.get_running_loop()

        def read() -> None:
            for line in iter(sys.stdin.buffer.readline, b""):
                loop.call_soon_threadsafe(lines.put_nowait, line)
            loop.call_soon_threadsafe(lines.put_nowait, b"")

        # A daemon thread: a blocked read must never keep the process from exiting.
        threading.Thread(target=read, name="stdin", daemon=True).start()
        if self.interactive:
            print("lastword console: type messages, Ctrl-D to finish.", file=sys.stderr)
        for number in itertools.count(1):
            raw = await lines.get()
            if raw == b"":
                break
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
        delay = 0.1
        while True:
            try:
                await sink.ingest(message)
                return
            except Unavailable as exc:
                # stdin cannot redeliver, so the line is held here until the store is back.
                log.warning("message not stored yet (%s); retrying in %.1fs", exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)

    async def send(self, conversation: str, text: str, idempotency_key: str) -> None:
        if self.interactive:
            sys.stderr.write("\r\033[K")
            text = f"bot> {text}"
        print(text, flush=True)

    async def typing(self, conversation: str) -> None:
        if self.interactive:
            sys.stderr.write("\r\033[Kbot is typing…")
            sys.stderr.flush()
