"""Redis Cluster: a real three-primary cluster (each primary with a replica), named by one
node's `redis://` URL and nothing else. Conversations spread over every primary; the runtime,
roles, heartbeats, usage, the sweep, `lastword status` and `lastword doctor` work across
them; a primary killed mid-run makes Store calls fail with `StoreUnavailable` only, until its
replica has taken over."""

from __future__ import annotations

import json
import time

import pytest
from redis.exceptions import (
    ClusterCrossSlotError,
    ClusterDownError,
    ClusterError,
    MasterDownError,
    MovedError,
    RedisClusterException,
    SlotNotCoveredError,
    TryAgainError,
)

import adapters
from bot.message import Scope
from bot.ops import doctor
from bot.service.app import make_store
from bot.service.cli import show_status
from bot.store import BudgetKeys, Keys, StoreUnavailable, lease_token, reaching_redis
from bot.store.census import collect
from bot.store.connect import mode_of, open_client
from tests.support.builders import message
from tests.support.clusters import (
    Cluster,
    cluster,
    conversations_on_each_primary,
    primary_of,
    runtime_on,
)
from tests.support.factories import SettingsFactory
from tests.support.waits import eventually, settled

__all__ = ["cluster"]  # the fixture, imported for pytest

pytestmark = pytest.mark.timeout(40)

BOT = Scope("bot", 2, 1.0)


def holders(cluster: Cluster, conversations: list[str]) -> dict[int, set[str]]:
    """Primary port -> the conversations whose state key it holds."""
    found: dict[int, set[str]] = {}
    for server in cluster.primaries:
        found[server.port] = set()
        with server.admin() as client:
            for conversation in conversations:
                try:
                    if client.exists(Keys(conversation).state):
                        found[server.port].add(conversation)
                except MovedError:
                    pass  # the slot is another node's
    return found


async def test_bursts_are_answered_in_conversations_on_every_primary(
    cluster: Cluster, make_settings: SettingsFactory
) -> None:
    conversations = conversations_on_each_primary(2)
    settings = make_settings(redis_url=cluster.url, replica_id="r1")
    async with runtime_on(settings) as (runtime, outbound):
        assert mode_of(runtime.store.redis) == "cluster"
        for conversation in conversations:
            for n in (1, 2, 3):
                assert await runtime.ingest(message(n=n, conversation=conversation))
        await outbound.wait_for(len(conversations))
        for conversation in conversations:
            await settled(runtime, conversation, version=3)
        # One reply per burst, covering its three messages.
        assert sorted(s.conversation for s in outbound.sent) == sorted(conversations)
        assert all("text 1" in s.text and "text 3" in s.text for s in outbound.sent)
        # The interrupt watch reads V of conversations on every primary in one call.
        assert await runtime.store.versions(conversations) == [(3, 0)] * len(conversations)
    held = holders(cluster, conversations)
    assert all(held.values()), f"a primary holds no conversation: {held}"
    assert set().union(*held.values()) == set(conversations)


async def test_roles_heartbeats_usage_sweep_status_and_doctor(
    cluster: Cluster, make_settings: SettingsFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    conversations = conversations_on_each_primary(1, prefix="test:swept-")
    base = make_settings(redis_url=cluster.url, debounce={"quiet_ms": 50, "max_wait_ms": 500})
    feeder = make_store(base, await open_client(cluster.url))
    try:
        # The sweep: every shard's due-index, on every primary, in one pipelined call.
        for conversation in conversations:
            assert (await feeder.ingest(message(n=1, conversation=conversation))).accepted

        async def all_due() -> bool:
            return set(await feeder.due()) == set(conversations)

        await eventually(all_due, 5, what="every conversation in the sweep")
        # The catch-up after a platform gap reads every shard's activity index.
        assert set(await feeder.recent("test", 60_000)) == set(conversations)

        # Usage lands in the shards of three primaries; status adds it up.
        for conversation in conversations:
            await feeder.add_usage(conversation, "u1", 100, 10)
        assert (await feeder.today()).users == len(conversations)
        # An admin's /deny reaches every shard, whichever primary holds it.
        await feeder.change_access("u9", "access", "deny", by="admin")
        for conversation in conversations:
            denied = message(n=2, conversation=conversation, user="u9")
            assert (await feeder.ingest(denied)).refused
        # The outbound budget: a platform's scopes share one slot, asked and held as one.
        budget, scopes = BudgetKeys(base.platform), (BOT, Scope("chat:1", 1, 1.0))
        first = await feeder.take(
            budget, scopes, call="message", ticket="t1", order_ms=0, grant="1"
        )
        await feeder.done(budget, scopes, "1", used=True)
        second = await feeder.take(
            budget, scopes, call="message", ticket="t2", order_ms=0, grant="2"
        )
        assert (first.status, second.status, second.scope) == ("granted", "wait", "chat:1")
        await feeder.hold(budget, "bot", 60_000)

        async with (
            runtime_on(base.model_copy(update={"replica_id": "r1"})) as (one, out_one),
            runtime_on(base.model_copy(update={"replica_id": "r2"})) as (two, out_two),
        ):
            # Neither runtime heard of these messages: their sweeps find and answer them.
            async def answered() -> bool:
                sent = {s.conversation for s in out_one.sent + out_two.sent}
                return sent >= set(conversations)

            await eventually(answered, 10, what="the sweep to answer every conversation")

            # One holder of a role across replicas, whatever node holds its slot.
            token = lease_token("r1")
            fence = await one.store.claim_role("poller", token, 10_000)
            assert fence
            assert await two.store.claim_role("poller", lease_token("r2"), 10_000) is None
            assert await one.store.renew_role("poller", token, fence, 10_000)

            client = await open_client(cluster.url)
            try:

                async def both_beat() -> bool:
                    status = await collect(client)
                    return {r.id for r in status.replicas} >= {"r1", "r2"}

                await eventually(both_beat, 5, what="both heartbeats in the status")
                status = await collect(client)
            finally:
                await client.aclose()
            # `lastword status`, given nothing but the URL.
            capsys.readouterr()
            assert await show_status(base, as_json=True) == 0
            shown = json.loads(capsys.readouterr().out)
            assert {r["id"] for r in shown["replicas"]} >= {"r1", "r2"}
        assert [(r.name, r.lease.holder) for r in status.roles] == [("poller", "r1")]
        assert status.tokens_today is not None
        assert status.tokens_today.prompt >= 300 and status.tokens_today.completion >= 30
        assert {s.conversation for s in status.tokens_today.top} >= set(conversations)
        assert [(r.user, r.access) for r in status.access] == [("u9", "deny")]
        assert [(h.platform, h.scope) for h in status.held] == [(base.platform, "bot")]
    finally:
        await feeder.close()

    checks = {
        c.name: c
        for c in await doctor.run_checks(
            make_settings(redis_url=cluster.url), platform_check=adapters.check
        )
    }
    store, scripts = checks["store"], checks["scripts"]
    assert store.ok and scripts.ok, (store, scripts)
    assert "Redis Cluster" in store.detail and "3 primaries" in store.detail
    assert "3 replicas" in store.detail and "on all 6 nodes" in store.detail
    for server in cluster.servers:
        assert f":{server.port}" in store.detail
    assert "each of the 3 primaries" in scripts.detail


async def test_a_store_call_during_a_failover_is_unavailable_until_the_replica_takes_over(
    cluster: Cluster, make_settings: SettingsFactory
) -> None:
    [conversation] = [c for c in conversations_on_each_primary(1) if primary_of(c) == 0]
    others = conversations_on_each_primary(1, prefix="test:other-")
    store = make_store(make_settings(redis_url=cluster.url), await open_client(cluster.url))
    try:
        assert (await store.ingest(message(n=1, conversation=conversation))).accepted
        cluster.primaries[0].kill()
        refusals = 0
        n = 2
        deadline = time.monotonic() + 25
        while True:
            try:
                await store.ingest(message(n=n, conversation=conversation))
                await store.versions([conversation, *others])
                await store.due()
                break
            except StoreUnavailable:
                refusals += 1
                n += 1
            # Anything else fails the test here, as it is.
            assert time.monotonic() < deadline, "the replica never took over"
        assert refusals > 0, "no call failed while the primary was down"
        assert cluster.replicas[0].port in cluster.primary_ports()
    finally:
        await store.close()


@pytest.mark.parametrize(
    "error",
    [
        ClusterDownError("The cluster is down"),
        MasterDownError("Link with MASTER is down and replica-serve-stale-data is set to 'no'."),
        TryAgainError("Multiple keys request during rehashing of slot"),
        MovedError("6272 127.0.0.1:7001"),
        ClusterError("TTL exhausted."),
        SlotNotCoveredError("Command # 1 (GET x) of pipeline: slot 6272 is not covered"),
        RedisClusterException("Redis Cluster cannot be connected. Please provide at least one"),
        RedisClusterException("All slots are not covered after query all startup_nodes."),
    ],
    ids=lambda e: type(e).__name__,
)
def test_the_cluster_clients_errors_are_retryable(error: Exception) -> None:
    """As redis-py's cluster client raises them (its parser strips the reply's code)."""
    with pytest.raises(StoreUnavailable), reaching_redis():
        raise error


@pytest.mark.parametrize(
    "error",
    [
        ClusterCrossSlotError("Keys in request don't hash to the same slot"),
        RedisClusterException("No way to dispatch this command to Redis Cluster."),
    ],
    ids=lambda e: type(e).__name__,
)
def test_a_bug_is_not_made_retryable(error: Exception) -> None:
    with pytest.raises(type(error)), reaching_redis():
        raise error


async def test_a_person_whose_slot_is_down_is_still_heard_in_a_place_on_another_node(
    cluster: Cluster, make_settings: SettingsFactory
) -> None:
    # A person's keys live in their home's slot (on primary 0 here); they write in a place on
    # primary 1 (a DM whose chat is not the user, as on Discord) and one on primary 2.
    user = next(f"p{n}" for n in range(1000) if primary_of(f"test:p{n}") == 0)
    _, here, there = conversations_on_each_primary(1, prefix="test:elsewhere-")
    settings = make_settings(redis_url=cluster.url, debounce={"quiet_ms": 0, "max_wait_ms": 0})
    store = make_store(settings, await open_client(cluster.url))
    try:
        for n, place in enumerate((here, there), 1):
            assert (await store.ingest(message(n=n, conversation=place, user=user))).accepted
            await store.add_usage(place, user, 10, 5)
        assert (await store.spending(here, user)).today == 30  # the person's, both places
        # Primary 0 and its replica gone for good, the other primaries serving their slots.
        for primary in cluster.primaries[1:]:
            with primary.admin() as admin:
                admin.config_set("cluster-require-full-coverage", "no")
        cluster.replicas[0].kill()
        cluster.primaries[0].kill()
        # The place's messages are still taken in (the person's rate not counted meanwhile),
        # and its budget check reads the place's own counts: a node down stops only its own.
        assert (await store.ingest(message(n=3, conversation=here, user=user))).accepted
        spent = await store.spending(here, user)
        assert (spent.today, spent.here_today.prompt) == (15, 10)
    finally:
        await store.close()
