"""A person is one user of one platform, wherever they write: their daily budget, their rate,
/usage and /forget are theirs across their DM and every group and topic, never one place's.
Over a real server, with the Runtime and the fake model (as tests/core/test_groups_store.py); the
person's keys themselves at the store (bounded: a capped index, keys that expire)."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import pytest
from redis.asyncio import Redis

from bot.commands import OVER_BUDGET, RATE_LIMITED
from bot.commands.forget import CONFIRM, forgotten
from bot.core.runtime import Runtime
from bot.message import InboundMessage, Place, Said
from bot.store import (
    DAY_KEEP_MS,
    MONTH_KEEP_MS,
    PLACES_CAP,
    RATE_WINDOW_MS,
    Heard,
    Ingested,
    Keys,
)
from bot.store.keys import PersonKeys
from tests.support.chatting import fake
from tests.support.factories import RuntimeFactory, SettingsFactory
from tests.support.fakes.openai_server import FAKE_MODEL_ID, FakeOpenAI
from tests.support.fakes.outbound import RecordingOutbound
from tests.support.scripts import build
from tests.support.waits import eventually, settled

__all__ = ["fake"]  # the fixture, imported for pytest

pytestmark = pytest.mark.timeout(60)

ANN, BOB = "1", "2"
GROUP, OTHER, SILENT = "-100", "-200", "-300"
# A DM whose chat is the user (Telegram's: the person's home, in their slot), and one whose
# channel has an id of its own (Discord's).
HOME, CHANNEL = "home", "channel"


def dm_place(who: str, kind: str) -> Place:
    return Place("test", who if kind == HOME else f"dm-{who}", who)


def group_place(who: str, chat: str = GROUP, topic: str = "") -> Place:
    return Place("test", chat, who, topic, group=True)


def conv(who: str, chat: str = GROUP) -> str:
    return group_place(who, chat).conversation


_ids = iter(range(1, 1_000_000))


def at(place: Place, text: str, *, mentioned: bool = False) -> InboundMessage:
    """A new message said at `place`."""
    name = {ANN: "Ann", BOB: "Bob"}.get(place.sender, place.sender)
    return InboundMessage.at(
        place,
        f"m{next(_ids)}",
        text,
        display_name=name,
        timestamp=time.time(),
        mentioned=mentioned,
    )


async def person_replica(
    runtime_factory: RuntimeFactory, fake: FakeOpenAI, *, rate: int = 0, **llm: Any
) -> tuple[Runtime, RecordingOutbound]:
    base = {"provider": "openai", "base_url": fake.base_url, "api_key": "k"}
    return await runtime_factory(
        llm=base | {"model": FAKE_MODEL_ID, "retries": 0} | llm,
        groups={"allowed": [GROUP, OTHER]},
        access={"rate_per_minute": rate},
    )


async def answered(bot: Runtime, message: InboundMessage) -> None:
    """Take `message` in and wait for its reply."""
    assert await bot.ingest(message)
    await settled(bot, message.conversation)


async def test_a_person_over_their_budget_in_dms_gets_the_budgets_answer_in_groups_and_topics(
    runtime_factory: RuntimeFactory, fake: FakeOpenAI
) -> None:
    bot, chat = await person_replica(runtime_factory, fake, daily_tokens_per_user=1)
    await answered(bot, at(dm_place(ANN, HOME), "hello"))
    assert len(fake.requests) == 1
    for place in (group_place(ANN), group_place(ANN, topic="7"), group_place(ANN, OTHER)):
        await answered(bot, at(place, "@bot and here?", mentioned=True))
        assert chat.texts(place.conversation) == [OVER_BUDGET]
    assert len(fake.requests) == 1
    # The budget is the person's: Bob, in the same group, is answered.
    await answered(bot, at(group_place(BOB), "@bot hi", mentioned=True))
    assert len(fake.requests) == 2


async def test_usage_in_a_group_shows_the_persons_total_across_places(
    runtime_factory: RuntimeFactory, fake: FakeOpenAI, redis: Redis
) -> None:
    bot, chat = await person_replica(runtime_factory, fake)
    await answered(bot, at(dm_place(ANN, CHANNEL), "hello"))
    await answered(bot, at(group_place(ANN, OTHER), "@bot hi", mentioned=True))
    today = datetime.now(UTC).date()
    spent = int(await redis.hget(PersonKeys("test", ANN).day(today), "tokens") or 0)
    dm = Keys(dm_place(ANN, CHANNEL).conversation)
    assert 0 < int(await redis.hget(dm.day(today), "tokens") or 0) < spent

    place = group_place(ANN, topic="7")
    await answered(bot, at(place, "/usage@bot", mentioned=True))
    (usage,) = chat.texts(place.conversation)
    assert usage.startswith(f"Today: {spent:,} tokens (")
    assert f"This month: {spent:,} tokens (" in usage
    assert "Of these, here: 0 today and 0 this month" in usage


@pytest.mark.parametrize("dm", [HOME, CHANNEL])
async def test_forget_in_a_group_erases_the_person_everywhere_and_no_one_else(
    runtime_factory: RuntimeFactory, fake: FakeOpenAI, redis: Redis, dm: str
) -> None:
    bot, chat = await person_replica(runtime_factory, fake)
    ann_dm, bob_dm = dm_place(ANN, dm), dm_place(BOB, dm)
    await answered(bot, at(ann_dm, "my secret is 42"))
    await answered(bot, at(ann_dm, "/persona Talk like a pirate."))
    await answered(bot, at(bob_dm, "my secret is 7"))
    await answered(bot, at(bob_dm, "/persona Be brief."))
    # Lines said to another group's room, to others, never to the bot.
    assert not await bot.ingest(at(group_place(ANN, OTHER), "my number is 555"))
    assert not await bot.ingest(at(group_place(BOB, OTHER), "mine is 666"))
    other_room = Keys(group_place(ANN, OTHER).conversation).room
    assert await redis.llen(other_room) == 2

    here = group_place(ANN)
    await answered(bot, at(here, "/forget@bot", mentioned=True))
    assert chat.texts(here.conversation) == [CONFIRM]
    await answered(bot, at(here, "/forget@bot", mentioned=True))
    # Here, the DM, and the other group's room.
    assert chat.texts(here.conversation)[-1] == forgotten(3)

    ann = Keys(ann_dm.conversation)
    assert await bot.store.history(ann_dm.conversation) == []
    assert await redis.hget(ann.state, "persona") is None
    room = [str(line) for line in await redis.lrange(other_room, 0, -1)]
    assert len(room) == 1 and "666" in room[0]
    # Bob's are untouched.
    assert len(await bot.store.history(bob_dm.conversation)) == 4
    assert await redis.hget(Keys(bob_dm.conversation).state, "persona") == b"Be brief."
    # Erased places leave the index: a /forget again erases here alone.
    assert await redis.zrange(PersonKeys("test", ANN).places, 0, -1) == []
    # Today's spending stays: a /forget never renews a budget.
    today = datetime.now(UTC).date()
    assert int(await redis.hget(PersonKeys("test", ANN).day(today), "tokens") or 0) > 0


async def test_the_rate_is_the_persons_across_a_dm_and_two_groups(
    runtime_factory: RuntimeFactory, fake: FakeOpenAI, redis: Redis
) -> None:
    bot, chat = await person_replica(runtime_factory, fake, rate=3)
    assert await bot.ingest(at(dm_place(ANN, HOME), "one"))
    assert await bot.ingest(at(group_place(ANN), "@bot two", mentioned=True))
    assert await bot.ingest(at(group_place(ANN, OTHER), "@bot three", mentioned=True))
    over = at(group_place(ANN, topic="7"), "@bot four", mentioned=True)
    assert not await bot.ingest(over)
    assert not await bot.ingest(at(dm_place(ANN, HOME), "five"))
    # In a group the bot is silent in, over the rate: still silent, no notice.
    assert not await bot.ingest(at(group_place(ANN, SILENT), "@bot six", mentioned=True))
    assert not await bot.ingest(at(dm_place(ANN, CHANNEL), "seven"))
    assert bot.stats.rate_limited == 3

    # Told once, where the rate was first passed.
    async def notices() -> list[str]:
        return [s.conversation for s in chat.sent if s.text == RATE_LIMITED]

    assert await eventually(notices, what="the rate's notice") == [over.conversation]
    # Someone else's rate is their own.
    assert await bot.ingest(at(group_place(BOB), "@bot hi", mentioned=True))
    assert not await redis.exists(Keys(group_place(ANN, SILENT).conversation).state)


async def test_a_follow_up_counts_against_the_rate_and_a_room_line_does_not(
    make_settings: SettingsFactory, redis: Redis
) -> None:
    store = build(make_settings, redis, access={"rate_per_minute": 2}, quiet=5000, max_wait=9000)

    def heard(message: InboundMessage) -> Heard:
        return Heard("allowed", "1" if message.mentioned else "0", Said.of(message, 100).to_json())

    async def ingest(message: InboundMessage) -> Ingested:
        return await store.ingest(message, heard=heard(message))

    assert (await ingest(at(group_place(BOB), "lunch?"))).overheard
    assert (await ingest(at(group_place(ANN), "@bot hi", mentioned=True))).accepted
    # Ann's window is open: her unaddressed line follows up her burst, and counts.
    assert (await ingest(at(group_place(ANN), "in Paris"))).accepted
    # Said to another group's room: noted for /forget, not counted.
    assert (await ingest(at(group_place(ANN, "-400"), "hello all"))).overheard
    over = await ingest(at(group_place(ANN, OTHER), "@bot and here", mentioned=True))
    assert over.limited and over.first_limited
    noted = await redis.zrange(PersonKeys("test", ANN).places, 0, -1)
    places = (conv(ANN), conv(ANN, "-400"), conv(ANN, OTHER))
    assert sorted(noted) == sorted(p.encode() for p in places)


async def test_a_message_delivered_again_counts_once_against_the_rate(
    make_settings: SettingsFactory, redis: Redis
) -> None:
    """A platform redelivers a message whose ingest it saw fail (on a cluster, the place's
    node was down after the person's step had counted it): counted each time, a node's
    outage would use up the person's rate and drop their next messages."""
    store = build(make_settings, redis, access={"rate_per_minute": 2}, quiet=5000, max_wait=9000)
    first = at(group_place(ANN), "@bot hi", mentioned=True)
    heard = Heard("allowed", "1", Said.of(first, 100).to_json())
    assert (await store.ingest(first, heard=heard)).accepted
    for _ in range(3):
        assert not (await store.ingest(first, heard=heard)).limited
        assert (
            await store.note_person(
                first.conversation, ANN, counts=True, message_id=first.message_id
            )
            == "ok"
        )
    second = at(group_place(ANN, OTHER), "@bot and here", mentioned=True)
    assert (await store.ingest(second, heard=heard)).accepted
    third = await store.ingest(at(group_place(ANN), "@bot more", mentioned=True), heard=heard)
    assert third.limited and third.first_limited
    # At most the rate's count remembered, for the rate's window.
    person = PersonKeys("test", ANN)
    assert await redis.hlen(person.counted) == 2
    assert 0 < await redis.pttl(person.counted) <= RATE_WINDOW_MS


async def test_a_persons_keys_are_bounded(make_settings: SettingsFactory, redis: Redis) -> None:
    store = build(make_settings, redis, access={"rate_per_minute": 5}, retention_days=1.0)
    retention_ms = 86_400_000
    person = PersonKeys("test", ANN)
    # A place spoken in longer ago than the retention: nothing is left there to erase.
    await redis.zadd(person.places, {"test:-1||1": 1})
    places = [group_place(ANN, f"-{n}").conversation for n in range(2, PLACES_CAP + 7)]
    await store.note_person(places[0], ANN, counts=False)
    assert await redis.zrange(person.places, 0, -1) == [places[0].encode()]
    for place in places[1:]:
        await store.note_person(place, ANN, counts=True)
    named = set(await redis.zrange(person.places, 0, -1))
    assert len(named) == PLACES_CAP and named <= {p.encode() for p in places}
    assert 0 < await redis.pttl(person.places) <= retention_ms
    assert 0 < await redis.pttl(person.rate) <= RATE_WINDOW_MS

    await store.add_usage(places[0], ANN, 10, 5)
    today = datetime.now(UTC).date()
    assert 0 < await redis.pttl(person.day(today)) <= DAY_KEEP_MS
    assert 0 < await redis.pttl(person.month(today)) <= MONTH_KEEP_MS
