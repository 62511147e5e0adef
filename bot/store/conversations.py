"""Conversations: the flow's steps on one conversation (ingest, acquire, renew, release,
interrupt, pre-send, commit) and what the runtime reads of it (V and W, the history, the
recent ones, the chosen model; the persona comes with the lease)."""

from __future__ import annotations

import json
import logging
import secrets
import time
from dataclasses import dataclass, replace
from typing import Any, Literal

from bot.config.settings import Verdict
from bot.message import Attachment, InboundMessage, Said
from bot.store import scripts
from bot.store.config import (
    CLOCK_SLACK_MS,
    DAY_KEEP_MS,
    RETRY_AFTER_ERROR_CAP_MS,
    RETRY_AFTER_ERROR_MS,
    utc_today,
)
from bot.store.errors import StoreUnavailable
from bot.store.keys import Keys
from bot.store.person import RATE_WINDOW_MS, People, Rate
from bot.store.replies import as_text, decoded, listed, look_in
from bot.store.scripts import Script

log = logging.getLogger(__name__)

# Platform message ids remembered per conversation for dedupe: at most this many, and none
# older than the platforms' redelivery horizon (Telegram keeps an update for 24 h) allows.
SEEN_CAP = 1000
SEEN_KEEP_MS = 25 * 3600_000
# How long a conversation stays in the activity index after its last message.
ACTIVE_KEEP_MS = 3600_000
# A user's typing signals count at most once in this long (and once after each message).
TYPING_EVERY_MS = 1000


def lease_token(owner: str) -> str:
    """A fresh, unguessable lease token that says which replica holds the lease (the part
    before the "/"), so `lastword status` can tell who holds what."""
    return f"{owner}/{secrets.token_hex(12)}"


@dataclass(frozen=True)
class Heard:
    """How a message reached the bot, for ingest: in a DM (the defaults), or in a group:
    `group` "allowed" (by the settings) or "ask" (the store knows: an admin's /allow),
    `addressed` "1" (to the bot), "0" (a follow-up if its sender's burst is open, else said to
    the room) or "never" (another bot's), and `room_entry`, the room's entry for it (`Said`)."""

    group: Literal["", "allowed", "ask"] = ""
    addressed: Literal["1", "0", "never"] = "1"
    room_entry: str = ""


@dataclass(frozen=True)
class Ingested:
    accepted: bool  # False: a redelivery, refused, or dropped by the rate limit
    version: int
    look_in_ms: int | None  # until the window's deadline; None when not accepted
    limited: bool = False  # dropped by the rate limit
    first_limited: bool = False  # ...and the first such in its window: tell the user once
    opened_window: bool = False  # this message opened the debounce window
    capped: bool = False  # the window's deadline is at its hard cap (max_wait)
    refused: bool = False  # its user may not talk to the bot (settings, or an admin's /deny)
    silent: bool = False  # said in a group the bot may not answer in
    overheard: bool = False  # said in a group, not to the bot: the room's context only
    # Tracing on: the burst's trace (a W3C traceparent), and the one before it when this
    # message began the burst's (`bot.traces`); "" otherwise.
    trace: str = ""
    follows: str = ""

    @classmethod
    def from_reply(cls, raw: bytes | str) -> Ingested:
        """From ingest.lua's answer."""
        reply = decoded(raw)
        status, window = reply["status"], reply["window"]
        return cls(
            accepted=status == "accepted",
            version=int(reply["version"]),
            look_in_ms=look_in(reply["look_in_ms"]),
            limited=status in ("limited", "first_limited"),
            first_limited=status == "first_limited",
            opened_window=window == "opened",
            capped=window == "capped",
            refused=status == "refused",
            silent=status == "silent",
            overheard=status == "overheard",
            trace=str(reply.get("trace") or ""),
            follows=str(reply.get("follows") or ""),
        )


@dataclass(frozen=True)
class Typed:
    """What a typing signal did (typing.lua): `held` the open window, until `look_in_ms` from
    now, cutting the speculative generation of fence `cut` (0: none ran); or nothing (the
    window was not open, or the signal came too soon after the last one)."""

    held: bool
    look_in_ms: int | None = None
    cut: int = 0
    trace: str = ""  # the burst's trace, tracing on (`Ingested.trace`)

    @classmethod
    def from_reply(cls, raw: bytes | str) -> Typed:
        reply = decoded(raw)
        if reply["status"] != "held":
            return cls(held=False)
        trace = str(reply.get("trace") or "")
        return cls(True, look_in(reply["look_in_ms"]), int(reply["cut"]), trace)


@dataclass(frozen=True)
class Lease:
    conversation: str
    token: str
    fence: int


@dataclass(frozen=True)
class HistoryEntry:
    role: Literal["user", "assistant"]
    version: int
    text: str
    # A user message's files, by reference: the prompt shows a past one as a short
    # placeholder (a voice note as its transcript), never its bytes again.
    attachments: tuple[Attachment, ...] = ()
    # A reply's tool calls and what they gave, as JSON (`bot.core.steps.Done.tools`).
    tools: str = ""
    # A reply's turn: the id of its tool record, the first version of the burst it answers
    # (0: every message before it not yet answered).
    turn: int = 0
    # What its author wrote and nothing added: a message's own text, without its files'
    # labels (a command is told by it); a reply's words from the model, without the command
    # answers and notices the user saw with them ("" for none). None, for an entry made in
    # code: all of its text.
    words: str | None = None

    @classmethod
    def from_json(cls, raw: bytes | str) -> HistoryEntry:
        data: dict[str, Any] = json.loads(raw)
        if data["role"] == "user":
            message = InboundMessage.from_json(json.dumps(data["message"]))
            return cls(
                "user",
                int(data["v"]),
                message.prompt_text(),
                message.attachments,
                words=message.text,
            )
        text = str(data["text"])
        return cls(
            "assistant",
            int(data["v"]),
            text,
            tools=str(data.get("tools", "")),  # written only for a reply that called tools
            turn=int(data["turn"]),
            # The stored `said`: how many bytes at the end of `text` are the model's.
            words=_last_bytes(text, int(data["said"])),
        )


def _last_bytes(text: str, count: int) -> str:
    """The end of `text` that is `count` bytes long in UTF-8, as commit.lua counts them."""
    encoded = text.encode()
    return encoded[len(encoded) - count :].decode(errors="replace") if count > 0 else ""


@dataclass(frozen=True)
class NotAcquired:
    """A wake-up that got no lease, and when to look again (`look_in_ms`): another replica
    holds it ("busy"), its window is still open ("early"), a failed attempt is backed off
    ("backoff"), or nothing is owed ("idle")."""

    status: Literal["busy", "early", "backoff", "idle"]
    look_in_ms: int | None = None


@dataclass(frozen=True)
class Resend:
    """An outbox a crashed holder left: its reply, the version the reply covers, the lease
    (`fence`, `token`) that passed its pre-send check, and the admin changes it announces, as
    `Store.presend` got them."""

    text: str
    version: int
    fence: int
    token: str
    changes: str


@dataclass(frozen=True)
class Window:
    """A lease taken speculatively: the window is still open `ms` longer (server clock), so
    the reply waits for it to close (`PreSend.status` "hold"); by this replica's clock it
    closes at `closes_at` (`time.monotonic()`), counted from the answer's arrival, so never
    before the server's deadline."""

    ms: int
    closes_at: float


@dataclass(frozen=True)
class Acquired:
    """A wake-up that got the lease, and the work to do under it."""

    lease: Lease
    version: int  # V when the lease was taken
    watermark: int  # W when the lease was taken
    lateness_ms: int  # how long after the window's deadline the lease was taken
    # Replies discarded in a row as stale: at the starvation limit, this one goes out as it is.
    discards: int
    unanswered: tuple[InboundMessage, ...]
    history: tuple[HistoryEntry, ...]
    # Attempts in a row that failed (a platform or store error) before this one.
    failures: int
    # How long the oldest unanswered message has waited (server clock): at the starvation
    # age, this reply goes out whatever arrives meanwhile.
    waited_ms: int
    # The model the user picked with /model ("": the default).
    model: str
    # The user's own instructions, set with /persona ("": none).
    persona: str
    # When the window closed, or will (ms, server clock; 0 for a resend): the reply's place in
    # the queue for the outbound budget.
    closes_at_ms: int
    # The platform id of the last message taken in; in a group, what the reply answers.
    last: str
    # In a group: what was said in the room to others lately, oldest first (`Said`).
    room: tuple[Said, ...]
    resend: Resend | None = None  # an outbox left by a crashed holder, to send as it is
    window: Window | None = None  # taken speculatively, the window still open
    trace: str = ""  # the burst's trace, tracing on (`Ingested.trace`)

    @property
    def status(self) -> Literal["acquired"]:
        return "acquired"


# What a wake-up got (`Store.acquire`): the lease and the work, or when to look again.
Grant = Acquired | NotAcquired


def granted(raw: bytes | str, conversation: str, token: str) -> Grant:
    """From acquire.lua's answer to `token`'s attempt."""
    reply = decoded(raw)
    status = reply["status"]
    if status != "acquired":
        return NotAcquired(status, look_in_ms=reply.get("look_in_ms"))
    outbox = reply.get("resend")
    window_ms = int(reply["window_ms"])
    return Acquired(
        lease=Lease(conversation, token, int(reply["fence"])),
        version=int(reply["version"]),
        watermark=int(reply["watermark"]),
        lateness_ms=int(reply["lateness_ms"]),
        discards=int(reply["discards"]),
        unanswered=tuple(InboundMessage.from_json(m) for m in listed(reply["unanswered"]) if m),
        history=tuple(HistoryEntry.from_json(h) for h in listed(reply["history"])),
        failures=int(reply["failures"]),
        waited_ms=int(reply["waited_ms"]),
        model=str(reply["model"]),
        persona=str(reply["persona"]),
        closes_at_ms=int(reply["closes_at_ms"]),
        last=str(reply["last"]),
        room=tuple(Said.from_json(e) for e in listed(reply["room"])),
        resend=_resent(outbox) if outbox else None,
        window=Window(window_ms, time.monotonic() + window_ms / 1000) if window_ms > 0 else None,
        trace=str(reply.get("trace") or ""),
    )


def _resent(outbox: dict[str, Any]) -> Resend:
    """An outbox left by a crashed holder, from acquire.lua's answer."""
    return Resend(
        str(outbox["text"]),
        int(outbox["version"]),
        int(outbox["fence"]),
        str(outbox["token"]),
        str(outbox["changes"]),
    )


# What became of a reply at commit: delivered, the user cannot be reached, or given up.
Outcome = Literal["sent", "unreachable", "abandoned"]
# Why an attempt gave its lease back without a reply: it failed, or an outage (the store, the
# platform) cut it short.
Failed = Literal["failure", "outage"]


@dataclass(frozen=True)
class Ended:
    """The outcome of a step that may end the lease, and when to look at the conversation next."""

    ok: bool  # False: the lease was no longer ours, and nothing changed
    look_in_ms: int | None  # None: nothing owed

    @classmethod
    def from_reply(cls, raw: bytes | str) -> Ended:
        """From release.lua's or commit.lua's answer: any status but 'lost' is ok."""
        reply = decoded(raw)
        return cls(reply["status"] != "lost", look_in(reply["look_in_ms"]))


@dataclass(frozen=True)
class Interrupt:
    """How handing back the lease of a cancelled, stale generation went."""

    status: Literal["stale", "lost"]  # stale: the lease is given back
    look_in_ms: int | None = None
    # A speculative generation cut short by a message of its own burst: no reply went stale.
    restarted: bool = False

    @classmethod
    def from_reply(cls, raw: bytes | str) -> Interrupt:
        """From interrupt.lua's answer: 'restarted' is a stale that counted no discard."""
        reply = decoded(raw)
        status = reply["status"]
        restarted = status == "restarted"
        return cls("stale" if restarted else status, look_in(reply["look_in_ms"]), restarted)


@dataclass(frozen=True)
class PreSend:
    # hold: a speculative reply whose window is still open (look_in_ms: until it closes);
    # nothing changed, ask again then.
    status: Literal["ok", "stale", "hold", "lost"]
    forced: bool = False  # sent despite being stale, by the starvation guard
    look_in_ms: int | None = None
    # Stale because a message of its own burst came while the window was open (speculation):
    # no discard counts.
    restarted: bool = False

    @classmethod
    def from_reply(cls, raw: bytes | str) -> PreSend:
        """From presend.lua's answer: 'forced' is an ok that the guard forced out,
        'restarted' a stale that counted no discard."""
        reply = decoded(raw)
        status = reply["status"]
        if status in ("ok", "forced"):
            return cls("ok", forced=status == "forced")
        if status == "restarted":
            return cls("stale", look_in_ms=look_in(reply["look_in_ms"]), restarted=True)
        return cls(status, look_in_ms=look_in(reply["look_in_ms"]))


class Conversations(People):
    """The steps of the flow on one conversation, each one script and one round trip (ingest
    in a place other than the person's home DM: two, `ingest`)."""

    async def ingest(
        self,
        message: InboundMessage,
        verdict: Verdict = "allowed",
        heard: Heard | None = None,
        *,
        typing: bool = False,
        trace: str = "",
    ) -> Ingested:
        """Take a message in. `verdict` is what the settings say of its user; an admin's
        /allow or /deny, read in the same step, overrides it for anyone but an admin. In a
        group, `heard` says how the message reached the bot (`bot.core.groups.heard`). `typing`:
        the platform reports this user's typing (typing.lua), so the window learns with it.
        `trace`: tracing on, the trace this message begins if no burst's is open (`bot.traces`).

        The rate limit is the person's, across every place they write in. In their home DM
        (a DM whose chat is the user, Telegram's) ingest counts it itself, the person's
        counter being in the same slot: one round trip. Anywhere else the person's step
        (person.lua) comes first for a message addressed to the bot, so one over the rate
        never enters a burst; a message that may follow up a burst is counted after ingest
        has said whether it did (it cannot be dropped then, but counts for the next ones), and
        a line said to the room is only noted, so /forget finds the room."""
        heard = heard or Heard()
        person = self.person_keys(message.conversation, message.user_id)
        if message.conversation == person.home:
            return await self._ingest(message, verdict, heard, typing, trace, person.rate)
        if heard.addressed == "never":
            return await self._ingest(message, verdict, heard, typing, trace)
        if heard.addressed == "0":
            ingested = await self._ingest(message, verdict, heard, typing, trace)
            if ingested.accepted or ingested.overheard:
                await self._noted(message, counts=ingested.accepted)
            return ingested
        rate = await self._noted(message, counts=True)
        if rate == "ok":
            return await self._ingest(message, verdict, heard, typing, trace)
        limited = Ingested(False, 0, None, limited=True, first_limited=rate == "first_limited")
        if not heard.group:
            return limited
        # Over the rate in a group: taken in as a line that can never be addressed, so a group
        # the bot is silent in stays silent (no notice goes there) and a redelivery is a
        # duplicate; what is said to the room is its context, as anyone's line is.
        ingested = await self._ingest(
            message, verdict, replace(heard, addressed="never"), typing, trace
        )
        return limited if ingested.overheard else ingested

    async def _noted(self, message: InboundMessage, *, counts: bool) -> Rate:
        """The person's step for `message` (`note_person`), or "ok" if the person's slot
        cannot be reached: on a cluster it may be on another node than the conversation's,
        and a node down must not stop messages that are not its own. Meanwhile the person's
        rate is not counted and the place not noted (a /forget still finds the place by the
        next message said there)."""
        try:
            return await self.note_person(
                message.conversation, message.user_id, counts=counts, message_id=message.message_id
            )
        except StoreUnavailable as exc:
            log.warning("a person's step was skipped: their slot is unreachable: %s", exc)
            return "ok"

    async def _ingest(
        self,
        message: InboundMessage,
        verdict: Verdict,
        heard: Heard,
        typing: bool,
        trace: str,
        rate: str = "",
    ) -> Ingested:
        """ingest.lua on the message: counting it against the rate key `rate` ("": not at
        all, the person's step counts it)."""
        conversation = message.conversation
        args: dict[str, str | int] = {
            "conversation": conversation,
            "message_id": message.message_id,
            "message": message.to_json(),
            "quiet_ms": self.settings.quiet_ms,
            "max_wait_ms": self.settings.max_wait_ms,
            "seen_cap": SEEN_CAP,
            "rate_limit": self.settings.rate_per_minute if rate else 0,
            "rate_window_ms": RATE_WINDOW_MS,
            "active_keep_ms": ACTIVE_KEEP_MS,
            "seen_keep_ms": SEEN_KEEP_MS,
            "retention_ms": self.settings.retention_ms,
            "verdict": verdict,
            "user": message.user_id,
            "speculate_ms": self.settings.speculate_ms,
            "learn_floor_ms": self.settings.learn_floor_ms,
            "in_group": heard.group,
            "addressed": heard.addressed,
            "said": heard.room_entry,
            "room_messages": self.settings.room_messages,
            "room_keep_ms": self.settings.room_keep_ms,
            "typing": int(typing),
            "trace": trace,
        }
        keys = _own_keys(scripts.INGEST, self.layout.keys(conversation))
        keys["rate"] = rate or keys["rate"]
        return Ingested.from_reply(await self._run_durable(scripts.INGEST, keys, args))

    async def typing(self, conversation: str, hold_ms: int) -> Typed:
        """The user is typing: hold their open window `hold_ms` from now (within its cap), and
        cut a speculative generation on it (typing.lua)."""
        keys = _own_keys(scripts.TYPING, self.layout.keys(conversation))
        args: dict[str, str | int] = {
            "conversation": conversation,
            "hold_ms": hold_ms,
            "max_wait_ms": self.settings.max_wait_ms,
            "every_ms": TYPING_EVERY_MS,
            "window_bound_ms": self.settings.max_wait_ms + CLOCK_SLACK_MS,
        }
        return Typed.from_reply(await self._run(scripts.TYPING, keys, args))

    async def notice_once(self, conversation: str, ttl_ms: int) -> bool:
        """True for the first caller, on any replica, within `ttl_ms`: a one-off notice (such
        as a refusal) is then sent by that caller only."""
        keys = {"notice": self.layout.keys(conversation).notice}
        return bool(await self._run(scripts.NOTICE, keys, {"period_ms": ttl_ms}))

    async def acquire(self, conversation: str, token: str) -> Grant:
        args: dict[str, str | int] = {
            "conversation": conversation,
            "token": token,
            "ttl_ms": self.settings.ttl_ms,
            "history_entries": self.settings.history_cap,
            "max_wait_ms": self.settings.max_wait_ms,
            "backoff_cap_ms": RETRY_AFTER_ERROR_CAP_MS,
            "slack_ms": CLOCK_SLACK_MS,
            "trusted_age_ms": self.settings.trusted_age_ms,
            "starvation_limit": self.settings.starvation_limit,
            "starvation_age_ms": self.settings.starvation_age_ms,
            "room_keep_ms": self.settings.room_keep_ms,
        }
        keys = _own_keys(scripts.ACQUIRE, self.layout.keys(conversation))
        # Durable too: a resend goes out on this answer alone, so the outbox it reads must be
        # as safe as a pre-send's (the wait covers every write before this one).
        raw = await self._run_durable(scripts.ACQUIRE, keys, args)
        return granted(raw, conversation, token)

    async def renew(self, lease: Lease) -> bool:
        keys = _own_keys(scripts.RENEW, self.layout.keys(lease.conversation))
        args = {**_holder(lease), "ttl_ms": self.settings.ttl_ms}
        return bool(await self._run(scripts.RENEW, keys, args))

    async def release(self, lease: Lease, *, failed: Failed | None = None) -> Ended:
        """Give the lease back without a reply. `failed`: the attempt failed, or an outage cut
        it short, so the next one, by any replica, is backed off (`RETRY_AFTER_ERROR_MS`,
        doubling, capped); only a failure counts towards `llm.attempts`."""
        args: dict[str, str | int] = {
            "conversation": lease.conversation,
            "token": lease.token,
            "failed": failed or "",
            "backoff_ms": RETRY_AFTER_ERROR_MS,
            "backoff_cap_ms": RETRY_AFTER_ERROR_CAP_MS,
        }
        keys = _own_keys(scripts.RELEASE, self.layout.keys(lease.conversation))
        return Ended.from_reply(await self._run(scripts.RELEASE, keys, args))

    async def interrupt(self, lease: Lease) -> Interrupt:
        """A newer message arrived mid-generation and the generation is cancelled: hand the
        lease back, counting a discard towards the starvation guard."""
        keys = _own_keys(scripts.INTERRUPT, self.layout.keys(lease.conversation))
        args = {**_holder(lease), "totals_keep_ms": DAY_KEEP_MS}
        return Interrupt.from_reply(await self._run(scripts.INTERRUPT, keys, args))

    async def presend(
        self,
        lease: Lease,
        version: int,
        text: str,
        reset: int = 0,
        *,
        replaces: int = 0,
        unsaid: int = 0,
        changes: str = "",
        worked_ms: int = 0,
        tools: str = "",
        turn: int = 0,
        words: str | None = None,
    ) -> PreSend:
        """The pre-send check. `reset` is the version of the last /reset among the covered
        messages (0: none): the commit then empties the history before appending. For a
        /retry, `replaces` is the version of the reply this one takes the place of in the
        history, and `unsaid` the /retry message's, which the history does not keep.
        `words`: the model's own words, the end of `text` (command answers and notices come
        before them; "" when there are none), which the history tells apart so the model is
        never shown the rest as its own; None takes all of the text as the model's.
        `changes`: the admin changes the reply announces, kept with it in the outbox until
        the commit, so a resend (`Grant.resend_changes`) can apply them too. `worked_ms`: how
        long the cycle has worked since its acquire (reading files, generating), by the
        replica's own clock; the starvation guard believes an age that much older than it
        would at the acquire, so a slow generation that the guard let run is not discarded.
        `tools`: the tool calls the reply made, which the history keeps with it; `turn`: the
        id of the turn it answers (its tool record's), which the history keeps too."""
        trusted = self.settings.trusted_age_ms
        args: dict[str, str | int] = {
            **_holder(lease),
            "version": version,
            "text": text,
            "starvation_limit": self.settings.starvation_limit,
            "reset": reset,
            "retention_ms": self.settings.retention_ms,
            "starvation_age_ms": self.settings.starvation_age_ms,
            "replaces": replaces,
            "unsaid": _unsaid(unsaid, text, text if words is None else words),
            "totals_keep_ms": DAY_KEEP_MS,
            "changes": changes,
            "trusted_age_ms": trusted + worked_ms if trusted else 0,
            "window_bound_ms": self.settings.max_wait_ms + CLOCK_SLACK_MS,
            "tools": tools,
            "turn": turn,
        }
        keys = _own_keys(scripts.PRESEND, self.layout.keys(lease.conversation))
        return PreSend.from_reply(await self._run_durable(scripts.PRESEND, keys, args))

    async def commit(self, lease: Lease, outcome: Outcome = "sent") -> Ended:
        """W moves to the version the outbox covers and the lease is released. `outcome`
        says what became of the reply: only a sent one joins the history; `unreachable`
        marks the conversation until the user writes again."""
        args: dict[str, str | int] = {
            **_holder(lease),
            "history_cap": self.settings.history_cap,
            "outcome": outcome,
            "retention_ms": self.settings.retention_ms,
            "totals_keep_ms": DAY_KEEP_MS,
        }
        keys = _own_keys(scripts.COMMIT, self.layout.keys(lease.conversation))
        return Ended.from_reply(await self._run_durable(scripts.COMMIT, keys, args))

    async def settle(self, lease: Lease) -> Ended:
        """What a commit that failed for good must not leave undone: W moves to the version
        the outbox covers and the outbox and the lease go, so the reply already sent is never
        sent again; the history and the totals are left as they are (settle.lua)."""
        keys = _own_keys(scripts.SETTLE, self.layout.keys(lease.conversation))
        return Ended.from_reply(await self._run_durable(scripts.SETTLE, keys, _holder(lease)))

    async def pick_model(self, conversation: str, name: str) -> None:
        """Remember the model the user picked with /model, for every replica."""
        async with self._reaching():
            await self.redis.hset(self.layout.keys(conversation).state, "model", name)

    async def versions(self, conversations: list[str]) -> list[tuple[int, int]]:
        """V of each conversation, and the fence of the speculative generation a typing signal
        cut (typing.lua; 0: none), in one pipelined round trip (on a cluster, one per primary
        holding any of them, at once): for watching generations go stale."""
        async with self._reaching(), self.redis.pipeline(transaction=False) as pipe:
            for conversation in conversations:
                pipe.hmget(self.layout.keys(conversation).state, ["v", "cut"])
            values: list[list[bytes | None]] = await pipe.execute()
        return [(int(v or 0), int(cut or 0)) for v, cut in values]

    async def counters(self, conversation: str) -> tuple[int, int]:
        """(V, W) of a conversation."""
        async with self._reaching():
            v, w = await self.redis.hmget(self.layout.keys(conversation).state, ["v", "w"])
        return int(v or 0), int(w or 0)

    async def recent(self, platform: str, within_ms: int) -> dict[str, str]:
        """Conversations on `platform` with a new message in the last `within_ms` (at most
        `ACTIVE_KEEP_MS`), each with the platform id of the last message taken in. Two round
        trips; meant for the rare catch-up after a platform connection gap."""
        prefix = f"{platform}:"
        # The client's clock is fine here: an hour-long window does not mind a skew of seconds.
        since = int(time.time() * 1000) - min(within_ms, ACTIVE_KEEP_MS)
        async with self._reaching():
            async with self.redis.pipeline(transaction=False) as pipe:
                for shard in range(self.layout.shards):
                    pipe.zrangebyscore(self.layout.active_key(shard), since, "+inf")
                shards: list[list[bytes]] = await pipe.execute()
            conversations = [c for s in shards for c in map(as_text, s) if c.startswith(prefix)]
            async with self.redis.pipeline(transaction=False) as pipe:
                for conversation in conversations:
                    pipe.hget(self.layout.keys(conversation).state, "last")
                lasts: list[bytes | None] = await pipe.execute()
        return {c: as_text(last) for c, last in zip(conversations, lasts, strict=True) if last}

    async def history(self, conversation: str) -> list[HistoryEntry]:
        async with self._reaching():
            raw = await self.redis.lrange(self.layout.keys(conversation).history, 0, -1)
        return [HistoryEntry.from_json(as_text(h)) for h in raw]


def _unsaid(message: int, text: str, words: str) -> str:
    """What the outbox's `unsaid` holds: the message the history leaves out (a /retry's, or
    0), and how many bytes at the end of the text the model said (commit.lua)."""
    if not text.endswith(words):
        raise ValueError("the model's words must end the reply")
    return json.dumps({"message": message, "said": len(words.encode())})


def _own_keys(script: Script, k: Keys) -> dict[str, str]:
    """A step's keys, each the conversation's own of the same name (`Keys`); `totals` is its
    shard's totals of today."""
    return {
        name: k.day_totals(utc_today()) if name == "totals" else getattr(k, name)
        for name in script.keys
    }


def _holder(lease: Lease) -> dict[str, str | int]:
    """The arguments that say who holds the lease."""
    return {"conversation": lease.conversation, "token": lease.token, "fence": lease.fence}
