"""The outbound budget's scripts on their own, against a real server (bot/store/budget.py).

A scope allows `count` calls in any sliding period, counted from when each call was answered;
replies wait in the order their windows closed; previews are shed before a reply waits; a
429's hold stops every call under its scope until it ends. A group's scope is shared fairly
between the people its replies are for: each at their share of its rate, in turn.
"""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio import Redis

from bot.message import PREVIEWS_SCOPE, Call, Scope
from bot.outbound.pacing import shared_fairly
from bot.store import BudgetKeys, InFlight, Store, Taken
from bot.store.budget import FAIR_BURST, IN_FLIGHT_MS, LAPSE_MS, POLL_MS
from tests.support.waits import server_ms

pytestmark = pytest.mark.timeout(30)

KEYS = BudgetKeys("test")
BOT = Scope("bot", 3, 1.0)
CHAT = Scope("chat:7", 1, 1.0)


async def take(
    store: Store, *scopes: Scope, call: Call = "message", order: int = 0, n: int = 0
) -> Taken:
    """Call `n`'s ask (its ticket t<n>, its grant g<n>)."""
    return await store.take(KEYS, scopes, call=call, ticket=f"t{n}", order_ms=order, grant=f"g{n}")


async def test_a_scope_allows_its_count_then_says_when_the_oldest_leaves(store: Store) -> None:
    for n in range(3):
        assert (await take(store, BOT, n=n)).status == "granted"
        await store.done(KEYS, (BOT,), f"g{n}", used=True)
    refused = await take(store, BOT, n=9)
    assert refused.status == "wait"
    assert refused.scope == "bot"
    # The oldest was answered just now: it leaves the window a period later.
    assert 800 <= refused.wait_ms <= 1000


async def test_a_call_in_flight_fills_its_slot_until_answered(store: Store) -> None:
    assert (await take(store, CHAT, n=1)).status == "granted"
    # Not answered yet: nothing else may go, and its slot frees a period after its answer at
    # the soonest, which cannot come before now: asked again then (and the time an answer
    # takes), not polled meanwhile.
    waiting = await take(store, CHAT, n=2)
    assert waiting.status == "wait"
    assert waiting.wait_ms == 1000 + POLL_MS
    await asyncio.sleep(0.2)
    await store.done(KEYS, (CHAT,), "g1", used=True)
    after = await take(store, CHAT, n=2)
    # Counted from its answer, not from when it was allowed: a full period from now.
    assert after.status == "wait"
    assert after.wait_ms > 900


async def test_a_slot_given_back_is_free_again(store: Store) -> None:
    assert (await take(store, CHAT, n=1)).status == "granted"
    await store.done(KEYS, (CHAT,), "g1", used=False)
    assert (await take(store, CHAT, n=2)).status == "granted"


async def test_replies_go_in_the_order_their_windows_closed(store: Store) -> None:
    for n in range(3):
        assert (await take(store, BOT, n=n)).status == "granted"
        await store.done(KEYS, (BOT,), f"g{n}", used=True)
    # Two replies wait: the later window first asks first.
    assert (await take(store, BOT, order=2000, n=20)).status == "wait"
    assert (await take(store, BOT, order=1000, n=10)).status == "wait"
    await asyncio.sleep(1.05)
    # A slot frees (three, in fact): the earlier window gets one, and so does the later one,
    # since the earlier waits for a slot of its own, not all of them.
    assert (await take(store, BOT, order=2000, n=20)).status == "granted"
    assert (await take(store, BOT, order=1000, n=10)).status == "granted"


async def test_an_earlier_reply_keeps_its_place_when_one_slot_frees(store: Store) -> None:
    single = Scope("bot", 1, 0.5)
    assert (await take(store, single, n=0)).status == "granted"
    await store.done(KEYS, (single,), "g0", used=True)
    assert (await take(store, single, order=1000, n=10)).status == "wait"
    await asyncio.sleep(0.55)
    # The later reply asks first, but the earlier one is still waiting: it goes first.
    late = await take(store, single, order=2000, n=20)
    assert late.status == "wait"
    assert (await take(store, single, order=1000, n=10)).status == "granted"


async def test_a_waiter_that_stops_asking_loses_its_place(store: Store) -> None:
    single = Scope("bot", 1, 0.2)
    assert (await take(store, single, order=1000, n=10)).status == "granted"
    await store.done(KEYS, (single,), "g10", used=True)
    assert (await take(store, single, order=1000, n=11)).status == "wait"
    # Ticket 11 never asks again (its replica died): after LAPSE_MS, 20 goes.
    await asyncio.sleep(0.25)
    assert (await take(store, single, order=2000, n=20)).status == "wait"
    await store.redis.zadd(KEYS.tickets, {"t11": 0})  # as if its ticket had expired
    assert (await take(store, single, order=2000, n=20)).status == "granted"


async def test_previews_are_shed_before_a_reply_would_wait(store: Store) -> None:
    wide = Scope("bot", 6, 1.0)
    # Typing may use half the scope, drafts two thirds; replies all of it.
    assert [(await take(store, wide, call="typing", n=n)).status for n in range(4)] == [
        "granted",
        "granted",
        "granted",
        "shed",
    ]
    assert (await take(store, wide, call="draft", n=5)).status == "shed"
    assert (await take(store, wide, call="message", n=6)).status == "granted"
    assert (await take(store, wide, call="message", n=7)).status == "granted"
    assert (await take(store, wide, call="message", n=8)).status == "granted"
    assert (await take(store, wide, call="message", n=9)).status == "wait"


async def test_no_preview_while_a_reply_waits(store: Store) -> None:
    wide = Scope("bot", 4, 1.0)
    chat = Scope("chat:1", 1, 1.0)
    assert (await take(store, wide, chat, n=1)).status == "granted"
    # A second part to the same chat waits for the chat, and so queues there only: the bot
    # scope has room, and previews elsewhere still go.
    assert (await take(store, wide, chat, n=2)).status == "wait"
    assert (await take(store, wide, call="typing", n=3)).status == "granted"
    for n in range(4, 6):
        assert (await take(store, wide, n=n)).status in ("granted", "wait")
    # Now the bot scope is full and a reply waits there: no preview goes.
    assert (await take(store, wide, n=7)).status == "wait"
    assert (await take(store, wide, call="typing", n=8)).status == "shed"


async def test_a_hold_stops_every_call_under_its_scope_until_it_ends(
    store: Store, redis: Redis
) -> None:
    await store.hold(KEYS, "bot", 300)
    held = await take(store, BOT, CHAT, n=1)
    assert (held.status, held.scope, held.held) == ("wait", "bot", True)
    assert 200 < held.wait_ms <= 300
    assert (await take(store, BOT, call="typing", n=2)).status == "shed"
    # A shorter hold heard later does not cut it short.
    await store.hold(KEYS, "bot", 50)
    assert 0 < (await store.held(KEYS))["bot"] <= 300
    await asyncio.sleep(0.35)
    assert await store.held(KEYS) == {}
    assert (await take(store, BOT, CHAT, n=1)).status == "granted"
    # Nothing of the hold is left behind.
    assert not await redis.exists(KEYS.scope("bot")[2], KEYS.holds)


async def test_the_keys_expire_on_their_own(store: Store, redis: Redis) -> None:
    assert (await take(store, BOT, CHAT, n=1)).status == "granted"
    assert (await take(store, CHAT, n=2)).status == "wait"
    # A period past the longest a call may be kept in flight, and its lapse.
    longest = 1000 + IN_FLIGHT_MS + LAPSE_MS
    for key in (*KEYS.scope("bot")[:1], *KEYS.scope("chat:7")[:2], KEYS.tickets):
        assert 0 < await redis.pttl(key) <= longest, key


async def test_a_reply_deep_in_the_queue_is_told_when_its_turn_comes(store: Store) -> None:
    pair = Scope("bot", 2, 1.0)
    for n in range(2):
        assert (await take(store, pair, n=n)).status == "granted"
        await store.done(KEYS, (pair,), f"g{n}", used=True)
    waits = [(await take(store, pair, order=1000 * n, n=10 + n)).wait_ms for n in range(1, 5)]
    # Two slots a second: the first two waiters within the second, the next two a second on
    # and the time their calls take to answer (not polling every few ms meanwhile).
    assert all(0 < wait <= 1000 for wait in waits[:2]), waits
    assert all(1500 < wait <= 2000 + POLL_MS for wait in waits[2:]), waits


# -- a group's scope, shared fairly between people ---------------------------------------------


async def ask(
    store: Store,
    scope: Scope,
    person: str,
    order: int,
    name: str,
    *,
    grant: str = "",
    burst: int = 1,
) -> Taken:
    """`person`'s reply `name`, its window closed at `order`, asking for a slot of a group's
    `scope`; answered at once if granted. With no slot to run ahead of the pace (`burst` 1)
    unless told: the pace is what most tests here look at."""
    taken = await store.take(
        KEYS,
        (scope,),
        call="message",
        ticket=name,
        order_ms=order,
        grant=grant or name,
        person=person,
        fair={scope.name},
        burst=burst,
    )
    if taken.status == "granted":
        await store.done(KEYS, (scope,), grant or name, used=True)
    return taken


async def test_a_person_past_their_share_waits_while_another_is_granted_at_once(
    store: Store, redis: Redis
) -> None:
    group = Scope("group:-7", 10, 10.0)
    now = await server_ms(redis)
    assert (await ask(store, group, "mallory", now, "m1")).status == "granted"
    # Alone, her share is the whole scope at its pace: one slot a second.
    again = await ask(store, group, "mallory", now + 1, "m2")
    assert (again.status, again.scope, again.held) == ("wait", "group:-7", False)
    assert 500 < again.wait_ms <= 1000
    # The scope has nine slots free: Bob and Carol are not kept back by her.
    assert (await ask(store, group, "bob", now + 2, "b1")).status == "granted"
    assert (await ask(store, group, "carol", now + 3, "c1")).status == "granted"
    # Each one's share shrinks as more people share the scope: Bob's next slot is two
    # seconds after his first (two people then), Carol's three.
    assert 1500 < (await ask(store, group, "bob", now + 4, "b2")).wait_ms <= 2000
    assert 2500 < (await ask(store, group, "carol", now + 5, "c2")).wait_ms <= 3000


async def test_a_person_may_run_a_few_slots_ahead_and_a_newcomer_is_not_kept_back(
    store: Store, redis: Redis
) -> None:
    group = Scope("group:-12", 20, 60.0)
    now = await server_ms(redis)
    # A quick exchange in a quiet group: FAIR_BURST replies at once, then her pace (one slot
    # every 3 s, the scope's whole rate, while she is alone).
    for n in range(FAIR_BURST):
        taken = await ask(store, group, "mallory", now + n, f"m{n}", burst=FAIR_BURST)
        assert taken.status == "granted", n
    kept = await ask(store, group, "mallory", now + 10, "m-next", burst=FAIR_BURST)
    assert kept.status == "wait" and 2000 < kept.wait_ms <= 3000
    # The slots she ran ahead with leave the scope room: Bob goes at once.
    assert (await ask(store, group, "bob", now + 11, "b1", burst=FAIR_BURST)).status == "granted"


async def test_a_person_alone_is_served_at_the_scopes_whole_rate(
    store: Store, redis: Redis
) -> None:
    group = Scope("group:-8", 4, 1.0)
    told: list[int] = []
    order = await server_ms(redis)
    # One person asking for slot after slot, for a period and a half.
    for n in range(6):
        while (taken := await ask(store, group, "ann", order, f"a{n}")).status != "granted":
            told.append(taken.wait_ms)
            await asyncio.sleep(taken.wait_ms / 1000)
        order = await server_ms(redis)
    # Never told to wait longer than a slot's interval at the scope's whole rate (250 ms),
    # give or take the milliseconds between her asks (a slot counts from its grant, and her
    # next ask comes a little later on a busy machine): her share is all of it. Kept back by
    # her share of a scope shared with anyone else, she would be told 500 ms or more.
    assert told and max(told) <= 300, told


async def test_a_groups_slots_go_round_by_person_oldest_window_first(
    store: Store, redis: Redis
) -> None:
    group = Scope("group:-9", 1, 0.5)
    now = await server_ms(redis)
    # The slot is taken; Mallory has two replies waiting (two topics), Bob one, his window
    # closed last.
    await store.take(KEYS, (group,), call="message", ticket="x", order_ms=1, grant="x")
    await store.done(KEYS, (group,), "x", used=True)
    waiting = {"m2": ("mallory", now - 200), "m1": ("mallory", now - 300), "b1": ("bob", now)}
    served: list[str] = []
    deadline = asyncio.get_running_loop().time() + 5
    while waiting and asyncio.get_running_loop().time() < deadline:
        # Her newer reply asks first each time, then her older one, then Bob's.
        for name, (person, order) in list(waiting.items()):
            if (await ask(store, group, person, order, name)).status == "granted":
                served.append(name)
                del waiting[name]
        await asyncio.sleep(0.02)
    # Mallory's first, then Bob's though her second's window closed before his, then hers.
    assert served == ["m1", "b1", "m2"]


async def test_a_promised_part_is_not_kept_back_by_its_persons_share(
    store: Store, redis: Redis
) -> None:
    group = Scope("group:-10", 10, 10.0)
    now = await server_ms(redis)
    assert (await ask(store, group, "mallory", now, "m1")).status == "granted"
    assert (await ask(store, group, "mallory", now, "m2")).status == "wait"
    # The rest of a reply under way (order 0) goes at once, and counts towards her share.
    assert (await ask(store, group, "mallory", 0, "m1-part2")).status == "granted"
    after = await ask(store, group, "mallory", now, "m2")
    assert after.status == "wait"
    assert 1000 < after.wait_ms <= 2000


async def test_a_groups_record_of_people_is_trimmed_and_expires(store: Store, redis: Redis) -> None:
    group = Scope("group:-11", 10, 0.2)
    people = KEYS.people(group.name)
    now = await server_ms(redis)
    for n in range(30):
        await ask(store, group, f"p{n}", now, f"t{n}")
    assert await redis.zcard(people) == 30
    # However many people were heard from, the record lives a period past the latest due.
    latest = int(max(due or 0 for due in await redis.zmscore(people, [f"p{n}" for n in range(30)])))
    assert 0 < await redis.pttl(people) <= latest - now + 200
    # Ann keeps the record alive, asking for slot after slot: everyone not heard from within
    # a period past their due is dropped meanwhile.
    end = latest + 250
    while (at := await server_ms(redis)) < end:
        await ask(store, group, "ann", at, f"a{at}")
        await asyncio.sleep(0.03)
    assert await redis.zrange(people, 0, -1) == [b"ann"]
    await asyncio.sleep(0.5)
    assert not await redis.exists(people)


async def test_a_due_further_off_than_the_period_is_kept_until_it_comes(
    store: Store, redis: Redis
) -> None:
    group = Scope("group:-12", 1, 0.6)
    now = await server_ms(redis)
    assert (await ask(store, group, "bob", now, "b")).status == "granted"
    for _ in range(2):
        for name in ("carol", "ann"):
            assert (await ask(store, group, name, now, name)).status == "wait"
        await asyncio.sleep(0.3)
    await asyncio.sleep(max(0.0, (now + 650 - await server_ms(redis)) / 1000))
    assert (await ask(store, group, "ann", now, "ann")).status == "granted"
    # Three people share one slot in 0.6 s: her next is 1.8 s away, three periods, and the
    # record of it outlives the periods in between.
    await asyncio.sleep(0.8)
    later = await ask(store, group, "ann", await server_ms(redis), "ann2")
    assert later.status == "wait"
    assert 600 < later.wait_ms <= 1000


def test_a_groups_own_limits_are_shared_by_person_and_the_bots_and_a_dms_are_not() -> None:
    scopes = (Scope("bot", 30, 1.0), Scope("chat:-5", 1, 1.0), Scope("group:-5", 20, 60.0))
    assert shared_fairly("telegram:-5|7|42", scopes) == ("42", frozenset({"chat:-5", "group:-5"}))
    assert shared_fairly("telegram:-5||42", scopes) == ("42", frozenset({"chat:-5", "group:-5"}))
    assert shared_fairly("telegram:42", scopes[:2]) == ("", frozenset())


# -- waits that lose nothing: places given back, kept alive, and a budget that lost its keys ---


async def test_a_reply_that_stops_waiting_gives_its_place_back_at_once(store: Store) -> None:
    single = Scope("bot", 1, 0.3)
    assert (await take(store, single, n=0)).status == "granted"
    await store.done(KEYS, (single,), "g0", used=True)
    assert (await take(store, single, order=1000, n=10)).status == "wait"
    late = await take(store, single, order=2000, n=20)
    assert late.status == "wait"
    # Ticket 10 is cancelled (a newer message, a dying replica): it leaves, and 20 goes as
    # soon as the slot frees, not once 10's ticket would have lapsed.
    await store.leave(KEYS, (single,), "t10")
    await asyncio.sleep(late.wait_ms / 1000 + 0.02)
    assert (await take(store, single, order=2000, n=20)).status == "granted"


async def test_a_waiting_replys_place_lives_while_kept_and_lapses_soon_after(
    store: Store, redis: Redis
) -> None:
    single = Scope("bot", 1, 0.2)
    assert (await take(store, single, n=0)).status == "granted"
    await store.done(KEYS, (single,), "g0", used=True)
    assert (await take(store, single, order=1000, n=10)).status == "wait"
    # Its replica keeps it alive past the ticket's TTL: 20 stays behind it.
    for _ in range(4):
        await asyncio.sleep(LAPSE_MS / 1000 / 3)
        await store.keep(KEYS, ["t10", "t-gone"])
    assert (await take(store, single, order=2000, n=20)).status == "wait"
    assert await redis.zscore(KEYS.tickets, "t-gone") is None  # a gone one is not brought back
    # Its replica died: within the TTL its place is gone, and 20 goes.
    await asyncio.sleep(LAPSE_MS / 1000 + 0.05)
    assert (await take(store, single, order=2000, n=20)).status == "granted"


async def test_a_call_in_flight_lives_while_kept_and_lapses_soon_after(
    store: Store, redis: Redis
) -> None:
    single, chat = Scope("bot", 1, 0.2), Scope("chat:9", 1, 0.2)
    assert (await take(store, single, chat, n=1)).status == "granted"
    # Its call takes long (a slow platform): its replica keeps it in flight past the lapse,
    # in every scope it took, and nothing else goes meanwhile.
    for _ in range(4):
        await asyncio.sleep(LAPSE_MS / 1000 / 3)
        await store.keep(KEYS, [], [InFlight("g1", (single, chat)), InFlight("g-gone", (chat,))])
    assert (await take(store, single, n=2)).status == "wait"
    assert (await take(store, chat, n=3)).status == "wait"
    assert await redis.zscore(KEYS.scope("chat:9")[0], "g-gone") is None  # not brought back
    # Its replica died mid-call: the call counts as made when it lapses, and its slots come
    # back a period after that, not IN_FLIGHT_MS after it was granted.
    await asyncio.sleep(LAPSE_MS / 1000 + 0.2 + 0.05)
    assert (await take(store, single, n=2)).status == "granted"
    assert (await take(store, chat, n=3)).status == "granted"


async def test_a_budget_that_lost_its_keys_starts_as_if_its_last_period_were_full(
    store: Store, redis: Redis
) -> None:
    wide = Scope("bot", 4, 1.0)
    granted = [(await take(store, wide, n=n)).status for n in range(4)]
    assert granted == ["granted"] * 4
    # A flush takes every key of the budget, its epoch with them.
    for key in await redis.keys("{lw:out:test}*"):
        await redis.delete(key)
    cautious = await store.take(
        KEYS, (wide,), call="message", ticket="t9", order_ms=0, grant="g9", seen=True
    )
    assert cautious.status == "wait"
    assert 0 < cautious.wait_ms <= 250  # a quarter of the period: the first slot comes back
    # A first start (no replica has seen the budget) is not held back.
    assert (await take(store, Scope("bot", 4, 1.0), n=8)).status == "wait"  # the epoch is set
    fresh = BudgetKeys("fresh")
    first = await store.take(fresh, (wide,), call="message", ticket="t", order_ms=0, grant="g")
    assert first.status == "granted"


async def test_a_shorter_retry_after_heard_later_never_shortens_a_longer_hold(
    store: Store,
) -> None:
    await store.hold(KEYS, "chat:7", 2000)
    await store.hold(KEYS, "chat:7", 100)
    assert 1800 < (await store.held(KEYS))["chat:7"] <= 2000
    # Counted for every replica to read: two 429s, about two seconds held.
    count, held_ms = (await store.heard(KEYS))["chat"]
    assert count == 2
    assert 1990 <= held_ms <= 2000


async def test_several_chats_refused_close_together_hold_the_bot(store: Store) -> None:
    # Told what it is about (Discord): never wider, however many.
    for n in range(4):
        assert not await store.hold(KEYS, f"channel:{n}", 500)
    assert "bot" not in await store.held(KEYS)
    # Guessed (Telegram): a chat, then another, hold only themselves; the third widens.
    assert not await store.hold(KEYS, "chat:1", 500, spread=True)
    assert not await store.hold(KEYS, "chat:2", 500, spread=True)
    assert "bot" not in await store.held(KEYS)
    assert await store.hold(KEYS, "chat:3", 500, spread=True)
    assert 400 < (await store.held(KEYS))["bot"] <= 500


async def test_a_previews_429_holds_previews_and_never_replies(store: Store) -> None:
    wide = Scope("bot", 10, 1.0)
    await store.hold(KEYS, PREVIEWS_SCOPE, 500)
    assert (await take(store, wide, call="typing", n=1)).status == "shed"
    assert (await take(store, wide, call="draft", n=2)).status == "shed"
    assert (await take(store, wide, call="message", n=3)).status == "granted"


async def test_when_a_hold_ends_a_typing_call_is_shed_while_a_reply_waits(store: Store) -> None:
    wide = Scope("bot", 10, 1.0)
    await store.hold(KEYS, "bot", 150)
    held = await take(store, wide, order=1000, n=1)
    assert held.status == "wait"
    await asyncio.sleep(held.wait_ms / 1000 + 0.02)
    # The hold is over and the scope empty, but the reply's ticket lives: it goes first.
    assert (await take(store, wide, call="typing", n=2)).status == "shed"
    assert (await take(store, wide, order=1000, n=1)).status == "granted"
    assert (await take(store, wide, call="typing", n=3)).status == "granted"


async def test_a_draft_ranks_above_a_typing_indicator(store: Store) -> None:
    # Ten slots: typing leaves five free, a draft four (KEEP_FREE_PCT).
    ten = Scope("bot", 10, 1.0)
    typing = [(await take(store, ten, call="typing", n=n)).status for n in range(6)]
    assert typing == ["granted"] * 5 + ["shed"]
    assert (await take(store, ten, call="draft", n=6)).status == "granted"
    assert (await take(store, ten, call="draft", n=7)).status == "shed"
    assert (await take(store, ten, call="message", n=8)).status == "granted"


async def test_a_reply_behind_many_is_told_by_the_scopes_whole_rate(store: Store) -> None:
    # Ten slots a second, two of them used: the eight free ones go to the first eight
    # replies waiting, and the rest come round at ten a second, not two.
    ten = Scope("bot", 10, 1.0)
    for n in range(2):
        assert (await take(store, ten, n=n)).status == "granted"
        await store.done(KEYS, (ten,), f"g{n}", used=True)
    waits = [(await take(store, ten, order=1000 + n, n=10 + n)).wait_ms for n in range(30)]
    # The first eight are granted at once (0: asked, not waiting).
    assert waits[:8] == [0] * 8, waits
    # The 9th and 10th have the two recorded slots, a second after their answers; the 11th
    # to 18th the slots just taken, a period (and an answer's time) from now; the next ten a
    # round later.
    assert all(800 < wait <= 1000 for wait in waits[8:10]), waits
    assert all(1000 < wait <= 1000 + POLL_MS for wait in waits[10:18]), waits
    assert all(1800 < wait <= 2 * (1000 + POLL_MS) for wait in waits[18:28]), waits


async def test_a_reply_behind_many_is_told_by_the_scopes_count_not_the_calls_recorded(
    store: Store,
) -> None:
    ten = Scope("bot", 10, 1.0)
    for n in range(10):
        assert (await take(store, ten, n=n)).status == "granted"
    for n in range(8):
        await store.done(KEYS, (ten,), f"g{n}", used=True)
    await asyncio.sleep(0.5)
    for n in range(8, 10):
        await store.done(KEYS, (ten,), f"g{n}", used=True)
    # Thirty replies wait, told their turns; then eight calls leave the window, two stay.
    for n in range(30):
        assert (await take(store, ten, order=1000 + n, n=100 + n)).status == "wait"
    await asyncio.sleep(0.55)
    # One more, behind them all: 22 slots past the 8 free ones the waiting replies will take,
    # at ten a second: two rounds from now, not eleven (22 over the two calls recorded).
    last = await take(store, ten, order=5000, n=999)
    assert last.status == "wait"
    assert last.wait_ms <= 3 * (1000 + POLL_MS), last


async def test_an_ask_made_again_after_its_answer_was_lost_takes_no_second_slot(
    store: Store, redis: Redis
) -> None:
    single = Scope("bot", 1, 1.0)
    assert (await take(store, single, n=1)).status == "granted"
    # The answer never reached the replica (a cut connection): it asks again, the same grant.
    assert (await take(store, single, n=1)).status == "granted"
    assert await redis.zcard(KEYS.scope("bot")[0]) == 1
    assert (await take(store, single, n=2)).status == "wait"
