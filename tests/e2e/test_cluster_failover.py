"""Proof with real processes on Redis Cluster and Sentinel (issue 13 §4).

The multi-process burst workload of ``tests/e2e/test_replicas.py`` (three
``tests/support/replica.py`` processes, a fake LLM that answers with the tokens of the messages it
covers, redelivery to a second replica) runs against:

- a real 3-primary cluster, each primary with a replica: conversations on every primary, one
  bot killed with SIGKILL mid-run; I1, I3, I4 (from fences), I5 and I6 for every conversation;
- the same cluster with one primary killed with SIGKILL mid-run: its replica is promoted, the
  bots carry on and every conversation is answered. At `fast` (the default) what was lost is
  printed and must lie within the README's window; `replicated` where the store supports it;
- a Sentinel-managed primary and replica, the primary killed mid-burst: at `replicated`, every
  acknowledged message is answered exactly once;
- `SCRIPT FLUSH` mid-run, on one server and on every primary of a cluster: nothing changes.

A reply part sent again under its idempotency key (the outbox resent by the next lease holder
after a commit the failover refused: SPEC, Recovery) counts once, as a platform that
deduplicates (Discord's nonce) shows it; the tests print how many there were. A second reply
under another key covering a message already answered is a duplicate (I1).

The time from a primary's kill to the first reply served after it is printed (``-s``).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest
from redis.asyncio import Redis
from redis.exceptions import MovedError

from bot.store import Keys
from bot.store.connect import Client, open_client
from bot.store.durability import Level, Refused, probe, waits_for
from bot.store.embedded import EmbeddedRedis
from tests.support.clusters import (
    MASTER_NAME,
    Cluster,
    SentinelSetup,
    Server,
    cluster,
    primary_of,
    sentinel,
    wait_until,
)
from tests.support.failover import bots, first_reply_after
from tests.support.fakes.openai_server import FakeOpenAI, RecordedRequest
from tests.support.replica_fleet import (
    I3_BOUND_S,
    LLM_DELAY_S,
    PLATFORM,
    QUIET_MS,
    SEED,
    SWEEP_MS,
    TTL_MS,
    WORKLOAD_ENV,
    Event,
    Step,
    check_conversation,
    conversation_of,
    covering_reply,
    message,
    plan_workload,
    quiet,
    tokens,
)
from tests.support.replica_fleet import Cluster as Bots
from tests.support.waits import eventually

__all__ = ["cluster", "sentinel"]  # the fixtures, imported for pytest

pytestmark = pytest.mark.timeout(60)
# A failover test's outage lasts until the primary is promoted and, at `replicated`, a replica
# is back in sync (each step allowed 15 s): a delivery meanwhile waits, as a platform retries.
FAILOVER_OUTAGE_S = 40

# How long a store outage may stall one delivery (a failover, plus the bots' retries).
FAILOVER_BOUND_S = 15.0
# README, LASTWORD_DURABILITY=fast: a crash loses up to ~1 s of acknowledged writes (the
# AOF's everysec), and a promoted asynchronous replica lacks what it had not received yet.
FAST_LOSS_WINDOW_S = 1.0
# The killed bot's last generation: far longer than the test, so the kill always cuts it.
ORPHAN_DELAY_S = 120.0


@contextlib.asynccontextmanager
async def client_for(url: str) -> AsyncIterator[Redis]:
    """The test's own client for the checks, of whatever mode `url` names. The checks call
    per-key commands only, which the cluster client routes like a plain client's."""
    client: Client = await open_client(url)
    try:
        yield cast(Redis, client)
    finally:
        await client.aclose()


class Router:
    """Delivers the workload's messages the way a platform would: a message for a bot that is
    gone (or about to be killed) goes to another, and a kill waits for the victim's deliveries
    in flight, so every message the platform sent is acknowledged by exactly one intake."""

    def __init__(self, replicas: Bots, rng: random.Random, *, outage_s: float = 10) -> None:
        self.replicas = replicas
        self.rng = rng
        # How long a delivery may wait for its intake: a platform retries for as long as the
        # store is out, which a failover test makes last until the failover is complete.
        self.outage_s = outage_s
        self.out: set[str] = set()
        self.pending: dict[str, int] = {}

    def route(self, targets: tuple[str, ...]) -> list[str]:
        routed: list[str] = []
        for name in targets:
            if name in self.out:
                spare = [n for n in self.replicas.alive() if n not in self.out and n not in routed]
                if not spare:
                    continue
                name = self.rng.choice(spare)
            if name not in routed:
                routed.append(name)
        return routed

    async def deliver(self, name: str, step: Step) -> None:
        self.pending[name] = self.pending.get(name, 0) + 1
        try:
            await self.replicas.deliver(name, step.message, self.outage_s)
        finally:
            self.pending[name] -= 1

    async def play(self, steps: list[Step]) -> None:
        for step in steps:
            # Deliberate: the user's typing rhythm is what the workload is about.
            await asyncio.sleep(step.gap_s)
            await asyncio.gather(*(self.deliver(n, step) for n in self.route(step.targets)))

    async def kill(self, name: str) -> None:
        """SIGKILL `name` once nothing is being handed to it."""
        self.out.add(name)
        await poll(lambda: not self.pending.get(name, 0), 10, f"{name}'s intake to drain")
        await self.replicas.kill(name)


async def poll(check: Callable[[], object], within_s: float, what: str) -> None:
    """Poll a cheap in-memory `check` until it holds; fail after `within_s` saying what."""
    deadline = time.monotonic() + within_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what} after {within_s:g}s")
        await asyncio.sleep(0.01)


async def in_thread(check: Callable[[], Any], within_s: float, what: str) -> Any:
    """`wait_until` (synchronous admin calls) off the event loop, so the bots' output is still
    read meanwhile."""
    return await asyncio.to_thread(wait_until, check, within_s, what)


def acknowledged(replicas: Bots) -> dict[str, float]:
    """When each message was first acknowledged to the platform (an `ingested` line, accepted
    or dropped as a redelivery: a retried ingest whose first attempt was stored but reported
    unavailable is dropped as a duplicate, and still acknowledged)."""
    first: dict[str, float] = {}
    for event in replicas.of("ingested"):
        message_id, t = event["message_id"], float(event["t"])
        first[message_id] = min(t, first.get(message_id, t))
    return first


def accepted_counts(replicas: Bots) -> dict[str, int]:
    counts: dict[str, int] = {}
    for event in replicas.of("ingested"):
        counts[event["message_id"]] = counts.get(event["message_id"], 0) + bool(event["accepted"])
    return counts


def delivered(events: Iterable[Event]) -> list[Event]:
    """What the user sees of the `sent` events: a reply part sent again under the same
    idempotency key (the outbox resent after its commit failed, SPEC recovery) is deduplicated
    by the platform (Discord's nonce), so only its first sending counts."""
    seen: set[str] = set()
    out = []
    for event in events:
        if event["key"] not in seen:
            seen.add(event["key"])
            out.append(event)
    return out


def resent(replicas: Bots) -> int:
    """Reply parts sent again under their idempotency key (a platform's dedupe drops them)."""
    return len(replicas.sent()) - len(delivered(replicas.sent()))


async def check_all(
    replicas: Bots, redis: Redis, conversations: Iterable[str], *, since: float = 0.0
) -> int:
    """I1, I3, I4 (from fences), I5 and I6 (test_replicas' `check_conversation`) for every
    conversation, each message counted from its acknowledgement; returns the number of
    replies."""
    acked = acknowledged(replicas)
    replies = 0
    for conversation in conversations:
        mine = {m: t for m, t in acked.items() if conversation_of(m) == conversation}
        replies += len(
            await check_conversation(
                redis,
                conversation,
                mine,
                delivered(replicas.sent(conversation)),
                since=since,
                core_waits=replicas.core_waits,
            )
        )
    return replies


async def answered(replicas: Bots, redis: Redis, messages: Iterable[str], within_s: float) -> None:
    """Every message covered by a delivered reply, then the store quiet (nothing owed, held,
    half-sent or scheduled), so nothing more will be sent."""
    wanted = set(messages)
    try:
        await replicas.wait_for(lambda: wanted <= replicas.covered(), within_s, "replies")
    except AssertionError as exc:
        raise AssertionError(
            f"{exc}: never answered: {sorted(wanted - replicas.covered())}"
        ) from None
    await quiet(
        redis, {conversation_of(m) for m in wanted}, within_s=(TTL_MS + SWEEP_MS) / 1000 + 5
    )


def workload(
    rng: random.Random, replicas: Bots, conversations: int
) -> tuple[list[list[Step]], list[str]]:
    plans = plan_workload(rng, replicas.names, conversations)
    return plans, [step.message.message_id for steps in plans for step in steps]


async def when_acknowledged(replicas: Bots, count: int, within_s: float = 30) -> None:
    await replicas.wait_for(
        lambda: len(acknowledged(replicas)) >= count, within_s, f"{count} messages taken in"
    )


def conversations_of(plans: list[list[Step]]) -> list[str]:
    return [f"{PLATFORM}:{conv}" for conv in range(len(plans))]


def slow_first(message_id: str) -> Callable[[RecordedRequest], float]:
    """The fake LLM's delay per request: the first generation covering `message_id` is still
    going when the test kills its replica (the fake notices the hang-up and stops); every
    other request, the survivors' generation for it included, takes the workload's
    LLM_DELAY_S."""
    first: list[RecordedRequest] = []

    def delay(request: RecordedRequest) -> float:
        if not first and message_id in tokens(request.last_user_text):
            first.append(request)
        return ORPHAN_DELAY_S if first and request is first[0] else LLM_DELAY_S

    return delay


async def renewed(redis: Redis, conversation: str, since: float) -> None:
    """Wait until the lease on `conversation` has been renewed after `since` (monotonic): it
    expires later than a lease taken before then could."""
    lease = Keys(conversation).lease

    async def later() -> bool:
        ttl_ms = await redis.pttl(lease)
        return ttl_ms > 0 and time.monotonic() + ttl_ms / 1000 > since + TTL_MS / 1000 + 0.05

    await eventually(later, TTL_MS / 1000 + 5, what=f"a renewal of the lease on {conversation}")


def holders(cluster: Cluster, conversations: Iterable[str]) -> dict[int, set[str]]:
    """Primary index -> the conversations whose keys its node holds."""
    found: dict[int, set[str]] = {}
    for index, server in enumerate(cluster.primaries):
        found[index] = set()
        with server.admin() as client:
            for conversation in conversations:
                with contextlib.suppress(MovedError):
                    if client.exists(Keys(conversation).state, Keys(conversation).history):
                        found[index].add(conversation)
    return found


# -- 1. the burst workload on every primary, a bot killed -----------------------------------


async def test_bursts_on_every_primary_with_a_bot_killed(cluster: Cluster, short_dir: Path) -> None:
    rng = random.Random(SEED + 13)
    async with (
        FakeOpenAI(reply=covering_reply) as fake,
        bots(cluster.url, fake, short_dir, env=WORKLOAD_ENV) as replicas,
        client_for(cluster.url) as redis,
    ):
        fake.delay_s = LLM_DELAY_S
        plans, messages = workload(rng, replicas, conversations=9)
        # A conversation of one message, delivered to one bot, whose first generation is slow,
        # so the kill certainly cuts one short; only the sweep can recover it. The bot killed is
        # the one generating: usually the intake's own timer wakes it first, but under load
        # another bot's sweep of the due-index can, as it should.
        orphan = message(len(plans), 1)
        conversations = [*conversations_of(plans), orphan.conversation]
        assert {primary_of(c) for c in conversations} == {0, 1, 2}
        fake.delay_for = slow_first(orphan.message_id)
        router = Router(replicas, rng)
        cut: list[RecordedRequest] = []

        async def kill_mid_run() -> None:
            await when_acknowledged(replicas, len(messages) // 3)
            assert await replicas.deliver(replicas.names[0], orphan)
            cut.append(
                await fake.wait_for_request(
                    lambda r: orphan.message_id in tokens(r.last_user_text),
                    timeout=QUIET_MS / 1000 + 5,
                )
            )
            # Killed once it has renewed the lease: what a renewal leaves behind must let the
            # sweep find the conversation when the lease expires.
            await renewed(redis, orphan.conversation, cut[0].started_at)
            await router.kill(cut[0].api_key)

        await asyncio.gather(kill_mid_run(), *(router.play(steps) for steps in plans))
        victim = cut[0].api_key
        messages.append(orphan.message_id)
        await answered(replicas, redis, messages, within_s=I3_BOUND_S + 10)
        # The victim's generation died with it, unfinished; a survivor answered instead.
        await fake.wait_for_request(lambda r: r is cut[0] and r.cancelled, timeout=5)
        assert not cut[0].finished
        survivors = replicas.alive()
        assert victim not in survivors and len(survivors) == 2
        await replicas.terminate_all(survivors)

        assert set(acknowledged(replicas)) == set(messages)
        assert all(n == 1 for n in accepted_counts(replicas).values()), accepted_counts(replicas)
        redelivered = sum(len(step.targets) > 1 for steps in plans for step in steps)
        assert redelivered > 0, "the seed must exercise redelivery"
        replies = await check_all(replicas, redis, conversations)
        assert replies < len(messages), "bursts were not folded"
        held = holders(cluster, conversations)
        assert all(held.values()), f"a primary holds no conversation: {held}"
        print(
            f"\ncluster, bot killed: {len(messages)} messages, {replies} replies "
            f"({resent(replicas)} parts resent under their key), conversations by primary {held}; "
            f"{victim} killed while generating for {tokens(cut[0].last_user_text)}"
        )


# -- helpers for a primary killed mid-run ----------------------------------------------------


def durable(servers: Iterable[Server]) -> None:
    """Every server with its append-only file fsynced on every write: what `replicated` needs
    on Redis 7.0 (no WAITAOF). Replicas too, since one of them becomes the primary."""
    for server in servers:
        with server.admin() as client:
            client.config_set("appendonly", "yes")
            client.config_set("appendfsync", "always")

    def rewritten() -> bool:
        for server in servers:
            with server.admin() as client:
                info = client.info("persistence")
                if info["aof_enabled"] != 1 or info["aof_rewrite_in_progress"]:
                    return False
        return True

    wait_until(rewritten, 10, "the append-only files to be written")


def restart_cluster_node(server: Server, *extra: str) -> None:
    """Start a killed cluster node again with its own nodes.conf (tests/support/clusters.py's
    options): the cluster makes a primary that lost its slots a replica of their new owner."""
    server.restart(
        "--cluster-enabled", "yes",
        "--cluster-port", str(server.bus_port),
        "--cluster-config-file", "nodes.conf",
        "--cluster-node-timeout", "1000",
        "--cluster-replica-validity-factor", "0",
        "--repl-diskless-sync-delay", "0",
        *extra,
    )  # fmt: skip


def replicating(server: Server, of_port: int) -> Callable[[], bool]:
    def check() -> bool:
        with server.admin() as client:
            info = client.info("replication")
        return bool(
            info.get("role") == "slave"
            and int(info.get("master_port", 0)) == of_port
            and info.get("master_link_status") == "up"
        )

    return check


@dataclass
class Failover:
    """When a primary was killed, its replica promoted, and (if asked) a replica back."""

    killed: float = 0.0
    promoted: float = 0.0
    replicated: float = 0.0


async def expect_answers(
    replicas: Bots, redis: Redis, conversations: list[str], wanted: set[str], within_s: float
) -> None:
    """Every message of `wanted` covered, then every conversation quiet."""
    try:
        await replicas.wait_for(lambda: wanted <= replicas.covered(), within_s, "replies")
    except AssertionError as exc:
        raise AssertionError(
            f"{exc}: never answered: {sorted(wanted - replicas.covered())}"
        ) from None
    await quiet(redis, conversations, within_s=(TTL_MS + SWEEP_MS) / 1000 + 10)


def covered_twice(replicas: Bots) -> dict[str, list[str]]:
    """Message -> the keys of the delivered replies that covered it, where more than one
    did (a resend under the same key is one delivery)."""
    by_message: dict[str, list[str]] = {}
    for event in delivered(replicas.sent()):
        for token in tokens(event["text"]):
            by_message.setdefault(token, []).append(str(event["key"]))
    return {m: keys for m, keys in by_message.items() if len(keys) > 1}


def all_sentinels_name(setup: SentinelSetup, port: int) -> bool:
    for server in setup.sentinels:
        with server.admin() as client:
            _, named = client.execute_command("SENTINEL GET-MASTER-ADDR-BY-NAME", MASTER_NAME)
            if int(named) != port:
                return False
    return True


@contextlib.contextmanager
def server_logs_on_failure(servers: Iterable[Server]) -> Iterator[None]:
    """On a failure, print the servers' logs (pytest shows them with it)."""
    try:
        yield
    except BaseException:
        for server in servers:
            log = server.folder / "server.log"
            text = log.read_text(errors="replace") if log.exists() else "(no log)"
            print(f"--- server {server.port} ({server.folder.name})\n" + text[-6000:])
        raise


# -- 2. a cluster primary killed mid-run ---------------------------------------------------


@pytest.mark.parametrize("level", ["fast", "replicated"])
async def test_a_cluster_primary_killed_mid_run(
    level: Level, request: pytest.FixtureRequest, short_dir: Path
) -> None:
    running: Cluster = request.getfixturevalue("cluster")
    if level == "replicated":
        durable(running.servers)
        async with client_for(running.url) as admin:
            try:
                waits_for(level, await probe(cast(Client, admin)))
            except Refused as exc:
                pytest.skip(f"the store refuses {level} on Redis Cluster: {exc}")
    rng = random.Random(SEED + 2)
    victim, heir = running.primaries[0], running.replicas[0]
    times = Failover()
    async with (
        FakeOpenAI(reply=covering_reply) as fake,
        # The bots' URL names the primary about to be killed, as an operator's might.
        bots(
            running.url, fake, short_dir, env=WORKLOAD_ENV | {"LASTWORD_DURABILITY": level}
        ) as replicas,
        # The test's own client starts from a node that stays up: redis-py's cluster client
        # reloads its slot map from the nodes it was given.
        client_for(f"redis://127.0.0.1:{running.primaries[1].port}") as redis,
    ):
        fake.delay_s = LLM_DELAY_S
        plans, messages = workload(rng, replicas, conversations=9)
        conversations = conversations_of(plans)
        on_victim = [c for c in conversations if primary_of(c) == 0]
        assert on_victim and len(on_victim) < len(conversations)
        router = Router(replicas, rng, outage_s=FAILOVER_OUTAGE_S)

        async def kill_primary() -> None:
            await when_acknowledged(replicas, len(messages) // 3)
            times.killed = time.time()
            victim.kill()
            await in_thread(
                lambda: heir.port in running.primary_ports(), 15, "the replica's promotion"
            )
            times.promoted = time.time()
            if level == "replicated":
                # WAIT 1 needs a replica: the crashed primary comes back as one.
                await asyncio.to_thread(
                    restart_cluster_node, victim, "--appendonly", "yes", "--appendfsync", "always"
                )
                await in_thread(replicating(victim, heir.port), 15, "the old primary to replicate")
            times.replicated = time.time()

        await asyncio.gather(kill_primary(), *(router.play(steps) for steps in plans))
        acked = acknowledged(replicas)
        assert set(acked) == set(messages)
        # Mid-run: the killed primary's conversations took messages in after the promotion.
        assert any(acked[m] > times.promoted for m in messages if conversation_of(m) in on_victim)

        def at_risk(message_id: str) -> bool:
            """Within the window `fast` may lose: on the killed primary, acknowledged at most
            ~1 s before the kill (its replica had it, or not)."""
            t = acked[message_id]
            conversation = conversation_of(message_id)
            return (
                level == "fast"
                and conversation in on_victim
                and times.killed - FAST_LOSS_WINDOW_S <= t <= times.killed
            )

        wanted = {m for m in messages if not at_risk(m)}
        await expect_answers(replicas, redis, conversations, wanted, I3_BOUND_S + 15)
        await replicas.terminate_all(replicas.alive())

        lost = sorted(set(messages) - replicas.covered())
        twice = covered_twice(replicas)
        resumed = first_reply_after(replicas, times.killed, on_victim)
        print(
            f"\ncluster, primary killed ({level}): {len(messages)} messages; replica promoted "
            f"{times.promoted - times.killed:.2f}s after the kill; first reply on its "
            f"conversations {resumed if resumed is None else round(resumed, 2)}s after it; "
            f"lost (acknowledged, never answered): {lost or 'none'}; "
            f"answered twice: {twice or 'none'}; "
            f"reply parts resent under their idempotency key: {resent(replicas)}"
        )
        # Whatever was lost or answered twice lies in the window the README states for fast.
        assert all(at_risk(m) for m in lost), (lost, acked, times)
        assert all(at_risk(m) for m in twice), (twice, acked, times)
        if level == "replicated":
            assert not lost and not twice
        # Every conversation untouched by a loss holds I1, I3, I4 (from fences), I5 and I6,
        # counted from the promotion (nothing could be answered on the killed primary before it).
        hit = {conversation_of(m) for m in [*lost, *twice]}
        await check_all(
            replicas, redis, [c for c in conversations if c not in hit], since=times.replicated
        )


# -- 3. a Sentinel-managed primary killed mid-burst -----------------------------------------


async def test_a_sentinel_primary_killed_mid_burst_loses_nothing_replicated(
    sentinel: SentinelSetup, short_dir: Path
) -> None:
    with server_logs_on_failure([sentinel.primary, sentinel.replica, *sentinel.sentinels]):
        await sentinel_failover(sentinel, short_dir)


async def sentinel_failover(sentinel: SentinelSetup, short_dir: Path) -> None:
    durable([sentinel.primary, sentinel.replica])
    with sentinel.replica.admin() as client:
        # Once promoted, it syncs the crashed primary back at once (the default waits 5 s).
        client.config_set("repl-diskless-sync-delay", 0)
    rng = random.Random(SEED + 3)
    times = Failover()
    env = {"LASTWORD_DURABILITY": "replicated"}
    async with (
        FakeOpenAI(reply=covering_reply) as fake,
        bots(sentinel.url, fake, short_dir, env=WORKLOAD_ENV | env) as replicas,
        client_for(sentinel.url) as redis,
    ):
        fake.delay_s = LLM_DELAY_S
        plans, messages = workload(rng, replicas, conversations=8)
        conversations = conversations_of(plans)
        router = Router(replicas, rng, outage_s=FAILOVER_OUTAGE_S)

        async def kill_primary() -> None:
            await when_acknowledged(replicas, len(messages) // 3)
            times.killed = time.time()
            sentinel.primary.kill()
            await in_thread(
                lambda: sentinel.master_port() == sentinel.replica.port,
                15,
                "the Sentinels to promote the replica",
            )
            times.promoted = time.time()
            # Every Sentinel, not just a majority, names the new primary before the old one
            # returns: a Sentinel still naming it would see a primary that calls itself a
            # replica, and count it down.
            await in_thread(
                lambda: all_sentinels_name(sentinel, sentinel.replica.port),
                15,
                "every Sentinel to name the new primary",
            )
            # WAIT 1 needs a replica: the crashed primary comes back as one.
            await asyncio.to_thread(
                sentinel.primary.restart,
                "--appendonly", "yes",
                "--appendfsync", "always",
                "--replicaof", "127.0.0.1", str(sentinel.replica.port),
            )  # fmt: skip
            await in_thread(
                replicating(sentinel.primary, sentinel.replica.port),
                15,
                "the old primary to replicate",
            )
            times.replicated = time.time()

        await asyncio.gather(kill_primary(), *(router.play(steps) for steps in plans))
        acked = acknowledged(replicas)
        assert set(acked) == set(messages)
        assert any(t > times.promoted for t in acked.values()), "the kill was not mid-burst"
        await expect_answers(replicas, redis, conversations, set(messages), I3_BOUND_S + 15)
        await replicas.terminate_all(replicas.alive())

        resumed = first_reply_after(replicas, times.killed, conversations)
        print(
            f"\nsentinel, primary killed (replicated): {len(messages)} messages; promoted "
            f"{times.promoted - times.killed:.2f}s after the kill, a replica again after "
            f"{times.replicated - times.killed:.2f}s; first reply "
            f"{resumed if resumed is None else round(resumed, 2)}s after the kill; "
            f"reply parts resent under their idempotency key: {resent(replicas)}"
        )
        # Exactly once: every acknowledged message covered by one reply, nothing else.
        assert not covered_twice(replicas)
        await check_all(replicas, redis, conversations, since=times.replicated)


# -- 4. SCRIPT FLUSH mid-run ------------------------------------------------------------------


@pytest.mark.parametrize("where", ["single", "cluster"])
async def test_script_flush_mid_run_changes_nothing(
    where: str, request: pytest.FixtureRequest, short_dir: Path
) -> None:
    if where == "cluster":
        running: Cluster = request.getfixturevalue("cluster")
        url, primaries = running.url, running.primaries
    else:
        server: EmbeddedRedis = request.getfixturevalue("server")
        url, primaries = server.url, []
    rng = random.Random(SEED + 4)
    async with (
        FakeOpenAI(reply=covering_reply) as fake,
        bots(url, fake, short_dir, env=WORKLOAD_ENV) as replicas,
        client_for(url) as redis,
    ):
        fake.delay_s = LLM_DELAY_S
        plans, messages = workload(rng, replicas, conversations=6)
        conversations = conversations_of(plans)
        router = Router(replicas, rng)
        flushes = 0

        async def flush() -> None:
            nonlocal flushes
            for part in (4, 2):
                await when_acknowledged(replicas, len(messages) // part)
                if primaries:
                    for primary in primaries:
                        with primary.admin() as client:
                            client.script_flush()
                else:
                    await redis.script_flush()
                flushes += 1

        await asyncio.gather(flush(), *(router.play(steps) for steps in plans))
        await answered(replicas, redis, messages, within_s=I3_BOUND_S + 10)
        await replicas.terminate_all()
        assert flushes == 2
        # Not even a resend the platform would have to drop.
        assert resent(replicas) == 0
        assert all(n == 1 for n in accepted_counts(replicas).values()), accepted_counts(replicas)
        replies = await check_all(replicas, redis, conversations)
        print(f"\nSCRIPT FLUSH x2 ({where}): {len(messages)} messages, {replies} replies")
