"""`lastword status`: what every replica and conversation is doing, read from Redis alone.

An operator running several replicas needs one view of the shared state: which replicas are
alive, who holds the platform's poller or gateway role, which conversations still owe a reply
and for how long they have waited, who holds their leases, and whether wake-ups are running
late. Everything here is read from Redis, so the view is the same whichever machine runs it,
and ages are measured on the server's clock (`TIME`), the one every deadline uses.

Replicas announce themselves with a heartbeat, a hash that expires on its own:

    {lw:replica}:<replica id>   hash   pid, host, platform, started_at (ms), last_beat (ms),
                                       plus whatever the replica adds (e.g. cycles, leases)

A crashed replica stops beating and its key expires, so "alive" means "beat within its TTL".
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError

from bot.cancel import cancel_and_wait
from bot.store import ROLE_TAG, SHARDS, Keys, reaching_redis, role_key, usage_day_keys

log = logging.getLogger(__name__)

# Its own hash tag: the heartbeats are not part of any conversation's slot.
HEARTBEAT_PREFIX = "{lw:replica}:"
# Long enough that a replica busy for a few seconds (or a Redis hiccup) does not vanish from
# the status, short enough that a dead one disappears while the operator still looks.
DEFAULT_HEARTBEAT_TTL_MS = 15_000
# Keys looked at per SCAN call while searching for heartbeats.
SCAN_COUNT = 1000
# Conversations listed under the tokens spent today.
TOP_CONVERSATIONS = 10
# Fields the heartbeat script owns; the rest of the hash is the replica's own information.
_OWN_FIELDS = ("pid", "host", "platform", "started_at", "last_beat")

# One step, on the server's clock: the beat time never comes from the replica's clock, and
# the start time survives the key expiring during an outage (the caller passes it back).
# KEYS: the heartbeat hash. ARGV: ttl ms, started_at ms ('' = keep the recorded one, or now),
# then field, value pairs. Returns started_at.
_BEAT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local started = ARGV[2]
if started == '' then
  started = redis.call('HGET', KEYS[1], 'started_at') or string.format('%d', now)
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'started_at', started, 'last_beat', string.format('%d', now),
  unpack(ARGV, 3))
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[1]))
return tonumber(started)
"""


def heartbeat_key(replica_id: str) -> str:
    return f"{HEARTBEAT_PREFIX}{replica_id}"


def holder_of(token: str) -> str | None:
    """The replica that holds a lease or role: tokens are `"<replica id>/<random hex>"`.
    None for a token without a replica id (written by an older version)."""
    holder, slash, _ = token.partition("/")
    return holder if slash else None


async def beat(
    redis: Redis,
    replica_id: str,
    info: Mapping[str, str | int],
    ttl_ms: int,
    *,
    started_at_ms: int | None = None,
) -> int:
    """Write the replica's heartbeat hash and (re)arm its expiry of `ttl_ms`.

    The hash holds pid and host (of this process unless `info` says otherwise), `started_at`
    and `last_beat` (server clock, ms), and every field of `info`. Fields left out of `info`
    since the last beat are dropped, so the hash never shows stale numbers. `started_at_ms`
    keeps the replica's start time across a key that expired meanwhile; without it the
    recorded one is kept, or now for a new key. Returns the start time recorded, for the
    next beat. Raises Redis errors: the caller decides whether to retry.
    """
    fields: dict[str, str] = {"pid": str(os.getpid()), "host": socket.gethostname()}
    fields.update({k: str(v) for k, v in info.items() if k not in ("started_at", "last_beat")})
    args: list[str | int] = [ttl_ms, "" if started_at_ms is None else started_at_ms]
    for name, value in fields.items():
        args += [name, value]
    script = redis.register_script(_BEAT)  # reloads itself on NOSCRIPT
    return int(await script(keys=[heartbeat_key(replica_id)], args=args))


class Heartbeat:
    """Keeps a replica's heartbeat alive: `beat` every TTL/3 from `start()` until `stop()`.

    Redis errors never escape: the first failure of an outage is logged as a warning (not
    every retry, so an outage does not flood the journal), the beat is retried at the next
    tick, and the recovery is logged once. `stop()` deletes the key (best effort), so a
    replica that shuts down cleanly leaves the status at once; a crashed one expires.
    `info` is called at every beat, so it can report live numbers (cycles running, leases).
    """

    def __init__(
        self,
        redis: Redis,
        replica_id: str,
        ttl_ms: int = DEFAULT_HEARTBEAT_TTL_MS,
        *,
        platform: str = "",
        info: Callable[[], Mapping[str, str | int]] | None = None,
    ) -> None:
        self.redis = redis
        self.replica_id = replica_id
        self.key = heartbeat_key(replica_id)
        self.ttl_ms = ttl_ms
        self.interval_s = ttl_ms / 3000
        self.platform = platform
        self.info = info
        self.beats = 0  # successful beats, for tests and diagnostics
        self.failures = 0  # failed beats, likewise
        self.started_at_ms: int | None = None
        self._down = False
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self.run(), name=f"heartbeat {self.replica_id}")

    async def stop(self) -> None:
        """Stop beating and delete the key, waiting at most one beat interval for Redis."""
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None
        try:
            async with asyncio.timeout(max(self.interval_s, 0.5)):
                await self.redis.delete(self.key)
        except (RedisError, OSError, TimeoutError) as exc:
            log.warning("could not remove heartbeat %s (it will expire): %s", self.key, exc)

    async def run(self) -> None:
        """Beat until cancelled. Never raises anything but the cancellation."""
        while True:
            await self._beat_once()
            await asyncio.sleep(self.interval_s)

    def _fields(self) -> dict[str, str | int]:
        fields: dict[str, str | int] = {"platform": self.platform} if self.platform else {}
        if self.info is not None:
            try:
                fields.update(self.info())
            except Exception:
                # A bug in the caller's numbers must not make a live replica look dead.
                log.exception("heartbeat info failed; beating without it")
        return fields

    async def _beat_once(self) -> None:
        try:
            # Bounded: a beat stuck longer than the interval is late anyway; try afresh.
            async with asyncio.timeout(self.interval_s):
                self.started_at_ms = await beat(
                    self.redis,
                    self.replica_id,
                    self._fields(),
                    self.ttl_ms,
                    started_at_ms=self.started_at_ms,
                )
        except (RedisError, OSError, TimeoutError) as exc:
            self.failures += 1
            if not self._down:
                self._down = True
                log.warning("heartbeat %s failed, retrying: %r", self.key, exc)
            return
        self.beats += 1
        if self._down:
            self._down = False
            log.info("heartbeat %s restored", self.key)


@dataclass(frozen=True)
class LeaseInfo:
    """A lease or role as stored: its token, the replica named in it, fence, and ms left."""

    token: str
    holder: str | None
    fence: int
    expires_in_ms: int

    def to_json(self) -> dict[str, Any]:
        return {
            "token": self.token,
            "holder": self.holder,
            "fence": self.fence,
            "expires_in_ms": self.expires_in_ms,
        }


@dataclass(frozen=True)
class Replica:
    """A replica whose heartbeat has not expired."""

    id: str
    host: str
    pid: int | None
    platform: str
    started_at_ms: int | None
    last_beat_ms: int | None
    beat_age_ms: int | None  # how long ago it beat, server clock
    expires_in_ms: int  # until its heartbeat expires unless it beats again
    info: dict[str, str] = field(default_factory=dict)  # the replica's own fields

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "host": self.host,
            "pid": self.pid,
            "platform": self.platform,
            "started_at_ms": self.started_at_ms,
            "last_beat_ms": self.last_beat_ms,
            "beat_age_ms": self.beat_age_ms,
            "expires_in_ms": self.expires_in_ms,
            "info": dict(self.info),
        }


@dataclass(frozen=True)
class Role:
    """A held role (e.g. the Telegram poller, the Discord gateway)."""

    name: str
    lease: LeaseInfo

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, **self.lease.to_json()}


@dataclass(frozen=True)
class Waiting:
    """A conversation that owes a reply: V > W, or a reply left in its outbox."""

    conversation: str
    unanswered: int  # V - W
    waited_ms: int | None  # since the oldest unanswered message (its platform timestamp)
    next_look_ms: int  # until its due time; negative: overdue
    outbox: bool  # a reply passed the pre-send check and is being (or must be re-)sent
    lease: LeaseInfo | None

    def to_json(self) -> dict[str, Any]:
        return {
            "conversation": self.conversation,
            "unanswered": self.unanswered,
            "waited_ms": self.waited_ms,
            "next_look_ms": self.next_look_ms,
            "outbox": self.outbox,
            "lease": None if self.lease is None else self.lease.to_json(),
        }


@dataclass(frozen=True)
class HeldLease:
    """A conversation lease: some replica is running a cycle for it."""

    conversation: str
    lease: LeaseInfo

    def to_json(self) -> dict[str, Any]:
        return {"conversation": self.conversation, **self.lease.to_json()}


@dataclass(frozen=True)
class Wakeup:
    """The earliest entry of the due-index over all shards."""

    conversation: str
    due_at_ms: int
    overdue_ms: int  # now - due_at; negative: not due yet

    def to_json(self) -> dict[str, Any]:
        return {
            "conversation": self.conversation,
            "due_at_ms": self.due_at_ms,
            "overdue_ms": self.overdue_ms,
        }


@dataclass(frozen=True)
class TokensToday:
    """Tokens spent on one UTC day, by every replica, and the conversations that spent most."""

    day: str
    prompt: int = 0
    completion: int = 0
    generations: int = 0
    top: tuple[tuple[str, int], ...] = ()  # (conversation, tokens), most first

    def to_json(self) -> dict[str, Any]:
        return {
            "day": self.day,
            "prompt": self.prompt,
            "completion": self.completion,
            "generations": self.generations,
            "top": [{"conversation": c, "tokens": t} for c, t in self.top],
        }


@dataclass(frozen=True)
class Status:
    """One snapshot of the shared state. `to_json()` gives, with stable keys:

        now_ms          server time of the snapshot (ms since the epoch)
        replicas        [{id, host, pid, platform, started_at_ms, last_beat_ms, beat_age_ms,
                          expires_in_ms, info: {field: text}}], by id
        roles           [{name, token, holder, fence, expires_in_ms}], by name
        conversations   [{conversation, unanswered, waited_ms, next_look_ms, outbox,
                          lease: {token, holder, fence, expires_in_ms} | null}],
                        longest wait first
        leases          [{conversation, token, holder, fence, expires_in_ms}], by conversation
        oldest_wakeup   {conversation, due_at_ms, overdue_ms} | null
        tokens_today    {day, prompt, completion, generations, top: [{conversation, tokens}]}

    Times are ms; `holder` is the replica id from the token, null if the token has none;
    `waited_ms` is null when the oldest message cannot be read. The parts are read in a few
    pipelined round trips, not atomically: a cycle that ends meanwhile may show half-done.
    """

    now_ms: int
    replicas: tuple[Replica, ...] = ()
    roles: tuple[Role, ...] = ()
    waiting: tuple[Waiting, ...] = ()
    leases: tuple[HeldLease, ...] = ()
    oldest_wakeup: Wakeup | None = None
    tokens_today: TokensToday | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "now_ms": self.now_ms,
            "replicas": [r.to_json() for r in self.replicas],
            "roles": [r.to_json() for r in self.roles],
            "conversations": [w.to_json() for w in self.waiting],
            "leases": [lease.to_json() for lease in self.leases],
            "oldest_wakeup": None if self.oldest_wakeup is None else self.oldest_wakeup.to_json(),
            "tokens_today": None if self.tokens_today is None else self.tokens_today.to_json(),
        }


def _text(value: bytes | str) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def _int(value: bytes | str | None) -> int | None:
    if value is None:
        return None
    try:
        return int(_text(value))
    except ValueError:
        return None


def _lease(token: Any, fence: Any, pttl: int) -> LeaseInfo | None:
    # PTTL -2: gone between reads. A hash without a token is not a lease.
    if token is None or pttl == -2:
        return None
    text = _text(token)
    return LeaseInfo(text, holder_of(text), _int(fence) or 0, pttl)


async def collect(
    redis: Redis, *, now_ms: int | None = None, scan_count: int = SCAN_COUNT
) -> Status:
    """Read a snapshot of replicas, roles, waiting conversations, leases and wake-ups.

    Three pipelined round trips, whatever the number of conversations (the due-index and
    role names first, then every key they name, then each waiting conversation's oldest
    message), plus one per `scan_count` keys of the keyspace while looking for heartbeats.
    `now_ms` replaces the server's clock (tests). Raises `StoreUnavailable` when Redis
    cannot be reached.
    """
    with reaching_redis():
        return await _collect(redis, now_ms, scan_count)


async def _collect(redis: Redis, now_ms: int | None, scan_count: int) -> Status:
    pattern = f"{HEARTBEAT_PREFIX}*"
    # The replicas' clocks pick the day they count tokens under, so this one picks it too.
    day = (
        datetime.now(UTC) if now_ms is None else datetime.fromtimestamp(now_ms / 1000, UTC)
    ).date()
    async with redis.pipeline(transaction=False) as pipe:
        pipe.time()
        # The fence counters name every role ever taken: no scan needed for roles.
        pipe.hkeys(ROLE_TAG)
        pipe.scan(0, match=pattern, count=scan_count)
        for shard in range(SHARDS):
            pipe.zrange(f"{{lw:{shard}}}:due", 0, -1, withscores=True)
        for shard in range(SHARDS):
            totals, ranking = usage_day_keys(shard, day)
            pipe.hgetall(totals)
            pipe.zrevrange(ranking, 0, TOP_CONVERSATIONS - 1, withscores=True)
        first: list[Any] = await pipe.execute()
    seconds, micros = first[0]
    now = int(seconds) * 1000 + int(micros) // 1000 if now_ms is None else now_ms
    role_names = sorted(_text(n) for n in first[1])
    cursor, found = first[2]
    beat_keys = {_text(k) for k in found}
    while int(cursor) != 0:
        cursor, found = await redis.scan(cursor, match=pattern, count=scan_count)
        beat_keys.update(_text(k) for k in found)
    due: dict[str, int] = {}
    for shard in first[3 : 3 + SHARDS]:
        for member, score in shard:
            due[_text(member)] = int(score)
    tokens_today = _tokens_today(day.isoformat(), first[3 + SHARDS :])
    replica_keys = sorted(beat_keys)
    conversations = sorted(due)

    async with redis.pipeline(transaction=False) as pipe:
        for key in replica_keys:
            pipe.hgetall(key)
            pipe.pttl(key)
        for name in role_names:
            pipe.hmget(role_key(name), ["token", "fence"])
            pipe.pttl(role_key(name))
        for conversation in conversations:
            k = Keys(conversation)
            pipe.hmget(k.state, ["v", "w"])
            pipe.hmget(k.lease, ["token", "fence"])
            pipe.pttl(k.lease)
            pipe.exists(k.outbox)
        details: list[Any] = await pipe.execute()
    at = 0
    replicas = []
    for key in replica_keys:
        fields, pttl = details[at], details[at + 1]
        at += 2
        if fields and pttl != -2:
            replicas.append(_replica(key, fields, pttl, now))
    roles = []
    for name in role_names:
        (token, fence), pttl = details[at], details[at + 1]
        at += 2
        held = _lease(token, fence, pttl)
        if held is not None:
            roles.append(Role(name, held))
    owed: list[tuple[str, int, int, bool, LeaseInfo | None]] = []
    leases = []
    for conversation in conversations:
        (v, w), (token, fence), pttl, outbox = details[at : at + 4]
        at += 4
        held = _lease(token, fence, pttl)
        if held is not None:
            leases.append(HeldLease(conversation, held))
        version, watermark = _int(v) or 0, _int(w) or 0
        if version > watermark or outbox:
            owed.append((conversation, version, watermark, bool(outbox), held))

    async with redis.pipeline(transaction=False) as pipe:
        for conversation, _, watermark, _, _ in owed:
            pipe.hget(Keys(conversation).pending, str(watermark + 1))
        oldest: list[Any] = await pipe.execute() if owed else []
    waiting = [
        Waiting(
            conversation,
            unanswered=max(version - watermark, 0),
            waited_ms=_waited(message, now),
            next_look_ms=due[conversation] - now,
            outbox=outbox,
            lease=held,
        )
        for (conversation, version, watermark, outbox, held), message in zip(
            owed, oldest, strict=True
        )
    ]
    waiting.sort(key=lambda w: (w.waited_ms is None, -(w.waited_ms or 0), w.conversation))

    wakeup = None
    if due:
        first_due = min(due, key=lambda c: (due[c], c))
        wakeup = Wakeup(first_due, due[first_due], now - due[first_due])
    return Status(
        now_ms=now,
        replicas=tuple(replicas),
        roles=tuple(roles),
        waiting=tuple(waiting),
        leases=tuple(leases),
        oldest_wakeup=wakeup,
        tokens_today=tokens_today,
    )


def _tokens_today(day: str, per_shard: list[Any]) -> TokensToday:
    """Sum the shards' totals and merge their rankings (each the shard's top conversations,
    so the merged top is exact)."""
    sums = {"prompt": 0, "completion": 0, "generations": 0}
    ranked: list[tuple[str, int]] = []
    for totals, ranking in zip(per_shard[::2], per_shard[1::2], strict=True):
        fields = {_text(k): _int(v) or 0 for k, v in totals.items()}
        for name in sums:
            sums[name] += fields.get(name, 0)
        ranked += [(_text(member), int(score)) for member, score in ranking]
    ranked.sort(key=lambda pair: (-pair[1], pair[0]))
    return TokensToday(day, top=tuple(ranked[:TOP_CONVERSATIONS]), **sums)


def _replica(key: str, raw: Mapping[Any, Any], pttl: int, now: int) -> Replica:
    fields = {_text(k): _text(v) for k, v in raw.items()}
    last_beat = _int(fields.get("last_beat"))
    return Replica(
        id=key.removeprefix(HEARTBEAT_PREFIX),
        host=fields.get("host", ""),
        pid=_int(fields.get("pid")),
        platform=fields.get("platform", ""),
        started_at_ms=_int(fields.get("started_at")),
        last_beat_ms=last_beat,
        beat_age_ms=None if last_beat is None else now - last_beat,
        expires_in_ms=pttl,
        info={k: v for k, v in sorted(fields.items()) if k not in _OWN_FIELDS},
    )


def _waited(message: bytes | str | None, now: int) -> int | None:
    """Ms since the message's timestamp (seconds, from its InboundMessage JSON)."""
    if message is None:
        return None
    try:
        timestamp = float(json.loads(message)["timestamp"])
    except (ValueError, KeyError, TypeError):
        return None
    return now - round(timestamp * 1000)


def duration(ms: int | None) -> str:
    """A short human duration: 850ms, 12.3s, 4m05s, 2h03m, 3d04h; "-" for unknown."""
    if ms is None:
        return "-"
    sign, ms = ("-", -ms) if ms < 0 else ("", ms)
    if ms < 1000:
        text = f"{ms}ms"
    elif ms < 60_000:
        text = f"{ms / 1000:.1f}s"
    elif ms < 3600_000:
        text = f"{ms // 60_000}m{ms // 1000 % 60:02d}s"
    elif ms < 86_400_000:
        text = f"{ms // 3600_000}h{ms // 60_000 % 60:02d}m"
    else:
        text = f"{ms // 86_400_000}d{ms // 3600_000 % 24:02d}h"
    return sign + text


def _relative(ms: int) -> str:
    """A time relative to now, `ms` ahead of it (negative: in the past)."""
    return f"in {duration(ms)}" if ms >= 0 else f"overdue {duration(-ms)}"


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Columns left-aligned to their widest cell, two spaces apart, like kubectl's."""
    widths = [max(len(row[i]) for row in [headers, *rows]) for i in range(len(headers))]
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in [headers, *rows]
    ]


def _holder(lease: LeaseInfo | None) -> str:
    if lease is None:
        return "none"
    return lease.holder if lease.holder is not None else f"? ({lease.token[:8]})"


def _section(title: str, headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """A titled table, indented, after a blank line; "none" when it has no rows."""
    body = ["  " + line for line in _table(headers, rows)] if rows else ["  none"]
    return ["", title, *body]


def render(status: Status) -> str:
    """The snapshot as text for a terminal: one aligned table per section, "none" if empty."""
    when = datetime.fromtimestamp(status.now_ms / 1000, UTC).isoformat(timespec="seconds")
    lines = [f"lastword status at {when.replace('+00:00', 'Z')} (server clock)"]

    rows = []
    for r in status.replicas:
        leases = sum(1 for held in status.leases if held.lease.holder == r.id)
        roles = ",".join(role.name for role in status.roles if role.lease.holder == r.id)
        up = None if r.started_at_ms is None else status.now_ms - r.started_at_ms
        rows.append(
            [
                r.id,
                r.host or "-",
                "-" if r.pid is None else str(r.pid),
                r.platform or "-",
                duration(up),
                f"{duration(r.beat_age_ms)} ago",
                str(leases),
                roles or "-",
                " ".join(f"{k}={v}" for k, v in r.info.items()) or "-",
            ]
        )
    headers = ["ID", "HOST", "PID", "PLATFORM", "UP", "LAST BEAT", "LEASES", "ROLES", "INFO"]
    lines += _section(f"replicas ({len(status.replicas)})", headers, rows)

    rows = [
        [role.name, _holder(role.lease), str(role.lease.fence), duration(role.lease.expires_in_ms)]
        for role in status.roles
    ]
    headers = ["NAME", "HOLDER", "FENCE", "EXPIRES IN"]
    lines += _section(f"roles ({len(status.roles)})", headers, rows)

    rows = [
        [
            w.conversation,
            str(w.unanswered),
            duration(w.waited_ms),
            _relative(w.next_look_ms),
            _holder(w.lease),
            "yes" if w.outbox else "no",
        ]
        for w in status.waiting
    ]
    headers = ["CONVERSATION", "UNANSWERED", "WAITED", "NEXT LOOK", "LEASE", "OUTBOX"]
    lines += _section(f"conversations waiting ({len(status.waiting)})", headers, rows)

    rows = [
        [
            held.conversation,
            _holder(held.lease),
            str(held.lease.fence),
            duration(held.lease.expires_in_ms),
        ]
        for held in status.leases
    ]
    headers = ["CONVERSATION", "HOLDER", "FENCE", "EXPIRES IN"]
    lines += _section(f"leases held ({len(status.leases)})", headers, rows)

    wakeup = status.oldest_wakeup
    rows = [] if wakeup is None else [[wakeup.conversation, _relative(-wakeup.overdue_ms)]]
    lines += _section("oldest wake-up", ["CONVERSATION", "DUE"], rows)

    tokens = status.tokens_today
    if tokens is not None:
        title = (
            f"tokens today ({tokens.day}, UTC): {tokens.prompt:,} prompt + "
            f"{tokens.completion:,} completion in {tokens.generations:,} generations"
        )
        rows = [[conversation, f"{spent:,}"] for conversation, spent in tokens.top]
        # No "none" under it: the totals line says as much.
        lines += _section(title, ["CONVERSATION", "TOKENS"], rows) if rows else ["", title]
    return "\n".join(lines) + "\n"
