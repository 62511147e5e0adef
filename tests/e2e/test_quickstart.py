"""The README's Quickstart, followed as written, against the fakes: the commands and the
`./.env` lines are read from README.md itself, so a Quickstart that drifts from what works
fails here.

A reader pastes their own key, endpoint and token over the README's placeholders; the test
pastes the fakes'. The one thing a reader never writes, the address of Telegram's or
Discord's API, is the network the fakes stand in for, so it goes in the environment. The
steps run in a directory of their own (the embedded store under it), with the tests' venv as
the README's `.venv`.
"""

from __future__ import annotations

import asyncio
import re
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.fakes.discord_server import FakeDiscord
from tests.support.fakes.openai_server import FakeOpenAI, ToolPolicy
from tests.support.fakes.telegram_server import FakeTelegram
from tests.support.running import Running, clean_environ, start_within_s

PROJECT = Path(__file__).resolve().parents[2]
VENV = Path(sys.executable).parent.parent
HEREDOC = re.compile(r"^cat (>>?) (\S+) <<'EOF'$")
USER = 4242
OPENAI_KEY = "sk-quickstart-test"


def quickstart() -> dict[str, list[str]]:
    """The Quickstart's shell blocks, by the heading they are under."""
    readme = (PROJECT / "README.md").read_text()
    section = readme.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    found: dict[str, list[str]] = {}
    heading = "Quickstart"
    for part in re.split(r"^(### .*)$", section, flags=re.M):
        if part.startswith("### "):
            heading = part.removeprefix("### ").strip()
            continue
        for block in re.findall(r"```sh\n(.*?)\n\s*```", part, flags=re.S):
            found.setdefault(heading, []).append(re.sub(r"^ {3}", "", block, flags=re.M))
    return found


@dataclass
class Reader:
    """Someone following the Quickstart in `home`, with their own key, URL and tokens."""

    home: Path
    values: dict[str, str]
    network: dict[str, str]

    @property
    def env(self) -> dict[str, str]:
        return clean_environ() | {"XDG_STATE_HOME": str(self.home / "state")} | self.network

    async def follow(self, block: str) -> list[str]:
        """Carry out a block: files written as its heredocs say (the reader's values over the
        placeholders), commands run; `lastword run` is returned for the caller to start."""
        lines = iter(block.splitlines())
        started = []
        for line in lines:
            heredoc = HEREDOC.match(line.strip())
            if heredoc:
                body = [self._pasted(text) for text in iter(lines.__next__, "EOF")]
                mode = "a" if heredoc.group(1) == ">>" else "w"
                with (self.home / heredoc.group(2)).open(mode) as file:
                    file.write("\n".join(body) + "\n")
            elif line.strip().endswith("lastword run"):
                started.append(line.strip())
            elif line.strip():
                await self._run(line.strip())
        return started

    def _pasted(self, line: str) -> str:
        name = line.partition("=")[0]
        return f"{name}={self.values[name]}" if name in self.values else line

    async def _run(self, command: str) -> None:
        """`command` in a process of its own, the fakes answering meanwhile (they share this
        test's event loop)."""
        if command.startswith(".venv/bin/pip install"):
            # No network here: the package must already be in the tests' venv, which the
            # test extras install; pip then only confirms it.
            command += " --no-index"
        process = await asyncio.create_subprocess_exec(
            "bash",
            "-c",
            command.replace(".venv/", f"{VENV}/"),
            cwd=self.home,
            env=self.env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        output, _ = await asyncio.wait_for(process.communicate(), 120)
        assert process.returncode == 0, f"{command}:\n{output.decode()}"

    def start_within_s(self) -> float:
        """How long the bot may take to reach its platform, its MCP servers in `./.env` too."""
        lines = (self.home / ".env").read_text().splitlines()
        written = dict(line.split("=", 1) for line in lines if "=" in line)
        return start_within_s(self.env | written)

    @asynccontextmanager
    async def running(self) -> AsyncIterator[Running]:
        bot = await Running.start(self.env, cwd=self.home, fresh=True)
        try:
            yield bot
        finally:
            if bot.process.returncode is None:
                await bot.terminate()

    async def ask_on_discord(self, discord: FakeDiscord, text: str) -> str:
        """The bot started as the Quickstart starts it, asked `text` in a DM: its reply."""
        async with self.running():
            await discord.wait_for_sessions(1, timeout=self.start_within_s())
            await discord.user_sends(USER, text)
            channel = discord.dm_channel(USER)
            await discord.wait_for_bot_messages(channel, 1, timeout=30)
        [reply] = discord.bot_messages(channel)
        return str(reply["content"])


@pytest.fixture
async def fakes() -> AsyncIterator[tuple[FakeOpenAI, FakeTelegram, FakeDiscord]]:
    async with FakeOpenAI() as provider, FakeTelegram() as telegram, FakeDiscord() as discord:
        yield provider, telegram, discord


def reader(home: Path, fakes: tuple[FakeOpenAI, FakeTelegram, FakeDiscord]) -> Reader:
    provider, telegram, discord = fakes
    values = {
        "OPENAI_API_KEY": OPENAI_KEY,
        "OPENAI_BASE_URL": provider.base_url,
        "LASTWORD_LLM__MODEL": "fake-model",
        "LASTWORD_TELEGRAM__TOKEN": telegram.token,
        "LASTWORD_DISCORD__TOKEN": discord.token,
    }
    network = {
        "LASTWORD_TELEGRAM__API_URL": telegram.api_url,
        "LASTWORD_DISCORD__API_URL": discord.api_url,
        "LASTWORD_DISCORD__GATEWAY_URL": discord.gateway_url,
    }
    return Reader(home, values, network)


def test_the_quickstart_has_the_steps_this_test_follows() -> None:
    steps = quickstart()
    assert len(steps["Quickstart"]) == 3
    assert {"The same on Discord", "Give it a tool"} <= set(steps)


async def test_the_telegram_quickstart_reaches_the_model(
    short_dir: Path, fakes: tuple[FakeOpenAI, FakeTelegram, FakeDiscord]
) -> None:
    provider, telegram, _ = fakes
    you = reader(short_dir, fakes)
    started = []
    for block in quickstart()["Quickstart"]:
        started += await you.follow(block)
    assert started == [".venv/bin/lastword run"]
    async with you.running():
        # Started as an operator starts it (a fresh interpreter: seconds of CPU on a loaded
        # machine), it is given its start's bound to reach Telegram before the reply's.
        await telegram.wait_for_calls("getUpdates", 1, timeout=you.start_within_s())
        telegram.push_update(telegram.private_text_update(USER, USER, "hello there"))
        [reply] = await telegram.wait_for_sent(1, timeout=30)
    assert reply.text == "You said: hello there"
    [request] = provider.requests
    assert request.api_key == OPENAI_KEY


async def test_the_discord_quickstart_reaches_the_model(
    short_dir: Path, fakes: tuple[FakeOpenAI, FakeTelegram, FakeDiscord]
) -> None:
    provider, _, discord = fakes
    you = reader(short_dir, fakes)
    steps = quickstart()
    await you.follow(steps["Quickstart"][0])
    [block] = steps["The same on Discord"]
    assert await you.follow(block) == [".venv/bin/lastword run"]
    assert await you.ask_on_discord(discord, "hello there") == "You said: hello there"
    assert [r.api_key for r in provider.requests] == [OPENAI_KEY]


async def test_the_mcp_step_gives_the_model_the_tools_answer(
    short_dir: Path, fakes: tuple[FakeOpenAI, FakeTelegram, FakeDiscord]
) -> None:
    provider, _, discord = fakes
    provider.reply = ToolPolicy(
        tool="get_current_time",
        arguments='{"timezone": "Asia/Tokyo"}',
        answer="The tool said: {result}",
    )
    you = reader(short_dir, fakes)
    steps = quickstart()
    await you.follow(steps["Quickstart"][0])
    await you.follow(steps["The same on Discord"][0])
    [block] = steps["Give it a tool"]
    assert await you.follow(block) == [".venv/bin/lastword run"]
    reply = await you.ask_on_discord(discord, "what time is it in Tokyo?")
    assert reply.startswith("The tool said:")
    assert "Asia/Tokyo" in reply
