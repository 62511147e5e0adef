"""Calling the store's scripts on their own: building a store over a test server, taking a
lease, a key's cluster slot."""

from __future__ import annotations

import asyncio
from typing import Any

from redis.asyncio import Redis

from bot.service.app import make_store
from bot.store import (
    Acquired,
    Store,
)
from tests.support.factories import SettingsFactory


def build(make_settings: SettingsFactory, redis: Redis, **overrides: Any) -> Store:
    """A store over the test server; `quiet`/`max_wait`/`ttl` are the timings in ms.

    Defaults close the window at once (quiet 0), so a test can acquire right after ingesting.
    The window is fixed, without speculation: those have tests of their own (test_speculation).
    """
    quiet = overrides.pop("quiet", 0)
    max_wait = overrides.pop("max_wait", max(quiet, 0))
    ttl = overrides.pop("ttl", 1500)
    debounce = {"quiet_ms": quiet, "max_wait_ms": max_wait, "speculate_ms": 0, "learn": False}
    settings = make_settings(debounce=debounce, lease={"ttl_ms": ttl}, **overrides)
    return make_store(settings, redis)


async def acquire_when_ready(
    store: Store,
    conversation: str,
    token: str,
    timeout: float = 3.0,  # noqa: ASYNC109
) -> Acquired:
    """Poll acquire until it grants the lease; only 'early' and 'busy' may come before."""
    async with asyncio.timeout(timeout):
        while True:
            grant = await store.acquire(conversation, token)
            if isinstance(grant, Acquired):
                return grant
            assert grant.status in ("early", "busy") and grant.look_in_ms is not None, grant
            await asyncio.sleep(min(max(grant.look_in_ms, 1), 20) / 1000)


def crc16(data: bytes) -> int:
    """CRC16/XMODEM, the checksum Redis Cluster hashes keys with."""
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc


def keyslot(key: str) -> int:
    """Redis Cluster's slot for a key: only a non-empty first {hash tag} counts, if any."""
    raw = key.encode()
    start = raw.find(b"{")
    if start >= 0:
        end = raw.find(b"}", start + 1)
        if end > start + 1:
            raw = raw[start + 1 : end]
    return crc16(raw) % 16384
