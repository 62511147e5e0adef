"""Redis Sentinel: a real primary, its replica and three Sentinels, named by a
`redis+sentinel://` URL. The runtime answers through the primary the Sentinels name; after
the primary is killed (SIGKILL) and the Sentinels promote the replica, it follows and
answers again, with nothing restarted."""

from __future__ import annotations

import pytest

import adapters
from bot.message import Unavailable
from bot.ops import doctor
from bot.store.connect import mode_of
from tests.support.builders import message
from tests.support.clusters import MASTER_NAME, SentinelSetup, runtime_on, sentinel
from tests.support.factories import SettingsFactory
from tests.support.waits import eventually, settled

__all__ = ["sentinel"]  # the fixture, imported for pytest

pytestmark = pytest.mark.timeout(40)


async def test_doctor_names_the_primary_the_sentinels_name(
    sentinel: SentinelSetup, make_settings: SettingsFactory
) -> None:
    checks = {
        c.name: c
        for c in await doctor.run_checks(
            make_settings(redis_url=sentinel.url), platform_check=adapters.check
        )
    }
    store, scripts = checks["store"], checks["scripts"]
    assert store.ok and scripts.ok, (store, scripts)
    assert "Sentinel mode (3 Sentinels)" in store.detail
    assert f"primary {MASTER_NAME!r} at 127.0.0.1:{sentinel.primary.port}" in store.detail
    assert f"1 replica (127.0.0.1:{sentinel.replica.port})" in store.detail


async def test_the_runtime_follows_a_failover(
    sentinel: SentinelSetup, make_settings: SettingsFactory
) -> None:
    conversation = "test:sentinel"
    async with runtime_on(make_settings(redis_url=sentinel.url)) as (runtime, outbound):
        assert mode_of(runtime.store.redis) == "sentinel"
        assert await runtime.ingest(message(n=1, conversation=conversation))
        await outbound.wait_for(1)
        await settled(runtime, conversation, version=1)

        sentinel.primary.kill()

        async def promoted() -> bool:
            return sentinel.master_port() == sentinel.replica.port

        await eventually(promoted, 15, what="the Sentinels to promote the replica")

        async def taken_in() -> bool:
            try:
                return await runtime.ingest(message(n=2, conversation=conversation))
            except Unavailable:
                return False  # not stored: a platform would deliver it again

        await eventually(taken_in, 10, what="the runtime to store a message again")
        await outbound.wait_for(2)
        await settled(runtime, conversation)
        assert "text 2" in outbound.sent[-1].text
