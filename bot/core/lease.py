"""Keeping a lease while work runs: renewed every TTL/3, and the work stopped once the lease
may be someone else's.

One keeper serves every kind of lease (a conversation's, a role's): what renews it is a
callable that says whether the lease is still ours, so this module knows nothing of keys,
tokens or fences; the renewal itself is token-checked in the store.

Freshness is measured from when the acquire (or the last renewal that succeeded) was sent,
never from when its answer came: the expiry counts from when the server ran the script, and a
pause between that and reading the answer must not make a lease that another holder may have
by now look fresh. For the same reason every renewal is bounded by the time the lease has
left: one that hangs past the expiry must not keep the work running meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from bot.cancel import cancel_and_wait
from bot.store import StoreUnavailable

log = logging.getLogger(__name__)

T = TypeVar("T")


class LeaseLost(Exception):
    """Another holder may have the lease now; this one must not act on it."""


class LeaseKeeper:
    """Renews a lease every TTL/3 while work runs, and cancels the work once it is lost:
    a renewal says it is someone else's, or none has succeeded within the TTL.

    `name` says which lease in the log ("lease on tg:42", "role telegram:poller").
    `renew` renews it for another TTL: True if it is still ours, False if not.
    `confirmed_at` is when the call that took the lease was sent (`time.monotonic()`).
    `on_failure` is told of each renewal that could not reach the store in time.
    """

    def __init__(
        self,
        name: str,
        renew: Callable[[], Awaitable[bool]],
        ttl_ms: int,
        confirmed_at: float,
        *,
        on_failure: Callable[[], None] = lambda: None,
    ) -> None:
        self.name = name
        self.ttl_s = ttl_ms / 1000
        self.confirmed_at = confirmed_at
        self.lost = False
        self._renew = renew
        self._on_failure = on_failure
        self._released = False

    def released(self) -> None:
        """The lease was handed back on purpose: stop renewing it, so a renewal racing the
        hand-back is not mistaken for a takeover."""
        self._released = True

    def _left_s(self) -> float:
        """How long the lease is surely ours still (negative once it may not be)."""
        return self.ttl_s - (time.monotonic() - self.confirmed_at)

    async def run(self, work: Awaitable[T], *, wind_down_s: float = 0.5) -> T:
        """Await `work` while keeping the lease, and return or raise as it does; raise
        `LeaseLost` instead if the lease was lost first (the work is cancelled by then). If
        this is cancelled, so is the work, which gets `wind_down_s` to end before it is
        cancelled again."""
        task = asyncio.ensure_future(work)
        keeping = asyncio.create_task(self._keep(task))
        try:
            # Not `await task`: a cancellation of this must go through `cancel_and_wait`,
            # which does not stop at one cancel the work may swallow.
            await asyncio.wait({task})
        finally:
            await cancel_and_wait(keeping)
            await cancel_and_wait(task, retry_s=wind_down_s)
        if self.lost and task.cancelled():
            raise LeaseLost(self.name)
        return task.result()

    async def ensure_fresh(self, *, always: bool = False) -> None:
        """Before a side effect: confirm the lease if so much time has passed (a pause, a
        slow send) that it may have expired, or `always`, rather than act on a lease someone
        else holds. Raises `LeaseLost` if it is not confirmed; an unexpected error of the
        renewal propagates."""
        if self.lost or self._released:
            raise LeaseLost(self.name)
        stale = self._left_s() < self.ttl_s / 2
        if (always or stale) and not await self._confirm():
            raise LeaseLost(self.name)

    async def _keep(self, work: asyncio.Future[Any]) -> None:
        while True:
            await asyncio.sleep(min(self.ttl_s / 3, max(self._left_s(), 0.0)))
            if self._released:
                return
            try:
                renewed = await self._confirm()
            except Exception:
                # A bug, not an outage: say so loudly, and treat it as an unanswered renewal
                # rather than let the work run on unguarded.
                log.exception("renewing %s failed unexpectedly", self.name)
                renewed = None
            if self._released:
                return
            if renewed is False:
                log.warning("%s was taken over; stopping", self.name)
            elif renewed is None and self._left_s() <= 0:
                log.warning("%s can no longer be confirmed; stopping", self.name)
            else:
                # Renewed, or not answered while the lease may still be ours: try again.
                continue
            self.lost = True
            await cancel_and_wait(work)
            return

    async def _confirm(self) -> bool | None:
        """Renew now: True if renewed, False if the lease is someone else's, None if the
        store did not answer within the time the lease has left."""
        sent_at = time.monotonic()
        try:
            async with asyncio.timeout(max(self._left_s(), 0.0)):
                renewed = await self._renew()
        except (StoreUnavailable, TimeoutError) as exc:
            self._on_failure()
            log.warning(
                "renewing %s failed: %s", self.name, str(exc) or "no answer in the time left"
            )
            return None
        if renewed:
            # Answers may come back out of order (a renewal here, another in `ensure_fresh`).
            self.confirmed_at = max(self.confirmed_at, sent_at)
        return renewed
