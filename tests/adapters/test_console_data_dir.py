"""The console keeps to itself: `lastword run` on the console, with no LASTWORD_DATA_DIR set,
keeps its store in a folder of its own, so it starts beside a bot installed here with the same
default data directory; and a data directory that is taken is refused with the setting to
change and a directory that is free."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from bot.store.embedded import in_use
from tests.support.console import Bot, assert_no_server, run_bot, server_pids
from tests.support.fakes.telegram_server import FakeTelegram
from tests.support.running import Running, clean_environ

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def state(short_dir: Path) -> Iterator[Path]:
    """`XDG_STATE_HOME` of the user under test: the default data directory is in it. No
    embedded server may outlive the test."""
    path = short_dir / "state"
    path.mkdir()
    yield path
    folders = [*path.glob("lastword*"), *path.glob("lastword/console*")]

    def leftovers() -> list[int]:
        return [pid for folder in folders for pid in server_pids(folder)]

    # A bot killed (not stopped) leaves its server to end on the signal it gets then.
    deadline = time.monotonic() + 5
    while leftovers() and time.monotonic() < deadline:
        time.sleep(0.05)
    left = leftovers()
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert left == [], "an embedded server outlived its test"


def console(state: Path) -> Bot:
    """A console `lastword run` of the user whose state home is `state`, with no
    LASTWORD_DATA_DIR set."""
    return Bot(state / "data", default_dir=True, env={"XDG_STATE_HOME": str(state)})


@pytest.fixture
async def installed(state: Path) -> AsyncIterator[Path]:
    """A Telegram bot run by the same user with the default data directory, as an installed
    user unit runs (its `StateDirectory=lastword` is the same folder): the folder it uses."""
    async with FakeTelegram() as telegram:
        env = clean_environ() | {
            "XDG_STATE_HOME": str(state),
            "LASTWORD_PLATFORM": "telegram",
            "LASTWORD_TELEGRAM__TOKEN": telegram.token,
            "LASTWORD_TELEGRAM__API_URL": telegram.api_url,
            "LASTWORD_LLM__PROVIDER": "echo",
        }
        bot = await Running.start(env, cwd=state)
        folder = state / "lastword"
        try:
            await telegram.wait_for_calls("getUpdates", 1, timeout=20)
            assert in_use(folder), bot.log
            yield folder
        finally:
            await bot.stop()


async def test_the_console_starts_beside_an_installed_bot(installed: Path, state: Path) -> None:
    bot = console(state)
    try:
        await asyncio.to_thread(bot.write, "hello\n")
        lines = await asyncio.to_thread(bot.wait_lines, 1, 20)
        assert lines == ["You said: hello"], bot.stderr()
        bot.close_stdin()
        code = await asyncio.to_thread(bot.wait, 20)
    finally:
        bot.kill()
    assert code == 0, bot.stderr()
    # Its own store, apart from the installed bot's, which runs on untouched.
    assert (installed / "console" / "appendonlydir").is_dir()
    assert in_use(installed)
    assert_no_server(installed / "console")


def test_a_taken_data_directory_names_the_setting_and_a_free_one(state: Path) -> None:
    first = console(state)
    try:
        first.write("one\n")
        assert first.wait_lines(1) == ["You said: one"], first.stderr()
        taken = state / "lastword" / "console"
        second = console(state)
        second.close_stdin()
        code = second.wait()
        free = state / "lastword" / "console-2"
        assert code == 1, second.stderr()
        assert second.lines() == []
        assert f"another lastword is already using {taken}" in second.stderr()
        assert f"LASTWORD_DATA_DIR={free}" in second.stderr()
        # The directory suggested is one to use indeed, while the first still runs.
        code, lines, stderr = run_bot(
            state / "data", "three\n", timeout=20, XDG_STATE_HOME=str(state),
            LASTWORD_DATA_DIR=str(free),
        )  # fmt: skip
        assert (code, lines) == (0, ["You said: three"]), stderr
        first.close_stdin()
        assert first.wait(20) == 0, first.stderr()
    finally:
        first.kill()


def test_the_history_of_earlier_versions_is_pointed_to_not_moved(state: Path) -> None:
    old = state / "lastword"
    # What an earlier version's console wrote: its store in the data directory itself.
    code, lines, stderr = run_bot(old, "first\n", timeout=20)
    assert (code, lines) == (0, ["You said: first"]), stderr
    kept = sorted(p.name for p in (old / "appendonlydir").iterdir())
    bot = console(state)
    bot.write("second\n")
    bot.close_stdin()
    try:
        assert bot.wait(20) == 0, bot.stderr()
    finally:
        bot.kill()
    assert bot.lines() == ["You said: second"]
    assert f"those of earlier versions stay in {old}" in bot.stderr()
    assert sorted(p.name for p in (old / "appendonlydir").iterdir()) == kept
    assert (old / "console" / "appendonlydir").is_dir()
    # Said once: the console's own folder exists from now on.
    bot = console(state)
    bot.close_stdin()
    try:
        assert bot.wait(20) == 0, bot.stderr()
    finally:
        bot.kill()
    assert "earlier versions" not in bot.stderr()
