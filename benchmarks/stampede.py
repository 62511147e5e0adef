"""A stampede of replies from three replicas: does the fleet keep to the bot's limit, alone and
through a fault, and what does waiting cost the store?

    python -m benchmarks.stampede [--users 300] [--rate 30] [--replicas 3]
                                  [--modes off replica shared]
                                  [--faults flood-wait restart kill] [--fault-at-s 2]
                                  [--outage-s 1] [--retry-after 3600] [--lease-ms 30000]
                                  [--hold-replies 1000] [--hold-s 5] [--one-fleet]

Three `lastword run` replicas (the real Telegram adapter in webhook mode) on one embedded
server, their model the fake OpenAI server (answering at once; it counts the generations),
against the loopback fake Bot API enforcing Telegram's limits: at most `--rate` calls in any
sliding second bot-wide (every sending call: messages, drafts, typing), one message a second
per chat. A call past a limit is answered 429 with a `retry_after`, as Telegram does, and
counted.

`--users` users each send one DM at the same moment, spread over the replicas as a load
balancer would; each is owed one reply. For each way of keeping the limits
(`LASTWORD_OUTBOUND__BUDGET`): `off` (as before the budget: 429s waited out by the replica
that got them), `replica` (each replica paces itself alone), `shared` (one budget in Redis);
then, the budget shared, the same stampede through one fault, `--fault-at-s` after the first
reply:

- `kill`: one replica killed -9; the replies it held wait for their leases (`--lease-ms`) to
  expire, then another replica finishes them;
- `restart`: the server stopped (its data saved) and started again on the same socket and
  data `--outage-s` later;
- `flood wait`: the next reply's chat is answered 429 with `retry_after` = `--retry-after`
  from then on, as Telegram answers a bot that flooded one DM. That user is owed nothing
  within the run; the others are.

For each it prints:

- 429s for Telegram's limits (the flood wait's own left out), in all and after the first
  second of replies;
- replies delivered (of those owed), and duplicates;
- the time to deliver them: from the first reply to the last, counting the first second
  whole (a sliding-second limit lets `--rate` out at once, then `--rate` a second), against
  the floor the bot-wide limit allows, owed / rate; their ratio; and for a fault the issue's
  goal: 1.3 floors, plus the lease for a kill, plus the outage for a restart;
- model calls per user: the fake provider's chat requests over the users who wrote;
- the store's calls per message delivered: the budget's (the replicas'
  `lastword_budget_calls_total`, a killed replica's as read just before it died; "-" from a
  build that does not count them), and every Redis command (`INFO commandstats`, added up
  across a restart), for transparency;

and a line on what each fault did (the kill's: the replies a second from it to the last), and
one on each row's budget calls a message, by script.

Then a hold: the store's calls of the idle fleet over `--hold-s`; then, the bot-wide scope
held (written straight into the budget, as a 429 would) while `--hold-replies` users write,
once every reply is generated and waits, over `--hold-s` again: Redis commands a second (the
busiest named) and the budget's calls (by script).

Each row and the hold get a fresh server, fresh replicas and fresh fakes; one run each. With
`--one-fleet` (the smoke test's), the rows of one mode and the hold run one after another in
one fleet, each with users of its own: quicker, but each sees what the ones before left (a
killed replica stays dead, so the kill comes last of the rows).

Last, what the budget costs each platform call, measured on its own: the one script call a
call makes (`budget_take`, which also records the answers of calls made before it), one round
trip to an embedded server over its unix socket, `--calls` times in a row (median and p99,
µs).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import statistics
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from redis.asyncio import Redis

from benchmarks.command_line import timed_run
from benchmarks.flood import model_env, ready, scrape
from benchmarks.wakeup import bench_settings, percentile, print_table, temporary_server
from bot.message import BOT_SCOPE, Scope
from bot.service.app import make_store
from bot.store import Ask, BudgetKeys, Stamp
from bot.store.connect import make_client
from bot.store.embedded import EmbeddedRedis
from tests.support.fakes.limits import Limits, Violation
from tests.support.fakes.loopback import free_port
from tests.support.fakes.openai_server import FakeOpenAI
from tests.support.fakes.telegram_server import (
    FakeTelegram,
    RecordedCall,
    ScriptedError,
    post_update,
    telegram_limits,
)
from tests.support.running import START_S, Running, clean_environ

SECRET = "stampede-webhook-secret"
# Replies still missing this long after the last one came are counted as not delivered (after
# a fault, this long plus the lease: a dead holder's replies wait for it).
QUIET_END_S = 20.0
# The goal for a row through a fault: its time to deliver within this many floors,
# plus what the fault itself must cost (the dead replica's lease, the outage).
GOAL_FLOORS = 1.3
# The faults, in the order one fleet goes through them: a kill leaves it a replica short.
FAULTS = ("flood-wait", "restart", "kill")
# The budget's store calls, by script, in a replica's /metrics.
BUDGET_CALLS = "lastword_budget_calls_total{"
# The hold outlasts any run; held as a 429's retry_after would hold it.
HOLD_MS = 600_000
# An update the webhook did not take is posted again this long after, at most this many times.
REDELIVER_S = 0.5
DELIVERIES = 20
# The benchmark's own reads of the counts are no traffic of the bot's.
OWN_COMMANDS = frozenset({"info"})


class FloodWaitTelegram(FakeTelegram):
    """The fake Bot API, able to play a flood wait in one chat: from `flood_from` on, the next
    reply's chat has every message sent to it answered 429 with `retry_after`."""

    def __init__(self, limits: Limits, retry_after: int) -> None:
        super().__init__(limits=limits)
        self.retry_after = retry_after
        self.flood_from: float | None = None
        self.flood_chat: int | str | None = None

    def _scripted(self, call: RecordedCall) -> ScriptedError | None:
        if call.method == "sendMessage" and self.flood_from is not None:
            if self.flood_chat is None and call.at >= self.flood_from:
                self.flood_chat = call.chat_id
            if call.chat_id == self.flood_chat:
                return self.too_many_requests(self.retry_after)
        return super()._scripted(call)


@dataclass
class Replica:
    webhook: str
    metrics: str
    bot: Running
    # Its /metrics as last read: a killed replica's are what it said just before it died.
    last: dict[str, float] = field(default_factory=dict)

    async def read(self) -> None:
        """Read its /metrics again, unless it is dead; waits for them to be served (they may
        come up after the webhook)."""
        deadline = time.monotonic() + START_S
        while self.bot.process.returncode is None:
            with contextlib.suppress(aiohttp.ClientError):
                async with aiohttp.ClientSession() as session:
                    self.last = await scrape(session, self.metrics)
                    return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.metrics} did not answer within {START_S:g} s")
            await asyncio.sleep(0.1)

    def budget_calls(self) -> Counter[str]:
        """The budget's store calls it made, by script; none from a build that does not count
        them (or before its first)."""
        return Counter(
            {
                name.split('"')[1]: round(value)
                for name, value in self.last.items()
                if name.startswith(BUDGET_CALLS)
            }
        )


@contextlib.asynccontextmanager
async def fleet(
    count: int, folder: Path, env_of: Callable[[Path, int], dict[str, str]]
) -> AsyncIterator[list[Replica]]:
    """`count` replicas, each with the settings `env_of(its data folder, its webhook port)`
    and its /metrics served; ready once each webhook answers."""
    bots: list[Replica] = []
    try:
        for n in range(count):
            port, metrics = free_port(), free_port()
            env = env_of(folder / f"r{n}", port) | {
                "LASTWORD_METRICS_LISTEN": f"127.0.0.1:{metrics}"
            }
            bot = await Running.start(env)
            webhook = f"http://127.0.0.1:{port}/telegram"
            bots.append(Replica(webhook, f"http://127.0.0.1:{metrics}/metrics", bot))
        await asyncio.gather(*(ready(replica.webhook, 60) for replica in bots))
        yield bots
    finally:
        await asyncio.gather(*(replica.bot.stop() for replica in bots))


@contextlib.asynccontextmanager
async def replicas(
    count: int, folder: Path, env_of: Callable[[Path, int], dict[str, str]]
) -> AsyncIterator[list[str]]:
    """`count` replicas, each with the settings `env_of(its data folder, its webhook port)`:
    their webhook URLs, once each answers."""
    async with fleet(count, folder, env_of) as bots:
        yield [replica.webhook for replica in bots]


def bot_env(
    server: EmbeddedRedis, fake: FakeTelegram, data_dir: Path, port: int, mode: str, rate: int
) -> dict[str, str]:
    return clean_environ() | {
        "LASTWORD_PLATFORM": "telegram",
        "LASTWORD_REDIS_URL": server.url,
        "LASTWORD_DATA_DIR": str(data_dir),
        "LASTWORD_LOG_LEVEL": "ERROR",
        "LASTWORD_LLM__PROVIDER": "echo",
        "LASTWORD_DEBOUNCE__QUIET_MS": "300",
        "LASTWORD_DEBOUNCE__MAX_WAIT_MS": "1500",
        "LASTWORD_TELEGRAM__TOKEN": fake.token,
        "LASTWORD_TELEGRAM__API_URL": fake.api_url,
        "LASTWORD_TELEGRAM__MODE": "webhook",
        "LASTWORD_TELEGRAM__WEBHOOK_LISTEN": f"127.0.0.1:{port}",
        "LASTWORD_TELEGRAM__WEBHOOK_SECRET": SECRET,
        "LASTWORD_TELEGRAM__MESSAGES_PER_SECOND": str(rate),
        "LASTWORD_OUTBOUND__BUDGET": mode,
    }


async def commands(server: EmbeddedRedis) -> Counter[str]:
    """The commands the server has run since it started, by name, the benchmark's own reads
    left out. A client of its own each time: the server may have restarted since."""
    redis = Redis.from_url(server.url)
    try:
        stats = await redis.info("commandstats")
    finally:
        await redis.aclose()
    return Counter(
        {
            name.removeprefix("cmdstat_"): int(stat["calls"])
            for name, stat in stats.items()
            if name.removeprefix("cmdstat_") not in OWN_COMMANDS
        }
    )


@dataclass
class Commands:
    """The server's commands over a span, added up across a restart (whose counts start
    again from nothing)."""

    server: EmbeddedRedis
    before: Counter[str] = field(default_factory=Counter)
    carried: Counter[str] = field(default_factory=Counter)

    async def start(self) -> None:
        self.before = await commands(self.server)

    async def restarting(self) -> None:
        """The server is about to stop: what it ran so far is kept."""
        self.carried += await commands(self.server) - self.before
        self.before = Counter()

    async def since(self) -> Counter[str]:
        return self.carried + (await commands(self.server) - self.before)


async def restart(server: EmbeddedRedis, outage_s: float) -> None:
    """Stop the server, its data saved, and start it again `outage_s` later on the same
    socket and data."""
    down = time.monotonic()
    redis = Redis.from_url(server.url)
    try:
        # SAVE: the benchmark's server keeps no append-only file and saves nothing on its own.
        await redis.shutdown(save=True)
    finally:
        await redis.aclose()
    await asyncio.to_thread(server.stop)  # reaped
    await sleep_until(down + outage_s)
    # From this thread: the server dies with the thread that started it (PDEATHSIG). It
    # blocks the fakes for the few ms the server takes to answer.
    server.start()


async def sleep_until(moment: float) -> None:
    await asyncio.sleep(max(0.0, moment - time.monotonic()))


@dataclass
class World:
    """A fleet with its server and fakes."""

    server: EmbeddedRedis
    fake: FloodWaitTelegram
    provider: FakeOpenAI
    replicas: list[Replica]

    @property
    def alive(self) -> list[Replica]:
        return [r for r in self.replicas if r.bot.process.returncode is None]

    async def budget_calls(self) -> Counter[str]:
        """The budget's store calls of every replica so far, by script."""
        await asyncio.gather(*(replica.read() for replica in self.alive))
        return sum((replica.budget_calls() for replica in self.replicas), Counter())

    async def post(self, chats: range) -> None:
        """One DM from each chat's user, at once, spread over the living replicas."""
        hooks = [replica.webhook for replica in self.alive]
        updates = [self.fake.private_text_update(c, c, f"news for {c}, please") for c in chats]
        await asyncio.gather(*(deliver(hooks[n % len(hooks)], u) for n, u in enumerate(updates)))

    def replies(self, chats: range) -> list[RecordedCall]:
        """The replies delivered to `chats`, in order."""
        return [m for m in self.fake.sent_messages if m.chat_id in chats]


async def deliver(hook: str, update: dict[str, object]) -> None:
    """Post `update` until the webhook takes it (a 200), as Telegram delivers an update again
    after any other answer; a replica that is busy may refuse one for a moment."""
    for _ in range(DELIVERIES):
        if await post_update(hook, update, SECRET) == 200:
            return
        await asyncio.sleep(REDELIVER_S)
    raise RuntimeError(f"{hook} refused an update {DELIVERIES} times")


@contextlib.asynccontextmanager
async def world(mode: str, args: argparse.Namespace) -> AsyncIterator[World]:
    async with (
        temporary_server() as server,
        FloodWaitTelegram(telegram_limits(per_second=args.rate), args.retry_after) as fake,
        FakeOpenAI() as provider,
    ):

        def env_of(folder: Path, port: int) -> dict[str, str]:
            return (
                bot_env(server, fake, folder, port, mode, args.rate)
                | model_env(provider.base_url)
                | {
                    "LASTWORD_LEASE__TTL_MS": str(args.lease_ms),
                    # Stopped at the end with replies still waiting (a hold's, a flood
                    # wait's): nothing is measured then, so no grace to wait out.
                    "LASTWORD_SHUTDOWN_GRACE_S": "0",
                }
            )

        async with fleet(args.replicas, server.data_dir.parent, env_of) as bots:
            yield World(server, fake, provider, bots)


# -- the faults ---------------------------------------------------------------------------


class Fault:
    """What strikes a stampede `--fault-at-s` after its first reply."""

    case = ""

    async def strike(self, w: World, spent: Commands, args: argparse.Namespace) -> None:
        raise NotImplementedError

    def allowance_s(self, args: argparse.Namespace) -> float:
        """What the fault must cost on top of the goal's floors."""
        return 0.0

    def said(self, w: World, chats: range, first: float) -> str:
        """What it did, in a line."""
        raise NotImplementedError


@dataclass
class Kill(Fault):
    case = "shared, kill -9"
    at: float = 0.0

    async def strike(self, w: World, spent: Commands, args: argparse.Namespace) -> None:
        victim = w.replicas[0]
        await victim.read()  # its last counts, just before it dies
        await victim.bot.kill()
        self.at = time.monotonic()

    def allowance_s(self, args: argparse.Namespace) -> float:
        return float(args.lease_ms / 1000)

    def said(self, w: World, chats: range, first: float) -> str:
        counts = Counter(int(m.at - self.at) for m in w.replies(chats) if m.at >= self.at)
        seconds = [counts[n] for n in range(max(counts, default=-1) + 1)]
        return (
            f"kill -9: replica 1 of {len(w.replicas)} killed {self.at - first:.1f} s into the"
            f" replies; replies in each second after, to the last: {runs_of(seconds)}"
        )


def runs_of(counts: list[int]) -> str:
    """The counts, a run of equal ones written once with its length ("0 x16")."""
    out = []
    for count, run in itertools.groupby(counts):
        n = len(list(run))
        out.append(f"{count} x{n}" if n > 2 else ", ".join([str(count)] * n))
    return ", ".join(out)


@dataclass
class Restart(Fault):
    case = "shared, Redis restart"
    at: float = 0.0
    back: float = 0.0

    async def strike(self, w: World, spent: Commands, args: argparse.Namespace) -> None:
        await spent.restarting()
        self.at = time.monotonic()
        await restart(w.server, args.outage_s)
        self.back = time.monotonic()

    def allowance_s(self, args: argparse.Namespace) -> float:
        return float(args.outage_s)

    def said(self, w: World, chats: range, first: float) -> str:
        after = [m.at for m in w.replies(chats) if m.at >= self.back]
        resumed = f"{min(after) - self.back:.1f} s" if after else "never"
        return (
            f"Redis restart: the server stopped {self.at - first:.1f} s into the replies, back"
            f" {self.back - self.at:.1f} s later; the first reply {resumed} after that"
        )


@dataclass
class FloodWait(Fault):
    case = "shared, flood wait"
    at: float = 0.0

    async def strike(self, w: World, spent: Commands, args: argparse.Namespace) -> None:
        self.at = w.fake.flood_from = time.monotonic()

    def said(self, w: World, chats: range, first: float) -> str:
        chat = w.fake.flood_chat
        asked = [c for c in w.fake.calls_to("sendMessage") if c.chat_id == chat]
        got = any(m.chat_id == chat for m in w.fake.sent_messages)
        return (
            f"flood wait: chat {chat} answered 429 (retry_after {w.fake.retry_after}) from"
            f" {self.at - first:.1f} s into the replies ({len(asked)} sendMessage); its reply"
            f" {'delivered' if got else 'not delivered'} within the run"
        )


FAULT_OF: dict[str, Callable[[], Fault]] = {
    "flood-wait": FloodWait,
    "restart": Restart,
    "kill": Kill,
}


# -- a stampede -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    case: str
    refused: int
    refused_after_first_s: int
    delivered: int
    owed: int
    duplicates: int
    span_s: float
    goal_s: float | None
    model_calls: int
    users: int
    messages: int
    # By script; none from a build that does not count them.
    budget_calls: Counter[str]
    redis_commands: int
    note: str


async def first_reply(w: World, chats: range, timeout_s: float) -> float | None:
    """When the first of `chats` had its reply; None if none came within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not (sent := w.replies(chats)):
        if time.monotonic() >= deadline:
            return None
        with contextlib.suppress(TimeoutError):
            await w.fake.wait_for_sent(
                len(w.fake.sent_messages) + 1, timeout=deadline - time.monotonic()
            )
    return sent[0].at


async def answered(w: World, owed: Callable[[], set[int]], quiet_s: float) -> None:
    """Until every chat owed a reply has one, or none came for `quiet_s`."""
    while not owed() <= {m.chat_id for m in w.fake.sent_messages}:
        seen = len(w.fake.sent_messages)
        with contextlib.suppress(TimeoutError):
            await w.fake.wait_for_sent(seen + 1, timeout=quiet_s)
        if len(w.fake.sent_messages) == seen:
            return


async def stampede(
    w: World, case: str, chats: range, fault: Fault | None, args: argparse.Namespace
) -> Outcome:
    """Every user of `chats` writes at once; their replies, through `fault` if any."""
    limits = w.fake.limits
    assert limits is not None
    requests = len(w.provider.requests)
    budget_before = await w.budget_calls()
    spent = Commands(w.server)
    await spent.start()
    began = time.monotonic()
    # A dead holder's replies (a killed replica's, or after an outage today's lost cycles)
    # wait for its lease.
    quiet_s = QUIET_END_S + (args.lease_ms / 1000 if fault else 0.0)
    await w.post(chats)
    first = await first_reply(w, chats, quiet_s)
    if first is not None and fault is not None:
        await sleep_until(first + args.fault_at_s)
        await fault.strike(w, spent, args)

    def owed() -> set[int]:
        return set(chats) - {w.fake.flood_chat} if w.fake.flood_chat in chats else set(chats)

    await answered(w, owed, quiet_s)
    budget_after = await w.budget_calls()
    redis_commands = sum((await spent.since()).values())
    start = first if first is not None else time.monotonic()
    sent = w.replies(chats)
    to_owed = [m for m in sent if m.chat_id in owed()]
    last = max((m.at for m in to_owed), default=start)
    floor_s = len(owed()) / args.rate
    return Outcome(
        case=case,
        refused=len(limits.violations_after(began)),
        refused_after_first_s=len(limits.violations_after(start + 1.0)),
        delivered=len({m.chat_id for m in to_owed}),
        owed=len(owed()),
        duplicates=len(sent) - len({m.chat_id for m in sent}),
        span_s=last - start + 1.0,
        goal_s=None if fault is None else GOAL_FLOORS * floor_s + fault.allowance_s(args),
        model_calls=len(w.provider.requests) - requests,
        users=len(chats),
        messages=len(sent),
        budget_calls=budget_after - budget_before,
        redis_commands=redis_commands,
        note="; ".join(
            part
            for part in (
                "" if fault is None or first is None else fault.said(w, chats, first),
                refusals(case, limits.violations_after(began), start),
            )
            if part
        ),
    )


def refusals(case: str, violations: Sequence[Violation], start: float) -> str:
    """Each 429 the fake answered: the limit and key it broke, the method, and when, from the
    first reply (so a refusal the budget should have prevented can be told apart)."""
    if not violations:
        return ""
    return f"{case}: " + ", ".join(
        f"429 {v.limit} {v.key} {v.method} at {v.at - start:+.2f} s" for v in violations
    )


def rows(outcomes: Sequence[Outcome], args: argparse.Namespace) -> list[list[str]]:
    def per_message(count: int | None, o: Outcome) -> str:
        return "-" if count is None or not o.messages else f"{count / o.messages:.2f}"

    return [
        [
            o.case,
            str(o.refused),
            str(o.refused_after_first_s),
            f"{o.delivered}/{o.owed}",
            str(o.duplicates),
            # Not all delivered: no time to deliver them.
            f"{o.span_s:.1f}" if o.delivered == o.owed else "-",
            f"{o.owed / args.rate:.1f}",
            f"{o.span_s / (o.owed / args.rate):.2f}x" if o.delivered == o.owed else "-",
            "-" if o.goal_s is None else f"{o.goal_s:.1f}",
            f"{o.model_calls / o.users:.2f}",
            per_message(o.budget_calls.total() if o.budget_calls else None, o),
            per_message(o.redis_commands, o),
        ]
        for o in outcomes
    ]


# -- a hold ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Span:
    """The store's calls over a span of a fleet's life."""

    waiting: int
    seconds: float
    commands: Counter[str]
    budget_calls: Counter[str]

    def cells(self, case: str) -> list[str]:
        total = sum(self.commands.values())
        return [
            case,
            str(self.waiting),
            f"{self.seconds:.1f}",
            f"{total / self.seconds:.0f}",
            f"{total / self.seconds / self.waiting:.2f}" if self.waiting else "-",
            f"{self.budget_calls.total() / self.seconds:.1f}" if self.budget_calls else "-",
        ]

    def busiest(self, count: int = 5) -> str:
        """The commands run most, and the budget's calls by script, a second each."""
        top = self.commands.most_common(count)
        return "; budget: ".join(
            ", ".join(f"{name} {n / self.seconds:.1f}/s" for name, n in counts) or "-"
            for counts in (top, sorted(self.budget_calls.items()))
        )


async def span(w: World, waiting: int, seconds: float) -> Span:
    budget_before = await w.budget_calls()
    spent = Commands(w.server)
    await spent.start()
    began = time.monotonic()
    await asyncio.sleep(seconds)
    budget_after = await w.budget_calls()
    used = await spent.since()
    return Span(waiting, time.monotonic() - began, used, budget_after - budget_before)


async def hold(w: World, chats: range, args: argparse.Namespace) -> tuple[Span, Span]:
    """The store's calls of the idle fleet; then with the bot-wide scope held while every user
    of `chats` writes, once their replies are generated and wait."""
    idle = await span(w, 0, args.hold_s)
    store = make_store(
        bench_settings(w.server, quiet_ms=0, max_wait_ms=0, ttl_ms=30_000, sweep_interval_ms=1000),
        make_client(w.server.url),
    )
    try:
        await store.hold(BudgetKeys("telegram"), BOT_SCOPE, HOLD_MS)
    finally:
        await store.redis.aclose()
    requests = len(w.provider.requests)
    await w.post(chats)
    with contextlib.suppress(TimeoutError):
        await w.provider.wait_for_request(
            lambda _: len(w.provider.requests) - requests >= len(chats), timeout=QUIET_END_S
        )
    # The last replies generated reach their wait.
    await asyncio.sleep(1.0)
    # Generated and not sent: waiting for the budget.
    waiting = len(w.provider.requests) - requests - len(w.replies(chats))
    return idle, await span(w, waiting, args.hold_s)


# -- the run --------------------------------------------------------------------------------


@dataclass
class Report:
    outcomes: list[Outcome] = field(default_factory=list)
    # The idle fleet's calls, then the hold's.
    held: tuple[Span, Span] | None = None


@dataclass
class Step:
    """A row (a mode, through a fault if any) or the hold (mode shared, no fault, `hold`)."""

    mode: str
    fault: str | None = None
    hold: bool = False


def plan(args: argparse.Namespace) -> list[list[Step]]:
    """The steps, each list in one fleet of its own."""
    steps = [Step(mode) for mode in args.modes]
    steps += [Step("shared", fault) for fault in FAULTS if fault in args.faults]
    if args.hold_replies:
        steps.append(Step("shared", hold=True))
    if not args.one_fleet:
        return [[step] for step in steps]
    modes = dict.fromkeys(step.mode for step in steps)
    return [[step for step in steps if step.mode == mode] for mode in modes]


async def measure(args: argparse.Namespace) -> Report:
    report = Report()
    first_chat = 100_000
    for steps in plan(args):
        async with world(steps[0].mode, args) as w:
            for step in steps:
                users = args.hold_replies if step.hold else args.users
                chats = range(first_chat, first_chat + users)
                first_chat += users
                if step.hold:
                    report.held = await hold(w, chats, args)
                    continue
                fault = None if step.fault is None else FAULT_OF[step.fault]()
                case = step.mode if fault is None else fault.case
                report.outcomes.append(await stampede(w, case, chats, fault, args))
    return report


async def cost(calls: int) -> list[list[str]]:
    """The round trip of one paced call, timed: (step, median µs, p99 µs). A replica asks for
    a call and records the answer of the call before it in the same script call; asked for
    alone when nothing was answered meanwhile."""
    async with temporary_server() as server:
        store = make_store(
            bench_settings(
                server, quiet_ms=0, max_wait_ms=0, ttl_ms=30_000, sweep_interval_ms=1000
            ),
            make_client(server.url),
        )
        keys = BudgetKeys("bench")
        scopes = (Scope(BOT_SCOPE, 1_000_000, 1.0), Scope("chat:1", 1_000_000, 1.0))
        alone: list[int] = []
        stamping: list[int] = []
        for n in range(calls):
            ask = Ask(scopes, "message", "t", 0, f"g{n}")
            began = time.perf_counter_ns()
            if n % 2:
                await store.take_all(keys, [ask], stamps=[Stamp(f"g{n - 1}", scopes, True)])
                stamping.append((time.perf_counter_ns() - began) // 1000)
            else:
                await store.take_all(keys, [ask])
                alone.append((time.perf_counter_ns() - began) // 1000)
        await store.redis.aclose()
    return [
        [step, f"{statistics.median(values):.0f}", str(percentile(sorted(values), 99))]
        for step, values in (("an ask", alone), ("an ask and an answer", stamping))
    ]


async def run(args: argparse.Namespace) -> None:
    report = await measure(args)
    print(
        f"cpus: {os.cpu_count()}; {args.replicas} `lastword run` replicas (telegram webhook, the"
        f" fake OpenAI model); {args.users} users at once; the fake Bot API enforcing"
        f" {args.rate} calls/s bot-wide and 1 message/s per chat; lease {args.lease_ms} ms;"
        f" faults {args.fault_at_s:g} s into the replies; one run per row"
        + (" (one fleet per mode)" if args.one_fleet else "")
    )
    if report.outcomes:
        headers = [
            "case",
            "429s",
            "429s after 1st s",
            "delivered",
            "duplicates",
            "time to deliver (s)",
            "floor (s)",
            "ratio",
            "goal (s)",
            "model calls/user",
            "budget calls/msg",
            "Redis cmds/msg",
        ]
        print_table(headers, rows(report.outcomes, args))
        for outcome in report.outcomes:
            if outcome.note:
                print(f"  {outcome.note}")
        for outcome in report.outcomes:
            if outcome.budget_calls and outcome.messages:
                scripts = ", ".join(
                    f"{name} {n / outcome.messages:.2f}"
                    for name, n in sorted(outcome.budget_calls.items())
                )
                print(f"  budget calls a message, {outcome.case}: {scripts}")
    if report.held is not None:
        print(
            f"\nthe store's calls of the idle fleet, then with the bot-wide scope held once"
            f" {args.hold_replies} users wrote and their replies wait"
        )
        headers = [
            "bot-wide scope",
            "waiting",
            "measured (s)",
            "Redis cmds/s",
            "per waiting reply",
            "budget calls/s",
        ]
        idle, held = report.held
        print_table(headers, [idle.cells("free (idle)"), held.cells("held")])
        print(f"  busiest idle: {idle.busiest()}")
        print(f"  busiest held: {held.busiest()}")
    print(
        f"\nwhat a paced call costs: one budget_take call, {args.calls} in a row, every other"
        " one also recording the answer of the call before"
    )
    print_table(["step", "median (µs)", "p99 (µs)"], await cost(args.calls))


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.stampede",
        description=__doc__.split("\n\n")[0] if __doc__ else "",
    )
    parser.add_argument("--users", type=int, default=300)
    parser.add_argument("--rate", type=int, default=30, help="bot-wide calls a second")
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--calls", type=int, default=2000, help="paced calls timed for the cost")
    parser.add_argument(
        "--modes",
        nargs="*",
        default=["off", "replica", "shared"],
        choices=["off", "replica", "shared"],
    )
    parser.add_argument("--faults", nargs="*", default=list(FAULTS), choices=FAULTS)
    parser.add_argument("--fault-at-s", type=float, default=2.0, help="after the first reply")
    parser.add_argument("--outage-s", type=float, default=1.0, help="the restart's")
    parser.add_argument("--retry-after", type=int, default=3600, help="the flood wait's")
    parser.add_argument("--lease-ms", type=int, default=30_000, help="the replicas' lease")
    parser.add_argument("--hold-replies", type=int, default=1000, help="0: no hold")
    parser.add_argument("--hold-s", type=float, default=5.0, help="the hold measured for")
    parser.add_argument(
        "--one-fleet", action="store_true", help="the rows of one mode and the hold in one fleet"
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    with timed_run():
        asyncio.run(run(parse_args(argv)))


if __name__ == "__main__":
    main(sys.argv[1:])
