"""Racing a generation's steps against a newer message: `Race` runs one step to its end, or
cancels it the moment the conversation's version moves and hands the lease back; `Next` is
what the cycle returns then, saying when to look at the conversation again.

A step that a newer message must not cancel (a tool call: its effect is outside lastword, and
its result is kept) runs outside the race; `Race.steered` says, before and after each such
step, whether a newer message arrived meanwhile, handing the lease back the same way, and
`Race.moved` does so when the store found one as a call was about to start.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from bot.cancel import cancel_and_wait
from bot.core.lease import LeaseKeeper, LeaseLost
from bot.store import Lease, Store

T = TypeVar("T")


@dataclass(frozen=True)
class Next:
    """When to look at the conversation again (None: nothing owed, or another replica's), and
    whether this replica is still the one working towards its reply (so it shows typing)."""

    look_in_ms: int | None
    working: bool


NOTHING = Next(None, working=False)


class Race:
    """Runs one step of a generation (`Cycle._interruptible`): to its end, or, once it
    `follow`s a version watch and a newer message arrives, cancelled on the spot with the
    lease handed back, and then `Next` instead of its result. Not following, a step is not
    interrupted."""

    def __init__(self, lease: Lease, keeper: LeaseKeeper, store: Store) -> None:
        self.lease = lease
        self.keeper = keeper
        self.store = store
        self.newer: asyncio.Future[Any] | None = None
        # The step running now, which `cut` cancels.
        self._step: asyncio.Future[Any] | None = None
        # Whether the newer message was of the same burst, sent while its window was open: a
        # speculative generation restarted, not a reply gone stale.
        self.restarted = False

    def follow(self, moved: asyncio.Event) -> None:
        """Be interrupted once `moved` is set."""
        self.newer = asyncio.ensure_future(moved.wait())

    def cut(self) -> None:
        """Cancel the running step now. The version watch calls this the moment it knows of a
        newer message, before the loop wakes anything waiting for `moved`: on a busy loop each
        such wake-up may take tens of milliseconds, and the provider bills until the stream
        is closed."""
        if self._step is not None:
            self._step.cancel()

    async def __call__(self, step: Coroutine[Any, Any, T]) -> T | Next:
        task = asyncio.ensure_future(step)
        self._step = task
        try:
            if self.newer is None:
                return await task
            await asyncio.wait({task, self.newer}, return_when=asyncio.FIRST_COMPLETED)
            if task.done() and not task.cancelled():
                # The answer came first, or with the news: the pre-send check decides.
                return task.result()
            # Stop paying for tokens before anything else: cancelling closes the provider's
            # stream. The lease goes back while the cancellation unwinds. (If Redis is out of
            # reach just now, StoreUnavailable ends the cycle as any store failure does: the
            # generation is gone either way, and the lease is released or expires.)
            if not task.cancelling():  # `cut` may have cancelled it already
                task.cancel()
            return await self._hand_back()
        finally:
            self._step = None
            await cancel_and_wait(task)

    async def steered(self) -> Next | None:
        """After a step that runs outside the race (a tool call): `Next`, with the lease
        handed back, if a newer message arrived meanwhile; None to go on."""
        if self.newer is None or not self.newer.done():
            return None
        return await self._hand_back()

    async def moved(self) -> Next | None:
        """The store said a newer message arrived (a call may not start): `Next`, with the
        lease handed back, if this generation follows the version; None if it does not (the
        starvation guard will send its reply as it is, or interrupting is off)."""
        if self.newer is None:
            return None
        return await self._hand_back()

    async def _hand_back(self) -> Next:
        verdict = await self.store.interrupt(self.lease)
        if verdict.status == "lost":
            raise LeaseLost(self.lease.conversation)
        self.keeper.released()
        self.restarted = verdict.restarted
        return Next(verdict.look_in_ms, working=True)
