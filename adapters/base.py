"""The interface every platform adapter implements.

An adapter turns platform events into `InboundMessage`s and hands them to a `Sink` (the
core's runtime), acknowledging the platform only once `ingest` has returned. It sends what
the core asks through the `Outbound` methods. It never touches the store.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol, runtime_checkable

from bot.backoff import Backoff
from bot.message import InboundMessage, Outbound, Unavailable

log = logging.getLogger(__name__)


class Sink(Protocol):
    async def ingest(self, message: InboundMessage) -> bool: ...

    async def settled(self, conversation: str) -> None: ...

    async def recent(self, platform: str, within_s: float) -> dict[str, str]:
        """Conversations on `platform` with a new message in the last `within_s` seconds (at
        most an hour), each with the platform id of the last message taken in. A platform that
        delivers nothing sent while no replica was connected reads its history after that id.
        """
        ...

    async def remember(self, name: str, value: str | None, ttl_s: float) -> None:
        """Keep a small value for `ttl_s` seconds where every replica can read it (None:
        forget it), such as the gateway session a new gateway holder resumes. Raises
        `Unavailable` if the store cannot be reached."""
        ...

    async def recall(self, name: str) -> str | None:
        """A value kept by `remember` on any replica, or None. Raises `Unavailable`."""
        ...

    async def run_exclusively(self, name: str, work: Callable[[], Awaitable[None]]) -> None:
        """Run `work()` only while this replica holds the role `name` (for example
        "telegram:poller"): exactly one replica of the deployment runs it at a time, and if
        that one dies another takes over within the lease TTL. Use it for a job the platform
        allows only once per bot, such as long polling or a gateway connection.

        If the role is lost, `work` is cancelled and started again once the role is back,
        so it must be safe to restart. Returns when `work()` returns (the role is released);
        an error from `work()` propagates; cancelling this cancels `work` and releases the
        role, so another replica takes over at once.
        """
        ...


class Adapter(Outbound, Protocol):
    platform: str

    async def run(self, sink: Sink) -> None:
        """Receive until the platform's input ends (or the task is cancelled on shutdown)."""

    def connected(self) -> bool:
        """Whether this replica can talk to the platform right now, for `/healthz`."""
        ...


@runtime_checkable
class LogsIn(Protocol):
    """What an adapter whose platform takes credentials (a bot token) adds to `Adapter`, so
    that a refused one stops `lastword run` before it reports ready, and shows in `/healthz`
    while running. Optional: a plug-in without it (the console) is simply not asked."""

    async def login(self) -> None:
        """Check that the platform accepts the credentials, before `run`. Raises
        `bot.settings.ConfigError`, naming the setting and never quoting its value, when the
        platform refuses them; returns when it accepts them, and also when it cannot be
        reached (`run` keeps trying then). The caller bounds it in time."""

    def refused(self) -> str | None:
        """Why the platform refuses the credentials right now (a token revoked while
        running), naming the setting; None while it accepts them."""
        ...


async def login(adapter: Adapter) -> None:
    """The adapter's start-up check of its credentials (`LogsIn.login`), if it has one."""
    if isinstance(adapter, LogsIn):
        await adapter.login()


def refused(adapter: Adapter) -> str | None:
    """Why the platform refuses the adapter's credentials right now, if it can say."""
    return adapter.refused() if isinstance(adapter, LogsIn) else None


def describe(message: InboundMessage) -> str:
    """How logs name a message: its platform id and its conversation."""
    return f"message {message.message_id} of {message.conversation}"


async def until_stored(
    take: Callable[[], Awaitable[object]],
    what: str,
    *,
    first_s: float = 0.2,
    cap_s: float = 5.0,
    error_cap_s: float = 60.0,
) -> None:
    """Run `take()` (which hands the message `what` to the core) until the store has it,
    backing off while the store is down. For a source that will not deliver again (a gateway
    event, a stdin line) or must not move on before it is stored (a poll's unconfirmed offset).

    An error nobody expected (a bug, an unclassified Redis reply) is logged with its
    traceback and retried too, backing off up to `error_cap_s`: the message is never dropped
    unstored, and the loop that called this never dies of it."""
    store_down = Backoff(first_s, cap_s)
    broken = Backoff(first_s, error_cap_s)
    while True:
        try:
            await take()
            return
        except Unavailable as exc:
            delay = store_down.next_delay()
            log.warning("%s not stored yet (%s); retrying in %.1fs", what, exc, delay)
        except Exception:
            delay = broken.next_delay()
            log.exception("%s could not be stored; retrying in %.1fs", what, delay)
        await asyncio.sleep(delay)
