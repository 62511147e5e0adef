"""The real `lastword run` process on the console: pipes in, replies out, the embedded store.

Every test starts the bot as a subprocess with a clean environment (no LASTWORD_* from the
developer's shell), short debounce timings and a private data directory, and talks to it over
stdin/stdout exactly as a script or a terminal user would. The helpers here are shared by the
other process-level test files (test_cli, test_bad_input).
"""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from redis import Redis

from bot.store import Keys
from tests.support.console import (
    CONVERSATION,
    MODULE,
    SCRIPT,
    Bot,
    assert_no_server,
    read_store,
    run_bot,
    server_pids,
    wait_ready,
)


@pytest.mark.parametrize("command", [MODULE, SCRIPT], ids=["python-m-bot", "lastword-script"])
def test_three_quick_lines_get_one_reply(data_dir: Path, command: list[str]) -> None:
    bot = Bot(data_dir, command=command)
    try:
        bot.write("a\nb\nc\n")
        bot.close_stdin()
        code = bot.wait()
    finally:
        bot.kill()
    assert code == 0, bot.stderr()
    assert bot.lines() == ["You said: a / b / c"]
    # The embedded server was started in the data dir, and stopped with the bot.
    assert (data_dir / "appendonlydir").is_dir()
    assert_no_server(data_dir)


def test_a_pause_longer_than_the_window_gives_two_replies(data_dir: Path) -> None:
    bot = Bot(data_dir)
    try:
        bot.write("a\n")
        # The first reply arriving is the proof that the window closed before "b" was typed.
        assert bot.wait_lines(1) == ["You said: a"]
        bot.write("b\n")
        # End of input right away: the reply to "b" is still owed and must come first.
        bot.close_stdin()
        code = bot.wait()
    finally:
        bot.kill()
    assert code == 0, bot.stderr()
    assert bot.lines() == ["You said: a", "You said: b"]
    assert_no_server(data_dir)


def test_end_of_input_waits_for_a_long_window(data_dir: Path) -> None:
    # A window far longer than it takes to close stdin: exiting early would lose the reply.
    code, lines, stderr = run_bot(
        data_dir,
        "only\n",
        LASTWORD_DEBOUNCE__QUIET_MS="1000",
        LASTWORD_DEBOUNCE__MAX_WAIT_MS="2000",
    )
    assert code == 0, stderr
    assert lines == ["You said: only"]


def test_history_persists_across_runs(data_dir: Path) -> None:
    code, lines, stderr = run_bot(data_dir, "first\n")
    assert (code, lines) == (0, ["You said: first"]), stderr
    code, lines, stderr = run_bot(data_dir, "second\n")
    assert (code, lines) == (0, ["You said: second"]), stderr
    assert_no_server(data_dir)

    counters, history, leased = read_store(data_dir)
    assert counters == (2, 2)
    assert [(h.role, h.text) for h in history] == [
        ("user", "first"),
        ("assistant", "You said: first"),
        ("user", "second"),
        ("assistant", "You said: second"),
    ]
    assert not leased


def wait_for_lease(data_dir: Path, timeout: float = 5) -> None:
    """Until a cycle holds the console conversation's lease in the bot's embedded store."""
    client = Redis(unix_socket_path=str(data_dir / "redis.sock"))
    try:
        deadline = time.monotonic() + timeout
        while not client.exists(Keys(CONVERSATION).lease):
            assert time.monotonic() < deadline, "no cycle took the lease"
            time.sleep(0.02)
    finally:
        client.close()


STOPS = {
    "sigterm": lambda bot: os.kill(bot.pid, signal.SIGTERM),
    "sigint": lambda bot: os.kill(bot.pid, signal.SIGINT),
    # Ctrl-C in a terminal: SIGINT to the whole foreground process group.
    "ctrl-c-in-terminal": lambda bot: os.killpg(bot.pid, signal.SIGINT),
}


@pytest.mark.parametrize("stop", STOPS.values(), ids=STOPS.keys())
def test_signal_mid_generation_exits_cleanly_and_loses_nothing(
    data_dir: Path, notify_socket: socket.socket, stop: Callable[[Bot], None]
) -> None:
    # The echo model "thinks" for 20 s, so the signal surely lands mid-generation, and the
    # grace period (1 s) ends long before the reply: the conversation is handed back.
    bot = Bot(
        data_dir,
        new_session=True,
        NOTIFY_SOCKET=notify_socket.getsockname(),
        LASTWORD_LLM__ECHO_DELAY_MS="20000",
        LASTWORD_SHUTDOWN_GRACE_S="1",
    )
    try:
        wait_ready(notify_socket)
        bot.write("pending\n")
        wait_for_lease(data_dir)
        started = time.monotonic()
        stop(bot)
        code = bot.wait(10)
        took = time.monotonic() - started
    finally:
        bot.kill()
    assert code == 0, bot.stderr()
    assert took < 10
    assert bot.lines() == []  # the reply was never sent...
    assert "Traceback" not in bot.stderr()
    assert "KeyboardInterrupt" not in bot.stderr()
    assert_no_server(data_dir)
    # The terminal's Ctrl-C reached the bot only: the server was stopped by the bot, after
    # the leases were handed back, not interrupted alongside it.
    assert "SIGINT" not in (data_dir / "server.log").read_text()

    # ...but the message is safe in the store and the lease was handed back, not left to expire.
    counters, history, leased = read_store(data_dir)
    assert counters == (1, 0)
    assert history == []
    assert not leased

    # The next run owes that reply and delivers it before it honours end of input.
    code, lines, stderr = run_bot(data_dir, "")
    assert code == 0, stderr
    assert lines == ["You said: pending"]


def test_ctrl_c_while_idle_exits_cleanly(data_dir: Path, notify_socket: socket.socket) -> None:
    bot = Bot(data_dir, new_session=True, NOTIFY_SOCKET=notify_socket.getsockname())
    try:
        wait_ready(notify_socket)
        os.killpg(bot.pid, signal.SIGINT)
        code = bot.wait(10)
    finally:
        bot.kill()
    assert code == 0, bot.stderr()
    assert "Traceback" not in bot.stderr()
    assert "KeyboardInterrupt" not in bot.stderr()
    assert_no_server(data_dir)


def test_ready_is_sent_over_notify_socket_once_accepting(
    data_dir: Path, notify_socket: socket.socket
) -> None:
    bot = Bot(data_dir, NOTIFY_SOCKET=notify_socket.getsockname())
    try:
        wait_ready(notify_socket)
        # Ready means accepting: a message sent now is answered.
        bot.write("hello\n")
        assert bot.wait_lines(1) == ["You said: hello"]
        bot.close_stdin()
        code = bot.wait()
        # STATUS= lines may come in between; STOPPING=1 comes last.
        datagrams: list[bytes] = []
        while not datagrams or datagrams[-1] != b"STOPPING=1":
            datagrams.append(notify_socket.recv(4096))
        assert all(d.startswith(b"STATUS=") for d in datagrams[:-1]), datagrams
    finally:
        bot.kill()
    assert code == 0, bot.stderr()


def test_startup_says_it_uses_the_offline_echo_model(data_dir: Path) -> None:
    code, _, stderr = run_bot(data_dir, "")
    assert code == 0, stderr
    assert "no LLM configured" in stderr
    assert "offline echo model" in stderr


def test_embedded_server_dies_with_a_killed_bot(
    data_dir: Path, notify_socket: socket.socket
) -> None:
    bot = Bot(data_dir, NOTIFY_SOCKET=notify_socket.getsockname())
    try:
        wait_ready(notify_socket)
        assert len(server_pids(data_dir)) == 1
        bot.process.send_signal(signal.SIGKILL)
        bot.wait()
    finally:
        bot.kill()
    # No clean-up code ran in the bot: PR_SET_PDEATHSIG alone must take the server down.
    deadline = time.monotonic() + 5
    while server_pids(data_dir) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server_pids(data_dir) == []


def test_a_second_bot_on_the_same_data_dir_is_refused(
    data_dir: Path, notify_socket: socket.socket
) -> None:
    bot = Bot(data_dir, NOTIFY_SOCKET=notify_socket.getsockname())
    try:
        wait_ready(notify_socket)
        code, lines, stderr = run_bot(data_dir, "")
        assert code == 1
        assert lines == []
        assert "LASTWORD_DATA_DIR" in stderr
        assert "Traceback" not in stderr
        # The first bot is unharmed.
        bot.write("still here\n")
        assert bot.wait_lines(1) == ["You said: still here"]
        bot.close_stdin()
        assert bot.wait() == 0
    finally:
        bot.kill()
