"""Operating lastword: systemd's notify protocol and watchdog, the graceful stop with its grace
period, SIGHUP reload, /healthz and /metrics, `lastword status`, `lastword doctor`,
structured logs and systemd credentials. Every test runs the real `lastword` process."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from redis.asyncio import Redis

from bot.store import Acquired, Keys
from bot.store.embedded import EmbeddedRedis
from tests.support.builders import message
from tests.support.console import Bot, clean_env, wait_ready
from tests.support.factories import SettingsFactory
from tests.support.fakes.loopback import free_port
from tests.support.fakes.openai_server import FakeOpenAI
from tests.support.fakes.telegram_server import FakeTelegram, post_update
from tests.support.operations import lastword
from tests.support.running import START_S, Running
from tests.support.waits import eventually, settled

pytestmark = pytest.mark.timeout(60)

CHAT = 4242
TOKEN = "123456789:AAFakeTelegramTokenForTests0123456789"


def receive(sock: socket.socket, wanted: bytes) -> list[bytes]:
    """Datagrams from the bot until one carries `wanted`; all of them, in order."""
    seen: list[bytes] = []
    while True:
        datagram = sock.recv(4096)
        seen.append(datagram)
        if wanted in datagram.split(b"\n"):
            return seen


def stop_as_systemd(bot: Bot, sock: socket.socket) -> list[bytes]:
    """SIGTERM, as systemd stops the unit: the datagrams until STOPPING=1, after which the bot
    must exit 0."""
    bot.process.send_signal(signal.SIGTERM)
    seen = receive(sock, b"STOPPING=1")
    assert bot.wait(10) == 0, bot.stderr()
    return seen


# -- systemd ---------------------------------------------------------------------------------


def test_notify_ready_status_watchdog_then_stopping(
    data_dir: Path, notify_socket: socket.socket
) -> None:
    bot = Bot(
        data_dir,
        NOTIFY_SOCKET=notify_socket.getsockname(),
        # WatchdogSec=1s: a ping every half second.
        WATCHDOG_USEC="1000000",
    )
    try:
        wait_ready(notify_socket)
        seen = receive(notify_socket, b"WATCHDOG=1")
        pings_started = time.monotonic()
        receive(notify_socket, b"WATCHDOG=1")
        assert time.monotonic() - pings_started < 1.0  # at half of WatchdogSec, not slower
        assert any(d.startswith(b"STATUS=cycles running: 0") for d in seen), seen
        stop_as_systemd(bot, notify_socket)
    finally:
        bot.kill()


def test_under_systemd_start_up_waits_for_a_redis_that_comes_up(
    data_dir: Path, notify_socket: socket.socket, short_dir: Path
) -> None:
    late = EmbeddedRedis(short_dir / "late")
    bot = Bot(data_dir, NOTIFY_SOCKET=notify_socket.getsockname(), LASTWORD_REDIS_URL=late.url)
    try:
        # Not reachable yet: the service says what it waits for instead of failing.
        waiting = receive(notify_socket, b"STATUS=waiting for Redis at " + late.url.encode())
        assert not any(b"READY=1" in d for d in waiting)
        assert bot.process.poll() is None
        late.start()
        wait_ready(notify_socket)
        bot.write("hello\n")
        assert bot.wait_lines(1) == ["You said: hello"]
        bot.close_stdin()
        assert bot.wait(10) == 0
    finally:
        bot.kill()
        late.stop()


def test_no_watchdog_pings_for_another_process(
    data_dir: Path, notify_socket: socket.socket
) -> None:
    # systemd sets WATCHDOG_PID to the main process; a child that inherits it must not ping.
    bot = Bot(
        data_dir,
        NOTIFY_SOCKET=notify_socket.getsockname(),
        WATCHDOG_USEC="200000",
        WATCHDOG_PID="1",
    )
    try:
        wait_ready(notify_socket)
        seen = stop_as_systemd(bot, notify_socket)
    finally:
        bot.kill()
    assert not any(b"WATCHDOG=1" in d for d in seen)


# -- SIGTERM during generation, with two replicas on Telegram ----------------------------------


@pytest.fixture
async def telegram() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram(TOKEN) as fake:
        yield fake


@pytest.fixture
async def provider() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI() as fake:
        fake.reply = lambda request: "Answer: " + request.last_user_text
        yield fake


def telegram_env(
    server: EmbeddedRedis, telegram: FakeTelegram, provider: FakeOpenAI, where: Path, **extra: str
) -> dict[str, str]:
    return clean_env(
        where,
        LASTWORD_PLATFORM="telegram",
        LASTWORD_REDIS_URL=server.url,
        LASTWORD_TELEGRAM__TOKEN=telegram.token,
        LASTWORD_TELEGRAM__API_URL=telegram.api_url,
        LASTWORD_LLM__PROVIDER="openai",
        LASTWORD_LLM__BASE_URL=provider.base_url,
        LASTWORD_LLM__API_KEY="sk-ops-test",
        LASTWORD_LLM__MODEL="m",
        LASTWORD_DEBOUNCE__QUIET_MS="200",
        LASTWORD_LOG_LEVEL="INFO",
        **extra,
    )


async def start(env: dict[str, str], name: str) -> Running:
    replica = {**env, "LASTWORD_REPLICA_ID": name}
    return await Running.start(replica, cwd=Path(env["LASTWORD_DATA_DIR"]).parent)


@pytest.mark.parametrize("finish", [True, False], ids=["finishes-in-grace", "handed-back"])
async def test_sigterm_during_generation_answers_exactly_once(
    server: EmbeddedRedis,
    redis: Redis,
    telegram: FakeTelegram,
    provider: FakeOpenAI,
    short_dir: Path,
    finish: bool,
) -> None:
    # The first generation takes 2 s; the grace period is longer (it finishes) or shorter
    # (the conversation is handed back, and the other replica answers).
    provider.delay_for = lambda request: 2.0 if len(provider.requests) == 1 else 0.0
    grace = "5" if finish else "0.3"
    first = await start(
        telegram_env(server, telegram, provider, short_dir / "a", LASTWORD_SHUTDOWN_GRACE_S=grace),
        "a",
    )
    second: Running | None = None
    try:
        # "a" polls (it started alone), takes the message in and generates.
        telegram.push_update(telegram.private_text_update(CHAT, CHAT, "hello"))
        await provider.wait_for_request(timeout=15)
        second = await start(telegram_env(server, telegram, provider, short_dir / "b"), "b")
        code, took = await first.terminate()
        assert code == 0, "".join(first.log)
        if finish:
            assert took < 5
            assert len(telegram.sent_messages) == 1  # sent before it exited
        else:
            assert took < 0.3 + 2.5
            assert telegram.sent_messages == []
            assert any("handing their conversations back" in line for line in first.log)
        await telegram.wait_for_sent(1, timeout=15)

        await settled(redis, f"telegram:{CHAT}", version=1, within_s=10)
        assert [m.text for m in telegram.sent_messages] == ["Answer: hello"]
        # The poller role moved to "b" (it was free from the start of the stop), once b has
        # started: started just before the stop, on a loaded machine it may still be starting
        # when "a" has answered and gone.
        polls = second

        async def b_polls() -> bool:
            return polls.said("this replica polls Telegram") > 0

        took_role = eventually(b_polls, START_S, what="b to take the poller role")
        await second.until(took_role, "b to take the poller role")
    finally:
        await first.stop()
        if second is not None:
            await second.stop()


async def test_a_webhook_answers_503_while_the_replica_drains(
    server: EmbeddedRedis,
    redis: Redis,
    telegram: FakeTelegram,
    provider: FakeOpenAI,
    short_dir: Path,
) -> None:
    provider.delay_s = 1.5
    port = free_port()
    secret = "webhook-secret-for-drain"
    env = telegram_env(
        server,
        telegram,
        provider,
        short_dir / "w",
        LASTWORD_TELEGRAM__MODE="webhook",
        LASTWORD_TELEGRAM__WEBHOOK_LISTEN=f"127.0.0.1:{port}",
        LASTWORD_TELEGRAM__WEBHOOK_SECRET=secret,
        LASTWORD_SHUTDOWN_GRACE_S="5",
    )
    url = f"http://127.0.0.1:{port}/telegram"
    replica = await start(env, "w")
    try:

        async def listening() -> bool:
            try:
                await post_update(url, {"update_id": 1}, secret, timeout=1)
            except OSError:
                return False
            return True

        await replica.until(eventually(listening, within_s=START_S), "the webhook to listen")
        first = telegram.private_text_update(CHAT, CHAT, "before the stop")
        assert await post_update(url, first, secret) == 200
        await provider.wait_for_request(timeout=10)
        replica.process.send_signal(signal.SIGTERM)

        # Draining: refused with 503, so Telegram keeps the update and delivers it again.
        async def refused() -> bool:
            late = telegram.private_text_update(CHAT, CHAT, "during the stop")
            return await post_update(url, late, secret) == 503

        await eventually(refused, within_s=3)
        code, _ = await replica.terminate()
        assert code == 0, "".join(replica.log)
        assert [m.text for m in telegram.sent_messages] == ["Answer: before the stop"]
        v, w = await redis.hmget(Keys(f"telegram:{CHAT}").state, ["v", "w"])
        assert (v, w) == (b"1", b"1")  # the refused update was not taken in
    finally:
        await replica.stop()


def test_logs_are_logfmt_with_replica_and_conversation_and_never_a_secret(
    server: EmbeddedRedis, short_dir: Path
) -> None:
    """The Telegram token, read from a systemd credential, works, and never shows in the
    journal although httpx logs every request URL (which carries the token) at INFO."""

    async def scenario() -> str:
        async with FakeTelegram(TOKEN) as telegram, FakeOpenAI() as provider:
            credentials = short_dir / "credentials"
            credentials.mkdir()
            (credentials / "LASTWORD_TELEGRAM__TOKEN").write_text(TOKEN + "\n")
            env = telegram_env(server, telegram, provider, short_dir / "d")
            del env["LASTWORD_TELEGRAM__TOKEN"]
            env.update(
                CREDENTIALS_DIRECTORY=str(credentials),
                LASTWORD_LOG_FORMAT="logfmt",
                LASTWORD_LOG_LEVEL="DEBUG",
            )
            replica = await start(env, "ops-1")
            try:
                telegram.push_update(telegram.private_text_update(CHAT, CHAT, "hi"))
                await telegram.wait_for_sent(1, timeout=15)
                code, _ = await replica.terminate()
                assert code == 0
            finally:
                await replica.stop()
            return "".join(replica.log)

    log = asyncio.run(scenario())
    lines = [line for line in log.splitlines() if line]
    assert lines
    assert TOKEN not in log and TOKEN.split(":")[1] not in log
    assert "sk-ops-test" not in log
    for line in lines:
        assert line.startswith("ts=") and " replica=ops-1 " in line, line
    cycle = [line for line in lines if "tokens for telegram:" in line]
    assert cycle and all(f"conversation=telegram:{CHAT}" in line for line in cycle)


# -- SIGHUP ------------------------------------------------------------------------------------


def test_sighup_reloads_what_can_change_and_says_what_cannot(
    data_dir: Path, notify_socket: socket.socket, short_dir: Path
) -> None:
    config = short_dir / "lastword.toml"
    config.write_text('[llm]\nsystem_prompt = "one"\n')
    bot = Bot(
        data_dir,
        NOTIFY_SOCKET=notify_socket.getsockname(),
        LASTWORD_CONFIG=str(config),
        LASTWORD_LOG_LEVEL="INFO",
    )
    try:
        wait_ready(notify_socket)
        config.write_text(
            '[llm]\nsystem_prompt = "two"\n[access]\nrate_per_minute = 5\n'
            f'[discord]\napi_url = "http://127.0.0.1:{free_port()}/api/v10"\n'
        )
        bot.process.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while "reloaded settings" not in bot.stderr() and time.monotonic() < deadline:
            time.sleep(0.05)
        bot.write("still here\n")
        bot.wait_lines(1)
        bot.close_stdin()
        assert bot.wait(10) == 0
    finally:
        bot.kill()
    log = bot.stderr()
    assert "reloaded settings; changed: access.rate_per_minute, llm.system_prompt" in log
    assert "only taken on after a restart: discord.api_url" in log


# -- /healthz and /metrics ---------------------------------------------------------------------


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not exposed")


def test_metrics_and_health_after_a_burst(
    server: EmbeddedRedis, data_dir: Path, notify_socket: socket.socket
) -> None:
    port = free_port()
    bot = Bot(
        data_dir,
        NOTIFY_SOCKET=notify_socket.getsockname(),
        LASTWORD_METRICS_LISTEN=f"127.0.0.1:{port}",
        LASTWORD_REDIS_URL=server.url,
    )
    try:
        wait_ready(notify_socket)
        status, body = get(f"http://127.0.0.1:{port}/healthz")
        assert status == 200 and json.loads(body)["status"] == "ok"
        bot.write("a\nb\na\n")
        assert bot.wait_lines(1) == ["You said: a / b / a"]
        # The reply is out; the commit follows at once.
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            status, text = get(f"http://127.0.0.1:{port}/metrics")
            if metric(text, "lastword_replies_total") == 1:
                break
            time.sleep(0.05)
        assert metric(text, "lastword_replies_total") == 1, "the reply was never counted"
        assert metric(text, "lastword_messages_ingested_total") == 3
        assert metric(text, "lastword_windows_opened_total") == 1
        assert metric(text, "lastword_cycles_total") >= 1
        assert metric(text, "lastword_reply_parts_total") == 1
        assert metric(text, "lastword_lease_acquisitions_total") >= 1
        assert metric(text, "lastword_llm_completion_tokens_total") > 0
        assert metric(text, "lastword_wakeup_lateness_seconds_count") >= 1
        assert metric(text, "lastword_llm_latency_seconds_count") == 1
        assert 'lastword_wakeup_lateness_seconds_bucket{le="+Inf"}' in text
        # OpenTelemetry's GenAI client histograms, under their own names: one request.
        series = {
            line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("gen_ai_client_") and "_count{" in line
        }
        tokens = [v for k, v in series.items() if 'gen_ai_token_type="output"' in k]
        durations = [v for k, v in series.items() if "operation_duration_seconds_count" in k]
        assert (tokens, durations) == ([1.0], [1.0]), series
        assert any('gen_ai_provider_name="echo"' in key for key in series), series

        # Redis gone: the health check says so, and the process stays up.
        server.stop()
        status, body = get(f"http://127.0.0.1:{port}/healthz")
        assert status == 503
        assert json.loads(body)["checks"]["redis"].startswith("unreachable")
        assert bot.process.poll() is None
    finally:
        bot.process.send_signal(signal.SIGTERM)
        bot.wait(10)
        bot.kill()


def lag_samples_over(text: str, bound: str) -> float:
    """How many of the loop's lag samples were over `bound` seconds (a bucket's `le`)."""
    name = "lastword_event_loop_lag_seconds"
    return metric(text, f"{name}_count") - metric(text, f'{name}_bucket{{le="{bound}"}}')


def test_the_event_loop_lag_is_exported_and_a_stall_shows_in_it(
    server: EmbeddedRedis, data_dir: Path, notify_socket: socket.socket
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    bot = Bot(
        data_dir,
        NOTIFY_SOCKET=notify_socket.getsockname(),
        LASTWORD_METRICS_LISTEN=f"127.0.0.1:{port}",
        LASTWORD_REDIS_URL=server.url,
    )
    try:
        wait_ready(notify_socket)
        _, before = get(url)
        assert metric(before, "lastword_event_loop_lag_recent_seconds") >= 0
        # The whole process stopped for a second: its loop runs the next tick that late.
        bot.process.send_signal(signal.SIGSTOP)
        time.sleep(1.0)
        bot.process.send_signal(signal.SIGCONT)
        deadline = time.monotonic() + 10
        while True:
            _, after = get(url)
            if lag_samples_over(after, "0.5") > lag_samples_over(before, "0.5"):
                break
            assert time.monotonic() < deadline, "the stall never showed in the lag histogram"
            time.sleep(0.05)
        lag_sum = "lastword_event_loop_lag_seconds_sum"
        assert metric(after, lag_sum) - metric(before, lag_sum) >= 0.9
        assert metric(after, "lastword_event_loop_lag_seconds_count") > metric(
            before, "lastword_event_loop_lag_seconds_count"
        )
    finally:
        bot.process.send_signal(signal.SIGCONT)
        bot.process.send_signal(signal.SIGTERM)
        bot.wait(10)
        bot.kill()


# -- lastword status and doctor ------------------------------------------------------------------


async def test_status_json_shows_a_held_lease_and_an_unanswered_conversation(
    server: EmbeddedRedis, make_settings: SettingsFactory, redis: Redis, short_dir: Path
) -> None:
    from bot.service.app import make_store

    # A lease that outlives both status runs, however slow the machine starts them.
    settings = make_settings(debounce={"quiet_ms": 0, "max_wait_ms": 0}, lease={"ttl_ms": 60_000})
    store = make_store(settings, redis)
    for n in (1, 2):
        await store.ingest(message(f"hi {n}", n=n, conversation="telegram:77", user="u77"))
    grant = await store.acquire("telegram:77", "replica-9/abc")
    assert isinstance(grant, Acquired), grant
    await store.ingest(message("waiting", n=1, conversation="telegram:78", user="u78"))

    env = clean_env(short_dir / "s", LASTWORD_REDIS_URL=server.url)
    result = await asyncio.to_thread(lastword, "status", "--json", env=env)
    assert result.returncode == 0, result.stderr
    status = json.loads(result.stdout)
    waiting = {c["conversation"]: c for c in status["conversations"]}
    assert waiting["telegram:77"]["unanswered"] == 2
    assert waiting["telegram:78"]["unanswered"] == 1
    [lease] = status["leases"]
    assert lease["conversation"] == "telegram:77" and lease["holder"] == "replica-9"

    table = await asyncio.to_thread(lastword, "status", env=env)
    assert table.returncode == 0 and "replica-9" in table.stdout


def test_status_with_redis_down_is_one_clear_line(short_dir: Path) -> None:
    env = clean_env(
        short_dir / "s", LASTWORD_REDIS_URL=f"redis://:pw-SECRET@127.0.0.1:{free_port()}/0"
    )
    result = lastword("status", env=env)
    assert result.returncode == 1
    assert result.stderr.startswith("lastword: cannot read the status from Redis")
    assert "pw-SECRET" not in result.stderr + result.stdout


def test_status_without_a_running_embedded_store_says_so(short_dir: Path) -> None:
    result = lastword("status", env=clean_env(short_dir / "nothing-here"))
    assert result.returncode == 1
    assert result.stderr.startswith("lastword: no bot is running with its embedded store")


def test_doctor_reports_a_wrong_token_and_a_down_redis(short_dir: Path) -> None:
    async def scenario() -> subprocess.CompletedProcess[str]:
        async with FakeTelegram(TOKEN) as telegram:
            env = clean_env(
                short_dir / "d",
                LASTWORD_PLATFORM="telegram",
                LASTWORD_TELEGRAM__TOKEN="987654:WrongTokenForDoctor",
                LASTWORD_TELEGRAM__API_URL=telegram.api_url,
                LASTWORD_REDIS_URL=f"redis://127.0.0.1:{free_port()}/0",
            )
            return await asyncio.to_thread(lastword, "doctor", env=env)

    result = asyncio.run(scenario())
    assert result.returncode == 1
    out = result.stdout
    assert "✗ store: cannot reach Redis" in out
    assert "LASTWORD_TELEGRAM__TOKEN" in out and "✗ platform" in out
    assert "WrongTokenForDoctor" not in out
