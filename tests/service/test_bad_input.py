"""Bad input: blank and huge messages, broken text, and a Redis that is down or goes away.

Each case is driven both where it enters in real life (the `lastword run` process and its
stdin) and, where the console cannot produce it, in-process through `Runtime.ingest` with the
platform played by RecordingOutbound. Nothing here may crash the bot or lose a message.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis import Redis as SyncRedis

from bot.message import Attachment
from bot.store import Keys
from bot.store.embedded import EmbeddedRedis
from tests.support.builders import message
from tests.support.console import (
    CONVERSATION,
    MODULE,
    Bot,
    assert_no_server,
    clean_env,
    read_store,
    run_bot,
    server_pids,
)
from tests.support.factories import RuntimeFactory
from tests.support.ports import closed_port
from tests.support.waits import settled

ECHO = "You said: "


def said(replies: list[str]) -> list[str]:
    """The user lines the echo replies covered, in order (each reply is "You said: a / b")."""
    covered: list[str] = []
    for reply in replies:
        assert reply.startswith(ECHO), reply
        covered += reply.removeprefix(ECHO).split(" / ")
    return covered


@pytest.fixture
def data_dir(short_dir: Path) -> Iterator[Path]:
    path = short_dir / "data"
    yield path
    assert server_pids(path) == [], "an embedded server outlived its test"


# --- empty and whitespace-only messages ----------------------------------------------------


async def test_blank_messages_are_dropped_in_process(runtime_factory: RuntimeFactory) -> None:
    runtime, outbound = await runtime_factory()
    for n, blank in enumerate(["", " ", "\n\t  \r\n", "\u3000\u00a0"]):
        assert await runtime.ingest(message(blank, n=n)) is False
    assert await runtime.store.counters("test:1") == (0, 0)  # no version bump
    # An attachment with no caption is a message, not a blank one.
    photo = message("", n=10, attachments=(Attachment("photo", "file-1"),))
    assert await runtime.ingest(photo) is True
    assert await runtime.ingest(message("real", n=11)) is True
    await settled(runtime, "test:1")
    # One reply, covering only what was said: the blanks left no trace in it.
    assert outbound.texts() == ["You said: [photo] / real"]
    assert await runtime.store.counters("test:1") == (2, 2)


def test_blank_lines_are_dropped_on_the_console(data_dir: Path) -> None:
    code, lines, stderr = run_bot(data_dir, "\n   \n\t\nhello\n \r\n\n")
    assert code == 0, stderr
    assert lines == ["You said: hello"]
    counters, history, _ = read_store(data_dir)
    assert counters == (1, 1)  # five blank lines, one version
    assert [h.text for h in history] == ["hello", "You said: hello"]


def test_only_blank_lines_give_no_reply(data_dir: Path) -> None:
    code, lines, stderr = run_bot(data_dir, "\n \n\t\n")
    assert code == 0, stderr
    assert lines == []
    counters, _, _ = read_store(data_dir)
    assert counters == (0, 0)


# --- a 100 kB message ----------------------------------------------------------------------


async def test_huge_message_is_truncated_with_a_note(runtime_factory: RuntimeFactory) -> None:
    runtime, outbound = await runtime_factory()
    limit = runtime.settings.max_message_chars
    text = "word " * 20_000  # 100 kB
    assert await runtime.ingest(message(text))
    await settled(runtime, "test:1")
    stored = [h.text for h in await runtime.store.history("test:1") if h.role == "user"]
    assert len(stored) == 1
    assert stored[0].startswith(text[:limit])
    assert f"{len(text) - limit} more characters were cut" in stored[0]
    assert len(stored[0]) <= limit + 100
    # The reply arrived, split to the platform's limit, and carries the note too.
    parts = outbound.texts()
    assert len(parts) >= 2
    assert all(len(part) <= outbound.max_message_chars for part in parts)
    assert sum(map(len, parts)) <= len(ECHO) + limit + 100
    assert "more characters were cut" in parts[-1]


def test_huge_line_on_the_console(data_dir: Path) -> None:
    code, lines, stderr = run_bot(data_dir, "y" * 100_000 + "\n")
    assert code == 0, stderr
    reply = "\n".join(lines)
    assert reply.startswith(ECHO + "y" * 8000)
    assert "92000 more characters were cut" in reply
    assert len(reply) <= len(ECHO) + 8000 + 100


# --- invalid text from the platform layer --------------------------------------------------


def test_invalid_utf8_on_stdin_is_replaced(data_dir: Path) -> None:
    code, lines, stderr = run_bot(data_dir, b"\xff\xfe bad \xc3\x28\nnul\x00byte\r\n")
    assert code == 0, stderr
    assert lines == ["You said: \ufffd\ufffd bad \ufffd( / nul\x00byte"]


def test_terminal_that_cannot_show_the_reply_still_gets_it(data_dir: Path) -> None:
    # An ASCII-only stdout must not make the send fail (and be retried forever).
    code, lines, stderr = run_bot(data_dir, "caf\u00e9 \u2603\n", PYTHONIOENCODING="ascii")
    assert code == 0, stderr
    assert lines == ["You said: caf? ?"]


async def test_lone_surrogates_in_text_are_stored_and_answered(
    runtime_factory: RuntimeFactory,
) -> None:
    runtime, outbound = await runtime_factory()
    assert await runtime.ingest(message("bad \udcff text \ud83d"))
    await settled(runtime, "test:1")
    [reply] = outbound.texts()
    reply.encode("utf-8")  # valid text: no surrogate got through
    assert reply.startswith("You said: bad ")
    assert reply.endswith(" text ?")
    [user, _] = await runtime.store.history("test:1")
    user.text.encode("utf-8")


async def test_lone_surrogates_in_other_fields_are_stored_and_answered(
    runtime_factory: RuntimeFactory,
) -> None:
    runtime, outbound = await runtime_factory()
    broken = message("hi", display_name="Ann \ud83d", attachments=(Attachment("photo", "f\udcff"),))
    assert await runtime.ingest(broken)
    await settled(runtime, "test:1")
    assert len(outbound.texts()) == 1


# --- output that goes away -----------------------------------------------------------------


def test_closed_stdout_ends_the_run_and_the_reply_waits_for_the_next(data_dir: Path) -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)  # `lastword run | head -0`: nobody will read the reply
    try:
        process = subprocess.Popen(
            MODULE,
            stdin=subprocess.PIPE,
            stdout=write_end,
            stderr=subprocess.PIPE,
            env=clean_env(data_dir),
            cwd=data_dir.parent,
        )
    finally:
        os.close(write_end)
    try:
        _, stderr = process.communicate(b"unseen\n", timeout=15)
    finally:
        process.kill()
    assert process.returncode == 0, stderr
    assert b"Traceback" not in stderr, stderr.decode()
    assert b"stdout was closed" in stderr
    # The reply was not lost: the next run with a working stdout delivers it.
    code, lines, stderr_text = run_bot(data_dir, "")
    assert code == 0, stderr_text
    assert lines == ["You said: unseen"]


# --- Redis down at start-up, or going away mid-run -----------------------------------------


def test_redis_down_at_startup_is_one_clear_line(data_dir: Path) -> None:
    code, lines, stderr = run_bot(
        data_dir, "hello\n", LASTWORD_REDIS_URL=f"redis://127.0.0.1:{closed_port()}/0"
    )
    assert code == 1
    assert lines == []
    # At a terminal the error comes at once: one line, no "waiting for Redis" before it (a
    # service would wait up to a minute). Not a time bound: the interpreter's own start
    # takes 1 to 6 s here, depending on the machine's load.
    errors = stderr.strip().splitlines()
    assert len(errors) == 1, stderr
    assert "LASTWORD_REDIS_URL" in errors[0]
    assert "Traceback" not in stderr


def counters(server: EmbeddedRedis) -> tuple[int, int]:
    client = SyncRedis(unix_socket_path=str(server.socket))
    try:
        v, w = client.hmget(Keys(CONVERSATION).state, ["v", "w"])
        return int(v or 0), int(w or 0)
    finally:
        client.close()


def wait_counters(server: EmbeddedRedis, expected: tuple[int, int], timeout: float = 5) -> None:
    deadline = time.monotonic() + timeout
    while (got := counters(server)) != expected:
        assert time.monotonic() < deadline, f"(V, W) is {got}, expected {expected}"
        time.sleep(0.02)


def wait_stderr(bot: Bot, text: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while text not in bot.stderr():
        assert time.monotonic() < deadline, f"{text!r} not in stderr: {bot.stderr()!r}"
        time.sleep(0.02)


def redis_returns_and_input_ends(bot: Bot, server: EmbeddedRedis) -> None:
    """The bot is still up when Redis comes back and the user ends input: it must then answer
    what it holds and exit 0, without a traceback."""
    assert bot.process.poll() is None
    server.start()
    bot.close_stdin()
    code = bot.wait(15)
    assert code == 0, bot.stderr()
    assert "Traceback" not in bot.stderr()


@pytest.mark.fresh_server
def test_lines_typed_while_redis_is_down_are_answered_when_it_returns(
    data_dir: Path, server: EmbeddedRedis
) -> None:
    bot = Bot(data_dir, LASTWORD_REDIS_URL=server.url)
    try:
        bot.write("a\nb\n")
        assert bot.wait_lines(1) == ["You said: a / b"]
        wait_counters(server, (2, 2))  # committed: nothing in flight when Redis goes

        server.stop()
        bot.write("c\nd\n")
        # The bot tried to store "c", failed, and holds it rather than dropping it or dying.
        wait_stderr(bot, "not stored yet")
        redis_returns_and_input_ends(bot, server)
    finally:
        bot.kill()
    assert said(bot.lines()) == ["a", "b", "c", "d"]  # every line answered exactly once
    assert counters(server) == (4, 4)
    assert_no_server(data_dir)  # an external Redis: the bot started none of its own


@pytest.mark.fresh_server
def test_accepted_message_survives_a_redis_restart(data_dir: Path, server: EmbeddedRedis) -> None:
    # The model takes 1 s, so no reply can reach the pre-send check before Redis is stopped:
    # the message is accepted (stored) but surely not answered when Redis goes.
    bot = Bot(
        data_dir,
        LASTWORD_REDIS_URL=server.url,
        LASTWORD_DEBOUNCE__QUIET_MS="300",
        LASTWORD_LLM__ECHO_DELAY_MS="1000",
    )
    try:
        bot.write("kept\n")
        wait_counters(server, (1, 0), timeout=10)
        server.stop()  # graceful: the append-only file is flushed
        wait_stderr(bot, "unreachable")
        redis_returns_and_input_ends(bot, server)
    finally:
        bot.kill()
    assert bot.lines() == ["You said: kept"]
    assert counters(server) == (1, 1)
