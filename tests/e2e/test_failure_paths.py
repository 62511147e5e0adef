"""Failure paths of the core, with replica processes (``tests/support/replica.py``) and a real
server: an error reply the store did not expect, a platform that keeps failing, a commit refused
once, a notice that hangs, a sweep that meets garbage, and a conversation left idle past its
retention. Each test names the scenario; each fails without the fix it pins down.

The platform's failures are scripted through one control file that every replica reads at
each send (see ``tests/support/replica.py``).
"""

from __future__ import annotations

import asyncio
import itertools
import socket
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from redis._parsers.base import BaseParser
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from bot.message import InboundMessage
from bot.service.app import make_store
from bot.store import Keys, classify
from bot.store.embedded import EmbeddedRedis
from tests.support.factories import SettingsFactory
from tests.support.fakes.loopback import free_port
from tests.support.fakes.openai_server import FakeOpenAI
from tests.support.fakes.telegram_server import FakeTelegram, post_update
from tests.support.replica_fleet import Cluster, covering_reply, message
from tests.support.running import Running, clean_environ
from tests.support.waits import eventually, settled

pytestmark = pytest.mark.timeout(90)

CONVERSATION = "pipe:1"


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI(reply=covering_reply) as openai:
        yield openai


def control(short_dir: Path) -> Path:
    return short_dir / "send-control"


def cluster(
    server: EmbeddedRedis, fake: FakeOpenAI, short_dir: Path, size: int = 1, **env: str
) -> Cluster:
    return Cluster(
        server, fake, short_dir, size, env={"REPLICA_SEND_CONTROL": str(control(short_dir)), **env}
    )


async def logged(cluster: Cluster, name: str, text: str, times: int = 1) -> None:
    """Wait until replica `name` has logged `text` at least `times` times. (Its log is a
    file, not its stdout, so `Cluster.wait_for` would not look again when it grows.)"""

    def count() -> int:
        return cluster.replicas[name].log_path.read_text().count(text)

    async def enough() -> bool:
        return count() >= times

    async def seen() -> str:
        return f"logged {count()} times"

    await eventually(
        enough, within_s=10, what=f"{name} logging {text!r} {times} times", describe=seen
    )


async def write(cluster: Cluster, name: str, msg: InboundMessage) -> None:
    """Hand `msg` to a replica without waiting for it to be taken in."""
    stdin = cluster.replicas[name].process.stdin
    assert stdin is not None
    stdin.write(msg.to_json().encode() + b"\n")
    await stdin.drain()


async def test_redis_out_of_memory_holds_messages_until_it_has_room(
    server: EmbeddedRedis, redis: Redis, fake: FakeOpenAI, short_dir: Path
) -> None:
    # At maxmemory with noeviction every write is refused with OOM: not a connection error,
    # but just as transient. It must hold the message (not acknowledge it), not end the
    # process, and store it once there is room.
    async with cluster(server, fake, short_dir) as bots:
        await redis.config_set("maxmemory-policy", "noeviction")
        await redis.config_set("maxmemory", 1)
        try:
            await write(bots, "r0", message(1, 1))
            await logged(bots, "r0", "Redis answered OOM")
            assert not bots.of("ingested"), "taken in while Redis refused every write"
            assert bots.alive() == ["r0"]
        finally:
            await redis.config_set("maxmemory", 0)
        await bots.wait_for(lambda: len(bots.sent()) == 1, timeout=15, what="the reply")
        assert bots.sent()[0]["text"] == "covers c1m1"


async def test_a_commit_refused_once_is_retried_not_resent(
    server: EmbeddedRedis, redis: Redis, fake: FakeOpenAI, short_dir: Path
) -> None:
    # The reply is out; the commit meets OOM. Left for the next holder, the outbox would be
    # sent a second time. Retried while the lease holds, it goes through once there is room.
    control(short_dir).write_text("hold 300")
    async with cluster(server, fake, short_dir) as bots:
        await bots.deliver("r0", message(1, 1))
        await bots.wait_for(lambda: bool(bots.sent()), timeout=10, what="the reply")
        await redis.config_set("maxmemory-policy", "noeviction")
        await redis.config_set("maxmemory", 1)
        try:
            await logged(bots, "r0", "commit of pipe:1 failed")
        finally:
            await redis.config_set("maxmemory", 0)
        await settled(redis, CONVERSATION, within_s=5)
        # The commit that settled it took the outbox and the lease away in the same step:
        # nothing is left that a later holder could resend.
        keys = Keys(CONVERSATION)
        assert await redis.exists(keys.outbox, keys.lease) == 0
        # Stopped, the replica has printed everything, its last counters included: what was
        # sent is read whole, not while a line may still be in the pipe.
        assert await bots.terminate("r0") == 0
        assert [e["text"] for e in bots.sent()] == ["covers c1m1"]
        assert bots.stats("r0").get("resent", 0) == 0


async def test_a_permanent_send_error_gives_the_reply_up_and_the_next_message_is_answered(
    server: EmbeddedRedis, redis: Redis, fake: FakeOpenAI, short_dir: Path
) -> None:
    control(short_dir).write_text("permanent")
    async with cluster(server, fake, short_dir) as bots:
        await bots.deliver("r0", message(1, 1))
        await bots.wait_for(lambda: bool(bots.of("send_failed")), timeout=10, what="a send")
        # Given up at once: the messages count as answered, nothing is left to resend.
        await settled(redis, CONVERSATION, within_s=5)
        assert await redis.exists(Keys(CONVERSATION).outbox) == 0
        await bots.wait_for(
            lambda: bots.stats("r0").get("abandoned") == 1, timeout=5, what="the count"
        )
        assert "gave up the reply to pipe:1" in bots.replicas["r0"].log_path.read_text()
        assert len(bots.of("send_failed")) == 1

        control(short_dir).unlink()
        await bots.deliver("r0", message(1, 2))
        await bots.wait_for(lambda: bool(bots.sent()), timeout=10, what="the next reply")
        await settled(redis, CONVERSATION, within_s=5)
        # The new message is answered, and the given-up reply is never sent late.
        assert [e["text"] for e in bots.sent()] == ["covers c1m2"]


async def test_the_backoff_between_failed_sends_holds_across_three_replicas(
    server: EmbeddedRedis, redis: Redis, fake: FakeOpenAI, short_dir: Path
) -> None:
    # A platform that keeps failing is tried again 1, 2, 4... s later, whichever replica's
    # sweep looks; without the backoff in the store, three sweeping replicas tried it about
    # once a second each.
    control(short_dir).write_text("transient")
    async with cluster(server, fake, short_dir, size=3) as bots:
        await bots.deliver("r0", message(1, 1))
        await bots.wait_for(lambda: bool(bots.of("send_failed")), timeout=10, what="a send")
        first = float(bots.of("send_failed")[0]["t"])
        await asyncio.sleep(8 - (time.time() - first))
        attempts = [float(e["t"]) for e in bots.of("send_failed")]
        # 0, 1, 3 and 7 s: four attempts in 8 s, from whichever replicas.
        assert 3 <= len(attempts) <= 4, attempts
        gaps = [b - a for a, b in itertools.pairwise(attempts)]
        for gap, least in zip(gaps, (1.0, 2.0, 4.0), strict=False):
            assert gap >= least * 0.9, f"attempts {gaps} s apart"
        assert not bots.sent()

        # The platform recovers: the reply goes out once, at the next attempt.
        control(short_dir).unlink()
        await bots.wait_for(lambda: bool(bots.sent()), timeout=15, what="the reply")
        await settled(redis, CONVERSATION, within_s=5)
        assert [e["text"] for e in bots.sent()] == ["covers c1m1"]


async def test_a_notice_that_hangs_does_not_stall_intake(
    server: EmbeddedRedis, redis: Redis, fake: FakeOpenAI, short_dir: Path
) -> None:
    # A refusal notice to a stranger takes 5 s to go out (a 429, a slow platform). Before,
    # it was sent inside ingest, so the poller or gateway waited for it.
    control(short_dir).write_text("hold 5000")
    async with cluster(server, fake, short_dir, LASTWORD_ACCESS__ALLOWED_USERS="u1") as bots:
        began = time.monotonic()
        assert not await bots.deliver("r0", message(2, 1))  # u2: refused, notice hangs
        assert await bots.deliver("r0", message(1, 1))
        assert time.monotonic() - began < 2.0
        await bots.wait_for(
            lambda: any(e["conversation"] == "pipe:2" for e in bots.sent()),
            timeout=5,
            what="the notice to go out meanwhile",
        )


async def test_the_sweeper_survives_an_error_it_did_not_expect(
    server: EmbeddedRedis,
    redis: Redis,
    fake: FakeOpenAI,
    short_dir: Path,
    make_settings: SettingsFactory,
) -> None:
    # A due-index shard of the wrong type makes every sweep fail with WRONGTYPE, an error
    # reply nobody classified. The sweep must log it and go on: it is how orphaned
    # conversations get finished.
    orphan = message(7, 1)
    garbage = Keys("pipe:3").due if Keys("pipe:3").due != Keys(orphan.conversation).due else ""
    assert garbage, "pick a conversation in another shard"
    await redis.set(garbage, "not a sorted set")
    async with cluster(server, fake, short_dir) as bots:
        await logged(bots, "r0", "sweep failed", times=2)
        await redis.delete(garbage)
        # Taken in by no replica (as if its replica died): only a sweep can answer it.
        store = make_store(make_settings(), redis)
        assert (await store.ingest(orphan)).accepted
        await bots.wait_for(lambda: bool(bots.sent()), timeout=10, what="the orphan's reply")
        assert bots.sent()[0]["text"] == "covers c7m1"
        assert bots.alive() == ["r0"]


async def test_an_idle_conversation_expires_whole_and_starts_afresh(
    server: EmbeddedRedis, redis: Redis, fake: FakeOpenAI, short_dir: Path
) -> None:
    retention_s = 3
    async with cluster(
        server, fake, short_dir, LASTWORD_RETENTION_DAYS=str(retention_s / 86400)
    ) as bots:
        await bots.deliver("r0", message(1, 1))
        await bots.wait_for(lambda: bool(bots.sent()), timeout=10, what="the reply")
        await settled(redis, CONVERSATION, within_s=5)
        k = Keys(CONVERSATION)
        kept = [key for key in (k.state, k.pending, k.seen, k.history, k.usage)]
        present = [key for key in kept if await redis.exists(key)]
        assert {k.state, k.seen, k.history, k.usage} <= set(present)
        for key in present:
            ttl = await redis.pttl(key)
            assert 0 < ttl <= retention_s * 1000, (key, ttl)

        async def gone() -> bool:
            return not await redis.exists(*kept)

        await eventually(gone, within_s=retention_s + 3)
        await bots.deliver("r0", message(1, 2))
        await bots.wait_for(lambda: len(bots.sent()) == 2, timeout=10, what="the next reply")
        # A fresh start: version 1 again, and a history of this turn only.
        assert await redis.hget(k.state, "v") == b"1"
        assert bots.sent()[1]["text"] == "covers c1m2"
        await settled(redis, CONVERSATION, within_s=5)
        assert await redis.llen(k.history) == 2


async def test_an_intake_that_fails_is_restarted_and_healthz_says_so_meanwhile(
    server: EmbeddedRedis, short_dir: Path
) -> None:
    # The webhook's port is taken (another process, a slow predecessor): the intake fails
    # to start. Before, that ended the process; now it is restarted with a backoff, and
    # /healthz answers 503 meanwhile, so systemd and a load balancer can see it.
    webhook_port, metrics_port = free_port(), free_port()
    squatter = socket.socket()
    squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    squatter.bind(("127.0.0.1", webhook_port))
    squatter.listen()
    async with FakeTelegram() as telegram:
        env = clean_environ() | {
            "LASTWORD_PLATFORM": "telegram",
            "LASTWORD_REDIS_URL": server.url,
            "LASTWORD_DATA_DIR": str(short_dir / "data"),
            "LASTWORD_TELEGRAM__TOKEN": telegram.token,
            "LASTWORD_TELEGRAM__API_URL": telegram.api_url,
            "LASTWORD_TELEGRAM__MODE": "webhook",
            "LASTWORD_TELEGRAM__WEBHOOK_LISTEN": f"127.0.0.1:{webhook_port}",
            "LASTWORD_TELEGRAM__WEBHOOK_SECRET": "s3cret",
            "LASTWORD_TELEGRAM__WEBHOOK_URL": "https://bot.example/telegram",
            "LASTWORD_METRICS_LISTEN": f"127.0.0.1:{metrics_port}",
            "LASTWORD_LLM__PROVIDER": "echo",
        }
        bot = await Running.start(env, cwd=short_dir)
        try:
            await eventually(lambda: _said(bot, "telegram intake stopped with an error"), 15)

            async def unhealthy() -> bool:
                status, body = await asyncio.to_thread(get, metrics_port)
                return status == 503 and "restarting: telegram intake" in body

            await eventually(unhealthy, within_s=5)
            assert bot.process.returncode is None
            squatter.close()

            # The next attempt (1, 2, 4 s after the failures) binds and registers the webhook.
            await telegram.wait_for_calls("setWebhook", 1, timeout=10)
            assert (await asyncio.to_thread(get, metrics_port))[0] == 200
            update = telegram.private_text_update(42, 42, "hello")
            assert (
                await post_update(f"http://127.0.0.1:{webhook_port}/telegram", update, "s3cret")
                == 200
            )
            await telegram.wait_for_sent(1, timeout=10)
            assert telegram.sent_messages[0].text == "You said: hello"
        finally:
            squatter.close()
            await bot.stop()


async def _said(bot: Running, text: str) -> bool:
    return bot.said(text) > 0


def get(port: int) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()
    except OSError:
        return 0, ""


@pytest.mark.parametrize(
    ("reply", "retryable", "reconnect"),
    [
        ("OOM command not allowed when used memory > 'maxmemory'.", True, False),
        ("BUSY Redis is busy running a script.", True, False),
        ("MASTERDOWN Link with MASTER is down", True, False),
        ("TRYAGAIN Multiple keys request during rehashing of slot", True, False),
        ("CLUSTERDOWN The cluster is down", True, False),
        ("NOSCRIPT No matching script.", True, False),
        ("READONLY You can't write against a read only replica.", True, True),
        ("MOVED 3999 127.0.0.1:6381", True, True),
        ("ASK 3999 127.0.0.1:6381", True, True),
        ("WRONGTYPE Operation against a key holding the wrong kind of value", False, False),
        ("ERR Error running script: attempt to compare nil with number", False, False),
    ],
)
def test_error_replies_are_classified_once(reply: str, retryable: bool, reconnect: bool) -> None:
    # The exception as redis-py's own parser builds it from the server's reply (it strips
    # the codes it knows from the message, so the code must be read where it keeps it).
    error = BaseParser.parse_error(reply)  # type: ignore[no-untyped-call]
    assert isinstance(error, ResponseError)
    verdict = classify(error)
    assert (verdict is not None) == retryable
    if verdict is not None:
        assert verdict.reconnect == reconnect
        assert reply.split()[0] in str(verdict) or "read-only" in str(verdict)
