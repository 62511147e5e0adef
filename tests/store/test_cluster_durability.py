"""LASTWORD_DURABILITY=replicated on a real Redis Cluster (three primaries, a replica each):
each durable step's script and its wait go to the primary that owns the conversation's slot,
on one connection, so an acknowledged write is on that primary's replica; a primary whose
replica is gone refuses writes (`StoreUnavailable`, within the bounded wait) while the others
go on; a stale slot map (MOVED), a slot mid-migration (ASK) and an emptied script cache
(NOSCRIPT) are followed; start-up refuses a primary without a replica; a runtime answers
bursts on every primary.

The cluster's servers run without AOF (tests/support/clusters.py), and Redis 7.0 has no WAITAOF:
each primary is switched to `appendonly yes` and `appendfsync always` here (`durable`)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager

import pytest
from redis import Redis as SyncRedis
from redis.asyncio.cluster import RedisCluster
from redis.crc import key_slot

from bot.message import InboundMessage
from bot.ops.doctor import durability_check
from bot.store import Acquired, Keys, Store, StoreSettings, StoreUnavailable, lease_token
from bot.store.connect import open_client
from bot.store.durability import NO_AOF_FIX, Durability, Refused
from tests.support.builders import message
from tests.support.clusters import (
    Cluster,
    Server,
    cluster,
    conversations_on_each_primary,
    primary_of,
    runtime_on,
    wait_until,
)
from tests.support.factories import SettingsFactory
from tests.support.waits import settled

__all__ = ["cluster"]  # the fixture, imported for pytest

pytestmark = pytest.mark.timeout(60)

# The bounded wait of these tests: short, so a refused write fails fast.
TIMEOUT_MS = 300


@pytest.fixture
def durable(cluster: Cluster) -> Cluster:
    """The cluster, every primary with its append-only file fsynced on every write."""
    for primary in cluster.primaries:
        with primary.admin() as client:
            client.config_set("appendonly", "yes")
            client.config_set("appendfsync", "always")
    return cluster


@pytest.fixture
async def client(durable: Cluster) -> AsyncIterator[RedisCluster]:
    made = await open_client(durable.url)
    assert isinstance(made, RedisCluster)
    yield made
    await made.aclose()


def store_of(client: RedisCluster) -> Store:
    settings = StoreSettings(
        0, 0, 1500, 200, 3, durability="replicated", durability_wait_ms=TIMEOUT_MS
    )
    return Store(client, settings)


@contextmanager
def readonly(server: Server) -> Iterator[SyncRedis]:
    """A client of a replica that answers reads of its primary's slots (READONLY)."""
    with server.admin() as replica:
        replica.execute_command("READONLY")
        yield replica


def home_dm(n: int, conversation: str) -> InboundMessage:
    """Message `n` of a DM whose chat is its user (Telegram's): one script per ingest, the
    person's keys being in the conversation's slot."""
    return message(n=n, conversation=conversation, user=conversation.partition(":")[2])


def on_replica(cluster: Cluster, conversation: str, field: str) -> object:
    """A field of the conversation's state, as the replica of its primary has it."""
    with readonly(cluster.replicas[primary_of(conversation)]) as replica:
        value = replica.hget(Keys(conversation).state, field)
    return value


async def test_each_step_waits_for_the_replica_of_its_primary(
    durable: Cluster, client: RedisCluster
) -> None:
    store = store_of(client)
    assert await store.durability.prepare("replicated") == (("WAIT", 1, TIMEOUT_MS),)
    conversations = conversations_on_each_primary(1)
    for conversation in conversations:  # the first calls load the scripts (NOSCRIPT)
        assert (await store.ingest(home_dm(1, conversation))).accepted
        # Acknowledged: the replica has it already, with no time to catch up.
        assert on_replica(durable, conversation, "v") == b"1"
    for primary in durable.primaries:
        with primary.admin() as admin:
            admin.config_resetstat()
    for conversation in conversations:
        assert (await store.ingest(home_dm(2, conversation))).version == 2
        assert on_replica(durable, conversation, "v") == b"2"
        grant = await store.acquire(conversation, lease_token("r"))
        assert isinstance(grant, Acquired), grant
        assert (await store.presend(grant.lease, grant.version, "hello")).status == "ok"
        with readonly(durable.replicas[primary_of(conversation)]) as replica:
            assert replica.exists(Keys(conversation).outbox)
        assert (await store.commit(grant.lease)).ok
        assert on_replica(durable, conversation, "w") == b"2"
    for primary in durable.primaries:
        with primary.admin() as admin:
            stats = admin.info("commandstats")
        # A WAIT after each of ingest, acquire, pre-send and commit, on the script's node
        # (one that blocks is counted again when it is woken).
        assert stats["cmdstat_wait"]["calls"] >= 4
        # Acquire, pre-send and commit run here for the first time: NOSCRIPT, SCRIPT LOAD on
        # that node, EVALSHA again.
        assert stats["cmdstat_script|load"]["calls"] == 3
        assert stats["cmdstat_evalsha"]["calls"] == 4 + 3


async def test_a_primary_without_its_replica_refuses_writes_and_the_others_go_on(
    durable: Cluster, client: RedisCluster
) -> None:
    store = store_of(client)
    await store.durability.prepare("replicated")
    conversations = conversations_on_each_primary(1)
    for conversation in conversations:
        assert (await store.ingest(message(n=1, conversation=conversation))).accepted
    durable.replicas[0].kill()
    began = time.monotonic()
    with pytest.raises(StoreUnavailable, match=f"no replica .* within {TIMEOUT_MS} ms"):
        await store.ingest(message(n=2, conversation=conversations[0]))
    assert time.monotonic() - began < TIMEOUT_MS / 1000 + 1.5
    for conversation in conversations[1:]:
        assert (await store.ingest(message(n=2, conversation=conversation))).version == 2

    # Start-up refuses the level while a primary has no replica, and names it.
    def replica_gone() -> bool:
        with durable.primaries[0].admin() as admin:
            return int(admin.info("replication")["connected_slaves"]) == 0

    wait_until(replica_gone, 5, "the primary to see its replica gone")
    with pytest.raises(Refused, match=f"primary 127.0.0.1:{durable.primaries[0].port}"):
        await Durability(client).prepare("replicated")
    assert await Durability(client).prepare("local") == ()


async def test_a_stale_slot_map_and_an_emptied_script_cache_are_followed(
    durable: Cluster, client: RedisCluster
) -> None:
    store = store_of(client)
    await store.durability.prepare("replicated")
    first, second, _ = conversations_on_each_primary(1)
    assert (await store.ingest(message(n=1, conversation=first))).accepted
    # The client believes the slot is another primary's: that one answers MOVED.
    slot = key_slot(Keys(first).state.encode())
    manager = client.nodes_manager
    owner = manager.slots_cache[slot]
    manager.slots_cache[slot] = manager.slots_cache[key_slot(Keys(second).state.encode())]
    for primary in durable.primaries:
        with primary.admin() as admin:
            admin.script_flush()
    assert (await store.ingest(message(n=2, conversation=first))).version == 2
    assert manager.slots_cache[slot][0] is owner[0]
    assert on_replica(durable, first, "v") == b"2"


async def test_a_slot_mid_migration_is_followed_with_asking(
    durable: Cluster, client: RedisCluster
) -> None:
    store = store_of(client)
    await store.durability.prepare("replicated")
    conversation = conversations_on_each_primary(1)[0]
    slot = key_slot(Keys(conversation).state.encode())
    source, target = durable.primaries[0], durable.primaries[1]
    with target.admin() as admin:
        admin.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", durable.ids[source.port])
    with source.admin() as admin:
        admin.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", durable.ids[target.port])
    # A new conversation's keys are not on the source: it answers ASK. The target serves a
    # script of several keys there only once it has them all (TRYAGAIN): retryable.
    with pytest.raises(StoreUnavailable, match="TRYAGAIN"):
        await store.ingest(message(n=1, conversation=conversation))
    with target.admin() as admin:
        assert admin.info("commandstats")["cmdstat_asking"]["calls"] == 1
    # The migration ends (nothing to move): the source answers MOVED, the target takes it.
    for primary in (target, source):
        with primary.admin() as admin:
            admin.execute_command("CLUSTER SETSLOT", slot, "NODE", durable.ids[target.port])
    assert (await store.ingest(message(n=1, conversation=conversation))).accepted
    with target.admin() as admin:
        assert admin.execute_command("CLUSTER COUNTKEYSINSLOT", slot) > 0
        assert admin.info("commandstats")["cmdstat_wait"]["calls"] >= 1


async def test_a_runtime_answers_bursts_on_every_primary_at_replicated(
    durable: Cluster, make_settings: SettingsFactory
) -> None:
    conversations = conversations_on_each_primary(2)
    settings = make_settings(
        redis_url=durable.url,
        replica_id="r1",
        durability="replicated",
        durability_wait_ms=TIMEOUT_MS,
    )
    async with runtime_on(settings) as (runtime, outbound):
        for conversation in conversations:
            for n in (1, 2, 3):
                assert await runtime.ingest(message(n=n, conversation=conversation))
        await outbound.wait_for(len(conversations))
        for conversation in conversations:
            await settled(runtime, conversation, version=3)
    assert sorted(s.conversation for s in outbound.sent) == sorted(conversations)
    for conversation in conversations:
        assert on_replica(durable, conversation, "w") == b"3"


async def test_doctor_probes_every_primary(
    durable: Cluster, make_settings: SettingsFactory
) -> None:
    settings = make_settings(redis_url=durable.url, durability="replicated")
    check = await durability_check(settings, 5.0)
    assert check.ok, check
    assert "WAIT 1" in check.detail
    weak = durable.primaries[2]
    with weak.admin() as admin:
        admin.config_set("appendonly", "no")
    check = await durability_check(settings, 5.0)
    assert not check.ok
    assert f"primary 127.0.0.1:{weak.port}" in check.detail
    assert check.fix == NO_AOF_FIX
