"""One outbound budget for the fleet, end to end: three `lastword run` replicas in webhook mode
against the fake Bot API enforcing Telegram's limits (at most N calls in any sliding second,
bot-wide and per chat; a call past them is refused with a 429 and counted as a violation).

Each replica paces its calls by the budget they share in Redis (bot/outbound/pacing.py): a stampede
of replies goes out at the bot-wide rate without one violation, previews are shed before a reply
waits, a 429 that one replica hears holds the others, and a Redis outage lets nothing through blind.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import re
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from bot.store.budget import SPREAD_COUNT
from bot.store.embedded import EmbeddedRedis
from tests.support.console import clean_env
from tests.support.discord_runs import discord_bots
from tests.support.fakes.discord_server import FakeDiscord, discord_limits
from tests.support.fakes.telegram_server import (
    FakeTelegram,
    RecordedCall,
    telegram_limits,
)
from tests.support.operations import lastword
from tests.support.telegram_runs import bot_env, webhook_bot
from tests.support.waits import eventually
from tests.support.webhook_fleet import Replica, described, fleet, post, replies

pytestmark = pytest.mark.timeout(180)

# The calls that count against Telegram's bot-wide limit.
SENDING = ("sendMessage", "sendMessageDraft", "sendChatAction")


async def shed(replicas: list[Replica], call: str) -> int:
    """Previews of `call` the replicas shed, from their /metrics."""
    total = 0
    async with aiohttp.ClientSession() as session:
        for port in (replica.metrics for replica in replicas):
            async with session.get(f"http://127.0.0.1:{port}/metrics") as response:
                text = await response.text()
            found = re.search(rf'^lastword_outbound_shed_total{{call="{call}"}} (\S+)$', text, re.M)
            total += int(float(found.group(1))) if found else 0
    return total


async def test_a_stampede_goes_out_at_the_bot_wide_rate_with_previews_shed_first(
    server: EmbeddedRedis, short_dir: Path
) -> None:
    users = 200
    async with (
        FakeTelegram(limits=telegram_limits()) as fake,
        fleet(
            server,
            fake,
            short_dir,
            LASTWORD_TELEGRAM__DRAFT_INTERVAL_MS="200",
            LASTWORD_LLM__ECHO_WORD_MS="100",
        ) as replicas,
    ):
        updates = [
            fake.private_text_update(chat, chat, f"what is the news for user {chat} today")
            for chat in range(7000, 7000 + users)
        ]
        # Everyone at once, spread over the replicas as a load balancer would.
        statuses = await asyncio.gather(
            *(post(replicas[n % 3], update) for n, update in enumerate(updates))
        )
        assert statuses == [200] * users
        await fake.wait_for_sent(users, timeout=120)

        by_chat = replies(fake)
        assert len(fake.sent_messages) == users  # none lost, none twice
        for chat in range(7000, 7000 + users):
            assert by_chat[chat] == [f"You said: what is the news for user {chat} today"]
        assert fake.limits is not None
        assert fake.limits.violations == [], described(fake.limits.violations)
        # The bot-wide budget was the bottleneck: replies took at least the floor it allows,
        # and the previews made room for them.
        sent = [c.at for c in fake.calls_to("sendMessage") if c.ok]
        assert max(sent) - min(sent) >= (users - 30) / 30
        assert await shed(replicas, "typing") > 0
        assert await shed(replicas, "draft") > 0


async def test_a_429_heard_by_one_replica_holds_every_replica(
    server: EmbeddedRedis, short_dir: Path
) -> None:
    users, hold_s = 12, 4
    async with (
        FakeTelegram(limits=telegram_limits()) as fake,
        fleet(server, fake, short_dir, LASTWORD_TELEGRAM__DRAFTS="false") as replicas,
    ):
        # Telegram does not say what a 429 is about: one chat's holds that chat, and the
        # first three replies' 429s, three chats within a second or so, hold the bot.
        fake.fail_next("sendMessage", *[fake.too_many_requests(hold_s)] * SPREAD_COUNT)
        # Users 0.3 s apart, on every replica: their replies come due while the third one's
        # 429 holds the bot.
        for n, chat in enumerate(range(8000, 8000 + users)):
            update = fake.private_text_update(chat, chat, f"hi {chat}")
            assert await post(replicas[n % 3], update) == 200
            await asyncio.sleep(0.3)
        await fake.wait_for_sent(users, timeout=60)

        refused = max(
            (c for c in fake.calls_to("sendMessage") if c.status == 429), key=lambda c: c.at
        )
        # Calls allowed before the hold was recorded may land after the 429 (as late as a
        # replica's loop stalls on a loaded machine); none after that until the hold ends,
        # though replies came due on every replica meanwhile.
        grace_s = 1.0
        during: list[RecordedCall] = [
            c
            for method in SENDING
            for c in fake.calls_to(method)
            if refused.at + grace_s < c.at < refused.at + hold_s
        ]
        assert during == [], [(c.method, c.chat_id, round(c.at - refused.at, 2)) for c in during]
        due_meanwhile = [
            c for c in fake.calls_to("sendMessage") if c.ok and c.at >= refused.at + hold_s
        ]
        assert len(due_meanwhile) >= 4
        by_chat = replies(fake)
        assert {chat: len(texts) for chat, texts in by_chat.items()} == {
            chat: 1 for chat in range(8000, 8000 + users)
        }


@pytest.mark.fresh_server
async def test_a_redis_outage_lets_nothing_past_the_limit_when_it_returns(
    server: EmbeddedRedis, short_dir: Path
) -> None:
    users = 40
    async with (
        FakeTelegram(limits=telegram_limits(per_second=10)) as fake,
        fleet(
            server,
            fake,
            short_dir,
            LASTWORD_TELEGRAM__DRAFTS="false",
            LASTWORD_TELEGRAM__MESSAGES_PER_SECOND="10",
        ) as replicas,
    ):
        updates = [fake.private_text_update(c, c, f"hello {c}") for c in range(9000, 9000 + users)]
        statuses = await asyncio.gather(
            *(post(replicas[n % 3], update) for n, update in enumerate(updates))
        )
        assert statuses == [200] * users
        await fake.wait_for_sent(10, timeout=60)
        # Redis goes away in the middle of the backlog, and comes back.
        await asyncio.to_thread(server.stop)
        down_at = time.monotonic()
        await asyncio.sleep(3.0)
        # From this thread: the server dies with the thread that started it (PDEATHSIG).
        server.start()
        chats = set(range(9000, 9000 + users))

        async def everyone_answered() -> bool:
            # Not a count of sends: a reply whose commit the outage cut off goes out again.
            return set(replies(fake)) >= chats

        await eventually(everyone_answered, within_s=120, what="a reply to every user")

        assert fake.limits is not None
        assert fake.limits.violations == [], described(fake.limits.violations)
        # Everyone answered. A reply sent just before the outage whose commit it cut off goes
        # out again, the same text (the known limit of a platform that cannot deduplicate:
        # docs/guarantees.md), never a second answer.
        by_chat = replies(fake)
        assert set(by_chat) == chats
        assert all(len(set(texts)) == 1 for texts in by_chat.values())
        # Nothing went out blind while the store was down (beyond calls already allowed).
        blind = [c for c in fake.calls_to("sendMessage") if down_at + 1.0 < c.at < down_at + 3.0]
        assert blind == []


async def test_replies_into_one_group_from_every_replica_keep_to_the_group_rate(
    server: EmbeddedRedis, short_dir: Path
) -> None:
    group, per_minute, each = -1001234567890, 6, 4
    async with FakeTelegram(limits=telegram_limits(group_per_minute=per_minute)) as fake:
        env = bot_env(
            server,
            fake,
            short_dir,
            LASTWORD_TELEGRAM__GROUP_MESSAGES_PER_MINUTE=str(per_minute),
            LASTWORD_TELEGRAM__CHAT_MESSAGES_PER_SECOND="1",
        )
        workers = [
            await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "tests.support.pacer_worker",
                f"telegram:{group}",
                str(each),
                env=env | {"LASTWORD_REPLICA_ID": f"r{n}"},
                stdout=asyncio.subprocess.PIPE,
            )
            for n in range(3)
        ]
        try:
            # Three replicas, twelve messages for one group at once: the group's minute
            # takes six, one a second in the chat; the rest wait for the minute to pass.
            await fake.wait_for_sent(per_minute, timeout=60)
            first = min(c.at for c in fake.sent_messages)
            with contextlib.suppress(TimeoutError):
                await fake.wait_for_sent(
                    per_minute + 1, timeout=max(0.0, first + 8 - time.monotonic())
                )
            assert len(fake.sent_messages) == per_minute
            assert fake.limits is not None
            assert fake.limits.violations == [], described(fake.limits.violations)
            gaps = [b.at - a.at for a, b in itertools.pairwise(fake.sent_messages)]
            assert min(gaps) >= 0.9  # and one a second in the chat
        finally:
            for worker in workers:
                # One that sent all its messages within the minute has exited already.
                with contextlib.suppress(ProcessLookupError):
                    worker.kill()
                await worker.wait()


async def test_a_discord_429_past_what_discord_py_waits_holds_the_bot_and_shows_in_status(
    server: EmbeddedRedis, short_dir: Path
) -> None:
    user = 31337
    async with FakeDiscord(limits=discord_limits()) as fake:
        channel = fake.dm_channel(user)
        async with discord_bots(1, server, fake, short_dir):
            fake.fail_next_post(channel, FakeDiscord.rate_limited(40, global_=True))
            await fake.user_sends(user, "hi")
            await fake.wait_for(lambda: any(p.status == 429 for p in fake.posts), timeout=30)
            env = clean_env(short_dir / "status", LASTWORD_REDIS_URL=server.url)

            async def held() -> list[dict[str, object]]:
                result = await asyncio.to_thread(lastword, "status", "--json", env=env)
                assert result.returncode == 0, result.stderr
                found: list[dict[str, object]] = json.loads(result.stdout)["held"]
                return found

            [hold] = await eventually(held, within_s=10, what="the 429's hold in status")
            assert (hold["platform"], hold["scope"]) == ("discord", "bot")
            assert 0 < int(str(hold["ends_in_ms"])) <= 40_000
            # The reply waits for the hold to end: not tried again blind.
            await asyncio.sleep(2)
            assert [p.status for p in fake.posts] == [429]
            assert fake.limits is not None and fake.limits.violations == []


async def test_a_reply_waiting_its_turn_is_still_checked_against_newer_messages(
    server: EmbeddedRedis, short_dir: Path
) -> None:
    hold_s = 4
    async with (
        FakeTelegram(limits=telegram_limits()) as fake,
        webhook_bot(
            server,
            fake,
            short_dir,
            LASTWORD_TELEGRAM__DRAFTS="false",
            LASTWORD_TELEGRAM__CHAT_MESSAGES_PER_SECOND="1",
        ) as bot,
    ):
        # Three chats refused at once: the bot is held (one would hold only its chat).
        pinging = (1, 3, 4)
        fake.fail_next("sendMessage", *[fake.too_many_requests(hold_s)] * len(pinging))
        for chat in pinging:
            assert await bot.post(fake.private_text_update(chat, chat, "ping")) == 200
        await fake.wait_for_calls("sendMessage", len(pinging), timeout=30)
        # The bot is held: a second user's reply waits its turn, and they write again meanwhile.
        assert await bot.post(fake.private_text_update(2, 2, "one")) == 200
        await asyncio.sleep(1.2)
        assert await bot.post(fake.private_text_update(2, 2, "two")) == 200
        await fake.wait_for_sent(len(pinging) + 1, timeout=30)
        with contextlib.suppress(TimeoutError):
            await fake.wait_for_sent(len(pinging) + 2, timeout=2)
        # One reply covering both, not a stale one to "one" that waited past "two".
        assert replies(fake) == {chat: ["You said: ping"] for chat in pinging} | {
            2: ["You said: one / two"]
        }
