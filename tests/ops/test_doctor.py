"""`lastword doctor`: each check against the real thing it checks, or a loopback fake of it.

The store is the test's real server; Telegram, Discord and the LLM are the loopback fakes,
driven through the same client libraries the bot uses. Every failure test asserts that the
report names the setting to fix, and none may leak a secret into the rendered output.
"""

from __future__ import annotations

import socket
import sys
import time
from collections.abc import AsyncIterator, Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from redis.asyncio import Redis

import adapters
import bot.store
from bot.config.settings import load_settings
from bot.ops import doctor
from bot.ops.check import Check
from bot.ops.doctor import MemoryPolicy, exit_code, memory_verdict, render, store_scripts
from bot.store.embedded import EmbeddedRedis
from tests.support import forked
from tests.support.doctor import (
    API_KEY,
    DISCORD_TOKEN,
    NAMES,
    TG_TOKEN,
    TG_WEBHOOK_SECRET,
    assert_no_secret,
    by_name,
    closed_port,
    llm_settings,
    run_checks,
)
from tests.support.factories import SettingsFactory
from tests.support.fakes.discord_server import FakeDiscord
from tests.support.fakes.loopback import LoopbackServer
from tests.support.fakes.openai_server import FAKE_MODEL_ID, FakeOpenAI
from tests.support.fakes.telegram_server import FakeTelegram

pytestmark = pytest.mark.timeout(20)


REDIS_PASSWORD = "SECRET-redis-pw-Lm55tr"


@pytest.fixture
async def telegram() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram(TG_TOKEN, bot_username="doctor_bot") as fake:
        yield fake


@pytest.fixture
async def discord_fake() -> AsyncIterator[FakeDiscord]:
    async with FakeDiscord(DISCORD_TOKEN, bot_username="doctorbot") as fake:
        yield fake


@pytest.fixture
def clean_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No LASTWORD_* variables, .env or lastword.toml from the developer's machine."""
    for name in list(__import__("os").environ):
        if name.startswith("LASTWORD_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    yield


class ChatOnlyServer(LoopbackServer):
    """An OpenAI-compatible server without `/models` (404), as some self-hosted ones are;
    answers chat completions, or 401 when `key` is not the one it was given."""

    def __init__(self, key: str) -> None:
        super().__init__()
        self.key = key
        self.bodies: list[dict[str, Any]] = []

    def _add_routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/chat/completions", self._chat)

    @property
    def base_url(self) -> str:
        return self.origin + "/v1"

    async def _chat(self, request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != f"Bearer {self.key}":
            error = {"message": "Incorrect API key provided", "type": "invalid_request_error"}
            return web.json_response({"error": error}, status=401)
        body = await request.json()
        self.bodies.append(body)
        return web.json_response(
            {
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "created": 0,
                "model": body["model"],
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "p"},
                        "finish_reason": "length",
                    }
                ],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }
        )


async def test_all_pass_with_telegram_openai_and_redis(
    make_settings: SettingsFactory, telegram: FakeTelegram, openai_fake: FakeOpenAI
) -> None:
    settings = make_settings(
        platform="telegram",
        telegram={"token": TG_TOKEN, "api_url": telegram.api_url},
        llm=llm_settings(openai_fake),
    )
    checks = await run_checks(settings)
    report = render(checks)

    assert [check.name for check in checks] == NAMES
    assert all(check.ok for check in checks), report
    assert exit_code(checks) == 0
    found = by_name(checks)
    assert "platform telegram" in found["settings"].detail
    assert "redis 7" in found["store"].detail or "valkey" in found["store"].detail
    assert found["scripts"].detail.startswith(f"{len(store_scripts())} scripts load")
    # A fresh server's defaults: noeviction and no limit.
    assert found["memory"].detail == "maxmemory-policy noeviction, no maxmemory"
    assert found["platform"].detail == f"telegram: @doctor_bot ({telegram.bot_user['id']})"
    assert f"model {FAKE_MODEL_ID} is listed" in found["llm"].detail
    assert [call.method for call in telegram.calls] == ["getMe"]
    assert "✗" not in report
    assert_no_secret(report)


@pytest.mark.parametrize("reads_all", [False, True])
async def test_with_groups_on_doctor_says_whether_telegrams_privacy_mode_hides_them(
    make_settings: SettingsFactory, reads_all: bool
) -> None:
    async with FakeTelegram(TG_TOKEN, can_read_all_group_messages=reads_all) as telegram:
        settings = make_settings(
            platform="telegram",
            telegram={"token": TG_TOKEN, "api_url": telegram.api_url},
            groups={"allowed": ["-1001"]},
        )
        found = await adapters.check(settings, 5)
    assert found.ok
    if reads_all:
        assert found.detail.endswith("privacy mode off: it reads every group message")
    else:
        assert "privacy mode on" in found.detail and "/setprivacy" in found.detail


async def test_no_secret_in_any_output(
    make_settings: SettingsFactory,
    server: EmbeddedRedis,
    redis: Redis,
    telegram: FakeTelegram,
    openai_fake: FakeOpenAI,
) -> None:
    await redis.config_set("requirepass", REDIS_PASSWORD)
    settings = make_settings(
        platform="telegram",
        redis_url=f"unix://{server.socket}?password={REDIS_PASSWORD}",
        telegram={
            "token": TG_TOKEN,
            "api_url": telegram.api_url,
            "mode": "webhook",
            "webhook_secret": TG_WEBHOOK_SECRET,
        },
        llm=llm_settings(openai_fake),
    )
    checks = await run_checks(settings)
    report = render(checks)

    # Every service took the secrets, so each was really used, and none is shown.
    assert all(check.ok for check in checks), report
    # The store as scheme, host, port and database: not even the name of its password.
    assert f"store unix://{server.socket}," in by_name(checks)["settings"].detail
    assert "password" not in by_name(checks)["settings"].detail
    assert_no_secret(report, REDIS_PASSWORD)


async def test_wrong_telegram_token_names_the_setting(
    make_settings: SettingsFactory, telegram: FakeTelegram
) -> None:
    wrong = "555000111:SECRET-wrong-token-Xy77"
    checks = await run_checks(
        make_settings(platform="telegram", telegram={"token": wrong, "api_url": telegram.api_url})
    )
    platform = by_name(checks)["platform"]
    report = render(checks)

    assert not platform.ok
    assert "Telegram refused LASTWORD_TELEGRAM__TOKEN" in platform.detail
    assert "@BotFather" in platform.fix
    assert exit_code(checks) == 1
    # python-telegram-bot's own error text quotes the token it was given.
    assert_no_secret(report, wrong, wrong.split(":", 1)[1])


async def test_unreachable_telegram_names_the_api_url(make_settings: SettingsFactory) -> None:
    api_url = f"http://127.0.0.1:{closed_port()}"
    checks = await run_checks(
        make_settings(platform="telegram", telegram={"token": TG_TOKEN, "api_url": api_url})
    )
    platform = by_name(checks)["platform"]

    assert not platform.ok
    assert f"cannot reach Telegram at {api_url}" in platform.detail
    assert "LASTWORD_TELEGRAM__API_URL" in platform.fix


def discord_settings(fake: FakeDiscord, token: str) -> dict[str, Any]:
    return {"token": token, "api_url": fake.api_url, "gateway_url": fake.gateway_url}


async def test_discord_token_and_message_content_intent(
    make_settings: SettingsFactory, discord_fake: FakeDiscord
) -> None:
    settings = make_settings(
        platform="discord", discord=discord_settings(discord_fake, DISCORD_TOKEN)
    )
    platform = by_name(await run_checks(settings))["platform"]

    assert platform.ok, platform
    assert platform.detail == (
        f"discord: doctorbot ({discord_fake.bot_id}), message content intent on"
    )


async def test_discord_without_message_content_intent_fails(
    make_settings: SettingsFactory, discord_fake: FakeDiscord
) -> None:
    discord_fake.enabled_privileged_intents = 0
    settings = make_settings(
        platform="discord", discord=discord_settings(discord_fake, DISCORD_TOKEN)
    )
    platform = by_name(await run_checks(settings))["platform"]

    assert not platform.ok
    assert "message content intent is off" in platform.detail
    assert "Developer Portal" in platform.fix


async def test_wrong_discord_token_names_the_setting(
    make_settings: SettingsFactory, discord_fake: FakeDiscord
) -> None:
    wrong = "SECRET.wrong-discord.Qw90"
    checks = await run_checks(
        make_settings(platform="discord", discord=discord_settings(discord_fake, wrong))
    )
    platform = by_name(checks)["platform"]

    assert not platform.ok
    assert "Discord refused LASTWORD_DISCORD__TOKEN" in platform.detail
    assert "LASTWORD_DISCORD__TOKEN" in platform.fix
    assert_no_secret(render(checks), wrong)


@pytest.mark.parametrize("where", ["tcp", "unix"])
async def test_down_redis_fails_clearly_and_quickly(
    make_settings: SettingsFactory, short_dir: Path, where: str
) -> None:
    if where == "tcp":
        url = f"redis://:{REDIS_PASSWORD}@127.0.0.1:{closed_port()}/0"
        shown = "redis://***@127.0.0.1:"
    else:
        url = f"unix://{short_dir}/no-such.sock"
        shown = url
    started = time.monotonic()
    checks = await run_checks(make_settings(redis_url=url))
    elapsed = time.monotonic() - started
    found = by_name(checks)
    report = render(checks)

    assert elapsed < 6
    assert not found["store"].ok
    assert found["store"].detail.startswith(f"cannot reach Redis at {shown}")
    assert found["store"].fix == "start Redis or fix LASTWORD_REDIS_URL"
    # What runs on the store is not checked, said once on the store's line.
    assert found["store"].detail.endswith(f"({doctor.NOT_CHECKED_ON_STORE})")
    assert not {"scripts", "memory", "durability"} & set(found)
    assert report.count("✗") == 1
    # The rest does not depend on the store and is still checked.
    assert found["platform"].ok and found["llm"].ok
    assert exit_code(checks) == 1
    assert_no_secret(report, REDIS_PASSWORD)


async def test_silent_redis_fails_within_the_timeout(make_settings: SettingsFactory) -> None:
    # Accepts connections (the kernel does, from the backlog) and never answers: a black hole.
    with socket.socket() as hole:
        hole.bind(("127.0.0.1", 0))
        hole.listen(8)
        url = f"redis://127.0.0.1:{hole.getsockname()[1]}/0"
        started = time.monotonic()
        checks = await run_checks(make_settings(redis_url=url), timeout_s=0.5)
        elapsed = time.monotonic() - started
    store = by_name(checks)["store"]

    assert elapsed < 3
    assert not store.ok
    assert store.detail == f"no answer within 0.5 s from {url} ({doctor.NOT_CHECKED_ON_STORE})"
    assert "LASTWORD_REDIS_URL" in store.fix


async def test_embedded_store_and_scripts(make_settings: SettingsFactory, short_dir: Path) -> None:
    data_dir = short_dir / "not-yet" / "data"
    checks = await run_checks(make_settings(redis_url=None, data_dir=data_dir))
    found = by_name(checks)

    assert found["store"].ok, found["store"]
    assert found["store"].detail.startswith("embedded ")
    assert f"data dir {data_dir} is writable" in found["store"].detail
    assert found["scripts"].ok, found["scripts"]
    assert found["scripts"].detail.endswith("scripts load on a temporary embedded server")
    # Read from the temporary server, which starts as lastword starts its own: the defaults.
    assert found["memory"] == Check(
        "memory", True, "maxmemory-policy noeviction, no maxmemory on a temporary embedded server"
    )
    # Doctor leaves nothing behind in the data dir, not even the directory.
    assert not data_dir.parent.exists()


async def test_unusable_data_dir_fails(make_settings: SettingsFactory, short_dir: Path) -> None:
    blocker = short_dir / "a-file"
    blocker.write_text("")
    checks = await run_checks(make_settings(redis_url=None, data_dir=blocker / "data"))
    store = by_name(checks)["store"]

    assert not store.ok
    assert f"{blocker} is not a directory" in store.detail
    assert "LASTWORD_DATA_DIR" in store.fix


# -- memory: the eviction policy ------------------------------------------------------------------


async def memory_check(make_settings: SettingsFactory, **overrides: Any) -> Check:
    checks = await run_checks(make_settings(**overrides))
    return by_name(checks)["memory"]


async def test_noeviction_with_a_limit_passes(make_settings: SettingsFactory, redis: Redis) -> None:
    await redis.config_set("maxmemory", 100 * 1024 * 1024)
    memory = await memory_check(make_settings)

    assert memory.ok, memory
    assert memory.detail.startswith("maxmemory-policy noeviction, maxmemory 100.0 MiB (")
    assert memory.detail.endswith(
        " used): at the limit writes fail with OOM and lastword holds messages"
    )


@pytest.mark.parametrize(
    "policy", ["allkeys-lru", "allkeys-lfu", "allkeys-random", "volatile-lru", "volatile-ttl"]
)
async def test_an_evicting_policy_with_a_limit_fails(
    make_settings: SettingsFactory, redis: Redis, policy: str
) -> None:
    await redis.config_set("maxmemory", 100 * 1024 * 1024)
    await redis.config_set("maxmemory-policy", policy)
    checks = await run_checks(make_settings())
    memory = by_name(checks)["memory"]

    assert not memory.ok
    assert memory.detail.startswith(f"maxmemory-policy {policy}, maxmemory 100.0 MiB (")
    assert "at the limit Redis evicts" in memory.detail
    assert "accepted but unanswered messages" in memory.detail
    # volatile-* is no safer: lastword's keys carry TTLs, so they are what it evicts.
    if policy.startswith("volatile-"):
        assert "keys with a TTL (leases, windows" in memory.detail
    else:
        assert "evicts any key" in memory.detail
    assert memory.fix.startswith(
        "CONFIG SET maxmemory-policy noeviction, and the same in redis.conf"
    )
    assert "OOM" in memory.fix and "503" in memory.fix
    assert exit_code(checks) == 1
    assert f"✗ memory: maxmemory-policy {policy}" in render(checks)


async def test_an_evicting_policy_without_a_limit_fails_too(
    make_settings: SettingsFactory, redis: Redis
) -> None:
    # Nothing is evicted today; one CONFIG SET maxmemory would start it without a word.
    await redis.config_set("maxmemory-policy", "allkeys-lru")
    memory = await memory_check(make_settings)

    assert not memory.ok
    assert memory.detail.startswith("maxmemory-policy allkeys-lru, no maxmemory: nothing is")
    assert "once maxmemory is set Redis evicts any key" in memory.detail
    assert "CONFIG SET maxmemory-policy noeviction" in memory.fix


async def test_fixing_the_policy_makes_the_check_pass(
    make_settings: SettingsFactory, redis: Redis
) -> None:
    await redis.config_set("maxmemory", 100 * 1024 * 1024)
    await redis.config_set("maxmemory-policy", "volatile-lru")
    assert not (await memory_check(make_settings)).ok

    await redis.config_set("maxmemory-policy", "noeviction")
    assert (await memory_check(make_settings)).ok


async def checks_as_restricted_user(
    make_settings: SettingsFactory, server: EmbeddedRedis, redis: Redis, *rules: str
) -> list[Check]:
    """Doctor's checks, connected as a user allowed everything but `rules` take away, as a
    managed Redis hands out."""
    await redis.acl_setuser(
        "lw", enabled=True, passwords=[f"+{REDIS_PASSWORD}"], keys=["*"], channels=["*"],
        commands=["+@all", *rules],
    )  # fmt: skip
    url = f"unix://{server.socket}?username=lw&password={REDIS_PASSWORD}"
    return await run_checks(make_settings(redis_url=url))


async def test_refused_config_reads_the_policy_from_info(
    make_settings: SettingsFactory, server: EmbeddedRedis, redis: Redis
) -> None:
    # ElastiCache and others rename or disable CONFIG; INFO still says what the policy is.
    await redis.config_set("maxmemory", 100 * 1024 * 1024)
    await redis.config_set("maxmemory-policy", "volatile-lru")
    checks = await checks_as_restricted_user(make_settings, server, redis, "-config")
    memory = by_name(checks)["memory"]

    assert by_name(checks)["store"].ok and by_name(checks)["scripts"].ok
    assert not memory.ok
    assert memory.detail.startswith("maxmemory-policy volatile-lru, maxmemory 100.0 MiB")
    assert_no_secret(render(checks), REDIS_PASSWORD)


async def test_info_without_memory_falls_back_to_config_get(
    make_settings: SettingsFactory, server: EmbeddedRedis, redis: Redis
) -> None:
    await redis.config_set("maxmemory-policy", "allkeys-lfu")
    # The store check's INFO sections stay allowed; INFO memory does not.
    checks = await checks_as_restricted_user(
        make_settings, server, redis, "-info", "+info|server", "+info|replication"
    )
    memory = by_name(checks)["memory"]

    assert by_name(checks)["store"].ok
    assert not memory.ok
    assert memory.detail.startswith("maxmemory-policy allkeys-lfu, no maxmemory")


async def test_a_policy_that_cannot_be_read_fails_with_a_manual_fix(
    make_settings: SettingsFactory, server: EmbeddedRedis, redis: Redis
) -> None:
    # The policy is the safe one, but doctor cannot see that: ✓ would claim a check not made.
    checks = await checks_as_restricted_user(
        make_settings, server, redis, "-config", "-info", "+info|server", "+info|replication"
    )
    memory = by_name(checks)["memory"]

    assert by_name(checks)["store"].ok
    assert not memory.ok
    assert memory.detail.startswith("could not check maxmemory-policy: INFO memory: ")
    assert "CONFIG GET: " in memory.detail and "no permissions" in memory.detail
    assert memory.fix.startswith("check by hand that maxmemory-policy is noeviction")
    assert exit_code(checks) == 1
    assert_no_secret(render(checks), REDIS_PASSWORD)


def test_memory_verdict_for_a_server_that_reports_no_policy() -> None:
    # A Redis-compatible server whose INFO memory and CONFIG GET answer without the policy.
    found = MemoryPolicy(
        None, 0, refused="INFO memory does not report it; CONFIG GET does not report it"
    )
    verdict = memory_verdict(found)

    assert not verdict.ok
    assert verdict.detail == (
        "could not check maxmemory-policy: INFO memory does not report it; "
        "CONFIG GET does not report it"
    )
    assert "check by hand" in verdict.fix


def test_every_store_script_is_checked() -> None:
    files = {
        entry.name.removesuffix(".lua")
        for entry in resources.files(bot.store).iterdir()
        if entry.name.endswith(".lua") and entry.name != "prelude.lua"
    }
    scripts = store_scripts()

    assert set(scripts) == files
    # Each as it runs, the prelude in front: the declared steps, /forget and /persona alike.
    assert scripts == {name: s.source for name, s in bot.store.scripts.ALL.items()}
    assert scripts["forget"].startswith((resources.files(bot.store) / "prelude.lua").read_text())


async def test_unknown_model_names_the_setting(
    make_settings: SettingsFactory, openai_fake: FakeOpenAI
) -> None:
    checks = await run_checks(make_settings(llm=llm_settings(openai_fake, model="no-such-model")))
    llm = by_name(checks)["llm"]

    assert not llm.ok
    assert f"model no-such-model is not listed at {openai_fake.base_url}" in llm.detail
    assert FAKE_MODEL_ID in llm.detail
    assert "LASTWORD_LLM__MODEL" in llm.fix


async def test_unreachable_llm_names_the_base_url(make_settings: SettingsFactory) -> None:
    base_url = f"http://127.0.0.1:{closed_port()}/v1"
    llm_values = {"provider": "openai", "base_url": base_url, "api_key": API_KEY}
    llm = by_name(await run_checks(make_settings(llm=llm_values)))["llm"]

    assert not llm.ok
    assert llm.detail == f"cannot connect to {base_url}"
    assert "LASTWORD_LLM__BASE_URL" in llm.fix


async def test_llm_without_models_endpoint_falls_back_to_one_token(
    make_settings: SettingsFactory,
) -> None:
    async with ChatOnlyServer(API_KEY) as chat:
        llm_values = {"provider": "openai", "base_url": chat.base_url, "api_key": API_KEY}
        llm = by_name(await run_checks(make_settings(llm=llm_values)))["llm"]

    assert llm.ok, llm
    assert "answered" in llm.detail and "(no /models)" in llm.detail
    [body] = chat.bodies
    assert body["max_tokens"] == 1


async def test_refused_api_key_names_the_setting(make_settings: SettingsFactory) -> None:
    async with ChatOnlyServer("the-right-key") as chat:
        llm_values = {"provider": "openai", "base_url": chat.base_url, "api_key": API_KEY}
        checks = await run_checks(make_settings(llm=llm_values))
    llm = by_name(checks)["llm"]

    assert not llm.ok
    assert "refused the API key" in llm.detail
    assert llm.fix == "fix LASTWORD_LLM__API_KEY"
    assert_no_secret(render(checks))


async def test_bad_config_is_the_only_check(
    clean_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LASTWORD_PLATFORM", "telegram")
    checks = await run_checks(load_settings)

    assert len(checks) == 1
    [settings] = checks
    assert settings.name == "settings" and not settings.ok
    assert "LASTWORD_TELEGRAM__TOKEN" in settings.detail
    # A configuration error, as `run` would exit with; one line, which names the fix.
    assert exit_code(checks) == 2
    assert render(checks) == f"✗ settings: {settings.detail}"
    assert render(checks).startswith("✗ settings: LASTWORD_TELEGRAM__TOKEN")


def test_render_shows_the_fix_under_a_failure_only() -> None:
    checks = [
        Check("store", True, "redis 7.2.4", fix="unused"),
        Check("llm", False, "cannot connect", fix="fix LASTWORD_LLM__BASE_URL"),
    ]

    assert render(checks) == (
        "✓ store: redis 7.2.4\n✗ llm: cannot connect\n    fix: fix LASTWORD_LLM__BASE_URL"
    )


async def test_console_and_echo_need_nothing(make_settings: SettingsFactory) -> None:
    found = by_name(await run_checks(make_settings()))

    assert found["platform"] == Check("platform", True, "console: no token needed")
    assert found["llm"] == Check("llm", True, "offline echo model")
    assert all(check.ok for check in found.values())


# MCP servers: each started, its tools listed and stopped, as a replica would.

MCP_SECRET = "SECRET-mcp-header-Wd40xq"


def mcp_time_server() -> dict[str, Any]:
    return {
        **forked.started_by_others("mcp_server_time", "--local-timezone", "UTC"),
        "env": {"SOME_TOKEN": MCP_SECRET},
    }


async def test_an_mcp_server_is_started_and_its_tools_counted(
    make_settings: SettingsFactory,
) -> None:
    settings = make_settings(tools={"mcp_servers": {"time": mcp_time_server()}})
    checks = await run_checks(settings)

    assert [check.name for check in checks] == [*NAMES, "mcp time"]
    assert checks[-1] == Check(
        "mcp time", True, f"{sys.executable}: 2 tools (get_current_time, convert_time)"
    )
    assert exit_code(checks) == 0
    assert_no_secret(render(checks), MCP_SECRET)


async def test_mcp_servers_that_fail_say_why_in_one_line(
    make_settings: SettingsFactory, short_dir: Path
) -> None:
    missing = str(short_dir / "no-such-server")
    url = f"http://127.0.0.1:{closed_port()}/mcp"
    # Only servers that fail: one that works needs its start-up time, which a loaded
    # machine stretches past a 2 s bound (it has a test of its own, above).
    servers = {
        "gone": {"command": missing, "args": ["--token", MCP_SECRET]},
        "web": {"url": url, "headers": {"Authorization": f"Bearer {MCP_SECRET}"}},
        # Started, but never answers.
        "mute": {"command": sys.executable, "args": ["-c", "import time; time.sleep(30)"]},
    }
    began = time.monotonic()
    settings = make_settings(tools={"mcp_servers": servers, "start_timeout_s": 2})
    checks = by_name(await run_checks(settings))
    # Side by side: the mute one's 2 s and its stop, not the sum of all.
    assert time.monotonic() - began < 12

    gone = checks["mcp gone"]
    assert not gone.ok
    assert gone.detail == (
        f"{missing}: FileNotFoundError: [Errno 2] No such file or directory: '{missing}'"
    )
    assert "LASTWORD_TOOLS__MCP_SERVERS" in gone.fix
    web = checks["mcp web"]
    assert not web.ok
    # Scheme, host and port only: a URL's path and query may hold a credential.
    assert web.detail.startswith(f"{url.removesuffix('/mcp')}/***: ")
    assert "LASTWORD_TOOLS__MCP_SERVERS" in web.fix
    assert checks["mcp mute"] == Check(
        "mcp mute", False, f"{sys.executable}: no tools listed within 2 s", gone.fix
    )
    report = render(list(checks.values()))
    assert_no_secret(report, MCP_SECRET)
    assert all("\n" not in check.detail for check in checks.values())
