"""/stop across replicas: `lastword run` processes (Telegram webhook, the OpenAI client on the
fake provider, a real server). The user asks for something long on one replica and sends
/stop to another while the first generates: the generation is cancelled at once, and the only
reply is "Stopped."."""

from __future__ import annotations

import time

import pytest

from bot.commands import STOPPED
from tests.support.waits import settled
from tests.support.world import CHAT, CONVERSATION, World

pytestmark = pytest.mark.timeout(60)


async def test_stop_on_another_replica_cancels_the_generation_and_answers_stopped(
    world: World,
) -> None:
    telegram, provider = world.telegram, world.provider
    provider.delay_s = 10.0  # a long answer, streamed
    async with world.bot("a") as first, world.bot("b") as second:
        await first.post(telegram.private_text_update(CHAT, CHAT, "write me a long essay"))
        request = await provider.wait_for_request(timeout=15)
        stopped_at = time.monotonic()
        await second.post(telegram.private_text_update(CHAT, CHAT, "/stop"))
        await provider.wait_for_request(lambda r: r is request and r.cancelled, timeout=5)
        reaction = time.monotonic() - stopped_at
        await telegram.wait_for_sent(1, timeout=15)
        await settled(world.redis, CONVERSATION, version=2, within_s=10)
    assert reaction < 0.3, f"the generation ran on {reaction:.3f} s after /stop was stored"
    assert [m.text for m in telegram.sent_messages] == [STOPPED]
    assert provider.requests == [request]  # nothing generated again for what was stopped
