"""The built-in platforms as the conformance suite drives them (`bot.testing.conformance`): one
`FakePlatform` each, over the loopback fakes of Telegram and Discord and a fake terminal for
the console."""

from __future__ import annotations

import errno
import io
import json
import os
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

import discord
import discord.client
import discord.gateway
import discord.http

from adapters.base import Adapter, Sink
from adapters.console import ConsoleAdapter
from adapters.discord import SESSION_KEY
from bot.testing.conformance import (
    ACKNOWLEDGEMENT,
    PERMANENT_SEND_ERROR,
    REDELIVERY,
    TYPING,
    USER_TYPING,
    Reply,
)
from tests.support.fakes.discord_server import FakeDiscord
from tests.support.fakes.loopback import free_port
from tests.support.fakes.telegram_server import FakeTelegram, post_update

# The one user of each test, who talks to the bot in a private chat.
TELEGRAM_CHAT = 4242
DISCORD_USER = 7001
WEBHOOK_SECRET = "conformance-webhook-secret"
WEBHOOK_PATH = "/telegram"


class TelegramPlatform:
    """Telegram in webhook mode: each message is POSTed to the adapter's endpoint as Telegram
    does, and acknowledged by a 200 answer; anything else makes Telegram deliver it again."""

    not_applicable: Mapping[str, str] = {
        USER_TYPING: "the Bot API never tells a bot that a user is typing"
    }
    # Telegram's limit, counted after entity parsing (the fake refuses longer messages).
    message_limit = 4096
    # The endpoint answers 200 as `ingest` returns.
    ack_within_s = 0.0

    def __init__(self) -> None:
        self.fake = FakeTelegram()
        self.port = free_port()
        self._updates: dict[str, dict[str, Any]] = {}
        # message id -> the HTTP status of each delivery, in order
        self.answers: dict[str, list[int]] = {}

    async def start(self) -> None:
        await self.fake.start()

    async def stop(self) -> None:
        await self.fake.stop()

    def settings(self) -> dict[str, Any]:
        return {
            "platform": "telegram",
            "telegram": {
                "token": self.fake.token,
                "api_url": self.fake.api_url,
                "mode": "webhook",
                "webhook_listen": f"127.0.0.1:{self.port}",
                "webhook_path": WEBHOOK_PATH,
                "webhook_secret": WEBHOOK_SECRET,
                "webhook_url": "https://bot.example" + WEBHOOK_PATH,
            },
        }

    async def attached(self, adapter: Adapter, sink: Sink) -> None:
        # The endpoint listens before the adapter registers it.
        await self.fake.wait_for_calls("setWebhook", 1)

    async def user_sends(self, text: str) -> str:
        update = self.fake.private_text_update(TELEGRAM_CHAT, TELEGRAM_CHAT, text)
        message_id = str(update["message"]["message_id"])
        self._updates[message_id] = update
        await self._deliver(message_id)
        return message_id

    async def redeliver(self, message_id: str) -> None:
        await self._deliver(message_id)

    async def _deliver(self, message_id: str) -> None:
        url = f"http://127.0.0.1:{self.port}{WEBHOOK_PATH}"
        status = await post_update(url, self._updates[message_id], WEBHOOK_SECRET)
        self.answers.setdefault(message_id, []).append(status)

    async def acknowledged(self, message_id: str) -> bool:
        return 200 in self.answers.get(message_id, [])

    def replies(self) -> list[Reply]:
        return [
            Reply(call.text or "", call.at)
            for call in self.fake.sent_messages
            if call.chat_id == TELEGRAM_CHAT
        ]

    def typing_seen(self) -> list[float]:
        return [
            call.at
            for call in self.fake.calls_to("sendChatAction")
            if call.ok and call.chat_id == TELEGRAM_CHAT
        ]

    def fail_sends(self, permanent: bool) -> None:
        # For now: flood control longer than the adapter waits out holding the lease.
        error = self.fake.chat_not_found() if permanent else self.fake.too_many_requests(120)
        self.fake.fail_chat(TELEGRAM_CHAT, error)

    def refuse_credentials(self) -> None:
        self.fake.refuse_token()


class DiscordPlatform:
    """Discord: DMs come over the gateway, which has no acknowledgement to hold back. What
    stands for one is the session the adapter keeps in the store for the next gateway holder:
    a RESUME replays every event after its sequence number, so a DM counts as acknowledged
    once that number has passed the event that carried it."""

    not_applicable: Mapping[str, str] = {}
    message_limit = 2000
    # The kept sequence number moves about once a second.
    ack_within_s = 2.0

    def __init__(self) -> None:
        self.fake = FakeDiscord()
        self.channel = 0
        self._sink: Sink | None = None
        # discord.py is aimed at a server through class and module attributes, which the
        # adapter sets for the process: put back as they were when the test ends.
        self._saved = (
            discord.http.Route.BASE,
            discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY,
            discord.client.DiscordWebSocket,
        )

    async def start(self) -> None:
        await self.fake.start()
        self.channel = self.fake.dm_channel(DISCORD_USER)

    async def stop(self) -> None:
        await self.fake.stop()
        (
            discord.http.Route.BASE,
            discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY,
            discord.client.DiscordWebSocket,  # type: ignore[misc]
        ) = self._saved

    def settings(self) -> dict[str, Any]:
        return {
            "platform": "discord",
            "discord": {
                "token": self.fake.token,
                "api_url": self.fake.api_url,
                "gateway_url": self.fake.gateway_url,
            },
        }

    async def attached(self, adapter: Adapter, sink: Sink) -> None:
        self._sink = sink
        await self.fake.wait_for_sessions(1)

    async def user_sends(self, text: str) -> str:
        payload = await self.fake.user_sends(DISCORD_USER, text)
        return str(payload["id"])

    async def redeliver(self, message_id: str) -> None:
        await self.fake.redeliver(int(message_id))

    async def acknowledged(self, message_id: str) -> bool:
        event = self.fake.first_event(int(message_id))
        assert self._sink is not None
        kept = await self._sink.recall(SESSION_KEY)
        if event is None or kept is None:
            return False
        session = json.loads(kept)
        return bool(session["id"] == event[0] and session["seq"] >= event[1])

    def replies(self) -> list[Reply]:
        return [
            Reply(post.content or "", post.at)
            for post in self.fake.posts
            if post.channel_id == self.channel and post.status == 200 and not post.deduplicated
        ]

    def typing_seen(self) -> list[float]:
        return [at for channel, at in self.fake.typing_calls if channel == self.channel]

    def fail_sends(self, permanent: bool) -> None:
        error = self.fake.missing_access() if permanent else self.fake.server_error(503)
        self.fake.fail_channel(self.channel, error)

    def refuse_credentials(self) -> None:
        self.fake.token = "revoked"

    async def user_types(self) -> None:
        await self.fake.user_types(DISCORD_USER)


class _Keyboard:
    """The console's stdin: a pipe the user types into. Not a terminal: on one, the input
    line is prompt_toolkit's, which needs a real one (tests/adapters/terminal/test_console_pty.py
    has it)."""

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe()

    def fileno(self) -> int:
        return self.read_fd

    def isatty(self) -> bool:
        return False

    def type(self, line: str) -> None:
        data = (line + "\n").encode()
        while data:
            data = data[os.write(self.write_fd, data) :]


class _Screen(io.TextIOBase):
    """The console's stdout or stderr: a terminal that keeps what was written, and when.
    Once `broken`, writing fails as on a closed pipe."""

    encoding = "utf-8"

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[tuple[str, float]] = []
        self.broken = False

    def isatty(self) -> bool:
        return True

    def fileno(self) -> int:
        raise io.UnsupportedOperation("a fake terminal has no file descriptor")

    def write(self, text: str) -> int:
        if self.broken:
            raise BrokenPipeError(errno.EPIPE, "Broken pipe")
        self.writes.append((text, time.monotonic()))
        return len(text)

    def flush(self) -> None:
        if self.broken:
            raise BrokenPipeError(errno.EPIPE, "Broken pipe")


class ConsolePlatform:
    """The console with its output on a (fake) terminal: lines piped to stdin, replies
    printed on stdout, each a line of its own, and the live draft redrawn in place."""

    not_applicable: Mapping[str, str] = {
        ACKNOWLEDGEMENT: (
            "stdin has no acknowledgement to hold back: a line the core cannot take in is "
            "held in memory and retried until it is stored"
        ),
        REDELIVERY: "stdin never delivers a line twice",
        PERMANENT_SEND_ERROR: (
            "a terminal never refuses a line for good: a closed stdout is transient (the "
            "reply waits in the store for the next run)"
        ),
        TYPING: (
            "typing is drawn above the input line, which only a real terminal has: "
            "tests/adapters/terminal/test_console_pty.py checks it under a pseudo-terminal"
        ),
        USER_TYPING: (
            "keystrokes are seen on a terminal only, never on a pipe: "
            "tests/adapters/terminal/test_console_pty.py checks them under a pseudo-terminal"
        ),
    }
    message_limit = ConsoleAdapter.max_message_chars
    ack_within_s = 0.0

    def __init__(self) -> None:
        self.keyboard = _Keyboard()
        self.stdout = _Screen()
        self.stderr = _Screen()
        self.run_id = ""
        self._lines = 0
        # The streams replaced, by name, with what was there before.
        self._saved: dict[str, Any] = {}
        self._threads: set[threading.Thread] = set()

    def _install(self) -> None:
        """Put the fake terminal in place of sys.stdin, stdout and stderr, where it is not.
        Again before each message: pytest's output capture puts its own streams back at the
        start of each test phase, and the adapter looks them up as it writes."""
        for name, stream in (
            ("stdin", self.keyboard),
            ("stdout", self.stdout),
            ("stderr", self.stderr),
        ):
            if getattr(sys, name) is not stream:
                self._saved[name] = getattr(sys, name)
                setattr(sys, name, stream)

    async def start(self) -> None:
        # Before the adapter is made: it asks its streams whether they are a terminal then,
        # and its reader thread takes stdin's file descriptor as it starts.
        self._threads = set(threading.enumerate())
        self._install()

    async def stop(self) -> None:
        for name, stream in (
            ("stdin", self.keyboard),
            ("stdout", self.stdout),
            ("stderr", self.stderr),
        ):
            if getattr(sys, name) is stream:
                setattr(sys, name, self._saved[name])
        # End of input: the adapter's reader thread reads it and ends; only then is its file
        # descriptor closed, so the thread can never read another file that reuses it.
        os.close(self.keyboard.write_fd)
        readers = [t for t in threading.enumerate() if t not in self._threads and t.name == "stdin"]
        for reader in readers:
            reader.join(timeout=5)
        if not any(reader.is_alive() for reader in readers):
            os.close(self.keyboard.read_fd)

    def settings(self) -> dict[str, Any]:
        return {"platform": "console"}

    async def attached(self, adapter: Adapter, sink: Sink) -> None:
        # stdin is read from the start; lines typed before that wait in the pipe.
        assert isinstance(adapter, ConsoleAdapter)
        self.run_id = adapter.run_id

    async def user_sends(self, text: str) -> str:
        self._install()
        self.keyboard.type(text)
        self._lines += 1
        return f"{self.run_id}:{self._lines}"

    async def redeliver(self, message_id: str) -> None:
        raise AssertionError("stdin cannot deliver a line twice")

    async def acknowledged(self, message_id: str) -> bool:
        raise AssertionError("stdin has no acknowledgement")

    def replies(self) -> list[Reply]:
        # A reply is a line of its own; drafts are redrawn in place, never ending a line.
        return [
            Reply(text.removesuffix("\n"), at)
            for text, at in self.stdout.writes
            if text.endswith("\n") and not text.startswith("\r")
        ]

    def typing_seen(self) -> list[float]:
        return [at for text, at in self.stderr.writes if "typing" in text]

    def fail_sends(self, permanent: bool) -> None:
        assert not permanent, "a terminal has no permanent failure"
        self.stdout.broken = True
