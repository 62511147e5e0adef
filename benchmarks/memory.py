"""Redis memory per conversation: right after it went idle, and after the retention passed.

    python -m benchmarks.memory [--conversations 1000] [--big 10] [--retention-s 2]

Three cases, each on a fresh embedded server, driven through the real store API
(`Store.ingest`, `acquire`, `add_usage`, `presend`, `commit`: what a runtime's cycle does,
without the runtime's timers):

- (a) idle: `--turns` (20) turns, each a user message answered by one reply;
- (b) pending: a burst of `--burst` (4) messages ingested and not answered yet;
- (c) big: an idle conversation that saw `--big-messages` (1,200) short messages, answered a
  burst of `--burst` at a time. The issue measured ~117 kB kept for ever for it before
  retention (64 kB of dedupe ids, 53 kB of history).

Each case is measured twice: right after its last write, and once `--retention-s` has passed
since then (every conversation key should have expired by then: ~0 bytes per conversation).
Two independent measures each time:

- `MEMORY USAGE key SAMPLES 0` of every key of the case's conversations, found by a SCAN with a
  MATCH on their names and split by key kind (state, pending, seen, history, ...), with the
  keys' TTLs, to show the lifetime was set; plus the shared per-shard keys the conversations
  add to (due-index, activity index, usage of the day), divided among them;
- `INFO memory` used_memory of the server against the fresh server's, divided by the number
  of conversations: everything, including the main dictionary's entries and the TTL table,
  which MEMORY USAGE leaves out.

The load writes the conversations turn by turn, all of them per round, so that none goes
idle for longer than a round while the others load: with a retention of seconds, a
conversation written only at the start of the load would expire before the end of it. The
benchmark checks that and says so if a round took longer than the retention. Nothing is
asserted: it reports what it finds, keys without a TTL included ("none").

Before the baseline, each case makes a dry run on a throw-away conversation (and FLUSHALL):
Redis 7 allocates a latency histogram (25-50 kB) for each command the first time it runs, and
that would otherwise count as conversations.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from redis.asyncio import Redis

from benchmarks.command_line import timed_run
from benchmarks.wakeup import print_table, temporary_server
from bot.config.settings import (
    AccessSettings,
    DebounceSettings,
    InstalledSettings,
    LLMSettings,
    Settings,
)
from bot.message import InboundMessage
from bot.ops.doctor import store_scripts
from bot.service.app import make_store
from bot.store import SEEN_CAP, SEEN_KEEP_MS, Keys, PreSend, Store
from bot.store.connect import make_client
from bot.store.embedded import EmbeddedRedis

# A conversation's own key: its shard's tag, "c", the conversation (which has a ":" itself),
# and the kind; a day's usage key has the day after its kind.
CONVERSATION_KEY = re.compile(
    r"^\{lw:[\d.]+\}:c:(?P<conversation>.+?):(?P<kind>day|[a-z]+)(:[-\d]+)?$"
)
PLATFORM = "telegram"
# Telegram-like ids: a chat id of ten digits, message ids counting up.
FIRST_CHAT = 5_000_000_000
WARM_CHAT = 4_000_000_000
# What is said. A turn: a one-line question and a short paragraph back; the 1,200-message
# case: the issue's "short messages", a few words each.
QUESTION = "could you remind me what we decided about the trip on {n}?"
REPLY = (
    "Sure. You settled on the train rather than driving, leaving on Friday morning and "
    "coming back on Sunday evening; Sam books the tickets and you book the flat near the "
    "station. The only open point was whether to add a day in the mountains. (turn {n})"
)
SHORT = "ok {n} sounds good"
# Tokens counted per reply, as the LLM would report them; they only change numbers in a hash.
PROMPT_TOKENS, COMPLETION_TOKENS = 600, 80
# After the retention, how long active expiry gets to settle before we measure anyway.
SETTLE_TIMEOUT_S = 10.0
# The figures the issue measured for case (c) before retention.
ISSUE_BIG_BYTES = 117_000


def settings_for(server: EmbeddedRedis, retention_s: float) -> Settings:
    return InstalledSettings(
        platform="console",
        redis_url=server.url,
        data_dir=server.data_dir,
        # Windows close at once: a cycle can follow its ingest without waiting.
        debounce=DebounceSettings(quiet_ms=0, max_wait_ms=0),
        # The bursts below are far above a person's pace; the limit's key lives 60 s anyway.
        access=AccessSettings(rate_per_minute=0),
        llm=LLMSettings(provider="echo"),
        retention_days=retention_s / 86_400,
        log_level="WARNING",
    )


def inbound(chat: int, n: int, text: str) -> InboundMessage:
    return InboundMessage(PLATFORM, str(chat), str(chat), str(n), text, display_name="Alex")


async def cycle(store: Store, chat: int, reply: str) -> None:
    """One whole cycle at the store level: acquire, count usage, pre-send check, commit."""
    conversation = f"{PLATFORM}:{chat}"
    while True:
        grant = await store.acquire(conversation, f"bench/{chat}")
        if grant.status == "acquired":
            break
        # The window closes at its deadline on the server's clock: at most a millisecond.
        if grant.status != "early" or grant.look_in_ms is None:
            raise RuntimeError(f"{conversation}: acquire answered {grant.status}")
        await asyncio.sleep(max(grant.look_in_ms, 1) / 1000)
    assert grant.lease is not None
    await store.add_usage(conversation, str(chat), PROMPT_TOKENS, COMPLETION_TOKENS)
    verdict = await store.presend(grant.lease, grant.version, reply)
    if verdict != PreSend("ok"):
        raise RuntimeError(f"{conversation}: pre-send check answered {verdict}")
    if not (await store.commit(grant.lease)).ok:
        raise RuntimeError(f"{conversation}: commit refused")


@dataclass(frozen=True)
class Case:
    label: str
    title: str
    conversations: int
    rounds: int
    # One round's writes for one conversation: (store, chat, round).
    step: Callable[[Store, int, int], Awaitable[None]]
    messages: int  # per conversation, for the header


def cases(args: argparse.Namespace) -> list[Case]:
    turns, burst = args.turns, args.burst

    async def turn(store: Store, chat: int, n: int) -> None:
        await store.ingest(inbound(chat, n + 1, QUESTION.format(n=n + 1)))
        await cycle(store, chat, REPLY.format(n=n + 1))

    async def pending(store: Store, chat: int, n: int) -> None:
        for m in range(burst):
            await store.ingest(inbound(chat, m + 1, SHORT.format(n=m + 1)))

    async def answered_burst(store: Store, chat: int, n: int) -> None:
        for m in range(n * burst + 1, (n + 1) * burst + 1):
            await store.ingest(inbound(chat, m, SHORT.format(n=m)))
        await cycle(store, chat, REPLY.format(n=n + 1))

    return [
        Case(
            "a",
            f"(a) idle after {turns} turns (a message, a reply)",
            args.conversations,
            turns,
            turn,
            turns,
        ),
        Case(
            "b",
            f"(b) a pending burst of {burst} messages, not answered yet",
            args.conversations,
            1,
            pending,
            burst,
        ),
        Case(
            "c",
            f"(c) idle after {args.big_messages} short messages, answered {burst} at a time",
            args.big,
            args.big_messages // burst,
            answered_burst,
            args.big_messages // burst * burst,
        ),
    ]


@dataclass
class Kind:
    keys: int = 0
    bytes: int = 0
    ttls: list[int] = field(default_factory=list)  # ms left; -1: no TTL


@dataclass
class Snapshot:
    used_memory: int  # over the fresh server's
    kinds: dict[str, Kind]  # per key kind, over every conversation of the case
    shared_keys: int
    shared_bytes: int
    conversations_with_keys: int  # a key other than `day`
    conversations_with_state: int
    expired_keys: int  # INFO stats, since the server started


async def used_memory(admin: Redis) -> int:
    info = await admin.info("memory")
    return int(info["used_memory"])


async def snapshot(admin: Redis, url: str, baseline: int) -> Snapshot:
    # used_memory first: the SCAN below reclaims expired keys it passes (lazy expiry), and the
    # figure should show what active expiry alone left.
    used = await used_memory(admin) - baseline
    expired = int((await admin.info("stats"))["expired_keys"])
    # The heavy reading on a connection of its own, closed afterwards: the server keeps a
    # connection's grown query and reply buffers (thousands of MEMORY USAGE in a pipeline)
    # for a while, and they would count as conversations in the next used_memory.
    reader = Redis.from_url(url)
    try:
        return await _snapshot(reader, used, expired)
    finally:
        await reader.aclose()


async def _snapshot(admin: Redis, used: int, expired: int) -> Snapshot:
    own: list[str] = []
    shared: list[str] = []
    async for raw in admin.scan_iter(match=f"*:c:{PLATFORM}:*", count=1000):
        own.append(raw.decode())
    async for raw in admin.scan_iter(count=1000):
        key = raw.decode()
        if ":c:" not in key:
            shared.append(key)
    sizes, ttls = await sizes_and_ttls(admin, own + shared)
    kinds: dict[str, Kind] = {}
    with_keys: set[str] = set()
    with_state: set[str] = set()
    for key in own:
        match = CONVERSATION_KEY.match(key)
        if match is None:
            raise RuntimeError(f"a key of unknown form: {key}")
        if key not in sizes:  # expired between the SCAN and the read
            continue
        kind = kinds.setdefault(match["kind"], Kind())
        kind.keys += 1
        kind.bytes += sizes[key]
        kind.ttls.append(ttls[key])
        # `day` keeps two days whatever the retention (usage of a UTC day, by design).
        if match["kind"] != "day":
            with_keys.add(match["conversation"])
        if match["kind"] == "state":
            with_state.add(match["conversation"])
    return Snapshot(
        used_memory=used,
        kinds=kinds,
        shared_keys=sum(1 for key in shared if key in sizes),
        shared_bytes=sum(sizes.get(key, 0) for key in shared),
        conversations_with_keys=len(with_keys),
        conversations_with_state=len(with_state),
        expired_keys=expired,
    )


async def sizes_and_ttls(admin: Redis, keys: list[str]) -> tuple[dict[str, int], dict[str, int]]:
    """MEMORY USAGE (every element counted, not a sample) and PTTL of each key that still
    exists, pipelined."""
    sizes: dict[str, int] = {}
    ttls: dict[str, int] = {}
    for start in range(0, len(keys), 1000):
        batch = keys[start : start + 1000]
        async with admin.pipeline(transaction=False) as pipe:
            for key in batch:
                pipe.memory_usage(key, samples=0)
                pipe.pttl(key)
            replies = await pipe.execute()
        for n, key in enumerate(batch):
            size, ttl = replies[2 * n], replies[2 * n + 1]
            if size is not None and ttl != -2:
                sizes[key] = int(size)
                ttls[key] = int(ttl)
    return sizes, ttls


async def wait_for_expiry(admin: Redis, since: float, retention_s: float) -> float:
    """Wait until `retention_s` has passed since `since` (monotonic), then until active expiry
    has settled: the key count unchanged for a few polls. Touches no key. Returns how long
    it waited in all."""
    started = time.monotonic()
    await asyncio.sleep(max(since + retention_s - started, 0) + 0.1)
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    last, unchanged = -1, 0
    while unchanged < 3 and time.monotonic() < deadline:
        count = int(await admin.dbsize())
        unchanged = unchanged + 1 if count == last else 0
        last = count
        await asyncio.sleep(0.2)
    return time.monotonic() - started


@dataclass(frozen=True)
class Sample:
    key: str
    kind: str
    type: str
    encoding: str
    entries: int
    bytes: int
    ttl_ms: int


async def sample_conversation(url: str, conversation: str) -> list[Sample]:
    """Every key of one conversation, found by a SCAN with a MATCH on its name."""
    admin = Redis.from_url(url)
    try:
        return await _sample(admin, conversation)
    finally:
        await admin.aclose()


async def _sample(admin: Redis, conversation: str) -> list[Sample]:
    prefix = Keys(conversation).base
    found: list[Sample] = []
    async for raw in admin.scan_iter(match=f"{prefix}:*", count=1000):
        key = raw.decode()
        kind_type = _text(await admin.type(key))
        encoding = (await admin.object("encoding", key)) or b"?"
        counts = {
            "hash": admin.hlen,
            "zset": admin.zcard,
            "list": admin.llen,
            "string": admin.strlen,
        }
        entries = int(await counts[kind_type](key)) if kind_type in counts else 0
        size = await admin.memory_usage(key, samples=0)
        ttl = int(await admin.pttl(key))
        match = CONVERSATION_KEY.match(key)
        kind = match["kind"] if match else "?"
        found.append(Sample(key, kind, kind_type, _text(encoding), entries, int(size or 0), ttl))
    return sorted(found, key=lambda s: -s.bytes)


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass
class Result:
    case: Case
    load_s: float
    slowest_round_s: float
    idle: Snapshot
    after: Snapshot
    waited_s: float
    sample: list[Sample]
    server: str  # name and version


async def run_case(case: Case, args: argparse.Namespace) -> Result:
    async with temporary_server() as server:
        admin = Redis.from_url(server.url)
        try:
            settings = settings_for(server, args.retention_s)
            # A dry run first, then FLUSHALL, so that the server's one-time allocations fall
            # before the baseline instead of counting as conversations: the script cache, and
            # the latency histogram Redis 7 allocates for each command the first time it runs
            # (25-50 kB each, scripts' commands and our measuring ones alike).
            warm = make_store(settings, make_client(server.url))
            for source in store_scripts().values():
                await warm.redis.script_load(source)
            for n in range(min(case.rounds, 3)):
                await case.step(warm, WARM_CHAT, n)
            await warm.close()
            await snapshot(admin, server.url, 0)
            await sample_conversation(server.url, f"{PLATFORM}:{WARM_CHAT}")
            await admin.dbsize()
            await admin.flushall()
            baseline = await used_memory(admin)
            # The bot's own client: a blocking pool of 100 connections.
            store = make_store(settings, make_client(server.url))
            chats = [FIRST_CHAT + n for n in range(case.conversations)]
            started = time.monotonic()
            slowest_round = 0.0
            for n in range(case.rounds):
                round_started = time.monotonic()
                await asyncio.gather(*(case.step(store, chat, n) for chat in chats))
                slowest_round = max(slowest_round, time.monotonic() - round_started)
            ended = time.monotonic()
            # The load's connections go before measuring: their buffers are not conversations.
            await store.close()
            idle = await snapshot(admin, server.url, baseline)
            sample = await sample_conversation(server.url, f"{PLATFORM}:{chats[0]}")
            waited = await wait_for_expiry(admin, ended, args.retention_s)
            after = await snapshot(admin, server.url, baseline)
            info = await admin.info("server")
            version = f"{info.get('server_name', 'redis')} {info['redis_version']}"
            return Result(
                case, ended - started, slowest_round, idle, after, waited, sample, version
            )
        finally:
            await admin.aclose()


# Reporting


def per(value: float, count: int) -> str:
    return f"{value / count:,.0f}"


def ttl_range(ttls: list[int]) -> tuple[str, str]:
    """Min and max TTL in seconds; "none" for a key without one (it would stay for ever)."""
    if not ttls:
        return "", ""
    if any(ttl < 0 for ttl in ttls):
        with_ttl = [ttl for ttl in ttls if ttl >= 0]
        return "none", _seconds(max(with_ttl)) if with_ttl else "none"
    return _seconds(min(ttls)), _seconds(max(ttls))


def _seconds(ms: int) -> str:
    return f"{ms / 1000:.1f} s" if ms < 100_000 else f"{ms / 3_600_000:.0f} h"


def report_case(result: Result, args: argparse.Namespace) -> None:
    case, idle, after = result.case, result.idle, result.after
    n = case.conversations
    print(f"## {case.title}: {n} conversations")
    print()
    print(
        f"load {result.load_s:.1f} s in {case.rounds} rounds (slowest {result.slowest_round_s:.2f}"
        f" s); measured right after it, and again {result.waited_s:.1f} s later"
    )
    if idle.conversations_with_state < n:
        print(
            f"WARNING: only {idle.conversations_with_state}/{n} conversations still had their "
            f"state right after the load: a round took longer than the retention "
            f"({args.retention_s:g} s); raise --retention-s"
        )
    print()
    names = sorted(
        set(idle.kinds) | set(after.kinds), key=lambda k: -idle.kinds.get(k, Kind()).bytes
    )
    rows: list[list[str]] = []
    for name in names:
        before, later = idle.kinds.get(name, Kind()), after.kinds.get(name, Kind())
        low, high = ttl_range(before.ttls)
        rows.append(
            [
                name,
                f"{before.keys / n:.2f}",
                per(before.bytes, n),
                low,
                high,
                f"{later.keys / n:.2f}",
                per(later.bytes, n),
            ]
        )
    totals = [
        (
            "all own keys",
            sum(k.bytes for k in idle.kinds.values()),
            sum(k.bytes for k in after.kinds.values()),
        ),
        (
            f"shared ({idle.shared_keys} keys: due, active, usage day)",
            idle.shared_bytes,
            after.shared_bytes,
        ),
        ("used_memory delta", idle.used_memory, after.used_memory),
    ]
    # Bytes only, idle and after: the key counts and TTLs are the kinds' own.
    rows += [[name, "", per(now, n), "", "", "", per(later, n)] for name, now, later in totals]
    print_table(
        [
            "key kind",
            "keys/conv",
            "bytes/conv idle",
            "TTL min",
            "TTL max",
            "keys/conv after",
            "bytes/conv after",
        ],
        rows,
    )
    print()
    print(
        f"conversations with a key left after the retention (`day` aside): "
        f"{after.conversations_with_keys}/{n}; keys expired by the server meanwhile: "
        f"{after.expired_keys - idle.expired_keys}"
    )
    print()
    print(f"one conversation ({PLATFORM}:{FIRST_CHAT}) right after the load, key by key:")
    print_table(
        ["kind", "type", "encoding", "entries", "bytes", "TTL"],
        [
            [s.kind, s.type, s.encoding, str(s.entries), f"{s.bytes:,}", _ttl(s.ttl_ms)]
            for s in result.sample
        ],
    )
    print()


def _ttl(ms: int) -> str:
    return "none" if ms < 0 else _seconds(ms)


def report(results: list[Result], args: argparse.Namespace) -> None:
    history_cap = Settings.model_fields["history_cap"].default
    print(
        f"settings: retention {args.retention_s:g} s (LASTWORD_RETENTION_DAYS="
        f"{args.retention_s / 86_400:.3g}), history cap {history_cap}"
        f" entries, dedupe ids: at most {SEEN_CAP}, {SEEN_KEEP_MS // 3_600_000} h; rate limit off"
    )
    print(
        f"a question is {len(QUESTION.format(n=10))} chars, a reply {len(REPLY.format(n=10))},"
        f" a short message {len(SHORT.format(n=100))}; {PLATFORM} ids (chat {FIRST_CHAT}...);"
        f" server {results[0].server if results else '?'}, a fresh one per case"
    )
    print()
    for result in results:
        report_case(result, args)
    print("## summary: bytes per conversation")
    print()
    rows = []
    for result in results:
        n = result.case.conversations
        own = sum(k.bytes for k in result.idle.kinds.values())
        own_after = sum(k.bytes for k in result.after.kinds.values())
        rows.append(
            [
                result.case.title.split(")")[0] + ")",
                str(result.case.messages),
                per(own, n),
                per(result.idle.used_memory, n),
                per(own_after, n),
                per(result.after.used_memory, n),
            ]
        )
    print_table(
        [
            "case",
            "messages",
            "own keys idle",
            "used_memory idle",
            "own keys after",
            "used_memory after",
        ],
        rows,
    )
    print()
    print(
        f"issue, before retention: case (c) kept ~{ISSUE_BIG_BYTES:,} bytes for ever "
        "(64 kB of dedupe ids, 53 kB of history)"
    )
    print()
    print("notes:")
    print(
        "- left after the retention by design: `day` (a user's tokens of one UTC day, kept "
        "2 days), and the shared entries: activity index (dropped at the shard's next ingest "
        "an hour on), usage ranking of the day (2 days), due-index (until a sweep finds "
        "nothing owed)"
    )
    print(
        "- (b): with a retention of seconds, the pending messages expire unanswered; with "
        "days, a sweep answers them long before"
    )
    print(
        "- not shown: dedupe ids are trimmed by age (25 h) only when a message comes in; an "
        "idle conversation keeps its ids until the retention expires it"
    )
    print(
        "- used_memory can end a little below the baseline: hash tables and the allocator do "
        "not return exactly to the fresh server's state (a few kB per case, divided among its "
        "conversations)"
    )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.memory")
    parser.add_argument("--conversations", type=int, default=1000, help="for cases (a) and (b)")
    parser.add_argument("--big", type=int, default=10, help="conversations for case (c)")
    parser.add_argument("--big-messages", type=int, default=1200)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--burst", type=int, default=4)
    parser.add_argument(
        "--retention-s",
        type=float,
        default=2.0,
        help="LASTWORD_RETENTION_DAYS in seconds; must exceed the slowest round of the load",
    )
    return parser.parse_args(argv)


async def run(args: argparse.Namespace) -> list[Result]:
    return [await run_case(case, args) for case in cases(args)]


def main(argv: Sequence[str] | None = None) -> None:
    with timed_run():
        args = parse_args(argv)
        report(asyncio.run(run(args)), args)


if __name__ == "__main__":
    main()
