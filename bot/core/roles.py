"""Roles: a job that exactly one replica runs at a time, such as a platform's single poller.

Telegram answers a second `getUpdates` on the same token with 409 Conflict, and Discord allows
one gateway connection per shard, so with several replicas one of them must hold the job. The
holder is chosen with the same primitive as the conversation lease (a random token, a fence
that only goes up, expiry on the server's clock, renewed every TTL/3): if the holder dies, its
role expires and another replica takes the job over within the TTL.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable

from bot.backoff import Backoff
from bot.config.settings import ConfigError
from bot.core.lease import LeaseKeeper, LeaseLost
from bot.store import Store, StoreUnavailable, lease_token

log = logging.getLogger(__name__)

# On shutdown, how long a role's work may take to wind down once cancelled (a gateway holder
# stores the DMs it still has queued) before it is cancelled again and the role released.
HANDOVER_S = 2.0
# After the work fails with an unexpected error, the role is handed back (another replica may
# fare better) and claimed again after this long, doubling per failure in a row up to the cap.
RESTART_AFTER_S = 1.0
RESTART_CAP_S = 60.0


async def run_exclusively(
    store: Store,
    name: str,
    work: Callable[[], Awaitable[None]],
    ttl_ms: int,
    *,
    owner: str = "replica",
    poll_s: float | None = None,
) -> None:
    """Run `work()` while this replica holds the role `name`, and only then.

    Waits for the role (looking again every `poll_s`, default TTL/3, while another replica
    holds it), then runs `work()` and renews the role every TTL/3. If the role is lost (taken
    over, or Redis unreachable for longer than the TTL, so another replica may have it by
    now), the work is cancelled and the wait starts over: `work` must be safe to restart.
    When `work()` returns, the role is released and this returns. If it raises a
    `ConfigError` (nothing a restart can fix), the role is released and the error propagates;
    any other error is logged, the role handed back, and the work started again once the role
    is back, after a backoff. When this is cancelled (shutdown), the work is cancelled and
    given `HANDOVER_S` to wind down, and the role released, so another replica takes over.
    """
    ttl_s = ttl_ms / 1000
    claim_every_s = ttl_s / 3 if poll_s is None else poll_s
    token = lease_token(owner)
    backoff = Backoff(RESTART_AFTER_S, RESTART_CAP_S)
    try:
        while True:
            fence, confirmed_at = await _claim(store, name, token, ttl_ms, claim_every_s)
            log.info("took role %s (fence %d)", name, fence)
            keeper = LeaseKeeper(
                f"role {name}",
                functools.partial(store.renew_role, name, token, fence, ttl_ms),
                ttl_ms,
                confirmed_at,
            )
            try:
                await keeper.run(
                    asyncio.create_task(_call(work), name=f"role {name}"),
                    wind_down_s=HANDOVER_S,
                )
            except LeaseLost:
                log.info("lost role %s (fence %d); its work is stopped", name, fence)
                continue
            except Exception as error:
                # Hand the role back, then raise a configuration error (nothing a restart can
                # fix) or start again after a backoff.
                await _release(store, name, token)
                if isinstance(error, ConfigError):
                    raise
                delay = backoff.next_delay()
                log.error(
                    "role %s failed (%d in a row); handed back, claiming again in %.0fs",
                    name,
                    backoff.failures,
                    delay,
                    exc_info=error,
                )
                await asyncio.sleep(delay)
                continue
            await _release(store, name, token)
            return
    except asyncio.CancelledError:
        # Any work running was given its wind-down by the keeper. Released also after a claim
        # whose answer the cancellation cut off: the release is token-checked, so it is a
        # no-op unless the role is ours.
        await _release(store, name, token)
        raise


async def _call(work: Callable[[], Awaitable[None]]) -> None:
    await work()


async def _claim(
    store: Store, name: str, token: str, ttl_ms: int, every_s: float
) -> tuple[int, float]:
    """Wait until the role is ours. Returns its fence and when the claim was sent (the
    expiry counts from no earlier than that)."""
    while True:
        sent_at = time.monotonic()
        try:
            fence = await store.claim_role(name, token, ttl_ms)
        except StoreUnavailable as exc:
            log.warning("cannot claim role %s: %s", name, exc)
            fence = None
        if fence is not None:
            return fence, sent_at
        await asyncio.sleep(every_s)


async def _release(store: Store, name: str, token: str) -> None:
    try:
        # Bounded: shutdown must not hang on an unreachable store; the role expires anyway.
        async with asyncio.timeout(store.settings.ttl_ms / 1000):
            if await store.release_role(name, token):
                log.info("released role %s", name)
    except (StoreUnavailable, TimeoutError) as exc:
        log.warning("could not release role %s (it will expire): %s", name, exc)
