"""After a failover the store may be talking to a read-only replica: a clear, retryable error,
then business as usual once the node is promoted (SPEC: READONLY without a crash loop)."""

from __future__ import annotations

from pathlib import Path

import pytest
from redis.asyncio import Redis

from bot.service.app import make_store
from bot.store import StoreUnavailable
from bot.store.connect import Client, make_client
from bot.store.embedded import EmbeddedRedis
from tests.support.builders import message
from tests.support.factories import SettingsFactory
from tests.support.fakes.loopback import free_port
from tests.support.waits import eventually


async def test_a_read_only_replica_is_reported_then_promoted(
    short_dir: Path, make_settings: SettingsFactory
) -> None:
    primary = EmbeddedRedis(short_dir / "primary", port=free_port())
    primary.start()
    replica = EmbeddedRedis(short_dir / "replica")
    replica.start()
    client: Client | None = None
    try:
        async with Redis.from_url(primary.url) as source:
            # By default the primary waits 5 s for more replicas before a full sync.
            await source.config_set("repl-diskless-sync-delay", 0)
        admin = Redis.from_url(replica.url)
        await admin.replicaof("127.0.0.1", primary.port)

        async def synced() -> bool:
            info = await admin.info("replication")
            return info.get("master_link_status") == "up"

        await eventually(synced, within_s=10)
        client = make_client(replica.url)
        store = make_store(make_settings(), client)
        hello = message("hello")
        with pytest.raises(StoreUnavailable, match="read-only"):
            await store.ingest(hello)

        await admin.replicaof("NO", "ONE")  # the failover promotes it
        result = await store.ingest(hello)
        assert result.accepted and result.version == 1
        await admin.aclose()
    finally:
        if client is not None:
            await client.aclose()
        replica.stop()
        primary.stop()
