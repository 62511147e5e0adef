"""Waits that lose nothing and cost nothing (issue 47), end to end: three `lastword run`
replicas in webhook mode sharing one outbound budget in a real Redis, against the fake Bot
API enforcing Telegram's limits, through the faults lastword survives everywhere else: a
replica killed mid-backlog, a Redis restart, 429s long, odd and spread over chats, and a
budget that lost its keys.

The bot-wide limit is raised from Telegram's 30 a second (to RATE, or half of it), in the
fake and in the replicas alike, so that a backlog of USERS replies takes a second or two, not
several: each fault shows the same at that scale.
"""

from __future__ import annotations

import asyncio
import re
import signal
import time
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from redis.asyncio import Redis

from bot.store import BudgetKeys
from bot.store.budget import IN_FLIGHT_MS, LAPSE_MS, SPREAD_MS
from bot.store.embedded import EmbeddedRedis
from tests.support.fakes.openai_server import FAKE_MODEL_ID, FakeOpenAI
from tests.support.fakes.telegram_server import FakeTelegram, RecordedCall, telegram_limits
from tests.support.waits import eventually
from tests.support.webhook_fleet import (
    Replica,
    core_waits,
    described,
    fleet,
    post,
    replies,
    why_late,
)

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]

RATE = 100
USERS = 150
# What a loaded machine adds to a bound measured in replies at RATE: a replica's event loop
# late by a second now and then, the replies' windows closing (quiet_ms) and their answers.
SLACK_S = 1.5
# A 429's wait, as the fake says it: an hour, Telegram's longest flood waits.
HOUR = 3600


def backlog(model: FakeOpenAI | None = None, rate: int = RATE, **extra: str) -> dict[str, str]:
    """The replicas' settings for a backlog at `rate`: the budget's bot-wide limit as the fake's,
    no drafts (each would be one more call in the bot-wide second), a stop that does not wait
    out a hold for the replies still waiting (they are handed over), and the model: `model`'s
    (its requests counted), else the echo; `extra` on top."""
    settings = {
        "LASTWORD_TELEGRAM__MESSAGES_PER_SECOND": str(rate),
        "LASTWORD_TELEGRAM__DRAFTS": "false",
        "LASTWORD_SHUTDOWN_GRACE_S": "1",
    }
    if model is not None:
        settings |= {
            "LASTWORD_LLM__PROVIDER": "openai",
            "LASTWORD_LLM__BASE_URL": model.base_url,
            "LASTWORD_LLM__API_KEY": "k",
            "LASTWORD_LLM__MODEL": FAKE_MODEL_ID,
        }
    return settings | extra


def spread(chats: Sequence[int], replicas: Sequence[Replica]) -> list[tuple[int, Replica]]:
    """Each user of `chats` with the replica their DM goes to, as a load balancer spreads them."""
    return [(chat, replicas[n % len(replicas)]) for n, chat in enumerate(chats)]


async def stampede(fake: FakeTelegram, users: Sequence[tuple[int, Replica]]) -> None:
    """One DM from each user at once, each to its replica's webhook, delivered again until
    accepted, as Telegram does (a replica short of time for its store answers 503)."""

    async def deliver(chat: int, replica: Replica) -> None:
        update = fake.private_text_update(chat, chat, f"news for {chat}, please")

        async def accepted() -> bool:
            return await post(replica, update) == 200

        await eventually(accepted, within_s=30, what=f"the webhook to take {chat}'s message")

    await asyncio.gather(*(deliver(chat, replica) for chat, replica in users))


async def answered(fake: FakeTelegram, chats: Collection[int], within_s: float) -> float:
    """Wait until every user of `chats` has a reply; when the last of them first got one."""

    async def all_of_them() -> bool:
        return set(replies(fake)) >= set(chats)

    async def missing() -> str:
        unanswered = sorted(set(chats) - set(replies(fake)))
        return f"{len(unanswered)} of {len(chats)} unanswered, e.g. {unanswered[:5]}"

    await eventually(all_of_them, within_s, what="a reply to every user", describe=missing)
    return max(first_replies(fake, chats).values())


def first_replies(fake: FakeTelegram, chats: Collection[int]) -> dict[int, float]:
    """When each user of `chats` that has a reply got their first."""
    first: dict[int, float] = {}
    for call in fake.sent_messages:
        if call.chat_id in chats and isinstance(call.chat_id, int):
            first.setdefault(call.chat_id, call.at)
    return first


def once_each(fake: FakeTelegram, chats: Collection[int]) -> dict[int, list[str | None]]:
    """The users of `chats` that did not get exactly one reply, with what they got."""
    by_chat = replies(fake)
    return {chat: by_chat.get(chat, []) for chat in chats if len(by_chat.get(chat, [])) != 1}


def one_answer_each(fake: FakeTelegram, chats: Collection[int]) -> dict[int, list[str | None]]:
    """The users of `chats` without exactly one answer. The same text sent again is one answer:
    a reply sent just before its replica died, not yet committed, goes out again, the known
    limit of a platform that cannot deduplicate (docs/guarantees.md); a second text is not."""
    by_chat = replies(fake)
    return {chat: by_chat.get(chat, []) for chat in chats if len(set(by_chat.get(chat, []))) != 1}


def refused(fake: FakeTelegram) -> list[RecordedCall]:
    return [c for c in fake.calls_to("sendMessage") if c.status == 429]


async def test_a_replica_killed_mid_backlog_costs_the_survivors_only_its_own_replies(
    server: EmbeddedRedis, short_dir: Path
) -> None:
    # A quarter of the rate, so that half the users outnumber what it lets out in three
    # seconds (however slowly a loaded machine writes their replies, most must wait); leases
    # longer than the 10 s its places were kept before; a hold short, but long enough to kill
    # the replica in it on a quiet machine.
    rate, lease_s, hold_s = RATE // 4, 12.0, 4
    doomed_users = range(10_000, 10_000 + USERS // 2)
    later_users = range(20_000, 20_000 + USERS // 6)
    settings = backlog(rate=rate, LASTWORD_LEASE__TTL_MS=str(int(lease_s * 1000)))
    async with (
        FakeTelegram(limits=telegram_limits(per_second=rate)) as fake,
        fleet(server, fake, short_dir, each=lambda _: settings) as replicas,
    ):
        doomed, *survivors = replicas
        # Its users' conversations all its own (the others paused, so that none is taken
        # over early), and its replies all waiting their turn, held by three chats' 429s
        # (so that none is in flight when it dies: that one would hold its slots until it
        # lapses). More of them than the limit lets out in a second: places they left in the
        # queue would stop every reply behind them.
        fake.fail_next("sendMessage", *(fake.too_many_requests(hold_s) for _ in range(3)))
        for replica in survivors:
            replica.bot.process.send_signal(signal.SIGSTOP)
        try:
            await stampede(fake, [(chat, doomed) for chat in doomed_users])
            await refusals(fake, 3)
            await eventually(lambda: waited(doomed, rate + rate // 5), within_s=60, what="a queue")
            # And every call it made answered and counted: the calls granted before the hold
            # may still be on their way when the queue is there (a replica forked in a blink
            # gets that far fast), and one in flight at its death rightly holds its slots
            # until it lapses.
            await eventually(lambda: all_counted(fake, doomed), within_s=30, what="none in flight")
        finally:
            for replica in survivors:
                replica.bot.process.send_signal(signal.SIGCONT)
        await doomed.bot.kill()
        killed_at = time.monotonic()
        # Users who write meanwhile, to the replicas still up: their replies queue behind the
        # dead replica's, which wait for its leases to expire.
        await stampede(fake, spread(later_users, survivors))

        # Theirs go when the hold ends, the dead replica's places given back by then (as its
        # tickets lapse, within a couple of seconds), and at the limit.
        last = await answered(fake, later_users, within_s=60)
        first = min(first_replies(fake, later_users).values())
        assert first - killed_at <= hold_s + SLACK_S * 2, round(first - killed_at, 2)
        floor_s = len(later_users) / rate
        assert last - first <= floor_s * 1.3 + SLACK_S * 2, round(last - first, 2)
        # The dead replica's own, once its leases expire (and, for a call it had in flight if
        # the hold was over when it died, once that call's slots lapse: it may have landed).
        dead_s = lease_s + LAPSE_MS / 1000
        await answered(fake, doomed_users, within_s=dead_s + SLACK_S * 4)
        assert one_answer_each(fake, [*doomed_users, *later_users]) == {}


async def test_a_replica_killed_mid_call_holds_that_chat_until_the_call_lapses_not_longer(
    server: EmbeddedRedis, short_dir: Path
) -> None:
    # The reply's call is on its way (the platform hangs) when its replica dies: the platform
    # may have seen it, so its chat's slot stays taken until the call lapses, counted as made
    # then. Another replica resends the reply once the lease expires, a lapse and a period
    # later at most: not IN_FLIGHT_MS (the longest a live replica's call may take) later.
    lease_s, chat = 3.0, 40_000
    settings = backlog(LASTWORD_LEASE__TTL_MS=str(int(lease_s * 1000)))
    async with (
        FakeTelegram(limits=telegram_limits(per_second=RATE)) as fake,
        fleet(server, fake, short_dir, each=lambda _: settings) as replicas,
    ):
        doomed, *survivors = replicas
        for replica in survivors:
            replica.bot.process.send_signal(signal.SIGSTOP)
        fake.hang("sendMessage")
        try:
            await stampede(fake, [(chat, doomed)])

            async def on_its_way() -> bool:
                return any(call.chat_id == chat for call in fake.calls_to("sendMessage"))

            await eventually(on_its_way, within_s=30, what="the reply's call")
            await doomed.bot.kill()
            killed_at = time.monotonic()
        finally:
            fake.hang("sendMessage", False)
            for replica in survivors:
                replica.bot.process.send_signal(signal.SIGCONT)
        answered_at = await answered(fake, [chat], within_s=IN_FLIGHT_MS / 1000 + 30)
        # Its lease, the call's lapse and the chat's period, with a loaded machine's slack:
        # well short of IN_FLIGHT_MS.
        bound_s = lease_s + LAPSE_MS / 1000 + 1 + SLACK_S * 4
        late_s = answered_at - killed_at
        assert late_s <= bound_s, f"{late_s:.1f} s\n{why_late(fake, survivors)}"
        assert bound_s < IN_FLIGHT_MS / 1000 / 2
        assert one_answer_each(fake, [chat]) == {}


async def all_counted(fake: FakeTelegram, replica: Replica) -> bool:
    """Whether the replica has recorded the answer of every paced call the fake has seen (the
    others paused, all are its own): none of its calls is in flight."""
    made = sum(len(fake.calls_to(method)) for method in PACED_METHODS)
    return await counter(replica, 'lastword_budget_answers_recorded_total{outcome="used"}') >= made


# What the outbound budget paces on Telegram.
PACED_METHODS = ("sendMessage", "sendMessageDraft", "sendChatAction")


async def waited(replica: Replica, count: int) -> bool:
    """Whether `count` of the replica's replies have waited their turn bot-wide (its /metrics)."""
    return await counter(replica, 'lastword_outbound_waits_total{scope="bot"}') >= count


async def counter(replica: Replica, series: str) -> float:
    """The value of `series` (name and labels) in the replica's /metrics; -1 while absent."""
    url = f"http://127.0.0.1:{replica.metrics}/metrics"
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        text = await response.text()
    found = re.search(rf"^{re.escape(series)} (\S+)$", text, re.M)
    return float(found.group(1)) if found is not None else -1.0


@pytest.mark.fresh_server
async def test_a_flush_or_a_redis_restart_mid_backlog_costs_no_429_and_no_second_generation(
    server: EmbeddedRedis, redis: Redis, short_dir: Path
) -> None:
    flushed, restarted = range(30_000, 30_000 + USERS), range(31_000, 31_000 + USERS)
    async with (
        FakeOpenAI() as model,
        FakeTelegram(limits=telegram_limits(per_second=RATE)) as fake,
        # Leases that outlive the outage, as the default's 30 s do.
        fleet(
            server, fake, short_dir, each=lambda _: backlog(model, LASTWORD_LEASE__TTL_MS="10000")
        ) as replicas,
    ):
        await stampede(fake, spread(flushed, replicas))
        await fake.wait_for_sent(USERS // 3, timeout=60)
        # The budget's keys gone, as a flush or a failover that lost the latest writes would
        # leave it: it starts again as if its last period were full, not with a burst.
        budget = [key async for key in redis.scan_iter(match=f"{BudgetKeys('telegram').base}*")]
        assert budget
        await redis.delete(*budget)
        await answered(fake, flushed, within_s=60)
        assert fake.limits is not None
        assert fake.limits.violations == [], described(fake.limits.violations)
        assert one_answer_each(fake, flushed) == {}

        sent = len(fake.sent_messages)
        await stampede(fake, spread(restarted, replicas))
        await fake.wait_for_sent(sent + USERS // 5, timeout=60)
        owed = len(set(restarted) - set(replies(fake)))
        # What the processes wait for a core from now: the machine's part of the backlog's
        # time (the server's pid changes at the restart).
        waits = core_waits(replicas, server)
        waits.start()
        try:
            await asyncio.to_thread(server.stop)
            await asyncio.sleep(1.0)  # the outage
            # From this thread: the server dies with the thread that started it (PDEATHSIG).
            server.start()
            back_at, back_wall = time.monotonic(), time.time()
            last = await answered(fake, restarted, within_s=60)
        finally:
            await waits.stop()
        waited = waits.between(back_wall, back_wall + (last - back_at))
        # Every reply written once: those the outage caught are kept, their leases with them.
        # Checked first: a late reply is a slow path, a second one a broken promise.
        assert len(model.requests) == len(flushed) + len(restarted), why_late(fake, replicas)
        assert one_answer_each(fake, restarted) == {}
        after = sorted(c.at - back_at for c in fake.sent_messages if c.at > back_at)
        # Delivery resumes at once, at the limit (a few calls allowed before the outage may
        # land first), and the backlog goes as fast as if nothing had happened.
        # Both bounds allow what the processes waited for a core meanwhile: a busy machine
        # slows the backlog by that much, and an idle one (nothing waited) keeps them strict.
        assert after[RATE // 5] <= 1.0 + RATE // 5 / RATE + SLACK_S + waited, (
            f"{after[: RATE // 5 + 1]}, {waited:.2f} s waited for a core\n"
            f"{why_late(fake, replicas)}"
        )
        assert last - back_at <= owed / RATE * 1.3 + SLACK_S + waited, (
            f"{last - back_at:.2f} s for {owed}, {waited:.2f} s waited for a core\n"
            f"{why_late(fake, replicas)}"
        )


async def test_a_429_holds_the_chat_it_was_about_odd_waits_are_bounded_and_healthz_tells(
    server: EmbeddedRedis, short_dir: Path
) -> None:
    others = range(40_000, 40_030)
    flooded, absurd = 40_100, 40_101
    async with (
        FakeTelegram(limits=telegram_limits(per_second=RATE)) as fake,
        fleet(server, fake, short_dir, each=lambda _: backlog()) as replicas,
    ):
        # An hour's flood wait in one DM: that chat is held, and everyone else is answered as
        # if nothing happened, a wait no platform means (31 years) in another DM too.
        fake.fail_chat(flooded, fake.too_many_requests(HOUR), "sendMessage")
        fake.fail_chat(absurd, fake.too_many_requests(10**9), "sendMessage")
        await stampede(fake, spread([flooded], replicas))
        await refusals(fake, 1)
        await stampede(fake, spread([absurd, *others], replicas))
        await answered(fake, others, within_s=30)
        await refusals(fake, 2)
        assert {flooded, absurd}.isdisjoint(replies(fake))
        # A chat's hold is not the bot's: every replica reports it healthy.
        assert [await health(r) for r in replicas] == [(200, "ok", "ok")] * len(replicas)

        # Waits of 3 s, 0 and -1, in three chats at once (their 429s together hold the bot,
        # as briefly): each waits what it said, at least a second, and is answered once.
        # Apart from the hour's 429s by more than the span in which 429s add up.
        hour_heard = max(c.at for c in refused(fake))
        waits = {40_200: 3, 40_201: 0, 40_202: -1}
        await asyncio.sleep(max(0.0, hour_heard + SPREAD_MS / 1000 + SLACK_S - time.monotonic()))
        fake.fail_next("sendMessage", *(fake.too_many_requests(wait) for wait in waits.values()))
        await stampede(fake, spread(list(waits), replicas))
        await answered(fake, waits, within_s=30)
        told = {c.chat_id: c for c in refused(fake) if c.chat_id in waits}
        for chat, call in told.items():
            said = wait_of(call)
            delivered = first_replies(fake, [chat])[chat] - call.at
            assert max(said, 1) - 0.2 <= delivered <= max(said, 1) + 3 + SLACK_S * 3, (
                said,
                delivered,
            )
        assert once_each(fake, waits) == {}

        # Three chats refused within seconds: the whole bot is held, for an hour, and every
        # replica says so while the others' replies wait.
        held = [40_300, 40_301, 40_302]
        fake.fail_next("sendMessage", *(fake.too_many_requests(HOUR) for _ in held))
        await stampede(fake, spread(held, replicas))

        async def every_replica_degraded() -> bool:
            return all(
                code == 200 and status == "degraded" and outbound != "ok"
                for code, status, outbound in [await health(r) for r in replicas]
            )

        await eventually(every_replica_degraded, within_s=10, what="every /healthz degraded")

        # Nothing crashed on the way: each odd wait logged once, and no traceback.
        logs = [line for replica in replicas for line in replica.bot.log]
        assert all(replica.bot.process.returncode is None for replica in replicas)
        assert [line for line in logs if "Traceback" in line] == []
        assert sum("1e+09" in line for line in logs) == 1


def wait_of(call: RecordedCall) -> int:
    """The retry_after a 429 the fake answered said."""
    assert call.description is not None
    return int(call.description.rsplit(" ", 1)[1])


async def refusals(fake: FakeTelegram, count: int) -> None:
    """Wait until the fake has answered `count` messages with a 429."""

    async def enough() -> bool:
        return len(refused(fake)) >= count

    await eventually(enough, within_s=30, what=f"{count} 429s")


async def health(replica: Replica) -> tuple[int, str, str]:
    """A replica's /healthz: its HTTP status, its status word and its outbound check."""
    url = f"http://127.0.0.1:{replica.metrics}/healthz"
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        body: dict[str, Any] = await response.json()
    return response.status, body["status"], body["checks"].get("outbound", "missing")


async def test_a_long_hold_of_the_bot_generates_each_reply_once_through_a_replica_leaving(
    server: EmbeddedRedis, short_dir: Path
) -> None:
    hold_s, first, users = 8, [50_000, 50_001, 50_002], range(50_100, 50_130)
    async with (
        FakeOpenAI() as model,
        FakeTelegram(limits=telegram_limits(per_second=RATE)) as fake,
        fleet(
            server, fake, short_dir, each=lambda _: backlog(model, LASTWORD_SHUTDOWN_GRACE_S="3")
        ) as replicas,
    ):
        # Three chats refused at once: Telegram holds the whole bot.
        fake.fail_next("sendMessage", *(fake.too_many_requests(hold_s) for _ in first))
        await stampede(fake, spread(first, replicas))
        await refusals(fake, len(first))
        held_at = max(c.at for c in refused(fake))
        # Users who write meanwhile: their replies are written, and wait for the hold to end.
        await stampede(fake, spread(users, replicas))

        async def written() -> bool:
            done = [request for request in model.requests if request.finished]
            return len(done) >= len(first) + len(users)

        await eventually(written, within_s=hold_s, what="every reply written")
        # A replica stopped meanwhile (a deploy, its grace shorter than the hold, long enough
        # for a reply just written to pass its pre-send check): its replies wait on in their
        # outbox for the others to send; none is written again.
        code, _ = await replicas[0].bot.terminate()
        assert code == 0

        last = await answered(fake, [*first, *users], within_s=hold_s + 30)
        went = min(first_replies(fake, users).values())
        assert went >= held_at + hold_s - 0.5, round(went - held_at, 2)
        assert last - held_at <= hold_s + SLACK_S * 2, round(last - held_at, 2)
        assert len(model.requests) == len(first) + len(users)
        assert once_each(fake, [*first, *users]) == {}
