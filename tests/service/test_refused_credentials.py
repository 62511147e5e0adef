"""Refused credentials: a platform token refused at start is a configuration error (exit 2,
one line naming the setting, before systemd hears READY=1); one revoked while running turns
`/healthz` to 503 with the reason, is logged once a minute without a traceback, is not
hammered, and is taken up again by itself once it works. The LLM's and the transcription
service's keys: a warning at start, `/healthz` while refused. Real `lastword run` processes
against the loopback fakes of Telegram, Discord and the OpenAI API, with a real Redis."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from pydantic import SecretStr

from bot.config.settings import LLMSettings, MediaSettings
from bot.llm.openai import OpenAILLM
from bot.llm.transcribe import OpenAITranscriber
from bot.store.embedded import EmbeddedRedis
from bot.testing.conformance import check_refused_credentials, running_bot
from tests.support.discord_runs import bot_env as discord_env
from tests.support.fakes.discord_server import CLOSE_AUTHENTICATION_FAILED, FakeDiscord
from tests.support.fakes.loopback import free_port
from tests.support.fakes.openai_server import FakeOpenAI
from tests.support.fakes.platforms import DiscordPlatform, TelegramPlatform
from tests.support.fakes.telegram_server import DEFAULT_TOKEN, FakeTelegram
from tests.support.running import Running, run_env
from tests.support.telegram_runs import CHAT, bot_env

pytestmark = pytest.mark.timeout(90)

TELEGRAM_SETTING = "LASTWORD_TELEGRAM__TOKEN"
DISCORD_SETTING = "LASTWORD_DISCORD__TOKEN"
LLM_SETTING = "LASTWORD_LLM__API_KEY"
KEY = "sk-refused-test-4b1e-DO-NOT-LOG"
REVOKED = "Telegram refused LASTWORD_TELEGRAM__TOKEN"


@pytest.fixture
async def telegram() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram() as fake:
        yield fake


@pytest.fixture
async def discord_api() -> AsyncIterator[FakeDiscord]:
    async with FakeDiscord() as fake:
        yield fake


@pytest.fixture
async def provider() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI() as fake:
        fake.expected_api_key = KEY
        yield fake


@pytest.fixture
def notify(short_dir: Path) -> Iterator[socket.socket]:
    """A datagram socket standing in for systemd's `$NOTIFY_SOCKET`, read without blocking."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(short_dir / "notify"))
    sock.setblocking(False)
    yield sock
    sock.close()


def notified(sock: socket.socket) -> list[bytes]:
    """Every line the bot has sent on the notify socket so far."""
    lines: list[bytes] = []
    while True:
        try:
            lines += sock.recv(4096).split(b"\n")
        except BlockingIOError:
            return lines


async def eventually(check: Callable[[], Awaitable[bool]], what: str, within_s: float) -> None:
    deadline = time.monotonic() + within_s
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what} after {within_s:g}s")
        await asyncio.sleep(0.1)


async def health(port: int) -> tuple[int, dict[str, Any]]:
    """/healthz: its status and its checks (0 and {} while it does not answer)."""
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3)) as http,
            http.get(f"http://127.0.0.1:{port}/healthz") as response,
        ):
            body = await response.json()
            return response.status, dict(body["checks"])
    except aiohttp.ClientError:
        return 0, {}


def health_is(port: int, status: int, check: str, value: str) -> Callable[[], Awaitable[bool]]:
    async def now() -> bool:
        got_status, checks = await health(port)
        return got_status == status and value in str(checks.get(check))

    return now


@contextlib.asynccontextmanager
async def running(env: dict[str, str]) -> AsyncIterator[Running]:
    bot = await Running.start(env)
    try:
        yield bot
    finally:
        await bot.stop()


def errors_about(bot: Running, setting: str) -> list[str]:
    return [line for line in bot.log if " ERROR " in line and setting in line]


def assert_clean(bot: Running, secret: str) -> None:
    assert not any("Traceback" in line for line in bot.log), "".join(bot.log)
    assert not any(secret in line for line in bot.log), "a secret was logged"


# -- a platform token refused at start ---------------------------------------------------------


async def test_a_refused_telegram_token_ends_run_before_ready_with_one_line(
    server: EmbeddedRedis, telegram: FakeTelegram, short_dir: Path, notify: socket.socket
) -> None:
    telegram.refuse_token()
    env = bot_env(server, telegram, short_dir / "data", NOTIFY_SOCKET=notify.getsockname())
    bot = await Running.start(env)
    try:
        code = await bot.exited(30)
    finally:
        await bot.stop()
    assert code == 2
    assert b"READY=1" not in notified(notify)
    assert len(bot.log) == 1, bot.log
    [line] = bot.log
    assert line.startswith(f"lastword: configuration error: {TELEGRAM_SETTING}: "), line
    assert "getMe" in line and "@BotFather" in line, line
    assert_clean(bot, telegram.token)
    assert [call.method for call in telegram.calls] == ["getMe"]


async def test_a_refused_discord_token_ends_run_before_ready(
    server: EmbeddedRedis, discord_api: FakeDiscord, short_dir: Path, notify: socket.socket
) -> None:
    env = discord_env(
        server,
        discord_api,
        short_dir / "data",
        LASTWORD_DISCORD__TOKEN="not-the-token",
        NOTIFY_SOCKET=notify.getsockname(),
    )
    bot = await Running.start(env)
    try:
        code = await bot.exited(30)
    finally:
        await bot.stop()
    assert code == 2
    assert b"READY=1" not in notified(notify)
    named = [line for line in bot.log if DISCORD_SETTING in line]
    assert len(named) == 1 and named[0].startswith("lastword: configuration error: "), bot.log
    assert "Developer Portal" in named[0]
    assert_clean(bot, "not-the-token")
    # One login (GET /users/@me), refused: not tried again, and no gateway opened.
    assert [(r.method, r.path, r.status) for r in discord_api.requests] == [
        ("GET", "/users/@me", 401)
    ]
    assert not discord_api.gateway_connections


async def test_an_unreachable_platform_at_start_is_no_configuration_error(
    server: EmbeddedRedis, short_dir: Path, notify: socket.socket
) -> None:
    # Nothing listens there: the network, not the token. The bot starts and keeps trying.
    env = run_env("telegram", server.url, short_dir / "data") | {
        "LASTWORD_TELEGRAM__TOKEN": DEFAULT_TOKEN,
        "LASTWORD_TELEGRAM__API_URL": f"http://127.0.0.1:{free_port()}",
        "NOTIFY_SOCKET": notify.getsockname(),
        "LASTWORD_LOG_LEVEL": "INFO",
    }
    async with running(env) as bot:

        async def ready() -> bool:
            return b"READY=1" in notified(notify)

        await eventually(ready, "READY=1", within_s=30)
        assert bot.process.returncode is None
        assert bot.said("cannot reach Telegram") == 1


async def test_discord_away_at_start_is_reached_once_it_is_back(
    server: EmbeddedRedis, discord_api: FakeDiscord, short_dir: Path
) -> None:
    """The start-up check that could not reach Discord leaves no session open behind it, and
    the intake reaches Discord once it is back (a closed client could never log in again:
    "Session is closed")."""
    env = discord_env(server, discord_api, short_dir / "data", LASTWORD_LOG_LEVEL="INFO")
    await discord_api.stop()
    async with running(env) as bot:

        async def away() -> bool:
            return bot.said("cannot reach Discord") == 1

        await eventually(away, "the start-up check to find Discord away", within_s=30)
        await discord_api.start()
        await discord_api.wait_for_sessions(1, timeout=30)
        user = 7011
        await discord_api.user_sends(user, "back?")
        await discord_api.wait_for_bot_messages(discord_api.dm_channel(user), 1, timeout=20)
        for leak in ("Unclosed client session", "Session is closed"):
            assert not any(leak in line for line in bot.log), "".join(bot.log)


# -- a platform token revoked while running ----------------------------------------------------


async def test_a_telegram_token_revoked_while_running_is_reported_not_hammered(
    server: EmbeddedRedis, telegram: FakeTelegram, short_dir: Path
) -> None:
    port = free_port()
    env = bot_env(
        server,
        telegram,
        short_dir / "data",
        LASTWORD_METRICS_LISTEN=f"127.0.0.1:{port}",
        LASTWORD_LOG_LEVEL="INFO",
    )
    async with running(env) as bot:
        await eventually(health_is(port, 200, "adapter", "ok"), "a healthy bot", within_s=30)
        await telegram.wait_for_calls("getUpdates", 1, timeout=10)

        telegram.refuse_token()
        # Sent while the token is refused: Telegram keeps it until the bot may poll again.
        telegram.push_update(telegram.private_text_update(CHAT, CHAT, "still there?"))
        await eventually(
            health_is(port, 503, "adapter", REVOKED), "/healthz to name the token", within_s=15
        )
        polls = len(telegram.calls_to("getUpdates"))
        # A negative can only be watched for a while: backed off, not spinning.
        await asyncio.sleep(5)
        refused_polls = len(telegram.calls_to("getUpdates")) - polls
        assert refused_polls <= 3, f"{refused_polls} polls in 5 s with a refused token"
        status, checks = await health(port)
        assert status == 503 and checks["adapter"] == REVOKED, checks
        assert len(errors_about(bot, TELEGRAM_SETTING)) == 1, errors_about(bot, TELEGRAM_SETTING)

        telegram.refuse_token(False)
        await eventually(health_is(port, 200, "adapter", "ok"), "/healthz to recover", within_s=30)
        await telegram.wait_for_sent(1, timeout=30)
        assert bot.said(f"Telegram accepts {TELEGRAM_SETTING} again") == 1
        assert_clean(bot, telegram.token)


async def test_a_discord_token_revoked_while_running_is_reported_not_hammered(
    server: EmbeddedRedis, discord_api: FakeDiscord, short_dir: Path
) -> None:
    port = free_port()
    env = discord_env(
        server, discord_api, short_dir / "data", LASTWORD_METRICS_LISTEN=f"127.0.0.1:{port}"
    )
    user = 7007
    async with running(env) as bot:
        await eventually(health_is(port, 200, "adapter", "ok"), "a healthy bot", within_s=30)
        # The DM below comes over the gateway: it must be held before the token goes.
        await discord_api.wait_for_sessions(1, timeout=30)
        token = discord_api.token
        # Revoked: every REST call is answered 401 from now on.
        discord_api.token = "revoked"
        await discord_api.user_sends(user, "are you there?")
        await eventually(
            health_is(port, 503, "adapter", f"Discord refused {DISCORD_SETTING}"),
            "/healthz to name the token",
            within_s=20,
        )
        # Discord closes the gateway of a reset token too: the holder has to log in again.
        await discord_api.drop_connections(CLOSE_AUTHENTICATION_FAILED)

        def refused_logins() -> int:
            return sum(r.status == 401 for r in discord_api.requests_to("GET", "/users/@me"))

        await discord_api.wait_for(lambda: refused_logins() >= 1, timeout=10)
        logins = refused_logins()
        # A negative can only be watched for a while: backed off from 2 s, doubling, one more
        # login in these 5 s (two from 1 s); with no back-off, hundreds.
        await asyncio.sleep(5)
        more = refused_logins() - logins
        assert more <= 2, f"{more} logins in 5 s with a refused token"
        status, checks = await health(port)
        assert status == 503 and checks["adapter"] == f"Discord refused {DISCORD_SETTING}", checks
        assert len(errors_about(bot, DISCORD_SETTING)) == 1, errors_about(bot, DISCORD_SETTING)

        discord_api.token = token
        await discord_api.wait_for_bot_messages(discord_api.dm_channel(user), 1, timeout=40)
        await eventually(health_is(port, 200, "adapter", "ok"), "/healthz to recover", within_s=10)
        # discord.py's warnings about voice and guilds are no concern of a DM bot.
        noise = ("voice will NOT be supported", "Guilds intent")
        assert not any(n in line for line in bot.log for n in noise), "".join(bot.log)
        # The reply owed meanwhile waited as for an outage: no traceback, nothing given up.
        assert not any("Traceback" in line for line in bot.log), "".join(bot.log)
        assert not any("gave up" in line for line in bot.log), "".join(bot.log)
        assert not any(token in line for line in bot.log), "the token was logged"
        # Each refused login's session was closed, not left to the garbage collector.
        assert not bot.said("Unclosed client session"), "".join(bot.log)


async def test_a_gateway_that_refuses_a_token_rest_takes_is_not_hammered(
    server: EmbeddedRedis, discord_api: FakeDiscord, short_dir: Path
) -> None:
    # Each round logs in over REST (which passes) and is refused by the gateway (4004): the
    # rounds are backed off as the logins are.
    env = discord_env(server, discord_api, short_dir / "data")
    async with running(env) as bot:
        await discord_api.wait_for_sessions(1, timeout=30)
        discord_api.gateway_token = "reset"
        await discord_api.drop_connections(CLOSE_AUTHENTICATION_FAILED)
        await discord_api.wait_for(lambda: discord_api.refused_identifies >= 1, timeout=10)
        refused = discord_api.refused_identifies
        # Backed off from 2 s, doubling: one more round in these 5 s (two from 1 s); with no
        # back-off, hundreds.
        await asyncio.sleep(5)
        more = discord_api.refused_identifies - refused
        assert more <= 2, f"{more} refused IDENTIFYs in 5 s"
        discord_api.gateway_token = None
        await discord_api.wait_for_sessions(1, timeout=40)
        assert not any("Traceback" in line for line in bot.log), "".join(bot.log)


# -- the LLM's key ------------------------------------------------------------------------------


def llm_env(
    server: EmbeddedRedis,
    telegram: FakeTelegram,
    provider: FakeOpenAI,
    where: Path,
    key: str,
    port: int,
) -> dict[str, str]:
    return bot_env(
        server,
        telegram,
        where,
        LASTWORD_LLM__PROVIDER="openai",
        LASTWORD_LLM__BASE_URL=provider.base_url,
        LASTWORD_LLM__API_KEY=key,
        LASTWORD_LLM__MODEL="m",
        LASTWORD_LLM__RETRY_BASE_S="0.01",
        LASTWORD_METRICS_LISTEN=f"127.0.0.1:{port}",
        LASTWORD_LOG_LEVEL="INFO",
    )


async def test_an_llm_key_refused_at_start_is_a_warning_and_the_bot_runs(
    server: EmbeddedRedis, telegram: FakeTelegram, provider: FakeOpenAI, short_dir: Path
) -> None:
    port = free_port()
    wrong = "sk-wrong-key-DO-NOT-LOG"
    async with running(llm_env(server, telegram, provider, short_dir / "d", wrong, port)) as bot:
        await eventually(
            health_is(port, 503, "llm", f"refused {LLM_SETTING}"), "/healthz", within_s=30
        )
        warnings = [line for line in bot.log if " WARNING " in line and LLM_SETTING in line]
        assert len(warnings) == 1, bot.log
        _, checks = await health(port)
        assert checks["adapter"] == "ok", checks
        # The bot runs: a message still gets its reply, the apology.
        telegram.push_update(telegram.private_text_update(CHAT, CHAT, "hello?"))
        [sent] = await telegram.wait_for_sent(1, timeout=20)
        assert sent.text and "sorry" in sent.text.lower(), sent.text
        assert bot.process.returncode is None
        assert_clean(bot, wrong)


async def test_an_llm_key_revoked_while_running_turns_health_503(
    server: EmbeddedRedis, telegram: FakeTelegram, provider: FakeOpenAI, short_dir: Path
) -> None:
    port = free_port()
    async with running(llm_env(server, telegram, provider, short_dir / "d", KEY, port)) as bot:
        await eventually(health_is(port, 200, "llm", "ok"), "a healthy bot", within_s=30)
        provider.expected_api_key = "sk-the-new-key"
        telegram.push_update(telegram.private_text_update(CHAT, CHAT, "hello?"))
        [sent] = await telegram.wait_for_sent(1, timeout=20)
        assert sent.text and "sorry" in sent.text.lower(), sent.text
        status, checks = await health(port)
        assert status == 503, checks
        assert f"refused {LLM_SETTING}" in checks["llm"] and provider.base_url in checks["llm"]
        assert not any("Traceback" in line for line in bot.log)
        assert not any(KEY in line for line in bot.log)


async def test_an_llm_key_not_set_is_said_so(provider: FakeOpenAI) -> None:
    settings = LLMSettings(provider="openai", base_url=provider.base_url, model="m")
    llm = OpenAILLM(settings)
    await llm.probe(5)
    assert llm.key.reason is not None
    assert f"{LLM_SETTING} is not set" in llm.key.reason and "refused" not in llm.key.reason


async def test_a_key_is_accepted_again_once_fixed(
    provider: FakeOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    key = SecretStr("sk-x")
    llm = OpenAILLM(LLMSettings(provider="openai", base_url=provider.base_url, api_key=key))
    await llm.probe(5, level=logging.WARNING)
    await llm.probe(5)
    assert llm.key.reason is not None
    # Twice refused within the minute: said once.
    said = [r for r in caplog.records if LLM_SETTING in r.getMessage()]
    assert [r.levelno for r in said] == [logging.WARNING], said
    provider.expected_api_key = "sk-x"
    await llm.probe(5)
    assert llm.key.reason is None


async def test_a_refused_transcription_key_names_its_setting(provider: FakeOpenAI) -> None:
    media = MediaSettings(
        transcription_model="whisper-1",
        transcription_base_url=provider.base_url,
        transcription_api_key=SecretStr("sk-transcribe-wrong"),
    )
    transcriber = OpenAITranscriber(media, LLMSettings())
    await transcriber.probe(5)
    assert transcriber.key.reason is not None
    assert "refused LASTWORD_MEDIA__TRANSCRIPTION_API_KEY" in transcriber.key.reason


# -- the conformance kit's check of revoked credentials (g), on the built-in platforms ----------


class RevocableTelegram(TelegramPlatform):
    def refuse_credentials(self) -> None:
        self.fake.refuse_token()


class RevocableDiscord(DiscordPlatform):
    def refuse_credentials(self) -> None:
        self.fake.token = "revoked"


@pytest.mark.parametrize("make", [RevocableTelegram, RevocableDiscord], ids=["telegram", "discord"])
async def test_the_kit_checks_revoked_credentials(
    make: Callable[[], RevocableTelegram | RevocableDiscord], monkeypatch: pytest.MonkeyPatch
) -> None:
    platform = make()
    async with running_bot(platform, monkeypatch) as bot:
        await check_refused_credentials(bot, platform)
