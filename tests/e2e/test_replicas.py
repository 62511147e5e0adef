"""The invariants with real processes: several replicas (``tests/support/replica.py``, each its own
OS process) share one real server and one fake LLM, and are fed over the normalized interface.

The fake LLM answers with the message tokens (``c<conv>m<n>``) it finds in the last user turn,
the one that folds the unanswered messages, so every delivered reply says exactly which
messages it covers. From the replies the replicas print, and from the store's own state, each
test checks, per conversation:

- I1: no message is covered by two delivered replies; reply versions strictly increase;
- I3: every accepted message is covered, within max_wait + LLM time + lease TTL + sweep
  interval (plus scheduling slack for a busy CI machine);
- I4, from the fences the replies carry (in their idempotency keys): each reply went out
  under its own lease, none under an older lease after one under a newer, none under a fence
  the store never granted;
- I5: V equals the number of distinct messages, however many times each was delivered;
- I6: the history holds every answered message and every reply, in order, matching what
  was delivered.

Then the same under failure: a replica killed with SIGKILL mid-generation, and a lease holder
paused with SIGSTOP past its lease and resumed. Every replica must also stop cleanly on SIGTERM;
the last test pins down why one once did not (a cancellation lost inside a store call).
"""

from __future__ import annotations

import asyncio
import random
import signal
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from redis.asyncio import Redis

from bot.commands import OVER_BUDGET
from bot.core.timers import Timers
from bot.service.app import make_store
from bot.store import Keys
from bot.store.embedded import EmbeddedRedis
from tests.support.factories import SettingsFactory
from tests.support.fakes.openai_server import FakeOpenAI, RecordedRequest
from tests.support.replica_fleet import (
    I3_BOUND_S,
    LLM_DELAY_S,
    PLATFORM,
    SEED,
    SWEEP_MS,
    TTL_MS,
    WORKLOAD_ENV,
    Cluster,
    Step,
    accepted_times,
    check_conversation,
    check_replies,
    conversation_of,
    covering_reply,
    message,
    plan_workload,
    process_state,
    quiet,
    settle,
    tokens,
)
from tests.support.waits import eventually

pytestmark = pytest.mark.timeout(90)


async def play(cluster: Cluster, steps: list[Step]) -> None:
    for step in steps:
        # Deliberate: the user's typing rhythm is what the workload is about.
        await asyncio.sleep(step.gap_s)
        await asyncio.gather(*(cluster.deliver(name, step.message) for name in step.targets))


async def test_random_bursts_across_replicas(
    server: EmbeddedRedis, redis: Redis, short_dir: Path
) -> None:
    rng = random.Random(SEED)
    async with (
        FakeOpenAI(reply=covering_reply) as fake,
        Cluster(server, fake, short_dir, size=3, env=WORKLOAD_ENV) as cluster,
    ):
        fake.delay_s = LLM_DELAY_S
        plans = plan_workload(rng, cluster.names, conversations=12)
        await asyncio.gather(*(play(cluster, steps) for steps in plans))
        messages = [step.message.message_id for steps in plans for step in steps]
        await settle(cluster, redis, messages, timeout=I3_BOUND_S + 5)
        await cluster.terminate_all()

        accepted = accepted_times(cluster)
        assert set(accepted) == set(messages)
        redelivered = sum(len(step.targets) > 1 for steps in plans for step in steps)
        assert redelivered > 0, "the seed must exercise redelivery"
        replies = 0
        for conv, steps in enumerate(plans):
            conversation = f"{PLATFORM}:{conv}"
            ids = {step.message.message_id for step in steps}
            mine = {m: t for m, t in accepted.items() if m in ids}
            replies += len(
                await check_conversation(
                    redis,
                    conversation,
                    mine,
                    cluster.sent(conversation),
                    core_waits=cluster.core_waits,
                )
            )
        # The debounce must actually fold bursts: far fewer replies than messages.
        assert replies < len(messages)
        assert len({e["replica"] for e in cluster.sent()}) > 1, "replies came from one replica"


async def test_kill_9_mid_generation(server: EmbeddedRedis, redis: Redis, short_dir: Path) -> None:
    rng = random.Random(SEED + 1)
    conversations = 6
    async with (
        FakeOpenAI(reply=covering_reply) as fake,
        Cluster(server, fake, short_dir, size=3) as cluster,
    ):
        names = cluster.names
        fake.hold()

        # Each conversation's first burst reaches one "home" replica only, so when a home dies
        # holding a conversation nobody else has heard of, only the sweep can recover it.
        def home(conv: int) -> str:
            return names[conv % len(names)]

        async def burst(conv: int) -> None:
            for n in (1, 2, 3):
                assert await cluster.deliver(home(conv), message(conv, n))

        await asyncio.gather(*(burst(c) for c in range(conversations)))

        def held_by(request: RecordedRequest) -> int:
            (conv,) = {
                int(conversation_of(t).split(":")[1]) for t in tokens(request.last_user_text)
            }
            return conv

        # Every conversation is now mid-generation somewhere.
        await fake.wait_for_request(
            lambda _: {held_by(r) for r in fake.requests} == set(range(conversations)),
            timeout=10,
        )
        # Odd conversations get no further message: a victim's odd one is an orphan.
        orphans = [r for r in fake.requests if held_by(r) % 2 and r.api_key == home(held_by(r))]
        assert orphans, "no home replica is generating its own odd conversation"
        victim_request = orphans[0]
        victim = victim_request.api_key
        victim_held = {held_by(r) for r in fake.requests if r.api_key == victim}
        await cluster.kill(victim)
        survivors = cluster.alive()
        assert victim not in survivors and len(survivors) == len(names) - 1

        # One more message to each even conversation, through the survivors: their drafts in
        # flight are now stale.
        evens = range(0, conversations, 2)
        await asyncio.gather(
            *(cluster.deliver(rng.choice(survivors), message(c, 4)) for c in evens)
        )
        expected = {
            c: [f"c{c}m{n}" for n in ((1, 2, 3, 4) if c % 2 == 0 else (1, 2, 3))]
            for c in range(conversations)
        }
        released_at = time.time()
        fake.release()
        await settle(
            cluster, redis, [t for ts in expected.values() for t in ts], timeout=I3_BOUND_S + 5
        )
        # The victim's connection died with it: its generation never completed.
        await fake.wait_for_request(lambda r: r is victim_request and r.cancelled, timeout=5)
        await cluster.terminate_all(survivors)

        assert victim not in {e["replica"] for e in cluster.sent()}
        for conv, wanted in expected.items():
            conversation = f"{PLATFORM}:{conv}"
            replies = await check_replies(cluster, redis, conversation, since=released_at)
            # Each draft in flight was discarded as stale, died with the victim, or went out
            # as it was: either way exactly one reply covers everything.
            assert [r.tokens for r in replies] == [wanted], conversation
        # A stale draft is cancelled mid-generation (interrupt, the default), or thrown away
        # by the pre-send check if the new message came too late to interrupt it; on a loaded
        # machine its replica may also have lost the lease first (renewals late past the TTL:
        # "lost the lease on pipe:0 mid-cycle; nothing sent from here"), and so sent nothing.
        stale_drafts = {c for c in evens if c not in victim_held}
        dropped = sum(
            int(cluster.stats(name).get(fate, 0))
            for name in survivors
            for fate in ("discarded", "interrupted", "lost")
        )
        assert dropped >= len(stale_drafts)


async def lease_when_stopped(
    cluster: Cluster, redis: Redis, name: str, conversation: str
) -> tuple[int, float]:
    """Once replica `name` is stopped (SIGSTOP sent), the fence of the lease it holds on
    `conversation` and when that lease expires (time.monotonic(), the fake's clock). A renewal
    it wrote just before stopping may land after this read: that only makes the lease end
    later than said, never earlier."""
    pid = cluster.replicas[name].process.pid

    async def stopped() -> bool:
        return process_state(pid).split()[1:2] == ["T"]

    await eventually(stopped, 5, what=f"{name} to be stopped")
    lease = Keys(conversation).lease
    fence, ttl_ms = await redis.hget(lease, "fence"), await redis.pttl(lease)
    assert fence is not None and ttl_ms > 0, f"{name} holds no lease on {conversation}"
    return int(fence), time.monotonic() + ttl_ms / 1000


async def test_paused_holder_is_fenced(
    server: EmbeddedRedis, redis: Redis, short_dir: Path
) -> None:
    async with (
        FakeOpenAI(reply=covering_reply) as fake,
        Cluster(server, fake, short_dir, size=3) as cluster,
    ):
        conversation = f"{PLATFORM}:0"
        fake.hold()
        for n in (1, 2):
            assert await cluster.deliver(cluster.names[0], message(0, n))
        # The generation covering both: one that took in only the first may have been
        # interrupted by the second, by its own holder.
        held = await fake.wait_for_request(lambda r: tokens(r.last_user_text) == ["c0m1", "c0m2"])
        holder = held.api_key

        cluster.signal(holder, signal.SIGSTOP)
        try:
            paused_fence, expires_at = await lease_when_stopped(
                cluster, redis, holder, conversation
            )
            released_at = time.time()
            # The paused holder's answer now waits in its socket; it cannot act on it.
            fake.release()
            takeover = await fake.wait_for_request(
                lambda r: r.api_key != holder and "c0m1" in tokens(r.last_user_text),
                timeout=(TTL_MS + SWEEP_MS) / 1000 + 5,
            )
            # I4: nobody else generated before the paused holder's lease expired, counted from
            # its last renewal (the lease's TTL once it could renew no more).
            assert takeover.started_at >= expires_at, (
                f"taken over {expires_at - takeover.started_at:.3f}s before the lease expired"
            )
            await settle(cluster, redis, ["c0m1", "c0m2"], timeout=I3_BOUND_S + 5)
        finally:
            cluster.signal(holder, signal.SIGCONT)

        # Once resumed, its cycle finds the lease gone and ends without a word.
        await cluster.wait_for(
            lambda: int(cluster.stats(holder).get("lost", 0)) >= 1,
            timeout=TTL_MS / 1000 + 5,
            what=f"{holder} to notice it lost the lease",
        )
        assert [e["replica"] for e in cluster.sent(conversation)] == [takeover.api_key]
        assert holder not in {e["replica"] for e in cluster.sent()}

        # And it keeps working: with the others stopped, only it can answer what comes next.
        for name in cluster.names:
            if name != holder:
                assert await cluster.terminate(name) == 0
        assert await cluster.deliver(holder, message(0, 3))
        assert await cluster.deliver(holder, message(1, 1))
        await settle(cluster, redis, ["c0m3", "c1m1"], timeout=I3_BOUND_S + 5)
        assert await cluster.terminate(holder) == 0

        replies = await check_replies(cluster, redis, conversation, since=released_at)
        assert [(r.replica, r.tokens) for r in replies] == [
            (takeover.api_key, ["c0m1", "c0m2"]),
            (holder, ["c0m3"]),
        ]
        # The takeover's reply went out under a newer lease than the one the pause ended.
        assert replies[0].fence > paused_fence
        replies = await check_replies(cluster, redis, f"{PLATFORM}:1")
        assert [r.replica for r in replies] == [holder]


async def test_sweeper_stops_although_cancellations_get_lost(
    redis: Redis, make_settings: SettingsFactory
) -> None:
    """On Python 3.11 a cancellation that lands just as a store call completes is lost
    (CPython gh-86296, in the `asyncio.wait_for` redis-py uses). A replica whose sweeper is
    nearly always inside a store call (here: a tiny interval; in production: a slow server)
    once hung on SIGTERM forever, sweeping on. Stopping must still end it, promptly, and
    nothing may be woken after it returns."""
    store = make_store(make_settings(), redis)
    # Always overdue, so every sweep wakes it.
    await redis.zadd(Keys("pipe:0").due, {"pipe:0": 0})
    woken: list[str] = []
    for _ in range(30):
        timers = Timers(woken.append, store.due, sweep_interval_s=0.0002)
        timers.start()
        # Deliberate: let it sweep a few times, so the stop lands mid-call.
        await asyncio.sleep(0.005)
        try:
            async with asyncio.timeout(2):
                await timers.stop()
        except TimeoutError:
            raise AssertionError("stop() left the sweeper running") from None
        stopped_at = len(woken)
        timers.arm("pipe:1", 0)
        # Deliberate: long enough for a sweep or a timer that outlived stop() to fire.
        await asyncio.sleep(0.002)
        assert len(woken) == stopped_at, f"woken after stop: {woken[stopped_at:]}"
    assert woken, "the sweeper never swept"


async def test_the_daily_token_budget_holds_across_processes(
    server: EmbeddedRedis, redis: Redis, short_dir: Path
) -> None:
    """One replica spends the user's budget; another process, with nothing in memory of it,
    answers the next burst with the notice and never calls the model."""
    async with FakeOpenAI() as fake:
        fake.reply = covering_reply
        budget = {"LASTWORD_LLM__DAILY_TOKENS_PER_USER": "5"}
        async with Cluster(server, fake, short_dir, size=2, env=budget) as cluster:
            conversation = f"{PLATFORM}:1"
            assert await cluster.deliver("r0", message(1, 1))
            await cluster.wait_for(lambda: len(cluster.sent(conversation)) == 1, 10, "a reply")
            assert tokens(cluster.sent(conversation)[0]["text"]) == ["c1m1"]
            spent = await redis.hget(Keys(conversation).day(datetime.now(UTC).date()), "tokens")
            assert int(spent or 0) > 5
            # Committed before it goes: this harness, unlike `lastword run`, does not let a
            # reply on its way out finish on SIGTERM, and a reply cut between its send and its
            # commit is rightly sent again by the other replica.
            await quiet(redis, [conversation], within_s=10)

            # The replica that spent it is gone: only the store remembers.
            assert await cluster.terminate("r0") == 0
            for n in (2, 3):
                assert await cluster.deliver("r1", message(1, n))
            await cluster.wait_for(lambda: len(cluster.sent(conversation)) == 2, 10, "a notice")
            assert cluster.sent(conversation)[1]["text"] == OVER_BUDGET
            assert cluster.sent(conversation)[1]["replica"] == "r1"
            assert len(fake.requests) == 1
            await quiet(redis, [conversation], within_s=5)
