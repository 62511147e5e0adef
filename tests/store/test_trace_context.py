"""A burst's trace context lives with its conversation in the store (`bot.traces`): born with
the burst's first message, joined by every later one and by the lease that answers it, and
ended by the commit, so the next burst begins a trace of its own that follows it. Carried in
the calls made today (ingest, acquire, commit): no round trip of its own."""

from __future__ import annotations

from bot.store import Store
from tests.support.builders import message
from tests.support.scripts import acquire_when_ready

FIRST = "00-" + "a" * 32 + "-" + "1" * 16 + "-01"
SECOND = "00-" + "b" * 32 + "-" + "2" * 16 + "-01"
THIRD = "00-" + "c" * 32 + "-" + "3" * 16 + "-01"


async def test_a_burst_keeps_one_trace_and_the_next_follows_it(store: Store) -> None:
    first = await store.ingest(message("one", n=1), trace=FIRST)
    assert (first.trace, first.follows) == (FIRST, "")
    # A later message of the burst joins it, whatever it proposed.
    joined = await store.ingest(message("two", n=2), trace=SECOND)
    assert (joined.trace, joined.follows) == (FIRST, "")
    grant = await acquire_when_ready(store, "test:1", "token-a")
    assert grant.trace == FIRST
    assert (await store.presend(grant.lease, grant.version, "reply")).status == "ok"
    assert (await store.commit(grant.lease)).ok
    # Answered: the next message begins a trace of its own, after the one before.
    after = await store.ingest(message("three", n=3), trace=THIRD)
    assert (after.trace, after.follows) == (THIRD, FIRST)


async def test_tracing_off_stores_no_trace(store: Store) -> None:
    ingested = await store.ingest(message("one", n=1))
    assert (ingested.trace, ingested.follows) == ("", "")
    grant = await acquire_when_ready(store, "test:1", "token-a")
    assert grant.trace == ""
    # A redelivery is not accepted, and joins nothing.
    again = await store.ingest(message("one", n=1), trace=FIRST)
    assert not again.accepted and again.trace == ""
