"""Stores over one server for the speculation tests, and granting a speculative generation."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from bot.store import Acquired, Store
from tests.support.builders import window_ms

CONV = "test:1"


QUIET_MS = 600


SPECULATE_MS = 100


StoreFactory = Callable[..., Store]


async def speculative_grant(store: Store, token: str = "t1") -> Acquired:
    """The lease taken at speculate_at, with the window still open."""
    async with asyncio.timeout(3):
        while True:
            grant = await store.acquire(CONV, token)
            if isinstance(grant, Acquired):
                assert window_ms(grant) > 0, "taken after the window closed: not speculative"
                return grant
            assert grant.status == "early" and grant.look_in_ms is not None, grant
            await asyncio.sleep(grant.look_in_ms / 1000)
