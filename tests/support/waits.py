"""Bounded waits for the tests: each polls for a state and fails with an AssertionError showing
the last state it saw (`eventually`; `settled` for a conversation's V and W), and the reads
they build on (`server_ms`, `counters`)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from redis.asyncio import Redis

from bot.core.runtime import Runtime
from bot.store import Keys
from bot.store.connect import Client

T = TypeVar("T")


async def server_ms(redis: Redis) -> int:
    """Now, in ms, on the server's clock (the one every deadline uses)."""
    seconds, micros = await redis.time()
    return int(seconds) * 1000 + int(micros) // 1000


async def eventually(
    check: Callable[[], Awaitable[T]],
    within_s: float = 3.0,
    *,
    what: str | None = None,
    describe: Callable[[], Awaitable[object]] | None = None,
) -> T:
    """Poll `check` until it returns something true, and return that.

    After `within_s` seconds, fail with an AssertionError that names what was awaited (`what`,
    else the check's name) and shows the last state seen: what `describe()` says then, else
    the check's last result.
    """
    last: list[T] = []  # the check's last (false) result, once it has returned one
    limit = asyncio.timeout(within_s)
    try:
        async with limit:
            while True:
                result = await check()
                if result:
                    return result
                last[:] = [result]
                await asyncio.sleep(0.01)
    except TimeoutError:
        if not limit.expired():
            raise  # the check's own timeout, not ours
        name = what or getattr(check, "__name__", repr(check))
        if describe is not None:
            seen = await _described(describe)
        else:
            seen = repr(last[0]) if last else "nothing (the check never returned)"
        raise AssertionError(
            f"gave up waiting for {name} after {within_s:g}s; last seen: {seen}"
        ) from None


async def _described(describe: Callable[[], Awaitable[object]]) -> str:
    """What `describe()` says, bounded in time: the state it reads may be what hangs."""
    try:
        async with asyncio.timeout(2.0):
            return str(await describe())
    except Exception as exc:  # a failure to describe must not hide the failure itself
        return f"(could not read it: {exc!r})"


async def counters(redis: Client, conversation: str) -> tuple[int | None, int | None]:
    """V and W of `conversation` as stored (None where the field is missing)."""
    v, w = await redis.hmget(Keys(conversation).state, ["v", "w"])
    return (None if v is None else int(v)), (None if w is None else int(w))


async def settled(
    where: Redis | Runtime,
    conversation: str,
    *,
    version: int | None = None,
    within_s: float = 10.0,
) -> None:
    """Wait until every message taken in for `conversation` has been answered: its watermark
    W has caught up with its version V (and V is `version`, when given).

    Given a `Runtime`, its own `settled()` decides (V == W, and no cycle of it runs there);
    given a Redis client, V == W > 0 in the store. Fails after `within_s` seconds with an
    AssertionError showing V and W.
    """
    redis = where.store.redis if isinstance(where, Runtime) else where

    async def state() -> str:
        v, w = await counters(redis, conversation)
        if isinstance(where, Runtime):
            return f"V={v} W={w}, {where.cycles_running} cycles running"
        return f"V={v} W={w}"

    if isinstance(where, Runtime):
        try:
            async with asyncio.timeout(within_s):
                await where.settled(conversation)
        except TimeoutError:
            raise AssertionError(
                f"gave up waiting for {conversation} to settle (V == W, no cycle running) "
                f"after {within_s:g}s; last seen: {await _described(state)}"
            ) from None
        if version is not None:
            assert (await counters(redis, conversation))[0] == version, await state()
        return

    async def caught_up() -> bool:
        v, w = await counters(redis, conversation)
        return v is not None and v == w and (version is None or v == version)

    wanted = "V == W > 0" if version is None else f"V == W == {version}"
    await eventually(
        caught_up, within_s, what=f"{conversation} to settle ({wanted})", describe=state
    )
