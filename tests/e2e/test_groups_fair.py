"""No one holds the room, end to end: three `lastword run` replicas in webhook mode against the
fake Bot API enforcing Telegram's limits (20 messages a minute in a group, one a second in a
chat). One member mentions the bot once a second, within the per-person rate; on a budget
served first come, first served her replies would spend the group's minute within 20 s and
the next person to ask would wait for it to pass. Shared fairly (bot/outbound/pacing.py), she gets
the group's slots at her share of its rate, her newer messages fold into fewer replies, and the
other member is answered at once.

The budget's rules on their own are tested against a real server in tests/store/test_budget.py.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from redis.asyncio import Redis

from bot.message import Place
from bot.store import Keys
from bot.store.embedded import EmbeddedRedis
from tests.support.fakes.telegram_server import FakeTelegram, RecordedCall, telegram_limits
from tests.support.waits import eventually
from tests.support.webhook_fleet import core_waits, described, fleet, post, why_late

pytestmark = pytest.mark.timeout(150)

GROUP = -1003
MALLORY, BOB = 201, 202
FLOOD_S, BOB_AT_S = 25, 22


def said_to(fake: FakeTelegram, ids: set[int]) -> list[RecordedCall]:
    return [c for c in fake.bot_replies_in(GROUP) if c.reply_to_message_id in ids]


async def test_a_member_flooding_the_group_does_not_hold_another_members_reply(
    server: EmbeddedRedis, redis: Redis, short_dir: Path
) -> None:
    async with (
        FakeTelegram(limits=telegram_limits()) as fake,
        fleet(
            server,
            fake,
            short_dir,
            LASTWORD_GROUPS__ALLOWED=str(GROUP),
            LASTWORD_TELEGRAM__DRAFTS="false",
            # Each of her messages a burst of its own, as far as the window goes: a second
            # apart, they would each be answered on a budget that let them.
            LASTWORD_DEBOUNCE__QUIET_MS="300",
            LASTWORD_DEBOUNCE__MAX_WAIT_MS="600",
        ) as replicas,
    ):
        mallory: dict[int, str] = {}
        waits = core_waits(replicas, server)
        waits.start()
        try:
            began = time.monotonic()
            bob_id, bob_at, bob_wall = 0, 0.0, 0.0
            for n in range(FLOOD_S):
                await asyncio.sleep(max(0.0, began + n - time.monotonic()))
                text = f"@fake_bot question m{n:02d}"
                update = fake.group_text_update(GROUP, MALLORY, text, first_name="Mallory")
                assert await post(replicas[n % 3], update) == 200
                mallory[int(update["message"]["message_id"])] = f"m{n:02d}"
                if n == BOB_AT_S:
                    update = fake.group_text_update(
                        GROUP, BOB, "@fake_bot one for me", first_name="Bob"
                    )
                    bob_at, bob_wall = time.monotonic(), time.time()
                    assert await post(replicas[1], update) == 200
                    bob_id = int(update["message"]["message_id"])

            async def bob_answered() -> list[RecordedCall]:
                return said_to(fake, {bob_id})

            [to_bob] = await eventually(bob_answered, within_s=30, what="Bob's reply")
        finally:
            await waits.stop()
        # First come, first served, Mallory's twenty replies by then would have held him
        # until the first of them left the group's minute, some 40 s. The bound allows what
        # the processes waited for a core meanwhile: on an idle machine nothing.
        late = to_bob.at - bob_at
        waited = waits.between(bob_wall, bob_wall + late)
        replies = [
            f"{c.at - bob_at:+.1f} s to {'Bob' if c.reply_to_message_id == bob_id else 'Mallory'}"
            for c in fake.bot_replies_in(GROUP)
        ]
        assert late < 5.0 + waited, (
            f"{late:.2f} s, {waited:.2f} s waited for a core; the group's replies, from Bob's "
            f"message: {', '.join(replies)}\n{why_late(fake, replicas)}"
        )

        # Nothing of hers lost: every message she sent is covered by a reply to her, each a
        # reply to the last message it covers.
        async def settled() -> bool:
            for user in (MALLORY, BOB):
                keys = Keys(Place("telegram", str(GROUP), str(user), group=True).conversation)
                v, w = await redis.hmget(keys.state, ["v", "w"])
                if v is None or v != w or await redis.exists(keys.outbox):
                    return False
            return True

        await eventually(settled, within_s=30, what="every message answered")
        to_her = said_to(fake, set(mallory))
        covered = " ".join(str(c.text) for c in to_her)
        assert [tag for tag in mallory.values() if tag not in covered] == []
        # Folded: fewer replies than messages, none over the platform's limits.
        assert len(to_her) < len(mallory)
        assert fake.limits is not None
        assert fake.limits.violations == [], described(fake.limits.violations)
