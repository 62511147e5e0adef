"""The interface every platform adapter implements.

An adapter turns platform events into `InboundMessage`s and hands them to a `Sink` (the
core's runtime), acknowledging the platform only once `ingest` has returned. It sends what
the core asks through the `Outbound` methods. It never touches the store.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from bot.backoff import Backoff
from bot.message import (
    InboundMessage,
    MenuEntry,
    Outbound,
    Place,
    SendFailed,
    Unavailable,
    Unreachable,
)

log = logging.getLogger(__name__)


class Sink(Protocol):
    async def ingest(self, message: InboundMessage) -> bool: ...

    def menu(self, *, admins: bool = False) -> tuple[MenuEntry, ...]:
        """The commands of a platform's menu, in /help's order: everyone's, and with `admins`
        the admin ones after them (what an admin's /help lists)."""
        ...

    async def settled(self, conversation: str) -> None: ...

    async def group_moved(self, platform: str, old_chat: str, new_chat: str) -> None:
        """The group `old_chat` now lives on as `new_chat` (a Telegram group upgraded to a
        supergroup): the new chat is allowed if the old one was, for every replica, and each
        person's conversation there is carried to theirs in the new chat. Safe to call more
        than once for one move. Raises `Unavailable` if the store cannot be reached.
        """
        ...

    async def user_typing(self, place: Place) -> None:
        """The person at `place` is typing, as the platform says (an adapter that reports it
        declares `bot.message.SeesTyping`). Best effort, bounded in time, and cheap to call
        for every signal: the core counts one per person a second at most. Never raises."""
        ...

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

    async def throttled(self, scope: str, retry_after_s: float) -> None:
        """The platform answered 429 on a call the adapter's client waited out and retried by
        itself (a call that failed with it raises `Throttled` instead): `scope` takes no call
        from any replica before `retry_after_s` has passed. Best effort; never raises."""
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
        `bot.config.settings.ConfigError`, naming the setting and never quoting its value, when the
        platform refuses them; returns when it accepts them, and also when it cannot be
        reached (`run` keeps trying then). The caller bounds it in time."""

    def refused(self) -> str | None:
        """Why the platform refuses the credentials right now (a token revoked while
        running), naming the setting; None while it accepts them."""
        ...


@dataclass(frozen=True)
class Identity:
    """Who the bot is on its platform and how people reach it, as the platform said at login:
    what the start-up log names, so that an operator sees at once which bot runs, and where
    to talk to it."""

    name: str  # "@lastword_bot on Telegram"
    reach: str  # "chat with it at https://t.me/lastword_bot"


@runtime_checkable
class Introduces(Protocol):
    """What an adapter adds to `Adapter` to say who the bot is. Optional: the start-up log of
    a plug-in without it names only its platform."""

    def identity(self) -> Identity | None:
        """Who the bot is, once the platform has said (after `LogsIn.login`); None while it
        has not (it could not be reached at start)."""
        ...


def introduction(adapter: Adapter) -> str:
    """The start-up log's line naming the bot and where to reach it, said once by the core
    for every platform alike."""
    if not isinstance(adapter, Introduces):
        return f"lastword is on {adapter.platform}"
    who = adapter.identity()
    if who is None:
        return (
            f"lastword is on {adapter.platform}; which bot is not known yet "
            f"({adapter.platform} did not say at start)"
        )
    return f"lastword is {who.name}: {who.reach}"


async def login(adapter: Adapter) -> None:
    """The adapter's start-up check of its credentials (`LogsIn.login`), if it has one."""
    if isinstance(adapter, LogsIn):
        await adapter.login()


def refused(adapter: Adapter) -> str | None:
    """Why the platform refuses the adapter's credentials right now, if it can say."""
    return adapter.refused() if isinstance(adapter, LogsIn) else None


# What a platform's refusal says when the trouble is the message a part replies to (Telegram:
# "message to be replied not found", "REPLY_MESSAGE_ID_INVALID"; Discord: "In
# message_reference: Unknown message").
REPLY_TROUBLE = ("repl", "reference")


async def replying(
    send: Callable[[int | None], Awaitable[None]], reply_to: str | None, what: str
) -> None:
    """Send one part with `send(target)`, as a reply to the platform message `reply_to` where
    the platform takes that, else as a plain part: a reply target is a detail, and one the
    platform can never take (not a message id, or refused as a bad request about the reply)
    must not cost the part itself, which would otherwise be retried and given up."""
    target = (
        int(reply_to)
        if reply_to is not None and reply_to.isascii() and reply_to.isdigit()
        else None
    )
    if reply_to is not None and target is None:
        log.warning(
            "%s: %r is no message id to reply to; sending it as a plain part", what, reply_to
        )
    if target is None:
        await send(None)
        return
    try:
        await send(target)
    except SendFailed as exc:
        if isinstance(exc, Unreachable) or not exc.permanent or not _about_reply(exc):
            raise
        log.warning(
            "%s: the reply to %s was refused (%s); sending it as a plain part", what, target, exc
        )
        await send(None)


def _about_reply(exc: SendFailed) -> bool:
    return any(word in str(exc).lower() for word in REPLY_TROUBLE)


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


# A menu is registered at most this many times in a row, each call bounded in time, backed
# off from the first delay up to the cap: a platform that keeps refusing it costs a few log
# lines, never the bot (its commands still work typed in full).
MENU_ATTEMPTS = 5
MENU_CALL_TIMEOUT_S = 20.0
MENU_RETRY_FIRST_S = 2.0
MENU_RETRY_CAP_S = 60.0


async def register_menu(
    platform: str,
    register: Callable[[], Awaitable[object]],
    wait_hint: Callable[[Exception], float | None] = lambda exc: None,
) -> bool:
    """Register the command menu with `register()`, which every replica may call at start
    (it sets the whole menu, so doing it twice is harmless). A failure (a refusal, a 5xx, a
    hang past `MENU_CALL_TIMEOUT_S`) is retried `MENU_ATTEMPTS` times in all, backed off, or
    after the wait `wait_hint` finds in the error (a 429's retry-after) if that is longer;
    then given up with a warning. True once registered."""
    backoff = Backoff(MENU_RETRY_FIRST_S, MENU_RETRY_CAP_S, jitter=0.5)
    for attempt in range(1, MENU_ATTEMPTS + 1):
        try:
            async with asyncio.timeout(MENU_CALL_TIMEOUT_S):
                await register()
        except Exception as exc:
            reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            if attempt == MENU_ATTEMPTS:
                log.warning(
                    "%s command menu not registered after %d attempts (%s); the commands "
                    "still work typed in full",
                    platform,
                    attempt,
                    reason,
                )
                return False
            delay = max(backoff.next_delay(), min(wait_hint(exc) or 0.0, MENU_RETRY_CAP_S))
            # The first failure is worth a warning; the retries that follow, only a note.
            log.log(
                logging.WARNING if attempt == 1 else logging.INFO,
                "%s command menu not registered (%s); retrying in %.1fs",
                platform,
                reason,
                delay,
            )
            await asyncio.sleep(delay)
        else:
            log.info("%s command menu registered", platform)
            return True
    return False
