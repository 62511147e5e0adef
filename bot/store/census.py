"""What `lastword status` shows, read from the store: the live replicas, the roles and leases
and who holds them, the replies held or waiting for the outbound budget, the 429s heard, the
oldest wake-up owed and the tokens spent today (`collect`). The one place status reads keys;
`bot.ops.status` renders what it finds.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, date, datetime
from typing import Any

from redis.asyncio.cluster import RedisCluster

from bot.store import AccessRecord, DayTotals, reaching_redis
from bot.store.connect import Client
from bot.store.keys import (
    ACCESS_KEY,
    HEARTBEAT_PATTERN,
    LAYOUT,
    ROLE_TAG,
    BudgetKeys,
    Keys,
    replica_of,
    role_key,
)
from bot.store.replies import as_text

# Keys looked at per SCAN call while searching for heartbeats.
SCAN_COUNT = 1000
# Conversations listed under the tokens spent today.
TOP_CONVERSATIONS = 10
# Fields the heartbeat script owns; the rest of the hash is the replica's own information.
_OWN_FIELDS = ("pid", "host", "platform", "started_at", "last_beat")
# Of that information, what status reads from its own source instead: the roles a replica
# holds are the role leases (the ROLES column, the roles section). Its heartbeat's list is
# written once a beat and said `-` beside a ROLES column naming the role it had just taken.
_READ_ELSEWHERE = ("roles",)


def holder_of(token: str) -> str | None:
    """The replica that holds a lease or role: tokens are `"<replica id>/<random hex>"`.
    None for a token that names none (the store is read as it is, whoever wrote it)."""
    holder, slash, _ = token.partition("/")
    return holder if slash else None


@dataclass(frozen=True)
class LeaseInfo:
    """A lease or role as stored: its token, the replica named in it, fence, and ms left."""

    token: str
    holder: str | None
    fence: int
    expires_in_ms: int


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


@dataclass(frozen=True)
class Role:
    """A held role (e.g. the Telegram poller, the Discord gateway)."""

    name: str
    lease: LeaseInfo


@dataclass(frozen=True)
class Waiting:
    """A conversation that owes a reply: V > W, or a reply left in its outbox."""

    conversation: str
    unanswered: int  # V - W
    waited_ms: int | None  # since the oldest unanswered message (its platform timestamp)
    next_look_ms: int  # until its due time; negative: overdue
    outbox: bool  # a reply passed the pre-send check and is being (or must be re-)sent
    lease: LeaseInfo | None


@dataclass(frozen=True)
class HeldLease:
    """A conversation lease: some replica is running a cycle for it."""

    conversation: str
    lease: LeaseInfo


@dataclass(frozen=True)
class Held:
    """A scope of a platform's outbound budget held after a 429: no replica sends under it."""

    platform: str
    scope: str
    ends_in_ms: int


@dataclass(frozen=True)
class Heard:
    """The 429s every replica of a platform heard about one kind of scope ("bot", "chat",
    ...), and the time their holds added up to: the budget's shared counters
    (budget_hold.lua), kept a day past the last 429."""

    platform: str
    kind: str
    count: int
    held_ms: int


@dataclass(frozen=True)
class Wakeup:
    """The earliest entry of the due-index over all shards."""

    conversation: str
    due_at_ms: int
    overdue_ms: int  # now - due_at; negative: not due yet


@dataclass(frozen=True)
class Spender:
    """A conversation and the tokens it spent on a day."""

    conversation: str
    tokens: int


@dataclass(frozen=True)
class TokensToday(DayTotals):
    """What every replica did on one UTC day, and the conversations that spent most tokens."""

    day: str = ""
    top: tuple[Spender, ...] = ()  # most first


def _json_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # JSON has no tuples, and a snapshot should equal its own JSON read back.
    return {name: list(value) if isinstance(value, tuple) else value for name, value in pairs}


def _json(part: Any) -> dict[str, Any]:
    return asdict(part, dict_factory=_json_object)


def _flat(held: Role | HeldLease) -> dict[str, Any]:
    """What holds a lease, and the lease's own fields, as one object."""
    data = _json(held)
    lease: dict[str, Any] = data.pop("lease")
    return data | lease


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
        tokens_today    {day, prompt, completion, generations, replies, interrupted, forced,
                         users, top: [{conversation, tokens}]}
        access          [{user, access, budget, by, at_ms, seq}]: what admins changed in
                        chat, by user
        held            [{platform, scope, ends_in_ms}]: scopes of the replicas' platforms'
                        shared outbound budget held after a 429, by platform and scope
        heard           [{platform, kind, count, held_ms}]: the 429s every replica of those
                        platforms heard (`count`) and the time their holds added up to
                        (`held_ms`: a 429 within a longer hold adds nothing), per kind of
                        scope ("bot", "chat", "group", ...), by platform and kind; kept a
                        day past the last 429

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
    access: tuple[AccessRecord, ...] = ()
    held: tuple[Held, ...] = ()
    heard: tuple[Heard, ...] = ()

    def to_json(self) -> dict[str, Any]:
        # By hand at this level only: roles and leases are flat, and the waiting ones are
        # "conversations" in the output.
        return {
            "now_ms": self.now_ms,
            "replicas": [_json(r) for r in self.replicas],
            "roles": [_flat(r) for r in self.roles],
            "conversations": [_json(w) for w in self.waiting],
            "leases": [_flat(held) for held in self.leases],
            "oldest_wakeup": None if self.oldest_wakeup is None else _json(self.oldest_wakeup),
            "tokens_today": None if self.tokens_today is None else _json(self.tokens_today),
            "access": [_json(record) for record in self.access],
            "held": [_json(h) for h in self.held],
            "heard": [_json(h) for h in self.heard],
        }


def _int(value: bytes | str | None) -> int | None:
    if value is None:
        return None
    try:
        return int(as_text(value))
    except ValueError:
        return None


def _lease(token: Any, fence: Any, pttl: int) -> LeaseInfo | None:
    # PTTL -2: gone between reads. A hash without a token is not a lease.
    if token is None or pttl == -2:
        return None
    text = as_text(token)
    return LeaseInfo(text, holder_of(text), _int(fence) or 0, pttl)


async def collect(
    redis: Client, *, now_ms: int | None = None, scan_count: int = SCAN_COUNT
) -> Status:
    """Read a snapshot of replicas, roles, waiting conversations, leases and wake-ups.

    Three pipelined round trips, whatever the number of conversations (the due-index and
    role names first, then every key they name, then each waiting conversation's oldest
    message), plus one per `scan_count` keys of the keyspace while looking for heartbeats.
    On a Redis Cluster each pipeline is split by node and sent to all at once, the heartbeats
    are looked for on every primary, and the clock is read in a call of its own.
    `now_ms` replaces the server's clock (tests). Raises `StoreUnavailable` when Redis
    cannot be reached.
    """
    with reaching_redis():
        return await _collect(redis, now_ms, scan_count)


@dataclass(frozen=True)
class _Indexes:
    """What the first round trip finds: the names of everything else to read."""

    now_ms: int  # server clock
    role_names: list[str]
    heartbeats: list[str]  # keys
    due: dict[str, int]  # conversation -> when to look at it next
    tokens_today: TokensToday
    access: list[AccessRecord]


@dataclass(frozen=True)
class _Owed:
    conversation: str
    version: int
    watermark: int
    outbox: bool
    lease: LeaseInfo | None


@dataclass(frozen=True)
class _Holders:
    """What the second round trip finds."""

    replicas: list[Replica]
    roles: list[Role]
    leases: list[HeldLease]
    owed: list[_Owed]


async def _collect(redis: Client, now_ms: int | None, scan_count: int) -> Status:
    # The replicas' clocks pick the day they count tokens under, so this one picks it too.
    day = (
        datetime.now(UTC) if now_ms is None else datetime.fromtimestamp(now_ms / 1000, UTC)
    ).date()
    indexes = await _read_indexes(redis, day, scan_count)
    now = indexes.now_ms if now_ms is None else now_ms
    holders = await _read_holders(redis, indexes, now)
    waiting = await _read_waiting(redis, holders.owed, indexes.due, now)
    wakeup = None
    if indexes.due:
        due = indexes.due
        first_due = min(due, key=lambda c: (due[c], c))
        wakeup = Wakeup(first_due, due[first_due], now - due[first_due])
    held, heard = await _read_budgets(redis, holders.replicas, now)
    return Status(
        now_ms=now,
        replicas=tuple(holders.replicas),
        roles=tuple(holders.roles),
        waiting=tuple(waiting),
        leases=tuple(holders.leases),
        oldest_wakeup=wakeup,
        tokens_today=indexes.tokens_today,
        access=tuple(indexes.access),
        held=tuple(held),
        heard=tuple(heard),
    )


async def _read_budgets(
    redis: Client, replicas: Sequence[Replica], now: int
) -> tuple[list[Held], list[Heard]]:
    """The held scopes and the 429 counters of the shared outbound budget of each platform a
    replica runs: one round trip per platform (each platform's budget lives in one slot)."""
    held, heard = [], []
    for platform in sorted({r.platform for r in replicas if r.platform}):
        keys = BudgetKeys(platform)
        async with redis.pipeline(transaction=False) as pipe:
            pipe.zrange(keys.holds, 0, -1, withscores=True)
            pipe.hgetall(keys.heard)
            found, counters = await pipe.execute()
        for scope, until in found:
            if until > now:
                held.append(Held(platform, as_text(scope), int(until) - now))
        heard += _counted(platform, counters)
    return held, heard


def _counted(platform: str, counters: Mapping[Any, Any]) -> list[Heard]:
    """The `heard` hash's fields, "<kind>:count" and "<kind>:held_ms", by kind."""
    fields = {as_text(name): _int(value) or 0 for name, value in counters.items()}
    kinds = sorted({name.rpartition(":")[0] for name in fields} - {""})
    return [
        Heard(platform, kind, fields.get(f"{kind}:count", 0), fields.get(f"{kind}:held_ms", 0))
        for kind in kinds
    ]


async def _read_indexes(redis: Client, day: date, scan_count: int) -> _Indexes:
    """The server's clock, the role names, the heartbeat keys, every shard's due-index and
    its tokens of `day`: one round trip, plus a SCAN call per further `scan_count` keys."""
    if isinstance(redis, RedisCluster):
        return await _read_cluster_indexes(redis, day, scan_count)
    async with redis.pipeline(transaction=False) as pipe:
        pipe.time()
        # The fence counters name every role ever taken: no scan needed for roles.
        pipe.hkeys(ROLE_TAG)
        pipe.scan(0, match=HEARTBEAT_PATTERN, count=scan_count)
        _read_shards(pipe, day)
        first: list[Any] = await pipe.execute()
    seconds, micros = first[0]
    cursor, found = first[2]
    heartbeats = {as_text(k) for k in found}
    while int(cursor) != 0:
        cursor, found = await redis.scan(cursor, match=HEARTBEAT_PATTERN, count=scan_count)
        heartbeats.update(as_text(k) for k in found)
    return _indexes(int(seconds) * 1000 + int(micros) // 1000, first[1], heartbeats, day, first[3:])


async def _read_cluster_indexes(redis: RedisCluster, day: date, scan_count: int) -> _Indexes:
    """`_read_indexes` on a cluster: the keyed reads in one pipeline, split by node and sent
    to all at once; the clock from one node; the heartbeats by a SCAN of every primary (the
    keyspace of a cluster is the union of theirs)."""
    async with redis.pipeline() as pipe:
        pipe.hkeys(ROLE_TAG)
        _read_shards(pipe, day)
        first: list[Any] = await pipe.execute()
    seconds, micros = await redis.time()
    heartbeats = {
        as_text(k) async for k in redis.scan_iter(match=HEARTBEAT_PATTERN, count=scan_count)
    }
    return _indexes(int(seconds) * 1000 + int(micros) // 1000, first[0], heartbeats, day, first[1:])


def _read_shards(pipe: Any, day: date) -> None:
    """Queue the reads of the access changed in chat, every shard's due-index, then its
    totals and ranking of `day`."""
    pipe.hgetall(ACCESS_KEY)
    for shard in range(LAYOUT.shards):
        pipe.zrange(LAYOUT.due_key(shard), 0, -1, withscores=True)
    for shard in range(LAYOUT.shards):
        totals, ranking = LAYOUT.usage_day_keys(shard, day)
        pipe.hgetall(totals)
        pipe.zrevrange(ranking, 0, TOP_CONVERSATIONS - 1, withscores=True)
        pipe.zcard(ranking)


def _indexes(
    now_ms: int, role_names: list[Any], heartbeats: set[str], day: date, shards: list[Any]
) -> _Indexes:
    """What `_read_shards` queued, read back, with the rest of the first round trip."""
    access, shards = shards[0], shards[1:]
    due: dict[str, int] = {}
    for shard in shards[: LAYOUT.shards]:
        for member, score in shard:
            due[as_text(member)] = int(score)
    return _Indexes(
        now_ms=now_ms,
        role_names=sorted(as_text(n) for n in role_names),
        heartbeats=sorted(heartbeats),
        due=due,
        tokens_today=_tokens_today(day.isoformat(), shards[LAYOUT.shards :]),
        access=sorted(
            (AccessRecord.from_json(as_text(user), raw) for user, raw in access.items()),
            key=lambda record: record.user,
        ),
    )


async def _read_holders(redis: Client, indexes: _Indexes, now: int) -> _Holders:
    """Every heartbeat, role lease and due conversation's counters and lease: one round trip."""
    conversations = sorted(indexes.due)
    async with redis.pipeline(transaction=False) as pipe:
        for key in indexes.heartbeats:
            pipe.hgetall(key)
            pipe.pttl(key)
        for name in indexes.role_names:
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
    for key in indexes.heartbeats:
        fields, pttl = details[at], details[at + 1]
        at += 2
        if fields and pttl != -2:
            replicas.append(_replica(key, fields, pttl, now))
    roles = []
    for name in indexes.role_names:
        (token, fence), pttl = details[at], details[at + 1]
        at += 2
        held = _lease(token, fence, pttl)
        if held is not None:
            roles.append(Role(name, held))
    owed = []
    leases = []
    for conversation in conversations:
        (v, w), (token, fence), pttl, outbox = details[at : at + 4]
        at += 4
        held = _lease(token, fence, pttl)
        if held is not None:
            leases.append(HeldLease(conversation, held))
        version, watermark = _int(v) or 0, _int(w) or 0
        if version > watermark or outbox:
            owed.append(_Owed(conversation, version, watermark, bool(outbox), held))
    return _Holders(replicas, roles, leases, owed)


async def _read_waiting(
    redis: Client, owed: list[_Owed], due: dict[str, int], now: int
) -> list[Waiting]:
    """The conversations that owe a reply, longest wait first, read from each one's oldest
    unanswered message: one round trip (none when nothing is owed)."""
    async with redis.pipeline(transaction=False) as pipe:
        for o in owed:
            pipe.hget(Keys(o.conversation).pending, str(o.watermark + 1))
        oldest: list[Any] = await pipe.execute() if owed else []
    waiting = [
        Waiting(
            o.conversation,
            unanswered=max(o.version - o.watermark, 0),
            waited_ms=_waited(message, now),
            next_look_ms=due[o.conversation] - now,
            outbox=o.outbox,
            lease=o.lease,
        )
        for o, message in zip(owed, oldest, strict=True)
    ]
    waiting.sort(key=lambda w: (w.waited_ms is None, -(w.waited_ms or 0), w.conversation))
    return waiting


def _tokens_today(day: str, per_shard: list[Any]) -> TokensToday:
    """Sum the shards' totals and merge their rankings (each the shard's top conversations,
    so the merged top is exact)."""
    ranked = [
        (as_text(member), int(score)) for ranking in per_shard[1::3] for member, score in ranking
    ]
    ranked.sort(key=lambda pair: (-pair[1], pair[0]))
    top = tuple(Spender(c, tokens) for c, tokens in ranked[:TOP_CONVERSATIONS])
    sums = DayTotals.summed(per_shard[::3], per_shard[2::3])
    return TokensToday(day=day, top=top, **asdict(sums))


def _replica(key: str, raw: Mapping[Any, Any], pttl: int, now: int) -> Replica:
    fields = {as_text(k): as_text(v) for k, v in raw.items()}
    last_beat = _int(fields.get("last_beat"))
    return Replica(
        id=replica_of(key),
        host=fields.get("host", ""),
        pid=_int(fields.get("pid")),
        platform=fields.get("platform", ""),
        started_at_ms=_int(fields.get("started_at")),
        last_beat_ms=last_beat,
        beat_age_ms=None if last_beat is None else now - last_beat,
        expires_in_ms=pttl,
        info={k: v for k, v in sorted(fields.items()) if k not in _OWN_FIELDS + _READ_ELSEWHERE},
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
