"""Failure paths of the core, with replica processes (``tests/replica.py``) and a real server:
an error reply the store did not expect, a platform that keeps failing, a commit refused once,
a notice that hangs, a sweep that meets garbage, and a conversation left idle past its
retention. Each test names the scenario; each fails without the fix it pins down.

The platform's failures are scripted through one control file that every replica reads at
each send (see ``tests/replica.py``).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from redis.asyncio import Redis

from bot.app import make_store
from bot.embedded import EmbeddedRedis
from bot.message import InboundMessage
from bot.store import Keys
from tests.conftest import SettingsFactory, eventually
from tests.fakes.openai_server import FakeOpenAI
from tests.test_replicas import Cluster, covering_reply, message

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


async def settled(redis: Redis, conversation: str = CONVERSATION) -> bool:
    v, w = await redis.hmget(Keys(conversation).state, ["v", "w"])
    return v is not None and v == w


async def logged(cluster: Cluster, name: str, text: str, times: int = 1) -> None:
    """Wait until replica `name` has logged `text` at least `times` times. (Its log is a
    file, not its stdout, so `Cluster.wait_for` would not look again when it grows.)"""

    async def enough() -> bool:
        return cluster.replicas[name].log_path.read_text().count(text) >= times

    await eventually(enough, within_s=10)


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
        await eventually(lambda: settled(redis), within_s=5)
        # Long enough for a lease (1.5 s) to expire and a sweep to resend, had it been left.
        await asyncio.sleep(2.5)
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
        await eventually(lambda: settled(redis), within_s=5)
        assert await redis.exists(Keys(CONVERSATION).outbox) == 0
        await bots.wait_for(
            lambda: bots.stats("r0").get("abandoned") == 1, timeout=5, what="the count"
        )
        assert "gave up the reply to pipe:1" in bots.replicas["r0"].log_path.read_text()
        assert len(bots.of("send_failed")) == 1

        control(short_dir).unlink()
        await bots.deliver("r0", message(1, 2))
        await bots.wait_for(lambda: bool(bots.sent()), timeout=10, what="the next reply")
        await eventually(lambda: settled(redis), within_s=5)
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
        await eventually(lambda: settled(redis), within_s=5)
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
    orphan = InboundMessage("pipe", "7", "u7", "c7m1", "about c7m1, please")
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
        await eventually(lambda: settled(redis), within_s=5)
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
        await eventually(lambda: settled(redis), within_s=5)
        assert await redis.llen(k.history) == 2
