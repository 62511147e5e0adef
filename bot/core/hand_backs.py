"""Leases whose giving back met an outage, given back once the store answers again.

A cycle that fails, or is stopped, hands its lease back so that the next attempt (on any
replica) need not wait for the lease to expire. When the store is out of reach, that hand-back
fails too, and the lease would hold the conversation for the rest of its TTL after the store is
back: a backlog answered seconds late. So a failed hand-back is tried again, backed off, until
it goes through, or the lease's TTL from the failure has passed (it has expired by itself
then). The release is token-checked: one that comes late can never free another holder's
lease. At most one retry per conversation, each bounded by the TTL; all cancelled at stop."""

from __future__ import annotations

import asyncio
import logging
import time

from bot.backoff import Backoff
from bot.cancel import cancel_and_wait
from bot.store import Failed, Lease, Store, StoreUnavailable

log = logging.getLogger(__name__)

# The first retry's delay and the longest, in seconds (jittered, so replicas that failed
# together do not all knock at once).
FIRST_S = 0.1
CAP_S = 2.0


class HandBacks:
    """Hand-backs to try again, each in a task of its own."""

    def __init__(self, store: Store) -> None:
        self.store = store
        # The retry of each conversation's hand-back.
        self._retries: dict[str, asyncio.Task[None]] = {}
        # Hand-backs that went through on a retry: for logs and tests.
        self.done = 0

    def later(self, lease: Lease, failed: Failed | None) -> None:
        """Try `lease`'s hand-back again, until it goes through or the lease has expired. A
        lease that was surely held (a fence) takes the place of an older retry of its
        conversation; one that may never have been taken (an acquire whose answer was lost:
        no fence) does not."""
        conversation = lease.conversation
        pending = self._retries.get(conversation)
        if pending is not None:
            if not lease.fence:
                return
            pending.cancel()
        ttl_s = self.store.settings.ttl_ms / 1000
        # An outage is over once the store answers: the retry gives the lease back plainly, so
        # the next attempt is not backed off anew from then (it would wait past the lease's own
        # expiry). A failure still counts towards `llm.attempts`.
        again: Failed | None = "failure" if failed == "failure" else None
        task = asyncio.create_task(self._retry(lease, again, time.monotonic() + ttl_s))
        self._retries[conversation] = task

        def ended(done: asyncio.Task[None]) -> None:
            if self._retries.get(conversation) is done:
                del self._retries[conversation]

        task.add_done_callback(ended)

    async def _retry(self, lease: Lease, failed: Failed | None, until: float) -> None:
        backoff = Backoff(FIRST_S, CAP_S, jitter=0.5)
        while True:
            delay = backoff.next_delay()
            if time.monotonic() + delay >= until:
                return
            await asyncio.sleep(delay)
            try:
                await self.store.release(lease, failed=failed)
            except StoreUnavailable:
                continue
            except Exception:
                log.warning("handing %s back failed", lease.conversation, exc_info=True)
                return
            self.done += 1
            log.info("handed %s back once the store answered again", lease.conversation)
            return

    async def stop(self) -> None:
        """Cancel every retry: the leases expire by themselves."""
        await asyncio.gather(*(cancel_and_wait(task) for task in list(self._retries.values())))
