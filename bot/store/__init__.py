"""The store: every atomic step of the flow as one Lua script against Redis.

Each script file next to this module is one step (`ingest`, `notice`, `acquire`, `renew`,
`release`, `interrupt`, `presend`, `commit`, `due`, `usage`, `role`, `role_release`,
`heartbeat`); `prelude.lua` holds their shared helpers and is loaded in front of each.

Every key name comes from `bot.store.keys`, which also describes the layout.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import secrets
import socket
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, fields
from datetime import UTC, date, datetime
from importlib import resources
from typing import Any, Literal

from redis.commands.core import AsyncScript
from redis.exceptions import (
    AskError,
    ClusterDownError,
    ClusterError,
    MasterDownError,
    MovedError,
    NoScriptError,
    ReadOnlyError,
    RedisClusterException,
    ResponseError,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from bot.connect import MAX_CONNECTIONS, Client, drop_connections
from bot.message import Attachment, InboundMessage, Unavailable
from bot.settings import Settings, Verdict
from bot.store.durability import DEFAULT_LEVEL, Durability, Level
from bot.store.keys import (
    ACCESS_KEY,
    ACCESS_SEQ_KEY,
    ROLE_TAG,
    access_key,
    active_key,
    due_key,
    heartbeat_key,
    kept_key,
    usage_day_keys,
)

# `X as X`: names other modules have always imported from here, re-exported.
from bot.store.keys import SHARDS as SHARDS
from bot.store.keys import Keys as Keys
from bot.store.keys import role_key as role_key
from bot.store.keys import shard_of as shard_of

log = logging.getLogger(__name__)

# Platform message ids remembered per conversation for dedupe: at most this many, and none
# older than the platforms' redelivery horizon (Telegram keeps an update for 24 h) allows.
SEEN_CAP = 1000
SEEN_KEEP_MS = 25 * 3600_000
# After a failed attempt at a conversation (a platform or store error), the next one waits
# this long, doubling per failure in a row up to the cap, whichever replica makes it.
RETRY_AFTER_ERROR_MS = 1000
RETRY_AFTER_ERROR_CAP_MS = 60_000
# A time the store holds further ahead than the flow ever sets one, by more than this, was set
# by a clock that has since moved back (a failover to a node behind): it counts as run out.
CLOCK_SLACK_MS = 1000
# A sweep mends at most this many shards' copies of the access changes (the rest at the next).
MEND_SHARDS_PER_SWEEP = 8
# The rate limit counts messages per minute.
RATE_WINDOW_MS = 60_000
# How long a conversation stays in the activity index after its last message.
ACTIVE_KEEP_MS = 3600_000
# A day's token count outlives the day, so a status read just after midnight still sees it.
DAY_KEEP_MS = 2 * 86_400_000
# A month's tokens outlive the month, so /usage on its last day still reads it whole.
MONTH_KEEP_MS = 62 * 86_400_000


class StoreUnavailable(Unavailable):
    """Redis cannot be reached, or refuses for now (out of memory, loading, read-only after a
    failover...). Try again later."""

    def __init__(self, reason: str, *, reconnect: bool = False) -> None:
        super().__init__(reason)
        # The connections point at a node that no longer serves us (a demoted primary, a
        # moved slot): drop them so the next attempt resolves the right one.
        self.reconnect = reconnect


# Error replies that say "not now" rather than "never": the first word of the reply.
# OOM: at maxmemory with noeviction (writes refused until memory is freed); BUSY: a script or
# function runs too long; LOADING: the dataset is being loaded after a restart; MASTERDOWN,
# TRYAGAIN, CLUSTERDOWN: a failover or resharding is under way; NOSCRIPT: an empty script
# cache after a restart (scripts are reloaded on the next attempt); NOREPLICAS: writes refused
# by `min-replicas-to-write` until a replica is back in touch; MISCONF: writes refused after a
# failed background save, until one succeeds; UNBLOCKED: an operator's CLIENT UNBLOCK ended a
# wait of ours (the durability level's WAIT). Not here, as no retry outlives them: ACL and
# auth refusals (NOPERM, NOAUTH, WRONGPASS), wrong types and script bugs (ERR, WRONGTYPE).
TRANSIENT_REPLIES = frozenset(
    {
        "OOM",
        "BUSY",
        "LOADING",
        "MASTERDOWN",
        "TRYAGAIN",
        "CLUSTERDOWN",
        "NOSCRIPT",
        "NOREPLICAS",
        "MISCONF",
        "UNBLOCKED",
    }
)
# These mean the connection talks to the wrong node: a replica after a failover (READONLY),
# or a cluster node that does not own the slot, seen by a plain client (MOVED, ASK).
WRONG_NODE_REPLIES = frozenset({"READONLY", "MOVED", "ASK"})


# The cluster client's own words for a cluster it cannot use for now (its slot map could not
# be loaded: no node answers, slots uncovered mid-failover, nodes disagree mid-resharding).
CLUSTER_UNREACHABLE = (
    "Redis Cluster cannot be connected",
    "All slots are not covered",
    "startup_nodes could not agree",
)


def classify(exc: ResponseError) -> StoreUnavailable | None:
    """The retryable `StoreUnavailable` for an error reply that is transient, else None (a
    bug or a misconfiguration: the caller lets it propagate, and it is logged as an error).
    An error raised inside a script keeps its code, so this works for scripts too."""
    text = str(exc).strip()
    # redis-py strips the codes it knows from the message and keeps them here, or says
    # which it was by the exception's class (the cluster's errors).
    code = getattr(exc, "status_code", None) or text.split(" ", 1)[0]
    if code == "ERR":
        # Before Redis 7 a refused command inside a script came back as a script error,
        # "ERR Error running script (call to f_...): @user_script:9: -NOREPLICAS ...".
        code = _refused_in_script(text) or code
    if isinstance(exc, ReadOnlyError):
        code = "READONLY"
    elif isinstance(exc, AskError):
        code = "MOVED" if isinstance(exc, MovedError) else "ASK"
    elif isinstance(exc, ClusterDownError):
        code = "MASTERDOWN" if isinstance(exc, MasterDownError) else "CLUSTERDOWN"
    elif isinstance(exc, TryAgainError):
        code = "TRYAGAIN"
    if code == "READONLY":
        return StoreUnavailable(
            f"Redis is read-only (a replica after a failover?): {text}", reconnect=True
        )
    if code in WRONG_NODE_REPLIES:
        return StoreUnavailable(f"Redis answered {code}: {text}", reconnect=True)
    if code in TRANSIENT_REPLIES:
        return StoreUnavailable(f"Redis answered {code}: {text}")
    return None


# In an old server's script error: the code of the reply that a call inside the script got.
_SCRIPT_CALL_REPLY = re.compile(r"@user_script: ?\d+: -?([A-Z]+) ")


def _refused_in_script(text: str) -> str | None:
    """The code of a refusal the script met, if `text` is an old server's script error."""
    if not text.startswith("Error running script"):
        return None
    found = _SCRIPT_CALL_REPLY.findall(text)
    return found[-1] if found else None


def _raised_in_redis_py(exc: BaseException) -> bool:
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and f"{os.sep}redis{os.sep}" in tb.tb_frame.f_code.co_filename


@contextmanager
def reaching_redis() -> Iterator[None]:
    """Turn the client's connection errors and transient error replies into
    `StoreUnavailable`, which callers handle; other errors propagate as they are."""
    try:
        yield
    except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
        # Sentinel's client says so when the primary it used answers READONLY: demoted.
        demoted = "previous master is now a slave" in str(exc)
        why = str(exc) or type(exc).__name__  # MaxConnectionsError has no text
        raise StoreUnavailable(f"Redis is unreachable: {why}", reconnect=demoted) from exc
    except AttributeError as exc:
        # redis-py's cluster client closes every connection when one call fails to connect;
        # a call in flight on another connection then fails inside the library like this.
        # Only from inside the library: one of ours is a bug, and propagates.
        if not _raised_in_redis_py(exc):
            raise
        raise StoreUnavailable(f"the Redis client dropped its connection: {exc}") from exc
    except ResponseError as exc:
        unavailable = classify(exc)
        if unavailable is None:
            raise
        raise unavailable from exc
    except ClusterError as exc:
        # Redirections or CLUSTERDOWN on every retry the cluster client made.
        raise StoreUnavailable(f"Redis Cluster is not usable now: {exc}") from exc
    except RedisClusterException as exc:
        # Others of these are bugs (keys of several slots in one call): they propagate.
        if isinstance(exc, SlotNotCoveredError) or str(exc).startswith(CLUSTER_UNREACHABLE):
            raise StoreUnavailable(
                f"Redis Cluster is not usable now: {exc}", reconnect=True
            ) from exc
        raise


def _load(name: str) -> str:
    folder = resources.files(__package__)
    prelude = folder.joinpath("prelude.lua").read_text()
    return prelude + "\n" + folder.joinpath(f"{name}.lua").read_text()


INGEST = _load("ingest")
NOTICE = _load("notice")
ACQUIRE = _load("acquire")
RENEW = _load("renew")
RELEASE = _load("release")
INTERRUPT = _load("interrupt")
USAGE = _load("usage")
PRESEND = _load("presend")
COMMIT = _load("commit")
DUE = _load("due")
ROLE = _load("role")
ROLE_RELEASE = _load("role_release")
HEARTBEAT = _load("heartbeat")
ACCESS_SET = _load("access_set")
ACCESS_COPY = _load("access_copy")


def lease_token(owner: str) -> str:
    """A fresh, unguessable lease token that says which replica holds the lease (the part
    before the "/"), so `lastword status` can tell who holds what."""
    return f"{owner}/{secrets.token_hex(12)}"


@dataclass(frozen=True)
class StoreSettings:
    """What the scripts are told with each call. Replaced whole by a reload (`Store.configure`)."""

    quiet_ms: int
    max_wait_ms: int
    ttl_ms: int
    history_cap: int
    starvation_limit: int
    starvation_age_ms: int = 0
    rate_per_minute: int = 0
    retention_ms: int = 30 * 86_400_000
    # What ingest, pre-send and commit wait for (bot.store.durability).
    durability: Level = DEFAULT_LEVEL

    @property
    def horizon_ms(self) -> int:
        """The longest delay the flow sets (a window, a lease, a backoff), with slack: a time
        the store holds further ahead than this is the work of a clock that moved back."""
        return max(self.max_wait_ms, self.ttl_ms, RETRY_AFTER_ERROR_CAP_MS) + CLOCK_SLACK_MS

    @property
    def trusted_age_ms(self) -> int:
        """The oldest age of the oldest unanswered message the starvation guard believes (0:
        the guard's age is off): the guard's age, a window (max_wait) and a generation (lease
        TTL) more; at the pre-send check also the time the cycle has worked (`presend`'s
        `worked_ms`). An age beyond it is taken for a clock that moved forward; the guard's
        clock then starts again, and only the discard count can force a reply meanwhile."""
        if not self.starvation_age_ms:
            return 0
        return self.starvation_age_ms + self.max_wait_ms + self.ttl_ms

    @classmethod
    def of(cls, settings: Settings) -> StoreSettings:
        return cls(
            quiet_ms=settings.debounce.quiet_ms,
            max_wait_ms=settings.debounce.max_wait_ms,
            ttl_ms=settings.lease.ttl_ms,
            history_cap=settings.history_cap,
            starvation_limit=settings.starvation_limit,
            starvation_age_ms=settings.starvation_age_ms,
            rate_per_minute=settings.access.rate_per_minute,
            retention_ms=int(settings.retention_days * 86_400_000),
            durability=settings.durability,
        )


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


@dataclass(frozen=True)
class AccessRecord:
    """What admins changed in chat for one user (`keys.ACCESS_KEY`)."""

    user: str
    access: Literal["allow", "deny"] | None  # None: as the settings say
    budget: int | None  # daily tokens; None: the settings' budget
    by: str  # the admin who made the last change
    at_ms: int
    seq: int

    @classmethod
    def from_json(cls, user: str, raw: bytes | str) -> AccessRecord:
        data = json.loads(raw)
        budget = data.get("budget")
        return cls(
            user=user,
            access=data.get("access"),
            budget=None if budget is None else int(budget),
            by=str(data.get("by", "")),
            at_ms=int(data.get("at", 0)),
            seq=int(data.get("seq", 0)),
        )


@dataclass(frozen=True)
class Spending:
    """A user's tokens today and this month (UTC, weighed by model cost), and the daily
    budget an admin set for them (None: the settings' budget)."""

    today: int
    month: int
    budget: int | None


@dataclass(frozen=True)
class DayTotals:
    """What every replica did on one UTC day: tokens, generations, replies sent, generations
    cut short or thrown away for a newer message, replies the starvation guard forced out,
    and the conversations that spent tokens."""

    prompt: int = 0
    completion: int = 0
    generations: int = 0
    replies: int = 0
    interrupted: int = 0
    forced: int = 0
    users: int = 0

    @classmethod
    def summed(cls, totals: Sequence[Mapping[Any, Any]], users: Sequence[int]) -> DayTotals:
        """The shards' totals (hashes) and counts of conversations, added up."""
        # Every field but `users` is a field of the shards' totals hashes, of the same name.
        sums = {f.name: 0 for f in fields(cls) if f.name != "users"}
        for shard in totals:
            for name, value in shard.items():
                if _text(name) in sums:
                    sums[_text(name)] += int(value)
        return cls(users=sum(int(n) for n in users), **sums)


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

    @classmethod
    def from_json(cls, raw: bytes | str) -> HistoryEntry:
        data: dict[str, Any] = json.loads(raw)
        if data["role"] == "user":
            message = InboundMessage.from_json(json.dumps(data["message"]))
            return cls("user", int(data["v"]), message.prompt_text(), message.attachments)
        return cls("assistant", int(data["v"]), str(data["text"]))


@dataclass(frozen=True)
class Grant:
    """What a wake-up got. Only `acquired` carries a lease and the work to do."""

    status: Literal["acquired", "busy", "early", "backoff", "idle"]
    look_in_ms: int | None = None  # for busy, early and backoff: when to look again
    lease: Lease | None = None
    version: int = 0  # V when the lease was taken
    watermark: int = 0  # W when the lease was taken
    lateness_ms: int = 0  # how long after the window's deadline the lease was taken
    # Replies discarded in a row as stale: at the starvation limit, this one goes out as it is.
    discards: int = 0
    resend: tuple[str, int] | None = None  # an outbox left by a crashed holder: (text, version)
    unanswered: tuple[InboundMessage, ...] = ()
    history: tuple[HistoryEntry, ...] = ()
    # Attempts in a row that failed (a platform or store error) before this one.
    failures: int = 0
    # With `resend`: the fence and token of the lease that passed its pre-send check.
    resend_lease: tuple[int, str] = (0, "")
    # How long the oldest unanswered message has waited (server clock): at the starvation
    # age, this reply goes out whatever arrives meanwhile.
    waited_ms: int = 0
    # The model the user picked with /model ("": the default).
    model: str = ""
    # With `resend`: the admin changes the reply announces, as `Store.presend` got them.
    resend_changes: str = ""


# What became of a reply at commit: delivered, the user cannot be reached, or given up.
Outcome = Literal["sent", "unreachable", "abandoned"]


@dataclass(frozen=True)
class Ended:
    """The outcome of a step that may end the lease, and when to look at the conversation next."""

    ok: bool  # False: the lease was no longer ours, and nothing changed
    look_in_ms: int | None  # None: nothing owed


@dataclass(frozen=True)
class Interrupt:
    """How handing back the lease of a cancelled, stale generation went."""

    status: Literal["stale", "lost"]  # stale: the lease is given back
    look_in_ms: int | None = None


@dataclass(frozen=True)
class PreSend:
    status: Literal["ok", "stale", "lost"]
    forced: bool = False  # sent despite being stale, by the starvation guard
    look_in_ms: int | None = None


def _today() -> date:
    # The replica's clock picks the day: a skew of seconds at midnight does not matter.
    return datetime.now(UTC).date()


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _look_in(ms: int | bytes) -> int | None:
    """When to look at a conversation again, from a script's reply: its -1 means never
    (nothing is owed, or it is not ours to look at)."""
    value = int(ms)
    return None if value < 0 else value


class Store:
    """Typed calls for the scripts. One instance per process, shared by all its tasks."""

    def __init__(self, redis: Client, settings: StoreSettings) -> None:
        self.redis = redis
        self.settings = settings
        self._ingest = redis.register_script(INGEST)
        self._notice = redis.register_script(NOTICE)
        self._acquire = redis.register_script(ACQUIRE)
        self._renew = redis.register_script(RENEW)
        self._release = redis.register_script(RELEASE)
        self._interrupt = redis.register_script(INTERRUPT)
        self._usage = redis.register_script(USAGE)
        self._presend = redis.register_script(PRESEND)
        self._commit = redis.register_script(COMMIT)
        self._due = redis.register_script(DUE)
        self._role = redis.register_script(ROLE)
        self._role_release = redis.register_script(ROLE_RELEASE)
        self._heartbeat = redis.register_script(HEARTBEAT)
        self._access_set = redis.register_script(ACCESS_SET)
        self._access_copy = redis.register_script(ACCESS_COPY)
        self.durability = Durability(redis)
        # The cluster client fails a call at once when a node's pool is exhausted, and then
        # closes every connection, failing the calls in flight too; the single-server pool
        # waits instead. Bounding the calls in flight per process to the pool size keeps
        # both within their pools.
        self._in_flight = asyncio.Semaphore(MAX_CONNECTIONS)

    def configure(self, settings: StoreSettings) -> None:
        """Take on reloaded settings: every script call from now on is told the new ones."""
        self.settings = settings

    @asynccontextmanager
    async def _reaching(self) -> AsyncIterator[None]:
        """`reaching_redis`, and after a reply that says we talk to the wrong node, the
        connections dropped so the next attempt resolves the right one."""
        try:
            async with self._in_flight:
                with reaching_redis():
                    yield
        except StoreUnavailable as exc:
            if exc.reconnect:
                # For the cluster client also its slot map; Sentinel's pool asks anew.
                await drop_connections(self.redis)
            raise

    async def _run(self, script: AsyncScript, keys: list[str], args: list[str | int]) -> Any:
        # AsyncScript reloads the script itself on NOSCRIPT (empty cache after a restart).
        async with self._reaching():
            return await script(keys=keys, args=args)

    async def _run_durable(
        self, script: AsyncScript, keys: list[str], args: list[str | int]
    ) -> Any:
        """`_run` for a step whose outcome is promised outside Redis: at the configured
        durability, it waits for the fsync (and a replica) on the script's connection."""
        async with self._reaching():
            return await self.durability.run(self.settings.durability, script, keys, args)

    async def ping(self) -> None:
        async with self._reaching():
            await self.redis.ping()

    async def check_layout(self) -> None:
        """At start-up: record the shard layout at the first start, and refuse a store laid
        out otherwise, or holding legacy data (`bot.store.migrate.LayoutError`)."""
        from bot.store.migrate import check_layout

        async with self._reaching():
            await check_layout(self.redis)

    async def ingest(self, message: InboundMessage, verdict: Verdict = "allowed") -> Ingested:
        """Take a message in. `verdict` is what the settings say of its user; an admin's
        /allow or /deny, read in the same step, overrides it for anyone but an admin."""
        conversation = message.conversation
        k = Keys(conversation)
        keys = [k.state, k.pending, k.seen, k.window, k.due, k.rate, k.active]
        keys += [k.history, k.outbox, k.usage, k.access]
        args: list[str | int] = [
            conversation,
            message.message_id,
            message.to_json(),
            self.settings.quiet_ms,
            self.settings.max_wait_ms,
            SEEN_CAP,
            self.settings.rate_per_minute,
            RATE_WINDOW_MS,
            ACTIVE_KEEP_MS,
            SEEN_KEEP_MS,
            self.settings.retention_ms,
            verdict,
            message.user_id,
        ]
        raw_status, version, due_in, raw_window = await self._run_durable(self._ingest, keys, args)
        status, window = _text(raw_status), _text(raw_window)
        return Ingested(
            accepted=status == "accepted",
            version=int(version),
            look_in_ms=_look_in(due_in),
            limited=status in ("limited", "first_limited"),
            first_limited=status == "first_limited",
            opened_window=window == "opened",
            capped=window == "capped",
            refused=status == "refused",
        )

    async def notice_once(self, conversation: str, ttl_ms: int) -> bool:
        """True for the first caller, on any replica, within `ttl_ms`: a one-off notice (such
        as a refusal) is then sent by that caller only."""
        keys = [Keys(conversation).notice]
        return bool(await self._run(self._notice, keys, [ttl_ms]))

    async def acquire(self, conversation: str, token: str) -> Grant:
        k = Keys(conversation)
        keys = [k.state, k.window, k.lease, k.due, k.pending, k.history, k.outbox]
        # Durable too: a resend goes out on this answer alone, so the outbox it reads must be
        # as safe as a pre-send's (the wait covers every write before this one).
        args: list[str | int] = [
            conversation,
            token,
            self.settings.ttl_ms,
            self.settings.history_cap,
            self.settings.max_wait_ms,
            RETRY_AFTER_ERROR_CAP_MS,
            CLOCK_SLACK_MS,
            self.settings.trusted_age_ms,
        ]
        reply = await self._run_durable(self._acquire, keys, args)
        status = _text(reply[0])
        if status in ("busy", "early", "backoff"):
            return Grant(status, look_in_ms=_look_in(reply[1]))  # type: ignore[arg-type]
        if status == "idle":
            return Grant("idle")
        _, fence, version, watermark, lateness, discards, resend, unanswered, history = reply[:9]
        return Grant(
            "acquired",
            lease=Lease(conversation, token, int(fence)),
            version=int(version),
            watermark=int(watermark),
            lateness_ms=int(lateness),
            discards=int(discards),
            resend=(_text(resend[0]), int(resend[1])) if resend else None,
            unanswered=tuple(InboundMessage.from_json(m) for m in unanswered if m),
            history=tuple(HistoryEntry.from_json(_text(h)) for h in history),
            failures=int(reply[9]),
            resend_lease=(int(reply[10] or 0), _text(reply[11])) if resend else (0, ""),
            waited_ms=int(reply[12]),
            model=_text(reply[13]),
            resend_changes=_text(reply[14]) if resend else "",
        )

    async def renew(self, lease: Lease) -> bool:
        k = Keys(lease.conversation)
        args: list[str | int] = [lease.conversation, lease.token, lease.fence, self.settings.ttl_ms]
        return bool(await self._run(self._renew, [k.lease, k.due], args))

    async def release(self, lease: Lease, *, failed: bool = False) -> Ended:
        """Give the lease back without a reply. `failed`: the attempt failed, so the next
        one, by any replica, is backed off (`RETRY_AFTER_ERROR_MS`, doubling, capped)."""
        k = Keys(lease.conversation)
        keys = [k.lease, k.state, k.window, k.due]
        args: list[str | int] = [
            lease.conversation,
            lease.token,
            int(failed),
            RETRY_AFTER_ERROR_MS,
            RETRY_AFTER_ERROR_CAP_MS,
        ]
        status, look_in = await self._run(self._release, keys, args)
        return Ended(_text(status) == "released", _look_in(look_in))

    async def interrupt(self, lease: Lease) -> Interrupt:
        """A newer message arrived mid-generation and the generation is cancelled: hand the
        lease back, counting a discard towards the starvation guard."""
        k = Keys(lease.conversation)
        keys = [k.lease, k.state, k.window, k.due, k.day_totals(_today())]
        args: list[str | int] = [lease.conversation, lease.token, lease.fence, DAY_KEEP_MS]
        raw_status, value = await self._run(self._interrupt, keys, args)
        status = _text(raw_status)
        return Interrupt(status, _look_in(value))  # type: ignore[arg-type]

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
    ) -> PreSend:
        """The pre-send check. `reset` is the version of the last /reset among the covered
        messages (0: none): the commit then empties the history before appending. For a
        /retry, `replaces` is the version of the reply this one takes the place of in the
        history, and `unsaid` the /retry message's, which the history does not keep.
        `changes`: the admin changes the reply announces, kept with it in the outbox until
        the commit, so a resend (`Grant.resend_changes`) can apply them too. `worked_ms`: how
        long the cycle has worked since its acquire (reading files, generating), by the
        replica's own clock; the starvation guard believes an age that much older than it
        would at the acquire, so a slow generation that the guard let run is not discarded."""
        k = Keys(lease.conversation)
        keys = [k.lease, k.state, k.outbox, k.window, k.due, k.day_totals(_today())]
        args: list[str | int] = [
            lease.conversation,
            lease.token,
            lease.fence,
            version,
            text,
            self.settings.starvation_limit,
            reset,
            self.settings.retention_ms,
            self.settings.starvation_age_ms,
            replaces,
            unsaid,
            DAY_KEEP_MS,
            changes,
            self.settings.trusted_age_ms + worked_ms if self.settings.trusted_age_ms else 0,
        ]
        reply = await self._run_durable(self._presend, keys, args)
        status = _text(reply[0])
        if status in ("ok", "forced"):
            return PreSend("ok", forced=status == "forced")
        return PreSend("stale" if status == "stale" else "lost", look_in_ms=_look_in(reply[1]))

    async def commit(self, lease: Lease, outcome: Outcome = "sent") -> Ended:
        """W moves to the version the outbox covers and the lease is released. `outcome`
        says what became of the reply: only a sent one joins the history; `unreachable`
        marks the conversation until the user writes again."""
        k = Keys(lease.conversation)
        keys = [k.lease, k.state, k.pending, k.history, k.outbox, k.window, k.due, k.seen]
        keys += [k.usage, k.day_totals(_today())]
        args: list[str | int] = [
            lease.conversation,
            lease.token,
            lease.fence,
            self.settings.history_cap,
            outcome,
            self.settings.retention_ms,
            DAY_KEEP_MS,
        ]
        status, look_in = await self._run_durable(self._commit, keys, args)
        return Ended(_text(status) == "committed", _look_in(look_in))

    async def due(self, limit: int = 100) -> list[str]:
        """Conversations, across all shards, whose next look is overdue, or scored further
        ahead than any delay the flow sets (`StoreSettings.horizon_ms`). One round trip (on a
        cluster, one to each primary, all at once: the pipeline is split by node), which also
        reads whether a shard's copies of the access changes lag behind: a few such shards
        are mended then (`MEND_SHARDS_PER_SWEEP`), the rest at the next sweep."""
        horizon = self.settings.horizon_ms
        *shards, latest = await self._in_every_shard(
            self._due,
            lambda shard: ([due_key(shard), access_key(shard)], [limit, horizon]),
            also=[("GET", ACCESS_SEQ_KEY)],
        )
        behind = [n for n, (_, whole) in enumerate(shards) if int(whole) < int(latest or 0)]
        if behind:
            await self._mend_access(behind[:MEND_SHARDS_PER_SWEEP])
        return [_text(c) for found, _ in shards for c in found]

    async def _mend_access(self, shards: Sequence[int]) -> None:
        """Mend these shards' copies of the access changes. Best effort: a failure is
        logged, and the next sweep finds them behind still and tries again; it must not cost
        the sweep its wake-ups."""
        try:
            await self._spread_access(shards)
        except Unavailable as exc:
            log.warning("could not mend the access changes of %d shards: %s", len(shards), exc)
        except Exception:
            log.exception("mending the access changes of %d shards failed", len(shards))

    async def _in_every_shard(
        self,
        script: AsyncScript,
        call: Callable[[int], tuple[list[str], list[str | int]]],
        *,
        shards: Sequence[int] = range(SHARDS),
        also: Sequence[tuple[str, ...]] = (),
    ) -> list[Any]:
        """Run `script` once in each of `shards` (all by default), on the keys and with the
        arguments `call(shard)` gives, and the commands `also` after them, in one pipeline (on
        a cluster, one round trip to each primary, all at once). Their replies, in order."""
        async with self._reaching():
            try:
                return await self._pipeline_in_every_shard(script, call, shards, also)
            except NoScriptError:
                # Plain EVALSHA in the pipeline (a Script object would add a SCRIPT EXISTS
                # round trip to every sweep), so reload by hand after a restart.
                await self.redis.script_load(script.script)
                return await self._pipeline_in_every_shard(script, call, shards, also)

    async def _pipeline_in_every_shard(
        self,
        script: AsyncScript,
        call: Callable[[int], tuple[list[str], list[str | int]]],
        shards: Sequence[int],
        also: Sequence[tuple[str, ...]],
    ) -> list[Any]:
        async with self.redis.pipeline(transaction=False) as pipe:
            for shard in shards:
                keys, args = call(shard)
                # As a raw command: the cluster pipeline refuses its evalsha() helper.
                pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
            for command in also:
                pipe.execute_command(*command)
            results: list[Any] = await pipe.execute()
        return results

    async def claim_role(self, name: str, token: str, ttl_ms: int) -> int | None:
        """Take the role `name` for `ttl_ms`. Returns its fence if it is now ours (newly
        taken, with a fence higher than any before, or already ours and renewed), None if
        another holder has it."""
        keys = [role_key(name), ROLE_TAG]
        fence = int(await self._run(self._role, keys, ["claim", name, token, "", ttl_ms]))
        return fence or None

    async def renew_role(self, name: str, token: str, fence: int, ttl_ms: int) -> bool:
        """Extend our hold on a role by `ttl_ms`; False if it is no longer ours."""
        keys = [role_key(name), ROLE_TAG]
        return bool(await self._run(self._role, keys, ["renew", name, token, fence, ttl_ms]))

    async def release_role(self, name: str, token: str) -> bool:
        """Give the role back if it is still ours; False (and no change) otherwise."""
        return bool(await self._run(self._role_release, [role_key(name)], [token]))

    async def remember(self, name: str, value: str | None, ttl_ms: int) -> None:
        """Keep `value` under `name` for `ttl_ms`, for any replica to read (None: forget)."""
        key = kept_key(name)
        async with self._reaching():
            if value is None:
                await self.redis.delete(key)
            else:
                await self.redis.set(key, value, px=max(ttl_ms, 1))

    async def recall(self, name: str) -> str | None:
        async with self._reaching():
            value = await self.redis.get(kept_key(name))
        return None if value is None else _text(value)

    async def add_usage(
        self, conversation: str, user: str, prompt: int, completion: int, cost: float = 1.0
    ) -> int:
        """Count the tokens a reply cost; returns what the conversation's user spent today.
        A DM conversation is one user, so its day is the user's day. `cost` weighs them in
        the user's day and month (a dearer model's tokens count for more)."""
        k = Keys(conversation)
        today = _today()
        keys = [k.usage, k.day(today), *usage_day_keys(shard_of(conversation), today)]
        keys.append(k.month(today))
        args: list[str | int] = [
            prompt,
            completion,
            user,
            DAY_KEEP_MS,
            conversation,
            self.settings.retention_ms,
            MONTH_KEEP_MS,
            repr(cost),
        ]
        return int(await self._run(self._usage, keys, args))

    async def spending(self, conversation: str, user: str) -> Spending:
        """Tokens the conversation's user has spent today and this month (UTC), and the
        daily budget an admin set for them, in one round trip (all in the conversation's
        slot)."""
        k = Keys(conversation)
        today = _today()
        async with self._reaching(), self.redis.pipeline(transaction=False) as pipe:
            pipe.hget(k.day(today), "tokens")
            pipe.hget(k.month(today), "tokens")
            pipe.hget(k.access, user)
            day, month, record = await pipe.execute()
        budget = None if record is None else AccessRecord.from_json(user, record).budget
        return Spending(int(day or 0), int(month or 0), budget)

    async def change_access(
        self, user: str, change: Literal["access", "budget"], value: str, by: str
    ) -> AccessRecord:
        """An admin's change to a user's access or daily budget ("" clears it), seen by
        every replica once this returns: the user's record, then its copy in every shard.
        Raises `Unavailable` if any part failed; making the change again is harmless."""
        keys = [ACCESS_KEY, ACCESS_SEQ_KEY]
        raw, previous = await self._run_durable(self._access_set, keys, [user, change, value, by])
        record = AccessRecord.from_json(user, _text(raw))
        # A shard that held every change up to the one before holds every one up to this.
        args: list[str | int] = [record.seq, int(previous), record.user, _text(raw), record.seq]
        await self._in_every_shard(self._access_copy, lambda shard: ([access_key(shard)], args))
        return record

    async def spread_access(self) -> int:
        """Copy every user's access record into every shard again, where a shard lacks it
        or holds an older one (a copy is not waited for at the durability level, so a
        failover may lose one). Run at start-up; returns the records spread. The sweep mends
        a shard found behind `{lw:access}` the same way (`due`)."""
        return await self._spread_access(range(SHARDS))

    async def _spread_access(self, shards: Sequence[int]) -> int:
        """Copy every user's access record into these shards, where a shard lacks it or holds
        an older one: one round trip to read, one to copy. Returns the number of records."""
        async with self._reaching(), self.redis.pipeline(transaction=False) as pipe:
            # The seq first: every change it counts is then among the records read after it.
            pipe.get(ACCESS_SEQ_KEY)
            pipe.hgetall(ACCESS_KEY)
            latest, records = await pipe.execute()
        args: list[str | int] = [int(latest or 0), 0]
        for user, raw in records.items():
            args += [_text(user), _text(raw), AccessRecord.from_json(_text(user), raw).seq]
        await self._in_every_shard(
            self._access_copy, lambda shard: ([access_key(shard)], args), shards=shards
        )
        return len(records)

    async def today(self) -> DayTotals:
        """What every replica did today (UTC), summed over the shards: one round trip (on a
        cluster, one to each primary, all at once)."""
        day = _today()
        async with self._reaching(), self.redis.pipeline(transaction=False) as pipe:
            for shard in range(SHARDS):
                totals, ranking = usage_day_keys(shard, day)
                pipe.hgetall(totals)
                pipe.zcard(ranking)
            found: list[Any] = await pipe.execute()
        return DayTotals.summed(found[::2], found[1::2])

    async def transcripts(self, conversation: str, file_keys: Sequence[str]) -> list[str | None]:
        """The cached transcripts of these files of one conversation, None where there is
        none; one round trip (the keys share the conversation's slot)."""
        if not file_keys:
            return []
        keys = Keys(conversation)
        async with self._reaching():
            found = await self.redis.mget([keys.transcript(f) for f in file_keys])
        return [None if v is None else _text(v) for v in found]

    async def keep_transcript(self, conversation: str, file_key: str, text: str) -> None:
        """Cache a transcript, for the rest of the conversation's retention: a generation
        interrupted and started again, and later turns' history, read it instead of paying
        for it again."""
        async with self._reaching():
            await self.redis.set(
                Keys(conversation).transcript(file_key), text, px=self.settings.retention_ms
            )

    async def pick_model(self, conversation: str, name: str) -> None:
        """Remember the model the user picked with /model, for every replica."""
        async with self._reaching():
            await self.redis.hset(Keys(conversation).state, "model", name)

    async def versions(self, conversations: list[str]) -> list[int]:
        """V of each conversation, in one pipelined round trip (on a cluster, one per primary
        holding any of them, at once): for watching generations go stale."""
        async with self._reaching(), self.redis.pipeline(transaction=False) as pipe:
            for conversation in conversations:
                pipe.hget(Keys(conversation).state, "v")
            values: list[bytes | None] = await pipe.execute()
        return [int(v or 0) for v in values]

    async def counters(self, conversation: str) -> tuple[int, int]:
        """(V, W) of a conversation."""
        async with self._reaching():
            v, w = await self.redis.hmget(Keys(conversation).state, ["v", "w"])
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
                for shard in range(SHARDS):
                    pipe.zrangebyscore(active_key(shard), since, "+inf")
                shards: list[list[bytes]] = await pipe.execute()
            conversations = [c for s in shards for c in map(_text, s) if c.startswith(prefix)]
            async with self.redis.pipeline(transaction=False) as pipe:
                for conversation in conversations:
                    pipe.hget(Keys(conversation).state, "last")
                lasts: list[bytes | None] = await pipe.execute()
        return {c: _text(last) for c, last in zip(conversations, lasts, strict=True) if last}

    async def history(self, conversation: str) -> list[HistoryEntry]:
        async with self._reaching():
            raw = await self.redis.lrange(Keys(conversation).history, 0, -1)
        return [HistoryEntry.from_json(_text(h)) for h in raw]

    async def beat(
        self,
        replica_id: str,
        info: Mapping[str, str | int],
        ttl_ms: int,
        *,
        started_at_ms: int | None = None,
    ) -> int:
        """Write the replica's heartbeat hash and (re)arm its expiry of `ttl_ms`.

        The hash holds pid and host (of this process unless `info` says otherwise),
        `started_at` and `last_beat` (server clock, ms), and every field of `info`. Fields
        left out of `info` since the last beat are dropped, so the hash never shows stale
        numbers. `started_at_ms` keeps the replica's start time across a key that expired
        meanwhile; without it the recorded one is kept, or now for a new key. Returns the
        start time recorded, for the next beat.
        """
        fields: dict[str, str] = {"pid": str(os.getpid()), "host": socket.gethostname()}
        fields.update({k: str(v) for k, v in info.items() if k not in ("started_at", "last_beat")})
        args: list[str | int] = [ttl_ms, "" if started_at_ms is None else started_at_ms]
        for name, value in fields.items():
            args += [name, value]
        return int(await self._run(self._heartbeat, [heartbeat_key(replica_id)], args))

    async def remove_beat(self, replica_id: str) -> None:
        """Delete the replica's heartbeat, so it leaves the status at once."""
        async with self._reaching():
            await self.redis.delete(heartbeat_key(replica_id))

    async def close(self) -> None:
        await self.redis.aclose()
